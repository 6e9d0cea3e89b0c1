"""Where does a step's time go? Device phases, per-op graph time, sampling and Python, side by side.

    python benchmarks/profile_step.py [CALBIN] [--lanes 1 8] [--steps 30] [--context-fill 200]

Runs through the real runtime (Device, IO bindings, jobs) on lanes prefilled to --context-fill tokens,
then reports per decode step: input prep, graph (body + head), output fetch, host sampling, and the
remainder (Python and the worker hand-off), and the top ops from ONNX Runtime's profiler.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import tempfile
import time

import numpy as np


def _profile_ops(calbin, lanes: int, fill: int, steps: int) -> list[tuple[str, float]]:
    """Per-op-type ms per step for decode_<n> + head_<n>, from ONNX Runtime's own profiler."""
    import onnxruntime as ort

    from calculet.runtime.device import Device
    from calculet.runtime.jobs import DecodeJob, PrefillJob

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
        d.run(PrefillJob(lane, tuple(range(10, 10 + min(fill, 128)))), 600)
    for _ in range(steps):
        d.run(DecodeJob(tuple(job_lanes), (5,) * lanes), 600)
    totals = collections.Counter()
    graph = d.program.decode_graph_for(lanes)
    for name in (graph.name, f"head_{graph.lanes}"):
        path = d.program.sessions[name].end_profiling()
        for event in json.load(open(path)):
            if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                totals[f"{name}:{event['args']['op_name']}"] += event["dur"]
    d.close()
    return [(op, us / 1000 / steps) for op, us in totals.most_common(10)]


def main() -> None:
    from calculet.cache import ensure_calbin
    from calculet.compiler.options import CompileOptions
    from calculet.engine.sampler import SamplerConfig, SequenceSampler
    from calculet.runtime.device import Device
    from calculet.runtime.jobs import DecodeJob, PrefillJob

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calbin", nargs="?", default=None)
    ap.add_argument("--lanes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--context-fill", type=int, default=200)
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
            pos = 0
            while pos < args.context_fill:
                chunk = min(128, args.context_fill - pos)
                d.run(PrefillJob(lane, tuple(range(10 + pos, 10 + pos + chunk))), 600)
                pos += chunk
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
        print(f"\ntop ops per decode step, {n} lane(s) (ONNX Runtime profiler, ms):")
        for op, ms in _profile_ops(calbin, n, args.context_fill, min(args.steps, 10)):
            print(f"  {op:55s} {ms:7.2f}")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
