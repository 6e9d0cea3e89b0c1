"""The scenarios of `run.py`: what each measures, on which pair of servers, and by which metrics.

    streams        closed loops of 1 and 8 clients, 200-token prompts, 128 output tokens
    16x8           16 requests through 8 streams: each finished stream sends the next prompt while the
                   others still decode (the case where a prefill stalls every decoding sequence)
    open           open-loop Poisson arrivals near llama-server's saturation rate (a fraction of its
                   8-stream request rate, measured in round 1's `streams`), goodput under an SLO
                   and the share of requests that met it (which bounds the goodput ratio)
    long           1,000- and 4,000-token prompts one at a time, 16 output tokens: prefill tokens/s
                   (a second pair of servers with a context that holds them)

A metric is (name, how to read it from a ScenarioSummary, whether higher is better).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

SCENARIOS = ("streams", "16x8", "open", "long")


@dataclass(frozen=True)
class Metric:
    name: str
    read: Callable             # ScenarioSummary -> float | None
    higher_is_better: bool


def _p(dist_name: str, pct: str):
    def read(s):
        dist = getattr(s, dist_name)
        return None if dist is None else getattr(dist, pct)
    return read


def _prefill_tps(s):
    """Prompt tokens per second of time to first token (one request at a time: the prefill rate)."""
    if s.ttft is None or not s.ttft.p50 or not s.mean_prompt_tokens:
        return None
    return s.mean_prompt_tokens / s.ttft.p50


OUTPUT_TPS = Metric("output tok/s", lambda s: s.output_token_throughput or None, True)
TTFT_P50 = Metric("TTFT p50 s", _p("ttft", "p50"), False)
ITL_P99 = Metric("ITL p99 s", _p("itl", "p99"), False)
TPOT_P50 = Metric("TPOT p50 s", _p("tpot", "p50"), False)
GOODPUT = Metric("goodput req/s", lambda s: s.goodput, True)


def _slo_met(s):
    """The share of the scenario's requests that met every SLO limit. Goodput is that share times the
    request rate over the window, and the window is at least the arrivals' span, so at an offered rate
    r no server's goodput exceeds about r: the goodput ratio B/A is at most about 1 / (A's share)."""
    if s.good is None or not s.requests:
        return None
    return s.good / s.requests


SLO_MET = Metric("SLO met share", _slo_met, True)
PREFILL_TPS = Metric("prefill tok/s", _prefill_tps, True)


@dataclass(frozen=True)
class Scenario:
    name: str                  # one of SCENARIOS
    servers: str               # "main" (8 slots, 1,024 tokens each) or "long" (1 slot, a long context)
    settings: dict = field(default_factory=dict)   # calculet.bench.config keys (url, model, out, seed added by run.py)
    metrics: tuple[Metric, ...] = ()


# The warm-up wave's seed is the run's seed plus this: never seed + 1000 x round + 100 x scenario, so
# no measured prompt repeats a warm-up prompt (llama-server would answer it from its prompt cache).
WARM_UP_SEED_OFFSET = 999


def warm_up_scenario(args) -> Scenario:
    """One unmeasured wave on each main server before round 1: as many requests as the largest
    closed-loop concurrency, all at once. The per-phase warm-up runs before a run's first phase (one
    client in `streams`), so without this a server's first 8-stream phase of the whole run is the
    first time it holds 8 sequences: llama-server's ran at about half its later rate (59 against
    101-119 tok/s in run J), which inflated that round's ratio and lowered `open`'s offered rate,
    taken from that round."""
    width = max(int(c) for c in str(args.concurrency).split(",") if c.strip())
    return Scenario("warm-up", "main", {"concurrency": width, "prompt_tokens": args.prompt_tokens,
                                        "output_tokens": args.output_tokens, "requests": width})


def build_scenarios(names: list[str], args, open_rate: float | None = None) -> list[Scenario]:
    """The selected scenarios from the command line's knobs. `open` needs `open_rate` (requests/s)."""
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise SystemExit(f"error: unknown scenario(s) {unknown}; allowed: {', '.join(SCENARIOS)}")
    out = []
    for name in names:
        if name == "streams":
            out.append(Scenario(name, "main", {"concurrency": args.concurrency, "prompt_tokens": args.prompt_tokens,
                                               "output_tokens": args.output_tokens, "requests": args.requests},
                                (OUTPUT_TPS, TTFT_P50, ITL_P99, TPOT_P50)))
        elif name == "16x8":
            out.append(Scenario(name, "main", {"concurrency": 8, "prompt_tokens": args.prompt_tokens,
                                               "output_tokens": args.output_tokens, "requests": 2 * 8},
                                (OUTPUT_TPS, TTFT_P50, ITL_P99, TPOT_P50)))
        elif name == "open":
            settings = {"load": "poisson", "rate": open_rate, "prompt_tokens": args.prompt_tokens,
                        "output_tokens": args.output_tokens, "requests": args.open_requests, "slo": args.open_slo}
            out.append(Scenario(name, "main", settings, (GOODPUT, SLO_MET, OUTPUT_TPS, TTFT_P50, ITL_P99)))
        elif name == "long":
            out.append(Scenario(name, "long", {"concurrency": 1, "prompt_tokens": args.long_prompt_tokens,
                                               "output_tokens": args.long_output_tokens, "requests": args.long_requests},
                                (PREFILL_TPS, TTFT_P50)))
    return out


def saturation_rate(summaries, output_tokens: int, fraction: float) -> float:
    """`fraction` of the highest closed-loop request rate among `summaries` (requests/s)."""
    closed = [s.request_throughput for s in summaries if s.load == "closed" and s.request_throughput]
    if not closed:
        raise RuntimeError("no closed-loop result to take a saturation rate from; give --open-rate")
    return round(fraction * max(closed), 3)
