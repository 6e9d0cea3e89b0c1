"""The input limits' arithmetic: the default body limit and the prompt-text bound (server/limits.py)."""

from __future__ import annotations

import pytest

from calculet.errors import RequestError
from calculet.server.limits import MIB, check_text_length, default_max_body_bytes, max_prompt_chars


def test_default_body_limit_follows_the_context():
    assert default_max_body_bytes(128) == MIB                 # small contexts get the 1 MiB floor
    assert default_max_body_bytes(32768) == 64 * 32768        # 2 MiB for a 32k context


def test_prompt_text_bound_and_message():
    limit = max_prompt_chars(context=100, token_chars=7)
    assert limit == 1400
    check_text_length(limit, limit, 100)
    with pytest.raises(RequestError) as exc:
        check_text_length(limit + 1, limit, 100)
    assert exc.value.code == "prompt_too_long" and "1401 characters" in exc.value.message and "100 tokens" in exc.value.message
