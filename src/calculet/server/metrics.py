"""The server's metrics: the engine reports into them (they implement EngineObserver), /metrics
renders them in the Prometheus text format through `prometheus-client`. Every name starts with
`calculet_`.

Every per-model series carries a `model` label (the served name): each served model reports through
its own `ModelMetrics` observer (`for_model(name)`), and its gauges are read from its engine
(`watch(name, ...)`). Server-wide series (`calculet_http_errors_total`) have no model label.

Each `ServerMetrics` owns its `CollectorRegistry` (never the library's global one), so several
servers or tests in one process keep separate counts. Gauges are read from the engine when scraped.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from calculet.engine.observer import EngineObserver
from calculet.runtime.jobs import PhaseTimings

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4   # the text format /metrics serves
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
STEP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
STEP_TOKEN_BUCKETS = (0, 1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
STEP_ROW_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128)
PHASES = ("input_prep", "infer", "output_fetch")
JOB_KINDS = ("prefill", "decode")
# gauge name, help, EngineSnapshot field
_SNAPSHOT_GAUGES = (
    ("calculet_requests_running", "Requests holding at least one lane", "running"),
    ("calculet_requests_waiting", "Requests waiting for a lane", "waiting"),
    ("calculet_lanes_in_use", "KV lanes in use", "lanes_in_use"),
    ("calculet_lanes_free", "KV lanes free", "lanes_free"),
    ("calculet_lanes_total", "KV lanes of the loaded calbin", "lanes_total"),
    ("calculet_sequences_burst_held", "Sequences of a burst that sent their first token and wait for the rest of "
     "the burst's prefill (--burst-prefill-tokens)", "burst_held"),
)
# counter name (without _total), help, PrefixCacheStats field; read from the engine's snapshot
_PREFIX_COUNTERS = (
    ("calculet_prefix_cache_lookups", "Admissions that looked for a warm lane holding their prompt's prefix", "lookups"),
    ("calculet_prefix_cache_hits", "Admissions that resumed from a warm lane's KV", "hits"),
    ("calculet_prefix_cache_tokens_saved", "Prompt tokens not prefilled because the prefix cache held their KV",
     "tokens_saved"),
)


def counter_values(counter: Counter) -> dict[tuple[str, ...], float]:
    """{label values: count} of a counter, read through its public `collect()`."""
    return {tuple(s.labels.values()): s.value for family in counter.collect() for s in family.samples
            if s.name.endswith("_total")}


class _ScrapeGauges:
    """A collector whose gauges are computed when /metrics is scraped, one series per watched model."""

    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        m = self.metrics
        watched = m.watched()
        healthy = GaugeMetricFamily("calculet_healthy", "1 when the model is loaded and its device is healthy, else 0",
                                    labels=("model",))
        for name, (_snapshot, health) in watched.items():
            healthy.add_metric((name,), 1.0 if health() else 0.0)
        yield healthy
        snapshots = {name: snapshot() for name, (snapshot, _health) in watched.items()}
        for gauge, help_text, field in _SNAPSHOT_GAUGES:
            family = GaugeMetricFamily(gauge, help_text, labels=("model",))
            for name, snap in snapshots.items():
                family.add_metric((name,), float(getattr(snap, field, 0) or 0))
            yield family
        for gauge, help_text, field in _PREFIX_COUNTERS:
            family = CounterMetricFamily(gauge, help_text, labels=("model",))
            for name, snap in snapshots.items():
                family.add_metric((name,), float(getattr(getattr(snap, "prefix_cache", None), field, 0)))
            yield family
        warm = GaugeMetricFamily("calculet_lanes_warm", "Free KV lanes that keep a finished sequence's KV for the "
                                 "prefix cache", labels=("model",))
        for name, snap in snapshots.items():
            warm.add_metric((name,), float(getattr(getattr(snap, "prefix_cache", None), "warm", 0)))
        yield warm
        efficiency = GaugeMetricFamily("calculet_device_padding_efficiency",
                                       "Useful tokens / computed tokens since start (1 = no padding waste)",
                                       labels=("model", "kind"))
        useful, computed = counter_values(m.useful), counter_values(m.computed)
        for key, total in computed.items():
            if total:
                efficiency.add_metric(key, useful.get(key, 0.0) / total)
        yield efficiency
        yield from _collective_counters(m.watched_collectives())


def _collective_counters(stats: dict) -> Iterator[CounterMetricFamily]:
    """Bytes moved between chips and host time spent moving them, per model (runtime/collectives.py
    counts them; only models on several chips have any). A reload starts a model's counts anew."""
    calls = CounterMetricFamily("calculet_collective_calls", "Collectives between a model's chips, by kind",
                                labels=("model", "kind"))
    moved = CounterMetricFamily("calculet_collective_bytes", "Bytes a link between a model's chips carries, by kind",
                                labels=("model", "kind"))
    seconds = CounterMetricFamily("calculet_collective_seconds", "Host time spent in a model's collectives",
                                  labels=("model",))
    for name, total in stats.items():
        for kind, (n, nbytes) in sorted(total.by_kind.items()):
            calls.add_metric((name, kind), float(n))
            moved.add_metric((name, kind), float(nbytes))
        seconds.add_metric((name,), total.seconds)
    yield calls
    yield moved
    yield seconds


