"""ONNX Runtime's profiler over prefill_16 and prefill_128 (one call each per repeat, fresh lanes): per op type, ms per call, and
the difference scaled to 128 tokens (what grows with the tokens; each node also carries ~28 us of profiler overhead).

    python profile_16_128.py CALBIN REPEATS"""
import collections, json, sys, tempfile
from calculet.runtime.device import Device, DeviceConfig
from calculet.runtime.jobs import PrefillJob
calbin, reps = sys.argv[1], int(sys.argv[2])
d = Device(DeviceConfig(threads=2, profile_dir=tempfile.mkdtemp()))   # every session writes ONNX Runtime's profile
d.configure(d.load(calbin))
for r in range(reps):
    for c in (16, 128):
        lane = d.lanes.allocate()
        d.run(PrefillJob(lane, tuple(range(10, 10 + c))), 600)
        d.lanes.free(lane)
tot = collections.Counter()
for name, s in d.program.sessions.items():
    if name not in ("prefill_16", "prefill_128"): continue
    for e in json.load(open(s.end_profiling())):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            tot[(name, e['args']['op_name'])] += e["dur"]
ops = sorted({k[1] for k in tot}, key=lambda o: -tot[("prefill_128", o)])
print(f"{'op':32s} {'p16':>8s} {'p128':>8s} {'slope/128':>9s}")
s16=s128=0
for o in ops:
    a, b = tot[("prefill_16", o)]/1000/reps, tot[("prefill_128", o)]/1000/reps
    s16+=a; s128+=b
    print(f"{o:32s} {a:8.2f} {b:8.2f} {(b-a)*128/112:9.2f}")
print("total", s16, s128)
d.close()
