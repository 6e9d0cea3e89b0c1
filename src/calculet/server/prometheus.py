"""A small Prometheus text-format (0.0.4) writer: counters, gauges read at scrape time, histograms.

Observations come from the engine thread, scrapes from the HTTP thread; each metric has its lock.
"""

from __future__ import annotations

import math
import threading
from typing import Callable


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(x: float) -> str:
    x = float(x)
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(x)


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labelnames: tuple[str, ...] = ()):
        self.name, self.help, self.labelnames = name, help_text, tuple(labelnames)
        self._lock = threading.Lock()

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name, help_text, labelnames=()):
        super().__init__(name, help_text, labelnames)
        self._values: dict[tuple[str, ...], float] = {} if labelnames else {(): 0.0}

    def inc(self, amount: float = 1.0, *labels: str) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0.0) + amount

    def value(self, *labels: str) -> float:
        return self._values.get(labels, 0.0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return self.header() + [f"{self.name}{_labels(self.labelnames, k)} {_num(v)}" for k, v in items]


class Gauge(_Metric):
    """A value read when scraped: `read()` returns {label values: number}."""
    kind = "gauge"

    def __init__(self, name, help_text, read: Callable[[], dict[tuple[str, ...], float]], labelnames=()):
        super().__init__(name, help_text, labelnames)
        self.read = read

    def render(self) -> list[str]:
        return self.header() + [f"{self.name}{_labels(self.labelnames, k)} {_num(v)}" for k, v in sorted(self.read().items())]


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name, help_text, buckets: tuple[float, ...], labelnames=()):
        super().__init__(name, help_text, labelnames)
        self.buckets = tuple(sorted(buckets)) + (math.inf,)
        self._series: dict[tuple[str, ...], list] = {}   # labels -> [bucket counts..., sum, count]

    def observe(self, value: float, *labels: str) -> None:
        with self._lock:
            s = self._series.setdefault(labels, [0] * len(self.buckets) + [0.0, 0])
            for i, le in enumerate(self.buckets):
                if value <= le:
                    s[i] += 1
            s[-2] += value
            s[-1] += 1

    def count(self, *labels: str) -> int:
        s = self._series.get(labels)
        return s[-1] if s else 0

    def render(self) -> list[str]:
        with self._lock:
            series = sorted((k, list(v)) for k, v in self._series.items())
        lines = self.header()
        for labels, s in series:
            for le, c in zip(self.buckets, s):
                le_label = 'le="' + _num(le) + '"'
                lines.append(f"{self.name}_bucket{_labels(self.labelnames, labels, le_label)} {c}")
            lines.append(f"{self.name}_sum{_labels(self.labelnames, labels)} {_num(s[-2])}")
            lines.append(f"{self.name}_count{_labels(self.labelnames, labels)} {s[-1]}")
        return lines


class Registry:
    def __init__(self):
        self.metrics: list[_Metric] = []

    def add(self, metric: _Metric) -> _Metric:
        if any(m.name == metric.name for m in self.metrics):
            raise ValueError(f"metric {metric.name} is registered twice")
        self.metrics.append(metric)
        return metric

    def render(self) -> str:
        lines = []
        for m in self.metrics:
            lines.extend(m.render())
        return "\n".join(lines) + "\n"
