"""The OpenVINO GenAI side: runs in its own venv (see README.md), answers measurement requests on stdin.

    $OV_VENV/bin/python benchmarks/vs_openvino/ov_side.py OV_MODEL_DIR --threads 2

Reads one JSON line per measurement, {"prompts": [[token ids], ...], "max_new_tokens": N}, submits
every prompt at once to a ContinuousBatchingPipeline (greedy, ignore_eos, the token ids as given so
both sides see the very same input), steps it until all are done, timing each token's arrival, and
writes one JSON line back: {"requests": [timing...], "wall_s": s}. `ready` is written once loaded.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import openvino as ov
import openvino_genai as ov_genai

from common import summarize, timing


def measure(pipe, prompts: list[list[int]], max_new_tokens: int) -> dict:
    config = ov_genai.GenerationConfig()
    config.max_new_tokens = max_new_tokens
    config.min_new_tokens = max_new_tokens
    config.ignore_eos = True
    config.do_sample = False
    t0 = time.perf_counter()
    handles = [pipe.add_request(i, ov.Tensor(np.asarray([p], dtype=np.int64)), config) for i, p in enumerate(prompts)]
    arrivals = [[] for _ in prompts]
    while pipe.has_non_finished_requests():
        pipe.step()
        now = time.perf_counter()
        for i, h in enumerate(handles):
            if h.can_read():
                for out in h.read().values():
                    arrivals[i] += [now] * len(out.generated_ids)
    for i, h in enumerate(handles):  # anything left after the last step
        if h.can_read():
            for out in h.read().values():
                arrivals[i] += [time.perf_counter()] * len(out.generated_ids)
    wall = time.perf_counter() - t0
    requests = [timing(t0, a) for a in arrivals]
    return {"requests": requests, "wall_s": wall, "summary": summarize(requests, wall)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="folder of an `optimum-cli export openvino` model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cache-gb", type=float, default=1.0, help="KV cache size for the scheduler (GB)")
    p.add_argument("--precision", default="", help="INFERENCE_PRECISION_HINT (f32, bf16, f16); empty: OpenVINO's "
                   "default for this CPU (bf16 where the CPU has AMX or AVX-512 BF16)")
    args = p.parse_args()
    scheduler = ov_genai.SchedulerConfig()
    scheduler.cache_size = max(1, int(args.cache_gb))
    scheduler.max_num_seqs = 8
    scheduler.dynamic_split_fuse = True
    config = {"INFERENCE_NUM_THREADS": args.threads, **({"INFERENCE_PRECISION_HINT": args.precision} if args.precision else {})}
    pipe = ov_genai.ContinuousBatchingPipeline(args.model, scheduler, "CPU", config)
    versions = {"openvino": ov.get_version(), "openvino_genai": getattr(ov_genai, "__version__", "?")}
    precision = args.precision or str(ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT"))
    print(json.dumps({"ready": True, "versions": versions, "precision": precision}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        print(json.dumps(measure(pipe, job["prompts"], job["max_new_tokens"])), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
