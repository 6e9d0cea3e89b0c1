"""One chip against two: the same model compiled for 1 chip, 2-chip TP and 2-chip PP, decode speed at
1 and 8 streams and the share of each step spent in collectives.

    python benchmarks/chips.py                                   # the default model (Gemma 3 270M), default policy
    python benchmarks/chips.py --tiny llama --steps 4            # smoke: a tiny random model (reference extra)
    python benchmarks/chips.py --out chips.md                    # keep the table

Each calbin is compiled once into --workdir (reused when present). A 1-chip calbin runs on one chip
with every core; a 2-chip calbin on two chips sharing the cores (runtime/chips.chip_configs: on 2
cores, one intra-op thread each). Per variant and stream count: n lanes prefilled with a short
prompt, then --steps decode steps over the n lanes after --warmup untimed ones, rounds interleaved
across variants. tokens/s = n x steps / seconds. Collective share = the host time
`runtime.collectives.Collectives` measured during the timed steps / their wall time; bytes per step
are what it counted (the same as `calculet plan --partition` predicts).

Record the machine with the numbers: nproc, and the CPU features
(grep -o -w 'avx2\\|avx512f\\|avx512_vnni\\|avx_vnni\\|amx_int8' /proc/cpuinfo | sort -u).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

VARIANTS = (("1 chip", 1, ""), ("2-chip TP", 2, "tp"), ("2-chip PP", 2, "pp"))


def _source(args) -> str | None:
    if not args.tiny:
        return None
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny_models import make_tiny_model

    folder = Path(args.workdir) / f"hf-{args.tiny}"
    if not (folder / "config.json").exists():
        make_tiny_model(args.tiny, folder)
    return str(folder)


def _calbins(args) -> dict[str, Path]:
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions

    source, out = _source(args), {}
    for name, chips, partition in VARIANTS:
        path = Path(args.workdir) / f"{args.tiny or 'default'}-{args.weights}-{chips}{partition}.calbin"
        if not (path / "manifest.json").exists():
            options = CompileOptions(lanes=args.lanes, context=args.context, weights=args.weights, golden=False,
                                     prefill_chunks=(16,), chips=chips, partition=partition)
            compile_calbin(source, path, options, log=lambda m: print(m, file=sys.stderr))
        out[name] = path
    return out


def _device(path: Path, chips: int):
    from calculet.runtime.chips import chip_configs, open_device

    return open_device(path, chip_configs(chips, cores=os.cpu_count()))


def _round(device, streams: int, steps: int, warmup: int) -> tuple[float, float, int]:
    """(seconds, collective seconds, collective bytes per step) for `steps` decode steps over `streams` lanes."""
    from calculet.runtime.jobs import DecodeJob, PrefillJob

    lanes = [device.lanes.allocate() for _ in range(streams)]
    try:
        for i, lane in enumerate(lanes):
            device.run(PrefillJob(lane, tuple(range(10 + i, 26 + i)), want_logits=False), 600)
        tokens = tuple(5 + i for i in range(streams))
        for _ in range(warmup):
            device.run(DecodeJob(tuple(lanes), tokens, full_logits=False), 600)
        coll = device.collectives
        before = coll.total if coll is not None else None
        t0 = time.perf_counter()
        for _ in range(steps):
            device.run(DecodeJob(tuple(lanes), tokens, full_logits=False), 600)
        seconds = time.perf_counter() - t0
        if coll is None:
            return seconds, 0.0, 0
        return seconds, coll.total.seconds - before.seconds, coll.last_step.bytes
    finally:
        for lane in lanes:
            device.lanes.free(lane)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", default=None, help="a tiny random architecture (llama, qwen3, gemma3) instead of the default model")
    p.add_argument("--weights", default="default", help="compile's weight policy (default: default)")
    p.add_argument("--lanes", type=int, default=8)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--streams", default="1,8", help="concurrent streams (lanes decoding together), comma-separated")
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per round")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="rounds per variant, interleaved; the best is kept")
    p.add_argument("--workdir", default=str(Path.home() / ".cache" / "calculet-bench-chips"))
    p.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = p.parse_args(argv)
    streams = [int(s) for s in args.streams.split(",")]
    if max(streams) > args.lanes:
        p.error(f"--streams {max(streams)} exceeds --lanes {args.lanes}")
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    calbins = _calbins(args)
    devices = {name: _device(calbins[name], chips) for name, chips, _ in VARIANTS}
    best: dict[tuple[str, int], tuple[float, float, int]] = {}
    try:
        for _ in range(args.rounds):
            for n in streams:
                for name in devices:
                    r = _round(devices[name], n, args.steps, args.warmup)
                    if (name, n) not in best or r[0] < best[(name, n)][0]:
                        best[(name, n)] = r
    finally:
        for d in devices.values():
            d.close()
    rows = ["| variant | streams | tokens/s | collective share | bytes between chips per step |",
            "|---|---:|---:|---:|---:|"]
    for name, _, _ in VARIANTS:
        for n in streams:
            seconds, coll, nbytes = best[(name, n)]
            rows.append(f"| {name} | {n} | {n * args.steps / seconds:.1f} | {coll / seconds:.1%} | {nbytes:,} |")
    table = "\n".join([f"model {args.tiny or 'default (Gemma 3 270M)'}, --weights {args.weights}, lanes {args.lanes}, "
                       f"context {args.context}, {os.cpu_count()} cores; best of {args.rounds} rounds of "
                       f"{args.steps} steps", "", *rows])
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
