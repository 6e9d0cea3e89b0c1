"""Benchmark figures, computed from the request records and nothing else.

Per scenario (warm-up excluded):
- TTFT = first text chunk − sent; E2E = done − sent (successful requests);
- TPOT per request = (E2E − TTFT) / (output tokens − 1), for requests with ≥ 2 output tokens;
- ITL = every gap between consecutive text chunks, pooled over all successful requests;
- each as count, mean, population standard deviation, min, max and P50/P90/P95/P99 (linear
  interpolation between order statistics, as numpy's default `percentile`);
- the window = first scheduled send → last end over all the scenario's requests, failed ones included;
  request throughput = successful requests / window; token throughputs = their tokens / window;
- goodput = successful requests meeting every SLO limit / window;
- errors by type. A failed request is counted in `requests` and `errors`, never dropped.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

from calculet.bench.records import RequestRecord
from calculet.bench.slo import Slo


@dataclass(frozen=True)
class Distribution:
    """Summary of samples in seconds."""

    count: int
    mean: float
    std: float
    min: float
    max: float
    p50: float
    p90: float
    p95: float
    p99: float


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-th percentile (0–100) of already sorted values, interpolating linearly."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    position = (len(sorted_values) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def distribution(values: Iterable[float]) -> Distribution | None:
    data = sorted(values)
    if not data:
        return None
    mean = math.fsum(data) / len(data)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in data) / len(data))
    return Distribution(
        count=len(data), mean=mean, std=std, min=data[0], max=data[-1],
        p50=percentile(data, 50), p90=percentile(data, 90), p95=percentile(data, 95), p99=percentile(data, 99),
    )


@dataclass(frozen=True)
class ScenarioSummary:
    scenario: str
    load: str
    concurrency: int | None
    rate: float | None
    prompt_bucket: int | None
    requests: int
    ok: int
    errors: dict[str, int]
    window_s: float
    request_throughput: float          # successful requests / s
    output_token_throughput: float     # output tokens of successful requests / s
    total_token_throughput: float      # prompt + output tokens of successful requests / s
    mean_prompt_tokens: float | None   # as the server reported
    mean_output_tokens: float | None
    output_tokens_from_usage: int      # successful requests whose count came from `usage`
    early_stops: int                   # fixed-output requests that ended before max_tokens
    ttft: Distribution | None
    tpot: Distribution | None
    itl: Distribution | None
    e2e: Distribution | None
    good: int | None = None            # requests meeting the SLO (None: no SLO given)
    goodput: float | None = None       # good requests / s
    slo: str = "none"
    error_examples: dict[str, str] = field(default_factory=dict)


def summarize_scenario(records: list[RequestRecord], slo: Slo | None = None) -> ScenarioSummary:
    if not records:
        raise ValueError("no records to summarize")
    first = records[0]
    ok = [r for r in records if r.ok]
    errors = Counter(r.error_type or "unknown" for r in records if not r.ok)
    examples: dict[str, str] = {}
    for r in records:
        if not r.ok:
            examples.setdefault(r.error_type or "unknown", (r.error or "")[:200])
    window_ns = max(r.t_done_ns for r in records) - min(r.t_scheduled_ns for r in records)
    window_s = max(window_ns / 1e9, 1e-9)
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    prompt_tokens = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    good = None
    if slo is not None and not slo.empty:
        good = sum(1 for r in ok if slo.met(r.ttft_s, r.tpot_s, r.e2e_s))
    return ScenarioSummary(
        scenario=first.scenario, load=first.load, concurrency=first.concurrency, rate=first.rate,
        prompt_bucket=first.prompt_bucket,
        requests=len(records), ok=len(ok), errors=dict(sorted(errors.items())), window_s=window_s,
        request_throughput=len(ok) / window_s,
        output_token_throughput=out_tokens / window_s,
        total_token_throughput=(out_tokens + sum(prompt_tokens)) / window_s,
        mean_prompt_tokens=sum(prompt_tokens) / len(prompt_tokens) if prompt_tokens else None,
        mean_output_tokens=out_tokens / len(ok) if ok else None,
        output_tokens_from_usage=sum(1 for r in ok if r.output_tokens_source == "usage"),
        early_stops=sum(1 for r in ok if r.fixed_output and (r.output_tokens or 0) < r.max_tokens),
        ttft=distribution(t for r in ok if (t := r.ttft_s) is not None),
        tpot=distribution(t for r in ok if (t := r.tpot_s) is not None),
        itl=distribution(g for r in ok for g in r.itls_s()),
        e2e=distribution(r.e2e_s for r in ok),
        good=good, goodput=None if good is None else good / window_s,
        slo=slo.describe() if slo is not None else "none",
        error_examples=examples,
    )


def summarize(records: Iterable[RequestRecord], slo: Slo | None = None) -> list[ScenarioSummary]:
    """One summary per scenario, in the order scenarios first appear; warm-up excluded."""
    groups: dict[str, list[RequestRecord]] = {}
    for record in records:
        if not record.warmup:
            groups.setdefault(record.scenario, []).append(record)
    return [summarize_scenario(group, slo) for group in groups.values()]


def server_timings(records: Iterable[RequestRecord]) -> dict[str, dict[str, Distribution]]:
    """The servers' own numeric timings per scenario, keyed `field.key` (e.g. `timings.prompt_ms`),
    over successful measured requests; units are the server's. Shown beside, never mixed in."""
    values: dict[str, dict[str, list[float]]] = {}
    for r in records:
        if r.warmup or not r.ok or not r.server_timings:
            continue
        for field_name, content in r.server_timings.items():
            items = content.items() if isinstance(content, dict) else [("", content)]
            for key, value in items:
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    name = f"{field_name}.{key}" if key else field_name
                    values.setdefault(r.scenario, {}).setdefault(name, []).append(float(value))
    return {scenario: {name: distribution(v) for name, v in sorted(named.items())}
            for scenario, named in values.items()}
