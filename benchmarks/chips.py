"""One chip against two: the same model compiled for 1 chip, 2-chip TP and 2-chip PP (a mixture-of-experts
model: 2-chip PP and 2-chip EP, TP being for dense models), decode speed at 1 and 8 streams and the
share of each step spent in collectives.

    python benchmarks/chips.py                                   # the default model (Gemma 3 270M), default policy
    python benchmarks/chips.py --tiny llama --steps 4            # smoke: a tiny random model (reference extra)
    python benchmarks/chips.py --tiny mixtral --steps 4          # smoke: a tiny MoE model (1 chip, PP, EP)
    python benchmarks/chips.py --out chips.md                    # keep the table

Each calbin is compiled once into --workdir (reused when present). A 1-chip calbin runs on one chip
with every core; a 2-chip calbin on two chips sharing the cores (runtime/chips.chip_configs: on 2
cores, one intra-op thread each). Per variant and stream count: n lanes prefilled with a short
prompt, then --steps decode steps over the n lanes after --warmup untimed ones, rounds interleaved
across variants. tokens/s = n x steps / seconds. Collective share = the host time
`runtime.collectives.Collectives` measured during the timed steps / their wall time; bytes per step
are what it counted (the same as `calculet plan --partition` predicts).

--served measures the same variants through `calculet serve` instead (one server per variant, started
with `--chips 1` or `--chips 2`, all up at once and measured in turn): n concurrent /v1/completions
requests of --steps tokens each (greedy, ignore_eos); tokens/s = n x steps / wall time of the batch
(prefill and HTTP included), collective share = the growth of `calculet_collective_seconds_total`
/ that wall time, bytes per token = the growth of `calculet_collective_bytes_total` / tokens.

    python benchmarks/chips.py --served                          # the default model, served
    python benchmarks/chips.py --served --tiny llama --steps 4 --rounds 1   # smoke

Record the machine with the numbers: nproc, and the CPU features
(grep -o -w 'avx2\\|avx512f\\|avx512_vnni\\|avx_vnni\\|amx_int8' /proc/cpuinfo | sort -u).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

VARIANTS = (("1 chip", 1, ""), ("2-chip TP", 2, "tp"), ("2-chip PP", 2, "pp"))
MOE_VARIANTS = (("1 chip", 1, ""), ("2-chip PP", 2, "pp"), ("2-chip EP", 2, "ep"))
MOE_TINY = ("qwen3_moe", "mixtral", "qwen2_moe")


def _variants(args):
    return MOE_VARIANTS if args.tiny in MOE_TINY else VARIANTS


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
    for name, chips, partition in _variants(args):
        path = Path(args.workdir) / f"{args.tiny or 'default'}-{args.weights}-{chips}{partition}.calbin"
        if not (path / "manifest.json").exists():
            options = CompileOptions(lanes=args.lanes, context=args.context, weights=args.weights, golden=False,
                                     prefill_chunks=(16,), chips=chips, partition=partition)
            compile_calbin(source, path, options, log=lambda m: print(m, file=sys.stderr))
        out[name] = path
    return out


def cpu_line() -> str:
    from calculet.cpu_features import detect

    cpu = detect()
    return f"{cpu.model or cpu.machine}: {cpu.label}"


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


def _servers(calbins: dict[str, Path], workdir: Path, variants) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from serving import Server

    servers = {}
    try:
        for name, chips, _ in variants:
            log = workdir / f"serve-{chips}{name.split()[-1].lower()}.log"
            servers[name] = Server([f"m={calbins[name]}"], log, "--chips", str(chips)).wait_ready(600)
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


def _collective_totals(server) -> tuple[float, float]:
    """(seconds, bytes) the server's collectives have taken so far."""
    m = server.all_metrics()
    seconds = sum(v for k, v in m.items() if k.startswith("calculet_collective_seconds_total"))
    nbytes = sum(v for k, v in m.items() if k.startswith("calculet_collective_bytes_total"))
    return seconds, nbytes


