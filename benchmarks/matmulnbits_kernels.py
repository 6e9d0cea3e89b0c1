"""MatMulNBits per ISA: 8-bit vs 4-bit blocks, fp32 vs int8 compute, 1 row (decode) vs many (prefill).

    python benchmarks/matmulnbits_kernels.py [--n 2048] [--k 640] [--rows 1,8,128] [--threads 2]
    python benchmarks/matmulnbits_kernels.py --n 262144 --rows 1,8 --int8-compute-only   # the lm_head

One ONNX Runtime MatMulNBits node per variant on the same random weight shape (default: the
default model's MLP up projection, [2048 x 640], blocks of 32), timed alternately; prints each
variant's time relative to 8-bit blocks with int8 compute (the `default` policy's kernel) per row
count, under this CPU's ISA features. This is the evidence behind `--weights auto` (calbin/isa.py):
run it on an AVX2-only CPU and on an AVX-512 VNNI one and compare the 4-bit/int8 and 8-bit/int8
columns. It also shows why the `int8` weight-only policy is slow: 8-bit blocks at fp32 compute
(accuracy_level 1) have no kernel and dequantize the whole weight per call. The column after the
blocks is the prefill-int8 pass's per-token int8 GEMM (rows quantized in the graph, int8 codes per
column), the kernel prefill chunks run on a CPU with VNNI or AMX (`--unsigned`: its codes as uint8
around 128, the exact u8 x u8 kernel the pass stores without VNNI). `--two-level` adds the two-level
int8 GEMM over the same codes (each row and then its residue quantized, one GEMM of twice the rows:
what down_proj runs in prefill chunks with AMX), timed for the same rows as the others.

    python benchmarks/matmulnbits_kernels.py --n 640 --k 2048 --rows 1,8 --int8-compute-only --unsigned --two-level
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

VARIANTS = (("8-bit, int8 compute (default)", 8, 4), ("4-bit, int8 compute (w4a8)", 4, 4),
            ("4-bit, fp32 compute (int4)", 4, 1), ("8-bit, fp32 compute (int8)", 8, 1))
ROWS8 = "int8 rows (prefill-int8)"   # the column after the blocks: rows8_session
TWO_LEVEL = "two-level int8 rows"    # --two-level's column: two_level_session


def open_session(model, threads: int):
    """An ONNX Runtime session on `model` whose thread pool spins as the runtime's do (DeviceConfig.spinning
    "run": spin while a call runs, stop when it ends). ONNX Runtime's default keeps a session's threads
    spinning after its call, on the cores the next session's call then needs: alternating sessions timed
    each other's spinning (a 128-row call of the int8 rows 3.4 ms that way, 1.0 ms alone, Zen 4)."""
    import onnxruntime as ort

    from calculet.runtime.program import session_spinning

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session_spinning(options, "run")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def session(bits: int, accuracy_level: int, n: int, k: int, block: int, threads: int):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    codes = rng.integers(0, 256, size=(n, k // block, block * bits // 8), dtype=np.uint8)
    scales = (rng.random((n, k // block), dtype=np.float32) * 0.01).astype(np.float32)
    node = helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], domain="com.microsoft", K=k, N=n, bits=bits,
                            block_size=block, accuracy_level=accuracy_level)
    graph = helper.make_graph([node], "mnb", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])],
                              [numpy_helper.from_array(codes, "B"), numpy_helper.from_array(scales, "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return open_session(model, threads)


def _rows8_store(n: int, k: int, unsigned: bool):
    """A store holding random int8 codes per output column `w.rows8` [k, n] (uint8 + 128 where `unsigned`) and
    their scales, registered as an 8-bit block weight `w` [n x k] the way the pass's stores are."""
    from calculet.compiler.weights import QuantInfo, WeightStore

    rng = np.random.default_rng(0)
    store = WeightStore()
    codes = rng.integers(-127, 128, size=(k, n), dtype=np.int8)                                   # [in, out]
    store.add("w.rows8.weight", (codes.astype(np.int16) + 128).astype(np.uint8) if unsigned else codes)
    store.add("w.rows8.scale", (rng.random(n, dtype=np.float32) * 0.01).astype(np.float32))
    store.add_quantized("w", QuantInfo(bits=8, block=32, n=n, k=k, accuracy_level=4),
                        np.zeros((n, k // 32, 32), np.uint8), np.zeros((n, k // 32), np.float32))
    return store


def _inline_session(g, store, threads: int):
    """open_session on the graph `g` builds, with the store's weights inline (a calbin keeps them in weights.bin)."""
    from onnx import TensorProto, numpy_helper

    model = g.build()
    for init in model.graph.initializer:
        if init.data_location == TensorProto.EXTERNAL:
            init.CopyFrom(numpy_helper.from_array(store.array(init.name), init.name))
    return open_session(model, threads)


def rows8_session(n: int, k: int, rows: int, threads: int, unsigned: bool = False):
    """The prefill-int8 pass's GEMM built by the pass itself (prefill_int8.per_row_int8_product, then the
    row scales' Mul; no outlier channels): each row of A quantized to uint8 on its own scale, u8 x s8
    `MatMulIntegerToFloat` over int8 codes per output column (`unsigned`: the same codes as uint8 + 128, the
    exact u8 x u8 kernel the pass stores without VNNI). Its graph has a static row count, so one session per
    row count; the per-row quantize is part of the time."""
    from calculet.compiler.builder import GraphBuilder
    from calculet.compiler.prefill_int8 import per_row_int8_product

    store = _rows8_store(n, k, unsigned)
    g = GraphBuilder("rows8", store)
    g.input("A", np.dtype(np.float32), (rows, k))
    product, scale = per_row_int8_product(g, "A", "w.rows8", rows, "/rows8")
    g.output(g.op("Mul", [product, scale], name="/rows8/Scaled"), "Y", np.dtype(np.float32), (rows, n))
    return _inline_session(g, store, threads)


def two_level_session(n: int, k: int, rows: int, threads: int, unsigned: bool = False):
    """The two-level int8 GEMM built by the pass (prefill_int8.two_level_linear: each row quantized, then its
    residue on a finer scale, both through one GEMM of twice the rows, the levels summed), over the same
    codes as rows8_session; the quantizes, the residue and the sum are part of the time."""
    from calculet.compiler.builder import GraphBuilder
    from calculet.compiler.prefill_int8 import two_level_linear

    store = _rows8_store(n, k, unsigned)
    g = GraphBuilder("two_level", store)
    g.input("A", np.dtype(np.float32), (1, rows, k))
    y = two_level_linear(g, "A", "w", 1, rows, "/two_level")
    g.output(y, "Y", np.dtype(np.float32), (1, rows, n))
    return _inline_session(g, store, threads)


def main(argv: list[str] | None = None) -> int:
    from calculet.cpu_features import detect

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--k", type=int, default=640)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--rows", default="1,8,128")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--int8-compute-only", action="store_true",
                   help="leave out the fp32-compute variants (they dequantize the whole weight per call: "
                        "minutes on a [262144 x 640] lm_head)")
    p.add_argument("--unsigned", action="store_true",
                   help="the int8 columns over uint8 codes around 128 (u8 x u8: what the pass stores without VNNI)")
    p.add_argument("--two-level", action="store_true",
                   help="add a column: the two-level int8 GEMM (prefill_int8.two_level_linear) over the same codes")
    args = p.parse_args(argv)
    variants = [v for v in VARIANTS if v[2] == 4] if args.int8_compute_only else list(VARIANTS)
    blocks = [session(bits, level, args.n, args.k, args.block, args.threads) for _, bits, level in variants]
    print(f"CPU: {detect().label}; weight [{args.n} x {args.k}], blocks of {args.block}, {args.threads} threads")
    codes = " (u8 x u8)" if args.unsigned else ""
    extra = [f"{ROWS8}{codes}"] + ([f"{TWO_LEVEL}{codes}"] if args.two_level else [])
    print("| rows | " + " | ".join([name for name, _, _ in variants] + extra) + " |")
    print("|---" * (len(variants) + len(extra) + 1) + "|")
    for rows in (int(r) for r in args.rows.split(",")):
        sessions = blocks + [rows8_session(args.n, args.k, rows, args.threads, args.unsigned)]
        if args.two_level:
            sessions.append(two_level_session(args.n, args.k, rows, args.threads, args.unsigned))
        a = np.random.default_rng(1).random((rows, args.k), dtype=np.float32)
        feeds = [{"A": a.reshape(s.get_inputs()[0].shape) if len(s.get_inputs()[0].shape) == 3 else a} for s in sessions]
        calls = max(3, 256 // rows)
        times = [[] for _ in sessions]
        for s, feed in zip(sessions, feeds):
            s.run(None, feed)
        for _ in range(args.rounds):
            for i, (s, feed) in enumerate(zip(sessions, feeds)):
                t0 = time.perf_counter()
                for _ in range(calls):
                    s.run(None, feed)
                times[i].append((time.perf_counter() - t0) / calls)
        base = statistics.median(times[0])
        print(f"| {rows} | " + " | ".join(f"{statistics.median(t) / base:.2f}x" for t in times) +
              f" |   (default: {base * 1e6:.0f} us per call)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
