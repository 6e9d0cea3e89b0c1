"""`calculet inspect`: what a calbin holds (`calculet validate` is calculet/validation.py, `calculet plan` planner/).

calculet/inspection.py registers this parser and adds `--provider` (node placement, measured through
the runtime, which calbin/ must not import).

Each subcommand registers itself with one small `_add_<name>(sub)` function and sets
`func(args) -> int`. Heavy imports stay inside the `_run_<name>` functions so `calculet --help`
stays fast. A bad calbin raises `ModelError`; the top-level CLI prints it on one line (exit 2).
"""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    return _add_inspect(sub)


# ---- inspect ----------------------------------------------------------------------------------

def _add_inspect(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "inspect", help="what a calbin holds: summary, graph I/O, op inventory, memory plan, quantization",
        description="Describe a calbin without running it: manifest summary, each graph's inputs and outputs, "
                    "op inventory per graph (standard ONNX vs ONNX Runtime ops, shape families), the memory "
                    "plan and the quantization policy per module.")
    p.add_argument("calbin", metavar="CALBIN", help="the calbin folder")
    p.add_argument("--json", action="store_true", help="print the InspectReport as JSON")
    p.set_defaults(func=_run_inspect)
    return p


def _run_inspect(args: argparse.Namespace) -> int:
    from calculet.calbin.inspect import inspect_calbin
    from calculet.calbin.inspect_render import render_text

    report = inspect_calbin(args.calbin)
    print(report.to_json_text() if args.json else render_text(report))
    return 0


# ---- shared -----------------------------------------------------------------------------------
