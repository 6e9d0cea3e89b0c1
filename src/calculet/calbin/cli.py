"""`calculet plan | validate | inspect`: commands that read a calbin or a model's shape.

Each subcommand registers itself with one small `_add_<name>(sub)` function and sets
`func(args) -> int`. Heavy imports stay inside the `_run_<name>` functions so `calculet --help`
stays fast. Bad input raises `RequestError`; the top-level CLI prints it on one line (exit 2).
"""

from __future__ import annotations

import argparse

from calculet.errors import RequestError


def add_parser(sub: argparse._SubParsersAction) -> None:
    _add_plan(sub)
    _add_validate(sub)
    _add_inspect(sub)


# ---- plan -------------------------------------------------------------------------------------

def _add_plan(sub: argparse._SubParsersAction) -> None:
    from calculet.calbin.plan_quant import POLICY_HELP  # tiny module: tables only

    p = sub.add_parser(
        "plan", help="capacity plan: parameters, KV cache and workspace per chip; does it fit?",
        description="Plan memory per chip from a config.json (or a folder holding one) or a GGUF "
                    "file's metadata, without weights. Exit 0 when it fits, 1 when it does not.",
        epilog=POLICY_HELP + "\n\nsizes: 32GiB, 512MiB (binary) or 16GB (decimal); a unit is "
               "required.", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", metavar="CONFIG_OR_SOURCE",
                   help="config.json, a folder with config.json, or a .gguf file")
    p.add_argument("--lanes", default="1", help="batch lanes of the decode graph (default 1)")
    p.add_argument("--context", default=None,
                   help="KV positions per lane (default: the model's max_position_embeddings)")
    p.add_argument("--kv-dtype", default="bf16", help="KV cache dtype: fp32, fp16, bf16, fp8")
    p.add_argument("--weights", default="default", metavar="POLICY", help="weight policy (below)")
    p.add_argument("--block-size", default="32", help="int4 block size (default 32)")
    p.add_argument("--chips", default="1", help="tensor-parallel chips (default 1)")
    p.add_argument("--device-memory", default=None, metavar="SIZE",
                   help="memory per chip, e.g. 32GiB (required)")
    p.add_argument("--guard", default="10%", metavar="PERCENT",
                   help="share of device memory held back as a safety margin (default 10%%)")
    p.add_argument("--prefill-chunk", default="512", help="tokens per prefill chunk (default 512)")
    p.add_argument("--activation-dtype", default="bf16", help="activation dtype: fp32, fp16, bf16")
    p.add_argument("--logits-dtype", default="bf16", help="logits dtype: fp32, fp16, bf16")
    p.add_argument("--json", action="store_true", help="print the PlanReport as JSON")
    p.set_defaults(func=_run_plan)


def _run_plan(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from calculet.calbin.plan import PlanRequest, plan_capacity
    from calculet.calbin.plan_render import render_text
    from calculet.calbin.plan_source import load_hparams
    from calculet.calbin.plan_units import parse_size

    if args.device_memory is None:
        raise RequestError("bad_argument", "--device-memory is required, e.g. --device-memory 32GiB")
    # Check every argument before reading the source (a GGUF header can take seconds).
    request = PlanRequest(
        lanes=_integer(args.lanes, "--lanes"),
        context=_integer(args.context, "--context") if args.context is not None else 1,
        device_memory_bytes=parse_size(args.device_memory, what="--device-memory"),
        chips=_integer(args.chips, "--chips"),
        kv_dtype=args.kv_dtype,
        weights=args.weights,
        block_size=_integer(args.block_size, "--block-size"),
        activation_dtype=args.activation_dtype,
        logits_dtype=args.logits_dtype,
        prefill_chunk=_integer(args.prefill_chunk, "--prefill-chunk"),
        guard_fraction=_percent(args.guard, "--guard"),
    )
    hparams = load_hparams(args.source)
    if args.context is None:
        if not hparams.max_position_embeddings:
            raise RequestError("bad_argument", f"{args.source} does not state "
                               f"max_position_embeddings; pass --context")
        request = replace(request, context=hparams.max_position_embeddings)
    report = plan_capacity(hparams, request, source=str(args.source))
    print(report.to_json() if args.json else render_text(report))
    return 0 if report.fit.fits else 1


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

def _integer(text: str, flag: str) -> int:
    try:
        value = int(str(text).replace("_", "").replace(",", ""))
    except ValueError:
        raise RequestError("bad_argument", f"{flag} must be a whole number, got {text!r}") from None
    if value <= 0:
        raise RequestError("bad_argument", f"{flag} must be at least 1, got {value}")
    return value


def _percent(text: str, flag: str) -> float:
    raw = str(text).strip().removesuffix("%")
    try:
        value = float(raw)
    except ValueError:
        raise RequestError("bad_argument", f"{flag} must be a percentage like 10%, got {text!r}") from None
    if not 0.0 <= value <= 90.0:
        raise RequestError("bad_argument", f"{flag} must be from 0% to 90%, got {text!r}")
    return value / 100.0
