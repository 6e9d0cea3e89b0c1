"""`calculet plan SOURCE --lanes N --context C --chips K --device-memory 32GiB`: capacity plan.

Heavy imports stay inside `_run` so `calculet --help` stays fast. Bad input raises `RequestError`
(or a model/source `ModelError`); the top-level CLI prints it on one line (exit 2).
"""

from __future__ import annotations

import argparse

from calculet.errors import RequestError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan", help="capacity plan: what compile would store, KV cache and workspace per chip; does it fit?",
        description="Plan memory per chip from a Hugging Face folder, its config.json or a GGUF file's "
                    "metadata, without weights. The weights are what `calculet compile` would store "
                    "with the same --weights, --block-size and passes. Exit 0 when it fits, 1 when it "
                    "does not.",
        epilog="weight policies: those of `calculet compile --weights` (its policy table, "
               "compiler/quantize.py). KV, activation and logits dtypes other than fp32 are planning "
               "assumptions for accelerators (compile writes fp32).\n\nsizes: 32GiB, 512MiB (binary) "
               "or 16GB (decimal); a unit is required.", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", metavar="SOURCE",
                   help="a Hugging Face folder, its config.json, or a .gguf file")
    p.add_argument("--lanes", default="1", help="batch lanes of the decode graph (default 1)")
    p.add_argument("--context", default=None,
                   help="KV positions per lane (default: the model's max_position_embeddings)")
    p.add_argument("--kv-dtype", default="fp32",
                   help="KV cache dtype: fp32 or fp16 (as compile --kv-dtype builds them); bf16, int8, fp8 for "
                        "accelerator planning")
    p.add_argument("--weights", default="default", metavar="POLICY", help="compile's weight policy (default: default)")
    p.add_argument("--block-size", default="32", help="int8/int4 block size (default 32)")
    p.add_argument("--no-fuse", action="append", metavar="NAME",
                   help="as compile --no-fuse (coarse-head changes the stored bytes)")
    p.add_argument("--prefill-int8-outliers", default=None, metavar="K",
                   help="as compile --prefill-int8-outliers (0: off; on a CPU with VNNI the pass stores per-column int8 "
                        "copies of qkv and gate/up; default: compile's)")
    p.add_argument("--prefill-int8-smooth", default=None, metavar="ALPHA",
                   help="as compile --prefill-int8-smooth: auto or ALPHA (0: the pass stores float32 outlier rows; "
                        "default: compile's, 0)")
    p.add_argument("--chips", default="1", help="tensor-parallel chips (default 1)")
    p.add_argument("--device-memory", default=None, metavar="SIZE",
                   help="memory per chip, e.g. 32GiB (required)")
    p.add_argument("--guard", default="10%", metavar="PERCENT",
                   help="share of device memory held back as a safety margin (default 10%%)")
    p.add_argument("--prefill-chunk", default="128", help="tokens per prefill chunk (default 128)")
    p.add_argument("--activation-dtype", default="fp32",
                   help="activation dtype: fp32 (compile); fp16, bf16 for accelerator planning")
    p.add_argument("--logits-dtype", default="fp32",
                   help="logits dtype: fp32 (compile); fp16, bf16 for accelerator planning")
    p.add_argument("--partition", default=None, choices=["pp", "tp", "ep"],
                   help="with --chips N: per-chip weights and KV as `compile --chips N --partition` writes them, and "
                        "the bytes its collectives move per decode step and per prefill chunk")
    p.add_argument("--link-bandwidth", default=None, metavar="SIZE",
                   help="with --partition: chip-to-chip bytes per second, e.g. 64GB (then collective time is shown)")
    p.add_argument("--link-latency", default=None, metavar="TIME",
                   help="with --partition: latency per collective, e.g. 5us (default 0)")
    p.add_argument("--json", action="store_true", help="print the PlanReport as JSON")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from calculet.compiler.options import parse_fusions
    from calculet.planner.plan import PlanRequest, plan_capacity
    from calculet.planner.render import render_text
    from calculet.planner.source import load_model
    from calculet.units import parse_size

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
        fusions=parse_fusions(None, args.no_fuse),
        **({} if args.prefill_int8_outliers is None else
           {"prefill_int8_outliers": _integer(args.prefill_int8_outliers, "--prefill-int8-outliers", minimum=0)}),
        **({} if args.prefill_int8_smooth is None else
           {"prefill_int8_smooth": None if args.prefill_int8_smooth == "auto" else
            _alpha(args.prefill_int8_smooth, "--prefill-int8-smooth")}),
    )
    model = load_model(args.source)
    if args.context is None:
        request = replace(request, context=model.spec.max_position_embeddings)
    report = plan_capacity(model, request, source=str(args.source))
    if args.partition:
        from calculet.planner.partition import Link, parse_latency, plan_partition

        bandwidth = parse_size(args.link_bandwidth, what="--link-bandwidth") if args.link_bandwidth else 0
        link = Link(float(bandwidth), parse_latency(args.link_latency))
        report = replace(report, partition=plan_partition(
            model.spec, args.partition, request.chips, request.lanes, request.context,
            min(request.prefill_chunk, request.context), request.weights, request.block_size, request.fusions, link))
    elif args.link_bandwidth or args.link_latency:
        raise RequestError("bad_argument", "--link-bandwidth and --link-latency price a partition: add --partition pp|tp|ep")
    print(report.to_json() if args.json else render_text(report))
    return 0 if report.fit.fits else 1


def _integer(text: str, flag: str, minimum: int = 1) -> int:
    try:
        value = int(str(text).replace("_", "").replace(",", ""))
    except ValueError:
        raise RequestError("bad_argument", f"{flag} must be a whole number, got {text!r}") from None
    if value < minimum:
        raise RequestError("bad_argument", f"{flag} must be at least {minimum}, got {value}")
    return value


def _alpha(text: str, flag: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise RequestError("bad_argument", f"{flag} must be a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise RequestError("bad_argument", f"{flag} must be in [0, 1) (0: float32 outlier channels), got {value}")
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