class ServerMetrics:
    def __init__(self):
        # No `*_created` series (a start timestamp beside every counter and histogram): /metrics keeps
        # the samples it always had. The switch is the library's, process-wide.
        disable_created_metrics()
        self.registry = r = CollectorRegistry(auto_describe=True)
        self._watched: dict[str, tuple[Callable[[], object], Callable[[], bool]]] = {}
        self._collectives: dict[str, Callable[[], object]] = {}
        self._lock = threading.Lock()
        M = ("model",)
        self.prompt_tokens = Counter("calculet_prompt_tokens_total", "Prompt tokens of admitted requests", M, registry=r)
        self.generation_tokens = Counter("calculet_generation_tokens_total", "Tokens generated", M, registry=r)
        self.requests = Counter("calculet_requests_total", "Requests the engine finished, by outcome "
                                "(stop, length, error, cancelled, timeout)", M + ("outcome",), registry=r)
        self.http_errors = Counter("calculet_http_errors_total", "Error responses by HTTP status", ("status",), registry=r)
        self.queue_time = Histogram("calculet_request_queue_seconds", "Arrival to first lane allocated", M,
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("calculet_time_to_first_token_seconds", "Arrival to first token sampled", M,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("calculet_inter_token_latency_seconds", "Time between consecutive tokens of a sequence", M,
                             buckets=STEP_BUCKETS, registry=r)
        self.e2e = Histogram("calculet_e2e_request_latency_seconds", "Arrival to the request's end", M,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.phase = Histogram("calculet_device_phase_seconds", "Device time per job and phase "
                               "(queued, input_prep, infer, output_fetch)", M + ("kind", "phase"), buckets=STEP_BUCKETS,
                               registry=r)
        self.step_prefill = Histogram("calculet_step_prefill_tokens", "Prompt tokens prefilled per engine step "
                                      "(bounded by --max-prefill-tokens and --step-token-budget)", M,
                                      buckets=STEP_TOKEN_BUCKETS, registry=r)
        self.slice_raised = Counter("calculet_step_slice_raised_total", "Engine steps whose prefill slice went past "
                                    "--step-token-budget for a prompt at risk of missing --ttft-target", M, registry=r)
        self.step_decode = Histogram("calculet_step_decode_rows", "Decoding sequences per engine step", M,
                                     buckets=STEP_ROW_BUCKETS, registry=r)
        self.sampling = Histogram("calculet_sampling_seconds", "Host sampling time per device job", M,
                                  buckets=STEP_BUCKETS, registry=r)
        self.useful = Counter("calculet_device_useful_tokens_total", "Real tokens in device jobs", M + ("kind",), registry=r)
        self.computed = Counter("calculet_device_computed_tokens_total", "Tokens the graphs computed, padding included",
                                M + ("kind",), registry=r)
        self.device_errors = Counter("calculet_device_errors_total", "Device failures, by error code", M + ("code",),
                                     registry=r)
        self.requeued_sequences = Counter("calculet_requeued_sequences_total", "Sequences re-prefilled after a device reset",
                                          M, registry=r)
        self.device_resets = Counter("calculet_device_resets_total", "Device resets, by result", M + ("result",), registry=r)
        r.register(_ScrapeGauges(self))

    def for_model(self, name: str) -> ModelMetrics:
        """The observer a model's engine reports into."""
        return ModelMetrics(self, name)

    def watch(self, name: str, snapshot, health, collectives=None) -> None:
        """Read model `name`'s gauges from `snapshot()` (an EngineSnapshot) and `health()` (bool) when scraped,
        and its collective counters from `collectives()` (a CollectiveStats, None on one chip)."""
        with self._lock:
            self._watched[name] = (snapshot, health)
            self._collectives.pop(name, None)
            if collectives is not None:
                self._collectives[name] = collectives

    def unwatch(self, name: str) -> None:
        """An unloaded model's gauges go; its counters stay (they only ever grow)."""
        with self._lock:
            self._watched.pop(name, None)
            self._collectives.pop(name, None)

    def watched(self) -> dict:
        with self._lock:
            return dict(self._watched)

    def watched_collectives(self) -> dict:
        """{model: CollectiveStats since its device's warm-up} of the watched models that have collectives."""
        with self._lock:
            sources = dict(self._collectives)
        stats = {name: read() for name, read in sources.items()}
        return {name: st for name, st in stats.items() if st is not None}

    def render(self) -> str:
        return generate_latest(self.registry).decode("utf-8")


class ModelMetrics(EngineObserver):
    """One model's engine observer: everything it reports is labelled with the model's name."""

    def __init__(self, metrics: ServerMetrics, name: str):
        self.m = metrics
        self.name = name

    def job(self, kind: str, timings: PhaseTimings, useful_tokens: int) -> None:
        m, n = self.m, self.name
        m.phase.labels(n, kind, "queued").observe(timings.queued)
        for phase in PHASES:
            m.phase.labels(n, kind, phase).observe(getattr(timings, phase))
        m.useful.labels(n, kind).inc(useful_tokens)
        m.computed.labels(n, kind).inc(timings.computed_tokens)

    def step(self, prefill_tokens: int, decode_rows: int) -> None:
        self.m.step_prefill.labels(self.name).observe(prefill_tokens)
        self.m.step_decode.labels(self.name).observe(decode_rows)

    def slice_raised(self) -> None:
        self.m.slice_raised.labels(self.name).inc()

    def sampled(self, seconds: float, tokens: int) -> None:
        if tokens:
            self.m.sampling.labels(self.name).observe(seconds)
            self.m.generation_tokens.labels(self.name).inc(tokens)

    def admitted(self, queue_s: float, prompt_tokens: int) -> None:
        self.m.queue_time.labels(self.name).observe(queue_s)
        self.m.prompt_tokens.labels(self.name).inc(prompt_tokens)

    def first_token(self, ttft_s: float) -> None:
        self.m.ttft.labels(self.name).observe(ttft_s)

    def inter_token(self, gaps_s: list[float]) -> None:
        itl = self.m.itl.labels(self.name)
        for gap in gaps_s:
            itl.observe(gap)

    def finished(self, outcome: str, e2e_s: float) -> None:
        self.m.requests.labels(self.name, outcome).inc()
        self.m.e2e.labels(self.name).observe(e2e_s)

    def device_error(self, code: str) -> None:
        self.m.device_errors.labels(self.name, code).inc()

    def requeued(self, sequences: int) -> None:
        self.m.requeued_sequences.labels(self.name).inc(sequences)

    def device_reset(self, seconds: float, ok: bool) -> None:
        self.m.device_resets.labels(self.name, "ok" if ok else "failed").inc()
