"""Two `calculet serve` flag sets side by side: alternating rounds, the same prompts, and the machine's
steal during every run.

    python benchmarks/serve_ab.py --a "--ort-spinning off" --b "--ort-spinning run" --rounds 8
    python benchmarks/serve_ab.py --a "--in-flight 1" --b "--in-flight 2" --concurrency 8

Both servers stay up (the idle one takes no CPU: run.py's machine figures show it). Each round runs
every concurrency on A, then the same prompts on B (the next round starts with B, so neither side
always goes first); each run is a closed loop of N clients sending --requests requests of
--prompt-tokens tokens and --output-tokens output tokens. Prints and writes (ab.md, ab.json under
--out): per concurrency and side, output tok/s, TPOT p50 and TTFT p50 per round with the CPU steal of
that run, the medians and worst rounds, and how many rounds B won. On a shared 2-core VM the steal
(the hypervisor running other guests) moves a run by more than most changes do: read the rounds
with low steal first.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "vs_llamacpp"))

from machine_load import percent, sample, since  # noqa: E402
from run import free_port, served_model, start, stop, wait_ready  # noqa: E402

from calculet.bench.config import build_config  # noqa: E402
from calculet.bench.metrics import summarize  # noqa: E402
from calculet.bench.records import read_records  # noqa: E402
from calculet.bench.runner import run_benchmark  # noqa: E402
from calculet.cpu_features import detect  # noqa: E402


def one_run(url: str, out: Path, concurrency: int, args, seed: int, prompts: Path | None) -> dict:
    config = {"url": url, "model": served_model(url), "warmup": 1, "seed": seed, "out": str(out), "label": out.name,
              "progress": False, "concurrency": [concurrency], "requests": args.requests,
              "output_tokens": args.output_tokens, "timeout": 600.0}
    if prompts is not None:
        config["prompts"] = str(prompts)
    else:
        config["prompt_tokens"] = [args.prompt_tokens]
    records = run_benchmark(build_config(config))
    s = summarize(read_records(records))[0]
    return {"tok_s": s.output_token_throughput, "tpot_p50": s.tpot.p50 if s.tpot else None,
            "ttft_p50": s.ttft.p50 if s.ttft else None, "errors": s.errors, "records": str(records)}


def table(results: list[dict], concurrency: int) -> list[str]:
    rows = [r for r in results if r["concurrency"] == concurrency]
    lines = [f"### {concurrency} stream(s)", "",
             "| round | A tok/s | A steal | B tok/s | B steal | B/A | A TPOT p50 ms | B TPOT p50 ms |", "|---|---|---|---|---|---|---|---|"]
    ratios = []
    for r in sorted({x["round"] for x in rows}):
        a = next(x for x in rows if x["round"] == r and x["side"] == "A")
        b = next(x for x in rows if x["round"] == r and x["side"] == "B")
        ratio = b["tok_s"] / a["tok_s"] if a["tok_s"] else None
        ratios.append(ratio)
        lines.append(f"| {r} | {a['tok_s']:.1f} | {percent(a['steal'])} | {b['tok_s']:.1f} | {percent(b['steal'])} | "
                     f"{ratio:.2f}x | {1e3 * a['tpot_p50']:.1f} | {1e3 * b['tpot_p50']:.1f} |")
    med = lambda side, k: statistics.median(x[k] for x in rows if x["side"] == side)  # noqa: E731
    worst = lambda side: min(x["tok_s"] for x in rows if x["side"] == side)  # noqa: E731
    steals = lambda side: [x["steal"] for x in rows if x["side"] == side and x["steal"] is not None]  # noqa: E731
    steal = lambda side: percent(statistics.median(steals(side))) if steals(side) else percent(None)  # noqa: E731
    wins = sum(1 for x in ratios if x and x > 1)
    lines += ["", f"medians: A {med('A', 'tok_s'):.1f} tok/s (worst {worst('A'):.1f}), B {med('B', 'tok_s'):.1f} "
              f"(worst {worst('B'):.1f}); B/A median {statistics.median(ratios):.2f}x; B faster in {wins} of {len(ratios)} "
              f"rounds; steal median A {steal('A')}, B {steal('B')}; TTFT p50 median "
              f"A {1e3 * med('A', 'ttft_p50'):.0f} ms, B {1e3 * med('B', 'ttft_p50'):.0f} ms", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", default="", help="flags of server A (e.g. \"--ort-spinning off\")")
    p.add_argument("--b", default="", help="flags of server B")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--concurrency", default="1,8", help="closed-loop clients, a list (default 1,8)")
    p.add_argument("--requests", type=int, default=8, help="requests per run (default 8)")
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("calculet-bench") / time.strftime("serve-ab-%Y%m%d-%H%M%S"))
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    flags = {"A": shlex.split(args.a), "B": shlex.split(args.b)}
    servers = {}
    try:
        for side, extra in flags.items():
            port, log = free_port(), args.out / f"serve-{side}.log"
            servers[side] = (start([sys.executable, "-m", "calculet", "serve", "--port", str(port), "--threads",
                                    str(args.threads), *extra], log), f"http://127.0.0.1:{port}", log)
        for process, url, log in servers.values():
            wait_ready(url, process, log, 900)
        pids = {side: process.pid for side, (process, _, _) in servers.items()}
        results = []
        for r in range(1, args.rounds + 1):
            order = ("A", "B") if r % 2 else ("B", "A")
            for c in (int(x) for x in args.concurrency.split(",")):
                prompts = None
                for side in order:
                    folder = args.out / f"round-{r}" / f"c{c}" / side
                    before = sample(pids)
                    got = one_run(servers[side][1], folder, c, args, args.seed + 1000 * r + c, prompts)
                    load = since(before, sample(pids), side)
                    prompts = folder / "prompts.jsonl"
                    results.append({"round": r, "concurrency": c, "side": side, "steal": load.steal, "busy": load.busy, **got})
                    print(f"round {r} c{c} {side}: {got['tok_s']:.1f} tok/s, {load.line()}", file=sys.stderr)
    finally:
        for process, _, _ in servers.values():
            stop(process)
    cpu = detect()
    lines = [f"# serve A/B: A = `{args.a}`, B = `{args.b}`", "", f"CPU: {cpu.label}; {args.threads} threads; "
             f"{args.rounds} alternating rounds; {args.requests} requests per run, {args.prompt_tokens}-token prompts, "
             f"{args.output_tokens} output tokens", ""]
    for c in (int(x) for x in args.concurrency.split(",")):
        lines += table(results, c)
    text = "\n".join(lines)
    (args.out / "ab.md").write_text(text + "\n", encoding="utf-8")
    (args.out / "ab.json").write_text(json.dumps({"cpu": cpu.to_json(), "a": args.a, "b": args.b, "runs": results},
                                                 indent=1) + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
