"""Fault injection for testing recovery for real: fail chosen job kinds at chosen counts.

Set `CALCULET_FAULT=decode:5` (fail the 5th decode job), `prefill:2`, or `decode:5:3` (fail the
5th, 6th and 7th). Off by default. The failure happens inside the worker exactly where a real
execution-provider error would, and surfaces as a DeviceError with code `injected_fault`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from calculet.errors import RequestError

ENV = "CALCULET_FAULT"


@dataclass
class FaultPlan:
    kind: str
    after: int
    count: int = 1
    seen: int = 0

    @staticmethod
    def parse(text: str | None) -> "FaultPlan | None":
        if not text:
            return None
        parts = text.split(":")
        try:
            kind, after = parts[0], int(parts[1])
            count = int(parts[2]) if len(parts) > 2 else 1
        except (IndexError, ValueError):
            raise RequestError("bad_fault_spec", f"{ENV}={text!r}: expected KIND:N[:COUNT], e.g. decode:5") from None
        if kind not in ("prefill", "decode") or after < 1 or count < 1:
            raise RequestError("bad_fault_spec", f"{ENV}={text!r}: expected KIND:N[:COUNT] with KIND prefill or decode and N, COUNT >= 1")
        return FaultPlan(kind, after, count)

    @staticmethod
    def from_env() -> "FaultPlan | None":
        return FaultPlan.parse(os.environ.get(ENV))

    def should_fail(self, kind: str) -> bool:
        if kind != self.kind:
            return False
        self.seen += 1
        return self.after <= self.seen < self.after + self.count
