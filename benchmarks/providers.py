"""Execution providers side by side on one calbin: load time (cold and cached), prefill and decode
tokens/s, in one process, rounds alternating between providers.

    # onnxruntime-openvino carries both the CPU and the OpenVINO provider, so one environment runs both
    # (.ci/run-openvino builds it as .venv-openvino):
    calculet compile -o portable-int8.calbin --target portable --weights int8 --lanes 8 --context 1024 --no-golden
    .venv-openvino/bin/python benchmarks/providers.py portable-int8.calbin --providers cpu,openvino --out providers.md

A provider may carry OpenVINO's inference precision, `openvino@bf16` (its CPU plugin then runs the
matmuls and attention in bfloat16, on AMX tiles where the CPU has them; `openvino` alone keeps
calculet's float32 default), so `--providers openvino,openvino@bf16` compares the two.

Per round and provider: `load` = open the calbin and configure it (sessions created; for OpenVINO with
a fresh, empty `cache_dir`, so the model is compiled for the device), `cached load` = the same again
with that `cache_dir` now filled (OpenVINO reads its compiled blobs back; the CPU provider has no such
cache, so its second load only differs by the OS page cache), `prefill` = one lane, a --prompt-tokens
prompt through the largest prefill chunk (or the calls --chunks names), tokens / seconds, `decode N` = N lanes decoding together for
--steps steps after --warmup, N x steps / seconds. Reported per metric: each provider's median and
worst round, and the ratio to the first provider per round (median and worst). The CPU's features
head the table: the ratio depends on them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def cpu_line() -> str:
    from calculet.cpu_features import detect

    cpu = detect()
    return f"{cpu.model or cpu.machine}, {os.cpu_count()} cores: {cpu.label}"


PRECISIONS = ("f32", "bf16")


def _options(spec: str, cache_dir: str | None) -> tuple[tuple[str, str], ...]:
    """Provider options for `spec` (`cpu`, `openvino`, `openvino@bf16`): the cache folder and, for
    `@PRECISION`, OpenVINO's CPU inference precision beside calculet's default load_config."""
    import json

    from calculet.runtime.providers import OPENVINO_CPU_LOAD_CONFIG

    provider, _, precision = spec.partition("@")
    if precision and (provider != "openvino" or precision not in PRECISIONS):
        raise SystemExit(f"error: {spec!r}: only openvino takes @PRECISION, one of {', '.join(PRECISIONS)}")
    out = [("cache_dir", cache_dir)] if provider == "openvino" and cache_dir else []
    if precision:
        cpu = {**OPENVINO_CPU_LOAD_CONFIG["CPU"], "INFERENCE_PRECISION_HINT": precision}
        out.append(("load_config", json.dumps({"CPU": cpu})))
    return tuple(out)


def _open(path: Path, spec: str, cache_dir: str | None, threads: int):
    from calculet.runtime.chips import ChipConfig, open_device

    t0 = time.perf_counter()
    device = open_device(path, (ChipConfig(0, spec.partition("@")[0], _options(spec, cache_dir), threads),))
    return device, time.perf_counter() - t0


def prefill_calls(tokens: int, chunks: tuple[int, ...], largest: int) -> list[int]:
    """Each prefill call's token count: `chunks` in order, the last one repeated (none: `largest`), the
    final call cut to what is left."""
    plan, calls, left = list(chunks) or [largest], [], tokens
    while left > 0:
        n = min(plan.pop(0) if len(plan) > 1 else plan[0], left)
        calls.append(n)
        left -= n
    return calls


def _prefill(device, tokens: int, chunks: tuple[int, ...] = ()) -> float:
    """One lane's prompt of `tokens` tokens in the calls `prefill_calls` plans; tokens / seconds."""
    from calculet.runtime.jobs import PrefillJob

    vocab = device.program.manifest.spec.vocab_size
    ids = [(7 * i) % (vocab - 10) + 10 for i in range(tokens)]
    calls = prefill_calls(tokens, chunks, max(device.program.manifest.profile.prefill_chunks))
    lane = device.lanes.allocate()
    try:
        t0 = time.perf_counter()
        start = 0
        for n in calls:
            device.run(PrefillJob(lane, tuple(ids[start:start + n]), want_logits=start + n >= tokens), 600)
            start += n
        return tokens / (time.perf_counter() - t0)
    finally:
        device.lanes.free(lane)


