"""`calculet run` (src/calculet/run.py): streams text, ends with the speed line, compiles a source into the cache once."""

from __future__ import annotations

import re

from calculet.cli import main


def test_run_streams_and_reports(tiny_calbin, capsys):
    assert main(["run", str(tiny_calbin("qwen3")), "The quick brown fox", "--max-tokens", "12"]) == 0
    out, err = capsys.readouterr()
    assert out.endswith("\n") and len(out) > 1
    m = re.search(r"\[prompt tokens (\d+) \| generated (\d+) \((stop|length)\) \| TTFT (\d+) ms \| decode ([\d.]+) tokens/s\]", err)
    assert m, err
    assert int(m.group(1)) > 0 and 1 <= int(m.group(2)) <= 12


def test_run_is_reproducible_with_seed(tiny_calbin, capsys):
    args = ["run", str(tiny_calbin("llama")), "Paris is", "--max-tokens", "16", "--temperature", "1.0", "--top-k", "20", "--seed", "7"]
    main(args)
    first = capsys.readouterr().out
    main(args)
    assert capsys.readouterr().out == first
    main(args[:-1] + ["8"])
    assert capsys.readouterr().out != first


def test_run_compiles_source_into_cache_once(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CALCULET_CACHE", str(tmp_path / "cache"))
    args = ["run", str(tiny_model_dir("gemma3")), "hello", "--max-tokens", "3", "--lanes", "2", "--context", "64", "--prefill-chunks", "4,16"]
    assert main(args) == 0
    assert "compiling into the cache" in capsys.readouterr().err
    cached = list((tmp_path / "cache").glob("*.calbin"))
    assert len(cached) == 1 and (cached[0] / "manifest.json").is_file()
    assert main(args) == 0
    assert "compiling" not in capsys.readouterr().err


def test_run_bad_request_options_say_what_is_allowed(tiny_calbin, capsys):
    calbin = str(tiny_calbin("qwen3"))
    assert main(["run", calbin, "hi", "--stop-token-ids", "1,x"]) == 2
    assert "error[bad_arguments]: --stop-token-ids must be comma-separated integers" in capsys.readouterr().err
    assert main(["run", calbin, "hi", "--max-tokens", "4", "--min-tokens", "9"]) == 2
    assert "min_tokens=9 is out of range; allowed: 0 <= min_tokens <= max_tokens (4)" in capsys.readouterr().err
