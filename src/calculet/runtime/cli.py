"""`calculet run [CALBIN|SOURCE] "prompt"`: stream a completion to the terminal, then report speed."""

from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="generate text from a calbin or a source (compiled into the cache on first use)")
    p.add_argument("model_or_prompt", nargs="+", metavar="[MODEL] PROMPT",
                   help="a calbin, HF folder or .gguf file (omit for the default model), then the prompt")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0 = all cores)")
    add_provider_arguments(p)
    p.add_argument("--full-hash", action="store_true", help="verify every file's SHA-256 before loading")
    p.add_argument("--lanes", type=int, default=None, help="when compiling a source: lanes (default 8)")
    p.add_argument("--context", type=int, default=None, help="when compiling a source: context (default 1024)")
    p.add_argument("--prefill-chunks", default=None, help="when compiling a source: chunk sizes (default 16,128)")
    p.add_argument("--expert-stats", action="store_true",
                   help="mixture-of-experts calbins compiled with --expert-stats: print the tokens routed to each expert")
    p.set_defaults(func=run)


def add_provider_arguments(p) -> None:
    """--provider and --provider-option, shared by `run` and `serve`."""
    from calculet.runtime.providers import PROVIDERS

    p.add_argument("--provider", choices=sorted(PROVIDERS), default="cpu",
                   help="ONNX Runtime execution provider (default cpu); openvino needs the onnxruntime-openvino "
                        "package and a --target portable calbin (a source is compiled that way: int8 weights)")
    p.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a provider option, repeatable (openvino: device_type=CPU|GPU|NPU, cache_dir=DIR, "
                        "precision=..., load_config=JSON)")


def run(args) -> int:
    from calculet.cache import ensure_calbin
    from calculet.compiler.options import CompileOptions
    from calculet.engine.generate import generate
    from calculet.engine.sampler import SamplingParams
    from calculet.engine.tokenizer import TextTokenizer
    from calculet.errors import RequestError
    from calculet.runtime.device import Device
    from calculet.runtime.program import DeviceConfig
    from calculet.runtime.providers import SOURCE_COMPILE, parse_provider_options

    if len(args.model_or_prompt) > 2:
        raise RequestError("bad_arguments", "give at most a model and one prompt (quote the prompt)")
    model, prompt = (None, args.model_or_prompt[0]) if len(args.model_or_prompt) == 1 else args.model_or_prompt
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed)
    from calculet.compiler.options import parse_chunks

    config = DeviceConfig(args.provider, threads=args.threads, provider_options=parse_provider_options(args.provider_option))
    overrides = dict(SOURCE_COMPILE[args.provider])
    overrides |= {k: v for k, v in (("lanes", args.lanes), ("context", args.context)) if v is not None}
    if args.prefill_chunks:
        overrides["prefill_chunks"] = parse_chunks(args.prefill_chunks)
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    calbin = ensure_calbin(model, CompileOptions(**overrides), log=log)
    device = Device(config)
    try:
        program = device.load(calbin, full_hash=args.full_hash)
        tokenizer = TextTokenizer.from_program(program)  # before the sessions: keeps its parse out of the peak
        device.configure(program)
        if args.expert_stats and not any(t.name == "expert_mask" for t in program.decode_graphs[0].outputs):
            raise RequestError("no_expert_stats", "this calbin has no expert statistics: compile a mixture-of-experts "
                               "model with `calculet compile ... --expert-stats`")
        prompt_ids = tokenizer.encode_prompt(prompt)

        def emit(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        gen = generate(device, tokenizer, prompt_ids, params, args.max_tokens, on_text=emit)
        load = device.expert_load
    finally:
        device.close()
    sys.stdout.write("\n")
    print(f"[prompt tokens {gen.prompt_tokens} | generated {len(gen.tokens)} ({gen.finish_reason}) | "
          f"TTFT {gen.ttft_s * 1000:.0f} ms | decode {gen.decode_tokens_per_s:.1f} tokens/s]", file=sys.stderr)
    if args.expert_stats:
        _print_expert_load(load)
    return 0


def _print_expert_load(load) -> None:
    """One line per sparse layer: tokens routed to each expert, and the busiest expert against the mean."""
    for i, row in enumerate(load if load is not None else []):
        mean = row.mean() if row.size else 0.0
        print(f"[experts, sparse layer #{i}: max/mean {row.max() / mean if mean else 0.0:.2f} | "
              + " ".join(str(int(c)) for c in row) + "]", file=sys.stderr)
