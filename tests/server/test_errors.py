"""HTTP status and OpenAI error shape for Calculet errors; pydantic type errors named by field."""

from __future__ import annotations

from calculet.errors import DeviceError, ModelError, RequestError
from calculet.server.config import ServerConfig
from calculet.server.errors import error_body, status_of, validation_message


def test_status_by_code_then_kind():
    assert status_of(RequestError("queue_full", "x")) == 429
    assert status_of(RequestError("model_not_found", "x")) == 404
    assert status_of(RequestError("unauthorized", "x")) == 401
    assert status_of(RequestError("request_timeout", "x")) == 408
    assert status_of(RequestError("invalid_parameter", "x")) == 400
    assert status_of(DeviceError("injected_fault", "x")) == 503
    assert status_of(ModelError("whatever", "x")) == 500


def test_error_body_names_the_parameter():
    body = error_body(RequestError("invalid_parameter", "top_p=0 is out of range; allowed: 0 < top_p <= 1"))
    assert body == {"error": {"message": "top_p=0 is out of range; allowed: 0 < top_p <= 1",
                              "type": "invalid_request_error", "code": "invalid_parameter", "param": "top_p"}}


def test_union_type_error_lists_the_members():
    errors = [{"type": "string_type", "loc": ("body", "prompt", "str"), "msg": "Input should be a valid string", "input": 3},
              {"type": "list_type", "loc": ("body", "prompt", "list[int]"), "msg": "Input should be a valid list", "input": 3}]
    err = validation_message(errors)
    assert err.message == "prompt: Input should be one of: str, list[int] (got 3)"


def test_config_never_shows_the_key():
    config = ServerConfig(api_key="sk-secret")
    assert "sk-secret" not in repr(config) and "sk-secret" not in str(config)
