"""Decode attention for 8 lanes, 4 query heads sharing 1 KV head of 256 dims (Gemma 3 270M), at T positions in a
640-row KV buffer: ONNX Runtime's GroupQueryAttention (past and present bound to one buffer, as the runtime binds
them) against the same product as plain ops over rows 0..T-1: Slice K/V, FusedMatMul(Q, K^T) with the 4 heads as
M = 4, Softmax, MatMul(P, V). Same outputs checked, then median per-call time over alternating rounds."""
import sys, time, statistics
import numpy as np, onnxruntime as ort
from onnx import helper, TensorProto as TP
L, NH, KVH, H, BUF = 8, 4, 1, 256, 640
rng = np.random.default_rng(0)

def so():
    s = ort.SessionOptions(); s.intra_op_num_threads = 2
    s.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return s

def gqa_model():
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens", "total"], ["o", "prk", "prv"],
                            domain="com.microsoft", num_heads=NH, kv_num_heads=KVH, scale=1.0 / 16)
    f = TP.FLOAT
    g = helper.make_graph([node], "g",
        [helper.make_tensor_value_info("q", f, [L, 1, NH * H]), helper.make_tensor_value_info("k", f, [L, 1, KVH * H]),
         helper.make_tensor_value_info("v", f, [L, 1, KVH * H]), helper.make_tensor_value_info("pk", f, [L, KVH, BUF, H]),
         helper.make_tensor_value_info("pv", f, [L, KVH, BUF, H]), helper.make_tensor_value_info("seqlens", TP.INT32, [L]),
         helper.make_tensor_value_info("total", TP.INT32, [])],
        [helper.make_tensor_value_info("o", f, [L, 1, NH * H]), helper.make_tensor_value_info("prk", f, [L, KVH, BUF, H]),
         helper.make_tensor_value_info("prv", f, [L, KVH, BUF, H])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    return ort.InferenceSession(m.SerializeToString(), so(), providers=["CPUExecutionProvider"])

def plain_model():
    f = TP.FLOAT
    c = lambda name, arr: helper.make_tensor(name, TP.INT64, [len(arr)], arr)
    nodes = [
        helper.make_node("Slice", ["pk", "zero", "t", "ax"], ["ks"]),
        helper.make_node("Slice", ["pv", "zero", "t", "ax"], ["vs"]),
        helper.make_node("Reshape", ["q", "qshape"], ["q4"]),                       # [L, 1, 4, 256]
        helper.make_node("FusedMatMul", ["q4", "ks"], ["s"], domain="com.microsoft", transB=1, alpha=1.0 / 16),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "vs"], ["o4"]),
        helper.make_node("Reshape", ["o4", "oshape"], ["o"]),
    ]
    g = helper.make_graph(nodes, "g",
        [helper.make_tensor_value_info("q", f, [L, 1, NH * H]), helper.make_tensor_value_info("pk", f, [L, KVH, BUF, H]),
         helper.make_tensor_value_info("pv", f, [L, KVH, BUF, H]), helper.make_tensor_value_info("t", TP.INT64, [1])],
        [helper.make_tensor_value_info("o", f, [L, 1, NH * H])],
        [c("zero", [0]), c("ax", [2]), c("qshape", [L, KVH, NH, H]), c("oshape", [L, 1, NH * H])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    return ort.InferenceSession(m.SerializeToString(), so(), providers=["CPUExecutionProvider"])

gqa, plain = gqa_model(), plain_model()
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
for T in (128, 264, 512):
    pk = rng.standard_normal((L, KVH, BUF, H)).astype(np.float32); pv = rng.standard_normal((L, KVH, BUF, H)).astype(np.float32)
    q = rng.standard_normal((L, 1, NH * H)).astype(np.float32)
    k_new = pk[:, 0, T - 1][:, None, :].copy(); v_new = pv[:, 0, T - 1][:, None, :].copy()   # the token at T-1 is "new"
    # GQA with one buffer for past and present (the runtime's binding)
    kbuf = ort.OrtValue.ortvalue_from_numpy(pk.copy()); vbuf = ort.OrtValue.ortvalue_from_numpy(pv.copy())
    b = gqa.io_binding()
    for name, arr in (("q", q), ("k", k_new), ("v", v_new), ("seqlens", np.full(L, T - 1, np.int32)), ("total", np.array(T, np.int32))):
        b.bind_cpu_input(name, arr)
    b.bind_ortvalue_input("pk", kbuf); b.bind_ortvalue_input("pv", vbuf)
    b.bind_output("o", "cpu"); b.bind_ortvalue_output("prk", kbuf); b.bind_ortvalue_output("prv", vbuf)
    pb = plain.io_binding()
    pb.bind_cpu_input("q", q); pb.bind_ortvalue_input("pk", kbuf); pb.bind_ortvalue_input("pv", vbuf)
    pb.bind_cpu_input("t", np.array([T], np.int64)); pb.bind_output("o", "cpu")
    gqa.run_with_iobinding(b); o1 = b.copy_outputs_to_cpu()[0]
    plain.run_with_iobinding(pb); o2 = pb.copy_outputs_to_cpu()[0]
    err = float(np.abs(o1 - o2).max())
    times = {"gqa": [], "plain": []}
    for r in range(rounds):
        for name, (s, bb) in (sorted({"gqa": (gqa, b), "plain": (plain, pb)}.items(), reverse=r % 2 == 1)):
            for _ in range(5): s.run_with_iobinding(bb)
            t0 = time.perf_counter()
            for _ in range(50): s.run_with_iobinding(bb)
            times[name].append((time.perf_counter() - t0) / 50 * 1e6)
    ratios = [p / g for p, g in zip(times["plain"], times["gqa"])]
    print(f"T={T}: max |diff| {err:.2e}; GQA {statistics.median(times['gqa']):.0f} us, plain ops "
          f"{statistics.median(times['plain']):.0f} us per call; plain/GQA median {statistics.median(ratios):.2f}x "
          f"(range {min(ratios):.2f}-{max(ratios):.2f})")
