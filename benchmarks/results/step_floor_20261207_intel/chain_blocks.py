"""MatMulNBits (int8 compute) by bits and block size, 18 chained products of one shape, each with its own weights:

    python chain_blocks.py ROWS KINDS K N       e.g.  python chain_blocks.py 8 8b32,8b64,8b128,4b32 640 4096
"""
import statistics, sys, time
from pathlib import Path
import numpy as np
from onnx import TensorProto, helper, numpy_helper
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from matmulnbits_kernels import open_session
LAYERS = 18
K, N = int(sys.argv[3]), int(sys.argv[4])
def session(kind, rows, rng):
    bits, block = (int(x) for x in kind.split("b"))
    nodes, inits, outs = [], [], []
    for l in range(LAYERS):
        inits += [numpy_helper.from_array(rng.integers(0, 256, (N, K // block, block * bits // 8), dtype=np.uint8), f"B{l}"),
                  numpy_helper.from_array(rng.random((N, K // block), dtype=np.float32) * 0.01, f"S{l}")]
        nodes.append(helper.make_node("MatMulNBits", ["A", f"B{l}", f"S{l}"], [f"Y{l}"], domain="com.microsoft", K=K, N=N,
                                      bits=bits, block_size=block, accuracy_level=4))
        outs.append(helper.make_tensor_value_info(f"Y{l}", TensorProto.FLOAT, [rows, N]))
    g = helper.make_graph(nodes, "c", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [rows, K])], outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return open_session(m, 2), {"A": rng.random((rows, K), dtype=np.float32)}
rows = int(sys.argv[1]); kinds = sys.argv[2].split(",")
rng = np.random.default_rng(0)
ss = {k: session(k, rows, rng) for k in kinds}
t = {k: [] for k in kinds}
for r in range(21):
    for k in (kinds if r % 2 == 0 else kinds[::-1]):
        s, f = ss[k]; t0 = time.perf_counter(); s.run(None, f); t[k].append((time.perf_counter() - t0) * 1e3)
for k in kinds: print(f"rows {rows} {k:8s} {statistics.median(t[k][3:]):7.2f} ms")
