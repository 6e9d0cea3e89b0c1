"""The default model's greedy tokens against the transformers reference at long prompts (issue 13).

    python benchmarks/long_context_parity.py [--lengths 4095,4096,4097] [--tokens 32] [--chunk 1024] [--rings|--no-rings]

Compiles the default model (Gemma 3 270M) with the fp32 policy at a context that holds the longest
prompt plus the generated tokens (the 15 sliding-window layers then keep KV rings of 512 + 128
rows), prompts it with text of exactly each length (`reference.sets.plan_prompts`), and compares
`--tokens` greedy tokens with `reference.hf.reference_greedy`. A numerics check, not a timing: the
reference runs take minutes per prompt on a small CPU, which is why the test suite
(tests/test_long_context.py) stops at 1,024 tokens. Exit status 1 when any prompt differs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="4095,4096,4097", help="prompt lengths in tokens (comma-separated)")
    p.add_argument("--tokens", type=int, default=32, help="greedy tokens compared per prompt")
    p.add_argument("--chunk", type=int, default=1024,
                   help="reference prefill chunk in tokens (bounds its attention matrix; same tokens)")
    p.add_argument("--rings", action=argparse.BooleanOptionalAction, default=True,
                   help="sliding-window layers on KV rings (default) or full-context buffers")
    args = p.parse_args(argv)
    lengths = tuple(int(n) for n in args.lengths.split(",") if n.strip())

    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions
    from calculet.engine.local import LocalEngine
    from calculet.engine.requests import GenerationRequest
    from calculet.engine.sampler import SamplerConfig
    from calculet.engine.tokenizer import TextTokenizer
    from calculet.reference.hf import build_reference_model, reference_greedy
    from calculet.reference.sets import plan_prompts
    from calculet.runtime.device import Device
    from calculet.sources.resolve import load_source

    context = -(-(max(lengths) + args.tokens) // 128) * 128
    with tempfile.TemporaryDirectory() as tmp:
        options = CompileOptions(lanes=1, context=context, weights="fp32", golden=False, kv_rings=args.rings)
        path = compile_calbin(None, Path(tmp) / "m.calbin", options, log=print)
        device = Device()
        device.configure(device.load(path))
        m = device.program.manifest
        print(f"context {context}; KV ring {m.kv.ring} rows on layers {list(m.kv.ring_layers)}; "
              f"{m.kv.bytes_per_lane / 2**20:.2f} MiB KV per lane")
        planned, _ = plan_prompts((path / m.tokenizer.file).read_text(), m.tokenizer.bos_token_id, m.spec.vocab_size,
                                  len(lengths), lengths)
        reference = build_reference_model(load_source(None))
        tokenizer = TextTokenizer.from_program(device.program)
        failures = 0
        with LocalEngine(device, tokenizer) as local:
            for prompt in planned:
                ids = list(prompt.input_ids)
                t0 = time.perf_counter()
                ours = list(local.submit(GenerationRequest(tuple(ids), SamplerConfig(temperature=0.0), args.tokens,
                                                           ignore_eos=True)).result().outputs[0].token_ids)
                t1 = time.perf_counter()
                ref = reference_greedy(reference, ids, args.tokens, prefill_chunk=args.chunk)
                t2 = time.perf_counter()
                same = ours == ref
                failures += not same
                first = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
                print(f"{prompt.name:<24} {len(ids):>6} tokens  {'equal' if same else f'DIFFER at token {first}'}"
                      f"  (calculet {t1 - t0:.1f} s, reference {t2 - t1:.1f} s)")
        device.close()
    print(f"{len(planned) - failures} of {len(planned)} prompts give the reference's {args.tokens} greedy tokens")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
