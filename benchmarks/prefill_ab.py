"""Prefill formulations side by side: the same long prompt through two or more calbins, alternating.

    python benchmarks/prefill_ab.py A.calbin B.calbin [--tokens 1000] [--rounds 5] [--threads 2]

Each calbin prefills the same prompt (random ids, fixed seed) in the pieces the runtime's
plan_chunks picks from its own chunk sizes, `--rounds` times, alternating calbins so drifts of a
shared machine hit all alike. Prints per calbin the median prefill time, tokens/s and the ratio to the
first calbin, plus the numerics beside it: the largest |logit| difference of the last position and
whether the next greedy token agrees (a formulation is kept only if gate F passes as well:
`calculet validate B.calbin` on a calbin compiled with golden/). CPU features are printed with the
result. Ratios only on a shared machine; absolute numbers belong to a quiet one.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def prefill_once(device, tokens: list[int]) -> tuple[float, np.ndarray]:
    from calculet.runtime.chunking import plan_chunks
    from calculet.runtime.jobs import PrefillJob

    lane = device.lanes.allocate()
    try:
        sizes = plan_chunks(len(tokens), 0, device.program.chunk_sizes, device.lanes.context)
        t0, done, result = time.perf_counter(), 0, None
        for i, size in enumerate(sizes):
            last = i == len(sizes) - 1
            result = device.run(PrefillJob(lane, tuple(tokens[done:done + size]), want_logits=last), 600)
            done += size
        return time.perf_counter() - t0, np.asarray(result.logits[0], dtype=np.float64)
    finally:
        device.lanes.free(lane)


def main(argv: list[str] | None = None) -> int:
    from calculet.cpu_features import detect
    from calculet.runtime.device import Device, DeviceConfig

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("calbins", nargs="+")
    p.add_argument("--tokens", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    devices = []
    for path in args.calbins:
        d = Device(DeviceConfig(threads=args.threads))
        d.configure(d.load(path))
        devices.append(d)
    vocab = devices[0].program.vocab_size
    tokens = np.random.default_rng(0).integers(3, min(vocab, 20000), size=args.tokens).tolist()
    times = [[] for _ in devices]
    logits = [None] * len(devices)
    try:
        for d in devices:  # warm-up: first-run allocations of every graph size used
            prefill_once(d, tokens)
        for _ in range(args.rounds):
            for i, d in enumerate(devices):
                seconds, logits[i] = prefill_once(d, tokens)
                times[i].append(seconds)
    finally:
        for d in devices:
            d.close()
    print(f"CPU: {detect().label}; prompt {args.tokens} tokens; {args.rounds} alternating rounds; threads {args.threads}")
    base = statistics.median(times[0])
    for path, t, lg, d in zip(args.calbins, times, logits, devices):
        med = statistics.median(t)
        diff = float(np.abs(lg - logits[0]).max())
        same = int(np.argmax(lg)) == int(np.argmax(logits[0]))
        print(f"{path}: chunks {list(d.program.chunk_sizes)}  median {med * 1e3:.0f} ms  worst {max(t) * 1e3:.0f} ms  "
              f"{args.tokens / med:.0f} tok/s  time ratio {med / base:.2f}x  max |dlogit| {diff:.3g}  "
              f"greedy {'same' if same else 'DIFFERS'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
