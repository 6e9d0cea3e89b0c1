"""`calculet bench …` through the real command line entry point."""

from __future__ import annotations

import json
from pathlib import Path

from calculet.cli import main


def test_run_report_compare(scripted_url: str, tmp_path: Path, capsys):
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"model": "scripted", "concurrency": [2], "prompt-tokens": [4],
                                    "output-tokens": 3, "requests": 2, "warmup": 0}))
    out = tmp_path / "run"
    code = main(["bench", "run", "--scenario", str(scenario), "--url", scripted_url, "--no-progress",
                 "--out", str(out), "--slo", "ttft=1s"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| closed-c2/p4/o3 | 2 / 2 | 0 |" in printed and (out / "report.md").is_file()
    assert main(["bench", "report", str(out / "records.jsonl"), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.md").is_file()
    assert main(["bench", "compare", str(out), str(out), "--out", str(tmp_path / "cmp.md")]) == 0
    assert "1.00×" in (tmp_path / "cmp.md").read_text()


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys):
    code = main(["bench", "run", "--url", "http://127.0.0.1:9", "--model", "m", "--concurrency", "0",
                 "--out", str(tmp_path / "x")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err == "error[bad_concurrency]: closed loop needs --concurrency ≥ 1, got 0"


def test_missing_run_for_report(tmp_path: Path, capsys):
    assert main(["bench", "report", str(tmp_path / "nothing")]) == 2
    assert "no benchmark records at" in capsys.readouterr().err
