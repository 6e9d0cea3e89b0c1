"""TTFT against chat turn (multi-turn) and prompt length (long-prompt): llama-server with its slot
cache, `calculet serve` with its prefix cache, and `calculet serve --no-prefix-cache`, same GGUF and
threads, one server measured at a time; a plot and a Markdown table per scenario.

    python benchmarks/vs_llamacpp/ttft.py                                  # multi-turn: 5 turns, 120 new words, 48 out
    python benchmarks/vs_llamacpp/ttft.py --scenario long-prompt --parallel 1 --slot-context 32768
                                        # buckets up to each server's own served context (llama-server: one slot)

The multi-turn conversations send the same new words to every server (same seed); each server is
resent its own earlier answers, as a chat client would. Every server sees every conversation's turn 1
fresh (different words each conversation), so only the history of the conversation itself can be
reused. Writes under --out: one scenario run per server (`calculet bench ttft-plot` redraws them),
`ttft-<scenario>.png` and `ttft-<scenario>.md`.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_llama_server import DEFAULT_CACHE, find_or_build  # noqa: E402
from run import default_gguf, free_port, served_model, start, stop, wait_ready  # noqa: E402

from calculet.bench.scenarios import SCENARIOS, ScenarioConfig, plot_ttft, read_series, run_scenario, ttft_table  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=SCENARIOS, default="multi-turn")
    parser.add_argument("--llama-server", help="llama-server binary (default: find or build one)")
    parser.add_argument("--no-llama", action="store_true", help="only the two calculet servers")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="llama.cpp build cache")
    parser.add_argument("--gguf", type=Path, help="GGUF to serve (default: the default model's; with --no-llama "
                        "also a calbin or HF folder)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for every server (default 2)")
    parser.add_argument("--parallel", type=int, default=8, help="llama-server slots (default 8)")
    parser.add_argument("--slot-context", type=int, default=1024, help="llama-server context per slot")
    parser.add_argument("--calculet-args", default="", help="extra arguments for both `calculet serve`s")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--words", type=int, default=120)
    parser.add_argument("--conversations", type=int, default=3)
    parser.add_argument("--output-tokens", type=int, default=48)
    parser.add_argument("--buckets", help="long-prompt: prompt lengths, comma-separated (default: up to the context)")
    parser.add_argument("--repeats", type=int, default=3, help="long-prompt: prompts per bucket")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for a server")
    parser.add_argument("--out", type=Path, default=Path("calculet-bench") / time.strftime("ttft-%Y%m%d-%H%M%S"))
    args = parser.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    gguf = (args.gguf or default_gguf()).expanduser()
    if not gguf.exists():   # a GGUF for every server; with --no-llama also a calbin or HF folder
        raise SystemExit(f"error: {gguf} does not exist")
    commands: dict[str, list[str]] = {}
    if not args.no_llama:
        binary = find_or_build(args.llama_server, args.cache.expanduser(), jobs=2)
        commands["llama.cpp"] = [str(binary), "-m", str(gguf), "--threads", str(args.threads), "--threads-batch",
                                 str(args.threads), "--parallel", str(args.parallel), "--ctx-size",
                                 str(args.parallel * args.slot_context), "--alias", gguf.stem, "--no-webui",
                                 "--host", "127.0.0.1"]
    model = [str(gguf)] if args.gguf else []   # none: the embedded default model, built from the same GGUF
    calculet = [sys.executable, "-m", "calculet", "serve", *model, "--threads", str(args.threads),
                *shlex.split(args.calculet_args)]
    commands["calculet"] = calculet
    commands["calculet --no-prefix-cache"] = [*calculet, "--no-prefix-cache"]
    buckets = tuple(int(b) for b in args.buckets.split(",")) if args.buckets else None

    runs = []
    for label, command in commands.items():   # one server up at a time: nothing else takes the cores
        port = free_port()
        log = args.out / (label.replace(" ", "").replace("--", "-") + ".log")
        process = start([*command, "--port", str(port)], log)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(url, process, log, args.ready_timeout)
            out = args.out / label.replace(" ", "").replace("--", "-")
            config = ScenarioConfig(args.scenario, url, served_model(url), out, label=label,
                                    output_tokens=args.output_tokens, seed=args.seed, buckets=buckets,
                                    repeats=args.repeats, turns=args.turns, words=args.words,
                                    conversations=args.conversations)
            run_scenario(config, log=lambda line: print(f"[{label}] {line}", file=sys.stderr))
            runs.append(out)
        finally:
            stop(process)
    table = ttft_table([read_series(r) for r in runs])
    (args.out / f"ttft-{args.scenario}.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    print(f"plot: {plot_ttft(runs, args.out / f'ttft-{args.scenario}.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
