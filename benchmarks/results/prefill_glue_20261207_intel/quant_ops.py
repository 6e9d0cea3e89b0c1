"""Per-row int8 quantization formulations, [R, K] float32 -> uint8 codes around 128 (and the two-level residue codes):
blocked QuantizeLinear with the [R, 1] scale (the graphs' row_codes) against Div by the row scale then a per-tensor
QuantizeLinear (scale 1.0). 18 chained copies, alternating calls."""
import statistics, sys, time
import numpy as np, onnxruntime as ort
from onnx import helper, TensorProto, numpy_helper
R, K = int(sys.argv[1]), int(sys.argv[2])
L = 18
def sess(kind):
    nodes, inits = [], [numpy_helper.from_array(np.full((R, 1), 128, np.uint8), "zpr"), numpy_helper.from_array(np.array(128, np.uint8), "zp"),
                        numpy_helper.from_array(np.array(1.0, np.float32), "one"), numpy_helper.from_array(np.array(1 / 254, np.float32), "res"),
                        numpy_helper.from_array(np.array(254.0, np.float32), "steps")]
    outs = []
    for l in range(L):
        x, s = "X", "S"
        if kind == "blocked 1-level":
            nodes.append(helper.make_node("QuantizeLinear", [x, s, "zpr"], [f"Q{l}"], axis=1, block_size=K))
            outs.append(f"Q{l}")
        elif kind == "div + per-tensor 1-level":
            nodes += [helper.make_node("Div", [x, s], [f"T{l}"]), helper.make_node("QuantizeLinear", [f"T{l}", "one", "zp"], [f"Q{l}"])]
            outs.append(f"Q{l}")
        elif kind == "blocked 2-level":
            nodes += [helper.make_node("QuantizeLinear", [x, s, "zpr"], [f"Q{l}"], axis=1, block_size=K),
                      helper.make_node("DequantizeLinear", [f"Q{l}", s, "zpr"], [f"D{l}"], axis=1, block_size=K),
                      helper.make_node("Sub", [x, f"D{l}"], [f"E{l}"]), helper.make_node("Div", [s, "steps"], [f"S2{l}"]),
                      helper.make_node("QuantizeLinear", [f"E{l}", f"S2{l}", "zpr"], [f"Q2{l}"], axis=1, block_size=K)]
            outs += [f"Q{l}", f"Q2{l}"]
        elif kind == "exact 2-level":   # bit-identical to blocked 2-level: Dequantize as Round(x / s1) * s1
            nodes += [helper.make_node("Div", [x, s], [f"T{l}"]), helper.make_node("QuantizeLinear", [f"T{l}", "one", "zp"], [f"Q{l}"]),
                      helper.make_node("Round", [f"T{l}"], [f"Rd{l}"]), helper.make_node("Mul", [f"Rd{l}", s], [f"D{l}"]),
                      helper.make_node("Sub", [x, f"D{l}"], [f"E{l}"]), helper.make_node("Div", [s, "steps"], [f"S2{l}"]),
                      helper.make_node("QuantizeLinear", [f"E{l}", f"S2{l}", "zpr"], [f"Q2{l}"], axis=1, block_size=K)]
            outs += [f"Q{l}", f"Q2{l}"]
        else:  # div + per-tensor 2-level
            nodes += [helper.make_node("Div", [x, s], [f"T{l}"]), helper.make_node("QuantizeLinear", [f"T{l}", "one", "zp"], [f"Q{l}"]),
                      helper.make_node("Round", [f"T{l}"], [f"Rd{l}"]), helper.make_node("Sub", [f"T{l}", f"Rd{l}"], [f"E{l}"]),
                      helper.make_node("QuantizeLinear", [f"E{l}", "res", "zp"], [f"Q2{l}"])]
            outs += [f"Q{l}", f"Q2{l}"]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [R, K]), helper.make_tensor_value_info("S", TensorProto.FLOAT, [R, 1])],
                          [helper.make_tensor_value_info(o, TensorProto.UINT8, [R, K]) for o in outs], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
x = rng.standard_normal((R, K)).astype(np.float32) * rng.uniform(0.1, 10, (R, 1)).astype(np.float32)
s = (np.abs(x).max(1, keepdims=True) / 127).astype(np.float32)
kinds = ["blocked 1-level", "div + per-tensor 1-level", "blocked 2-level", "div + per-tensor 2-level", "exact 2-level"]
ss = {k: sess(k) for k in kinds}
res = {k: ss[k].run(None, {"X": x, "S": s}) for k in kinds}
print("1-level codes equal:", np.array_equal(res[kinds[0]][0], res[kinds[1]][0]),
      "| 2-level: q1 equal", np.array_equal(res[kinds[2]][0], res[kinds[3]][0]),
      "q2 equal share", float(np.mean(res[kinds[2]][1] == res[kinds[3]][1])),
      "q2 max diff", int(np.abs(res[kinds[2]][1].astype(int) - res[kinds[3]][1].astype(int)).max()),
      "| exact 2-level equal:", all(np.array_equal(a, b) for a, b in zip(res[kinds[2]], res[kinds[4]])))
t = {k: [] for k in kinds}
for r in range(41):
    for k in (kinds if r % 2 == 0 else kinds[::-1]):
        t0 = time.perf_counter(); ss[k].run(None, {"X": x, "S": s}); t[k].append((time.perf_counter() - t0) * 1e3)
for k in kinds: print(f"R {R} K {K} x{L}  {k:26s} median {statistics.median(t[k][3:]):7.3f} ms")
