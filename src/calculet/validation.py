"""`calculet validate`: calbin's structural gates A–E composed with gate F (golden numerics).

calbin/ must not import the runtime, the engine or the reference, so the full validator is put
together here, above all of them: gate F (`calculet/golden_gate.py`) is handed to
`calbin.validate.validate_calbin` as a later gate. Check ids and the JSON report are the same as
when every gate lived in calbin/.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from calculet import golden_gate
from calculet.calbin import validate as calbin_validate
from calculet.calbin.validate_report import Rule, ValidationOptions, ValidationReport
from calculet.errors import RequestError
from calculet.inspection import add_placement_arguments, placements

LATER_GATES = (("F", golden_gate),)


def validate_calbin(path: str | Path, options: ValidationOptions = ValidationOptions()) -> ValidationReport:
    """Gates A–F over a calbin folder."""
    return calbin_validate.validate_calbin(path, options, LATER_GATES)


def all_rules() -> list[Rule]:
    return calbin_validate.all_rules(LATER_GATES)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate", help="check a calbin: files, manifest, contract, memory plan, graphs, numerics (gates A-F)",
        description="Run gates A-F over a calbin and print one line per check. Exit 0 on pass, 1 on warnings "
                    "with --strict, 2 on failure or when the path is not a calbin.",
        epilog="gates: A files, B manifest, C contract (manifest == graphs == tokenizer), D memory plan, "
               "E graphs (ONNX checker, shape inference, op inventory), P partition (--chips N calbins), F numerics (golden prompts through the "
               "runtime; runs when golden/ is present)")
    p.add_argument("calbin", metavar="CALBIN", help="the calbin folder")
    p.add_argument("--full-hash", action="store_true", help="also compare the SHA-256 of every file (reads every byte)")
    p.add_argument("--fast", action="store_true", help="skip gate F and the full hash: structure only, a few seconds")
    p.add_argument("--strict", action="store_true", help="exit 1 when there are warnings")
    p.add_argument("--chip-memory", type=int, default=0, metavar="BYTES",
                   help="a --chips N calbin: gate P fails when a chip's memory plan exceeds BYTES (0: no budget)")
    p.add_argument("--json", metavar="OUT", default=None, help="also write the report as JSON to OUT ('-': print JSON only)")
    add_placement_arguments(p, "also report")
    p.set_defaults(func=_run_validate)


def _run_validate(args: argparse.Namespace) -> int:
    if args.fast and args.full_hash:
        raise RequestError("bad_argument", "--fast skips the full hash; pass either --fast or --full-hash, not both")
    report = validate_calbin(args.calbin, ValidationOptions(full_hash=args.full_hash, numerics=not args.fast,
                                                                    chip_memory_bytes=args.chip_memory))
    placed = placements(args.calbin, args.provider, args.provider_option) if report.exit_code() != 2 else []
    text = report.to_json_text()
    if placed:  # the report's JSON plus a "placement" list
        text = json.dumps({**json.loads(text), "placement": [p.to_dict() for p in placed]}, indent=1)
    if args.json == "-":
        print(text)
    else:
        from calculet.runtime.node_placement import render_placement

        print(calbin_validate.render_table(report))
        for p in placed:
            print(render_placement(p))
        if args.json is not None:
            Path(args.json).write_text(text + "\n")
    return report.exit_code(strict=args.strict)
