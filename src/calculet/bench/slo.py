"""Service-level objectives for goodput: `ttft=500ms,tpot=50ms,e2e=10s`.

A request is *good* when it succeeded and every latency named in the SLO is at or below its limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from calculet.errors import RequestError

_UNITS = {"ms": 1e-3, "s": 1.0, "us": 1e-6}
_ITEM = re.compile(r"^\s*(ttft|tpot|e2e)\s*=\s*([0-9]*\.?[0-9]+)\s*(ms|s|us)\s*$")


@dataclass(frozen=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise RequestError("bad_slo", f"SLO {name} must be > 0, got {value}")

    @property
    def empty(self) -> bool:
        return self.ttft_s is None and self.tpot_s is None and self.e2e_s is None

    def describe(self) -> str:
        parts = [f"{n}≤{v * 1e3:g}ms" for n, v in
                 (("TTFT", self.ttft_s), ("TPOT", self.tpot_s), ("E2E", self.e2e_s)) if v is not None]
        return ", ".join(parts) or "none"

    def met(self, ttft_s: float | None, tpot_s: float | None, e2e_s: float) -> bool:
        """Whether one successful request's latencies meet every limit set here."""
        if self.ttft_s is not None and (ttft_s is None or ttft_s > self.ttft_s):
            return False
        # A one-token answer has no TPOT; it cannot break a TPOT limit.
        if self.tpot_s is not None and tpot_s is not None and tpot_s > self.tpot_s:
            return False
        if self.e2e_s is not None and e2e_s > self.e2e_s:
            return False
        return True


def parse_slo(text: str | None) -> Slo:
    """Parse `ttft=500ms,tpot=50ms` (units ms, s or us; names ttft, tpot, e2e)."""
    if not text:
        return Slo()
    values: dict[str, float] = {}
    for item in text.split(","):
        match = _ITEM.match(item)
        if not match:
            raise RequestError(
                "bad_slo",
                f"SLO item {item.strip()!r} is not NAME=NUMBER UNIT with NAME in ttft, tpot, e2e "
                "and UNIT in ms, s, us (e.g. ttft=500ms,tpot=50ms)",
            )
        name, number, unit = match.groups()
        if name + "_s" in values:
            raise RequestError("bad_slo", f"SLO names {name} twice in {text!r}")
        values[name + "_s"] = float(number) * _UNITS[unit]
    return Slo(**values)
