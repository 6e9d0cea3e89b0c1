"""`calculet reference make`, `calculet compare`, `calculet eval perplexity`.

    calculet reference make [SOURCE] -o ref.npz --prompts 100 --tokens 32 [--long] [--context C]
    calculet compare model.calbin --reference ref.npz [--calbin2 other.calbin] [--min-agreement 0.9]
    calculet compare model.calbin --probe [--source SOURCE]
    calculet eval perplexity model.calbin [--text FILE] | --reference SOURCE

Exit codes: 0 pass, 1 a threshold failed, 2 bad input or a failed run.
"""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(sub) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    ref = sub.add_parser("reference", help="reference sets from the transformers model (reference extra)")
    ref_sub = ref.add_subparsers(dest="reference_command", metavar="ACTION")
    make = ref_sub.add_parser("make", help="greedy tokens and per-step top-k logits for many prompts", formatter_class=fmt)
    make.add_argument("source", nargs="?", default=None, help="Hugging Face folder or .gguf file; omit for the embedded default model")
    make.add_argument("-o", "--output", default="reference.npz", help="output .npz file")
    make.add_argument("--prompts", type=int, default=100, help="number of distinct prompts")
    make.add_argument("--tokens", type=int, default=32, help="greedy steps per prompt")
    make.add_argument("--topk", type=int, default=10, help="logits kept per step")
    make.add_argument("--long", action="store_true", help="add prompts of 4095-4097 tokens (slow on large models)")
    make.add_argument("--context", type=int, default=None,
                      help="the served context: skip prompts that cannot run in it and add the two longest that can")
    make.add_argument("--lengths", default=None, help="comma-separated prompt lengths instead of the default plan")
    make.set_defaults(func=run_reference_make)
    ref.set_defaults(func=lambda args: (ref.print_help(), 2)[1])

    cmp_ = sub.add_parser("compare", help="a calbin (or two) against a reference set; --probe localizes a divergence",
                          formatter_class=fmt)
    cmp_.add_argument("calbin", help="calbin folder")
    cmp_.add_argument("--reference", default=None, help="reference set (.npz from `calculet reference make`)")
    cmp_.add_argument("--calbin2", default=None, help="a second calbin scored against the same set")
    cmp_.add_argument("--min-agreement", type=float, default=None, help="exit 1 when teacher-forced agreement is below")
    cmp_.add_argument("--min-topk-overlap", type=float, default=None, help="exit 1 when the mean top-k overlap is below")
    cmp_.add_argument("--batch", type=int, default=1,
                      help="prompts decoded together (1: the numbers a lone request gets; more is faster)")
    cmp_.add_argument("--worst", type=int, default=10, help="worst prompts listed per calbin")
    cmp_.add_argument("--json", default=None, metavar="FILE", help="write the full report as JSON ('-': stdout, no table)")
    cmp_.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0: all cores)")
    cmp_.add_argument("--probe", action="store_true",
                      help="compare per-module hidden states of a calbin compiled with --probes against the reference")
    cmp_.add_argument("--source", default=None, help="with --probe: the model source (default: the path in the manifest)")
    cmp_.add_argument("--probe-threshold", type=float, default=0.05,
                      help="with --probe: relative error a module must exceed to be named")
    cmp_.add_argument("--probe-jump", type=float, default=4.0,
                      help="with --probe: ... and how many times the largest error before it")
    cmp_.add_argument("--probe-tokens", type=int, default=None,
                      help="with --probe: prompt length (default: the largest prefill chunk, at most 64)")
    cmp_.set_defaults(func=run_compare)

    ev = sub.add_parser("eval", help="model quality measurements")
    ev_sub = ev.add_subparsers(dest="eval_command", metavar="MEASURE")
    ppl = ev_sub.add_parser("perplexity", help="sliding-window perplexity of a calbin and/or the transformers reference",
                            formatter_class=fmt)
    ppl.add_argument("calbin", nargs="?", default=None, help="calbin folder (omit to score only --reference)")
    ppl.add_argument("--reference", default=None, metavar="SOURCE",
                     help="also score the transformers fp32 model of SOURCE (HF folder or .gguf; 'default': the embedded model)")
    ppl.add_argument("--text", default=None, help="UTF-8 text file (default: the English pydoc_data text of this Python)")
    ppl.add_argument("--max-tokens", type=int, default=4096, help="score the first N tokens of the text (0: all)")
    ppl.add_argument("--window", type=int, default=None, help="window length in tokens (default: the calbin's context, else 1024)")
    ppl.add_argument("--stride", type=int, default=None, help="tokens between window starts (default: window / 2)")
    ppl.add_argument("--windows", choices=("every-token", "last-stride"), default="every-token",
                     help="every-token: each token scored once, in the first window that ends after it; last-stride: "
                          "llama.cpp's `llama-perplexity --ppl-stride` protocol (only each window's last --stride tokens)")
    ppl.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0: all cores)")
    ppl.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON ('-': stdout)")
    ppl.set_defaults(func=run_perplexity)
    mc = ev_sub.add_parser("module-costs", formatter_class=fmt,
                           help="the error each module's quantization costs: fp32 builds with one module quantized at a time")
    mc.add_argument("source", nargs="?", default=None, help="Hugging Face folder or .gguf file; omit for the embedded default model")
    mc.add_argument("--reference", required=True, help="reference set (.npz from `calculet reference make`)")
    mc.add_argument("--weights", default="default", help="the policy whose per-module formats are measured")
    mc.add_argument("--block-size", type=int, default=32, help="quantization block size")
    mc.add_argument("--context", type=int, default=None, help="context of the builds (default: what the set's longest prompt needs)")
    mc.add_argument("--json", default=None, metavar="FILE", help="write the rows as JSON ('-': stdout)")
    mc.set_defaults(func=run_module_costs)
    ev.set_defaults(func=lambda args: (ev.print_help(), 2)[1])


