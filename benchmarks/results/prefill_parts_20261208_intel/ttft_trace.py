"""A 200-token prompt through calculet.LLM (max 2 tokens): TTFT and when each device job was submitted and finished.

    python ttft_trace.py CALBIN"""
import sys, time, statistics, numpy as np
from calculet import LLM, SamplingParams
from calculet.runtime import device as devmod
log = []
orig_submit, orig_wait = devmod.Device.submit, devmod.Device.wait
def submit(self, job):
    log.append(("submit", type(job).__name__, getattr(job, "tokens", None) and len(job.tokens), time.perf_counter())); return orig_submit(self, job)
def wait(self, h, timeout=None):
    r = orig_wait(self, h, timeout); log.append(("done", "", 0, time.perf_counter())); return r
devmod.Device.submit, devmod.Device.wait = submit, wait
llm = LLM(sys.argv[1], threads=2, lanes=8)
rng = np.random.default_rng(1)
p = SamplingParams(max_tokens=2, min_tokens=2, ignore_eos=True, temperature=0)
for r in range(6):
    prompt = rng.integers(3, 20000, size=200).tolist()
    log.clear()
    t0 = time.perf_counter()
    for d in llm.stream(prompt, p):
        t1 = time.perf_counter(); break
    for d in llm.stream(prompt[:5], p): pass
    if r >= 3:
        print(f"TTFT {(t1-t0)*1e3:.1f}")
        for e in log:
            if e[3] <= t1 + 0.001: print(f"   {e[0]:7s} {e[1]:12s} {e[2]} {(e[3]-t0)*1e3:7.1f}")
llm.close()