def _decode(device, streams: int, steps: int, warmup: int) -> float:
    from calculet.runtime.jobs import DecodeJob, PrefillJob

    lanes = [device.lanes.allocate() for _ in range(streams)]
    try:
        for i, lane in enumerate(lanes):
            device.run(PrefillJob(lane, tuple(range(10 + i, 26 + i)), want_logits=False), 600)
        tokens = tuple(5 + i for i in range(streams))
        for _ in range(warmup):
            device.run(DecodeJob(tuple(lanes), tokens, full_logits=False), 600)
        t0 = time.perf_counter()
        for _ in range(steps):
            device.run(DecodeJob(tuple(lanes), tokens, full_logits=False), 600)
        return streams * steps / (time.perf_counter() - t0)
    finally:
        for lane in lanes:
            device.lanes.free(lane)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("calbin", type=Path, help="a calbin every provider can run (a portable one for openvino)")
    p.add_argument("--providers", default="cpu,openvino", help="comma-separated; the first is the ratios' base")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: every core)")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--chunks", default="", help="the prefill calls' token counts, e.g. 128,64,8 (the last one "
                                                  "repeats; default: the largest compiled chunk)")
    p.add_argument("--streams", default="1,8")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--out", type=Path, default=None, help="also write the table to this markdown file")
    args = p.parse_args(argv)
    providers = [s.strip() for s in args.providers.split(",") if s.strip()]
    streams = [int(s) for s in args.streams.split(",")]
    chunks = tuple(int(c) for c in args.chunks.split(",") if c.strip())
    for spec in providers:
        _options(spec, None)   # a bad @PRECISION stops here, before any load
    results: dict[tuple[str, str], list[float]] = {}

    def add(provider: str, metric: str, value: float) -> None:
        results.setdefault((metric, provider), []).append(value)

    with tempfile.TemporaryDirectory(prefix="calculet-providers-") as tmp:
        for r in range(args.rounds):
            for provider in providers:
                cache = os.path.join(tmp, f"{provider}-{r}")
                os.makedirs(cache)
                device, cold = _open(args.calbin, provider, cache, args.threads)
                device.close()
                device, warm = _open(args.calbin, provider, cache, args.threads)
                try:
                    add(provider, "load s", cold)
                    add(provider, "cached load s", warm)
                    _prefill(device, args.prompt_tokens, chunks)   # first run of each graph: not timed
                    add(provider, f"prefill tok/s ({args.prompt_tokens} tokens)", _prefill(device, args.prompt_tokens, chunks))
                    for n in streams:
                        add(provider, f"decode tok/s ({n} stream{'s' if n > 1 else ''})", _decode(device, n, args.steps, args.warmup))
                finally:
                    device.close()
                print(f"round {r + 1}/{args.rounds} {provider}: "
                      + ", ".join(f"{m} {v[-1]:.2f}" for (m, pr), v in results.items() if pr == provider), file=sys.stderr)

    import onnxruntime as ort

    base = providers[0]
    rows = [f"| metric | provider | median | worst round | vs {base}: median (worst round) |", "|---|---|---:|---:|---:|"]
    for metric in dict.fromkeys(m for m, _ in results):
        lower_better = metric.endswith(" s")
        for provider in providers:
            v = results[(metric, provider)]
            worst = max(v) if lower_better else min(v)
            ratio = [a / b for a, b in zip(v, results[(metric, base)])]
            worst_ratio = max(ratio) if lower_better else min(ratio)
            rows.append(f"| {metric} | {provider} | {statistics.median(v):.2f} | {worst:.2f} | "
                        f"{statistics.median(ratio):.2f}x ({worst_ratio:.2f}x) |")
    m = _open_manifest(args.calbin)
    head = (f"calbin {args.calbin.name} (target {m.target}, weights {m.quantization.policy if m.quantization else '?'}, "
            f"lanes {m.profile.lanes}, context {m.profile.context}); onnxruntime {ort.__version__} "
            f"{ort.get_available_providers()}; CPU {cpu_line()}; {args.rounds} rounds alternating providers; "
            f"prefill calls: {args.chunks or 'the largest chunk'}; "
            f"times: lower is better, tok/s: higher is better (worst round = least favourable)")
    table = "\n".join([head, "", *rows])
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0


def _open_manifest(path: Path):
    from calculet.calbin.manifest import read_manifest

    return read_manifest(path)


if __name__ == "__main__":
    raise SystemExit(main())
