"""The lm_head's candidate product [R, 640] x [640, 262144], per kernel, timed alone (its weights stream: 84-168 MB):

    python head_kernels.py ROWS KINDS       e.g.  python head_kernels.py 1,2,4,8,16 s7,mnb4a4

s7: MatMulInteger u8 x s8 over 7-bit codes (the several-row coarse head's kernel without an int8 dot; pair-bounded
codes run the same kernel); s8: full-range codes; mnb4a4 / mnb4a0: MatMulNBits 4-bit blocks of 64, int8 / fp32
compute (the one-row coarse head's); mnb8a4: 8-bit blocks of 32."""
import statistics, sys, time
from pathlib import Path
import numpy as np
from onnx import TensorProto, helper, numpy_helper
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from matmulnbits_kernels import open_session
K, N = 640, 262144

def session(kind, rows, rng):
    inits = [numpy_helper.from_array(np.array(0, np.uint8), "AZ")]
    if kind.startswith("mnb"):
        bits = 4 if "4" in kind else 8
        block = 64 if bits == 4 else 32
        acc = 4 if kind.endswith("a4") else 0
        inits = [numpy_helper.from_array(rng.integers(0, 256, (N, K // block, block * bits // 8), dtype=np.uint8), "B"),
                 numpy_helper.from_array(rng.random((N, K // block), dtype=np.float32) * 0.01, "S")]
        node = helper.make_node("MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft", K=K, N=N, bits=bits,
                                block_size=block, accuracy_level=acc)
        out = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [rows, N])
        feed = rng.random((rows, K), dtype=np.float32); dtype = TensorProto.FLOAT
    else:
        top = 63 if kind == "s7" else 127
        inits += [numpy_helper.from_array(rng.integers(-top, top + 1, (K, N), dtype=np.int8), "B"),
                  numpy_helper.from_array(np.array(0, np.int8), "Z")]
        node = helper.make_node("MatMulInteger", ["A", "B", "AZ", "Z"], ["Y"])
        out = helper.make_tensor_value_info("Y", TensorProto.INT32, [rows, N])
        feed = rng.integers(0, 256, (rows, K), dtype=np.uint8); dtype = TensorProto.UINT8
    graph = helper.make_graph([node], "head", [helper.make_tensor_value_info("A", dtype, [rows, K])], [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return open_session(model, 2), {"A": feed}

rows = [int(r) for r in sys.argv[1].split(",")]
kinds = sys.argv[2].split(",")
rng = np.random.default_rng(0)
for r_ in rows:
    ss = {k: session(k, r_, rng) for k in kinds}
    t = {k: [] for k in kinds}
    for r in range(15):
        for k in (kinds if r % 2 == 0 else kinds[::-1]):
            s, feed = ss[k]; t0 = time.perf_counter(); s.run(None, feed); t[k].append((time.perf_counter() - t0) * 1e3)
    for k in kinds:
        print(f"rows {r_} {k:8s} median {statistics.median(t[k][3:]):7.2f} ms  fastest {min(t[k]):7.2f}", flush=True)
