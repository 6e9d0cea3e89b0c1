"""One HTTP request carried between Ray actors, and the ASGI calls at either end.

The router replica turns the client's request into a `ForwardedRequest` (plain bytes, cheap to
pickle); the model replica runs it through the same FastAPI app `calculet serve` uses and yields the
ASGI messages the app sends (`http.response.start`, then `http.response.body` ones), which the
router writes back. No Ray import here: both ends are plain asyncio, testable without a cluster.

    client ─▶ Serve proxy ─▶ Router.__call__ ─(handle, stream)─▶ Model.handle ─▶ run_asgi(app, request)
                                  ▲                                                  │ ASGI messages
                                  └───────────────────────── yielded one by one ◀────┘
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import AsyncIterator

log = logging.getLogger(__name__)

CANCEL_WAIT_S = 5.0   # how long a cancelled app may take to close its request (it frees the lane)


@dataclass(frozen=True)
class ForwardedRequest:
    method: str
    path: str
    query_string: bytes
    headers: tuple[tuple[bytes, bytes], ...]   # lower-case names, as ASGI gives them
    body: bytes
    client: tuple[str, int] | None = None

    def scope(self) -> dict:
        return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                "method": self.method, "scheme": "http", "path": self.path, "raw_path": self.path.encode(),
                "query_string": self.query_string, "root_path": "", "headers": [list(h) for h in self.headers],
                "client": self.client, "server": ("calculet-replica", 0), "state": {}}

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)


async def run_asgi(app, request: ForwardedRequest, extra_headers: tuple[tuple[bytes, bytes], ...] = ()
                   ) -> AsyncIterator[dict]:
    """Call the ASGI `app` with `request` and yield what it sends, `extra_headers` added to the start
    message. The body is delivered at once; after it the app hears `http.disconnect` only when the
    caller stops iterating (the client left, or the router was cancelled), which makes the app
    cancel its engine request the way it does for a dropped HTTP connection."""
    sent: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        await sent.put(message)

    task = asyncio.create_task(app(request.scope(), receive, send))
    task.add_done_callback(lambda _t: sent.put_nowait(None))   # wakes the reader when the app returns
    try:
        while True:
            message = await sent.get()
            if message is None:
                task.result()   # re-raises what the app raised
                return
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *map(list, extra_headers)]}
            yield message
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                return
    finally:
        gone.set()
        if not task.done():
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), CANCEL_WAIT_S)
            if not task.done():
                log.warning("the app did not end %g s after its client left; cancelling it", CANCEL_WAIT_S)
                task.cancel()
