"""`calculet validate | inspect`: commands that read a calbin (`calculet plan` is in planner/).

Each subcommand registers itself with one small `_add_<name>(sub)` function and sets
`func(args) -> int`. Heavy imports stay inside the `_run_<name>` functions so `calculet --help`
stays fast. Bad input raises `RequestError`; the top-level CLI prints it on one line (exit 2).
"""

from __future__ import annotations

import argparse

from calculet.errors import RequestError


def add_parser(sub: argparse._SubParsersAction) -> None:
    _add_validate(sub)
    _add_inspect(sub)


# ---- validate ---------------------------------------------------------------------------------

def _add_validate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate", help="check a calbin: files, manifest, contract, memory plan, graphs, numerics (gates A-F)",
        description="Run gates A-F over a calbin and print one line per check. Exit 0 on pass, 1 on warnings "
                    "with --strict, 2 on failure or when the path is not a calbin.",
        epilog="gates: A files, B manifest, C contract (manifest == graphs == tokenizer), D memory plan, "
               "E graphs (ONNX checker, shape inference, op inventory), F numerics (golden prompts through the "
               "runtime; runs when golden/ is present)")
    p.add_argument("calbin", metavar="CALBIN", help="the calbin folder")
    p.add_argument("--full-hash", action="store_true", help="also compare the SHA-256 of every file (reads every byte)")
    p.add_argument("--fast", action="store_true", help="skip gate F and the full hash: structure only, a few seconds")
    p.add_argument("--strict", action="store_true", help="exit 1 when there are warnings")
    p.add_argument("--json", metavar="OUT", default=None, help="also write the report as JSON to OUT ('-': print JSON only)")
    p.set_defaults(func=_run_validate)


def _run_validate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from calculet.calbin.validate import ValidationOptions, render_table, validate_calbin

    if args.fast and args.full_hash:
        raise RequestError("bad_argument", "--fast skips the full hash; pass either --fast or --full-hash, not both")
    options = ValidationOptions(full_hash=args.full_hash, numerics=not args.fast)
    report = validate_calbin(args.calbin, options)
    if args.json == "-":
        print(report.to_json_text())
    else:
        print(render_table(report))
        if args.json is not None:
            Path(args.json).write_text(report.to_json_text() + "\n")
    return report.exit_code(strict=args.strict)


# ---- inspect ----------------------------------------------------------------------------------

def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect", help="what a calbin holds: summary, graph I/O, op inventory, memory plan, quantization",
        description="Describe a calbin without running it: manifest summary, each graph's inputs and outputs, "
                    "op inventory per graph (standard ONNX vs ONNX Runtime ops, shape families), the memory "
                    "plan and the quantization policy per module.")
    p.add_argument("calbin", metavar="CALBIN", help="the calbin folder")
    p.add_argument("--json", action="store_true", help="print the InspectReport as JSON")
    p.set_defaults(func=_run_inspect)


def _run_inspect(args: argparse.Namespace) -> int:
    from calculet.calbin.inspect import inspect_calbin
    from calculet.calbin.inspect_render import render_text

    report = inspect_calbin(args.calbin)
    print(report.to_json_text() if args.json else render_text(report))
    return 0


# ---- shared -----------------------------------------------------------------------------------
