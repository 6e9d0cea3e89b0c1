"""Two calbins (same weights, different graphs): logits of the same prefill chunks and decode steps, compared bit for bit."""
import sys
import numpy as np
from calculet.runtime.device import Device
from calculet.runtime.jobs import DecodeJob, PrefillJob
outs = []
for path in sys.argv[1:3]:
    d = Device(); d.configure(d.load(path))
    lanes = [d.lanes.allocate() for _ in range(8)]
    got = []
    for i, lane in enumerate(lanes):
        ids = [(7 * i + 31 * j) % 50000 + 100 for j in range(200)]
        got.append(d.run(PrefillJob(lane, tuple(ids[:128])), 600).logits)
        got.append(d.run(PrefillJob(lane, tuple(ids[128:192])), 600).logits)
        got.append(d.run(PrefillJob(lane, tuple(ids[192:200])), 600).logits)
    tokens = (5,) * 8
    for _ in range(4):
        r = d.run(DecodeJob(tuple(lanes), tokens), 600); got.append(r.logits)
        tokens = tuple(int(t) for t in np.argmax(r.logits, axis=-1))
    r = d.run(DecodeJob((lanes[3],), (tokens[3],)), 600); got.append(r.logits)
    outs.append(got)
same = [np.array_equal(a, b) for a, b in zip(*outs)]
worst = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(*outs))
print(f"{sum(same)} of {len(same)} outputs bit-identical; largest difference {worst:g}")
