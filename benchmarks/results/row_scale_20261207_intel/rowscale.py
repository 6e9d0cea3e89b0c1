"""MatMulIntegerToFloat with the per-row activation scale as its a_scale [R, 1] vs a scalar a_scale and a Mul after."""
import statistics, sys, time
import numpy as np, onnxruntime as ort
from onnx import helper, TensorProto, numpy_helper
R, K, N = (int(x) for x in sys.argv[1:4])
rng = np.random.default_rng(0)
B = rng.integers(-64, 64, (K, N), dtype=np.int8); bs = (rng.random(N).astype(np.float32) + 0.5) * 1e-2
def model(inside, layers=18):
    nodes, inits = [], [numpy_helper.from_array(np.array(128, np.uint8), "azp"), numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    outs = []
    for l in range(layers):
        inits += [numpy_helper.from_array(B, f"B{l}"), numpy_helper.from_array(bs, f"bs{l}")]
        if inside:
            nodes.append(helper.make_node("MatMulIntegerToFloat", ["A", f"B{l}", "S", f"bs{l}", "azp"], [f"Y{l}"], domain="com.microsoft"))
        else:
            nodes.append(helper.make_node("MatMulIntegerToFloat", ["A", f"B{l}", "one", f"bs{l}", "azp"], [f"P{l}"], domain="com.microsoft"))
            nodes.append(helper.make_node("Mul", [f"P{l}", "S"], [f"Y{l}"]))
        outs.append(helper.make_tensor_value_info(f"Y{l}", TensorProto.FLOAT, [R, N]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("A", TensorProto.UINT8, [R, K]),
                                        helper.make_tensor_value_info("S", TensorProto.FLOAT, [R, 1])], outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions(); so.intra_op_num_threads = 2
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
feeds = {"A": rng.integers(0, 256, (R, K), dtype=np.uint8), "S": rng.random((R, 1)).astype(np.float32)}
ss = {"mul after": model(False), "a_scale [R,1]": model(True)}
ys = {k: s.run(None, feeds) for k, s in ss.items()}
print("max rel diff", max(float(np.abs(a - b).max() / np.abs(a).max()) for a, b in zip(*ys.values())))
t = {k: [] for k in ss}
for r in range(31):
    for k in (list(ss) if r % 2 == 0 else list(ss)[::-1]):
        t0 = time.perf_counter(); ss[k].run(None, feeds); t[k].append((time.perf_counter() - t0) * 1e3)
for k in ss: print(f"R {R} K {K} N {N} x18  {k:14s} median {statistics.median(t[k][3:]):7.2f} ms  fastest {min(t[k][3:]):7.2f}")
