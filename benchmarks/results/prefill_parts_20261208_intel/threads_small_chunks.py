"""The 16- and 64-token prefill graphs on 1 intra-op thread against 2 (two Devices, alternating).

    python threads_small_chunks.py CALBIN"""
import sys, time, statistics, numpy as np
from calculet.runtime.device import Device, DeviceConfig
from calculet.runtime.jobs import PrefillJob
res = {}
devs = {t: Device(DeviceConfig(threads=t)) for t in (1, 2)}
for t, d in devs.items(): d.configure(d.load(sys.argv[1]))
rng = np.random.default_rng(0)
for r in range(10):
    for s in (16, 64):
        for t, d in devs.items():
            lane = d.lanes.allocate()
            toks = tuple(rng.integers(3, 20000, size=s).tolist())
            t0 = time.perf_counter(); d.run(PrefillJob(lane, toks, want_logits=False), 600); res.setdefault((s, t), []).append(time.perf_counter() - t0)
            d.lanes.free(lane)
for k, v in sorted(res.items()): print(k, f"{statistics.median(v[2:])*1e3:.1f} ms")
