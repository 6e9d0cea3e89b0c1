"""Decode attention over 18 layers, 8 lanes, 4 q heads / 1 kv head of 256, T valid positions in a C-row buffer:
GroupQueryAttention (in place) vs Slice + batched MatMul (one K read per lane for all 4 heads)."""
import statistics, sys, time
from pathlib import Path
import numpy as np
from onnx import TensorProto, helper, numpy_helper
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from matmulnbits_kernels import open_session
LAYERS, L, H, D, C = 18, 8, 4, 256, 1024

def gqa_model():
    nodes, ins, outs = [], [], []
    ins += [helper.make_tensor_value_info("q", TensorProto.FLOAT, [L, 1, H * D]),
            helper.make_tensor_value_info("k", TensorProto.FLOAT, [L, 1, D]),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [L, 1, D]),
            helper.make_tensor_value_info("seqlens", TensorProto.INT32, [L]),
            helper.make_tensor_value_info("total", TensorProto.INT32, [1])]
    for i in range(LAYERS):
        ins += [helper.make_tensor_value_info(f"pk{i}", TensorProto.FLOAT, [L, 1, C, D]),
                helper.make_tensor_value_info(f"pv{i}", TensorProto.FLOAT, [L, 1, C, D])]
        nodes.append(helper.make_node("GroupQueryAttention", ["q", "k", "v", f"pk{i}", f"pv{i}", "seqlens", "total"],
                                      [f"o{i}", f"prk{i}", f"prv{i}"], domain="com.microsoft", num_heads=H, kv_num_heads=1,
                                      scale=0.0625))
        outs += [helper.make_tensor_value_info(f"o{i}", TensorProto.FLOAT, [L, 1, H * D]),
                 helper.make_tensor_value_info(f"prk{i}", TensorProto.FLOAT, [L, 1, C, D]),
                 helper.make_tensor_value_info(f"prv{i}", TensorProto.FLOAT, [L, 1, C, D])]
    g = helper.make_graph(nodes, "gqa", ins, outs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])

def mm_model(T, fused=True):
    nodes, ins, outs, inits = [], [], [], []
    ins += [helper.make_tensor_value_info("q", TensorProto.FLOAT, [L, 1, H, D]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, [L, 1, 1, T])]
    inits += [numpy_helper.from_array(np.array([0], np.int64), "s0"), numpy_helper.from_array(np.array([T], np.int64), "s1"),
              numpy_helper.from_array(np.array([2], np.int64), "ax")]
    for i in range(LAYERS):
        ins += [helper.make_tensor_value_info(f"pk{i}", TensorProto.FLOAT, [L, 1, C, D]),
                helper.make_tensor_value_info(f"pv{i}", TensorProto.FLOAT, [L, 1, C, D])]
        nodes += [helper.make_node("Slice", [f"pk{i}", "s0", "s1", "ax"], [f"k{i}"]),
                  helper.make_node("Slice", [f"pv{i}", "s0", "s1", "ax"], [f"v{i}"]),
                  helper.make_node("FusedMatMul", ["q", f"k{i}"], [f"sc{i}"], domain="com.microsoft", transB=1, alpha=0.0625),
                  helper.make_node("Add", [f"sc{i}", "mask"], [f"m{i}"]),
                  helper.make_node("Softmax", [f"m{i}"], [f"p{i}"], axis=-1),
                  helper.make_node("MatMul", [f"p{i}", f"v{i}"], [f"o{i}"])]
        outs += [helper.make_tensor_value_info(f"o{i}", TensorProto.FLOAT, [L, 1, H, D])]
    g = helper.make_graph(nodes, "mm", ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])

rng = np.random.default_rng(0)
bufs = {f"p{kv}{i}": rng.standard_normal((L, 1, C, D), dtype=np.float32) for i in range(LAYERS) for kv in "kv"}
for T in [int(t) for t in sys.argv[1].split(",")]:
    g = open_session(gqa_model(), 2)
    gf = {"q": rng.standard_normal((L, 1, H * D), dtype=np.float32), "k": rng.standard_normal((L, 1, D), dtype=np.float32),
          "v": rng.standard_normal((L, 1, D), dtype=np.float32), "seqlens": np.full(L, T - 1, np.int32),
          "total": np.array([T], np.int32), **bufs}
    m = open_session(mm_model(T), 2)
    mf = {"q": rng.standard_normal((L, 1, H, D), dtype=np.float32), "mask": np.zeros((L, 1, 1, T), np.float32), **bufs}
    import onnxruntime as ort
    vals = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in gf.items()}
    b = g.io_binding()
    for k, v in vals.items(): b.bind_ortvalue_input(k, v)
    for i in range(LAYERS):
        b.bind_ortvalue_output(f"prk{i}", vals[f"pk{i}"]); b.bind_ortvalue_output(f"prv{i}", vals[f"pv{i}"]); b.bind_output(f"o{i}")
    class B:
        def run(self, _o, _f): g.run_with_iobinding(b)
    ss = {"gqa": (B(), None), "slice+mm": (m, mf)}
    t = {k: [] for k in ss}
    for r in range(21):
        for k in (list(ss) if r % 2 == 0 else list(ss)[::-1]):
            s, f = ss[k]; t0 = time.perf_counter(); s.run(None, f); t[k].append((time.perf_counter() - t0) * 1e3)
    print(f"T {T}: " + "  ".join(f"{k} {statistics.median(v[3:]):.2f} ms" for k, v in t.items()), flush=True)
