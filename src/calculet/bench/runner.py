"""Run a benchmark: probe the server, build the prompts, drive each phase, write the records.

    from calculet.bench.config import BenchConfig, Load, Target
    from calculet.bench.runner import run_benchmark
    records = run_benchmark(BenchConfig(Target(url, model), loads=(Load("closed", concurrency=8),)))

Load generators (one per phase):
- closed loop: `concurrency` clients, each sending its next request when the last one ended;
- open loop: requests sent at seeded arrival times (Poisson, gamma, constant), each on its own task,
  with an optional cap on requests in flight (a request waiting for the cap keeps its scheduled time
  in `t_scheduled_ns`; its latencies count from when it was really sent).
A phase ends when its requests are all sent, or when `duration_s` has passed (no new request is
sent; those in flight finish). Warm-up requests run once before the first phase and are recorded
with `warmup: true`.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

from calculet.bench.client import request_body, stream_request
from calculet.bench.config import BenchConfig, Load
from calculet.bench.probe import probe_server
from calculet.bench.records import PROMPTS_FILE, RECORDS_FILE, RUN_FILE, RequestRecord
from calculet.bench.schedule import arrival_times
from calculet.bench.tokens import LocalTokenizer, RemoteTokenizer, TokenCounter
from calculet.bench.workload import Phase, Prompt, plan_phases, prompts_in_file_order
from calculet.cpu_features import detect
from calculet.errors import RequestError


def run_benchmark(config: BenchConfig) -> Path:
    """Run every phase of `config`; return the path of the records JSONL (inside `config.out_dir`)."""
    out_dir = config.out_dir
    if (out_dir / RECORDS_FILE).exists():
        raise RequestError("run_exists", f"{out_dir / RECORDS_FILE} already exists; give a new --out folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    headers = {"Authorization": f"Bearer {config.target.api_key}"} if config.target.api_key else {}
    facts = probe_server(config.target.base_url, config.target.model, headers)
    context = config.workload.max_context or facts.context
    counter = _token_counter(config, headers)
    try:
        warmup, phases, notes = plan_phases(config, counter, context)
    finally:
        if isinstance(counter, RemoteTokenizer):
            counter.close()
    with (out_dir / PROMPTS_FILE).open("w", encoding="utf-8") as f:
        for prompt in prompts_in_file_order(phases, warmup):
            f.write(prompt.to_json() + "\n")
    info = {
        "run_id": out_dir.name,
        "label": config.label or config.target.base_url,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "clock": "time.perf_counter_ns of the client (CLOCK_MONOTONIC on Linux), in ns since clock_origin",
        "config": _config_json(config),
        "server": {"models": facts.models, "context": context,
                   "context_source": "--max-context" if config.workload.max_context else facts.context_source,
                   **facts.raw},
        "tokenizer": counter.source if counter else None,
        # The machine the client runs on: the server's too when both share it (benchmarks/vs_llamacpp).
        # Its ISA decides ONNX Runtime's int8 kernels, so every result says which CPU it came from.
        "client_cpu": detect().to_json(),
        "notes": notes,
        "phases": [],
    }
    _write_json(out_dir / RUN_FILE, info)
    records_file = out_dir / RECORDS_FILE
    # The client's own pauses would count as server latency: a full garbage collection of a big heap
    # (a test session, a notebook) takes tens of ms. Freezing the heap keeps collections short.
    gc.collect()
    gc.freeze()
    try:
        origin = time.perf_counter_ns()
        info["clock_origin"] = {"perf_counter_ns": origin, "unix_time_s": time.time()}
        info["phases"] = asyncio.run(_drive(config, warmup, phases, records_file, info["run_id"], origin))
    finally:
        gc.unfreeze()
    _write_json(out_dir / RUN_FILE, info)
    return records_file


def _token_counter(config: BenchConfig, headers: dict[str, str]) -> TokenCounter | None:
    if config.workload.prompts_file is not None:
        return None
    if config.workload.tokenizer is not None:
        return LocalTokenizer(config.workload.tokenizer)
    return RemoteTokenizer(config.target.base_url, config.target.model, headers)


def _config_json(config: BenchConfig) -> dict[str, Any]:
    data = asdict(config)
    data["target"]["api_key"] = "***" if config.target.api_key else None
    return json.loads(json.dumps(data, default=str))


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# --- driving the load ------------------------------------------------------------------------------

@dataclass
class _Sink:
    """Writes each finished request's record at once and keeps the progress bar current."""

    file: Any
    bar: Any
    run_id: str
    ids: itertools.count = field(default_factory=itertools.count)
    phase_started_s: float = 0.0
    phase_done: int = 0
    phase_ok: int = 0
    phase_tokens: int = 0
    scenario: str = ""
    last_refresh_s: float = 0.0

    def start_phase(self, scenario: str) -> None:
        self.scenario, self.phase_started_s = scenario, time.perf_counter()
        self.phase_done = self.phase_ok = self.phase_tokens = 0

    def add(self, record: RequestRecord) -> None:
        self.file.write(record.to_json() + "\n")
        self.file.flush()
        self.phase_done += 1
        self.phase_ok += record.ok
        self.phase_tokens += record.output_tokens or 0
        self.bar.update(1)
        now = time.perf_counter()
        if now - self.last_refresh_s > 0.25:
            self.last_refresh_s = now
            elapsed = max(now - self.phase_started_s, 1e-9)
            self.bar.set_postfix_str(
                f"{self.scenario} ok {self.phase_ok}/{self.phase_done} "
                f"{self.phase_done / elapsed:.2f} req/s {self.phase_tokens / elapsed:.0f} tok/s",
                refresh=False,
            )


