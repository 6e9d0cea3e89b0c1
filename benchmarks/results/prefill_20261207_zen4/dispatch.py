"""ONNX Runtime's cost per node on this CPU: chains of 10 and 1,000 small nodes (Mul, Reshape + Mul), timed; the
difference per node is the dispatch (plus the op's own work on its 640 or 10,240 floats).

    python dispatch.py
"""
import sys, time, statistics
import numpy as np
from onnx import helper, numpy_helper, TensorProto as TP
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from matmulnbits_kernels import open_session
def chain(n, op, shape):
    nodes, inits = [], []
    prev = "A"
    for i in range(n):
        if op == "Reshape":
            s = f"s{i}"; inits.append(numpy_helper.from_array(np.array(shape if i % 2 else [-1], np.int64), s))
            nodes.append(helper.make_node("Reshape", [prev, s], [f"t{i}"]))
        elif op == "Mul":
            nodes.append(helper.make_node("Mul", [prev, "c"], [f"t{i}"]))
        elif op == "ReshapeMul":
            s = f"s{i}"; inits.append(numpy_helper.from_array(np.array(shape if i % 2 else [-1], np.int64), s))
            nodes.append(helper.make_node("Reshape", [prev, s], [f"r{i}"]))
            nodes.append(helper.make_node("Mul", [f"r{i}", "c"], [f"t{i}"]))
        prev = f"t{i}"
    if op in ("Mul", "ReshapeMul"): inits.append(numpy_helper.from_array(np.float32(1.0001), "c"))
    nodes.append(helper.make_node("Identity", [prev], ["Y"]))
    g = helper.make_graph(nodes, "c", [helper.make_tensor_value_info("A", TP.FLOAT, shape)], [helper.make_tensor_value_info("Y", TP.FLOAT, None)], inits)
    return open_session(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), 2)
for op, shape in (("Mul", [16, 640]), ("Mul", [1, 640]), ("ReshapeMul", [16, 640])):
    res = {}
    for n in (10, 1000):
        s = chain(n, op, shape); A = np.ones(shape, np.float32)
        for _ in range(5): s.run(None, {"A": A})
        t = []
        for _ in range(30):
            t0 = time.perf_counter(); s.run(None, {"A": A}); t.append(time.perf_counter() - t0)
        res[n] = statistics.median(t)
    print(op, shape, f"per node {(res[1000]-res[10])/990*1e6:.2f} us")
