"""run_asgi: one forwarded request through an ASGI app, without Ray (plain asyncio)."""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from calculet.ray.bridge import CANCEL_WAIT_S, ForwardedRequest, run_asgi


def _app(events: list):
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request):
        return {"body": (await request.body()).decode(), "q": request.url.query, "h": request.headers.get("x-a")}

    @app.get("/stream")
    async def stream():
        async def gen():
            try:
                for i in range(1000):
                    yield f"data: {i}\n\n"
                    await asyncio.sleep(0.01)
            finally:
                events.append("closed")
        return StreamingResponse(gen(), media_type="text/event-stream")

    return app


def _collect(app, request, **kw):
    async def go():
        return [m async for m in run_asgi(app, request, **kw)]
    return asyncio.run(go())


def test_request_goes_through_and_the_replica_header_is_added():
    req = ForwardedRequest("POST", "/echo", b"k=v", ((b"x-a", b"1"), (b"content-type", b"application/json")), b'{"a": 1}')
    messages = _collect(_app([]), req, extra_headers=((b"x-calculet-replica", b"r1"),))
    start, *bodies = messages
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert [b"x-calculet-replica", b"r1"] in [list(h) for h in start["headers"]]
    import json
    assert json.loads(b"".join(m.get("body", b"") for m in bodies)) == {"body": '{"a": 1}', "q": "k=v", "h": "1"}


def test_leaving_early_disconnects_the_app():
    """The app must hear the client leave (so the engine frees the lane) when the caller stops reading."""
    events: list = []

    async def go():
        gen = run_asgi(_app(events), ForwardedRequest("GET", "/stream", b"", (), b""))
        got = []
        async for m in gen:
            got.append(m)
            if len(got) == 3:
                break
        t0 = time.perf_counter()
        await gen.aclose()
        return got, time.perf_counter() - t0

    got, closing_s = asyncio.run(go())
    assert closing_s < CANCEL_WAIT_S / 2   # it heard http.disconnect, not the fallback cancel
    assert got[0]["type"] == "http.response.start" and got[1]["body"] == b"data: 0\n\n"
    assert events == ["closed"]
