"""benchmarks/vs_llamacpp's rounds summary: median and worst round per metric, for each server and the
B/A ratio (issue 14 part 5: >= 5 alternating rounds, worst round reported beside the median)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "vs_llamacpp"))
from rounds import collect, median_and_worst, rounds_json, rounds_markdown  # noqa: E402
from scenarios import (  # noqa: E402
    GOODPUT, OUTPUT_TPS, PREFILL_TPS, SCENARIOS, SLO_MET, TTFT_P50, WARM_UP_SEED_OFFSET, saturation_rate,
    warm_up_scenario,
)


def _s(tps, ttft, prompt=1000.0, load="closed", rate=1.0):
    return SimpleNamespace(output_token_throughput=tps, ttft=SimpleNamespace(p50=ttft), mean_prompt_tokens=prompt,
                           load=load, request_throughput=rate)


def test_worst_is_the_round_least_favourable():
    assert median_and_worst([3.0, 1.0, 2.0], True) == (2.0, 1.0)
    assert median_and_worst([3.0, 1.0, None], False) == (2.0, 3.0)
    assert median_and_worst([None], True) == (None, None)


def test_rows_ratios_and_tables():
    rounds = [{("streams", "c8"): (_s(100, 0.5), _s(150, 0.4))},
              {("streams", "c8"): (_s(100, 0.5), _s(120, 0.6))},
              {("streams", "c8"): (_s(80, 0.5), _s(160, 0.5))}]
    rows = collect(rounds, {"streams": (OUTPUT_TPS, TTFT_P50, PREFILL_TPS)})
    tps, ttft, prefill = rows
    assert tps.ratios == pytest.approx((1.5, 1.2, 2.0)) and ttft.ratios == pytest.approx((0.8, 1.2, 1.0))
    assert median_and_worst(tps.ratios, True) == pytest.approx((1.5, 1.2))
    assert median_and_worst(ttft.ratios, False) == pytest.approx((1.0, 1.2))
    assert prefill.b[0] == pytest.approx(1000 / 0.4)
    cpu = {"flags": ["avx2", "fma"], "source": "test", "machine": "x86_64", "model": "EPYC"}
    md = rounds_markdown(rows, cpu, 3)
    assert "CPU: EPYC (x86_64): avx2 fma (test)" in md
    assert "| streams c8 | output tok/s ↑ | 100 | 80 | 150 | 120 | **1.50×** | 1.20× | 1.50× 1.20× 2.00× |" in md
    data = json.loads(rounds_json(rows, cpu))
    assert data["cpu"] == cpu and data["rows"][1]["ratio_worst"] == pytest.approx(1.2)


def test_one_server_alone_has_no_ratio_columns():
    rows = collect([{("long", "p1000"): (None, _s(10, 0.25))}], {"long": (PREFILL_TPS,)})
    md = rounds_markdown(rows, None, 1)
    assert "B/A" not in md.splitlines()[6] and "| 4000 | 4000 |" in md and "CPU: not recorded" in md


def test_saturation_rate_takes_the_best_closed_loop():
    assert saturation_rate([_s(1, 1, rate=0.5), _s(1, 1, rate=2.0), _s(1, 1, load="poisson", rate=9.0)], 128, 0.9) == 1.8
    with pytest.raises(RuntimeError, match="--open-rate"):
        saturation_rate([], 128, 0.9)


def test_slo_met_share_shows_the_goodput_ceiling():
    """At one offered rate a server that meets every SLO has a goodput near that rate: against a peer
    that met 3 of 4, the goodput ratio stays near 4/3 however fast the first server is."""
    peer = SimpleNamespace(good=18, requests=24, goodput=18 / 45.0)
    ours = SimpleNamespace(good=24, requests=24, goodput=24 / 42.0)
    assert SLO_MET.read(peer) == pytest.approx(0.75) and SLO_MET.read(ours) == 1.0
    assert GOODPUT.read(ours) / GOODPUT.read(peer) < 1 / SLO_MET.read(peer) * 45 / 42 + 1e-9
    assert SLO_MET.read(SimpleNamespace(good=None, requests=24)) is None
    assert SLO_MET.read(SimpleNamespace(good=0, requests=0)) is None


def test_the_warm_up_wave_fills_the_largest_concurrency_with_prompts_no_round_reuses():
    wave = warm_up_scenario(SimpleNamespace(concurrency="1,8, 4", prompt_tokens="200", output_tokens=128))
    assert wave.settings == {"concurrency": 8, "prompt_tokens": "200", "output_tokens": 128, "requests": 8}
    assert wave.servers == "main" and not wave.metrics          # measured by no table
    measured = {1000 * r + 100 * i for r in range(50) for i in range(len(SCENARIOS))}
    assert WARM_UP_SEED_OFFSET not in measured
