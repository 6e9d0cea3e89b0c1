"""The Prometheus text writer: cumulative buckets, labels escaped, gauges read at scrape time."""

from __future__ import annotations

from calculet.server.prometheus import Counter, Gauge, Histogram, Registry


def test_exposition_format():
    r = Registry()
    c = r.add(Counter("x_total", "things", ("kind",)))
    h = r.add(Histogram("lat_seconds", "latency", (0.1, 1.0)))
    r.add(Gauge("g", "a gauge", lambda: {(): 3}))
    c.inc(2, 'a"b')
    for v in (0.05, 0.5, 5.0):
        h.observe(v)
    lines = r.render().splitlines()
    assert "# TYPE x_total counter" in lines and 'x_total{kind="a\\"b"} 2' in lines
    assert 'lat_seconds_bucket{le="0.1"} 1' in lines and 'lat_seconds_bucket{le="1"} 2' in lines
    assert 'lat_seconds_bucket{le="+Inf"} 3' in lines and "lat_seconds_count 3" in lines
    assert "lat_seconds_sum 5.55" in lines and "g 3" in lines
