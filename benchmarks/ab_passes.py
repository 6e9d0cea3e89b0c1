"""Fusion passes A/B, in one run: every pass on, each pass off, and host sampling (no sampling head).

    python benchmarks/ab_passes.py [SOURCE] [--steps 30] [--out benchmarks/ab_passes.md]

Compiles the source (default: the embedded Gemma 3 270M) once per variant with the default weight
policy, then measures through the real runtime, interleaving variants round by round so machine
noise hits them alike: decode step time at 1 and 8 lanes (200 tokens of context), the time of a
128-token prefill chunk, and host time to pick the next token (sampling) per step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from calculet.compiler.compile import compile_calbin
from calculet.compiler.options import FUSIONS, CompileOptions
from calculet.engine.sampler import SamplerConfig, SequenceSampler
from calculet.runtime.device import Device
from calculet.runtime.jobs import DecodeJob, PrefillJob


def variants() -> dict[str, frozenset[str]]:
    out = {"all passes": frozenset(FUSIONS)}
    for name in FUSIONS:
        out[f"no {name}"] = frozenset(FUSIONS) - {name}
    out["no passes"] = frozenset()
    return out


class Probe:
    def __init__(self, calbin: Path):
        self.device = Device()
        self.device.configure(self.device.load(calbin))
        lanes = self.device.lanes
        self.lanes = [lanes.allocate() for _ in range(lanes.count)]
        for lane in self.lanes:
            for start in range(0, 200, 100):
                self.device.run(PrefillJob(lane, tuple(range(10 + start, 110 + start)), want_logits=False), 600)
        self.spare = self.lanes.pop()  # for the prefill probe
        self.greedy = SequenceSampler(SamplerConfig(temperature=0.0))
        self.head = self.device.program.candidates > 0

    def decode(self, n: int) -> tuple[float, float]:
        """One greedy step as the engine runs it: with a sampling head no vocabulary row is fetched."""
        t0 = time.perf_counter()
        r = self.device.run(DecodeJob(tuple(self.lanes[:n]), (5,) * n, full_logits=not self.head), 600)
        t1 = time.perf_counter()
        for i in range(n):
            cand = (r.topk_ids[i], r.topk_values[i]) if r.topk_ids is not None else None
            self.greedy.sample(r.logits[i] if r.logits is not None else None, cand)
        return t1 - t0, time.perf_counter() - t1

    def prefill(self) -> float:
        self.device.lanes.clear(self.spare)
        t0 = time.perf_counter()
        self.device.run(PrefillJob(self.spare, tuple(range(10, 138))), 600)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", nargs="?", default=None)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="calculet-ab-"))
    probes = {}
    for label, fusions in variants().items():
        out = work / (label.replace(" ", "_") + ".calbin")
        compile_calbin(args.source, out, CompileOptions(golden=False, fusions=fusions), log=lambda _m: None)
        probes[label] = Probe(out)
    samples = {k: {"d1": [], "d8": [], "s1": [], "s8": [], "p": []} for k in probes}
    for _ in range(args.steps):  # round-robin: every variant sees the same machine state
        for label, probe in probes.items():
            d1, s1 = probe.decode(1)
            d8, s8 = probe.decode(7)
            s = samples[label]
            s["d1"].append(d1), s["s1"].append(s1), s["d8"].append(d8), s["s8"].append(s8)
    for _ in range(max(3, args.steps // 5)):
        for label, probe in probes.items():
            samples[label]["p"].append(probe.prefill())
    base = {k: statistics.median(v) for k, v in samples["all passes"].items()}
    lines = ["| variant | decode 1 lane (ms) | decode 7 lanes (ms) | prefill 128 (ms) | sampling 1 / 7 rows (ms) | vs all passes (1 / 7 / prefill) |",
             "|---|---|---|---|---|---|"]
    for label, s in samples.items():
        m = {k: statistics.median(v) for k, v in s.items()}
        lines.append(f"| {label} | {m['d1']*1e3:.2f} | {m['d8']*1e3:.2f} | {m['p']*1e3:.1f} | "
                     f"{m['s1']*1e3:.3f} / {m['s8']*1e3:.3f} | "
                     f"{m['d1']/base['d1']:.2f}x / {m['d8']/base['d8']:.2f}x / {m['p']/base['p']:.2f}x |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
