"""Where a slow decode step goes: 8-stream waves in process, every device job timed, the machine sampled.

    python benchmarks/stall_probe.py [CALBIN] [--duration 300] [--streams 8] [--prompt-tokens 200]
                                     [--output-tokens 128] [--interval-ms 10] [--out FILE.md] [--jsonl FILE]

Served 8-stream runs (vs_llamacpp/run.py) show now and then one decode step of 100-130 ms against
~40 ms, stalling all eight streams at once, and with ~1,000 gaps a round one such step is the ITL P99.
This script repeats waves of `--streams` requests arriving together (the streams scenario) on one
Engine in this process, for `--duration` seconds, with an EngineObserver that stamps every device job
as it completes (time.perf_counter: CLOCK_MONOTONIC on Linux, the same clock in every process) with
its phases: queued (submit -> the device worker starts it), input prep, infer (ONNX Runtime's run),
output fetch. A second process samples the machine every `--interval-ms`:
- /proc/stat per CPU: user, system, idle, irq, softirq and steal ticks (1 tick = 10 ms),
- /proc/vmstat: compaction stalls, THP allocations and collapses, page faults,
- /proc/<this pid>/task/*/schedstat: each thread's run time and run-queue wait (ns),
and gc.callbacks records every collection of this process (generation, duration).

A decode step's wall is the time between two decode completions with no prefill job between them
(waves start with prefill steps; those are left out). Steps above `--slow-factor` x the median are
listed with their phases and what the machine did in their window; the same figures averaged over
ordinary steps are given beside them. Record the CPU with the figures (the report's header has it).
"""

from __future__ import annotations

import argparse
import bisect
import gc
import json
import os
import queue
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
VMSTAT_KEYS = ("compact_stall", "compact_fail", "compact_success", "thp_fault_alloc", "thp_collapse_alloc",
               "pgmajfault", "pgfault", "pgscan_direct", "allocstall_normal", "allocstall_movable")


# --- the sampler (its own process) -----------------------------------------------------------------------
def _read_cpus() -> dict[str, list[int]]:
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            parts = line.split()
            out[parts[0]] = [int(x) for x in parts[1:9]]
    return out


