"""Each prefill graph called alone on a fresh lane, with and without the head (want_logits), 12 rounds, medians of the last 10.

    python chunk_calls.py CALBIN 16,64,128"""
import sys, time, statistics, numpy as np
from calculet.runtime.device import Device, DeviceConfig
from calculet.runtime.jobs import PrefillJob
d = Device(DeviceConfig(threads=2)); d.configure(d.load(sys.argv[1]))
sizes = [int(s) for s in sys.argv[2].split(",")]
rng = np.random.default_rng(0)
res = {}
for r in range(12):
    for s in sizes:
      for wl in (False, True):
        lane = d.lanes.allocate()
        toks = tuple(rng.integers(3, 20000, size=s).tolist())
        t = time.perf_counter(); d.run(PrefillJob(lane, toks, want_logits=wl), 600); res.setdefault((s,wl),[]).append(time.perf_counter() - t)
        d.lanes.free(lane)
for k,v in res.items():
    print(k, f"{statistics.median(v[2:])*1e3:.1f} ms")
d.close()
