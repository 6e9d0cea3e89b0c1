"""Input limits that protect the server before any parsing: the request body size and the length of
a prompt's text before it is tokenized.

Body size. `BodyLimit` is an ASGI middleware in front of the app. A body whose `Content-Length`
exceeds the limit gets 413 at once, without a byte of it read; a body without one (chunked) is
counted as it arrives and answered 413 as soon as it passes the limit. Either way the server holds
at most `limit` bytes of it (uvicorn discards the rest of the upload as it comes in, after the
answer). The default limit comes from the context once the model is known:

    default_max_body_bytes(context) = max(1 MiB, 64 B x context)

64 bytes per token of context = 16 bytes per token (about 4 characters of up to 4 UTF-8 bytes each)
times 4 for JSON escapes (a character written as `\\uXXXX` is 6 bytes) and the rest of the body.
A body that needs more than that holds more text than the context can take; `--max-body-bytes`
raises it.

Prompt text. A token covers at most `max_token_chars` characters (the longest entry in the
vocabulary, counted in the tokenizer's own alphabet, which has at least one character per character
of text it stands for), so text of more than `context x max_token_chars x 2` characters cannot fit
the context, and is refused before the tokenizer sees it. The factor 2 leaves room for a normalizer
that merges characters (Unicode composition turns "e" + U+0301 into one character).
"""

from __future__ import annotations

import json

from calculet.errors import RequestError

MIB = 1 << 20
BODY_BYTES_PER_TOKEN = 64
MIN_BODY_BYTES = MIB
NORMALIZER_MARGIN = 2


def default_max_body_bytes(context: int) -> int:
    return max(MIN_BODY_BYTES, BODY_BYTES_PER_TOKEN * context)


def max_token_chars(tokenizer) -> int:
    """The most characters one token of this vocabulary can stand for (an upper bound)."""
    return max((len(piece) for piece in tokenizer.pieces()), default=1)


def max_prompt_chars(context: int, token_chars: int) -> int:
    return context * max(token_chars, 1) * NORMALIZER_MARGIN


def check_text_length(chars: int, limit: int, context: int, what: str = "prompt") -> None:
    """Refuse text that cannot fit the context whatever its tokens, before tokenizing it."""
    if chars > limit:
        raise RequestError("prompt_too_long",
                           f"{what}: the text has {chars} characters, more than the {limit} characters that {context} tokens of "
                           f"context can hold with this vocabulary; allowed: at most {context} tokens (shorten the {what})")


class BodyLimit:
    """ASGI middleware: 413 for a request body over `limit()` bytes, checked before the app reads it.

    `limit` is a callable because the default depends on the model's context, known only after loading.
    `on_reject()` is called once per rejected request (for metrics)."""

    def __init__(self, app, limit, on_reject=lambda: None):
        self.app = app
        self.limit = limit
        self.on_reject = on_reject

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        limit = self.limit()
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            return await self._reject(send, declared, limit)
        messages, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":   # the client went away before sending it all
                return
            size += len(message.get("body", b""))
            if size > limit:
                return await self._reject(send, None, limit)
            messages.append(message)
            if not message.get("more_body"):
                break

        async def replay():
            return messages.pop(0) if messages else await receive()

        return await self.app(scope, replay, send)

    async def _reject(self, send, declared: int | None, limit: int) -> None:
        self.on_reject()
        size = f"has {declared} bytes" if declared is not None else f"is larger than {limit} bytes"
        body = json.dumps({"error": {"message": f"the request body {size}; allowed: at most {limit} bytes "
                                                f"(--max-body-bytes; the default follows the model's context)",
                                     "type": "invalid_request_error", "code": "body_too_large", "param": None}}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
