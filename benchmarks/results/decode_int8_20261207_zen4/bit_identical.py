"""Bit-identity of two calbins through the real runtime: prefill chunks, 8-lane and 1-lane decode, full logits."""
import sys, numpy as np
from calculet.runtime.device import Device
from calculet.runtime.jobs import DecodeJob, PrefillJob
def trace(path):
    d = Device(); d.configure(d.load(path)); out = []
    lanes = [d.lanes.allocate() for _ in range(8)]
    rng = np.random.default_rng(7)
    for i, l in enumerate(lanes):
        n = [200, 17, 64, 1, 130, 90, 5, 150][i]
        toks = tuple(int(t) for t in rng.integers(3, 50000, n))
        pos = 0
        while pos < n:
            c = min(128, n - pos)
            r = d.run(PrefillJob(l, toks[pos:pos + c]), 600); pos += c
        out.append(r.logits.copy()); out.append(r.topk_ids.copy())
    for step in range(6):
        r = d.run(DecodeJob(tuple(lanes), tuple(int(t) for t in rng.integers(3, 50000, 8))), 600)
        out += [r.logits.copy(), r.topk_ids.copy(), r.topk_values.copy()]
        r = d.run(DecodeJob((lanes[step],), (int(rng.integers(3, 50000)),)), 600)
        out += [r.logits.copy(), r.topk_ids.copy(), r.topk_values.copy()]
    d.close(); return out
a, b = trace(sys.argv[1]), trace(sys.argv[2])
diff = [i for i, (x, y) in enumerate(zip(a, b)) if not np.array_equal(x, y)]
print("arrays", len(a), "differing", len(diff), diff[:10])
if diff:
    i = diff[0]; print("max abs diff", np.abs(a[i].astype(np.float64) - b[i]).max())
