"""Fixtures: the scripted OpenAI-compatible server, run as a real process on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Generous delays so that 5 % holds on a loaded 2-core machine (the harness and the server share it).
TTFT_S = 0.3
GAP_S = 0.02
OUTPUT_TOKENS = 21   # 20 gaps: E2E = 0.3 + 20 × 0.02 = 0.7 s


@pytest.fixture(scope="session")
def scripted_url() -> str:
    script = Path(__file__).with_name("scripted_server.py")
    process = subprocess.Popen(
        [sys.executable, str(script), "--ttft", str(TTFT_S), "--gap", str(GAP_S)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        line = process.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"scripted server did not start (said {line!r})")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="session")
def measured_run(scripted_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Closed loops of 2 and 4 clients, 8 requests each, 16-token prompts, 21 output tokens."""
    from calculet.bench.config import build_config
    from calculet.bench.runner import run_benchmark

    config = build_config({
        "url": scripted_url, "model": "scripted", "concurrency": [2, 4], "prompt_tokens": [16],
        "output_tokens": OUTPUT_TOKENS, "requests": 8, "warmup": 2, "slo": "ttft=350ms,tpot=30ms",
        "out": str(tmp_path_factory.mktemp("bench") / "measured"), "progress": False,
        "label": "scripted",
    })
    return run_benchmark(config)
