"""What one node costs ONNX Runtime to dispatch: chains of 500 Abs (or ReduceMax + Div) nodes on small tensors, 1 and 2 threads.

    python node_dispatch.py"""
import numpy as np, onnxruntime as ort, time
from onnx import helper as h, TensorProto as T
def model(op, n, shape):
    nodes = []; x = "x"
    for i in range(n):
        if op == "Abs": nodes.append(h.make_node("Abs", [x], [f"y{i}"]))
        elif op == "ReduceMax": nodes.append(h.make_node("ReduceMax", [x], [f"r{i}"], axes=[1], keepdims=1)); nodes.append(h.make_node("Div", [x, f"r{i}"], [f"y{i}"]))
        x = f"y{i}"
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, shape)], [h.make_tensor_value_info(x, T.FLOAT, shape)])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
for shape in ([8, 640], [128, 640]):
  for op in ("Abs", "ReduceMax"):
    for th in (1, 2):
        so = ort.SessionOptions(); so.intra_op_num_threads = th; so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "1")
        s = ort.InferenceSession(model(op, 500, shape), so, providers=["CPUExecutionProvider"])
        feed = {"x": np.random.rand(*shape).astype(np.float32) * 0.5 + 0.5}
        for _ in range(5): s.run(None, feed)
        ts = []
        for _ in range(30):
            t = time.perf_counter(); s.run(None, feed); ts.append(time.perf_counter() - t)
        n = 500 * (2 if op == "ReduceMax" else 1)
        print(shape, op, th, f"{np.median(ts)/n*1e6:.2f} us/node")
