"""ServerMetrics on prometheus-client: names, labels, cumulative buckets, label escaping, gauges read
when scraped, and one registry per server."""

from __future__ import annotations

from calculet.engine.engine import EngineSnapshot
from calculet.runtime.jobs import PhaseTimings
from calculet.server.metrics import LATENCY_BUCKETS, ServerMetrics


def samples(text: str) -> dict[str, float]:
    """{'name{labels}': value} of every sample line, as tests/serving.py reads /metrics."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_counters_histograms_and_escaped_labels():
    m = ServerMetrics()
    for e2e in (0.004, 0.3, 500.0):
        m.finished("stop", e2e)
    m.device_error('odd"code\\x')
    m.admitted(0.02, 7)
    text = m.render()
    s = samples(text)
    assert "# TYPE calculet_requests_total counter" in text.splitlines()
    assert "# TYPE calculet_e2e_request_latency_seconds histogram" in text.splitlines()
    assert "_created" not in text   # the samples /metrics always had, no creation timestamps
    assert s['calculet_requests_total{outcome="stop"}'] == 3
    assert s['calculet_device_errors_total{code="odd\\"code\\\\x"}'] == 1
    assert s["calculet_prompt_tokens_total"] == 7 and s["calculet_generation_tokens_total"] == 0
    # cumulative buckets: as many as LATENCY_BUCKETS plus +Inf, counting 1, then 2 from 0.5 s on, then 3 at +Inf
    buckets = {k: v for k, v in s.items() if k.startswith("calculet_e2e_request_latency_seconds_bucket")}
    assert len(buckets) == len(LATENCY_BUCKETS) + 1
    assert s['calculet_e2e_request_latency_seconds_bucket{le="0.005"}'] == 1
    assert s['calculet_e2e_request_latency_seconds_bucket{le="0.25"}'] == 1
    assert s['calculet_e2e_request_latency_seconds_bucket{le="0.5"}'] == 2
    assert s['calculet_e2e_request_latency_seconds_bucket{le="120.0"}'] == 2
    assert s['calculet_e2e_request_latency_seconds_bucket{le="+Inf"}'] == 3
    assert s["calculet_e2e_request_latency_seconds_count"] == 3
    assert abs(s["calculet_e2e_request_latency_seconds_sum"] - 500.304) < 1e-9


def test_gauges_are_read_when_scraped():
    m = ServerMetrics()
    s = samples(m.render())
    assert s["calculet_healthy"] == 0 and s["calculet_lanes_in_use"] == 0
    assert not any(k.startswith("calculet_device_padding_efficiency") for k in s)   # nothing computed yet
    state = {"snapshot": EngineSnapshot("ready", 2, 1, 1, 3, 5, 8), "healthy": True}
    m.watch(lambda: state["snapshot"], lambda: state["healthy"])
    m.job("prefill", PhaseTimings(infer=0.01, computed_tokens=16), useful_tokens=12)
    s = samples(m.render())
    assert (s["calculet_healthy"], s["calculet_requests_running"], s["calculet_requests_waiting"]) == (1, 2, 1)
    assert (s["calculet_lanes_in_use"], s["calculet_lanes_free"], s["calculet_lanes_total"]) == (3, 5, 8)
    assert s['calculet_device_padding_efficiency{kind="prefill"}'] == 0.75
    assert s['calculet_device_phase_seconds_count{kind="prefill",phase="infer"}'] == 1
    assert s['calculet_device_phase_seconds_count{kind="prefill",phase="queued"}'] == 1
    state["healthy"] = False
    assert samples(m.render())["calculet_healthy"] == 0


def test_each_server_has_its_own_registry():
    """Guards against registering into prometheus-client's global registry: a second ServerMetrics in
    the same process would raise 'Duplicated timeseries' there, or share the first one's counts."""
    a, b = ServerMetrics(), ServerMetrics()
    a.finished("length", 1.0)
    assert samples(a.render())['calculet_requests_total{outcome="length"}'] == 1
    assert 'calculet_requests_total{outcome="length"}' not in samples(b.render())
