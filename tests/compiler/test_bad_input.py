"""Bad input gets one clear line naming what is wrong and the limit, a non-zero exit, no traceback,
and nothing half-written."""

from __future__ import annotations

import json
import shutil

import pytest

from calculet.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err.strip()


def _assert_one_line(err: str, code: str, *fragments: str):
    lines = err.splitlines()
    assert lines, "no error printed"
    last = lines[-1]
    assert last.startswith(f"error[{code}]:"), last
    for f in fragments:
        assert f in last, f"{f!r} not in {last!r}"
    assert "Traceback" not in err


def _no_leftovers(out_parent, name):
    assert not [p for p in out_parent.iterdir() if p.name.startswith(f".{name}.tmp-")], "temporary folder left behind"
    assert not (out_parent / name).exists(), "half-written calbin left behind"


@pytest.fixture
def model_copy(tiny_model_dir, tmp_path):
    def make(arch="llama"):
        dst = tmp_path / f"src-{arch}"
        shutil.copytree(tiny_model_dir(arch), dst)
        return dst
    return make


def test_unknown_architecture(model_copy, tmp_path, capsys):
    src = model_copy()
    cfg = json.loads((src / "config.json").read_text())
    cfg["model_type"] = "falcon_mamba"
    (src / "config.json").write_text(json.dumps(cfg))
    code, err = _run(capsys, "compile", str(src), "-o", str(tmp_path / "x.calbin"))
    assert code == 2
    _assert_one_line(err, "unsupported_architecture", "falcon_mamba", "gemma3_text", "llama", "qwen2", "qwen3")
    _no_leftovers(tmp_path, "x.calbin")


def test_missing_tensor(model_copy, tmp_path, capsys):
    from safetensors.numpy import load_file, save_file

    src = model_copy()
    tensors = load_file(src / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, src / "model.safetensors")
    code, err = _run(capsys, "compile", str(src), "-o", str(tmp_path / "x.calbin"), "--no-golden")
    assert code == 2
    _assert_one_line(err, "missing_tensor", "model.layers.1.mlp.up_proj.weight")
    _no_leftovers(tmp_path, "x.calbin")


def test_truncated_safetensors(model_copy, tmp_path, capsys):
    src = model_copy()
    f = src / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    code, err = _run(capsys, "compile", str(src), "-o", str(tmp_path / "x.calbin"))
    assert code == 2
    _assert_one_line(err, "safetensors_truncated", "model.safetensors", "truncated")
    _no_leftovers(tmp_path, "x.calbin")


def test_corrupt_safetensors_header(model_copy, tmp_path, capsys):
    src = model_copy()
    f = src / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:16] = b"\x00garbage"
    f.write_bytes(bytes(data))
    code, err = _run(capsys, "compile", str(src), "-o", str(tmp_path / "x.calbin"))
    assert code == 2
    _assert_one_line(err, "safetensors_corrupt", "model.safetensors", "not valid JSON")


def test_missing_source(tmp_path, capsys):
    code, err = _run(capsys, "compile", str(tmp_path / "nope"), "-o", str(tmp_path / "x.calbin"))
    assert code == 2
    _assert_one_line(err, "source_not_found", "nope")


def test_bad_compile_options(tiny_model_dir, tmp_path, capsys):
    code, err = _run(capsys, "compile", str(tiny_model_dir("llama")), "-o", str(tmp_path / "x.calbin"),
                     "--context", "64", "--prefill-chunks", "16,128")
    assert code == 2
    _assert_one_line(err, "bad_option", "128", "context (64)")


def test_debug_shows_traceback(model_copy, tmp_path, capsys):
    src = model_copy()
    (src / "config.json").write_text("{not json")
    code, err = _run(capsys, "--debug", "compile", str(src), "-o", str(tmp_path / "x.calbin"))
    assert code == 2 and "Traceback" in err and "hf_bad_json" in err


@pytest.fixture
def calbin_copy(tiny_calbin, tmp_path):
    dst = tmp_path / "copy.calbin"
    shutil.copytree(tiny_calbin("llama"), dst)
    return dst


def test_calbin_size_mismatch(calbin_copy, capsys):
    w = calbin_copy / "graphs" / "weights.bin"
    w.write_bytes(w.read_bytes()[:-64])
    code, err = _run(capsys, "run", str(calbin_copy), "hello")
    assert code == 2
    _assert_one_line(err, "file_size_mismatch", "weights.bin", "bytes on disk", "the manifest says")


def test_calbin_hash_mismatch_needs_full_hash(calbin_copy, capsys):
    w = calbin_copy / "graphs" / "weights.bin"
    data = bytearray(w.read_bytes())
    data[100] ^= 0xFF
    w.write_bytes(bytes(data))
    code, err = _run(capsys, "run", str(calbin_copy), "hello", "--max-tokens", "2", "--full-hash")
    assert code == 2
    _assert_one_line(err, "file_hash_mismatch", "weights.bin", "SHA-256")


def test_not_a_calbin(tmp_path, capsys):
    (tmp_path / "empty.calbin").mkdir()
    (tmp_path / "empty.calbin" / "manifest.json").write_text("[1, 2")
    code, err = _run(capsys, "run", str(tmp_path / "empty.calbin"), "hello")
    assert code == 2
    _assert_one_line(err, "manifest_not_json", "manifest.json")


def test_prompt_longer_than_context(tiny_calbin, capsys):
    code, err = _run(capsys, "run", str(tiny_calbin("llama")), "fox " * 200)
    assert code == 2
    _assert_one_line(err, "prompt_too_long", "context is 64", "at most 63")


def test_empty_prompt(tiny_calbin, capsys):
    code, err = _run(capsys, "run", str(tiny_calbin("llama")), "")
    assert code == 2
    _assert_one_line(err, "empty_prompt", "empty")


def test_bad_decode_int8_choice(tiny_model_dir, tmp_path, capsys):
    code, err = _run(capsys, "compile", str(tiny_model_dir("llama")), "-o", str(tmp_path / "x.calbin"),
                     "--decode-int8", "qkv")
    assert code == 2
    _assert_one_line(err, "bad_option", "--decode-int8 must be one of gate-up, all, off", "'qkv'")
    _no_leftovers(tmp_path, "x.calbin")


def test_a_full_disk_is_refused_before_weights_are_written(model_copy, tmp_path, capsys, monkeypatch):
    """A disk with less free space than weights.bin takes: one line naming both sizes, nothing half-written
    (instead of ENOSPC part-way through the write)."""
    import calculet.compiler.weights as weights_module

    real = shutil.disk_usage

    def nearly_full(path):
        usage = real(path)
        return usage._replace(free=4096)

    monkeypatch.setattr(weights_module.shutil, "disk_usage", nearly_full)
    code, err = _run(capsys, "compile", str(model_copy()), "-o", str(tmp_path / "x.calbin"))
    assert code == 2
    _assert_one_line(err, "disk_full", "weights.bin needs", "0.00 GiB free", "-o")
    _no_leftovers(tmp_path, "x.calbin")
