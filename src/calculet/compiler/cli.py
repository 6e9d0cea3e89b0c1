"""`calculet compile [SOURCE] -o OUT.calbin --lanes B --context C --prefill-chunks 16,64,128`."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("compile", help="compile a HF folder or GGUF file (default: the embedded Gemma 3 270M) into a calbin",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("source", nargs="?", default=None, help="Hugging Face folder or .gguf file; omit for the embedded default model")
    p.add_argument("-o", "--output", required=True, help="output calbin folder (e.g. model.calbin)")
    p.add_argument("--lanes", type=int, default=8, help="decode batch lanes (KV slots)")
    p.add_argument("--context", type=int, default=None,
                   help="context length per lane (default: what the model was trained for, cut to fit --kv-memory)")
    p.add_argument("--kv-memory", default="auto", metavar="SIZE|auto",
                   help="KV budget for all lanes, e.g. 4GiB: picks the context when --context is not given and refuses "
                        "a --context that does not fit; auto = available memory less the weights and a 2 GiB margin")
    p.add_argument("--prefill-chunks", default="16,64,128", help="comma-separated prefill chunk sizes (default 16,64,128)")
    p.add_argument("--target", default="cpu",
                   help="cpu (ONNX Runtime contrib ops: fused attention with in-place KV, int8 kernels) or "
                        "portable (standard ONNX ops only, for NPU execution providers; --weights fp32, fp16 or int8)")
    p.add_argument("--weights", default="auto",
                   help="weight policy: auto (by this CPU's ISA: default with AVX2, VNNI or AMX (without an int8 dot "
                        "product the int8 GEMMs' codes avoid 16-bit saturation), fp32 without AVX2; the reason goes "
                        "into the manifest; CALCULET_CPU_FEATURES=avx2,fma,... "
                        "simulates a CPU), default (int8 projections/lm_head/embedding with int8 compute, fp32 norms), "
                        "fp32, fp16 (half-precision weights and matmuls), int8 (weight-only: a numerics reference, "
                        "ONNX Runtime has no fast kernel for it), w8a8, int4 (weight-only), w4a8")
    p.add_argument("--block-size", type=int, default=32, help="quantization block size along K (16..256, power of two)")
    p.add_argument("--decode-lanes", default="1", help="extra decode batch sizes besides --lanes (comma-separated)")
    p.add_argument("--fuse", action="append", metavar="NAME", help="enable a fusion pass (default: all)")
    p.add_argument("--no-fuse", action="append", metavar="NAME", help="disable a fusion pass (sampling-head, or all)")
    p.add_argument("--no-golden", action="store_true", help="skip the reference run that records golden/")
    p.add_argument("--expert-stats", action="store_true",
                   help="mixture-of-experts models: bodies also output which experts each token was routed to, so "
                        "`calculet run --expert-stats` can show the load per expert")
    p.add_argument("--quant", default="", metavar="MODULE[:LAYERS]=FORMAT[/bBLOCK],...",
                   help="per-module overrides of --weights: attn, mlp (optionally per layer range, e.g. mlp:0-3=int4), "
                        "lm_head, embed, router=fp32; formats fp32, fp16, int8, int4, w8a8, w4a8; e.g. "
                        "attn=int8,mlp=int4/b32,lm_head=int8")
    p.add_argument("--probes", action="store_true",
                   help="debug build: every module's output (embedding, norms, attention, MLP, each layer) is also a "
                        "graph output, for `calculet compare --probe`")
    p.add_argument("--chips", type=int, default=1, help="split the model over this many chips (1..8; needs --partition)")
    p.add_argument("--partition", default="", choices=["", "pp", "tp", "ep"],
                   help="how --chips splits the model: pp (contiguous layer ranges, the hidden state sent chip to "
                        "chip), tp (attention heads and FFN columns split, partial outputs all-reduced) or ep "
                        "(mixture-of-experts models: routed experts split, attention replicated, expert outputs "
                        "all-reduced)")
    p.add_argument("--no-kv-ring", action="store_true",
                   help="sliding-window layers keep a full-context KV buffer (fused attention) instead of a ring of "
                        "window + largest prefill chunk rows (for A/B runs)")
    p.add_argument("--kv-dtype", default="fp32", choices=("fp32", "fp16", "bf16", "int8"),
                   help="KV cache dtype: fp32, or fp16 (half the KV bytes; cpu and portable targets); bf16 and int8 "
                        "are refused with the reason (see docs/ARCHITECTURE.md)")
    p.add_argument("--prefill-int8-outliers", type=int, default=32, metavar="K",
                   help="the prefill-int8 pass: prefill chunks run the projections that read a norm (qkv, gate/up) as a "
                        "per-token int8 GEMM, keeping the K input channels with the largest activations (calibrated on "
                        "a probe build) in float32; decode keeps the block kernels. Needs a CPU with VNNI or AMX, one "
                        "chip, --target cpu; off by itself elsewhere (default 32; 0: off)")
    p.add_argument("--decode-int8", default="gate-up", metavar="gate-up|all|off",
                   help="where the prefill-int8 pass runs on an x86 CPU without an int8 dot product (AVX2 only), the "
                        "projections decode steps run on its int8 rows too (pair-bounded codes for the u8 x s8 GEMM; the others, and "
                        "down_proj always, on the block kernels): gate-up (the default), all (qkv, o_proj and gate/up), "
                        "off. On a Zen 4's AVX2 view, against all: gate-up 0.91x the 1-lane step and 1.03x the 8-lane "
                        "one, off 0.89x and 1.10x. Elsewhere decode keeps the block kernels")
    p.add_argument("--no-decode-int8", action="store_true", help="the same as --decode-int8 off")
    p.add_argument("--prefill-int8-smooth", default="0", metavar="auto|ALPHA",
                   help="the prefill-int8 pass smooths each projection's input channels instead of keeping K of them in "
                        "float32: x / f through the int8 GEMM with W's rows times f, f = max|x|^ALPHA / max|W|^(1-ALPHA) "
                        "per channel from the calibration (SmoothQuant's migration); auto: per projection the ALPHA of "
                        "0.3..0.8 whose simulated output error on the calibration rows is least. Faster prefill, coarser "
                        "numerics (default model: 0.82x the prefill time, teacher-forced agreement 0.9675 against 0.9753; "
                        "docs/NUMERICS.md); --prefill-int8-outliers then only switches the pass on (default 0: the float32 "
                        "outlier channels)")
    p.set_defaults(func=run)


def parse_smooth(text: str) -> float | None:
    """--prefill-int8-smooth: auto (None) or an alpha (CompileOptions checks its range)."""
    if str(text).strip().lower() == "auto":
        return None
    from calculet.errors import RequestError

    try:
        return float(text)
    except ValueError:
        raise RequestError("bad_option", f"--prefill-int8-smooth must be auto or a number in [0, 1), got {text!r}") from None


def parse_kv_memory(text: str) -> int | None:
    from calculet.units import parse_size

    return None if text.strip().lower() == "auto" else parse_size(text, what="--kv-memory", minimum=1)


def run(args) -> int:
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions, parse_chunks, parse_fusions
    from calculet.compiler.quant_spec import parse_quant

    options = CompileOptions(lanes=args.lanes, context=args.context, prefill_chunks=parse_chunks(args.prefill_chunks),
                             target=args.target, weights=args.weights, block_size=args.block_size, golden=not args.no_golden,
                             decode_lanes=parse_chunks(args.decode_lanes) if args.decode_lanes else (),
                             fusions=parse_fusions(args.fuse, args.no_fuse), expert_stats=args.expert_stats,
                             probes=args.probes, quant=parse_quant(args.quant, args.block_size),
                             kv_rings=not args.no_kv_ring, kv_memory=parse_kv_memory(args.kv_memory),
                             chips=args.chips, partition=args.partition, kv_dtype=args.kv_dtype,
                             prefill_int8_outliers=args.prefill_int8_outliers,
                             prefill_int8_smooth=parse_smooth(args.prefill_int8_smooth), decode_int8="off" if args.no_decode_int8 else args.decode_int8)
    compile_calbin(args.source, args.output, options)
    return 0
