"""Where does a step's time go? Device phases, per-op graph time, sampling and Python, side by side.

    python benchmarks/profile_step.py [CALBIN] [--lanes 1 8] [--steps 30] [--context-fill 200] [--nodes OP]

Runs through the real runtime (Device, IO bindings, jobs) on lanes prefilled to --context-fill tokens,
then reports per decode step: input prep, graph (body + head), output fetch, host sampling, and the
remainder (Python and the worker hand-off), and the top ops from ONNX Runtime's profiler (with --nodes OP,
also each node of that op type, e.g. --nodes GroupQueryAttention: one line per layer).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import tempfile
import time

import numpy as np


def _profiled_kernels(calbin, lanes: int, fill: int, steps: int) -> list[tuple[str, str, str, float]]:
    """(graph, op type, node, microseconds) of every kernel ONNX Runtime's own profiler timed in `steps` decode
    steps of decode_<n> and head_<n>, on `lanes` lanes prefilled to `fill` tokens."""
    import onnxruntime as ort

    from calculet.runtime.device import Device
    from calculet.runtime.jobs import DecodeJob

    original = ort.SessionOptions
    prefix = os.path.join(tempfile.mkdtemp(), "ort")

    class Profiled(original):
        def __init__(self):
            super().__init__()
            self.enable_profiling = True
            self.profile_file_prefix = prefix

    ort.SessionOptions = Profiled
    try:
        d = Device()
        d.configure(d.load(calbin))
    finally:
        ort.SessionOptions = original
    job_lanes = [d.lanes.allocate() for _ in range(lanes)]
    for lane in job_lanes:
        _fill(d, lane, fill)
    for _ in range(steps):
        d.run(DecodeJob(tuple(job_lanes), (5,) * lanes), 600)
    kernels = []
    graph = d.program.decode_graph_for(lanes)
    for name in (graph.name, f"head_{graph.lanes}"):
        path = d.program.sessions[name].end_profiling()
        for event in json.load(open(path)):
            if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                kernels.append((name, event["args"]["op_name"], event["name"][:-len("_kernel_time")], event["dur"]))
    d.close()
    return kernels


def _fill(d, lane: int, tokens: int) -> None:
    """Prefill `lane` to `tokens` tokens in chunks of at most 128."""
    from calculet.runtime.jobs import PrefillJob

    pos = 0
    while pos < tokens:
        chunk = min(128, tokens - pos)
        d.run(PrefillJob(lane, tuple(range(10 + pos, 10 + pos + chunk))), 600)
        pos += chunk


def _by_op(kernels, steps: int) -> list[tuple[str, float]]:
    """The ten op types (per graph) with the most kernel time, ms per step."""
    totals = collections.Counter()
    for graph, op, _, us in kernels:
        totals[f"{graph}:{op}"] += us
    return [(op, us / 1000 / steps) for op, us in totals.most_common(10)]


def _by_node(kernels, steps: int, op: str) -> list[tuple[str, float]]:
    """Every node of op type `op`, in name order (layer numbers as numbers), ms per step."""
    totals = collections.Counter()
    for graph, kind, node, us in kernels:
        if kind == op:
            totals[f"{graph}:{node}"] += us
    def natural(name: str) -> list:
        return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
    return [(node, totals[node] / 1000 / steps) for node in sorted(totals, key=natural)]


def main() -> None:
    from calculet.cache import ensure_calbin
    from calculet.compiler.options import CompileOptions
    from calculet.engine.sampler import SamplerConfig, SequenceSampler
    from calculet.runtime.device import Device
    from calculet.runtime.jobs import DecodeJob

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calbin", nargs="?", default=None)
    ap.add_argument("--lanes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--context-fill", type=int, default=200)
    ap.add_argument("--nodes", metavar="OP", default=None, help="also list each node of this op type (profiler, ms per step)")
    args = ap.parse_args()
    calbin = ensure_calbin(args.calbin, CompileOptions())
    d = Device()
    d.configure(d.load(calbin))
    print(f"calbin {calbin}\n")
    print("| lanes | step ms | input prep | graph | output fetch | sampling | python + hand-off |")
    print("|---|---|---|---|---|---|---|")
    for n in args.lanes:
        lanes = [d.lanes.allocate() for _ in range(n)]
        for lane in lanes:
            _fill(d, lane, args.context_fill)
        samplers = [SequenceSampler(SamplerConfig(temperature=0.0)) for _ in lanes]
        rows = collections.defaultdict(list)
        tokens = [5] * n
        for step in range(args.steps + 3):
            t0 = time.perf_counter()
            r = d.run(DecodeJob(tuple(lanes), tuple(tokens)), 600)
            t1 = time.perf_counter()
            tokens = [s.sample(r.logits[i], (r.topk_ids[i], r.topk_values[i]) if r.topk_ids is not None else None)
                      for i, s in enumerate(samplers)]
            t2 = time.perf_counter()
            if step >= 3:  # warm-up
                t = r.timings
                rows["step"].append(t2 - t0)
                rows["prep"].append(t.input_prep)
                rows["infer"].append(t.infer)
                rows["fetch"].append(t.output_fetch)
                rows["sample"].append(t2 - t1)
                rows["rest"].append((t1 - t0) - t.input_prep - t.infer - t.output_fetch)
        ms = {k: statistics.median(v) * 1000 for k, v in rows.items()}
        print(f"| {n} | {ms['step']:.2f} | {ms['prep']:.3f} | {ms['infer']:.2f} | {ms['fetch']:.3f} | "
              f"{ms['sample']:.3f} | {ms['rest']:.3f} |")
        for lane in lanes:
            d.lanes.free(lane)
    d.close()
    for n in args.lanes:
        steps = min(args.steps, 10)
        kernels = _profiled_kernels(calbin, n, args.context_fill, steps)
        print(f"\ntop ops per decode step, {n} lane(s) (ONNX Runtime profiler, ms):")
        for op, ms in _by_op(kernels, steps):
            print(f"  {op:55s} {ms:7.2f}")
        if args.nodes:
            nodes = _by_node(kernels, steps, args.nodes)
            print(f"\n{args.nodes} nodes per decode step, {n} lane(s) (ms): {sum(ms for _, ms in nodes):.2f} in all")
            for node, ms in nodes:
                print(f"  {node:70s} {ms:7.3f}")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
