"""Open-loop arrival times: Poisson, gamma (with a burstiness factor) or a constant rate.

Inter-arrival gaps are drawn from a gamma distribution with shape `burstiness` and mean 1/rate, so
their coefficient of variation is 1/sqrt(burstiness): 1 is a Poisson process, below 1 is burstier,
above 1 is smoother; `constant` spaces arrivals exactly 1/rate apart.

The gaps are then scaled by one common factor so that the n arrivals span exactly n/rate seconds:
the offered load is the requested rate, not a random draw near it. (For a Poisson process this is
the process conditioned on its n-th arrival falling at n/rate; the shape of the gaps is unchanged.)
"""

from __future__ import annotations

import random


def inter_arrival_gaps(n: int, rate: float, mode: str = "poisson", burstiness: float = 1.0,
                       seed: int = 0) -> list[float]:
    """n gaps in seconds; the first arrival comes one gap after the start."""
    if n < 1:
        raise ValueError(f"need at least one arrival, got n={n}")
    if rate <= 0:
        raise ValueError(f"rate must be > 0 arrivals/s, got {rate}")
    mean = 1.0 / rate
    if mode == "constant":
        return [mean] * n
    if mode == "poisson":
        shape = 1.0
    elif mode == "gamma":
        if burstiness <= 0:
            raise ValueError(f"burstiness must be > 0, got {burstiness}")
        shape = burstiness
    else:
        raise ValueError(f"arrival mode must be poisson, gamma or constant, got {mode!r}")
    rng = random.Random(seed)
    gaps = [rng.gammavariate(shape, mean / shape) for _ in range(n)]
    scale = n * mean / sum(gaps)
    return [g * scale for g in gaps]


def arrival_times(n: int, rate: float, mode: str = "poisson", burstiness: float = 1.0,
                  seed: int = 0) -> list[float]:
    """Seconds after the start of the phase at which each of n requests is sent (non-decreasing)."""
    times, t = [], 0.0
    for gap in inter_arrival_gaps(n, rate, mode, burstiness, seed):
        t += gap
        times.append(t)
    return times
