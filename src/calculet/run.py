"""`calculet run [CALBIN|SOURCE] "prompt"`: stream a completion to the terminal, then report speed.

It is `calculet.LLM(...).stream(prompt, SamplingParams(...))`: the same engine, request mapping and
generation loop as `calculet serve`, so the same request gives the same text.
"""

from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="generate text from a calbin or a source (compiled into the cache on first use)")
    p.add_argument("model_or_prompt", nargs="+", metavar="[MODEL] PROMPT",
                   help="a calbin, HF folder or .gguf file (omit for the default model), then the prompt")
    p.add_argument("--max-tokens", type=int, default=128, help="at most this many tokens (cut to what fits the context)")
    p.add_argument("--min-tokens", type=int, default=0, help="EOS and --stop-token-ids cannot end the output before this")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop before this text (repeat for several); it is not printed")
    p.add_argument("--stop-token-ids", default="", metavar="IDS", help="comma-separated token ids that end the output")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past EOS")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0 = all cores)")
    from calculet.runtime.providers import add_provider_arguments

    add_provider_arguments(p)
    p.add_argument("--full-hash", action="store_true", help="verify every file's SHA-256 before loading")
    p.add_argument("--lanes", type=int, default=None, help="when compiling a source: lanes (default 8)")
    p.add_argument("--context", type=int, default=None, help="when compiling a source: context (default: what the model was trained for, within the memory budget)")
    p.add_argument("--prefill-chunks", default=None, help="when compiling a source: chunk sizes (default 16,64,128)")
    p.add_argument("--chips", type=int, default=None,
                   help="when compiling a source: split it over this many chips (with --partition); a calbin "
                        "compiled with --chips runs on as many chips, sharing the cores")
    p.add_argument("--partition", default=None, choices=["pp", "tp", "ep"],
                   help="when compiling a source: pp, tp or ep (MoE models)")
    p.add_argument("--expert-stats", action="store_true",
                   help="mixture-of-experts calbins compiled with --expert-stats: print the tokens routed to each expert")
    p.set_defaults(func=run)


def _token_ids(text: str) -> tuple[int, ...]:
    from calculet.errors import RequestError

    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise RequestError("bad_arguments", f"--stop-token-ids must be comma-separated integers like 1,106, got {text!r}") from None


def run(args) -> int:
    from calculet.compiler.options import parse_chunks
    from calculet.engine.params import SamplingParams
    from calculet.errors import RequestError
    from calculet.llm import LLM
    from calculet.runtime.providers import parse_provider_options

    if len(args.model_or_prompt) > 2:
        raise RequestError("bad_arguments", "give at most a model and one prompt (quote the prompt)")
    model, prompt = (None, args.model_or_prompt[0]) if len(args.model_or_prompt) == 1 else args.model_or_prompt
    if args.max_tokens < 1:
        raise RequestError("bad_arguments", f"--max-tokens must be >= 1, got {args.max_tokens}")
    stop_token_ids = _token_ids(args.stop_token_ids)
    chunks = parse_chunks(args.prefill_chunks) if args.prefill_chunks else None
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    with LLM(model, log_fn=log, threads=args.threads, provider=args.provider,
             provider_options=parse_provider_options(args.provider_option), full_hash=args.full_hash, lanes=args.lanes,
             context=args.context, prefill_chunks=chunks, chips=args.chips, partition=args.partition) as llm:
        if args.expert_stats and not llm.has_expert_stats:
            raise RequestError("no_expert_stats", "this calbin has no expert statistics: compile a mixture-of-experts "
                               "model with `calculet compile ... --expert-stats`")
        prompt_ids = llm.encode(prompt)
        room = max(llm.context - len(prompt_ids), 1)   # the engine says so if the prompt leaves none
        max_tokens = min(args.max_tokens, room)        # cut to the context, as before; min_tokens with it
        min_tokens = min(args.min_tokens, max_tokens) if args.min_tokens <= args.max_tokens else args.min_tokens
        params = SamplingParams(max_tokens=max_tokens, min_tokens=min_tokens,
                                temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                                seed=args.seed, presence_penalty=args.presence_penalty,
                                frequency_penalty=args.frequency_penalty, repetition_penalty=args.repetition_penalty,
                                stop=tuple(args.stop), stop_token_ids=stop_token_ids, ignore_eos=args.ignore_eos)
        stream = llm.stream(prompt_ids, params)
        for delta in stream:
            if delta.text:
                sys.stdout.write(delta.text)
                sys.stdout.flush()
        out = stream.output
        load = llm.expert_load
    sys.stdout.write("\n")
    gen, t = out.outputs[0], out.timings
    decoded = len(gen.token_ids) - 1
    rate = decoded / t.decode_s if decoded > 0 and t.decode_s > 0 else 0.0
    print(f"[prompt tokens {out.usage.prompt_tokens} | generated {len(gen.token_ids)} ({gen.finish_reason}) | "
          f"TTFT {t.ttft_s * 1000:.0f} ms | decode {rate:.1f} tokens/s]", file=sys.stderr)
    if args.expert_stats:
        _print_expert_load(load)
    return 0


def _print_expert_load(load) -> None:
    """One line per sparse layer: tokens routed to each expert, and the busiest expert against the mean."""
    for i, row in enumerate(load if load is not None else []):
        mean = row.mean() if row.size else 0.0
        print(f"[experts, sparse layer #{i}: max/mean {row.max() / mean if mean else 0.0:.2f} | "
              + " ".join(str(int(c)) for c in row) + "]", file=sys.stderr)
