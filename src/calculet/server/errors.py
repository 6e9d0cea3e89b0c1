"""Errors as OpenAI shapes them: `{"error": {"message", "type", "code", "param"}}` with an HTTP status.

The status comes from the error's stable code where it has its own (429 queue_full, 404
model_not_found, ...), else from its kind: request 400, model 500, device 503.
"""

from __future__ import annotations

import re

from fastapi.responses import JSONResponse

from calculet.errors import CalculetError, ErrorKind, RequestError

RETRY_AFTER_S = 1

STATUS_BY_CODE = {
    "unauthorized": 401,
    "admin_disabled": 403,
    "model_exists": 409,
    "model_does_not_fit": 507,
    "model_not_found": 404,
    "not_found": 404,
    "request_timeout": 408,
    "queue_full": 429,
    "model_loading": 503,
    "shutting_down": 503,
    "model_unloading": 503,
    "device_unavailable": 503,
}
STATUS_BY_KIND = {ErrorKind.REQUEST: 400, ErrorKind.MODEL: 500, ErrorKind.DEVICE: 503}
TYPE_BY_STATUS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                  404: "invalid_request_error", 409: "invalid_request_error", 507: "server_error",
                  408: "timeout_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}

_PARAM = re.compile(r"^([a-z_][a-z_.0-9]*)(=|: )")


def status_of(error: CalculetError) -> int:
    return STATUS_BY_CODE.get(error.code, STATUS_BY_KIND[error.kind])


def error_body(error: CalculetError) -> dict:
    status = status_of(error)
    m = _PARAM.match(error.message)
    return {"error": {"message": error.message, "type": TYPE_BY_STATUS.get(status, "server_error"),
                      "code": error.code, "param": m.group(1) if m else None}}


def error_response(error: CalculetError) -> JSONResponse:
    status = status_of(error)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status in (429, 503) else None
    return JSONResponse(error_body(error), status_code=status, headers=headers)


def validation_message(errors: list[dict]) -> RequestError:
    """A pydantic error list -> one RequestError that names the field and what it should be."""
    first = errors[0]
    if first.get("type") == "json_invalid":
        return RequestError("invalid_json", f"the request body is not valid JSON: {first.get('msg')}")
    path = _field_path(first)
    if first.get("type") == "missing":
        return RequestError("missing_parameter", f"{path or 'body'}: this field is required")
    # a check on the value (valid Unicode, ...) says more than "none of the union's types fit"
    value = next((e for e in errors if e.get("type") == "value_error"), None)
    if value is not None:
        return RequestError("invalid_value", f"{_field_path(value) or 'body'}: {value['msg'].removeprefix('Value error, ')}")
    # a union (prompt: str | list[int]) reports one error per member, each tagged with its type
    members = [_union_member(e) for e in errors if _field_path(e) == path]
    members = [m for m in members if m]
    detail = f"Input should be one of: {', '.join(dict.fromkeys(members))}" if len(members) > 1 else first.get("msg", "invalid value")
    got = first.get("input")
    shown = "an object" if isinstance(got, dict) else repr(got)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return RequestError("invalid_type", f"{path or 'body'}: {detail} (got {shown})")


_TYPE_TAGS = ("str", "int", "float", "bool")


def _is_tag(part) -> bool:
    return isinstance(part, str) and (any(c in part for c in "[]") or part in _TYPE_TAGS)


def _field_path(error: dict) -> str:
    loc = [p for p in error.get("loc", ()) if p != "body"]
    out = []
    for p in loc:
        if _is_tag(p):
            break
        out.append(str(p))
    return ".".join(out)


_VALIDATED = re.compile(r"function-(?:after|before|wrap|plain)\[[^,\]]*, ([^\]]+)\]")


def _union_member(error: dict) -> str | None:
    """The union member an error belongs to, as a type name: `function-after[_check(), str]` reads `str`."""
    tag = next((p for p in error.get("loc", ()) if _is_tag(p)), None)
    return _VALIDATED.sub(r"\1", tag) if tag else None


def parse_error(cause: BaseException) -> RequestError:
    """Why FastAPI could not parse a JSON body (it reports them all as one 400) -> a message that says it."""
    if isinstance(cause, UnicodeDecodeError):
        return RequestError("invalid_json", f"the request body is not valid UTF-8 (byte {cause.object[cause.start]:#04x} at "
                            f"offset {cause.start}); send JSON as UTF-8 text")
    if isinstance(cause, RecursionError):
        return RequestError("invalid_json", "the request body nests arrays or objects too deeply; allowed: well under "
                            "1000 levels")
    return RequestError("invalid_json", f"the request body is not valid JSON: {type(cause).__name__}: {str(cause)[:200]}")
