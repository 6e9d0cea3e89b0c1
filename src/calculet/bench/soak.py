"""`calculet bench soak [MODEL]`: mixed traffic against our own server for a duration, watching for
leaks and unexpected errors.

It starts `calculet serve MODEL` as a child process (so it can read its /proc entries), then W
workers send, in random order: streams read to the end, non-streaming requests, streams the client
closes after a random number of chunks (cancel), non-streaming requests the client abandons after a
random delay (disconnect), and bad inputs (lone surrogates, broken JSON, out-of-range numbers, a
body over the size limit). Every `burst_every_s` the workers pause and a burst of more requests
than lanes + queue arrives at once (the overflow must get 429). Every `sample_every_s` one line goes
to SOAK/samples.jsonl: server RSS, open file descriptors, threads, lanes in use, queue depth and the
client's counters. At the end the server is stopped with SIGTERM (it must exit 0) and
SOAK/summary.json says whether the run passed:

- no unexpected outcome (a 5xx, a 4xx to a valid request, a refused connection, a stream without [DONE]);
- every lane free once the traffic stops;
- the server counted as many finished requests (`calculet_requests_total`) as the client had admitted
  (plus at most the requests it abandoned before any answer, which the server may not have received);
- once idle, the server has as many open fds and threads as before the traffic (small margins);
- RSS grew no faster than `max_rss_slope_mb_per_h` after the warm-up (least-squares slope).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

BAD_BODIES = (
    b'{"prompt": "a\\ud800b", "max_tokens": 2}',
    b'{"prompt": "a\xff\xfe", "max_tokens": 2}',
    b'{"prompt": "ab", "max_tokens": -1}',
    b'{"prompt": "ab", "temperature": "hot"}',
    b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"prompt": "ab"',
)
FD_MARGIN = 8        # sockets a client may not have closed yet
THREAD_MARGIN = 6    # pool threads started on first use (the server text pool, uvicorn and anyio workers)
PROMPTS = ("The quick brown fox", "Paris is the capital of", "def main():", "Once upon a time", "1, 2, 3,")


@dataclass(frozen=True)
class SoakConfig:
    model: str | None = None             # what `calculet serve` gets (None: the default model)
    duration_s: float = 3600.0
    workers: int = 6
    max_tokens: int = 24
    sample_every_s: float = 5.0
    burst_every_s: float = 30.0
    burst_size: int = 0                  # 0: lanes + max_queue + 4
    max_queue: int = 32                  # bursts overflow it; the steady traffic never does
    warmup_s: float = 60.0               # samples before this do not count for the RSS slope
    max_rss_slope_mb_per_h: float = 5.0
    server_args: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self):
        if self.duration_s <= 0 or self.workers < 1 or self.sample_every_s <= 0 or self.max_tokens < 1:
            raise ValueError("duration, workers, sample interval and max_tokens must be positive")


@dataclass
class Tally:
    sent: Counter = field(default_factory=Counter)          # by action
    outcomes: Counter = field(default_factory=Counter)      # "action:status"
    admitted: int = 0                                       # requests the engine took (it counts each once)
    uncertain: int = 0                                      # abandoned before any answer: taken or not, the client cannot know
    unexpected: list = field(default_factory=list)

    def bad(self, what: str) -> None:
        if len(self.unexpected) < 50:
            self.unexpected.append(what)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_stats(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 2), "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


_MODEL_LABEL = re.compile(r'model="(?:[^"\\]|\\.)*",?')


def scrape(text: str) -> dict[str, float]:
    """{'name{labels}': value} of /metrics, summed over the served models (their `model` label dropped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            name = _MODEL_LABEL.sub("", name).replace(",}", "}").replace("{}", "")
            out[name] = out.get(name, 0.0) + float(value)
    return out


def rss_slope_mb_per_h(samples: list[dict], warmup_s: float) -> float | None:
    """Least-squares slope of RSS over time after the warm-up, in MB per hour (None: too few samples)."""
    points = [(s["t"], s["rss_mb"]) for s in samples if s["t"] >= warmup_s]
    if len(points) < 3:
        return None
    n = len(points)
    mt, mr = sum(t for t, _ in points) / n, sum(r for _, r in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return 0.0 if var == 0 else sum((t - mt) * (r - mr) for t, r in points) / var * 3600


class Soak:
    def __init__(self, config: SoakConfig, out: Path):
        self.config, self.out = config, out
        self.rng = random.Random(config.seed)
        self.tally = Tally()
        self.samples: list[dict] = []
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.gate = asyncio.Event()          # cleared while a burst runs
        self.proc: subprocess.Popen | None = None

    # --- the server -------------------------------------------------------------------------
    def start_server(self, timeout: float = 600) -> dict:
        cmd = [sys.executable, "-m", "calculet", "serve", *([self.config.model] if self.config.model else []),
               "--port", str(self.port), "--max-queue", str(self.config.max_queue), *self.config.server_args]
        self.log = open(self.out / "server.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}; see {self.out / 'server.log'}")
            try:
                r = httpx.get(self.url + "/health", timeout=2)
                if r.status_code == 200:
                    return r.json()
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the server was not healthy after {timeout} s")

    def stop_server(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self.log.close()

    # --- traffic ----------------------------------------------------------------------------
    def body(self, stream: bool) -> dict:
        return {"prompt": self.rng.choice(PROMPTS), "max_tokens": self.rng.randint(1, self.config.max_tokens),
                "temperature": self.rng.choice((0.0, 0.8)), "seed": self.rng.randint(0, 1000), "stream": stream}

    async def stream(self, http: httpx.AsyncClient, action: str, stop_after: int | None = None, expect=(200,)) -> int:
        """A streaming request; `stop_after`: close after that many data lines (a cancel)."""
        async with http.stream("POST", self.url + "/v1/completions", json=self.body(True)) as r:
            if r.status_code != 200:
                await r.aread()
                return r.status_code
            self.tally.admitted += 1
            lines, done = 0, False
            async for line in r.aiter_lines():
                if not line:
                    continue
                lines += 1
                if line == "data: [DONE]":
                    done = True
                elif '"error"' in line:
                    self.tally.bad(f"{action}: error event {line[:200]}")
                if stop_after is not None and lines >= stop_after:
                    return 200
            if not done:
                self.tally.bad(f"{action}: stream ended without [DONE]")
            return 200

    async def one(self, http: httpx.AsyncClient) -> None:
        action = self.rng.choices(("stream", "complete", "cancel", "disconnect", "bad"), (4, 3, 2, 1, 1))[0]
        self.tally.sent[action] += 1
        try:
            if action == "stream":
                status = await self.stream(http, action)
            elif action == "cancel":
                status = await self.stream(http, action, stop_after=self.rng.randint(1, 4))
            elif action == "complete":
                r = await http.post(self.url + "/v1/completions", json=self.body(False))
                status = r.status_code
                self.tally.admitted += status == 200
            elif action == "disconnect":
                # abandoned at a random point: queued, prefilling or decoding (the engine counts it as cancelled)
                try:
                    long = {k: v for k, v in self.body(False).items() if k != "max_tokens"} | {"ignore_eos": True}
                    r = await http.post(self.url + "/v1/completions", json=long, timeout=self.rng.uniform(0.05, 0.3))
                    status = r.status_code
                    self.tally.admitted += status == 200
                except httpx.TimeoutException:
                    status = 200
                    self.tally.uncertain += 1
            else:
                content = self.rng.choice(BAD_BODIES + (b'{"prompt": "' + b"x" * (4 << 20) + b'"}',))
                r = await http.post(self.url + "/v1/completions", content=content,
                                    headers={"content-type": "application/json"})
                status = r.status_code
                if status not in (400, 413):
                    self.tally.bad(f"bad input got {status}: {r.text[:200]}")
        except httpx.HTTPError as exc:
            self.tally.bad(f"{action}: {type(exc).__name__}: {exc}")
            return
        self.tally.outcomes[f"{action}:{status}"] += 1
        if action != "bad" and status != 200:
            self.tally.bad(f"{action} got {status}")

    async def worker(self, end: float) -> None:
        async with httpx.AsyncClient(timeout=120) as http:
            while time.monotonic() < end:
                await self.gate.wait()
                await self.one(http)

    async def burst(self, lanes: int) -> None:
        """More requests at once than lanes + queue: each gets 200 or 429, nothing else."""
        size = self.config.burst_size or lanes + self.config.max_queue + 4
        self.tally.sent["burst"] += size

        async def one(http):
            try:
                r = await http.post(self.url + "/v1/completions", json=self.body(False))
            except httpx.HTTPError as exc:
                self.tally.bad(f"burst: {type(exc).__name__}: {exc}")
                return
            self.tally.outcomes[f"burst:{r.status_code}"] += 1
            self.tally.admitted += r.status_code == 200
            if r.status_code not in (200, 429):
                self.tally.bad(f"burst got {r.status_code}: {r.text[:200]}")

        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=size)) as http:
            await asyncio.gather(*(one(http) for _ in range(size)))

    async def sampler(self, t0: float, end: float) -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            while True:
                self.samples.append(await self.sample(http, t0))
                if time.monotonic() >= end:
                    return
                await asyncio.sleep(self.config.sample_every_s)

    async def sample(self, http: httpx.AsyncClient, t0: float) -> dict:
        m = scrape((await http.get(self.url + "/metrics")).text)
        record = {"t": round(time.monotonic() - t0, 2), **proc_stats(self.proc.pid),
                  "lanes_in_use": m.get("calculet_lanes_in_use"), "queue_depth": m.get("calculet_requests_waiting"),
                  "requests_running": m.get("calculet_requests_running"), "client_sent": sum(self.tally.sent.values()),
                  "unexpected": len(self.tally.unexpected)}
        with open(self.out / "samples.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        return record

    async def traffic(self, lanes: int) -> None:
        t0 = time.monotonic()
        end = t0 + self.config.duration_s
        self.gate.set()
        sampler = asyncio.create_task(self.sampler(t0, end))
        workers = [asyncio.create_task(self.worker(end)) for _ in range(self.config.workers)]
        next_burst = t0 + self.config.burst_every_s
        while time.monotonic() < end:
            await asyncio.sleep(min(0.5, max(end - time.monotonic(), 0)))
            if time.monotonic() >= next_burst and time.monotonic() < end:
                self.gate.clear()
                await self._idle()
                await self.burst(lanes)
                next_burst = time.monotonic() + self.config.burst_every_s
                self.gate.set()
        await asyncio.gather(*workers)
        await sampler

    async def _idle(self, timeout: float = 60) -> dict:
        """Wait until the server has no request running or waiting and every lane is free."""
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=30) as http:
            while True:
                m = scrape((await http.get(self.url + "/metrics")).text)
                if (m["calculet_lanes_in_use"] == 0 and m["calculet_requests_running"] == 0
                        and m["calculet_requests_waiting"] == 0) or time.monotonic() > deadline:
                    return m
                await asyncio.sleep(0.05)

    # --- the whole run ----------------------------------------------------------------------
    def run(self) -> dict:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "samples.jsonl").write_text("")
        health = self.start_server()
        lanes = health["lanes_free"] + health["lanes_in_use"]
        try:
            idle_before = proc_stats(self.proc.pid)
            asyncio.run(self.traffic(lanes))
            final = asyncio.run(self._idle())
            idle_after = proc_stats(self.proc.pid)
        finally:
            exit_code = self.stop_server()
        counted = sum(v for k, v in final.items() if k.startswith("calculet_requests_total{"))
        slope = rss_slope_mb_per_h(self.samples, self.config.warmup_s)
        checks = {
            "no_unexpected_errors": not self.tally.unexpected,
            "lanes_free_at_end": final["calculet_lanes_in_use"] == 0,
            "request_counts_match": self.tally.admitted <= counted <= self.tally.admitted + self.tally.uncertain,
            "rss_slope_ok": slope is None or slope <= self.config.max_rss_slope_mb_per_h,
            "server_exit_0": exit_code == 0,
            # once idle again, the server holds what it held before the traffic (a few sockets of margin)
            "fds_back_to_idle": idle_after["fds"] - idle_before["fds"] <= FD_MARGIN,
            "threads_back_to_idle": idle_after["threads"] - idle_before["threads"] <= THREAD_MARGIN,
        }
        summary = {"passed": all(checks.values()), "checks": checks, "config": asdict(self.config),
                   "rss_slope_mb_per_h": slope, "server_counted": counted, "client_admitted": self.tally.admitted,
                   "client_abandoned": self.tally.uncertain,
                   "sent": dict(self.tally.sent), "outcomes": dict(self.tally.outcomes),
                   "unexpected": self.tally.unexpected, "samples": len(self.samples),
                   "idle_before": idle_before, "idle_after": idle_after,
                   "rss_mb_first_last": [self.samples[0]["rss_mb"], self.samples[-1]["rss_mb"]] if self.samples else None,
                   "fds_first_last": [self.samples[0]["fds"], self.samples[-1]["fds"]] if self.samples else None,
                   "threads_first_last": [self.samples[0]["threads"], self.samples[-1]["threads"]] if self.samples else None}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary


def run_soak(config: SoakConfig, out: Path) -> dict:
    return Soak(config, out).run()
