"""18 layers of the prefill gate/up path alone: A = one packed int8 GEMM, outlier product and Add, then Split (the served form);
B = gate and up as two int8 GEMMs over the same codes (no Split). Alternating, medians.

    python gate_up_two_gemms.py ROWS"""
import numpy as np, onnxruntime as ort, time, sys
from onnx import helper as h, TensorProto as T, numpy_helper as nh
R, K, N, L = int(sys.argv[1]), 640, 2048, 18
rng = np.random.default_rng(0)
def graph(variant):
    nodes, inits = [], []
    def init(name, arr): inits.append(nh.from_array(arr, name)); return name
    x = "x"
    init("zp", np.array(128, np.uint8)); init("one", np.array(1.0, np.float32))
    outs = []
    for l in range(L):
        p = f"l{l}_"
        nodes.append(h.make_node("QuantizeLinear", ["x", "xs", init(p+"zpr", np.full((R,1),128,np.uint8))], [p+"q"], axis=1, block_size=K))
        nodes.append(h.make_node("Gather", ["x", init(p+"ids", np.arange(32, dtype=np.int64)*7)], [p+"xo"], axis=1))
        if variant == "A":
            init(p+"w", rng.integers(-127,127,(K,2*N)).astype(np.int8)); init(p+"s", np.full(2*N, .01, np.float32))
            init(p+"wo", rng.standard_normal((32, 2*N)).astype(np.float32))
            nodes.append(h.make_node("MatMulIntegerToFloat", [p+"q", p+"w", "xs", p+"s", "zp"], [p+"y"], domain="com.microsoft"))
            nodes.append(h.make_node("MatMul", [p+"xo", p+"wo"], [p+"o"]))
            nodes.append(h.make_node("Add", [p+"y", p+"o"], [p+"sum"]))
            nodes.append(h.make_node("Split", [p+"sum", init(p+"sp", np.array([N, N], np.int64))], [p+"g", p+"u"], axis=1))
        else:
            for part in "gu":
                init(p+"w"+part, rng.integers(-127,127,(K,N)).astype(np.int8)); init(p+"s"+part, np.full(N, .01, np.float32))
                init(p+"wo"+part, rng.standard_normal((32, N)).astype(np.float32))
                nodes.append(h.make_node("MatMulIntegerToFloat", [p+"q", p+"w"+part, "xs", p+"s"+part, "zp"], [p+"y"+part], domain="com.microsoft"))
                nodes.append(h.make_node("MatMul", [p+"xo", p+"wo"+part], [p+"o"+part]))
                nodes.append(h.make_node("Add", [p+"y"+part, p+"o"+part], [p+part]))
        nodes.append(h.make_node("Gelu", [p+"g"], [p+"a"], domain="com.microsoft"))
        nodes.append(h.make_node("Mul", [p+"a", p+"u"], [p+"out"]))
        nodes.append(h.make_node("ReduceMax", [p+"out"], [p+"r"], keepdims=0)); outs.append(p+"r")
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [R, K]), h.make_tensor_value_info("xs", T.FLOAT, [R, 1])],
                     [h.make_tensor_value_info(o, T.FLOAT, []) for o in outs], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 21), h.make_opsetid("com.microsoft", 1)])
sess = {}
for v in "AB":
    so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    sess[v] = ort.InferenceSession(graph(v).SerializeToString(), so, providers=["CPUExecutionProvider"])
feed = {"x": rng.standard_normal((R, K)).astype(np.float32), "xs": np.full((R, 1), 0.03, np.float32)}
ts = {v: [] for v in "AB"}
for r in range(25):
    for v in ("AB" if r % 2 else "BA"):
        t = time.perf_counter(); sess[v].run(None, feed); ts[v].append(time.perf_counter() - t)
for v in "AB": print(v, R, f"{np.median(ts[v][3:])*1e3:.2f} ms")
