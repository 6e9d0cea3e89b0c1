"""Decode step time of several calbins side by side, through the real runtime (Device, IO bindings, jobs).

    python step_ab.py A.calbin,B.calbin,... ROUNDS

Each calbin gets its own Device with 8 lanes prefilled to 128 tokens. Per round, in alternating order, each
device rewinds its lanes to 128 tokens, warms 3 steps, then times 20 decode steps at 1 lane and 20 at 8 lanes
(the mean). The table gives per calbin the median and the fastest round, and the median of the per-round
ratios to the first calbin (paired: each round's noise hits all of them alike), with its quartiles.
"""
import statistics
import sys
import time

from calculet.runtime.device import Device
from calculet.runtime.jobs import DecodeJob, PrefillJob

paths = sys.argv[1].split(",")
rounds = int(sys.argv[2])
devs = {}
for path in paths:
    d = Device()
    d.configure(d.load(path))
    lanes = [d.lanes.allocate() for _ in range(8)]
    for lane in lanes:
        d.run(PrefillJob(lane, tuple(range(10, 138))), 600)
    devs[path] = (d, lanes)
res = {(p, k): [] for p in paths for k in (1, 8)}
for r in range(rounds):
    for path in (paths if r % 2 == 0 else paths[::-1]):
        d, lanes = devs[path]
        for lane in lanes:
            d.lanes.rewind(lane, 128)
        for k in (1, 8):
            for _ in range(3):
                d.run(DecodeJob(tuple(lanes[:k]), (5,) * k), 600)
            t0 = time.perf_counter()
            for _ in range(20):
                d.run(DecodeJob(tuple(lanes[:k]), (5,) * k), 600)
            res[(path, k)].append((time.perf_counter() - t0) / 20 * 1e3)
for k in (1, 8):
    base = res[(paths[0], k)]
    for path in paths:
        v = res[(path, k)]
        rr = sorted(a / b for a, b in zip(v, base))
        print(f"lanes {k} {path}: median {statistics.median(v):6.2f} ms, fastest {min(v):6.2f}; per-round ratio to "
              f"the first: median {statistics.median(rr):.3f} (quartiles {rr[len(rr) // 4]:.3f}-{rr[3 * len(rr) // 4]:.3f})")
