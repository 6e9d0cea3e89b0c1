"""18 projections of one shape in one ONNX graph, each with its own weights (so they stream from memory as in
a decode step, not from cache as one repeated node does), timed per kernel:

    python chained_products.py [ROWS] [KINDS]      e.g.  python chained_products.py 8 mnb,u8u8,u8s8,s7

mnb: MatMulNBits, 8-bit blocks of 32, int8 compute (accuracy_level 4: the decode body's block kernel);
u8u8: MatMulInteger over uint8 weights around 128 (the prefill-int8 pass's codes without an int8 dot);
u8s8: MatMulInteger over full-range int8 weights (saturates pair sums without an int8 dot: timing only);
s7: MatMulInteger over 7-bit int8 weights (exact there). The integer kinds take uint8 activations as
given (no quantize), so they time the GEMM alone. Shape: the packed gate/up [640 -> 4,096]. 25 rounds in
alternating order, the first 3 dropped; sessions spin only while they run (matmulnbits_kernels.open_session).
Run from the repository root (it imports benchmarks/matmulnbits_kernels.py).
"""
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from matmulnbits_kernels import open_session  # noqa: E402

LAYERS, K, N = 18, 640, 4096


def session(kind: str, rows: int, rng):
    nodes, inits, outs = [], [numpy_helper.from_array(np.array(0, np.uint8), "AZ")], []
    for layer in range(LAYERS):
        if kind == "mnb":
            inits += [numpy_helper.from_array(rng.integers(0, 256, (N, K // 32, 32), dtype=np.uint8), f"B{layer}"),
                      numpy_helper.from_array(rng.random((N, K // 32), dtype=np.float32) * 0.01, f"S{layer}")]
            nodes.append(helper.make_node("MatMulNBits", ["A", f"B{layer}", f"S{layer}"], [f"Y{layer}"],
                                          domain="com.microsoft", K=K, N=N, bits=8, block_size=32, accuracy_level=4))
            outs.append(helper.make_tensor_value_info(f"Y{layer}", TensorProto.FLOAT, [rows, N]))
            continue
        if kind == "u8u8":
            w, zero = rng.integers(0, 256, (K, N), dtype=np.uint8), np.array(128, np.uint8)
        else:
            top = 127 if kind == "u8s8" else 63
            w, zero = rng.integers(-top, top + 1, (K, N), dtype=np.int8), np.array(0, np.int8)
        inits += [numpy_helper.from_array(w, f"B{layer}"), numpy_helper.from_array(zero, f"Z{layer}")]
        nodes.append(helper.make_node("MatMulInteger", ["A", f"B{layer}", "AZ", f"Z{layer}"], [f"Y{layer}"]))
        outs.append(helper.make_tensor_value_info(f"Y{layer}", TensorProto.INT32, [rows, N]))
    dtype = TensorProto.FLOAT if kind == "mnb" else TensorProto.UINT8
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("A", dtype, [rows, K])], outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    feed = rng.random((rows, K), dtype=np.float32) if kind == "mnb" else rng.integers(0, 256, (rows, K), dtype=np.uint8)
    return open_session(model, 2), {"A": feed}


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    kinds = sys.argv[2].split(",") if len(sys.argv) > 2 else ["mnb", "u8u8", "u8s8", "s7"]
    rng = np.random.default_rng(0)
    sessions = {k: session(k, rows, rng) for k in kinds}
    times = {k: [] for k in kinds}
    for r in range(25):
        for k in (kinds if r % 2 == 0 else kinds[::-1]):
            s, feed = sessions[k]
            t0 = time.perf_counter()
            s.run(None, feed)
            times[k].append((time.perf_counter() - t0) * 1e3)
    for k in kinds:
        print(f"rows {rows} {k:5s} median {statistics.median(times[k][3:]):7.2f} ms  fastest {min(times[k]):7.2f}")


if __name__ == "__main__":
    main()
