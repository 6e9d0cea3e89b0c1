"""Rounds summary: per scenario and metric, each server's median and worst round and the B/A ratio's.

A = llama.cpp, B = calculet. The worst round is the lowest value of a higher-is-better metric
(throughput, goodput) and the highest of a lower-is-better one (latency); for the ratio B/A the
worst is the round least favourable to calculet. One server alone (--llama-only, --calculet-only)
gives its own columns only.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    scenario: str                  # e.g. "streams closed-c8/p200/o128"
    metric: str
    higher_is_better: bool
    a: tuple[float | None, ...]    # per round (None: not measured or not defined)
    b: tuple[float | None, ...]

    @property
    def ratios(self) -> tuple[float | None, ...]:
        return tuple(None if x is None or y is None or not x else y / x for x, y in zip(self.a, self.b))


def median_and_worst(values, higher_is_better: bool) -> tuple[float | None, float | None]:
    got = [v for v in values if v is not None and not math.isnan(v)]
    if not got:
        return None, None
    return statistics.median(got), (min(got) if higher_is_better else max(got))


def collect(per_round: list[dict], metrics_of: dict) -> list[Row]:
    """per_round: one dict per round, {(scenario label, sub-scenario): (summary A | None, summary B | None)};
    metrics_of: scenario label -> its Metric tuple. Rows keep the first-seen order."""
    keys = []
    for r in per_round:
        keys += [k for k in r if k not in keys]
    rows = []
    for label, sub in keys:
        for m in metrics_of[label]:
            a, b = [], []
            for r in per_round:
                sa, sb = r.get((label, sub), (None, None))
                a.append(None if sa is None else m.read(sa))
                b.append(None if sb is None else m.read(sb))
            rows.append(Row(f"{label} {sub}", m.name, m.higher_is_better, tuple(a), tuple(b)))
    return rows


def _fmt(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def _ratio(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def rounds_markdown(rows: list[Row], cpu: dict | None, rounds: int) -> str:
    both = any(v is not None for r in rows for v in r.a) and any(v is not None for r in rows for v in r.b)
    cpu_line = (f"CPU: {cpu.get('model') or 'unknown model'} ({cpu.get('machine')}): "
                f"{' '.join(cpu.get('flags', [])) or 'none of the tracked features'} ({cpu.get('source')})"
                if cpu else "CPU: not recorded")
    lines = [f"# vs llama.cpp: {rounds} alternating round(s), median and worst round", "", cpu_line, "",
             "A = llama.cpp, B = calculet. Worst = the round least favourable to that column "
             "(lowest throughput, highest latency; for B/A, least favourable to calculet).", ""]
    head = "| scenario | metric | A median | A worst | B median | B worst |"
    if both:
        head += " B/A median | B/A worst | B/A per round |"
    lines += [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        am, aw = median_and_worst(r.a, r.higher_is_better)
        bm, bw = median_and_worst(r.b, r.higher_is_better)
        line = f"| {r.scenario} | {r.metric} {'↑' if r.higher_is_better else '↓'} | {_fmt(am)} | {_fmt(aw)} | {_fmt(bm)} | {_fmt(bw)} |"
        if both:
            rm, rw = median_and_worst(r.ratios, r.higher_is_better)
            line += f" **{_ratio(rm)}** | {_ratio(rw)} | {' '.join(_ratio(x) for x in r.ratios)} |"
        lines.append(line)
    return "\n".join(lines)


def rounds_json(rows: list[Row], cpu: dict | None) -> str:
    out = {"cpu": cpu, "rows": []}
    for r in rows:
        am, aw = median_and_worst(r.a, r.higher_is_better)
        bm, bw = median_and_worst(r.b, r.higher_is_better)
        rm, rw = median_and_worst(r.ratios, r.higher_is_better)
        out["rows"].append({"scenario": r.scenario, "metric": r.metric, "higher_is_better": r.higher_is_better,
                            "a": list(r.a), "b": list(r.b), "ratio": list(r.ratios),
                            "a_median": am, "a_worst": aw, "b_median": bm, "b_worst": bw,
                            "ratio_median": rm, "ratio_worst": rw})
    return json.dumps(out, indent=1) + "\n"
