"""Decode attention for 8 lanes, 4 query heads sharing 1 KV head of 256 dims (Gemma 3 270M), at T positions in a
640-row KV buffer. Side A is ONNX Runtime's GroupQueryAttention in float32, past and present bound to one buffer as
the runtime binds them. Side B, by the first argument:
  plain  the same product as plain ops over rows 0..T-1: Slice K/V, FusedMatMul(Q, K^T) with the 4 heads as M = 4,
         Softmax, MatMul(P, V);
  f16    GroupQueryAttention with float16 inputs and KV.
Outputs are compared, then each side's median per-call time over alternating rounds (spinning off in both sessions:
with it on, the idle session's spinning threads took the other's cores).

    python attention_ab.py plain|f16 [ROUNDS]"""
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper

L, NH, KVH, H, BUF = 8, 4, 1, 256, 640
OPSETS = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]


def session(nodes, inputs, outputs, inits=()):
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)), opset_imports=OPSETS)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def value(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def gqa_session(f):
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens", "total"], ["o", "prk", "prv"],
                            domain="com.microsoft", num_heads=NH, kv_num_heads=KVH, scale=1.0 / 16)
    kv = [L, KVH, BUF, H]
    return session([node], [value("q", f, [L, 1, NH * H]), value("k", f, [L, 1, KVH * H]), value("v", f, [L, 1, KVH * H]),
                            value("pk", f, kv), value("pv", f, kv), value("seqlens", TP.INT32, [L]),
                            value("total", TP.INT32, [])],
                   [value("o", f, [L, 1, NH * H]), value("prk", f, kv), value("prv", f, kv)])


def plain_session():
    const = lambda name, values: helper.make_tensor(name, TP.INT64, [len(values)], values)  # noqa: E731
    nodes = [helper.make_node("Slice", ["pk", "zero", "t", "ax"], ["ks"]),
             helper.make_node("Slice", ["pv", "zero", "t", "ax"], ["vs"]),
             helper.make_node("Reshape", ["q", "qshape"], ["q4"]),  # [L, 1, 4, 256]
             helper.make_node("FusedMatMul", ["q4", "ks"], ["s"], domain="com.microsoft", transB=1, alpha=1.0 / 16),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "vs"], ["o4"]),
             helper.make_node("Reshape", ["o4", "oshape"], ["o"])]
    f, kv = TP.FLOAT, [L, KVH, BUF, H]
    return session(nodes, [value("q", f, [L, 1, NH * H]), value("pk", f, kv), value("pv", f, kv), value("t", TP.INT64, [1])],
                   [value("o", f, [L, 1, NH * H])],
                   [const("zero", [0]), const("ax", [2]), const("qshape", [L, KVH, NH, H]), const("oshape", [L, 1, NH * H])])


def bind_gqa(sess, dtype, q, pk, pv, T):
    """The token at T-1 is the new one; past and present share one buffer per K and V."""
    kbuf, vbuf = (ort.OrtValue.ortvalue_from_numpy(x.astype(dtype)) for x in (pk, pv))
    b = sess.io_binding()
    for name, arr in (("q", q.astype(dtype)), ("k", pk[:, 0, T - 1][:, None, :].astype(dtype)),
                      ("v", pv[:, 0, T - 1][:, None, :].astype(dtype)),
                      ("seqlens", np.full(L, T - 1, np.int32)), ("total", np.array(T, np.int32))):
        b.bind_cpu_input(name, arr)
    b.bind_ortvalue_input("pk", kbuf)
    b.bind_ortvalue_input("pv", vbuf)
    b.bind_output("o", "cpu")
    b.bind_ortvalue_output("prk", kbuf)
    b.bind_ortvalue_output("prv", vbuf)
    return b, kbuf, vbuf


def bind_plain(sess, q, kbuf, vbuf, T):
    b = sess.io_binding()
    b.bind_cpu_input("q", q)
    b.bind_ortvalue_input("pk", kbuf)
    b.bind_ortvalue_input("pv", vbuf)
    b.bind_cpu_input("t", np.array([T], np.int64))
    b.bind_output("o", "cpu")
    return b


def output(sess, binding):
    sess.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()[0].astype(np.float32)


def main() -> None:
    against = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    if against not in ("plain", "f16"):
        raise SystemExit("usage: attention_ab.py plain|f16 [ROUNDS]")
    rng = np.random.default_rng(0)
    gqa = gqa_session(TP.FLOAT)
    other = plain_session() if against == "plain" else gqa_session(TP.FLOAT16)
    for T in (128, 264, 512):
        pk, pv = (rng.standard_normal((L, KVH, BUF, H)).astype(np.float32) for _ in range(2))
        q = rng.standard_normal((L, 1, NH * H)).astype(np.float32)
        a, kbuf, vbuf = bind_gqa(gqa, np.float32, q, pk, pv, T)
        b = bind_plain(other, q, kbuf, vbuf, T) if against == "plain" else bind_gqa(other, np.float16, q, pk, pv, T)[0]
        err = float(np.abs(output(gqa, a) - output(other, b)).max())
        sides = {"gqa": (gqa, a), against: (other, b)}
        times = {name: [] for name in sides}
        for r in range(rounds):
            for name, (sess, binding) in sorted(sides.items(), reverse=r % 2 == 1):
                for _ in range(5):
                    sess.run_with_iobinding(binding)
                t0 = time.perf_counter()
                for _ in range(50):
                    sess.run_with_iobinding(binding)
                times[name].append((time.perf_counter() - t0) / 50 * 1e6)
        ratios = [x / g for x, g in zip(times[against], times["gqa"])]
        print(f"T={T}: max |diff| {err:.2e}; GQA f32 {statistics.median(times['gqa']):.0f} us, {against} "
              f"{statistics.median(times[against]):.0f} us per call; {against}/GQA median {statistics.median(ratios):.2f}x "
              f"(range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
