"""A 128-token chunk's GEMMs one by one: qkv, o_proj, gate/up on the int8 rows, down_proj on both kernels.

    python gemms.py ROWS
"""
import sys, time, statistics, random
import numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from matmulnbits_kernels import session, rows8_session
R = int(sys.argv[1])
shapes = {"qkv": (1536, 640), "o": (640, 1024), "gate_up": (4096, 640), "down": (640, 2048)}
rng = np.random.default_rng(1)
sess = {f"{k}-rows8": (rows8_session(n, kk, R, 2), kk) for k, (n, kk) in shapes.items()}
sess["down-b32"] = (session(8, 4, 640, 2048, 32, 2), 2048)
times = {k: [] for k in sess}
for rnd in range(9):
    order = list(sess); random.shuffle(order)
    for nm in order:
        s, kk = sess[nm]; A = rng.standard_normal((R, kk), dtype=np.float32)
        s.run(None, {"A": A}); t0 = time.perf_counter()
        for _ in range(20): s.run(None, {"A": A})
        times[nm].append((time.perf_counter() - t0) / 20 * 1e6)
med = {k: statistics.median(v) for k, v in times.items()}
print(" ".join(f"{k} {v:.0f}us" for k, v in med.items()))
per_layer = med["qkv-rows8"] + med["o-rows8"] + med["gate_up-rows8"] + med["down-b32"]
print(f"per layer {per_layer:.0f} us, x18 = {per_layer*18/1000:.1f} ms")
