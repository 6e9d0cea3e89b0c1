"""ONNX Runtime's profiler over a prefill chunk's graph: per op type and per node, ms per call.

    python profile_prefill.py CALBIN CHUNK REPEATS     (two chunks of CHUNK tokens per repeat, each on a fresh lane)

The profiler adds tens of microseconds per node: small nodes are overstated (RESULTS.md, 2026-12-05 (2))."""
import collections, json, os, sys, tempfile
import onnxruntime as ort
from calculet.runtime.device import Device
from calculet.runtime.jobs import PrefillJob
calbin, chunk, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
original = ort.SessionOptions
prefix = os.path.join(tempfile.mkdtemp(), "ort")
class Profiled(original):
    def __init__(self):
        super().__init__(); self.enable_profiling = True; self.profile_file_prefix = prefix
ort.SessionOptions = Profiled
d = Device(); d.configure(d.load(calbin)); ort.SessionOptions = original
for r in range(reps):
    lane = d.lanes.allocate()
    pos = 0
    for c in [chunk, chunk]:
        d.run(PrefillJob(lane, tuple(range(10 + pos, 10 + pos + c))), 600); pos += c
    d.lanes.free(lane)
tot = collections.Counter(); nodes = collections.Counter()
for name, s in d.program.sessions.items():
    if not name.startswith("prefill"): continue
    for e in json.load(open(s.end_profiling())):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            tot[f"{name}:{e['args']['op_name']}"] += e["dur"]
            nodes[e["name"][:-12]] += e["dur"]
n = reps * 2
print("sessions", [k for k in d.program.sessions])
for k, v in tot.most_common(18): print(f"{k:55s} {v/1000/n:8.2f} ms/call")
print("--- nodes (first layer-ish)")
for k, v in nodes.most_common(25): print(f"{k:70s} {v/1000/n:8.3f}")
d.close()
