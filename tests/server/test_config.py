"""ServerConfig rejects bad options with a message that names the flag and the allowed range."""

from __future__ import annotations

import pytest

from calculet.errors import RequestError
from calculet.server.config import ServerConfig


@pytest.mark.parametrize("kwargs, flag, allowed", [
    ({"port": 70000}, "--port", "0..65535"),
    ({"max_queue": -1}, "--max-queue", ">= 0"),
    ({"max_prefill_tokens": 0}, "--max-prefill-tokens", ">= 1"),
    ({"step_token_budget": -1}, "--step-token-budget", "0 for none"),
    ({"in_flight": 3}, "--in-flight", "1 or 2"),
    ({"ttft_target_s": -0.5}, "--ttft-target", "0 for none"),
    ({"request_timeout_s": 0.0}, "--request-timeout", "> 0"),
    ({"threads": -2}, "--threads", ">= 0"),
    ({"api_key": " "}, "--api-key", "empty"),
    ({"max_body_bytes": 10}, "--max-body-bytes", ">= 1024"),
    ({"drain_timeout_s": -1.0}, "--drain-timeout", "0..3600"),
    ({"job_timeout_s": 0.0}, "--job-timeout", "> 0"),
    ({"kv_dtype": "fp64"}, "--kv-dtype", "fp32, fp16, bf16, int8"),
])
def test_bad_option_names_flag_and_limit(kwargs, flag, allowed):
    with pytest.raises(RequestError) as exc:
        ServerConfig(**kwargs)
    assert exc.value.code == "bad_option" and flag in exc.value.message and allowed in exc.value.message


def test_repr_hides_the_key_and_shows_the_budget():
    text = repr(ServerConfig(api_key="secret", max_prefill_tokens=256))
    assert "secret" not in text and "max_prefill_tokens=256" in text


def test_engine_defaults_are_the_flags_defaults():
    """Guards against the server, the Python API and the engine drifting apart on the mixed-step
    budget and the in-flight depth (each repeats the default so `serve --help` stays light)."""
    from calculet.engine.engine import EngineConfig
    from calculet.llm import LLMOptions

    engine = EngineConfig()
    for config in (ServerConfig().engine_config(), LLMOptions().engine_config()):
        assert (config.step_token_budget, config.in_flight) == (engine.step_token_budget, engine.in_flight) == (72, 2)
        assert config.ttft_target_s == engine.ttft_target_s is None
