"""The harness against our own server: a real `calculet serve` on a tiny model, measured end to end;
the report's summary is recomputed independently from the JSONL."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.test_report import recompute
from serving import Server

OUTPUT_TOKENS = 8


@pytest.fixture(scope="module")
def served(tiny_calbin, tmp_path_factory):
    server = Server(tiny_calbin("qwen3", lanes=4, context=128), tmp_path_factory.mktemp("serve") / "server.log")
    try:
        yield server.wait_ready(60)
    finally:
        server.stop()


def test_bench_run_against_calculet_serve(served, tmp_path):
    from calculet.bench.config import build_config
    from calculet.bench.report import write_report
    from calculet.bench.runner import run_benchmark

    model = served.get("/v1/models").json()["data"][0]["id"]
    config = build_config({
        "url": served.url, "model": model, "concurrency": [1, 3], "prompt_tokens": [16],
        "output_tokens": OUTPUT_TOKENS, "requests": 6, "warmup": 1, "slo": "ttft=2s,tpot=500ms",
        "out": str(tmp_path / "run"), "progress": False, "label": "calculet",
    })
    records = run_benchmark(config)
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    measured = [r for r in lines if not r["warmup"]]
    assert len(measured) == 12 and all(r["status"] == "ok" for r in measured)
    for r in measured:  # fixed output length honoured, server timings lined up beside the client's
        assert r["output_tokens"] == OUTPUT_TOKENS
        assert r["t_sent_ns"] < r["t_first_token_ns"] <= r["t_done_ns"]
        assert r["server_timings"], "calculet serve returns its own timings per request"
    report = write_report(records, tmp_path / "report")
    summary = json.loads((report.parent / "summary.json").read_text())
    mine = recompute(records, ttft_slo=2.0, tpot_slo=0.5)
    assert [s["scenario"] for s in summary["scenarios"]] == list(mine)
    for s in summary["scenarios"]:
        m = mine[s["scenario"]]
        assert (s["requests"], s["ok"]) == (m["requests"], m["ok"])
        assert s["output_token_throughput"] == pytest.approx(m["output_token_throughput"], rel=1e-9)
        for metric in ("ttft", "tpot", "itl", "e2e"):
            assert s[metric]["p50"] == pytest.approx(float(np.percentile(m[metric], 50)), rel=1e-9)
