"""The HTTP API (FastAPI): OpenAI completions, chat completions and models, plus health, metrics,
tokenize and detokenize, and the admin endpoints (server/admin.py). /health and the OpenAPI document
are open; everything else needs the API key when one is set.

Every request names its model; `host.lease(name)` routes it and holds that model until the request
is queued in its engine (server/host.py), which is what lets unload and reload drain without loss."""

from __future__ import annotations

import hmac
import logging

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from calculet import __version__
from calculet.errors import CalculetError, RequestError
from calculet.server import params
from calculet.server.admin import add_admin_routes
from calculet.server.errors import error_response, parse_error, status_of, validation_message
from calculet.server.metrics import CONTENT_TYPE
from calculet.server.limits import MIN_BODY_BYTES, BodyLimit, check_text_length, default_max_body_bytes
from calculet.server.offload import TextPool
from calculet.server.openai_format import ChatFormat, CompletionFormat
from calculet.server.responses import EngineCall, respond, stream
from calculet.server.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest

log = logging.getLogger(__name__)


async def _answer(call: EngineCall, fmt, n: int, body, request: Request, prefix: str = ""):
    """Server-sent events when the request asks to stream, else one JSON response."""
    if body.stream:
        return stream(call, fmt, n, bool(body.stream_options and body.stream_options.include_usage))
    return await respond(call, fmt, n, request, prefix=prefix)


def create_app(config, host, metrics) -> FastAPI:
    """config: ServerConfig; host: ModelHost; metrics: ServerMetrics."""
    app = FastAPI(title="Calculet", version=__version__, description="OpenAI-compatible server over a calbin")
    key = config.api_key.encode() if config.api_key else None
    text = app.state.text_pool = TextPool()   # tokenizing and templating run here, never on the event loop

    def body_limit() -> int:
        if config.max_body_bytes is not None:
            return config.max_body_bytes
        contexts = [m.context for m in host.models()]
        return default_max_body_bytes(max(contexts)) if contexts else MIN_BODY_BYTES

    app.add_middleware(BodyLimit, limit=body_limit, on_reject=lambda: metrics.http_errors.labels("413").inc())

    async def authorized(request: Request) -> None:  # async: no thread-pool hop per request
        if key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key):
            raise RequestError("unauthorized", "missing or wrong API key; send the header `Authorization: Bearer <key>`")

    def answer_error(error: CalculetError) -> JSONResponse:
        metrics.http_errors.labels(str(status_of(error))).inc()
        return error_response(error)

    @app.exception_handler(CalculetError)
    async def _calculet_error(_request: Request, exc: CalculetError):
        return answer_error(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError):
        return answer_error(validation_message(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException):
        if exc.status_code == 400 and exc.__cause__ is not None:   # FastAPI could not parse the body
            return answer_error(parse_error(exc.__cause__))
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        metrics.http_errors.labels(str(exc.status_code)).inc()
        return JSONResponse({"error": {"message": str(exc.detail), "type": "invalid_request_error", "code": code,
                                       "param": None}}, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception):
        log.exception("unexpected error in a request handler")
        return JSONResponse({"error": {"message": f"internal server error: {type(exc).__name__}", "type": "server_error",
                                       "code": "internal_error", "param": None}}, status_code=500)

    guard = [Depends(authorized)]

    @app.get("/health", tags=["admin"])
    async def health():
        ok, body = host.health()
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", dependencies=guard, tags=["admin"], response_class=PlainTextResponse)
    async def metrics_text():
        return PlainTextResponse(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models", dependencies=guard, tags=["openai"])
    async def models():
        served = host.serving()
        return {"object": "list", "data": [m.card() for m in served]}

    @app.get("/v1/models/{model_id}", dependencies=guard, tags=["openai"])
    async def model_info(model_id: str):
        with host.lease(model_id) as m:
            return m.card()

    @app.post("/v1/completions", dependencies=guard, tags=["openai"])
    async def completions(body: CompletionRequest, request: Request):
        with host.lease(body.model) as m:
            if isinstance(body.prompt, str):
                check_text_length(len(body.prompt), m.max_prompt_chars, m.context)
            prompt_ids = await text.run(params.completion_prompt, body, m.tokenizer)
            gen = params.completion_request(body, prompt_ids, m.context, m.engine.config.request_timeout_s)
            echo = ""
            if body.echo:
                echo = body.prompt if isinstance(body.prompt, str) else await text.run(m.tokenizer.decode, prompt_ids)
            fmt = CompletionFormat(m.name, m.tokenizer, body.return_token_ids, echo_text=echo if body.stream else "")
            call = EngineCall(m.engine, gen)
        return await _answer(call, fmt, gen.n, body, request, prefix=echo)

    @app.post("/v1/chat/completions", dependencies=guard, tags=["openai"])
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        with host.lease(body.model) as m:
            check_text_length(params.chat_chars(body.messages), m.max_prompt_chars, m.context, "messages")
            prompt_ids = await text.run(params.chat_prompt, body.messages, m)
            gen = params.chat_request(body, prompt_ids, m.context, m.engine.config.request_timeout_s,
                                      m.chat.stop_token_ids)
            fmt = ChatFormat(m.name, m.tokenizer, body.return_token_ids)
            call = EngineCall(m.engine, gen)
        return await _answer(call, fmt, gen.n, body, request)

    @app.post("/tokenize", dependencies=guard, tags=["admin"])
    async def tokenize(body: TokenizeRequest):
        with host.lease(body.model) as m:
            if (body.prompt is None) == (body.messages is None):
                raise RequestError("invalid_parameter", "give exactly one of prompt (text) or messages (chat)")
            if body.messages is not None:
                check_text_length(params.chat_chars(body.messages), m.max_prompt_chars, m.context, "messages")
                ids = await text.run(params.chat_prompt, body.messages, m)
            else:
                check_text_length(len(body.prompt), m.max_prompt_chars, m.context)
                ids = await text.run(m.tokenizer.encode, body.prompt, add_bos=None if body.add_special_tokens else False)
            return {"tokens": ids, "count": len(ids), "max_model_len": m.context}

    @app.post("/detokenize", dependencies=guard, tags=["admin"])
    async def detokenize(body: DetokenizeRequest):
        with host.lease(body.model) as m:
            vocab = m.tokenizer.vocab_size
            bad = [t for t in body.tokens if not 0 <= t < vocab]
            if bad:
                raise RequestError("invalid_parameter", f"tokens has token id {bad[0]}; allowed: 0 <= id <= {vocab - 1}")
            return {"prompt": await text.run(m.tokenizer.decode, body.tokens)}

    add_admin_routes(app, config, host)
    return app
