"""`calculet bench compare A B`: two runs side by side, scenario by scenario, with B/A ratios.

Both runs are summarised from their records with the same SLO. Scenarios are paired by name (runs
made from one scenario file, or the second given the first's prompts.jsonl, share names); when no
name is shared, they are paired in order and the table says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from calculet.bench.metrics import Distribution, ScenarioSummary, summarize
from calculet.bench.records import read_records, read_run_info, run_dir
from calculet.bench.slo import Slo


@dataclass(frozen=True)
class Row:
    name: str
    unit_ms: bool                 # shown in milliseconds (else plain, or as an integer for counts)
    better: str                   # "higher" or "lower"
    pick: Callable[[ScenarioSummary], float | None]


def _q(attr: str, q: str) -> Callable[[ScenarioSummary], float | None]:
    def pick(s: ScenarioSummary) -> float | None:
        d: Distribution | None = getattr(s, attr)
        return None if d is None else getattr(d, q)
    return pick


ROWS = (
    Row("successful requests", False, "higher", lambda s: float(s.ok)),
    Row("failed requests", False, "lower", lambda s: float(s.requests - s.ok)),
    Row("request throughput (req/s)", False, "higher", lambda s: s.request_throughput),
    Row("output throughput (tok/s)", False, "higher", lambda s: s.output_token_throughput),
    Row("total throughput (tok/s)", False, "higher", lambda s: s.total_token_throughput),
    Row("goodput (req/s)", False, "higher", lambda s: s.goodput),
    Row("mean output tokens", False, "higher", lambda s: s.mean_output_tokens),
    Row("TTFT mean (ms)", True, "lower", _q("ttft", "mean")),
    Row("TTFT P50 (ms)", True, "lower", _q("ttft", "p50")),
    Row("TTFT P99 (ms)", True, "lower", _q("ttft", "p99")),
    Row("TPOT mean (ms)", True, "lower", _q("tpot", "mean")),
    Row("TPOT P50 (ms)", True, "lower", _q("tpot", "p50")),
    Row("TPOT P99 (ms)", True, "lower", _q("tpot", "p99")),
    Row("ITL P50 (ms)", True, "lower", _q("itl", "p50")),
    Row("ITL P99 (ms)", True, "lower", _q("itl", "p99")),
    Row("E2E P50 (ms)", True, "lower", _q("e2e", "p50")),
    Row("E2E P99 (ms)", True, "lower", _q("e2e", "p99")),
)


def _fmt(value: float | None, ms: bool) -> str:
    if value is None:
        return "–"
    if ms:
        return f"{value * 1e3:.1f}"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return b / a


def pair_scenarios(a: list[ScenarioSummary], b: list[ScenarioSummary]) -> tuple[list[tuple[ScenarioSummary, ScenarioSummary]], bool]:
    """Pairs by scenario name; in order when no name is shared. Returns (pairs, paired_by_name)."""
    by_name = {s.scenario: s for s in b}
    pairs = [(s, by_name[s.scenario]) for s in a if s.scenario in by_name]
    if pairs:
        return pairs, True
    return list(zip(a, b)), False


def compare_runs(run_a: Path, run_b: Path, slo: Slo | None = None) -> str:
    """The comparison as Markdown text."""
    label_a = read_run_info(run_a).get("label") or run_dir(run_a).name
    label_b = read_run_info(run_b).get("label") or run_dir(run_b).name
    if label_a == label_b:
        label_a, label_b = f"A: {label_a}", f"B: {label_b}"
    a, b = summarize(read_records(run_a), slo), summarize(read_records(run_b), slo)
    pairs, by_name = pair_scenarios(a, b)
    if not pairs:
        raise ValueError(f"nothing to compare: {run_a} has {len(a)} scenarios, {run_b} has {len(b)}")
    lines = [f"# {label_b} vs {label_a}", "",
             f"Ratio = B / A (B = {label_b}, A = {label_a}). SLO: {(slo or Slo()).describe()}.", ""]
    if not by_name:
        lines += ["Scenario names differ between the runs; they are paired in order.", ""]
    unpaired = [s.scenario for s in a if s.scenario not in {x.scenario for x, _ in pairs}]
    if unpaired:
        lines += [f"Only in A: {', '.join(unpaired)}.", ""]
    for sa, sb in pairs:
        title = sa.scenario if sa.scenario == sb.scenario else f"{sa.scenario} ↔ {sb.scenario}"
        lines += [f"## {title}", "", f"| metric | {label_a} | {label_b} | B/A | better |", "|---|---|---|---|---|"]
        for row in ROWS:
            va, vb = row.pick(sa), row.pick(sb)
            if va is None and vb is None:
                continue
            r = ratio(va, vb)
            lines.append(f"| {row.name} | {_fmt(va, row.unit_ms)} | {_fmt(vb, row.unit_ms)} "
                         f"| {'–' if r is None else f'{r:.2f}×'} | {row.better} |")
        if sa.errors or sb.errors:
            lines.append(f"| errors | {sa.errors or 0} | {sb.errors or 0} | | |")
        lines.append("")
    return "\n".join(lines)