def _read_vmstat() -> dict[str, int]:
    out = {}
    for line in Path("/proc/vmstat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key in VMSTAT_KEYS:
            out[key] = int(value)
    return out


def _read_threads(pid: int) -> dict[str, list[int]]:
    """tid:name -> [run ns, wait ns, timeslices] of every thread of `pid`."""
    out = {}
    root = Path(f"/proc/{pid}/task")
    for task in root.iterdir():
        try:
            name = (task / "comm").read_text().strip()
            run, wait, slices = (int(x) for x in (task / "schedstat").read_text().split())
        except (OSError, ValueError):
            continue
        out[f"{task.name}:{name}"] = [run, wait, slices]
    return out


def sample_loop(pid: int, interval: float, path: str) -> None:
    """Write one JSON line per tick until `pid` is gone or stdin closes."""
    with open(path, "w") as f:
        while True:
            t = time.perf_counter()
            try:
                row = {"t": t, "cpus": _read_cpus(), "vm": _read_vmstat(), "threads": _read_threads(pid)}
            except FileNotFoundError:
                return
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
            time.sleep(max(0.0, interval - (time.perf_counter() - t)))


# --- the engine side -------------------------------------------------------------------------------------
@dataclass
class Trace:
    jobs: list = field(default_factory=list)    # (t_end, kind, graph, queued, prep, infer, fetch)
    gcs: list = field(default_factory=list)     # (t_start, t_end, generation, collected)
    _gc_start: float = 0.0

    def observer(self):
        from calculet.engine.observer import EngineObserver

        trace = self

        class Observer(EngineObserver):
            def job(self, kind, timings, useful_tokens):
                trace.jobs.append((time.perf_counter(), kind, timings.graph, timings.queued, timings.input_prep,
                                   timings.infer, timings.output_fetch))

        return Observer()

    def gc_callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gcs.append((self._gc_start, time.perf_counter(), info.get("generation"), info.get("collected")))


def run_waves(engine, vocab: int, streams: int, prompt_tokens: int, output_tokens: int, duration: float,
              log) -> int:
    from calculet.engine.requests import GenerationRequest, RequestDone, RequestFailed
    from calculet.engine.sampler import SamplerConfig

    rng, waves, end = random.Random(0), 0, time.perf_counter() + duration
    while time.perf_counter() < end:
        done = queue.Queue()
        for _ in range(streams):
            ids = (2,) + tuple(rng.randrange(1000, vocab - 1) for _ in range(prompt_tokens - 1))
            engine.submit(GenerationRequest(ids, SamplerConfig(temperature=0.0), output_tokens, ignore_eos=True),
                          lambda e: isinstance(e, (RequestDone, RequestFailed)) and done.put(e))
        for _ in range(streams):
            event = done.get(timeout=600)
            if isinstance(event, RequestFailed):
                raise SystemExit(f"request failed: {event.error}")
        waves += 1
        if waves % 10 == 0:
            log(f"  {waves} waves, {end - time.perf_counter():.0f} s left")
    return waves


# --- the report ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    t0: float
    t1: float
    queued: float
    prep: float
    infer: float
    fetch: float

    @property
    def wall(self) -> float:
        return self.t1 - self.t0


def decode_steps(jobs: list) -> list[Step]:
    """Consecutive decode completions with nothing else completing between them."""
    steps, prev = [], None
    for t, kind, _graph, queued, prep, infer, fetch in jobs:
        if kind == "decode" and prev is not None and prev[1] == "decode":
            steps.append(Step(prev[0], t, queued, prep, infer, fetch))
        prev = (t, kind)
    return steps


def window(samples: list[dict], t0: float, t1: float) -> tuple[dict, dict] | None:
    """The samples just before t0 and just after t1 (None when the sampler did not cover it). The samples
    are in time order, as the sampler wrote them."""
    i = bisect.bisect_right(samples, t0, key=lambda s: s["t"])   # samples[:i] have t <= t0
    j = bisect.bisect_left(samples, t1, key=lambda s: s["t"])    # samples[j:] have t >= t1
    return (samples[i - 1], samples[j]) if i > 0 and j < len(samples) else None


def machine_delta(samples: list[dict], t0: float, t1: float) -> dict | None:
    pair = window(samples, t0, t1)
    if pair is None:
        return None
    a, b = pair
    cpu = {f: sum(b["cpus"][c][i] - a["cpus"][c][i] for c in b["cpus"] if c in a["cpus"]) * 10.0
           for i, f in enumerate(CPU_FIELDS)}                                  # ms summed over CPUs
    vm = {k: b["vm"].get(k, 0) - a["vm"].get(k, 0) for k in VMSTAT_KEYS}
    waits = {k: (b["threads"][k][1] - a["threads"][k][1]) / 1e6 for k in b["threads"] if k in a["threads"]}
    runs = {k: (b["threads"][k][0] - a["threads"][k][0]) / 1e6 for k in b["threads"] if k in a["threads"]}
    return {"span_ms": (b["t"] - a["t"]) * 1e3, "cpu_ms": cpu, "vm": vm, "wait_ms": waits, "run_ms": runs}


def describe(step: Step, samples: list[dict], gcs: list) -> str:
    d = machine_delta(samples, step.t0, step.t1)
    in_gc = [g for g in gcs if g[1] > step.t0 and g[0] < step.t1]
    gc_text = ", ".join(f"gen {g[2]} {1e3 * (g[1] - g[0]):.1f} ms" for g in in_gc) or "none"
    head = (f"{1e3 * step.wall:.1f} ms: queued {1e3 * step.queued:.1f}, prep {1e3 * step.prep:.2f}, "
            f"infer {1e3 * step.infer:.1f}, fetch {1e3 * step.fetch:.2f}; host (wall - phases) "
            f"{1e3 * (step.wall - step.queued - step.prep - step.infer - step.fetch):.1f}; GC {gc_text}")
    if d is None:
        return head + "; machine: not sampled"
    cpu = d["cpu_ms"]
    waits = sorted(d["wait_ms"].items(), key=lambda kv: -kv[1])[:3]
    vm = {k: v for k, v in d["vm"].items() if v}
    return (head + f"; over {d['span_ms']:.0f} ms sampled: steal {cpu['steal']:.0f} ms, idle {cpu['idle']:.0f}, "
            f"irq+softirq {cpu['irq'] + cpu['softirq']:.0f}, system {cpu['system']:.0f}; run-queue wait "
            + ", ".join(f"{k.split(':', 1)[1]} {v:.1f} ms" for k, v in waits) + f"; vmstat {vm or 'no change'}")


def report(trace: Trace, samples: list[dict], args, waves: int, header: str) -> str:
    steps = decode_steps(trace.jobs)
    if not steps:
        return header + "\n\nno decode steps recorded\n"
    walls = sorted(s.wall for s in steps)
    median = statistics.median(walls)
    slow = [s for s in steps if s.wall > args.slow_factor * median]
    pct = lambda q: walls[min(len(walls) - 1, int(round(q / 100 * (len(walls) - 1))))] * 1e3  # noqa: E731
    lines = [header, "",
             f"{waves} waves of {args.streams} x ({args.prompt_tokens} prompt + {args.output_tokens} output tokens) "
             f"in {args.duration:.0f} s; {len(steps)} decode steps with no prefill between them: median "
             f"{median * 1e3:.1f} ms, P99 {pct(99):.1f}, P99.9 {pct(99.9):.1f}, max {walls[-1] * 1e3:.1f}; "
             f"{len(slow)} above {args.slow_factor:g} x the median; Python collections: "
             + ", ".join(f"gen {g} x{sum(1 for x in trace.gcs if x[2] == g)} (max "
                         f"{1e3 * max((x[1] - x[0] for x in trace.gcs if x[2] == g), default=0):.1f} ms)"
                         for g in (0, 1, 2)), ""]
    ordinary = [s for s in steps if s.wall <= 1.2 * median]
    if ordinary:
        mean = lambda f: 1e3 * statistics.fmean(f(s) for s in ordinary)  # noqa: E731
        lines.append(f"ordinary steps (<= 1.2 x median, {len(ordinary)}), means: queued {mean(lambda s: s.queued):.1f}, "
                     f"prep {mean(lambda s: s.prep):.2f}, infer {mean(lambda s: s.infer):.1f}, fetch "
                     f"{mean(lambda s: s.fetch):.2f} ms")
        sampled = [machine_delta(samples, s.t0, s.t1) for s in ordinary[:: max(1, len(ordinary) // 200)]]
        sampled = [d for d in sampled if d is not None]
        if sampled:
            per = lambda f: statistics.fmean(f(d) for d in sampled)  # noqa: E731
            lines.append(f"  their windows ({len(sampled)} sampled), means: steal {per(lambda d: d['cpu_ms']['steal']):.1f} ms, "
                         f"idle {per(lambda d: d['cpu_ms']['idle']):.1f} ms, span {per(lambda d: d['span_ms']):.0f} ms")
    lines += ["", "slow steps:"] + [f"- {describe(s, samples, trace.gcs)}" for s in slow[:40]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calbin", nargs="?", default=None, help="a calbin or source (default: the default model)")
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of waves (default: %(default)s)")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--interval-ms", type=float, default=10.0, help="machine sampling period (default: %(default)s)")
    ap.add_argument("--slow-factor", type=float, default=2.0, help="a slow step: above this x the median wall")
    ap.add_argument("--out", default=None, help="also write the report to this markdown file")
    ap.add_argument("--jsonl", default=None, help="keep the sampler's raw lines here (default: a temporary file)")
    ap.add_argument("--sample", nargs=3, metavar=("PID", "INTERVAL_S", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sample:
        sample_loop(int(args.sample[0]), float(args.sample[1]), args.sample[2])
        return

    import tempfile

    from calculet.cache import ensure_calbin
    from calculet.compiler.options import CompileOptions
    from calculet.cpu_features import detect
    from calculet.engine.engine import Engine, EngineConfig
    from calculet.engine.tokenizer import TextTokenizer
    from calculet.runtime.device import Device

    calbin = ensure_calbin(args.calbin, CompileOptions())
    device = Device()
    device.configure(device.load(calbin))
    tokenizer = TextTokenizer.from_program(device.program)
    trace = Trace()
    engine = Engine(device, tokenizer, EngineConfig(), trace.observer())
    engine.start()
    raw = args.jsonl or tempfile.mkstemp(prefix="stall-probe-", suffix=".jsonl")[1]
    sampler = subprocess.Popen([sys.executable, __file__, "--sample", str(os.getpid()), str(args.interval_ms / 1e3), raw])
    gc.callbacks.append(trace.gc_callback)
    try:
        run_waves(engine, device.program.vocab_size, args.streams, args.prompt_tokens, args.output_tokens, 5.0, print)
        trace.jobs.clear()
        trace.gcs.clear()
        print(f"warm-up done; {args.duration:.0f} s of waves", flush=True)
        waves = run_waves(engine, device.program.vocab_size, args.streams, args.prompt_tokens, args.output_tokens,
                          args.duration, print)
    finally:
        gc.callbacks.remove(trace.gc_callback)
        sampler.terminate()
        sampler.wait()
        engine.stop()
        device.close()
    samples = []
    with open(raw) as f:
        for line in f:
            try:
                samples.append(json.loads(line))
            except json.JSONDecodeError:   # the last line, cut by terminate()
                pass
    cpu = detect()
    header = (f"# stall probe: {calbin}\n\nCPU: {cpu.label}; sampler every {args.interval_ms:g} ms "
              f"({len(samples)} samples); raw samples: {raw}")
    text = report(trace, samples, args, waves, header)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
