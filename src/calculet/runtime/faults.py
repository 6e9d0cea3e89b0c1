"""Fault injection for testing recovery for real: chosen faults at chosen jobs, inside the worker,
exactly where a real execution-provider failure would happen.

    CALCULET_FAULT=SPEC[,SPEC...]      SPEC = [ACTION@]PHASE:N[:COUNT]

PHASE is `prefill` or `decode` (the Nth job of that kind, counted from 1, and the COUNT-1 after
it), or `load` (the Nth session creation: configure() is the 1st, each reset() the next).
ACTION (default `fail`):

    fail        the job raises a DeviceError (code injected_fault)
    alloc       the job raises as ONNX Runtime does when an allocation fails (device_run_failed)
    hang        the job blocks until `FaultPlan.release` is set (tests set it; else for an hour),
                then finishes late, to prove a late result is fenced off
    delay=S     the job runs S seconds late (a slow job; past --job-timeout it counts as hung)
    nan, inf    the job's logits come back NaN / +inf (corrupt output: code bad_output)
    fail@load   session creation fails (code session_create_failed)
    delay=S@load  session creation takes S seconds longer (a slow load: /health says loading)

Examples: `decode:5` (the 5th decode job fails), `hang@decode:3`, `delay=0.5@prefill:1:4`,
`nan@decode:2,fail@load:2`. Off by default.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from dataclasses import dataclass

from calculet.errors import RequestError

ENV = "CALCULET_FAULT"
PHASES = ("prefill", "decode", "load")
ACTIONS = ("fail", "alloc", "hang", "delay", "nan", "inf")
HANG_S = 3600.0


@dataclass(frozen=True)
class Fault:
    action: str
    phase: str
    after: int
    count: int = 1
    delay_s: float = 0.0

    def __post_init__(self):
        if self.phase not in PHASES:
            raise ValueError(f"phase {self.phase!r}; allowed: {', '.join(PHASES)}")
        if self.action not in ACTIONS:
            raise ValueError(f"action {self.action!r}; allowed: {', '.join(ACTIONS)}")
        if self.phase == "load" and self.action not in ("fail", "delay"):
            raise ValueError("the load phase takes only the fail and delay actions")
        if self.after < 1 or self.count < 1 or self.delay_s < 0:
            raise ValueError("N and COUNT must be >= 1, a delay >= 0")

    def __str__(self) -> str:
        action = f"delay={self.delay_s:g}" if self.action == "delay" else self.action
        return f"{action}@{self.phase}:{self.after}:{self.count}"


class FaultPlan:
    def __init__(self, faults: tuple[Fault, ...]):
        self.faults = faults
        self.release = threading.Event()   # ends every injected hang
        self.hanging = threading.Event()   # set when a job enters an injected hang (tests wait on it)
        self._seen: Counter[str] = Counter()
        self._lock = threading.Lock()

    @staticmethod
    def parse(text: str | None) -> "FaultPlan | None":
        if not text:
            return None
        return FaultPlan(tuple(_parse_one(spec.strip(), text) for spec in text.split(",") if spec.strip()))

    @staticmethod
    def from_env() -> "FaultPlan | None":
        return FaultPlan.parse(os.environ.get(ENV))

    def take(self, phase: str) -> Fault | None:
        """Count one job (or session creation) of `phase`; the fault that hits it, if any."""
        with self._lock:
            self._seen[phase] += 1
            n = self._seen[phase]
        return next((f for f in self.faults if f.phase == phase and f.after <= n < f.after + f.count), None)

    def wait_released(self) -> None:
        self.hanging.set()
        self.release.wait(HANG_S)


def _parse_one(spec: str, whole: str) -> Fault:
    action, _, where = spec.rpartition("@")
    action = action or "fail"
    delay = 0.0
    try:
        if action.startswith("delay="):
            action, delay = "delay", float(action.removeprefix("delay="))
        parts = where.split(":")
        if len(parts) not in (2, 3):
            raise ValueError("expected PHASE:N[:COUNT]")
        return Fault(action, parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else 1, delay)
    except ValueError as exc:
        raise RequestError("bad_fault_spec", f"{ENV}={whole!r}: {spec!r}: {exc}; expected [ACTION@]PHASE:N[:COUNT] with "
                           f"PHASE in {', '.join(PHASES)} and ACTION in fail, alloc, hang, delay=S, nan, inf "
                           f"(e.g. decode:5, hang@decode:3, delay=0.5@prefill:1:4)") from None
