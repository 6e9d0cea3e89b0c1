"""`validate_calbin(path, options, later) -> ValidationReport`: run gates A–E (and `later` ones) over a calbin.

    read manifest.json ─▶ A files ─▶ B manifest ─┬─▶ C contract ─▶ D memory ─▶ E graphs ─┬─▶ later (F numerics)
                                                 └ skipped when B finds the manifest unreadable   └ only when A–E pass

calbin/ holds the structural gates only. A later gate (gate F, golden numerics, needs the runtime)
is passed in by a higher layer: `calculet.validation` is what `calculet validate` runs.

A folder that is not a calbin, or a manifest.json that is not a JSON object, raises `ModelError`:
there is nothing to judge. Everything else becomes a check in the report. A gate that stumbles over
a malformed manifest in a way no rule foresaw reports `<gate>.unreadable` instead of a traceback.
"""

from __future__ import annotations

import time
from pathlib import Path

from calculet.calbin.gates import GATES, schema
from calculet.calbin.gates.context import GateContext
from calculet.calbin.manifest import read_manifest_json
from calculet.calbin.validate_report import (Check, Rule, Status, ValidationOptions, ValidationReport,
                                             render_table)

__all__ = ["ValidationOptions", "ValidationReport", "all_rules", "render_table", "validate_calbin"]

_UNEXPECTED = (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError, OverflowError)


def all_rules(later: tuple = ()) -> list[Rule]:
    """Every rule, gate by gate: the stable check ids a report can hold (besides `<gate>.unreadable`)."""
    return [rule for _, module in (*GATES, *later) for rule in module.RULES]


def validate_calbin(path: str | Path, options: ValidationOptions = ValidationOptions(),
                    later: tuple = ()) -> ValidationReport:
    """Gates A–E, then each `(letter, gate)` of `later` (a gate has `RULES` and `run(ctx)`), which runs
    only when A–E pass."""
    t0 = time.perf_counter()
    folder = Path(path)
    ctx = GateContext(folder, read_manifest_json(folder), options)
    checks: list[Check] = []
    seconds: dict[str, float] = {}
    structural = {gate for gate, _ in GATES}
    for gate, module in (*GATES, *later):
        t = time.perf_counter()
        reason = _skip_reason(gate, checks, gate not in structural)
        if reason:
            checks += [rule.skip(reason) for rule in module.RULES]
        else:
            checks += _run_gate(gate, module, ctx)
        seconds[gate] = time.perf_counter() - t
    return ValidationReport(str(folder), options, tuple(checks), seconds, time.perf_counter() - t0)


def _skip_reason(gate: str, checks: list[Check], later: bool) -> str | None:
    failed = [c.id for c in checks if c.status is Status.FAIL]
    if gate not in "AB":
        blocking = [i for i in failed if i in schema.BLOCKING or i == "B.unreadable"]
        if blocking:
            return f"not run: the manifest cannot be read safely ({', '.join(blocking)} failed)"
    if later and failed:
        more = " …" if len(failed) > 4 else ""
        return f"not run: numerics are not judged on a package that fails gates A–E ({', '.join(failed[:4])}{more} failed)"
    return None


def _run_gate(gate: str, module, ctx: GateContext) -> list[Check]:
    try:
        return module.run(ctx)
    except _UNEXPECTED as exc:
        rule = Rule(f"{gate}.unreadable", "the gate could not finish on this manifest")
        return [rule.check([f"gate {gate} stopped on a malformed manifest: {type(exc).__name__}: {exc}"], "")]
