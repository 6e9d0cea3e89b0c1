"""The engine thread's host work per step during an 8-prompt burst: each Engine method's time per call.

    python hostgap.py CALBIN
"""
import sys, time, threading, statistics, collections
import numpy as np
from calculet import LLM, SamplingParams
from calculet.engine import engine as E
acc = collections.defaultdict(float); cnt = collections.Counter()
def timed(cls, name):
    orig = getattr(cls, name)
    def w(self, *a, **k):
        t0 = time.perf_counter()
        try: return orig(self, *a, **k)
        finally: acc[name] += time.perf_counter() - t0; cnt[name] += 1
    setattr(cls, name, w)
for n in ("_schedule", "_jobs", "_sample", "_emit", "_publish", "_take_snapshot", "_expire", "_observe", "_settle", "step"):
    timed(E.Engine, n)
llm = LLM(sys.argv[1], threads=2, lanes=8)
rng = np.random.default_rng(0)
params = SamplingParams(max_tokens=128, min_tokens=128, ignore_eos=True, temperature=0)
def run():
    prompts = [[2] + rng.integers(3, 20000, size=199).tolist() for _ in range(8)]
    streams = [llm.stream(p, params) for p in prompts]
    def read(i):
        for d in streams[i]: pass
    ths = [threading.Thread(target=read, args=(i,)) for i in range(8)]
    [t.start() for t in ths]; [t.join() for t in ths]
run(); acc.clear(); cnt.clear()
t0 = time.perf_counter(); run(); wall = time.perf_counter() - t0
steps = cnt["step"]
print(f"wall {wall*1e3:.0f} ms, steps {steps}")
for n in sorted(acc, key=lambda n: -acc[n]): print(f"  {n:15s} total {acc[n]*1e3:7.1f} ms  per call {acc[n]/cnt[n]*1e3:.3f} ms  calls {cnt[n]}")
llm.close()
