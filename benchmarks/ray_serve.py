"""Requests/s and TTFT of `calculet serve` against Ray Serve with 1 and 2 replicas, and the time Ray
adds to one request.

    python benchmarks/ray_serve.py CALBIN [--concurrency 1,8] [--requests 32] [--prompt-tokens 128]
                                          [--output-tokens 64] [--replica-cpus 1] [--out DIR]

Three targets on this machine, one after the other (never two at once): `calculet serve CALBIN`
(--threads = --replica-cpus), then a local Ray cluster (num_cpus = 2 x --replica-cpus) running
`build_app` with 1 replica, then redeployed with 2. Each is loaded with `calculet bench run` (closed
loop at each --concurrency); the per-request overhead is the median end-to-end time of sequential
1-token requests on a 1-token prompt, Ray with 1 replica minus `calculet serve`. Results go to
DIR/<target>/ (bench runs) and DIR/summary.md. Nothing here is a test; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not healthy after {timeout} s")


def _bench(url: str, model: str, out: Path, args) -> list[dict]:
    subprocess.run([sys.executable, "-m", "calculet", "bench", "run", "--url", url, "--model", model,
                    "--concurrency", args.concurrency, "--prompt-tokens", str(args.prompt_tokens),
                    "--output-tokens", str(args.output_tokens), "--requests", str(args.requests), "--warmup", "2",
                    "--out", str(out), "--no-progress"], check=True, stdout=subprocess.DEVNULL)
    found = sorted(out.rglob("summary.json"))
    return json.loads(found[-1].read_text())["scenarios"] if found else []


def _one_token_ms(url: str, model: str, n: int) -> float:
    """Median end-to-end milliseconds of n sequential 1-token completions of a 1-token prompt."""
    times = []
    with httpx.Client(timeout=60) as client:
        for i in range(n + 3):
            t0 = time.perf_counter()
            r = client.post(url + "/v1/completions", json={"model": model, "prompt": [5], "max_tokens": 1, "temperature": 0})
            r.raise_for_status()
            if i >= 3:   # the first few warm the connection and the path
                times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _measure(label: str, url: str, model: str, out: Path, args, rows: list) -> float:
    _wait(url)
    overhead_ms = _one_token_ms(url, model, args.probe_requests)
    for s in _bench(url, model, out / label, args):
        ttft = s.get("ttft") or {}
        rows.append((label, s.get("concurrency"), s["ok"], s["requests"], s["request_throughput"],
                     ttft.get("p50"), ttft.get("p99"), overhead_ms))
    return overhead_ms


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("calbin")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--probe-requests", type=int, default=50, help="sequential 1-token requests for the overhead")
    p.add_argument("--replica-cpus", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="calculet-ray-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    model, rows = "model", []

    port = _port()
    proc = subprocess.Popen([sys.executable, "-m", "calculet", "serve", args.calbin, "--port", str(port),
                             "--served-model-name", model, "--threads", str(args.replica_cpus)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        serve_ms = _measure("serve", f"http://127.0.0.1:{port}", model, out, args, rows)
    finally:
        proc.terminate()
        proc.wait(60)

    import ray
    from ray import serve

    from calculet.ray.deployment import build_app
    from calculet.ray.options import ReplicaOptions
    from calculet.server.config import ServerConfig

    port = _port()
    ray.init(num_cpus=2 * args.replica_cpus, include_dashboard=False, logging_level="WARNING")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        config = ServerConfig(model=args.calbin, served_model_name=model)
        ray_ms = {}
        for replicas in (1, 2):
            serve.run(build_app(config, ReplicaOptions(replicas=replicas, num_cpus=args.replica_cpus)), name="calculet",
                      route_prefix="/")
            ray_ms[replicas] = _measure(f"ray-{replicas}", f"http://127.0.0.1:{port}", model, out, args, rows)
    finally:
        serve.shutdown()
        ray.shutdown()

    lines = ["| target | concurrency | ok | req/s | TTFT p50 ms | TTFT p99 ms | 1-token request ms (median) |",
             "|---|---|---|---|---|---|---|"]
    for label, conc, ok, n, rps, p50, p99, ms in rows:
        ms_text = lambda v: f"{v * 1000:.1f}" if v is not None else "-"   # noqa: E731  (summary in seconds)
        lines.append(f"| {label} | {conc} | {ok}/{n} | {rps:.2f} | {ms_text(p50)} | {ms_text(p99)} | {ms:.1f} |")
    lines.append("")
    lines.append(f"Ray's per-request overhead (1 replica, median 1-token request): {ray_ms[1] - serve_ms:+.1f} ms "
                 f"({serve_ms:.1f} ms direct, {ray_ms[1]:.1f} ms through Serve's proxy, the router and the replica)")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nruns and summary: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
