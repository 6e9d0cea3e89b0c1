"""A small, real OpenAI-compatible HTTP server with scripted timing, for the harness's tests.

Every streamed answer sends its first token `ttft` seconds after the request arrived and each next
token `gap` seconds after the one before (on absolute deadlines, so delays do not drift), one token
per SSE chunk, then a finish chunk, a `usage` chunk (when asked) and `[DONE]`.

A directive inside the prompt text changes the answer:
    #429  → HTTP 429          #500  → HTTP 500
    #drop → 3 tokens, then the connection is cut mid-stream
    #eos3 → stops after 3 tokens with finish_reason "stop" (a server ignoring ignore_eos)
    #nousage → no usage chunk even when asked

Tokenizer (`/tokenize`): whitespace-separated words; a word of n characters is ceil(n/4) tokens.

Run: `python tests/bench/scripted_server.py --ttft 0.2 --gap 0.02` prints `PORT <n>` when ready.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import socket
import sys
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

MODEL = "scripted"
CONTEXT = 4096


def count_tokens(text: str) -> int:
    return sum(math.ceil(len(word) / 4) for word in text.split())


def make_app(ttft_s: float, gap_s: float) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": CONTEXT}]}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await request.json()
        text = body.get("content", body.get("prompt", ""))
        return {"tokens": list(range(count_tokens(text)))}

    async def answer(request: Request, chat: bool):
        arrived = asyncio.get_running_loop().time()
        body = await request.json()
        if chat:
            text = " ".join(m.get("content", "") for m in body.get("messages", []))
        else:
            text = body.get("prompt", "")
        if "#429" in text:
            return JSONResponse({"error": {"message": "too many requests", "type": "rate_limit"}}, 429)
        if "#500" in text:
            return JSONResponse({"error": {"message": "scripted failure", "type": "server_error"}}, 500)
        n_out = int(body.get("max_tokens", 16))
        stop_after = 3 if "#eos3" in text else None
        drop_after = 3 if "#drop" in text else None
        usage = bool((body.get("stream_options") or {}).get("include_usage")) and "#nousage" not in text
        prompt_tokens = count_tokens(text) + 1  # + BOS, as a real server counts

        def chunk(piece: str | None, finish: str | None) -> str:
            if chat:
                choice = {"index": 0, "delta": {"content": piece} if piece else {}, "finish_reason": finish}
                obj = "chat.completion.chunk"
            else:
                choice = {"index": 0, "text": piece or "", "finish_reason": finish}
                obj = "text_completion"
            return "data: " + json.dumps({"id": "x", "object": obj, "model": MODEL, "choices": [choice]}) + "\n\n"

        async def events():
            loop = asyncio.get_running_loop()
            if chat:  # a role-only first chunk, as OpenAI and vLLM send: it carries no token
                yield "data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "model": MODEL,
                                             "choices": [{"index": 0, "delta": {"role": "assistant"}}]}) + "\n\n"
            produced = 0
            limit = stop_after if stop_after is not None else n_out
            for k in range(limit):
                delay = arrived + ttft_s + k * gap_s - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if drop_after is not None and k == drop_after:
                    raise ConnectionAbortedError("scripted drop mid-stream")
                yield chunk(f" t{k}", None)
                produced += 1
            finish = "stop" if stop_after is not None else "length"
            final = json.loads(chunk(None, finish)[6:])
            final["timings"] = {"arrived_monotonic": arrived, "prompt_ms": ttft_s * 1e3, "predicted_n": produced,
                                "predicted_ms": (produced - 1) * gap_s * 1e3}
            yield "data: " + json.dumps(final) + "\n\n"
            if usage:
                yield "data: " + json.dumps({"id": "x", "object": "x", "model": MODEL, "choices": [],
                                             "usage": {"prompt_tokens": prompt_tokens,
                                                       "completion_tokens": produced,
                                                       "total_tokens": prompt_tokens + produced}}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(request, chat=True)

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--ttft", type=float, default=0.2)
    parser.add_argument("--gap", type=float, default=0.02)
    args = parser.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(make_app(args.ttft, args.gap), log_level="critical", access_log=False)
    server = uvicorn.Server(config)

    async def serve():
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        print(f"PORT {sock.getsockname()[1]}", flush=True)
        await task

    started = time.monotonic()
    asyncio.run(serve())
    print(f"served for {time.monotonic() - started:.1f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
