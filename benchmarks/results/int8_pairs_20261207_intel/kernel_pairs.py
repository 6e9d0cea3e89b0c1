"""Which neighbours ONNX Runtime's u8 x s8 GEMM adds in 16 bits, and whether pair-bounded codes are exact there.

    . ~/.cache/calculet/isa_view/avx2/env.sh && python kernel_pairs.py      # the AVX2 kernels (benchmarks/isa_view)
    python kernel_pairs.py                                                  # this CPU's own

Weight codes are drawn so that one pairing along K holds |c1| + |c2| <= 128 (every pair holds a 127 or a 64
with a small or equal neighbour) while every other pairing is free to exceed it; activations are 0 or 255
(uint8 around 128, the pass's zero point), the largest pair sums. Per shape and op (MatMulInteger,
MatMulIntegerToFloat) the largest difference from exact int64 arithmetic is printed for codes bounded on
the neighbours (2j, 2j + 1), which compiler/int8_pairs.py relies on, on (j, j + 2), and unbounded.
"""
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(2)


def bounded(k: int, n: int, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """[k, n] int8 codes with |c[first]| + |c[second]| <= 128 on the given row pairs."""
    w = np.zeros((k, n), np.int16)
    sign = rng.choice([-1, 1], (k, n))
    big = rng.integers(0, 2, (len(first), n)) == 1
    mid = rng.random((len(first), n)) < 0.2
    w[first] = np.where(mid, 64, np.where(big, 127, 1)) * sign[first]
    w[second] = np.where(mid, 64, np.where(big, 1, 127)) * sign[second]
    assert (np.abs(w[first]) + np.abs(w[second]) <= 128).all()
    return w.astype(np.int8)


def run(a: np.ndarray, w: np.ndarray, op: str) -> np.ndarray:
    zero = numpy_helper.from_array(np.array(128, np.uint8), "za")
    if op == "MatMulInteger":
        node, out = helper.make_node(op, ["a", "w", "za"], ["y"]), TensorProto.INT32
        inits = [numpy_helper.from_array(w, "w"), zero]
    else:
        node, out = helper.make_node(op, ["a", "w", "sa", "sw", "za"], ["y"], domain="com.microsoft"), TensorProto.FLOAT
        inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(1.0, np.float32), "sa"),
                 numpy_helper.from_array(np.ones(w.shape[1], np.float32), "sw"), zero]
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, list(a.shape))],
                          [helper.make_tensor_value_info("y", out, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = 2, 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]


worst = {}
for m in (1, 2, 3, 8, 16, 128, 129):
    for k, n in ((640, 1536), (1024, 640), (640, 4096), (64, 96)):
        j = np.arange(k)
        quads = j[j % 4 < 2]
        codes = {"neighbours (2j, 2j+1)": bounded(k, n, j[0::2], j[1::2]),
                 "(j, j+2)": bounded(k, n, quads, quads + 2),
                 "unbounded": rng.choice([-127, 127], (k, n)).astype(np.int8)}
        a = np.where(rng.random((m, k)) < 0.5, 255, 0).astype(np.uint8)
        for label, w in codes.items():
            exact = (a.astype(np.int64) - 128) @ w.astype(np.int64)
            for op in ("MatMulInteger", "MatMulIntegerToFloat"):
                err = float(np.abs(run(a, w, op).astype(np.float64) - exact).max())
                worst[label, op] = max(worst.get((label, op), 0.0), err)
print(f"onnxruntime {ort.__version__}; rows 1-129, K 64-1,024: largest |product - exact|")
for (label, op), err in worst.items():
    print(f"  {label:24s} {op:22s} {err:12.0f}")
