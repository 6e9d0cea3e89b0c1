"""Per-node kernel time of the decode graph's GroupQueryAttention nodes (ONNX Runtime profiler), lanes prefilled to FILL
tokens: python gqa_per_node.py CALBIN LANES FILL."""
import collections, json, os, sys, tempfile
import onnxruntime as ort
from calculet.runtime.device import Device
from calculet.runtime.jobs import DecodeJob, PrefillJob
calbin, lanes, fill, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), 30
orig = ort.SessionOptions
prefix = os.path.join(tempfile.mkdtemp(), "ort")
class P(orig):
    def __init__(self):
        super().__init__(); self.enable_profiling = True; self.profile_file_prefix = prefix
ort.SessionOptions = P
d = Device(); d.configure(d.load(calbin)); ort.SessionOptions = orig
ls = [d.lanes.allocate() for _ in range(lanes)]
for l in ls:
    done = 0
    while done < fill:
        n = min(128, fill - done); d.run(PrefillJob(l, tuple(range(10 + done, 10 + done + n))), 600); done += n
for _ in range(steps):
    d.run(DecodeJob(tuple(ls), (5,) * lanes), 600)
g = d.program.decode_graph_for(lanes)
node = collections.Counter()
for ev in json.load(open(d.program.sessions[g.name].end_profiling())):
    if ev.get("cat") == "Node" and ev["name"].endswith("_kernel_time") and ev["args"]["op_name"] == "GroupQueryAttention":
        node[ev["name"][:-len("_kernel_time")]] += ev["dur"]
for name, us in sorted(node.items()):
    print(f"{name:60s} {us / steps:8.1f} us")
print(f"total GQA {sum(node.values()) / steps / 1000:.2f} ms per step")
d.close()
