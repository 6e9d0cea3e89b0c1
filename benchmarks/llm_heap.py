"""The in-process `calculet.LLM` with and without `settle_heap` (the load's objects frozen out of the
collector's full passes, server/heap.py), alternating, one fresh interpreter per measurement.

Each measurement loads the default model (`LLM(threads=2, settle_heap=...)`), then runs waves of 8
streams (random 200-token prompts, 128 output tokens, greedy, all submitted before any is read) and
records, inside the waves only: every generation-2 collection (`gc.callbacks`) and its duration, the
gaps between a stream's tokens (ITL) and the output tokens/s. The parent prints medians and the
worst measurement of each side.

    python benchmarks/llm_heap.py --rounds 4 --waves 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time

CHILD = "child"


def child(settle: bool, waves: int, prompt_tokens: int, output_tokens: int, model: str | None = None) -> dict:
    import gc
    import random

    from calculet import LLM, SamplingParams

    llm = LLM(model, threads=2, settle_heap=settle)
    vocab = llm._device.program.vocab_size
    frozen = gc.get_freeze_count()
    passes: list[float] = []
    started: list[float] = []
    recording = False

    def on_gc(phase, info):
        if info.get("generation") != 2 or not recording:
            return
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            passes.append(time.perf_counter() - started.pop())

    gc.callbacks.append(on_gc)
    params = SamplingParams(max_tokens=output_tokens, min_tokens=output_tokens, ignore_eos=True, temperature=0)
    rng = random.Random(7)
    gaps: list[float] = []
    tokens, wall = 0, 0.0
    for wave in range(waves + 1):   # wave 0 warms up and is not recorded
        prompts = [[rng.randrange(vocab // 10, vocab) for _ in range(prompt_tokens)] for _ in range(8)]
        arrivals: list[list[float]] = [[] for _ in prompts]
        recording = wave > 0
        t0 = time.perf_counter()
        streams = [llm.stream(p, params) for p in prompts]

        def read(i):
            for delta in streams[i]:
                arrivals[i] += [time.perf_counter()] * len(delta.token_ids)

        readers = [threading.Thread(target=read, args=(i,)) for i in range(len(prompts))]
        for t in readers:
            t.start()
        for t in readers:
            t.join()
        recording = False
        if wave:
            wall += time.perf_counter() - t0
            tokens += sum(len(a) for a in arrivals)
            gaps += [b - a for arr in arrivals for a, b in zip(arr, arr[1:]) if b > a]
    llm.close()
    gc.callbacks.remove(on_gc)
    gaps.sort()
    return {"settle": settle, "frozen": frozen, "gen2_passes": len(passes),
            "gen2_ms_total": sum(passes) * 1e3, "gen2_ms_max": max(passes, default=0.0) * 1e3,
            "itl_p99_ms": gaps[int(0.99 * (len(gaps) - 1))] * 1e3 if gaps else 0.0,
            "tok_s": tokens / wall if wall else 0.0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4, help="alternating rounds, each one measurement per side")
    p.add_argument("--waves", type=int, default=3, help="measured waves of 8 streams per measurement")
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--model", default=None, help="a calbin or source (default: the embedded default model)")
    args = p.parse_args(argv)
    from calculet.cpu_features import detect

    cpu = detect()
    print(f"CPU: {cpu.model} ({cpu.machine}): {cpu.label}")
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for r in range(args.rounds):
        for settle in ((True, False) if r % 2 == 0 else (False, True)):
            out = subprocess.run([sys.executable, __file__, CHILD, str(int(settle)), str(args.waves),
                                  str(args.prompt_tokens), str(args.output_tokens), args.model or ""],
                                 capture_output=True, text=True, check=True).stdout
            m = json.loads(out.strip().splitlines()[-1])
            runs[settle].append(m)
            print(f"round {r + 1} settle_heap={settle}: {m}", flush=True)
    print("\n| settle_heap | objects frozen | gen-2 passes in the waves | their ms, total (max) | ITL p99 ms, median (worst) | tok/s, median (worst) |")
    print("|---|---|---|---|---|---|")
    for settle in (True, False):
        ms = runs[settle]
        med = lambda k: statistics.median(m[k] for m in ms)
        print(f"| {settle} | {int(med('frozen'))} | {[m['gen2_passes'] for m in ms]} | "
              f"{med('gen2_ms_total'):.0f} ({max(m['gen2_ms_max'] for m in ms):.0f}) | "
              f"{med('itl_p99_ms'):.1f} ({max(m['itl_p99_ms'] for m in ms):.1f}) | "
              f"{med('tok_s'):.1f} ({min(m['tok_s'] for m in ms):.1f}) |")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        settle, waves, pt, ot = bool(int(sys.argv[2])), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(child(settle, waves, pt, ot, sys.argv[6] or None)))
        sys.exit(0)
    sys.exit(main())
