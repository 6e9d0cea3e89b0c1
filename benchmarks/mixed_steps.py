"""Mixed steps and ping/pong: in-flight 1 vs 2 with the step profile of each, and the step-token-budget
sweep (TTFT against ITL P99), in process on one Engine (no HTTP), variants alternated round by round.

    python benchmarks/mixed_steps.py [CALBIN] [--rounds 3] [--prompt-tokens 200] [--output-tokens 64]
                                     [--budgets 0,32,64,136,512] [--only pingpong|sweep] [--out FILE.md]

Scenarios (both on the same prompts, random token ids, ignore_eos, so every variant does equal work):
    8 streams      8 requests at once
    16 through 8   8 client threads, each sending 2 requests back to back (a finished stream sends
                   its next prompt while the others still decode)
pingpong, at the default budget: `immediate` (each job run on the engine thread itself, inside
submit: no device worker, no hand-off), `--in-flight 1` (the worker runs each job; the engine waits
for it before submitting the next) and `--in-flight 2` (the next job queued in the other staging slot
while the host samples and streams the previous one). Step profile per job kind: queued, input prep, infer and output fetch (device worker),
host sampling, and the device's idle share of the wall time (1 - summed job time / wall).
sweep: `--step-token-budget` per value (0 = none, only --max-prefill-tokens 512), in-flight 2.
Times: TTFT and ITL are measured where a client sees them (when each delta reaches the consumer).
Report medians over rounds and the worst round. Record the CPU with the numbers
(grep -o -w 'avx2\\|avx512f\\|avx512_vnni\\|avx_vnni\\|amx_int8' /proc/cpuinfo | sort -u).
"""

from __future__ import annotations

import argparse
import queue
import random
import statistics
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class Profile:
    """EngineObserver: per job kind, summed phase seconds and count; sampling seconds; step sizes."""
    phases: dict = field(default_factory=lambda: defaultdict(float))
    jobs: dict = field(default_factory=lambda: defaultdict(int))
    sampling: float = 0.0
    steps: list = field(default_factory=list)

    def observer(self):
        from calculet.engine.observer import EngineObserver

        profile = self

        class Observer(EngineObserver):
            def job(self, kind, timings, useful_tokens):
                profile.jobs[kind] += 1
                for name in ("queued", "input_prep", "infer", "output_fetch"):
                    profile.phases[(kind, name)] += getattr(timings, name)

            def sampled(self, seconds, tokens):
                profile.sampling += seconds

            def step(self, prefill_tokens, decode_rows):
                profile.steps.append((prefill_tokens, decode_rows))

        return Observer()


class Inline:
    """The device without its worker thread: submit runs the job on the caller's thread and returns a
    finished handle (the 'immediate' variant; benchmark only: it skips submit's checks and fencing)."""

    def __init__(self, device):
        self._device = device

    def __getattr__(self, name):
        return getattr(self._device, name)

    def submit(self, job):
        from calculet.errors import CalculetError
        from calculet.runtime.jobs import JobHandle

        handle = JobHandle(job=job, id=0, submitted_at=time.perf_counter())
        try:
            handle._finish(result=self._device._execute(job, queued=0.0))
        except CalculetError as exc:
            handle._finish(error=exc)
        return handle


@dataclass(frozen=True)
class Run:
    wall: float
    output_tokens: int
    ttft: list
    itl: list
    profile: Profile