@dataclass(frozen=True)
class _Request:
    scenario: str
    load: Load
    prompt: Prompt
    warmup: bool


async def _drive(config: BenchConfig, warmup: list[Prompt], phases: list[Phase], records_file: Path,
                 run_id: str, origin: int) -> list[dict[str, Any]]:
    from tqdm import tqdm

    def clock() -> int:
        return time.perf_counter_ns() - origin

    headers = {"Authorization": f"Bearer {config.target.api_key}"} if config.target.api_key else {}
    timeout = httpx.Timeout(config.target.timeout_s, connect=min(10.0, config.target.timeout_s))
    # Idle connections are dropped after 4 s, before servers commonly close them (5 s): fewer stale reuses.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=4.0)
    total = len(warmup) + sum(len(p.prompts) for p in phases)
    summary = []
    with (records_file.open("a", encoding="utf-8") as file,
          tqdm(total=total, unit="req", disable=not config.progress, dynamic_ncols=True) as bar):
        sink = _Sink(file, bar, run_id)
        async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers) as http:
            if warmup:
                first = phases[0].load if phases else Load("closed", concurrency=1)
                width = max(1, min(len(warmup), first.concurrency or 1))
                load = Load("closed", concurrency=width)
                await _open_connections(http, config.target.base_url, width)
                sink.start_phase("warmup")
                await _closed_loop(http, config, sink, clock, load, "warmup", warmup, None, warmup=True)
            for phase in phases:
                await _open_connections(http, config.target.base_url, phase.load.concurrency or 1)
                sink.start_phase(phase.scenario)
                started = clock()
                deadline = started + int(config.limits.duration_s * 1e9) if config.limits.duration_s else None
                if phase.load.mode == "closed":
                    await _closed_loop(http, config, sink, clock, phase.load, phase.scenario,
                                       list(phase.prompts), deadline)
                else:
                    await _open_loop(http, config, sink, clock, phase, deadline)
                summary.append({"scenario": phase.scenario, "started_ns": started, "ended_ns": clock(),
                                "requests_done": sink.phase_done, "requests_planned": len(phase.prompts)})
    return summary


async def _open_connections(http: httpx.AsyncClient, base_url: str, n: int) -> None:
    """Open n keep-alive connections before a phase, so that TCP set-up is not counted in its first
    requests: n GET /v1/models held open together (a held response keeps its connection busy, so the
    pool must make n of them). Failures are ignored: the phase's own requests will show them."""
    opened = 0
    all_open = asyncio.Event()

    async def hold() -> None:
        nonlocal opened
        try:
            async with http.stream("GET", base_url + "/v1/models") as response:
                opened += 1
                if opened == n:
                    all_open.set()
                await asyncio.wait_for(all_open.wait(), timeout=10.0)
                await response.aread()
        except (httpx.HTTPError, asyncio.TimeoutError):
            all_open.set()  # do not keep the others waiting

    await asyncio.gather(*(hold() for _ in range(n)))


async def _one(http: httpx.AsyncClient, config: BenchConfig, sink: _Sink, clock: Callable[[], int],
               request: _Request, scheduled_ns: int | None) -> None:
    prompt, target = request.prompt, config.target
    request_id = next(sink.ids)
    body = request_body(target.model, prompt.body(target.api), prompt.max_tokens, config.workload.fixed_output)
    result = await stream_request(http, target.endpoint, body, clock)
    load = request.load
    sink.add(RequestRecord(
        run_id=sink.run_id, request_id=request_id, scenario=request.scenario, warmup=request.warmup,
        load=load.mode, concurrency=load.concurrency, rate=load.rate, api=target.api,
        prompt_bucket=prompt.bucket, prompt_tokens_target=prompt.target_tokens,
        max_tokens=prompt.max_tokens, fixed_output=config.workload.fixed_output,
        t_scheduled_ns=result.t_sent_ns if scheduled_ns is None else scheduled_ns,
        **asdict(result),
    ))


async def _closed_loop(http: httpx.AsyncClient, config: BenchConfig, sink: _Sink, clock: Callable[[], int],
                       load: Load, scenario: str, prompts: list[Prompt], deadline: int | None,
                       warmup: bool = False) -> None:
    queue = iter(prompts)

    async def client() -> None:
        for prompt in queue:  # shared iterator: each prompt goes to exactly one client
            if deadline is not None and clock() >= deadline:
                return
            await _one(http, config, sink, clock, _Request(scenario, load, prompt, warmup), None)

    await asyncio.gather(*(client() for _ in range(load.concurrency or 1)))


async def _open_loop(http: httpx.AsyncClient, config: BenchConfig, sink: _Sink, clock: Callable[[], int],
                     phase: Phase, deadline: int | None) -> None:
    load = phase.load
    times = arrival_times(len(phase.prompts), load.rate or 1.0, load.mode, load.burstiness,
                          seed=zlib.crc32(f"{config.seed}/{phase.scenario}".encode()))
    cap = asyncio.Semaphore(load.concurrency) if load.concurrency else None
    start = clock()

    async def arrive(prompt: Prompt, scheduled: int) -> None:
        request = _Request(phase.scenario, load, prompt, False)
        if cap is None:
            await _one(http, config, sink, clock, request, scheduled)
            return
        async with cap:
            await _one(http, config, sink, clock, request, scheduled)

    tasks = []
    for prompt, at_s in zip(phase.prompts, times):
        scheduled = start + int(at_s * 1e9)
        if deadline is not None and scheduled >= deadline:
            break
        delay = (scheduled - clock()) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(arrive(prompt, scheduled)))
    await asyncio.gather(*tasks)
