"""Two models served at once vs each alone: output tokens/s and latency per model.

    python benchmarks/two_models.py --a A.calbin --b B.calbin [--streams 4] [--requests 16] [--max-tokens 64]

Scenarios, each a fresh `calculet serve` on 127.0.0.1:

    a alone        serve a=A                       (one chip: all cores)
    b alone        serve b=B
    both, 2 chips  serve a=A b=B, a on chip 0, b on chip 1 (--chips 2: cores/2 threads each)
    both, 1 chip   serve a=A b=B, both on chip 0   (each its own sessions, all cores each: they contend)

Load: closed loop, `--streams` clients per model sending greedy streamed completions that ignore EOS
(`--max-tokens` each), `--requests` per model after `--warmup` per client; in the "both" scenarios the
two models are loaded at the same time. Prints one line per scenario and model: output tokens/s,
mean time to first token and mean inter-token latency, and the sum over the models.
Do not read timings off a shared or busy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

PROMPT = "The history of the printing press begins with"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(models_toml: str, chips: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = _port()
    cmd = [sys.executable, "-m", "calculet", "serve", "--models", models_toml, "--chips", str(chips), "--port", str(port),
           *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}: {proc.stderr.read()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("server not healthy after 900 s")


async def one_request(client: httpx.AsyncClient, url: str, model: str, max_tokens: int) -> tuple[float, list[float]]:
    """(time to first token, token arrival times) of one streamed completion."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}
    t0 = time.perf_counter()
    arrivals = []
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{model}: HTTP {r.status_code}: {await r.aread()}")
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"{model}: {chunk['error']}")
                now = time.perf_counter()
                for choice in chunk["choices"]:
                    arrivals.extend([now] * len(choice.get("token_ids") or ()))
    return (arrivals[0] - t0 if arrivals else float("nan")), arrivals


async def warm_up(client: httpx.AsyncClient, url: str, model: str, streams: int, warmup: int, max_tokens: int) -> None:
    await asyncio.gather(*(one_request(client, url, model, max_tokens) for _ in range(streams * warmup)))


async def measure(client: httpx.AsyncClient, url: str, model: str, streams: int, requests: int, max_tokens: int) -> dict:
    """`requests` completions over `streams` closed-loop clients."""
    left = requests
    ttfts, gaps, tokens = [], [], 0

    async def worker():
        nonlocal left, tokens
        while left > 0:
            left -= 1
            ttft, arrivals = await one_request(client, url, model, max_tokens)
            ttfts.append(ttft)
            gaps.extend(b - a for a, b in zip(arrivals, arrivals[1:]))
            tokens += len(arrivals)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(streams)))
    seconds = time.perf_counter() - t0
    return {"model": model, "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
            "ttft_ms": 1000 * sum(ttfts) / max(1, len(ttfts)), "itl_ms": 1000 * sum(gaps) / max(1, len(gaps))}


async def scenario(url: str, models: list[str], args) -> list[dict]:
    """Every model warmed up first, then all measured at the same time."""
    limits = httpx.Limits(max_connections=4 * args.streams * len(models))
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await asyncio.gather(*(warm_up(client, url, m, args.streams, args.warmup, args.max_tokens) for m in models))
        return await asyncio.gather(*(measure(client, url, m, args.streams, args.requests, args.max_tokens) for m in models))


def write_toml(path: Path, entries: list[tuple[str, str, int]]) -> str:
    path.write_text("".join(f'[[model]]\nname = "{n}"\ncalbin = "{p}"\nchips = [{c}]\n\n' for n, p, c in entries))
    return str(path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="first model: a calbin")
    p.add_argument("--b", required=True, help="second model: a calbin")
    p.add_argument("--streams", type=int, default=4, help="concurrent clients per model (default %(default)s)")
    p.add_argument("--requests", type=int, default=16, help="measured requests per model (default %(default)s)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up requests per client (default %(default)s)")
    p.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (default %(default)s)")
    p.add_argument("--scenarios", default="a,b,both2,both1", help="which of a,b,both2,both1 (default %(default)s)")
    p.add_argument("--serve-args", default="", help="more `calculet serve` flags, e.g. '--max-queue 64'")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="calculet-two-models-"))
    plans = {
        "a": ("a alone", [("a", args.a, 0)], 1),
        "b": ("b alone", [("b", args.b, 0)], 1),
        "both2": ("both, 2 chips", [("a", args.a, 0), ("b", args.b, 1)], 2),
        "both1": ("both, 1 chip", [("a", args.a, 0), ("b", args.b, 0)], 1),
    }
    print(f"cores {os.cpu_count()}, {args.streams} streams x {args.requests} requests x {args.max_tokens} tokens per model")
    for key in args.scenarios.split(","):
        label, entries, chips = plans[key]
        proc, url = start(write_toml(tmp / f"{key}.toml", entries), chips, args.serve_args.split())
        try:
            results = asyncio.run(scenario(url, [n for n, _, _ in entries], args))
        finally:
            proc.terminate()
            proc.wait(60)
        for r in results:
            print(f"{label:14s} {r['model']}: {r['tok_s']:8.1f} tok/s  ttft {r['ttft_ms']:7.1f} ms  itl {r['itl_ms']:6.2f} ms "
                  f"({r['tokens']} tokens in {r['seconds']:.1f} s)")
        if len(results) > 1:
            print(f"{label:14s} sum: {sum(r['tok_s'] for r in results):8.1f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