def _progress(total: int, desc: str, unit: str):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, leave=False, mininterval=0.5, delay=1.0, file=sys.stderr)


def _lengths(text: str | None) -> tuple[int, ...] | None:
    from calculet.errors import RequestError

    if not text:
        return None
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise RequestError("bad_option", f"--lengths must be comma-separated integers like 1,2,16, got {text!r}") from None


def run_reference_make(args) -> int:
    from calculet.reference.sets import check_output_path, make_reference_set, write_reference_set
    from calculet.sources.resolve import load_source

    check_output_path(args.output)  # before the (long) reference run
    source = load_source(args.source)
    with _progress(args.prompts, "reference (transformers fp32)", "prompt") as bar:
        refset = make_reference_set(source, args.prompts, args.tokens, args.topk, long=args.long, context=args.context,
                                    lengths=_lengths(args.lengths), progress=bar)
    path = write_reference_set(refset, args.output)
    lengths = sorted({p.input_ids.size for p in refset.prompts})
    print(f"wrote {path}: {len(refset.prompts)} prompts x {refset.tokens} tokens, top-{refset.topk}; "
          f"lengths {lengths[:12]}{' ...' if len(lengths) > 12 else ''}; {len(refset.skipped)} lengths skipped")
    return 0


def run_compare(args) -> int:
    from calculet.errors import RequestError
    from calculet.numerics.compare import Thresholds, compare_calbin
    from calculet.numerics.render import render
    from calculet.reference.sets import read_reference_set

    th = Thresholds(args.min_agreement, args.min_topk_overlap)
    if args.probe:
        return run_probe(args)
    if args.reference is None:
        raise RequestError("bad_option", "compare needs --reference FILE (a set from `calculet reference make`), or --probe")
    refset = read_reference_set(args.reference)
    reports = []
    for path in [args.calbin] + ([args.calbin2] if args.calbin2 else []):
        with _progress(len(refset.prompts), f"compare {path}", "prompt") as bar:
            reports.append(compare_calbin(path, refset, args.batch, args.threads, bar))
    doc = {"reports": [r.to_dict(th) for r in reports], "passed": all(not r.failures(th) for r in reports)}
    if args.json == "-":
        print(json.dumps(doc, indent=1))
    else:
        print(render(reports, th, args.worst))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
    return 0 if doc["passed"] else 1


def _text(path: str | None) -> tuple[str, str]:
    from calculet.reference.texts import english_docs_text

    if path is None:
        return english_docs_text(), f"pydoc_data.topics (Python {sys.version.split()[0]})"
    with open(path, encoding="utf-8") as f:
        return f.read(), path


