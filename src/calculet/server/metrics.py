"""The server's metrics: the engine reports into them (they implement EngineObserver), /metrics
renders them in the Prometheus text format through `prometheus-client`. Every name starts with
`calculet_`.

Each `ServerMetrics` owns its `CollectorRegistry` (never the library's global one), so several
servers or tests in one process keep separate counts. Gauges are read from the engine when scraped.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from calculet.engine.observer import EngineObserver
from calculet.runtime.jobs import PhaseTimings

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4   # the text format /metrics serves
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
STEP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
PHASES = ("input_prep", "infer", "output_fetch")
JOB_KINDS = ("prefill", "decode")
# gauge name, help, EngineSnapshot field
_SNAPSHOT_GAUGES = (
    ("calculet_requests_running", "Requests holding at least one lane", "running"),
    ("calculet_requests_waiting", "Requests waiting for a lane", "waiting"),
    ("calculet_lanes_in_use", "KV lanes in use", "lanes_in_use"),
    ("calculet_lanes_free", "KV lanes free", "lanes_free"),
    ("calculet_lanes_total", "KV lanes of the loaded calbin", "lanes_total"),
)


def counter_values(counter: Counter) -> dict[tuple[str, ...], float]:
    """{label values: count} of a counter, read through its public `collect()`."""
    return {tuple(s.labels.values()): s.value for family in counter.collect() for s in family.samples
            if s.name.endswith("_total")}


class _ScrapeGauges:
    """A collector whose gauges are computed when /metrics is scraped."""

    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        m = self.metrics
        yield GaugeMetricFamily("calculet_healthy", "1 when the model is loaded and the device is healthy, else 0",
                                value=m._health())
        snapshot = m._snapshot()
        for name, help_text, field in _SNAPSHOT_GAUGES:
            yield GaugeMetricFamily(name, help_text, value=float(getattr(snapshot, field, 0) or 0))
        efficiency = GaugeMetricFamily("calculet_device_padding_efficiency",
                                       "Useful tokens / computed tokens since start (1 = no padding waste)",
                                       labels=("kind",))
        useful, computed = counter_values(m.useful), counter_values(m.computed)
        for kind in JOB_KINDS:
            if computed.get((kind,)):
                efficiency.add_metric((kind,), useful.get((kind,), 0.0) / computed[(kind,)])
        yield efficiency


class ServerMetrics(EngineObserver):
    def __init__(self):
        # No `*_created` series (a start timestamp beside every counter and histogram): /metrics keeps
        # the samples it always had. The switch is the library's, process-wide.
        disable_created_metrics()
        self.registry = r = CollectorRegistry(auto_describe=True)
        self._snapshot: Callable[[], object] = lambda: None   # set by `watch` once the engine exists
        self._health: Callable[[], float] = lambda: 0.0
        self.prompt_tokens = Counter("calculet_prompt_tokens_total", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("calculet_generation_tokens_total", "Tokens generated", registry=r)
        self.requests = Counter("calculet_requests_total", "Requests the engine finished, by outcome "
                                "(stop, length, error, cancelled, timeout)", ("outcome",), registry=r)
        self.http_errors = Counter("calculet_http_errors_total", "Error responses by HTTP status", ("status",), registry=r)
        self.queue_time = Histogram("calculet_request_queue_seconds", "Arrival to first lane allocated",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("calculet_time_to_first_token_seconds", "Arrival to first token sampled",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("calculet_inter_token_latency_seconds", "Time between consecutive tokens of a sequence",
                             buckets=STEP_BUCKETS, registry=r)
        self.e2e = Histogram("calculet_e2e_request_latency_seconds", "Arrival to the request's end",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.phase = Histogram("calculet_device_phase_seconds", "Device time per job and phase "
                               "(queued, input_prep, infer, output_fetch)", ("kind", "phase"), buckets=STEP_BUCKETS,
                               registry=r)
        self.sampling = Histogram("calculet_sampling_seconds", "Host sampling time per engine step",
                                  buckets=STEP_BUCKETS, registry=r)
        self.useful = Counter("calculet_device_useful_tokens_total", "Real tokens in device jobs", ("kind",), registry=r)
        self.computed = Counter("calculet_device_computed_tokens_total", "Tokens the graphs computed, padding included",
                                ("kind",), registry=r)
        self.device_errors = Counter("calculet_device_errors_total", "Device failures, by error code", ("code",), registry=r)
        self.requeued_sequences = Counter("calculet_requeued_sequences_total", "Sequences re-prefilled after a device reset",
                                          registry=r)
        self.device_resets = Counter("calculet_device_resets_total", "Device resets, by result", ("result",), registry=r)
        r.register(_ScrapeGauges(self))

    def watch(self, snapshot, health) -> None:
        """Read gauges from `snapshot()` (an EngineSnapshot) and `health()` (bool) when scraped."""
        self._snapshot = snapshot
        self._health = lambda: 1.0 if health() else 0.0

    def render(self) -> str:
        return generate_latest(self.registry).decode("utf-8")

    # --- EngineObserver ------------------------------------------------------------------
    def job(self, kind: str, timings: PhaseTimings, useful_tokens: int) -> None:
        self.phase.labels(kind, "queued").observe(timings.queued)
        for name in PHASES:
            self.phase.labels(kind, name).observe(getattr(timings, name))
        self.useful.labels(kind).inc(useful_tokens)
        self.computed.labels(kind).inc(timings.computed_tokens)

    def sampled(self, seconds: float, tokens: int) -> None:
        if tokens:
            self.sampling.observe(seconds)
            self.generation_tokens.inc(tokens)

    def admitted(self, queue_s: float, prompt_tokens: int) -> None:
        self.queue_time.observe(queue_s)
        self.prompt_tokens.inc(prompt_tokens)

    def first_token(self, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)

    def inter_token(self, gaps_s: list[float]) -> None:
        for gap in gaps_s:
            self.itl.observe(gap)

    def finished(self, outcome: str, e2e_s: float) -> None:
        self.requests.labels(outcome).inc()
        self.e2e.observe(e2e_s)

    def device_error(self, code: str) -> None:
        self.device_errors.labels(code).inc()

    def requeued(self, sequences: int) -> None:
        self.requeued_sequences.inc(sequences)

    def device_reset(self, seconds: float, ok: bool) -> None:
        self.device_resets.labels("ok" if ok else "failed").inc()