def _served_round(server, streams: int, steps: int) -> tuple[float, float, int]:
    """(seconds, collective seconds, collective bytes per token) for `streams` concurrent requests of `steps` tokens."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> int:
        r = server.post("/v1/completions", {"model": "m", "prompt": f"Tell me a story about the number {i}.",
                                             "max_tokens": steps, "temperature": 0, "ignore_eos": True})
        r.raise_for_status()
        return r.json()["usage"]["completion_tokens"]

    coll0, bytes0 = _collective_totals(server)
    with ThreadPoolExecutor(streams) as pool:
        t0 = time.perf_counter()
        tokens = sum(pool.map(one, range(streams)))
        seconds = time.perf_counter() - t0
    coll1, bytes1 = _collective_totals(server)
    return seconds, coll1 - coll0, int((bytes1 - bytes0) / max(1, tokens))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", default=None, help="a tiny random architecture (llama, qwen3, gemma3; MoE: qwen3_moe, "
                                                      "mixtral, qwen2_moe) instead of the default model")
    p.add_argument("--weights", default="default", help="compile's weight policy (default: default)")
    p.add_argument("--lanes", type=int, default=8)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--streams", default="1,8", help="concurrent streams (lanes decoding together), comma-separated")
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per round")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5, help="rounds per variant, interleaved; median and worst reported")
    p.add_argument("--workdir", default=str(Path.home() / ".cache" / "calculet-bench-chips"))
    p.add_argument("--out", default=None, help="also write the table to this markdown file")
    p.add_argument("--served", action="store_true", help="measure through `calculet serve` (HTTP) instead of in-process")
    args = p.parse_args(argv)
    streams = [int(s) for s in args.streams.split(",")]
    if max(streams) > args.lanes:
        p.error(f"--streams {max(streams)} exceeds --lanes {args.lanes}")
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    calbins = _calbins(args)
    if args.served:
        targets = _servers(calbins, Path(args.workdir), _variants(args))
        measure, close = (lambda t, n: _served_round(t, n, args.steps)), (lambda t: t.stop())
        for server in targets.values():     # warm-up: the first requests of each server are not timed
            _served_round(server, 1, args.warmup)
    else:
        targets = {name: _device(calbins[name], chips) for name, chips, _ in _variants(args)}
        measure, close = (lambda t, n: _round(t, n, args.steps, args.warmup)), (lambda t: t.close())
    runs: dict[tuple[str, int], list[tuple[float, float, int]]] = {}
    try:
        for _ in range(args.rounds):
            for n in streams:
                for name in targets:
                    runs.setdefault((name, n), []).append(measure(targets[name], n))
    finally:
        for t in targets.values():
            close(t)
    per, first = ("token" if args.served else "step"), VARIANTS[0][0]
    rows = [f"| variant | streams | tokens/s median | worst round | vs 1 chip: median (worst round) | collective share | bytes between chips per {per} |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for name, _, _ in _variants(args):
        for n in streams:
            rate = [n * args.steps / r[0] for r in runs[(name, n)]]
            ratio = [a / (n * args.steps / b[0]) for a, b in zip(rate, runs[(first, n)])]  # same round, side by side
            share = statistics.median(r[1] / r[0] for r in runs[(name, n)])
            rows.append(f"| {name} | {n} | {statistics.median(rate):.1f} | {min(rate):.1f} | "
                        f"{statistics.median(ratio):.2f}x ({min(ratio):.2f}x) | {share:.1%} | {runs[(name, n)][-1][2]:,} |")
    table = "\n".join([f"model {args.tiny or 'default (Gemma 3 270M)'}, --weights {args.weights}, lanes {args.lanes}, "
                       f"context {args.context}, {os.cpu_count()} cores, CPU {cpu_line()}; median and worst of "
                       f"{args.rounds} interleaved rounds of {args.steps} steps"
                       + (", served over HTTP (calculet serve)" if args.served else ", in-process"), "", *rows])
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
