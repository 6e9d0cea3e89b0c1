"""Where an 8-prompt burst goes in calculet.LLM (the vs_openvino batch8 scenario): each graph's calls and
infer time, the device's busy share, the decode steps' wall time against their infer time.

    python burst8.py CALBIN
"""
import sys, time, threading, statistics, collections
import numpy as np
from calculet import LLM, SamplingParams
from calculet.engine import observer as obs
rec = collections.defaultdict(list)
def job(self, kind, timings, useful):
    rec["job"].append((time.perf_counter(), kind, timings.graph, timings.infer, timings.queued, timings.input_prep, timings.output_fetch))
def step(self, prefill_tokens, decode_rows):
    rec["step"].append((time.perf_counter(), prefill_tokens, decode_rows))
def sampled(self, seconds, tokens):
    rec["sampled"].append((time.perf_counter(), seconds, tokens))
obs.EngineObserver.job, obs.EngineObserver.step, obs.EngineObserver.sampled = job, step, sampled
llm = LLM(sys.argv[1], threads=2, lanes=8)
rng = np.random.default_rng(0)
params = SamplingParams(max_tokens=128, min_tokens=128, ignore_eos=True, temperature=0)
def run():
    prompts = [[2] + rng.integers(3, 20000, size=199).tolist() for _ in range(8)]
    arrivals = [[] for _ in prompts]
    t0 = time.perf_counter()
    streams = [llm.stream(p, params) for p in prompts]
    def read(i):
        for d in streams[i]: arrivals[i] += [time.perf_counter()] * len(d.token_ids)
    ths = [threading.Thread(target=read, args=(i,)) for i in range(8)]
    [t.start() for t in ths]; [t.join() for t in ths]
    return t0, time.perf_counter() - t0, arrivals
run()
for k in rec: rec[k].clear()
t0, wall, arrivals = run()
ttft = sorted(a[0] - t0 for a in arrivals)
print(f"wall {wall*1e3:.0f} ms, tok/s {1024/wall:.1f}, TTFT p50 {statistics.median(ttft)*1e3:.0f} ms, first {ttft[0]*1e3:.0f} last {ttft[-1]*1e3:.0f}")
jobs = rec["job"]
by = collections.defaultdict(list)
for t, kind, graph, infer, queued, prep, fetch in jobs: by[graph].append((infer, queued, prep, fetch))
for g, v in sorted(by.items()):
    inf = [x[0] for x in v]
    print(f"{g}: n {len(v)} infer sum {sum(inf)*1e3:.0f} ms median {statistics.median(inf)*1e3:.1f} ms; queued med {statistics.median([x[1] for x in v])*1e3:.2f}; prep {statistics.median([x[2] for x in v])*1e3:.2f} fetch {statistics.median([x[3] for x in v])*1e3:.2f}")
dev = sum(x[3] for x in jobs)
print(f"device infer total {dev*1e3:.0f} ms of wall {wall*1e3:.0f} ms ({dev/wall:.0%})")
last_prefill = max(t for t, k, g, *_ in jobs if g.startswith("prefill"))
dec = [(t, i) for t, k, g, i, *_ in jobs if g.startswith("decode")]
dec_after = [x for x in dec if x[0] > last_prefill]
if len(dec_after) > 2:
    span = dec_after[-1][0] - dec_after[0][0]
    print(f"pure decode phase: {len(dec_after)} steps, {span/(len(dec_after)-1)*1e3:.1f} ms per step wall, infer median {statistics.median([i for _, i in dec_after])*1e3:.1f} ms")
print("prefill done at", round((last_prefill - t0) * 1e3), "ms; decode steps before it:", len([x for x in dec if x[0] <= last_prefill]))
llm.close()
s = rec["sampled"]
print("sampled events", len(s), "median seconds", statistics.median([x[1] for x in s]) * 1e3, "ms; tokens med", statistics.median([x[2] for x in s]))
# gaps between a decode job's end (its observe time) and the next decode job's observe minus its infer
d = [(t, i, q) for t, k, g, i, q, *_ in jobs if g.startswith("decode")]
gaps = [ (d[j+1][0] - d[j+1][1]) - d[j][0] for j in range(len(d) - 1)]
print("between a decode step's observe and the next one's start (approx):", round(statistics.median(gaps) * 1e3, 2), "ms")
