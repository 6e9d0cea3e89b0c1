"""What one prefill call costs: chunk plans run call by call on one lane, each call timed.

    python benchmarks/prefill_calls.py CALBIN [--plans 16,64,120 128,72 8,8,8,8] [--rounds 9] [--threads 2]

Each plan is a sequence of chunk sizes prefilled one after the other on a fresh lane (random ids, the
runtime's PrefillJob, no head): the first call starts at position 0, the next where the last ended.
Prints per plan the median time of every call (the first two rounds are warm-up) and their sum, with
the CPU's features. A call's time depends on the calls around it (each prefill session streams its
own prepacked weights), so compare plans, not calls of different runs. From the per-size times, a
call's fixed cost and per-token cost follow (benchmarks/RESULTS.md, 2026-12-05).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    from calculet.cpu_features import detect
    from calculet.runtime.device import Device, DeviceConfig
    from calculet.runtime.jobs import PrefillJob

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("calbin")
    p.add_argument("--plans", nargs="+", default=["16,64,120", "120,64,16", "128,72", "8,8,8,8", "128,128,128,128,128"])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    device = Device(DeviceConfig(threads=args.threads))
    device.configure(device.load(args.calbin))
    vocab = device.program.vocab_size
    rng = np.random.default_rng(0)
    print(f"CPU: {detect().label}; {args.threads} threads; {args.calbin}")
    try:
        for plan in ([int(x) for x in text.split(",")] for text in args.plans):
            rounds = []
            for _ in range(args.rounds):
                lane, row = device.lanes.allocate(), []
                try:
                    for size in plan:
                        ids = tuple(int(t) for t in rng.integers(3, min(vocab, 20000), size=size))
                        t0 = time.perf_counter()
                        device.run(PrefillJob(lane, ids, want_logits=False), 600)
                        row.append(time.perf_counter() - t0)
                finally:
                    device.lanes.free(lane)
                rounds.append(row)
            medians = [statistics.median(call) * 1e3 for call in zip(*rounds[2:])]
            print(f"plan {','.join(map(str, plan))}: " + " ".join(f"{m:.1f}" for m in medians) +
                  f" ms; total {sum(medians):.1f} ms")
    finally:
        device.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
