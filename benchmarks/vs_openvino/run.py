"""Calculet's in-process LLM against OpenVINO GenAI's ContinuousBatchingPipeline, same prompts, alternating.

    python benchmarks/vs_openvino/run.py --ov-python $OV_VENV/bin/python --ov-model OV_DIR [--rounds 5]

Runs in the main venv (calculet in-process, `calculet.LLM`); the OpenVINO side runs in its own venv
as a subprocess (ov_side.py) fed over stdin, so neither environment sees the other's packages
(onnxruntime-openvino and onnxruntime cannot share one). Both get the same token ids (BOS + random
ids, new ones every round), greedy, a fixed output length, the same thread count. Scenarios
(common.py): `single` (TTFT, TPOT) and `batch8` (8 prompts at once: output tokens/s). Prints each
round and the median and worst round of every metric with the ratio B/A (A = OpenVINO GenAI,
B = calculet), under the CPU's ISA features, and the machine during every measured run (steal, busy,
the CPU the idle side took: ../vs_llamacpp/machine_load.py); writes results.json under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parent.parent / "vs_llamacpp"))
from common import SCENARIOS, summarize, timing  # noqa: E402
from machine_load import Load, loads_markdown, sample, since  # noqa: E402

METRICS = (("output_tok_s", True), ("ttft_p50_s", False), ("tpot_p50_s", False))


class OpenVinoSide:
    def __init__(self, python: str, model: str, threads: int, precision: str = ""):
        script = Path(__file__).resolve().parent / "ov_side.py"
        self.proc = subprocess.Popen([python, str(script), model, "--threads", str(threads), "--precision", precision],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        hello = json.loads(self.proc.stdout.readline() or "{}")
        if not hello.get("ready"):
            raise RuntimeError(f"ov_side.py did not start (exit {self.proc.poll()}); run it by hand to see why")
        self.versions = hello["versions"]
        self.precision = hello.get("precision", "?")   # the inference precision OpenVINO's matmuls ran in

    def measure(self, prompts: list[list[int]], max_new_tokens: int) -> dict:
        self.proc.stdin.write(json.dumps({"prompts": prompts, "max_new_tokens": max_new_tokens}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["summary"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


class CalculetSide:
    def __init__(self, model: str | None, threads: int, lanes: int):
        from calculet import LLM

        self.llm = LLM(model, threads=threads, lanes=lanes)

    def measure(self, prompts: list[list[int]], max_new_tokens: int) -> dict:
        from calculet import SamplingParams

        params = SamplingParams(max_tokens=max_new_tokens, min_tokens=max_new_tokens, ignore_eos=True, temperature=0)
        arrivals = [[] for _ in prompts]
        t0 = time.perf_counter()
        streams = [self.llm.stream(p, params) for p in prompts]   # all submitted before any is read

        def read(i):
            for delta in streams[i]:
                arrivals[i] += [time.perf_counter()] * len(delta.token_ids)

        threads = [threading.Thread(target=read, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        return summarize([timing(t0, a) for a in arrivals], wall)

    def close(self):
        self.llm.close()


def main(argv: list[str] | None = None) -> int:
    from calculet.cpu_features import detect

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ov-python", help="python of the OpenVINO venv (README.md); omit to measure calculet alone")
    p.add_argument("--ov-model", help="the `optimum-cli export openvino --weight-format int8` folder")
    p.add_argument("--calculet-model", help="calbin or source for calculet (default: the default model)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ov-precision", default="", metavar="f32|bf16|f16",
                   help="OpenVINO's INFERENCE_PRECISION_HINT (default: its own choice for this CPU, bf16 where it has "
                        "AMX or AVX-512 BF16; the results name the precision either way)")
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--vocab", type=int, default=20000, help="prompt ids are drawn from 3..vocab-1")
    p.add_argument("--bos", type=int, default=2, help="BOS id put first in every prompt (Gemma: 2; -1: none)")
    p.add_argument("--out", type=Path, default=Path("calculet-bench") / time.strftime("vs-openvino-%Y%m%d-%H%M%S"))
    args = p.parse_args(argv)
    if bool(args.ov_python) != bool(args.ov_model):
        raise SystemExit("error: give --ov-python and --ov-model together (or neither: calculet alone)")
    sides = {}
    if args.ov_python:
        sides["openvino"] = OpenVinoSide(args.ov_python, args.ov_model, args.threads, args.ov_precision)
    sides["calculet"] = CalculetSide(args.calculet_model, args.threads, lanes=max(SCENARIOS.values()))
    results = {name: {s: [] for s in sides} for name in SCENARIOS}
    pids = {"calculet": os.getpid(), **({"openvino": sides["openvino"].proc.pid} if "openvino" in sides else {})}
    loads: list[tuple[int, str, Load]] = []   # (round, scenario, machine load) per measured run
    rng = np.random.default_rng(0)
    try:
        for side in sides.values():  # warm-up: first-run allocations
            side.measure([[3, 4, 5, 6]], 2)
        for r in range(args.rounds):
            for name, n in SCENARIOS.items():
                bos = [args.bos] if args.bos >= 0 else []
                prompts = [bos + rng.integers(3, args.vocab, size=args.prompt_tokens - len(bos)).tolist() for _ in range(n)]
                for label, side in sides.items():
                    before = sample(pids)
                    results[name][label].append(side.measure(prompts, args.output_tokens))
                    loads.append((r + 1, name, since(before, sample(pids), label)))
                print(f"round {r + 1}: {name}: " + "; ".join(
                    f"{label} {res[-1]['output_tok_s']:.1f} tok/s, TTFT {res[-1]['ttft_p50_s'] * 1e3:.0f} ms"
                    for label, res in results[name].items()), file=sys.stderr)
    finally:
        for side in sides.values():
            side.close()
    cpu = detect().to_json()
    lines = [f"# calculet (B) vs OpenVINO GenAI (A), in-process: {args.rounds} alternating rounds", "",
             f"CPU: {detect().label}; {args.threads} threads; prompts {args.prompt_tokens} tokens; "
             f"output {args.output_tokens} tokens" +
             (f"; OpenVINO's inference precision {sides['openvino'].precision}" if "openvino" in sides else ""), "",
             "| scenario | metric | A median | A worst | B median | B worst | B/A median | B/A worst |", "|---" * 8 + "|"]
    for name in SCENARIOS:
        for metric, higher in METRICS:
            cols = []
            per = {label: [r[metric] for r in res] for label, res in results[name].items()}
            ratios = ([b / a for a, b in zip(per["openvino"], per["calculet"]) if a and b is not None]
                      if "openvino" in per else [])
            for values in (per.get("openvino", []), per["calculet"], ratios):
                got = [v for v in values if v is not None]
                worst = (min(got) if higher else max(got)) if got else None
                cols += [statistics.median(got) if got else None, worst]
            lines.append(f"| {name} | {metric} {'↑' if higher else '↓'} | " +
                         " | ".join("–" if v is None else f"{v:.3g}" for v in cols) + " |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"cpu": cpu, "args": {k: str(v) for k, v in vars(args).items()},
                                                       "openvino_precision": sides["openvino"].precision
                                                       if "openvino" in sides else None,
                                                       "results": results,
                                                       "machine": [{"round": r, "scenario": name, **load.to_json()}
                                                                   for r, name, load in loads]}, indent=1))
    lines += ["", loads_markdown(loads)]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
