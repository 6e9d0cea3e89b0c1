"""One wave of 8 x 200-token prompts, 128 greedy tokens each, through the in-process API (LLM.generate),
the engine calculet serve runs, without HTTP. python wave_in_process.py CALBIN (4 rounds)."""
import time, statistics, numpy as np, sys
from calculet import LLM, SamplingParams
llm = LLM(sys.argv[1], threads=2)
rng = np.random.default_rng(0)
res = []
for r in range(4):
    prompts = [[2] + rng.integers(1000, 30000, 199).tolist() for _ in range(8)]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=128, temperature=0, ignore_eos=True))
    dt = time.perf_counter() - t0
    n = sum(o.usage.completion_tokens for o in outs)
    res.append(n / dt); print(f"round {r}: {n} tokens in {dt:.2f} s = {n/dt:.1f} tok/s", flush=True)
print("median", statistics.median(res))
