"""ServerMetrics on prometheus-client: names, labels (a `model` label per served model), cumulative
buckets, label escaping, gauges read when scraped, and one registry per server."""

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
    server = ServerMetrics()
    m = server.for_model("a")
    for e2e in (0.004, 0.3, 500.0):
        m.finished("stop", e2e)
    m.device_error('odd"code\\x')
    m.admitted(0.02, 7)
    text = server.render()
    s = samples(text)
    assert "# TYPE calculet_requests_total counter" in text.splitlines()
    assert "# TYPE calculet_e2e_request_latency_seconds histogram" in text.splitlines()
    assert "_created" not in text   # the samples /metrics always had, no creation timestamps
    assert s['calculet_requests_total{model="a",outcome="stop"}'] == 3
    assert s['calculet_device_errors_total{code="odd\\"code\\\\x",model="a"}'] == 1
    assert s['calculet_prompt_tokens_total{model="a"}'] == 7 and "calculet_generation_tokens_total" not in s
    # cumulative buckets: as many as LATENCY_BUCKETS plus +Inf, counting 1, then 2 from 0.5 s on, then 3 at +Inf
    buckets = {k: v for k, v in s.items() if k.startswith("calculet_e2e_request_latency_seconds_bucket")}
    assert len(buckets) == len(LATENCY_BUCKETS) + 1
    assert s['calculet_e2e_request_latency_seconds_bucket{le="0.005",model="a"}'] == 1
    assert s['calculet_e2e_request_latency_seconds_bucket{le="0.25",model="a"}'] == 1
    assert s['calculet_e2e_request_latency_seconds_bucket{le="0.5",model="a"}'] == 2
    assert s['calculet_e2e_request_latency_seconds_bucket{le="120.0",model="a"}'] == 2
    assert s['calculet_e2e_request_latency_seconds_bucket{le="+Inf",model="a"}'] == 3
    assert s['calculet_e2e_request_latency_seconds_count{model="a"}'] == 3
    assert abs(s['calculet_e2e_request_latency_seconds_sum{model="a"}'] - 500.304) < 1e-9


def test_gauges_are_read_when_scraped():
    server = ServerMetrics()
    s = samples(server.render())
    assert not any(k.startswith(("calculet_healthy", "calculet_lanes_in_use")) for k in s)   # no model yet
    assert not any(k.startswith("calculet_device_padding_efficiency") for k in s)   # nothing computed yet
    state = {"snapshot": EngineSnapshot("ready", 2, 1, 1, 3, 5, 8, burst_held=2), "healthy": True}
    server.watch("a", lambda: state["snapshot"], lambda: state["healthy"])
    server.for_model("a").job("prefill", PhaseTimings(infer=0.01, computed_tokens=16), useful_tokens=12)
    s = samples(server.render())
    assert (s['calculet_healthy{model="a"}'], s['calculet_requests_running{model="a"}'],
            s['calculet_requests_waiting{model="a"}']) == (1, 2, 1)
    assert (s['calculet_lanes_in_use{model="a"}'], s['calculet_lanes_free{model="a"}'],
            s['calculet_lanes_total{model="a"}']) == (3, 5, 8)
    assert s['calculet_sequences_burst_held{model="a"}'] == 2
    assert s['calculet_device_padding_efficiency{kind="prefill",model="a"}'] == 0.75
    assert s['calculet_device_phase_seconds_count{kind="prefill",model="a",phase="infer"}'] == 1
    assert s['calculet_device_phase_seconds_count{kind="prefill",model="a",phase="queued"}'] == 1
    state["healthy"] = False
    assert samples(server.render())['calculet_healthy{model="a"}'] == 0


def test_each_model_has_its_own_series_and_unwatch_drops_its_gauges():
    """Two models report into one registry under their own `model` label; an unloaded model's
    gauges go while its counters stay."""
    server = ServerMetrics()
    for name, lanes in (("a", 4), ("b", 2)):
        server.watch(name, lambda lanes=lanes: EngineSnapshot("ready", 0, 0, 0, 0, lanes, lanes), lambda: True)
    server.for_model("a").finished("stop", 0.1)
    server.for_model("b").finished("length", 0.1)
    server.for_model("b").finished("length", 0.2)
    s = samples(server.render())
    assert s['calculet_lanes_total{model="a"}'] == 4 and s['calculet_lanes_total{model="b"}'] == 2
    assert s['calculet_requests_total{model="a",outcome="stop"}'] == 1
    assert s['calculet_requests_total{model="b",outcome="length"}'] == 2
    assert 'calculet_requests_total{model="a",outcome="length"}' not in s
    server.unwatch("b")
    s = samples(server.render())
    assert 'calculet_lanes_total{model="b"}' not in s and s['calculet_lanes_total{model="a"}'] == 4
    assert s['calculet_requests_total{model="b",outcome="length"}'] == 2


def test_each_server_has_its_own_registry():
    """Guards against registering into prometheus-client's global registry: a second ServerMetrics in
    the same process would raise 'Duplicated timeseries' there, or share the first one's counts."""
    a, b = ServerMetrics(), ServerMetrics()
    a.for_model("m").finished("length", 1.0)
    assert samples(a.render())['calculet_requests_total{model="m",outcome="length"}'] == 1
    assert 'calculet_requests_total{model="m",outcome="length"}' not in samples(b.render())


def test_step_mix_is_exposed():
    """The mixed-step budget shows in /metrics: prompt tokens and decode rows per engine step, per model."""
    m = ServerMetrics()
    for prefill, rows in ((512, 0), (48, 8), (0, 8)):
        m.for_model("m").step(prefill, rows)
    s = samples(m.render())
    assert s['calculet_step_prefill_tokens_count{model="m"}'] == 3 and s['calculet_step_prefill_tokens_sum{model="m"}'] == 560
    assert s['calculet_step_prefill_tokens_bucket{le="0.0",model="m"}'] == 1
    assert s['calculet_step_prefill_tokens_bucket{le="64.0",model="m"}'] == 2
    assert s['calculet_step_decode_rows_bucket{le="0.0",model="m"}'] == 1 and s['calculet_step_decode_rows_sum{model="m"}'] == 16
    m.for_model("m").slice_raised()
    assert samples(m.render())['calculet_step_slice_raised_total{model="m"}'] == 1
