"""The engine in-process, no server: `calculet.LLM`, `calculet run` and the golden check submit
requests to the same continuous-batching `Engine` the server runs, and read each request's events.

    with LocalEngine(device, tokenizer) as local:
        streams = [local.submit(r) for r in requests]      # all queued at once: batched by the engine
        outputs = [s.result() for s in streams]            # RequestOutput each
        for delta in local.submit(request):                # or streamed: SequenceDelta ...
            print(delta.text, end="")

There is one generation loop (the engine's step); this module only feeds it and listens.
"""

from __future__ import annotations

import queue
import sys
from typing import Iterator

from calculet.engine.engine import Engine, EngineConfig
from calculet.engine.outputs import OutputBuilder, RequestOutput
from calculet.engine.requests import GenerationRequest, RequestDone, RequestFailed, SequenceDelta
from calculet.errors import RequestError

UNBOUNDED_QUEUE = sys.maxsize   # in-process callers queue every request they give (generate: all prompts at once)


class RequestStream:
    """One submitted request. Iterating yields its `SequenceDelta`s; the iteration ends after the
    request is done (`output` then holds the whole `RequestOutput`) and raises the request's error
    if it failed. Leaving the iteration early cancels the request."""

    def __init__(self, engine: Engine, request: GenerationRequest, prompt: str | None = None):
        self.request = request
        self.prompt = prompt
        self.output: RequestOutput | None = None
        self._engine = engine
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._builder = OutputBuilder(request.n, request.logprobs is not None)
        self._ended = False
        self.id = engine.submit(request, self._events.put)

    def __iter__(self) -> Iterator[SequenceDelta]:
        try:
            while not self._ended:
                event = self._events.get()
                if isinstance(event, SequenceDelta):
                    self._builder.add(event)
                    yield event
                elif isinstance(event, RequestDone):
                    self._ended = True
                    self.output = self._builder.build(self.prompt, self.request.prompt_ids, event)
                elif isinstance(event, RequestFailed):
                    self._ended = True
                    raise event.error
        finally:
            if not self._ended:   # the caller stopped listening: free the lanes
                self._ended = True
                self._engine.cancel(self.id)

    def result(self) -> RequestOutput:
        """Wait for the end; the whole output (raises the request's error if it failed)."""
        for _ in self:
            pass
        if self.output is None:
            raise RequestError("cancelled", "the request was cancelled: its stream was closed before the end")
        return self.output

    def cancel(self) -> None:
        self._engine.cancel(self.id)


class LocalEngine:
    """An `Engine` on its own thread over a device the caller opened (and closes)."""

    def __init__(self, device, tokenizer, config: EngineConfig | None = None):
        self.engine = Engine(device, tokenizer, config or EngineConfig(max_queue=UNBOUNDED_QUEUE))
        self.engine.start()

    @property
    def context(self) -> int:
        return self.engine.context

    def submit(self, request: GenerationRequest, prompt: str | None = None) -> RequestStream:
        return RequestStream(self.engine, request, prompt)

    def submit_all(self, requests: list[GenerationRequest], prompts: list[str | None] | None = None) -> list[RequestStream]:
        """Queue every request in one go (each checked first, so a bad one queues none)."""
        for request in requests:
            self.engine.check(request)
        prompts = prompts or [None] * len(requests)
        streams: list[RequestStream] = []
        try:
            for request, prompt in zip(requests, prompts):
                streams.append(RequestStream(self.engine, request, prompt))
        except BaseException:
            for stream in streams:
                stream.cancel()
            raise
        return streams

    def run(self, request: GenerationRequest) -> RequestOutput:
        return self.submit(request).result()

    def close(self) -> None:
        """Stop the engine thread (requests still running fail with `shutting_down`)."""
        self.engine.stop()

    def __enter__(self) -> "LocalEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
