"""Prefill attention of one S-token chunk starting at p0 over a 640-row buffer, 18 layers: GroupQueryAttention in place
(the served form) against the four query heads' plain products over the one KV head (FusedMatMul, mask, Softmax, MatMul;
the K/V write left out, so it flatters the products).

    python attention_products.py S P0"""
import sys, time, numpy as np, onnxruntime as ort
from onnx import helper, TensorProto as T, numpy_helper as nh
S, p0, R, D, N, layers = int(sys.argv[1]), int(sys.argv[2]), 640, 256, 4, 18
Tt = p0 + S
def model(kind):
    nodes, inits, ins, outs = [], [], [], []
    ins += [helper.make_tensor_value_info("q", T.FLOAT, [1, S, N*D]), helper.make_tensor_value_info("k", T.FLOAT, [1, S, D]),
            helper.make_tensor_value_info("v", T.FLOAT, [1, S, D]), helper.make_tensor_value_info("seq", T.INT32, [1]),
            helper.make_tensor_value_info("tot", T.INT32, []), helper.make_tensor_value_info("mask", T.FLOAT, [S*N, Tt])]
    inits += [nh.from_array(np.array([S*N, D], np.int64), "qrows"), nh.from_array(np.array([1, S, N*D], np.int64), "oshape"),
              nh.from_array(np.array([0], np.int64), "zero"), nh.from_array(np.array([Tt], np.int64), "tt"), nh.from_array(np.array([2], np.int64), "ax2"),
              nh.from_array(np.array([Tt, D], np.int64), "kvrows")]
    prev = "q"
    for l in range(layers):
        pk, pv = f"pk{l}", f"pv{l}"
        ins += [helper.make_tensor_value_info(pk, T.FLOAT, [1, 1, R, D]), helper.make_tensor_value_info(pv, T.FLOAT, [1, 1, R, D])]
        outs += [helper.make_tensor_value_info(f"k{l}o", T.FLOAT, [1, 1, R, D]), helper.make_tensor_value_info(f"v{l}o", T.FLOAT, [1, 1, R, D])]
        if kind == "gqa":
            nodes.append(helper.make_node("GroupQueryAttention", [prev, "k", "v", pk, pv, "seq", "tot"], [f"a{l}", f"k{l}o", f"v{l}o"],
                         domain="com.microsoft", num_heads=N, kv_num_heads=1, scale=0.0625, local_window_size=512))
        else:
            nodes.append(helper.make_node("Identity", [pk], [f"k{l}o"])); nodes.append(helper.make_node("Identity", [pv], [f"v{l}o"]))
            nodes.append(helper.make_node("Reshape", [prev, "qrows"], [f"q{l}"]))
            for x in "kv":
                nodes.append(helper.make_node("Slice", [f"{x}{l}o", "zero", "tt", "ax2"], [f"{x}s{l}"]))
                nodes.append(helper.make_node("Reshape", [f"{x}s{l}", "kvrows"], [f"{x}r{l}"]))
            nodes.append(helper.make_node("FusedMatMul", [f"q{l}", f"kr{l}"], [f"s{l}"], domain="com.microsoft", transB=1, alpha=0.0625))
            nodes.append(helper.make_node("Add", [f"s{l}", "mask"], [f"m{l}"]))
            nodes.append(helper.make_node("Softmax", [f"m{l}"], [f"p{l}"], axis=-1))
            nodes.append(helper.make_node("MatMul", [f"p{l}", f"vr{l}"], [f"o{l}"]))
            nodes.append(helper.make_node("Reshape", [f"o{l}", "oshape"], [f"a{l}"]))
        prev = f"a{l}"
    outs.insert(0, helper.make_tensor_value_info(prev, T.FLOAT, [1, S, N*D]))
    g = helper.make_graph(nodes, kind, ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
rng = np.random.default_rng(0)
kv = [ort.OrtValue.ortvalue_from_numpy(rng.standard_normal((1, 1, R, D)).astype(np.float32)) for _ in range(2 * layers)]
pos = p0 + np.arange(S)
mask = np.where(np.arange(Tt)[None, :] <= pos[:, None], 0, -1e30).astype(np.float32).repeat(N, 0)
feeds = {"q": rng.standard_normal((1, S, N*D)).astype(np.float32) * 0.1, "k": rng.standard_normal((1, S, D)).astype(np.float32),
         "v": rng.standard_normal((1, S, D)).astype(np.float32), "seq": np.array([Tt - 1], np.int32), "tot": np.array(Tt, np.int32), "mask": mask}
sess = {}
for kind in ("gqa", "plain"):
    so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.log_severity_level = 3; so.add_session_config_entry("session.intra_op.allow_spinning", "1"); so.add_session_config_entry("session.force_spinning_stop", "1")
    s = ort.InferenceSession(model(kind).SerializeToString(), so, providers=["CPUExecutionProvider"])
    b = s.io_binding()
    names = [i.name for i in s.get_inputs()]
    for k, x in feeds.items():
        if k in names: b.bind_cpu_input(k, x)
    for l in range(layers):
        b.bind_ortvalue_input(f"pk{l}", kv[2*l]); b.bind_ortvalue_input(f"pv{l}", kv[2*l+1])
        b.bind_ortvalue_output(f"k{l}o", kv[2*l]); b.bind_ortvalue_output(f"v{l}o", kv[2*l+1])
    b.bind_output(s.get_outputs()[0].name)
    sess[kind] = (s, b)
for kind, (s_, b_) in sess.items(): s_.run_with_iobinding(b_)
from calculet.runtime import hugepages; hugepages.collapse()
res = {k: [] for k in sess}
for r in range(25):
    for kind, (s, b) in sess.items():
        t = time.perf_counter(); s.run_with_iobinding(b); res[kind].append(time.perf_counter() - t)
for k, v in res.items(): print(f"S={S} p0={p0} {k:6s} {np.median(v[3:])*1e3:7.2f} ms  (18 layers)")
