"""Open-loop arrival schedules: rate and burstiness must be what was asked for."""

from __future__ import annotations

import statistics

import pytest

from calculet.bench.schedule import arrival_times, inter_arrival_gaps


@pytest.mark.parametrize("mode,burstiness", [("poisson", 1.0), ("gamma", 0.5), ("gamma", 2.0), ("gamma", 4.0)])
def test_mean_and_coefficient_of_variation(mode: str, burstiness: float):
    rate = 8.0
    gaps = inter_arrival_gaps(2000, rate, mode, burstiness, seed=0)
    mean = statistics.fmean(gaps)
    cv = statistics.pstdev(gaps) / mean
    assert abs(mean - 1 / rate) <= 0.05 / rate
    expected_cv = burstiness ** -0.5
    assert abs(cv - expected_cv) <= 0.05 * expected_cv, f"CV {cv:.3f} vs {expected_cv:.3f}"


def test_constant_rate_is_exact():
    assert arrival_times(4, 2.0, "constant") == [0.5, 1.0, 1.5, 2.0]


def test_seeded_and_different_per_seed():
    assert arrival_times(50, 3.0, seed=7) == arrival_times(50, 3.0, seed=7)
    assert arrival_times(50, 3.0, seed=7) != arrival_times(50, 3.0, seed=8)


def test_times_increase():
    times = arrival_times(500, 100.0, "gamma", 0.3, seed=1)
    assert all(b >= a for a, b in zip(times, times[1:]))


@pytest.mark.parametrize("kwargs,match", [
    (dict(n=0, rate=1.0), "at least one"),
    (dict(n=5, rate=0.0), "rate"),
    (dict(n=5, rate=1.0, mode="uniform"), "poisson, gamma or constant"),
    (dict(n=5, rate=1.0, mode="gamma", burstiness=0.0), "burstiness"),
])
def test_bad_arguments_say_what_is_wrong(kwargs, match):
    with pytest.raises(ValueError, match=match):
        inter_arrival_gaps(**kwargs)
