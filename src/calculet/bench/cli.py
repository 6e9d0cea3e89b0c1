"""`calculet bench run | report | compare | soak | scenario | ttft-plot`: measure any OpenAI-compatible server
from the client side (soak: our own server, started as a child process, under mixed traffic for a duration;
scenario: TTFT against prompt length or chat turn, plotted side by side by ttft-plot)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from calculet.bench.config import APIS, DEFAULT_REQUESTS, LOAD_MODES, SETTINGS, Limits, Load, Target, Workload

_RUN_HELP = """Load an OpenAI-compatible server and record every request (RUN/records.jsonl).
Lists (comma-separated) sweep: --concurrency 1,8 or --rate 1,2,4; --prompt-tokens 256,1024 or auto."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", help="benchmark an OpenAI-compatible server",
                                  description=__doc__.splitlines()[0])
    sub = bench.add_subparsers(dest="bench_command", metavar="{run,report,compare,soak,scenario,ttft-plot}")
    bench.set_defaults(func=lambda args: (bench.print_help(), 2)[1])

    run = sub.add_parser("run", help="run a load test", description=_RUN_HELP)
    run.add_argument("--scenario", type=Path, help="JSON or TOML file of these settings (flags override it)")
    target = run.add_argument_group("target")
    target.add_argument("--url", help="server base URL, e.g. http://127.0.0.1:8080 (with or without /v1)")
    target.add_argument("--model", help="model name to send (as the server lists it)")
    target.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    target.add_argument("--api", choices=APIS, help=f"endpoint (default: {Target.api})")
    target.add_argument("--timeout", type=float, help=f"seconds per request (default: {Target.timeout_s:g})")
    load = run.add_argument_group("load")
    load.add_argument("--load", choices=LOAD_MODES,
                      help="closed loop, or open-loop arrivals (default: closed, or poisson with --rate)")
    load.add_argument("--concurrency", help="closed loop: concurrent clients (list sweeps; default 1)")
    load.add_argument("--rate", help="open loop: requests/s (list sweeps)")
    load.add_argument("--burstiness", type=float, help=f"gamma shape: 1 Poisson, <1 burstier (default {Load.burstiness:g})")
    load.add_argument("--max-concurrency", type=int, help="open loop: cap on requests in flight")
    work = run.add_argument_group("workload")
    work.add_argument("--prompt-tokens", help="prompt lengths in tokens, or 'auto' (1,16,256,1K,2K,4K… "
                      f"up to the context) (default: {','.join(map(str, Workload.prompt_tokens))})")
    work.add_argument("--output-tokens", type=int, help=f"output tokens per request (default: {Workload.output_tokens})")
    work.add_argument("--no-fixed-output", dest="fixed_output", action="store_const", const=False,
                      help="do not send ignore_eos/min_tokens")
    work.add_argument("--prompts", type=Path, help="JSONL of prompts ({'prompt': …} or {'messages': …}) "
                      "instead of buckets; a run's prompts.jsonl replays its prompts")
    work.add_argument("--tokenizer", type=Path, help="tokenizer.json to count tokens (default: server's /tokenize)")
    work.add_argument("--max-context", type=int, help="context length, when the server does not report it")
    bound = run.add_argument_group("bounds and output")
    bound.add_argument("--requests", type=int, help=f"requests per phase (default: {DEFAULT_REQUESTS}, or the prompts file)")
    bound.add_argument("--duration", type=float, help="seconds per phase before sending stops")
    bound.add_argument("--warmup", type=int, help=f"warm-up requests, not counted (default: {Limits.warmup})")
    bound.add_argument("--seed", type=int, help="seed for prompts and arrivals (default: 0)")
    bound.add_argument("--slo", help="goodput limits, e.g. ttft=500ms,tpot=50ms,e2e=10s")
    bound.add_argument("--out", type=Path, help="run directory (default: calculet-bench/<time>)")
    bound.add_argument("--label", help="name of this server in reports (default: its URL)")
    bound.add_argument("--no-progress", dest="progress", action="store_const", const=False,
                       help="no progress bar")
    bound.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    run.set_defaults(func=_run)

    report = sub.add_parser("report", help="write report.md, summary.json and plots for a run")
    report.add_argument("run", type=Path, help="run directory or its records.jsonl")
    report.add_argument("--out", type=Path, help="folder for the report (default: the run directory)")
    report.add_argument("--slo", help="goodput limits (default: the run's own)")
    report.set_defaults(func=_report)

    soak = sub.add_parser("soak", help="start `calculet serve` and run mixed traffic for a duration, watching for "
                          "leaks (RSS, fds, threads, lanes) and unexpected errors")
    soak.add_argument("model", nargs="?", default=None, metavar="CALBIN|SOURCE", help="what to serve (default: the default model)")
    soak.add_argument("--duration", type=float, default=3600.0, help="seconds of traffic (default 3600)")
    soak.add_argument("--workers", type=int, default=6, help="concurrent clients (default 6)")
    soak.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples (default 5)")
    soak.add_argument("--burst-every", type=float, default=30.0, help="seconds between overload bursts (default 30)")
    soak.add_argument("--warmup", type=float, default=60.0, help="seconds before the RSS slope counts (default 60)")
    soak.add_argument("--max-rss-slope", type=float, default=5.0, help="MB per hour of RSS growth allowed (default 5)")
    soak.add_argument("--out", type=Path, default=None, help="run directory (default: calculet-soak/<time>)")
    soak.set_defaults(func=_soak)

    compare = sub.add_parser("compare", help="two runs side by side with B/A ratios")
    compare.add_argument("a", type=Path, help="baseline run (directory or records.jsonl)")
    compare.add_argument("b", type=Path, help="run to compare with it")
    compare.add_argument("--slo", help="goodput limits applied to both runs")
    compare.add_argument("--out", type=Path, help="also write the table to this Markdown file")
    compare.set_defaults(func=_compare)

    from calculet.bench.scenarios import SCENARIOS, ScenarioConfig

    sc = sub.add_parser("scenario", help="TTFT against prompt length (long-prompt) or chat turn (multi-turn), one "
                        "request at a time")
    sc.add_argument("name", choices=SCENARIOS)
    sc.add_argument("--url", required=True, help="server base URL (with or without /v1)")
    sc.add_argument("--model", required=True, help="model name to send")
    sc.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    sc.add_argument("--label", help="name of this server in tables and plots (default: its URL)")
    sc.add_argument("--out", type=Path, help="run directory (default: calculet-bench/<scenario>-<time>)")
    sc.add_argument("--output-tokens", type=int, default=ScenarioConfig.output_tokens,
                    help="tokens out per request (default %(default)s)")
    sc.add_argument("--seed", type=int, default=0)
    sc.add_argument("--timeout", type=float, default=ScenarioConfig.timeout_s, help="seconds per request")
    sc.add_argument("--buckets", help="long-prompt: prompt lengths, comma-separated (default: 128, 256, … below the "
                    "context, plus one near it)")
    sc.add_argument("--repeats", type=int, default=ScenarioConfig.repeats, help="long-prompt: prompts per bucket")
    sc.add_argument("--max-context", type=int, help="long-prompt: the context, when the server does not say")
    sc.add_argument("--tokenizer", type=Path, help="long-prompt: tokenizer.json (default: the server's /tokenize)")
    sc.add_argument("--turns", type=int, default=ScenarioConfig.turns, help="multi-turn: turns per conversation")
    sc.add_argument("--words", type=int, default=ScenarioConfig.words, help="multi-turn: new words per turn")
    sc.add_argument("--conversations", type=int, default=ScenarioConfig.conversations,
                    help="multi-turn: conversations, one after another")
    sc.set_defaults(func=_scenario)

    tp = sub.add_parser("ttft-plot", help="runs of one scenario side by side: a TTFT plot and a Markdown table")
    tp.add_argument("runs", type=Path, nargs="+", help="scenario run directories")
    tp.add_argument("--out", type=Path, default=Path("ttft.png"), help="PNG to write (default %(default)s)")
    tp.set_defaults(func=_ttft_plot)


