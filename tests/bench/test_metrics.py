"""Metrics from records: definitions checked on hand-made records."""

from __future__ import annotations

import numpy as np
import pytest

from calculet.bench.metrics import distribution, percentile, summarize
from calculet.bench.records import RequestRecord
from calculet.bench.slo import Slo

MS = 1_000_000


def record(i: int, sent_ms: int, first_ms: int | None, gaps_ms: list[int], ok: bool = True,
           scenario: str = "s", warmup: bool = False, error_type: str | None = None) -> RequestRecord:
    chunks = [] if first_ms is None else [first_ms * MS]
    for g in gaps_ms:
        chunks.append(chunks[-1] + g * MS)
    done = (chunks[-1] if chunks else sent_ms * MS) + MS
    return RequestRecord(
        run_id="r", request_id=i, scenario=scenario, warmup=warmup, load="closed", concurrency=1, rate=None,
        api="completions", prompt_bucket=8, prompt_tokens_target=8, max_tokens=len(chunks), fixed_output=True,
        t_scheduled_ns=sent_ms * MS, t_sent_ns=sent_ms * MS, t_first_token_ns=None if first_ms is None else first_ms * MS,
        t_chunks_ns=chunks, t_done_ns=done, http_status=200 if ok else 500, status="ok" if ok else "error",
        error_type=error_type, prompt_tokens=9, output_tokens=len(chunks), output_tokens_source="usage",
    )


@pytest.mark.parametrize("q", [0, 1, 50, 90, 95, 99, 100])
def test_percentile_matches_numpy_linear(q: float):
    values = sorted(np.random.default_rng(0).exponential(size=37).tolist())
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_distribution_uses_population_std():
    d = distribution([1.0, 2.0, 3.0, 4.0])
    assert d.mean == 2.5 and d.std == pytest.approx(float(np.std([1, 2, 3, 4])))
    assert distribution([]) is None


def test_definitions():
    records = [
        record(0, 0, 100, [10, 20, 30]),        # TTFT 100, e2e 161, TPOT (161-100)/3
        record(1, 200, 250, [10]),              # TTFT 50, e2e 61, TPOT 11
        record(2, 300, None, [], ok=False, error_type="http_500"),
        record(3, 0, 5, [1], warmup=True),      # excluded
    ]
    (s,) = summarize(records, Slo(ttft_s=0.06))
    assert s.requests == 3 and s.ok == 2 and s.errors == {"http_500": 1}
    assert s.ttft.mean == pytest.approx((0.100 + 0.050) / 2)
    assert s.tpot.p50 == pytest.approx(((0.161 - 0.100) / 3 + 0.011) / 2)
    assert sorted([0.010, 0.020, 0.030, 0.010]) == pytest.approx(sorted(
        [g for r in records[:2] for g in r.itls_s()]))
    assert s.itl.count == 4 and s.itl.mean == pytest.approx(0.0175)
    assert s.window_s == pytest.approx(0.301)  # first send 0 ms → last end 301 ms (the failed request)
    assert s.request_throughput == pytest.approx(2 / 0.301)
    assert s.output_token_throughput == pytest.approx(6 / 0.301)
    assert s.good == 1 and s.goodput == pytest.approx(1 / 0.301)


def test_scenarios_are_kept_apart_and_in_order():
    records = [record(0, 0, 10, [1], scenario="b"), record(1, 0, 10, [1], scenario="a")]
    assert [s.scenario for s in summarize(records)] == ["b", "a"]
