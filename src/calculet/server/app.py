"""The HTTP API (FastAPI): OpenAI completions, chat completions and models, plus health, metrics,
tokenize and detokenize. /health and the OpenAPI document are open; everything else needs the API
key when one is set."""

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


def _model_card(m) -> dict:
    """One entry of /v1/models for a loaded model."""
    return {"id": m.name, "object": "model", "created": m.created, "owned_by": "calculet", "max_model_len": m.context}


def create_app(config, host, metrics) -> FastAPI:
    """config: ServerConfig; host: ModelHost; metrics: ServerMetrics."""
    app = FastAPI(title="Calculet", version=__version__, description="OpenAI-compatible server over a calbin")
    key = config.api_key.encode() if config.api_key else None
    text = app.state.text_pool = TextPool()   # tokenizing and templating run here, never on the event loop

    def body_limit() -> int:
        if config.max_body_bytes is not None:
            return config.max_body_bytes
        return default_max_body_bytes(host.model.context) if host.model is not None else MIN_BODY_BYTES

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
        m = host.require()
        return {"object": "list", "data": [_model_card(m)]}

    @app.get("/v1/models/{model_id}", dependencies=guard, tags=["openai"])
    async def model_info(model_id: str):
        m = host.require()
        params.check_model(model_id, m.name)
        return _model_card(m)

    @app.post("/v1/completions", dependencies=guard, tags=["openai"])
    async def completions(body: CompletionRequest, request: Request):
        m = host.require()
        params.check_model(body.model, m.name)
        if isinstance(body.prompt, str):
            check_text_length(len(body.prompt), m.max_prompt_chars, m.context)
        prompt_ids = await text.run(params.completion_prompt, body, m.tokenizer)
        gen = params.completion_request(body, prompt_ids, m.context, config.request_timeout_s)
        echo = ""
        if body.echo:
            echo = body.prompt if isinstance(body.prompt, str) else await text.run(m.tokenizer.decode, prompt_ids)
        fmt = CompletionFormat(m.name, m.tokenizer, body.return_token_ids, echo_text=echo if body.stream else "")
        return await _answer(EngineCall(m.engine, gen), fmt, gen.n, body, request, prefix=echo)

    @app.post("/v1/chat/completions", dependencies=guard, tags=["openai"])
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        m = host.require()
        params.check_model(body.model, m.name)
        check_text_length(params.chat_chars(body.messages), m.max_prompt_chars, m.context, "messages")
        prompt_ids = await text.run(params.chat_prompt, body.messages, m)
        gen = params.chat_request(body, prompt_ids, m.context, config.request_timeout_s, m.chat.stop_token_ids)
        fmt = ChatFormat(m.name, m.tokenizer, body.return_token_ids)
        return await _answer(EngineCall(m.engine, gen), fmt, gen.n, body, request)

    @app.post("/tokenize", dependencies=guard, tags=["admin"])
    async def tokenize(body: TokenizeRequest):
        m = host.require()
        params.check_model(body.model, m.name)
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
        m = host.require()
        params.check_model(body.model, m.name)
        vocab = m.tokenizer.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise RequestError("invalid_parameter", f"tokens has token id {bad[0]}; allowed: 0 <= id <= {vocab - 1}")
        return {"prompt": await text.run(m.tokenizer.decode, body.tokens)}

    return app
