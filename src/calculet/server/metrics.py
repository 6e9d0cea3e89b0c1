"""The server's metrics: the engine reports into them (they implement EngineObserver), /metrics
renders them in the Prometheus text format. Every name starts with `calculet_`."""

from __future__ import annotations

from calculet.engine.observer import EngineObserver
from calculet.runtime.jobs import PhaseTimings
from calculet.server.prometheus import Counter, Gauge, Histogram, Registry

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
STEP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
PHASES = ("input_prep", "infer", "output_fetch")


class ServerMetrics(EngineObserver):
    def __init__(self):
        self.registry = r = Registry()
        self._snapshot = lambda: None          # set by `watch` once the engine exists
        self._health = lambda: 0.0
        snap = lambda field: (lambda: {(): float(getattr(self._snapshot(), field, 0) or 0)})  # noqa: E731
        r.add(Gauge("calculet_healthy", "1 when the model is loaded and the device is healthy, else 0", lambda: {(): self._health()}))
        r.add(Gauge("calculet_requests_running", "Requests holding at least one lane", snap("running")))
        r.add(Gauge("calculet_requests_waiting", "Requests waiting for a lane", snap("waiting")))
        r.add(Gauge("calculet_lanes_in_use", "KV lanes in use", snap("lanes_in_use")))
        r.add(Gauge("calculet_lanes_free", "KV lanes free", snap("lanes_free")))
        r.add(Gauge("calculet_lanes_total", "KV lanes of the loaded calbin", snap("lanes_total")))
        self.prompt_tokens = r.add(Counter("calculet_prompt_tokens_total", "Prompt tokens of admitted requests"))
        self.generation_tokens = r.add(Counter("calculet_generation_tokens_total", "Tokens generated"))
        self.requests = r.add(Counter("calculet_requests_total", "Requests the engine finished, by outcome "
                                      "(stop, length, error, cancelled, timeout)", ("outcome",)))
        self.http_errors = r.add(Counter("calculet_http_errors_total", "Error responses by HTTP status", ("status",)))
        self.queue_time = r.add(Histogram("calculet_request_queue_seconds", "Arrival to first lane allocated", LATENCY_BUCKETS))
        self.ttft = r.add(Histogram("calculet_time_to_first_token_seconds", "Arrival to first token sampled", LATENCY_BUCKETS))
        self.itl = r.add(Histogram("calculet_inter_token_latency_seconds", "Time between consecutive tokens of a sequence", STEP_BUCKETS))
        self.e2e = r.add(Histogram("calculet_e2e_request_latency_seconds", "Arrival to the request's end", LATENCY_BUCKETS))
        self.phase = r.add(Histogram("calculet_device_phase_seconds", "Device time per job and phase "
                                     "(queued, input_prep, infer, output_fetch)", STEP_BUCKETS, ("kind", "phase")))
        self.sampling = r.add(Histogram("calculet_sampling_seconds", "Host sampling time per engine step", STEP_BUCKETS))
        self.useful = r.add(Counter("calculet_device_useful_tokens_total", "Real tokens in device jobs", ("kind",)))
        self.computed = r.add(Counter("calculet_device_computed_tokens_total", "Tokens the graphs computed, padding included", ("kind",)))
        r.add(Gauge("calculet_device_padding_efficiency", "Useful tokens / computed tokens since start (1 = no padding waste)",
                    self._efficiency, ("kind",)))
        self.device_errors = r.add(Counter("calculet_device_errors_total", "Device failures, by error code", ("code",)))
        self.requeued_sequences = r.add(Counter("calculet_requeued_sequences_total", "Sequences re-prefilled after a device reset"))
        self.device_resets = r.add(Counter("calculet_device_resets_total", "Device resets, by result", ("result",)))

    def watch(self, snapshot, health) -> None:
        """Read gauges from `snapshot()` (an EngineSnapshot) and `health()` (bool) when scraped."""
        self._snapshot = snapshot
        self._health = lambda: 1.0 if health() else 0.0

    def render(self) -> str:
        return self.registry.render()

    def _efficiency(self) -> dict:
        out = {}
        for kind in ("prefill", "decode"):
            computed = self.computed.value(kind)
            if computed:
                out[(kind,)] = self.useful.value(kind) / computed
        return out

    # --- EngineObserver ------------------------------------------------------------------
    def job(self, kind: str, timings: PhaseTimings, useful_tokens: int) -> None:
        self.phase.observe(timings.queued, kind, "queued")
        for name in PHASES:
            self.phase.observe(getattr(timings, name), kind, name)
        self.useful.inc(useful_tokens, kind)
        self.computed.inc(timings.computed_tokens, kind)

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
        self.requests.inc(1, outcome)
        self.e2e.observe(e2e_s)

    def device_error(self, code: str) -> None:
        self.device_errors.inc(1, code)

    def requeued(self, sequences: int) -> None:
        self.requeued_sequences.inc(sequences)

    def device_reset(self, seconds: float, ok: bool) -> None:
        self.device_resets.inc(1, "ok" if ok else "failed")