def run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Scenario-file values overridden by the flags that were given."""
    from calculet.bench.config import read_scenario_file

    settings = read_scenario_file(args.scenario) if args.scenario else {}
    for key in SETTINGS:
        value = getattr(args, key, None)
        if value is not None:
            settings[key] = str(value) if isinstance(value, Path) else value
    return settings


def _run(args: argparse.Namespace) -> int:
    from calculet.bench.config import build_config
    from calculet.bench.metrics import summarize
    from calculet.bench.records import read_records
    from calculet.bench.report import summary_table, write_report
    from calculet.bench.runner import run_benchmark

    config = build_config(run_settings(args))
    records = run_benchmark(config)
    print("\n".join(summary_table(summarize(read_records(records), config.slo))))
    if not args.no_report:
        print(f"report: {write_report(records.parent)}")
    print(f"records: {records}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from calculet.bench.report import write_report
    from calculet.bench.slo import parse_slo

    print(write_report(args.run, args.out, parse_slo(args.slo) if args.slo else None))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from calculet.bench.compare import compare_runs
    from calculet.bench.slo import parse_slo

    text = compare_runs(args.a, args.b, parse_slo(args.slo))
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


def _scenario(args: argparse.Namespace) -> int:
    import time

    from calculet.bench.scenarios import ScenarioConfig, run_scenario

    buckets = tuple(int(b) for b in args.buckets.split(",")) if args.buckets else None
    out = args.out or Path("calculet-bench") / f"{args.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    config = ScenarioConfig(args.name, args.url, args.model, out, label=args.label, api_key=args.api_key,
                            timeout_s=args.timeout, seed=args.seed, output_tokens=args.output_tokens, buckets=buckets,
                            repeats=args.repeats, max_context=args.max_context, tokenizer=args.tokenizer,
                            turns=args.turns, words=args.words, conversations=args.conversations)
    print(f"records: {run_scenario(config)}")
    return 0


def _ttft_plot(args: argparse.Namespace) -> int:
    from calculet.bench.scenarios import plot_ttft, read_series, ttft_table

    print(ttft_table([read_series(r) for r in args.runs]))
    print(f"plot: {plot_ttft(args.runs, args.out)}")
    return 0


def _soak(args: argparse.Namespace) -> int:
    import json
    import time

    from calculet.bench.soak import SoakConfig, run_soak

    config = SoakConfig(model=args.model, duration_s=args.duration, workers=args.workers, sample_every_s=args.sample_every,
                        burst_every_s=args.burst_every, warmup_s=args.warmup, max_rss_slope_mb_per_h=args.max_rss_slope)
    out = args.out or Path("calculet-soak") / time.strftime("%Y%m%d-%H%M%S")
    summary = run_soak(config, out)
    print(json.dumps({k: summary[k] for k in ("passed", "checks", "rss_slope_mb_per_h", "unexpected")}, indent=2))
    print(f"samples: {out / 'samples.jsonl'}  summary: {out / 'summary.json'}")
    return 0 if summary["passed"] else 1
