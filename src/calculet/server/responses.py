"""From engine events to HTTP responses: one JSON body, or server-sent events.

`EngineCall` is the bridge between threads: the engine thread pushes events through
`loop.call_soon_threadsafe` into an asyncio queue the handler reads. Whatever way a handler ends
(done, error, client gone, task cancelled), the request is cancelled in the engine, which frees its
lanes within one step.
"""

from __future__ import annotations

import asyncio
import json
import time

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from calculet.engine.requests import RequestDone, RequestFailed, SequenceDelta
from calculet.server.errors import error_body, error_response
from calculet.server.openai_format import timing_headers, usage

DISCONNECT_POLL_S = 0.5


class EngineCall:
    def __init__(self, engine, request):
        self.engine = engine
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.arrived_unix = time.time()
        self.id = engine.submit(request, self._sink)   # raises now for a bad request or a full queue
        self.ended = False

    def _sink(self, event) -> None:  # engine thread
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)

    async def next(self, timeout: float | None = None):
        event = await asyncio.wait_for(self.queue.get(), timeout) if timeout else await self.queue.get()
        if isinstance(event, (RequestDone, RequestFailed)):
            self.ended = True
        return event

    def close(self) -> None:
        if not self.ended:
            self.engine.cancel(self.id)
            self.ended = True


class _Choices:
    """Per-choice text, token ids, logprobs and finish reason."""

    def __init__(self, n: int):
        self.text = [""] * n
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list] = [[] for _ in range(n)]
        self.finish: list[str | None] = [None] * n

    def add(self, d: SequenceDelta) -> None:
        self.text[d.index] += d.text
        self.tokens[d.index].extend(d.token_ids)
        self.logprobs[d.index].extend(d.logprobs)
        self.finish[d.index] = d.finish_reason or self.finish[d.index]


async def respond(call: EngineCall, fmt, n: int, http: Request, prefix: str = "") -> JSONResponse:
    """Wait for the whole result (cancelling if the client goes away) and answer in one body."""
    choices = _Choices(n)
    next_check = time.monotonic() + DISCONNECT_POLL_S
    try:
        while True:
            try:
                event = await call.next(DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                event = None
            if time.monotonic() >= next_check:  # events may flow without pause: check by the clock
                next_check = time.monotonic() + DISCONNECT_POLL_S
                if await http.is_disconnected():
                    return JSONResponse({}, status_code=499)
            if event is None:
                continue
            if isinstance(event, SequenceDelta):
                choices.add(event)
            elif isinstance(event, RequestFailed):
                return error_response(event.error)
            else:
                body = fmt.envelope([fmt.choice(i, prefix + choices.text[i], choices.logprobs[i], choices.finish[i],
                                                choices.tokens[i]) for i in range(n)], chunk=False)
                body["usage"] = usage(event)
                return JSONResponse(body, headers=timing_headers(event.timings))
    finally:
        call.close()


def sse(data) -> str:
    return "data: " + (data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)) + "\n\n"


async def _events(call: EngineCall, fmt, n: int, include_usage: bool):
    try:
        for chunk in fmt.first_chunks(n):
            yield sse(chunk)
        pending = [[] for _ in range(n)]   # logprobs of tokens whose text is still held back
        held = None                        # the latest finish chunk: the end carries the server's timings
        while True:
            event = await call.next()
            if isinstance(event, SequenceDelta):
                pending[event.index].extend(event.logprobs)
                if not (event.text or event.finish_reason):
                    continue
                chunk = fmt.envelope([fmt.choice(event.index, event.text, pending[event.index], event.finish_reason,
                                                 event.token_ids, chunk=True)], chunk=True)
                pending[event.index] = []
                if include_usage:
                    chunk["usage"] = None
                if held is not None:
                    yield sse(held)
                    held = None
                if event.finish_reason:
                    held = chunk
                else:
                    yield sse(chunk)
            elif isinstance(event, RequestFailed):
                if held is not None:
                    yield sse(held)
                yield sse(error_body(event.error))
                break
            else:
                if held is not None:
                    held["server_timings"] = event.timings.to_json()
                    yield sse(held)
                if include_usage:
                    yield sse({**fmt.envelope([], chunk=True), "usage": usage(event)})
                break
        yield sse("[DONE]")
    finally:
        call.close()


def stream(call: EngineCall, fmt, n: int, include_usage: bool) -> StreamingResponse:
    headers = {"x-calculet-timings": json.dumps({"arrived_unix": round(call.arrived_unix, 6)}), "cache-control": "no-cache"}
    return StreamingResponse(_events(call, fmt, n, include_usage), media_type="text/event-stream", headers=headers)
