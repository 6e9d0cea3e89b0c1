"""The Hugging Face folder source on `safetensors.safe_open`: float32/float16/bfloat16/float64 tensors
read as float32, sharded folders, and clear errors (our code, the file's path) for bad files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from calculet.errors import ModelError
from calculet.sources.hf import load_hf_folder


def folder_with(tmp_path: Path, files: dict[str, dict[str, np.ndarray]], index: bool = False) -> Path:
    """A model folder: a stub config and tokenizer (the source does not parse them) and safetensors files."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "tokenizer.json").write_text("{}")
    for name, tensors in files.items():
        save_file(tensors, tmp_path / name)
    if index:
        weight_map = {t: name for name, tensors in files.items() for t in tensors}
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return tmp_path


def test_float_dtypes_read_as_float32(tmp_path):
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal((3, 5)).astype(np.float32)
    tensors = {"a": f32, "b": f32.astype(np.float16), "c": f32.astype(np.float64)}
    source = load_hf_folder(folder_with(tmp_path, {"model.safetensors": tensors}))
    assert sorted(source.tensors) == ["a", "b", "c"] and source.tensors.shape("b") == (3, 5)
    for name, want in tensors.items():
        got = source.tensors[name]
        assert got.dtype == np.float32 and np.array_equal(got, want.astype(np.float32)), name


def test_bfloat16_matches_torch(tmp_path):
    """Guards bfloat16 checkpoints (most HF models): numpy has no bfloat16, so safe_open needs ml_dtypes."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as save_torch

    w = torch.randn(4, 8, dtype=torch.bfloat16)
    folder = folder_with(tmp_path, {})
    save_torch({"w": w}, folder / "model.safetensors")
    got = load_hf_folder(folder).tensors["w"]
    assert got.dtype == np.float32 and np.array_equal(got, w.float().numpy())


def test_sharded_folder(tmp_path):
    a, b = np.ones((2, 2), np.float32), np.arange(6, dtype=np.float32)
    source = load_hf_folder(folder_with(tmp_path, {"model-00001-of-00002.safetensors": {"a": a},
                                                   "model-00002-of-00002.safetensors": {"b": b}}, index=True))
    assert np.array_equal(source.tensors["a"], a) and np.array_equal(source.tensors["b"], b)


def test_unsupported_dtype_fails_on_access(tmp_path):
    source = load_hf_folder(folder_with(tmp_path, {"model.safetensors": {"ids": np.arange(4, dtype=np.int32)}}))
    with pytest.raises(ModelError) as info:
        source.tensors["ids"]
    assert info.value.code == "safetensors_dtype" and "'ids' is I32" in info.value.message
    assert "F32, F16, BF16, F64" in info.value.message


def _bad_file(tmp_path: Path, data: bytes) -> Path:
    folder = folder_with(tmp_path, {})
    (folder / "model.safetensors").write_bytes(data)
    return folder


def _whole(tmp_path: Path) -> bytes:
    save_file({"a": np.ones((4, 4), np.float32), "b": np.zeros(8, np.float32)}, tmp_path / "whole.safetensors")
    return (tmp_path / "whole.safetensors").read_bytes()


@pytest.mark.parametrize("keep, code, fragment", [
    (0, "safetensors_truncated", "too short for a safetensors header"),
    (5, "safetensors_truncated", "too short for a safetensors header"),
    (20, "safetensors_corrupt", "header length exceeds the file's 20 bytes"),
    (-1, "safetensors_truncated", "truncated?"),
])
def test_truncated_file(tmp_path, keep, code, fragment):
    data = _whole(tmp_path)
    folder = _bad_file(tmp_path / "m", data[:keep])
    with pytest.raises(ModelError) as info:
        load_hf_folder(folder)
    assert info.value.code == code and fragment in info.value.message
    assert str(folder / "model.safetensors") in info.value.message


def test_corrupt_header(tmp_path):
    data = bytearray(_whole(tmp_path))
    data[8:16] = b"\x00garbage"
    folder = _bad_file(tmp_path / "m", bytes(data))
    with pytest.raises(ModelError) as info:
        load_hf_folder(folder)
    assert info.value.code == "safetensors_corrupt" and "header is not valid JSON" in info.value.message
    assert str(folder / "model.safetensors") in info.value.message


def test_header_overlapping_offsets(tmp_path):
    header = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}).encode()
    folder = _bad_file(tmp_path, struct.pack("<Q", len(header)) + header + bytes(12))
    with pytest.raises(ModelError) as info:
        load_hf_folder(folder)
    assert info.value.code == "safetensors_corrupt" and "not a valid safetensors file" in info.value.message