def percentile(values: list, q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def prompts(vocab: int, n: int, length: int, seed: int) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    return [(2,) + tuple(rng.randrange(min(1000, vocab // 2), vocab - 1) for _ in range(length - 1)) for _ in range(n)]


def run_scenario(device, tokenizer, variant, ps: list, streams: int, output_tokens: int) -> Run:
    """`streams` client threads share the prompts, each sending its next one when the last finished."""
    from calculet.engine.engine import Engine
    from calculet.engine.requests import GenerationRequest, RequestDone, RequestFailed, SequenceDelta
    from calculet.engine.sampler import SamplerConfig

    profile = Profile()
    inline, config = variant
    engine = Engine(Inline(device) if inline else device, tokenizer, config, profile.observer())
    engine.start()
    todo = queue.Queue()
    for p in ps:
        todo.put(p)
    ttft, itl, counts, lock = [], [], [0], threading.Lock()

    def client():
        while True:
            try:
                ids = todo.get_nowait()
            except queue.Empty:
                return
            events = queue.Queue()
            sent = time.perf_counter()
            engine.submit(GenerationRequest(ids, SamplerConfig(temperature=0.0), output_tokens, ignore_eos=True),
                          events.put)
            last = None
            while True:
                event = events.get(timeout=600)
                now = time.perf_counter()
                if isinstance(event, SequenceDelta) and event.token_ids:
                    with lock:
                        (ttft.append(now - sent) if last is None else itl.append(now - last))
                        counts[0] += len(event.token_ids)
                    last = now
                elif isinstance(event, (RequestDone, RequestFailed)):
                    if isinstance(event, RequestFailed):
                        raise SystemExit(f"request failed: {event.error}")
                    break

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    engine.stop()
    return Run(wall, counts[0], ttft, itl, profile)


def summary(runs: list[Run]) -> dict:
    """Medians over rounds, and the worst round (lowest tok/s, highest ITL P99)."""
    tps = [r.output_tokens / r.wall for r in runs]
    p99 = [percentile(r.itl, 99) * 1000 for r in runs]
    return {"tok/s": statistics.median(tps), "tok/s worst": min(tps),
            "TTFT p50 ms": statistics.median(percentile(r.ttft, 50) * 1000 for r in runs),
            "ITL p50 ms": statistics.median(percentile(r.itl, 50) * 1000 for r in runs),
            "ITL p99 ms": statistics.median(p99), "ITL p99 worst": max(p99)}


def step_profile(runs: list[Run]) -> str:
    """ms per job, summed over rounds: queued / prep / infer / fetch per kind; sampling; device idle share."""
    parts = []
    for kind in ("decode", "prefill"):
        n = sum(r.profile.jobs[kind] for r in runs)
        if n:
            ms = {p: 1000 * sum(r.profile.phases[(kind, p)] for r in runs) / n
                  for p in ("queued", "input_prep", "infer", "output_fetch")}
            parts.append(f"{kind} x{n}: queued {ms['queued']:.1f} prep {ms['input_prep']:.2f} "
                         f"infer {ms['infer']:.1f} fetch {ms['output_fetch']:.2f}")
    jobs = sum(sum(r.profile.jobs.values()) for r in runs)
    busy = sum(r.profile.phases[(k, p)] for r in runs for k in ("decode", "prefill")
               for p in ("input_prep", "infer", "output_fetch"))
    wall = sum(r.wall for r in runs)
    sampling = sum(r.profile.sampling for r in runs)
    parts.append(f"sampling {1000 * sampling / max(jobs, 1):.2f} ms/job; device idle {100 * (1 - busy / wall):.0f}%")
    return "; ".join(parts)


def table(rows: list[tuple[str, dict, str]]) -> str:
    keys = list(rows[0][1])
    out = ["| variant | " + " | ".join(keys) + " | step profile |", "|---|" + "---|" * (len(keys) + 1)]
    for name, s, extra in rows:
        out.append(f"| {name} | " + " | ".join(f"{s[k]:.1f}" for k in keys) + f" | {extra} |")
    return "\n".join(out)


def compare(device, tokenizer, variants: dict, args, log) -> str:
    """Every variant once per round, in alternating order, on both scenarios."""
    vocab = device.program.vocab_size
    sections = []
    for scenario, n, streams in (("8 streams", 8, 8), ("16 through 8", 16, 8)):
        runs = defaultdict(list)
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            ps = prompts(vocab, n, args.prompt_tokens, seed=r)
            for name in order:
                runs[name].append(run_scenario(device, tokenizer, variants[name], ps, streams, args.output_tokens))
                log(f"  {scenario} round {r + 1} {name}: {runs[name][-1].output_tokens / runs[name][-1].wall:.1f} tok/s")
        rows = [(name, summary(runs[name]), step_profile(runs[name])) for name in variants]
        sections.append(f"### {scenario} ({n} requests, {args.prompt_tokens} prompt + {args.output_tokens} output "
                        f"tokens, {args.rounds} rounds)\n\n{table(rows)}")
    return "\n\n".join(sections)


def main() -> None:
    from calculet.cache import ensure_calbin
    from calculet.compiler.options import CompileOptions
    from calculet.engine.engine import EngineConfig
    from calculet.engine.tokenizer import TextTokenizer
    from calculet.runtime.device import Device

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calbin", nargs="?", default=None, help="a calbin or source (default: the default model)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--budgets", default="0,32,64,136,512", help="step token budgets to sweep (0 = none)")
    ap.add_argument("--only", choices=("pingpong", "sweep"), default=None)
    ap.add_argument("--out", default=None, help="also write the tables to this markdown file")
    args = ap.parse_args()
    calbin = ensure_calbin(args.calbin, CompileOptions())
    device = Device()
    device.configure(device.load(calbin))
    tokenizer = TextTokenizer.from_program(device.program)
    out = [f"calbin: {calbin}"]
    try:
        if args.only in (None, "pingpong"):
            print("ping/pong: immediate vs in-flight 1 vs in-flight 2", flush=True)
            variants = {"immediate": (True, EngineConfig(in_flight=1)),
                        **{f"in-flight {k}": (False, EngineConfig(in_flight=k)) for k in (1, 2)}}
            out.append("## Ping/pong (default step budget)\n\n" + compare(device, tokenizer, variants, args, print))
        if args.only in (None, "sweep"):
            print("step-token-budget sweep (in-flight 2)", flush=True)
            budgets = [int(b) for b in args.budgets.split(",")]
            variants = {f"budget {b or 'none'}": (False, EngineConfig(step_token_budget=b)) for b in budgets}
            out.append("## Step token budget (TTFT vs ITL P99)\n\n" + compare(device, tokenizer, variants, args, print))
    finally:
        device.close()
    text = "\n\n".join(out) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
