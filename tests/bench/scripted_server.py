"""A small, real OpenAI-compatible HTTP/1.1 server with scripted timing, for the harness's tests.

It is written on bare asyncio streams (keep-alive, Content-Length bodies, chunked SSE responses)
rather than a web framework so that its own per-request cost stays far below the delays it injects,
even on a loaded 2-core machine.

Every streamed answer sends its first token `ttft` seconds after the request arrived and each next
token `gap` seconds after the one before (on absolute deadlines, so delays do not drift), one token
per SSE chunk, then a finish chunk carrying llama.cpp-style `timings`, a `usage` chunk (when asked)
and `[DONE]`. Chat answers start with a role-only chunk, as OpenAI and vLLM do.

A directive inside the prompt text changes the answer:
    #429  → HTTP 429          #500  → HTTP 500
    #drop → 3 tokens, then the connection is cut mid-stream
    #eos3 → stops after 3 tokens with finish_reason "stop" (a server ignoring ignore_eos)
    #nousage → no usage chunk even when asked
    #stale → the first time this prompt comes, the connection is closed with no answer (as a server
             closing an idle keep-alive connection does); later it is answered
    #disconnect → the connection is always closed with no answer

Endpoints: POST /v1/completions, POST /v1/chat/completions, POST /tokenize, GET /v1/models.
Tokenizer: whitespace-separated words; a word of n characters is ceil(n/4) tokens; usage adds a BOS.

Run: `python tests/bench/scripted_server.py --ttft 0.3 --gap 0.02` prints `PORT <n>` when ready.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math

MODEL = "scripted"
CONTEXT = 4096


def count_tokens(text: str) -> int:
    return sum(math.ceil(len(word) / 4) for word in text.split())


class Dropped(Exception):
    """Raised to cut a connection mid-stream."""


class ScriptedServer:
    def __init__(self, ttft_s: float, gap_s: float):
        self.ttft_s, self.gap_s = ttft_s, gap_s
        self.seen: set[str] = set()

    # --- HTTP/1.1 plumbing -----------------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                arrived = asyncio.get_running_loop().time()
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in
                           (line.split(":", 1) for line in lines[1:] if ":" in line)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                await self.route(method, path, json.loads(body) if body else {}, arrived, writer)
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, Dropped):
            pass
        finally:
            writer.close()

    @staticmethod
    async def send_json(writer: asyncio.StreamWriter, status: int, data: dict) -> None:
        body = json.dumps(data).encode()
        reason = {200: "OK", 404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error"}[status]
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()

    @staticmethod
    async def send_chunk(writer: asyncio.StreamWriter, event: str) -> None:
        data = event.encode()
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await writer.drain()

    # --- the API ---------------------------------------------------------------------------------
    async def route(self, method: str, path: str, body: dict, arrived: float, writer: asyncio.StreamWriter) -> None:
        if method == "GET" and path == "/v1/models":
            await self.send_json(writer, 200, {"object": "list", "data": [
                {"id": MODEL, "object": "model", "max_model_len": CONTEXT}]})
        elif method == "POST" and path == "/tokenize":
            text = body.get("content", body.get("prompt", ""))
            await self.send_json(writer, 200, {"tokens": list(range(count_tokens(text)))})
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            await self.complete(body, path.endswith("chat/completions"), arrived, writer)
        else:
            await self.send_json(writer, 404, {"error": {"message": f"no route {method} {path}"}})

    async def complete(self, body: dict, chat: bool, arrived: float, writer: asyncio.StreamWriter) -> None:
        if chat:
            text = " ".join(m.get("content", "") for m in body.get("messages", []))
        else:
            text = body.get("prompt", "")
        if "#disconnect" in text or ("#stale" in text and text not in self.seen):
            self.seen.add(text)
            writer.transport.abort()
            raise Dropped()
        if "#429" in text:
            return await self.send_json(writer, 429, {"error": {"message": "too many requests"}})
        if "#500" in text:
            return await self.send_json(writer, 500, {"error": {"message": "scripted failure"}})
        n_out = 3 if "#eos3" in text else int(body.get("max_tokens", 16))
        usage = bool((body.get("stream_options") or {}).get("include_usage")) and "#nousage" not in text
        kind = "chat.completion.chunk" if chat else "text_completion"

        def event(choices: list, **extra) -> str:
            return "data: " + json.dumps({"id": "x", "object": kind, "model": MODEL, "choices": choices, **extra}) + "\n\n"

        def choice(piece: str | None, finish: str | None) -> dict:
            if chat:
                return {"index": 0, "delta": {"content": piece} if piece else {}, "finish_reason": finish}
            return {"index": 0, "text": piece or "", "finish_reason": finish}

        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        if chat:
            await self.send_chunk(writer, event([{"index": 0, "delta": {"role": "assistant"}}]))
        loop = asyncio.get_running_loop()
        for k in range(n_out):
            delay = arrived + self.ttft_s + k * self.gap_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if "#drop" in text and k == 3:
                writer.transport.abort()
                raise Dropped()
            await self.send_chunk(writer, event([choice(f" t{k}", None)]))
        timings = {"arrived_monotonic": arrived, "prompt_ms": self.ttft_s * 1e3, "predicted_n": n_out,
                   "predicted_ms": (n_out - 1) * self.gap_s * 1e3}
        await self.send_chunk(writer, event([choice(None, "stop" if "#eos3" in text else "length")], timings=timings))
        if usage:
            prompt_tokens = count_tokens(text) + 1
            await self.send_chunk(writer, event([], usage={"prompt_tokens": prompt_tokens, "completion_tokens": n_out,
                                                           "total_tokens": prompt_tokens + n_out}))
        await self.send_chunk(writer, "data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def serve(ttft_s: float, gap_s: float) -> None:
    server = await asyncio.start_server(ScriptedServer(ttft_s, gap_s).handle, "127.0.0.1", 0)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ttft", type=float, default=0.3)
    parser.add_argument("--gap", type=float, default=0.02)
    args = parser.parse_args()
    try:
        asyncio.run(serve(args.ttft, args.gap))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
