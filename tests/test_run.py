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


def test_a_new_compile_removes_the_builds_of_other_compilers(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Each cached build is marked with its compiler's fingerprint; compiling a new one removes the builds
    no compiler of this version can reuse (another fingerprint, or no mark), and keeps this compiler's
    other builds, folders being compiled and anything that is not a calbin."""
    from calculet.cache import COMPILER_MARK, _compiler_fingerprint

    cache = tmp_path / "cache"
    monkeypatch.setenv("CALCULET_CACHE", str(cache))

    def build(name: str, mark: str | None):
        folder = cache / name
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text("{}")
        (folder / "weights.bin").write_bytes(b"\\0" * 4096)
        if mark is not None:
            (cache / (name + COMPILER_MARK)).write_text(mark)
        return folder

    old = build("m-old.calbin", "0123456789abcdef")
    legacy = build("m-legacy.calbin", None)
    mine = build("m-other-options.calbin", _compiler_fingerprint())
    compiling = cache / ".m-new.calbin.tmp-x"
    compiling.mkdir()
    (cache / "isa_view").mkdir()
    args = ["run", str(tiny_model_dir("llama")), "hello", "--max-tokens", "2", "--lanes", "2", "--context", "64",
            "--prefill-chunks", "4,16"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "removed m-old.calbin from the cache: made by another compiler" in err
    assert "removed m-legacy.calbin from the cache" in err
    assert not old.exists() and not legacy.exists() and not (cache / ("m-old.calbin" + COMPILER_MARK)).exists()
    assert mine.exists() and compiling.exists() and (cache / "isa_view").exists()
    new = [p for p in cache.glob("*.calbin") if p not in (mine,)]
    assert len(new) == 1 and (cache / (new[0].name + COMPILER_MARK)).read_text() == _compiler_fingerprint()
    assert main(args) == 0   # a cache hit removes nothing
    assert "removed" not in capsys.readouterr().err and mine.exists()
