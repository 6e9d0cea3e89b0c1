"""ServerConfig rejects bad options with a message that names the flag and the allowed range."""

from __future__ import annotations

import pytest

from calculet.errors import RequestError
from calculet.server.config import ServerConfig


@pytest.mark.parametrize("kwargs, flag, allowed", [
    ({"port": 70000}, "--port", "0..65535"),
    ({"max_queue": -1}, "--max-queue", ">= 0"),
    ({"max_prefill_tokens": 0}, "--max-prefill-tokens", ">= 1"),
    ({"request_timeout_s": 0.0}, "--request-timeout", "> 0"),
    ({"threads": -2}, "--threads", ">= 0"),
    ({"api_key": " "}, "--api-key", "empty"),
    ({"max_body_bytes": 10}, "--max-body-bytes", ">= 1024"),
    ({"drain_timeout_s": -1.0}, "--drain-timeout", "0..3600"),
    ({"job_timeout_s": 0.0}, "--job-timeout", "> 0"),
])
def test_bad_option_names_flag_and_limit(kwargs, flag, allowed):
    with pytest.raises(RequestError) as exc:
        ServerConfig(**kwargs)
    assert exc.value.code == "bad_option" and flag in exc.value.message and allowed in exc.value.message


def test_repr_hides_the_key_and_shows_the_budget():
    text = repr(ServerConfig(api_key="secret", max_prefill_tokens=256))
    assert "secret" not in text and "max_prefill_tokens=256" in text
