"""The float32 outlier channels' product added to the int8 product: Gemm(picked, W_o, C) (what ONNX Runtime fuses MatMul + Add
into) against MatMul and Add kept apart (3-D, so no fusion), 18 x (qkv 1536, o 640, gate/up 4096) columns."""
import statistics, sys, time
import numpy as np, onnxruntime as ort
from onnx import helper, TensorProto, numpy_helper
R, KO = int(sys.argv[1]), 32
NS = (1536, 640, 4096)
rng = np.random.default_rng(0)
def sess(kind):
    nodes, inits, outs, ins = [], [], [], []
    for l in range(18):
        for j, n in enumerate(NS):
            w = f"W{l}_{j}"; inits.append(numpy_helper.from_array(rng.standard_normal((KO, n)).astype(np.float32), w))
            p, c, y = f"P{j}", f"C{j}", f"Y{l}_{j}"
            if kind == "gemm":
                nodes.append(helper.make_node("Gemm", [p, w, c], [y]))
            else:
                nodes += [helper.make_node("MatMul", [p, w], [f"M{l}_{j}"]), helper.make_node("Add", [c, f"M{l}_{j}"], [y])]
            outs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, None))
    shape = (lambda d: [1] + d) if kind == "matmul+add 3-D" else (lambda d: d)
    ins = [helper.make_tensor_value_info(f"P{j}", TensorProto.FLOAT, shape([R, KO])) for j in range(3)] + \
          [helper.make_tensor_value_info(f"C{j}", TensorProto.FLOAT, shape([R, n])) for j, n in enumerate(NS)]
    m = helper.make_model(helper.make_graph(nodes, "g", ins, outs, inits), opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {f"P{j}": rng.standard_normal(shape([R, KO])).astype(np.float32) for j in range(3)}
    feeds.update({f"C{j}": rng.standard_normal(shape([R, n])).astype(np.float32) for j, n in enumerate(NS)})
    return s, feeds
kinds = ["gemm", "matmul+add 3-D"]
ss = {k: sess(k) for k in kinds}
t = {k: [] for k in kinds}
for r in range(31):
    for k in (kinds if r % 2 == 0 else kinds[::-1]):
        s, f = ss[k]; t0 = time.perf_counter(); s.run(None, f); t[k].append((time.perf_counter() - t0) * 1e3)
for k in kinds: print(f"R {R} x18x3  {k:16s} median {statistics.median(t[k][3:]):7.2f} ms")
