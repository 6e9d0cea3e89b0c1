"""8 rows (an 8-lane decode step) through the body shapes: 8-bit MatMulNBits int8 compute vs per-token
u8 x u8 MatMulIntegerToFloat (uint8 codes around 128, as the prefill-int8 pass stores them without VNNI)."""
import sys, time, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # benchmarks/: matmulnbits_kernels
import numpy as np
from matmulnbits_kernels import rows8_session, session
from calculet.cpu_features import detect

print(detect().label if hasattr(detect(), "label") else detect())
rows = int(sys.argv[1]) if len(sys.argv) > 1 else 8
for name, n, k in (("qkv", 1536, 640), ("o_proj", 640, 1024), ("gate_up", 4096, 640), ("down", 640, 2048)):
    s = {"blocks8": session(8, 4, n, k, 32, 2), "u8u8": rows8_session(n, k, rows, 2, True), "u8s8": rows8_session(n, k, rows, 2, False)}
    a = np.random.default_rng(1).standard_normal((rows, k)).astype(np.float32)
    t = {key: [] for key in s}
    for _ in range(7):
        for key, sess in s.items():
            for _ in range(20): sess.run(None, {"A": a})
            t0 = time.perf_counter()
            for _ in range(100): sess.run(None, {"A": a})
            t[key].append((time.perf_counter() - t0) / 100 * 1e6)
    med = {key: statistics.median(v) for key, v in t.items()}
    print(f"{name} [{rows} x {k}] x [{k} x {n}]: " + "  ".join(f"{key} {v:.0f} us ({v / med['blocks8']:.2f}x)" for key, v in med.items()))
