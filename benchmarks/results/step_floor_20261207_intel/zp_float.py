"""MatMulNBits 4-bit blocks of 32 with float zero points (what the GGUF's Q4_K, w = d1 q - m1, would need to be
exact: zp = m1 / d1) against uint8 zero points, 8 rows [640 -> 4,096]: error against exact arithmetic, and time."""
import statistics, sys, time
import numpy as np, onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
K, N, B = 640, 4096, 32
rng = np.random.default_rng(0)
q = rng.integers(0, 16, (N, K), dtype=np.uint8)
d1 = (rng.random((N, K // B), dtype=np.float32) * 0.01 + 0.001).astype(np.float32)
m1 = (rng.random((N, K // B), dtype=np.float32) * 0.08).astype(np.float32)
zp = (m1 / d1).astype(np.float32)
packed = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(N, K // B, B // 2)
w = (d1[:, :, None] * q.reshape(N, K // B, B) - m1[:, :, None]).reshape(N, K)
def model(acc, zp_kind):
    inits = [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(d1, "S")]
    ins = ["A", "B", "S"]
    if zp_kind == "float":
        inits.append(numpy_helper.from_array(zp, "Z")); ins.append("Z")
    elif zp_kind == "u8":
        zi = np.clip(np.round(zp), 0, 15).astype(np.uint8)
        zpk = (zi[:, 0::2] | (zi[:, 1::2] << 4)) if zi.shape[1] % 2 == 0 else None
        inits.append(numpy_helper.from_array(zpk.reshape(N, -1), "Z")); ins.append("Z")
    node = helper.make_node("MatMulNBits", ins, ["Y"], domain="com.microsoft", K=K, N=N, bits=4, block_size=B, accuracy_level=acc)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions(); so.intra_op_num_threads = 2
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
x = rng.standard_normal((8, K)).astype(np.float32)
ref = x.astype(np.float64) @ w.T.astype(np.float64)
for acc in (4, 1):
    for zk in ("float", "u8"):
        try:
            s = model(acc, zk)
        except Exception as e:
            print(acc, zk, "FAIL", str(e)[:200]); continue
        y = s.run(None, {"A": x})[0]
        if zk == "float":
            err = np.abs(y - ref).max() / np.abs(ref).max()
        else:
            err = float("nan")
        ts = []
        for _ in range(30):
            t0 = time.perf_counter(); s.run(None, {"A": x}); ts.append(time.perf_counter() - t0)
        print(f"acc {acc} zp {zk:5s} rel err vs exact {err:.2e}  {statistics.median(ts)*1e3:.3f} ms")
