"""down_proj [2048 -> 640] on the int8 rows with k per-token outliers picked by TopK (exact, float32 or int8
weight rows gathered per token) against the 8-bit block kernel and the plain int8 rows.

    python dyn.py ROWS,...
"""
"""Micro-benchmark: down_proj [2048 -> 640] at R rows as MatMulNBits b32 vs per-row int8 with k dynamic outliers."""
import sys, time, statistics, random
import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto as TP
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from matmulnbits_kernels import session, open_session

K, N = 2048, 640
rng = np.random.default_rng(0)
W8 = rng.integers(-127, 128, size=(K, N), dtype=np.int8)
wscale = (rng.random(N, dtype=np.float32) * 0.01).astype(np.float32)

def c(name, arr): return numpy_helper.from_array(np.asarray(arr), name)

def dyn_model(R, k, mode):
    nodes, inits = [], [c("W8", W8), c("wscale", wscale), c("one", np.float32(1.0)), c("zp", np.uint8(128)),
                        c("zprow", np.full((R, 1), 128, np.uint8)), c("k1", np.array([k + 1], np.int64)),
                        c("c127", np.float32(127.0)), c("zeros", np.zeros((R, k), np.float32)),
                        c("s0", np.array([0], np.int64)), c("sk", np.array([k], np.int64)), c("sk1", np.array([k + 1], np.int64)),
                        c("ax1", np.array([1], np.int64))]
    n = lambda op, i, o, **kw: nodes.append(helper.make_node(op, i, o, **kw))
    n("Abs", ["A"], ["abs"])
    if k > 0:
        n("TopK", ["abs", "k1"], ["vals", "idx"], axis=1, largest=1, sorted=1)
        n("Slice", ["idx", "s0", "sk", "ax1"], ["idk"])
        n("Slice", ["vals", "sk", "sk1", "ax1"], ["peak"])
        n("GatherElements", ["A", "idk"], ["xo"], axis=1)
        n("ScatterElements", ["A", "idk", "zeros"], ["xin"], axis=1)
        src = "xin"
    else:
        n("ReduceMax", ["abs", "ax1"], ["peak"], keepdims=1)
        src = "A"
    n("Div", ["peak", "c127"], ["s"])
    n("QuantizeLinear", [src, "s", "zprow"], ["q"], axis=1, block_size=K)
    n("MatMulIntegerToFloat", ["q", "W8", "one", "wscale", "zp"], ["prod"], domain="com.microsoft")
    n("Mul", ["prod", "s"], ["scaled"])
    if k > 0:
        if mode == "f32":
            inits.append(c("Wf", (W8.astype(np.float32) * wscale)))
            n("Gather", ["Wf", "idk"], ["wg"], axis=0)                   # [R,k,N]
            n("Unsqueeze", ["xo", "ax1"], ["xo3"])                       # [R,1,k]
            n("MatMul", ["xo3", "wg"], ["yo3"])                          # [R,1,N]
            n("Squeeze", ["yo3", "ax1"], ["yo"])
            n("Add", ["scaled", "yo"], ["Y"])
        else:
            n("Gather", ["W8", "idk"], ["wg8"], axis=0)
            n("Cast", ["wg8"], ["wg"], to=TP.FLOAT)
            n("Unsqueeze", ["xo", "ax1"], ["xo3"])
            n("MatMul", ["xo3", "wg"], ["yo3"])
            n("Squeeze", ["yo3", "ax1"], ["yo"])
            n("Mul", ["yo", "wscale"], ["yos"])
            n("Add", ["scaled", "yos"], ["Y"])
    else:
        n("Identity", ["scaled"], ["Y"])
    g = helper.make_graph(nodes, "dyn", [helper.make_tensor_value_info("A", TP.FLOAT, [R, K])],
                          [helper.make_tensor_value_info("Y", TP.FLOAT, [R, N])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    return open_session(m, 2)

for R in [int(r) for r in sys.argv[1].split(",")]:
    A = rng.standard_normal((R, K), dtype=np.float32)
    sess = {"b32": session(8, 4, N, K, 32, 2), "rows8": dyn_model(R, 0, ""),
            "dyn8-i8": dyn_model(R, 8, "i8"), "dyn16-i8": dyn_model(R, 16, "i8"), "dyn16-f32": dyn_model(R, 16, "f32")}
    times = {nm: [] for nm in sess}
    calls = 20
    for rnd in range(9):
        order = list(sess); random.shuffle(order)
        for nm in order:
            s = sess[nm]; s.run(None, {"A": A})
            t0 = time.perf_counter()
            for _ in range(calls): s.run(None, {"A": A})
            times[nm].append((time.perf_counter() - t0) / calls * 1e6)
    base = statistics.median(times["b32"])
    print(f"rows {R}: " + "  ".join(f"{nm} {statistics.median(v):.0f}us ({statistics.median(v)/base:.2f}x)" for nm, v in times.items()), flush=True)
