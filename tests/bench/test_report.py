"""`bench report`: the summary it writes is recomputed here from the JSONL alone, independently."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calculet.bench.report import write_report


@pytest.fixture(scope="module")
def report(measured_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_report(measured_run, tmp_path_factory.mktemp("report"))


def recompute(records_file: Path, ttft_slo: float, tpot_slo: float) -> dict[str, dict]:
    """From raw JSON lines with numpy; shares no code with calculet.bench.metrics."""
    groups: dict[str, list[dict]] = {}
    for line in records_file.read_text().splitlines():
        r = json.loads(line)
        if not r["warmup"]:
            groups.setdefault(r["scenario"], []).append(r)
    out = {}
    for name, rs in groups.items():
        ok = [r for r in rs if r["status"] == "ok"]
        ttft = np.array([r["t_first_token_ns"] - r["t_sent_ns"] for r in ok]) / 1e9
        e2e = np.array([r["t_done_ns"] - r["t_sent_ns"] for r in ok]) / 1e9
        n_out = np.array([r["output_tokens"] for r in ok])
        tpot = (e2e - ttft) / (n_out - 1)
        itl = np.concatenate([np.diff(r["t_chunks_ns"]) for r in ok]) / 1e9
        window = (max(r["t_done_ns"] for r in rs) - min(r["t_scheduled_ns"] for r in rs)) / 1e9
        good = int(np.sum((ttft <= ttft_slo) & (tpot <= tpot_slo)))
        out[name] = {
            "ttft": ttft, "tpot": tpot, "itl": itl, "e2e": e2e,
            "request_throughput": len(ok) / window, "output_token_throughput": n_out.sum() / window,
            "goodput": good / window, "requests": len(rs), "ok": len(ok),
        }
    return out


def test_summary_recomputed_from_jsonl(measured_run: Path, report: Path):
    summary = json.loads((report.parent / "summary.json").read_text())
    mine = recompute(measured_run, ttft_slo=0.35, tpot_slo=0.03)
    assert [s["scenario"] for s in summary["scenarios"]] == list(mine)
    for s in summary["scenarios"]:
        m = mine[s["scenario"]]
        assert (s["requests"], s["ok"]) == (m["requests"], m["ok"])
        for key in ("request_throughput", "output_token_throughput", "goodput"):
            assert s[key] == pytest.approx(m[key], rel=1e-9)
        for metric in ("ttft", "tpot", "itl", "e2e"):
            values = m[metric]
            assert s[metric]["count"] == len(values)
            assert s[metric]["mean"] == pytest.approx(values.mean(), rel=1e-9)
            assert s[metric]["std"] == pytest.approx(values.std(), rel=1e-9, abs=1e-12)
            for q in (50, 90, 95, 99):
                assert s[metric][f"p{q}"] == pytest.approx(np.percentile(values, q), rel=1e-9)


def test_report_markdown_and_plots(report: Path):
    text = report.read_text()
    assert text.startswith("# Benchmark report: scripted")
    assert "| closed-c2/p16/o21 | 8 / 8 | 0 |" in text and "TTFT≤350ms" in text
    from calculet.cpu_features import detect
    assert f"- client CPU: {detect().model or 'unknown model'}" in text and " ".join(detect().flags) in text
    for name in ("latency_cdfs", "throughput_vs_load", "ttft_vs_prompt_length"):
        png = report.parent / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"(plots/{name}.png)" in text
    # the scripted server's own timings are lined up beside the client's figures
    assert "| closed-c2/p16/o21 | timings.predicted_n | 8 | 21 | 21 | 21 |" in text


def test_report_tells_errors_and_unhonoured_ignore_eos(tmp_path: Path, scripted_url: str):
    from calculet.bench.config import build_config
    from calculet.bench.runner import run_benchmark

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "x #eos3"}\n{"prompt": "y #429"}\n')
    run = run_benchmark(build_config({"url": scripted_url, "model": "scripted", "prompts": str(prompts),
                                      "output_tokens": 5, "warmup": 0, "progress": False,
                                      "out": str(tmp_path / "run")}))
    text = write_report(run).read_text()
    assert "1 of 1 successful requests ended before max_tokens" in text
    assert "| closed-c1 | http_429 | 1 | " in text
