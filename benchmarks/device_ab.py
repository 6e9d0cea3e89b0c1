"""Two DeviceConfig settings side by side on one calbin, each in processes of its own (settings that
act on the whole process, such as `hugepages`, cannot share one), alternating A/B, B/A, ...

    python benchmarks/device_ab.py CALBIN --a hugepages=off --b hugepages=collapse --rounds 6

Each process opens the device (2 threads by default), warms it, then --reps times: a 200-token prompt
on one lane in the engine's calls (128 + 64 + 8), a 1-lane decode step and an 8-lane decode step
(the lanes hold 128 tokens; 20 steps each, the mean). A round is one process of each side; the table
gives per round each side's medians over its reps and B/A, then the medians and worst rounds. The
device alone: no engine, no HTTP (benchmarks/serve_ab.py measures the served path).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

METRICS = ("prefill 200 ms", "decode 1 lane ms", "decode 8 lanes ms")


def parse_setting(text: str) -> dict:
    """"hugepages=off,spinning=run" -> {"hugepages": "off", "spinning": "run"} (DeviceConfig fields)."""
    out = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"error: a setting is FIELD=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def measure(calbin: str, setting: dict, threads: int, reps: int) -> dict:
    """One process's medians (runs in the child)."""
    import numpy as np

    from calculet.runtime.device import Device
    from calculet.runtime.jobs import DecodeJob, PrefillJob
    from calculet.runtime.program import DeviceConfig

    device = Device(DeviceConfig(threads=threads, **setting))
    device.configure(device.load(calbin))
    rng = np.random.default_rng(0)
    vocab = min(device.program.manifest.spec.vocab_size, 20000)

    def prompt(n):
        return tuple(int(t) for t in rng.integers(3, vocab, size=n))

    def prefill() -> float:
        ids, lane = prompt(200), device.lanes.allocate()
        t0, start = time.perf_counter(), 0
        for n in (128, 64, 8):
            device.run(PrefillJob(lane, ids[start:start + n], want_logits=start + n >= 200), 600)
            start += n
        elapsed = time.perf_counter() - t0
        device.lanes.free(lane)
        return elapsed * 1e3

    def decode(n: int, steps: int = 20) -> float:
        lanes = [device.lanes.allocate() for _ in range(n)]
        for lane in lanes:
            device.run(PrefillJob(lane, prompt(128), want_logits=False), 600)
        tokens = tuple(5 + i for i in range(n))
        for _ in range(2):
            device.run(DecodeJob(tuple(lanes), tokens, full_logits=False), 600)
        t0 = time.perf_counter()
        for _ in range(steps):
            device.run(DecodeJob(tuple(lanes), tokens, full_logits=False), 600)
        elapsed = (time.perf_counter() - t0) / steps
        for lane in lanes:
            device.lanes.free(lane)
        return elapsed * 1e3

    prefill(), decode(8)   # first runs: not timed
    values = {m: [] for m in METRICS}
    for _ in range(reps):
        values[METRICS[0]].append(prefill())
        values[METRICS[1]].append(decode(1))
        values[METRICS[2]].append(decode(8))
    device.close()
    return {m: statistics.median(v) for m, v in values.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("calbin")
    p.add_argument("--a", default="", help="DeviceConfig fields of side A, e.g. hugepages=off")
    p.add_argument("--b", default="", help="DeviceConfig fields of side B")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--reps", type=int, default=5, help="measurements per process (their median is the process's)")
    p.add_argument("--out", type=Path, default=None, help="also write the table to this markdown file")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        print(json.dumps(measure(args.calbin, parse_setting(args.child), args.threads, args.reps)))
        return 0
    sides = {"A": args.a, "B": args.b}
    for text in sides.values():
        parse_setting(text)
    results = {"A": [], "B": []}
    for r in range(args.rounds):
        for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
            out = subprocess.run([sys.executable, __file__, args.calbin, "--threads", str(args.threads), "--reps",
                                  str(args.reps), "--child", sides[side]], capture_output=True, text=True, check=True)
            results[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {side}: " + ", ".join(f"{m} {v:.2f}" for m, v in results[side][-1].items()), file=sys.stderr)
    from calculet.cpu_features import detect
    from calculet.runtime.hugepages import thp_mode

    lines = [f"# device A/B: A = `{args.a}`, B = `{args.b}`", "",
             f"CPU: {detect().label}; kernel {os.uname().release}, THP mode {thp_mode()}; {args.threads} threads; "
             f"{args.rounds} rounds (one process per side each, order alternating), {args.reps} reps per process; "
             f"lower is better", "",
             "| metric | round | A | B | B/A |", "|---|---|---|---|---|"]
    for m in METRICS:
        a, b = [x[m] for x in results["A"]], [x[m] for x in results["B"]]
        ratios = [y / x for x, y in zip(a, b)]
        lines += [f"| {m} | {i + 1} | {x:.2f} | {y:.2f} | {y / x:.3f}x |" for i, (x, y) in enumerate(zip(a, b))]
        lines.append(f"| {m} | **median (worst)** | {statistics.median(a):.2f} ({max(a):.2f}) | "
                     f"{statistics.median(b):.2f} ({max(b):.2f}) | **{statistics.median(ratios):.3f}x** "
                     f"({max(ratios):.3f}x); B faster in {sum(q < 1 for q in ratios)} of {len(ratios)} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
