"""What `validate` returns: one `Check` per rule, grouped by gate, and an overall status.

    Check(id="D.overlap", gate="D", status=fail, severity=error, message=..., evidence={...})

A rule's `severity` says what breaking it costs: `error` fails the package, `warning` makes it
`pass_with_warnings`, `info` never fails (inventories). `status` is what happened this run:
pass, warn, fail, or skip (not run, and `message` says why). Check ids are stable: tests, CI
scripts and bug reports match on them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum

GATES = {
    "A": "files",
    "B": "manifest",
    "C": "contract",
    "D": "memory",
    "E": "graphs",
    "P": "partition",
    "F": "numerics",
}
MAX_PROBLEMS = 50  # problems kept in a check's evidence; the message shows the first few


class Status(str, Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Overall(str, Enum):
    PASS = "pass"
    PASS_WITH_WARNINGS = "pass_with_warnings"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    id: str                 # "<gate>.<rule>", e.g. "A.size"
    gate: str               # "A".."F"
    status: Status
    severity: Severity
    message: str
    evidence: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.gate not in GATES or not self.id.startswith(self.gate + "."):
            raise ValueError(f"check id {self.id!r} must start with its gate letter (one of {''.join(GATES)}) and a dot")

    def to_json(self) -> dict:
        return {"id": self.id, "gate": self.gate, "gate_name": GATES[self.gate], "status": self.status.value,
                "severity": self.severity.value, "message": self.message, "evidence": self.evidence}


@dataclass(frozen=True)
class Rule:
    """A rule a gate checks; `check(problems, ...)` turns what the gate found into a `Check`."""

    id: str
    description: str
    severity: Severity = Severity.ERROR

    @property
    def gate(self) -> str:
        return self.id.split(".", 1)[0]

    def check(self, problems: list[str], passed: str, evidence: dict | None = None) -> Check:
        """Pass with `passed` as the message when `problems` is empty; otherwise fail (or warn)."""
        evidence = dict(evidence or {})
        if not problems:
            return Check(self.id, self.gate, Status.PASS, self.severity, passed, evidence)
        shown = "; ".join(problems[:3])
        if len(problems) > 3:
            shown += f" (+{len(problems) - 3} more)"
        evidence["problems"] = problems[:MAX_PROBLEMS]
        if len(problems) > MAX_PROBLEMS:
            evidence["problems_total"] = len(problems)
        status = {Severity.ERROR: Status.FAIL, Severity.WARNING: Status.WARN, Severity.INFO: Status.PASS}[self.severity]
        return Check(self.id, self.gate, status, self.severity, shown, evidence)

    def skip(self, reason: str) -> Check:
        return Check(self.id, self.gate, Status.SKIP, self.severity, reason)


@dataclass(frozen=True)
class ValidationOptions:
    full_hash: bool = False     # gate A also compares SHA-256 of every file (reads every byte)
    numerics: bool = True       # gate F runs the golden prompts when golden/ is present
    chip_memory_bytes: int = 0  # gate P: each chip's memory plan must fit this (0: no budget)

    @staticmethod
    def fast() -> "ValidationOptions":
        """No full hash, no gate F: the checks that need no inference and no full read."""
        return ValidationOptions(full_hash=False, numerics=False)


@dataclass(frozen=True)
class ValidationReport:
    path: str
    options: ValidationOptions
    checks: tuple[Check, ...]
    gate_seconds: dict[str, float]
    seconds: float

    @property
    def status(self) -> Overall:
        if any(c.status is Status.FAIL for c in self.checks):
            return Overall.FAIL
        if any(c.status is Status.WARN for c in self.checks):
            return Overall.PASS_WITH_WARNINGS
        return Overall.PASS

    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status is Status.FAIL]

    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status is Status.WARN]

    def failed_ids(self) -> set[str]:
        return {c.id for c in self.failed()}

    def check(self, check_id: str) -> Check:
        for c in self.checks:
            if c.id == check_id:
                return c
        raise KeyError(f"no check {check_id!r} in this report; ids: {[c.id for c in self.checks]}")

    def exit_code(self, strict: bool = False) -> int:
        """0 pass, 1 warnings under strict, 2 fail."""
        status = self.status
        if status is Overall.FAIL:
            return 2
        if status is Overall.PASS_WITH_WARNINGS and strict:
            return 1
        return 0

    def counts(self) -> dict[str, int]:
        return {s.value: sum(1 for c in self.checks if c.status is s) for s in Status}

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "status": self.status.value,
            "options": {"full_hash": self.options.full_hash, "numerics": self.options.numerics},
            "counts": self.counts(),
            "seconds": round(self.seconds, 4),
            "gate_seconds": {g: round(s, 4) for g, s in self.gate_seconds.items()},
            "checks": [c.to_json() for c in self.checks],
        }

    def to_json_text(self) -> str:
        return json.dumps(self.to_json(), indent=1, default=str)


def render_table(report: ValidationReport) -> str:
    """A fixed-width table, one line per check, then the overall line."""
    rows = [(c.id, c.status.value.upper() if c.status is not Status.PASS else "pass", c.message) for c in report.checks]
    w_id = max(len(r[0]) for r in rows) if rows else 8
    lines = [f"validate {report.path}", f"{'check':<{w_id}}  {'status':<6}  message"]
    gate = None
    for c, (cid, status, message) in zip(report.checks, rows):
        if c.gate != gate:
            gate = c.gate
            lines.append(f"-- gate {gate}: {GATES[gate]} ({report.gate_seconds.get(gate, 0.0):.2f} s)")
        lines.append(f"{cid:<{w_id}}  {status:<6}  {message}")
    n = report.counts()
    lines.append(f"overall: {report.status.value} ({n['pass']} passed, {n['warn']} warnings, {n['fail']} failed, "
                 f"{n['skip']} skipped) in {report.seconds:.2f} s")
    return "\n".join(lines)
