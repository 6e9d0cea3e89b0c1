"""8-bit MatMulNBits at block sizes 32/64/128/256 (int8 compute) against the int8 rows, per row count.

    python blocks.py N K ROWS      e.g. python blocks.py 640 2048 1,8,16,64,128   (down_proj)
"""
import sys, time, statistics, random
import numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from matmulnbits_kernels import session, rows8_session
n, k = int(sys.argv[1]), int(sys.argv[2])
rows = [int(r) for r in sys.argv[3].split(",")]
blocks = [32, 64, 128, 256]
rng = np.random.default_rng(1)
for r in rows:
    A = rng.standard_normal((r, k), dtype=np.float32)
    sess = {f"b{b}": session(8, 4, n, k, b, 2) for b in blocks}
    sess["rows8"] = rows8_session(n, k, r, 2)
    times = {name: [] for name in sess}
    calls = 20 if r >= 64 else 200
    for rnd in range(9):
        order = list(sess); random.shuffle(order)
        for name in order:
            s = sess[name]; s.run(None, {"A": A})
            t0 = time.perf_counter()
            for _ in range(calls): s.run(None, {"A": A})
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
    base = statistics.median(times["b32"])
    print(f"[{n}x{k}] rows {r}: " + "  ".join(f"{nm} {statistics.median(v):.0f}us ({statistics.median(v)/base:.2f}x)" for nm, v in times.items()), flush=True)
