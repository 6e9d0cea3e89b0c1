"""Round (half to even) against (x + 1.5 * 2**23) - 1.5 * 2**23 on 18 inputs [128, 2048] (the two-level down_proj's steps):
equal values, and the time of each.

    python round_magic.py"""
import numpy as np, onnxruntime as ort, time
from onnx import helper as h, TensorProto as T, numpy_helper as nh
R, K, L = 128, 2048, 18
def model(kind):
    nodes, inits = [], [nh.from_array(np.array(12582912.0, np.float32), "magic")]
    outs = []
    for l in range(L):
        if kind == "round": nodes.append(h.make_node("Round", ["x"], [f"y{l}"]))
        else:
            nodes.append(h.make_node("Add", ["x", "magic"], [f"t{l}"])); nodes.append(h.make_node("Sub", [f"t{l}", "magic"], [f"y{l}"]))
        outs.append(h.make_tensor_value_info(f"y{l}", T.FLOAT, [R, K]))
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [R, K])], outs, inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
x = (np.random.default_rng(0).standard_normal((R, K)) * 40).astype(np.float32)
x[0, :8] = [0.5, 1.5, 2.5, -0.5, -1.5, 126.5, -126.5, 127.0]
sess = {}
for k in ("round", "magic"):
    so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.log_severity_level = 3; so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    sess[k] = ort.InferenceSession(model(k), so, providers=["CPUExecutionProvider"])
a = sess["round"].run(None, {"x": x})[0]; b = sess["magic"].run(None, {"x": x})[0]
print("identical:", np.array_equal(a, b), a[0, :8], b[0, :8])
ts = {k: [] for k in sess}
for r in range(30):
    for k, s in sess.items():
        t = time.perf_counter(); s.run(None, {"x": x}); ts[k].append(time.perf_counter() - t)
for k in ts: print(k, f"{np.median(ts[k][3:])*1e3:.2f} ms for 18")
