"""`calculet bench report RUN`: a Markdown report, a machine-readable summary and PNG plots.

Writes into the run directory (or `--out`):
    report.md      run facts, notes, the summary table, latency detail, errors, plot links
    summary.json   every figure of the summary (`metrics.ScenarioSummary`, seconds)
    plots/latency_cdfs.png, plots/throughput_vs_load.png, plots/ttft_vs_prompt_length.png
Every figure comes from `records.jsonl` through `metrics.summarize`.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from calculet.bench.metrics import Distribution, ScenarioSummary, server_timings, summarize
from calculet.bench.plots import write_plots
from calculet.bench.records import RequestRecord, read_records, read_run_info, run_dir
from calculet.bench.slo import Slo


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1e3:.1f}"


def _pair(d: Distribution | None) -> str:
    return "–" if d is None else f"{_ms(d.p50)} / {_ms(d.p99)}"


def _num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def summary_table(summaries: list[ScenarioSummary]) -> list[str]:
    lines = [
        "| scenario | ok / sent | errors | req/s | output tok/s | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) "
        "| ITL p50 / p99 (ms) | E2E p50 / p99 (ms) | goodput (req/s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        errors = ", ".join(f"{k} {v}" for k, v in s.errors.items()) or "0"
        goodput = "–" if s.goodput is None else f"{s.goodput:.2f} ({s.good}/{s.requests})"
        lines.append(
            f"| {s.scenario} | {s.ok} / {s.requests} | {errors} | {s.request_throughput:.2f} "
            f"| {s.output_token_throughput:.1f} | {_pair(s.ttft)} | {_pair(s.tpot)} | {_pair(s.itl)} "
            f"| {_pair(s.e2e)} | {goodput} |"
        )
    return lines


def _detail(s: ScenarioSummary) -> list[str]:
    lines = [f"### {s.scenario}", "",
             f"Window {s.window_s:.2f} s; mean prompt tokens (server) {_num(s.mean_prompt_tokens, 1)}; "
             f"mean output tokens {_num(s.mean_output_tokens, 1)} (from `usage` for "
             f"{s.output_tokens_from_usage} of {s.ok} requests, else counted from chunks); "
             f"total tok/s {s.total_token_throughput:.1f}.", "",
             "| metric (ms) | n | mean | std | P50 | P90 | P95 | P99 | max |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, d in (("TTFT", s.ttft), ("TPOT", s.tpot), ("ITL", s.itl), ("E2E", s.e2e)):
        if d is None:
            lines.append(f"| {name} | 0 | – | – | – | – | – | – | – |")
        else:
            lines.append(f"| {name} | {d.count} | {_ms(d.mean)} | {_ms(d.std)} | {_ms(d.p50)} | {_ms(d.p90)} "
                         f"| {_ms(d.p95)} | {_ms(d.p99)} | {_ms(d.max)} |")
    return lines + [""]


def fixed_output_notes(summaries: list[ScenarioSummary], records: list[RequestRecord]) -> list[str]:
    notes = []
    for s in summaries:
        if s.early_stops:
            notes.append(f"{s.scenario}: {s.early_stops} of {s.ok} successful requests ended before max_tokens "
                         "although ignore_eos and min_tokens were sent: the server did not honour them, so "
                         "output lengths vary")
    if any(r.fixed_output is False for r in records if not r.warmup):
        notes.append("fixed output length was not requested (--no-fixed-output): output lengths are the model's")
    return notes


def _server_timing_lines(records: list[RequestRecord]) -> list[str]:
    timings = server_timings(records)
    if not timings:
        return []
    lines = ["## The server's own timings", "",
             "As the server reported them per request (its units), beside the client's figures above.", "",
             "| scenario | field | n | mean | P50 | P99 |", "|---|---|---|---|---|---|"]
    for scenario, named in timings.items():
        for name, d in named.items():
            lines.append(f"| {scenario} | {name} | {d.count} | {d.mean:.4g} | {d.p50:.4g} | {d.p99:.4g} |")
    return lines + [""]


def _run_facts(info: dict[str, Any]) -> list[str]:
    if not info:
        return ["(no run.json beside the records)"]
    config, server = info.get("config", {}), info.get("server", {})
    target, workload, limits = config.get("target", {}), config.get("workload", {}), config.get("limits", {})
    loads = ", ".join(
        f"{l['mode']} c={l['concurrency']}" if l["mode"] == "closed"
        else f"{l['mode']} rate={l['rate']}/s b={l['burstiness']} cap={l['concurrency']}"
        for l in config.get("loads", [])
    )
    return [
        f"- run `{info.get('run_id')}` at {info.get('created')}; server `{target.get('url')}`, "
        f"model `{target.get('model')}`, API `{target.get('api')}`",
        f"- load: {loads}; requests per phase {limits.get('requests') or 'all'}, duration cap "
        f"{limits.get('duration_s') or 'none'} s, warm-up {limits.get('warmup')}",
        f"- workload: prompt buckets {workload.get('prompt_tokens') if not workload.get('prompts_file') else '–'}"
        f", prompts file {workload.get('prompts_file') or '–'}, output tokens {workload.get('output_tokens')}, "
        f"fixed output {workload.get('fixed_output')}",
        f"- tokens counted with {info.get('tokenizer') or 'the prompts file'}; context "
        f"{server.get('context') or 'unknown'} ({server.get('context_source') or 'not reported'})",
        f"- client CPU: {_cpu_line(info.get('client_cpu'))}",
    ]


def _cpu_line(cpu: dict | None) -> str:
    """`AMD EPYC (x86_64): avx2 fma f16c avx512f avx512_vnni (/proc/cpuinfo)`, or why it is unknown."""
    if not cpu:
        return "not recorded (a run from before CPU features were recorded)"
    name = f"{cpu.get('model') or 'unknown model'} ({cpu.get('machine') or '?'})"
    return f"{name}: {' '.join(cpu.get('flags', [])) or 'none of the tracked features'} ({cpu.get('source')})"


def write_report(run: Path, out: Path | None = None, slo: Slo | None = None) -> Path:
    """Write report.md, summary.json and plots for a run; return the report's path."""
    records = read_records(run)
    info = read_run_info(run)
    if slo is None:
        slo_text = info.get("config", {}).get("slo") or {}
        slo = Slo(**slo_text) if slo_text else Slo()
    out = Path(out) if out else run_dir(run)
    out.mkdir(parents=True, exist_ok=True)
    summaries = summarize(records, slo)
    if not summaries:
        raise ValueError(f"{run} holds no measured requests (only warm-up)")
    (out / "summary.json").write_text(
        json.dumps({"run_id": info.get("run_id"), "label": info.get("label"), "client_cpu": info.get("client_cpu"),
                    "scenarios": [asdict(s) for s in summaries]}, indent=2) + "\n",
        encoding="utf-8")
    plots = write_plots(records, summaries, out / "plots")
    notes = list(info.get("notes", [])) + fixed_output_notes(summaries, records)
    lines = [f"# Benchmark report: {info.get('label') or run_dir(run).name}", "", *_run_facts(info), ""]
    if notes:
        lines += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    lines += ["## Summary", "",
              f"Latencies are measured by the client from the moment a request is sent. "
              f"SLO: {slo.describe()}. Warm-up requests are excluded; failed requests are counted.", "",
              *summary_table(summaries), "", "## Latency detail", ""]
    for s in summaries:
        lines += _detail(s)
    lines += _server_timing_lines(records)
    failed = [(s.scenario, kind, count, s.error_examples.get(kind, ""))
              for s in summaries for kind, count in s.errors.items()]
    if failed:
        lines += ["## Errors", "", "| scenario | type | count | example |", "|---|---|---|---|"]
        lines += [f"| {sc} | {kind} | {n} | {ex.replace('|', '/').replace(chr(10), ' ')[:120]} |"
                  for sc, kind, n, ex in failed]
        lines.append("")
    lines += ["## Plots", ""] + [f"![{p.stem}]({p.relative_to(out).as_posix()})" for p in plots] + [""]
    report = out / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return report

