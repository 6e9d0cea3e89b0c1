"""Does ONNX Runtime's GroupQueryAttention skip the rows its `local_window_size` leaves out? (decode, one node)

    python benchmarks/gqa_window.py [--lanes 8] [--buffer 1152] [--window 512] [--rounds 7] [--calls 200]

The question behind a "mirrored" KV ring (RESULTS.md, 2026-12-05 (8)): past the sliding window a ring
layer's decode reads all R = 640 ring rows with a mask, because GroupQueryAttention (GQA) attends rows
0..seqlens_k of its buffer and a wrapped ring's last W positions are not rows 0..p. Written twice (at
p mod R and, for the first W - 1 rows, again past R), the last W positions would always sit in
contiguous rows ending at the newest one, and GQA with `local_window_size` = W could read them in
place (ONNX Runtime 1.32's CPU kernel attends the last `local_window_size` rows, the new one included, as
compiler/layers.py relies on; tests/bench/test_gqa_window.py checks it). That pays only if the kernel's cost follows the window, not seqlens_k. Timed here, alternating,
one GQA node each, the default model's shape (4 query heads, 1 KV head, head 256), every lane at the
same length, past and present bound to the same buffer as the runtime binds them:

    causal W       seqlens_k = W - 1, no window        (what an unwrapped ring layer runs now, at best)
    causal R       seqlens_k = R - 1, no window        (the rows the whole-ring branch reads)
    mirror         seqlens_k = buffer - 1, window W    (a mirrored ring's worst row)

If `mirror` costs what `causal W` does, the kernel skips the masked rows; if it costs more than
`causal R`, a mirrored ring would be slower than the whole-ring products it is meant to replace.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _session(lanes: int, heads: int, kv_heads: int, dim: int, buffer: int, window: int, threads: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    f32 = TensorProto.FLOAT
    node = helper.make_node(
        "GroupQueryAttention", ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total"], ["out", "present_k", "present_v"],
        domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads, local_window_size=window, do_rotary=0,
        scale=float(dim ** -0.5))
    kv = [lanes, kv_heads, buffer, dim]
    graph = helper.make_graph(
        [node], "gqa",
        [helper.make_tensor_value_info("q", f32, [lanes, 1, heads * dim]),
         helper.make_tensor_value_info("k", f32, [lanes, 1, kv_heads * dim]),
         helper.make_tensor_value_info("v", f32, [lanes, 1, kv_heads * dim]),
         helper.make_tensor_value_info("past_k", f32, kv), helper.make_tensor_value_info("past_v", f32, kv),
         helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [lanes]),
         helper.make_tensor_value_info("total", TensorProto.INT32, [])],
        [helper.make_tensor_value_info("out", f32, [lanes, 1, heads * dim]),
         helper.make_tensor_value_info("present_k", f32, kv), helper.make_tensor_value_info("present_v", f32, kv)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


class Case:
    """One GQA configuration with its buffers bound in place (present = past), as calculet's runtime binds them."""

    def __init__(self, name: str, session, lanes: int, heads: int, kv_heads: int, dim: int, buffer: int, seqlen: int):
        import onnxruntime as ort

        rng = np.random.default_rng(0)
        self.name, self.session = name, session
        kv = [rng.standard_normal((lanes, kv_heads, buffer, dim), dtype=np.float32) for _ in range(2)]
        feeds = {"q": rng.standard_normal((lanes, 1, heads * dim), dtype=np.float32),
                 "k": rng.standard_normal((lanes, 1, kv_heads * dim), dtype=np.float32),
                 "v": rng.standard_normal((lanes, 1, kv_heads * dim), dtype=np.float32),
                 "seqlens_k": np.full(lanes, seqlen, np.int32), "total": np.array(seqlen + 1, np.int32)}
        self.feeds = feeds
        self.binding = session.io_binding()
        for name_, value in feeds.items():
            self.binding.bind_cpu_input(name_, value)
        self.binding.bind_output("out")   # bound first: copy_outputs_to_cpu()[0]
        for past, present, buf in (("past_k", "present_k", kv[0]), ("past_v", "present_v", kv[1])):
            value = ort.OrtValue.ortvalue_from_numpy(buf)
            self.binding.bind_ortvalue_input(past, value)
            self.binding.bind_ortvalue_output(present, value)
        self.kv = kv   # keep the buffers alive

    def time(self, calls: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            self.session.run_with_iobinding(self.binding)
        return (time.perf_counter() - start) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lanes", type=int, default=8)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=1)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--window", type=int, default=512, help="the model's sliding window W")
    p.add_argument("--ring", type=int, default=640, help="the ring's rows R (window + largest chunk)")
    p.add_argument("--buffer", type=int, default=1152, help="a mirrored ring's rows: R + W - 1, rounded up")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=200)
    a = p.parse_args(argv)
    from calculet.cpu_features import detect

    shape = (a.lanes, a.heads, a.kv_heads, a.dim, a.buffer)
    cases = [Case(f"causal W (seqlens_k {a.window - 1}, no window)", _session(*shape[:-1], a.buffer, -1, a.threads),
                  *shape, a.window - 1),
             Case(f"causal R (seqlens_k {a.ring - 1}, no window)", _session(*shape[:-1], a.buffer, -1, a.threads),
                  *shape, a.ring - 1),
             Case(f"mirror (seqlens_k {a.buffer - 1}, window {a.window})",
                  _session(*shape[:-1], a.buffer, a.window, a.threads), *shape, a.buffer - 1)]
    times: dict[str, list[float]] = {c.name: [] for c in cases}
    for c in cases:
        c.time(20)   # warm
    for r in range(a.rounds):
        for c in (cases if r % 2 == 0 else cases[::-1]):
            times[c.name].append(c.time(a.calls))
    base = statistics.median(times[cases[0].name])
    print(f"CPU: {' '.join(detect().flags)}; lanes {a.lanes}, heads {a.heads}/{a.kv_heads}, head {a.dim}, "
          f"buffer {a.buffer} rows, {a.threads} threads, {a.rounds} alternating rounds of {a.calls} calls")
    print("| case | us per call, median (worst round) | vs causal W |")
    print("|---|---|---|")
    for c in cases:
        med = statistics.median(times[c.name])
        print(f"| {c.name} | {med:.0f} ({max(times[c.name]):.0f}) | {med / base:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