def run_perplexity(args) -> int:
    from calculet.errors import RequestError
    from calculet.numerics import perplexity as P

    if args.calbin is None and args.reference is None:
        raise RequestError("bad_option", "give a CALBIN, --reference SOURCE, or both")
    text, text_name = _text(args.text)
    device = tokenizer_json = bos = None
    results = []
    try:
        if args.calbin is not None:
            from calculet.runtime.device import Device
            from calculet.runtime.program import DeviceConfig

            device = Device(DeviceConfig(threads=args.threads))
            device.configure(device.load(args.calbin))
            tok = device.program.manifest.tokenizer
            tokenizer_json = (device.program.path / tok.file).read_text()
            bos = tok.bos_token_id if tok.add_bos_token else None
        source = model = None
        if args.reference is not None:
            from calculet.reference.hf import build_reference_model
            from calculet.reference.prompts import bos_id_for
            from calculet.sources.resolve import load_source

            source = load_source(None if args.reference == "default" else args.reference)
            model = build_reference_model(source)
            if tokenizer_json is None:  # a calbin's tokenizer wins, so both score the same ids
                tokenizer_json, bos = source.tokenizer_json, bos_id_for(source)
        window = args.window or (device.lanes.context if device is not None else 1024)
        stride = args.stride or max(1, window // 2)
        ids = P.text_ids(tokenizer_json, text, bos, args.max_tokens)
        windows = P.WINDOW_PROTOCOLS[args.windows](len(ids), window, stride)
        scored = sum(w.end - w.score_from for w in windows)
        if device is not None:
            with _progress(scored, f"perplexity {args.calbin}", "tok") as bar:
                lps = P.calbin_logprobs(device, ids, windows, bar)
            policy = device.program.manifest.quantization.policy
            results.append(P.result(f"{args.calbin} ({policy})", lps, window, stride))
        if model is not None:
            with _progress(scored, "perplexity (transformers fp32)", "tok") as bar:
                lps = P.reference_logprobs(model, ids, windows, bar)
            results.append(P.result(f"{source.path} (transformers fp32)", lps, window, stride))
    finally:
        if device is not None:
            device.close()
    doc = {"text": text_name, "tokens": len(ids), "window": window, "stride": stride, "windows": args.windows,
           "results": [r.to_dict() for r in results]}
    if args.json == "-":
        print(json.dumps(doc, indent=1))
        return 0
    print(f"text: {text_name}, {len(ids)} tokens, window {window}, stride {stride}, {len(windows)} windows ({args.windows})")
    for r in results:
        print(f"  {r.model:60} perplexity {r.perplexity:10.4f}   nll/token {r.nll:.5f}   ({r.tokens_scored} scored)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


def _probe_ids(program, n: int | None) -> list[int]:
    """A prompt of natural text (several passages) in the calbin's own tokenizer, BOS first when used."""
    from tokenizers import Tokenizer

    from calculet.errors import RequestError
    from calculet.reference.texts import PASSAGES

    largest = program.prefill_graphs[-1].tokens
    n = n if n is not None else min(largest, 64)
    if not 1 <= n <= largest:
        raise RequestError("bad_option", f"--probe-tokens must be in 1..{largest} (the largest prefill chunk), got {n}")
    tok = program.manifest.tokenizer
    tokenizer = Tokenizer.from_str((program.path / tok.file).read_text())
    ids = [tok.bos_token_id] if tok.add_bos_token and tok.bos_token_id is not None else []
    ids += tokenizer.encode("\n\n".join(body for _, body in PASSAGES), add_special_tokens=False).ids
    return [t for t in ids if t < program.vocab_size][:n]


def run_probe(args) -> int:
    from calculet.errors import RequestError
    from calculet.numerics.probe import probe_calbin
    from calculet.runtime.program import Program
    from calculet.sources.resolve import load_source

    program = Program(args.calbin)
    source_path = args.source or program.manifest.model.source.path
    if not source_path:
        raise RequestError("bad_option", "--probe needs the model source: pass --source SOURCE")
    ids = _probe_ids(program, args.probe_tokens)
    report = probe_calbin(args.calbin, load_source(source_path), ids, args.probe_threshold, args.probe_jump, args.threads)
    if args.json == "-":
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print(report.render())
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report.to_dict(), f, indent=1)
    return 0 if report.first_bad is None else 1


def run_module_costs(args) -> int:
    from calculet.compiler.options import CompileOptions
    from calculet.numerics.module_costs import module_costs, plan_rows, render
    from calculet.reference.sets import read_reference_set

    refset = read_reference_set(args.reference)
    need = max(p.input_ids.size for p in refset.prompts) + refset.tokens - 1
    context = args.context or max(64, -(-need // 64) * 64)
    chunks = tuple(c for c in (16, 128) if c <= context)
    base = CompileOptions(lanes=1, context=context, prefill_chunks=chunks, golden=False, decode_lanes=(),
                          block_size=args.block_size)
    rows = len(plan_rows(args.weights, args.block_size, tied=False)) + 1
    with _progress(rows, f"module costs ({args.weights})", "build") as bar:
        costs = module_costs(args.source, refset, args.weights, base, bar)
    doc = {"policy": args.weights, "context": context,
           "rows": [{"row": c.row, "format": c.format, **c.summary} for c in costs]}
    if args.json == "-":
        print(json.dumps(doc, indent=1))
        return 0
    print(f"per-module cost of --weights {args.weights} against {args.reference} ({len(refset.prompts)} prompts x "
          f"{refset.tokens} tokens; builds: fp32 + one module)")
    print(render(costs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0
