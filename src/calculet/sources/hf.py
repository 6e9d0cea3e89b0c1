"""Hugging Face folder source: config.json, *.safetensors (single or sharded), tokenizer files.

Weights are read with `safetensors.safe_open` (memory-mapped; the header is checked against the
file size when opened), each tensor on access; its errors are re-raised with our codes and the path.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, so safe_open reads BF16 tensors)
import numpy as np
from safetensors import SafetensorError, safe_open

from calculet.errors import ModelError
from calculet.sources.base import LazyTensors, SourceModel, sha256_files

FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")   # safetensors dtypes read as float32


def read_json(path: Path, what: str) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelError("hf_missing_file", f"{path}: {what} is missing from the model folder") from None
    except json.JSONDecodeError as exc:
        raise ModelError("hf_bad_json", f"{path}: {what} is not valid JSON ({exc})") from None


def _safetensors_error(path: Path, exc: Exception) -> ModelError:
    """Our code and a message naming the file for a `safe_open` failure (its own says only what broke)."""
    reason = str(exc).removeprefix("Error while deserializing header: ")
    size = path.stat().st_size if path.exists() else 0
    if "header too small" in reason:
        return ModelError("safetensors_truncated", f"{path}: {size} bytes, too short for a safetensors header "
                                                   f"(needs >= 8; truncated?)")
    if "not fully covered" in reason:
        return ModelError("safetensors_truncated", f"{path}: its {size} bytes do not hold exactly the tensor data "
                                                   f"its header lists (truncated?)")
    if "invalid header length" in reason:
        return ModelError("safetensors_corrupt", f"{path}: its header length exceeds the file's {size} bytes "
                                                 f"(truncated, or not a safetensors file)")
    if "json" in reason.lower() or "utf" in reason.lower():
        return ModelError("safetensors_corrupt", f"{path}: header is not valid JSON ({reason})")
    return ModelError("safetensors_corrupt", f"{path}: not a valid safetensors file ({reason})")


@contextmanager
def _opened(path: Path) -> Iterator:
    """`safe_open` (memory-mapped, header checked against the file size) with our errors."""
    try:
        with safe_open(path, framework="numpy") as f:
            yield f
    except SafetensorError as exc:
        raise _safetensors_error(path, exc) from None


def _safetensors_table(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (safetensors dtype, shape)} from a file's header; no tensor data is read."""
    with _opened(path) as f:
        return {name: (sl.get_dtype(), tuple(sl.get_shape())) for name in f.keys() for sl in (f.get_slice(name),)}


def _tensor_loader(path: Path, name: str, dtype: str):
    def load() -> np.ndarray:
        if dtype not in FLOAT_DTYPES:
            raise ModelError("safetensors_dtype", f"{path}: tensor {name!r} is {dtype}, which is not supported "
                                                  f"(supported: {', '.join(FLOAT_DTYPES)})")
        with _opened(path) as f:
            return f.get_tensor(name).astype(np.float32, copy=False)   # BF16 arrives as ml_dtypes.bfloat16

    return load


def load_hf_folder(folder: str | Path) -> SourceModel:
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelError("hf_not_found", f"{folder}: not a folder (expected a Hugging Face model folder with config.json)")
    config = read_json(folder / "config.json", "config.json")
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index, "model.safetensors.index.json").get("weight_map", {})
        files = sorted({folder / f for f in weight_map.values()})
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelError("hf_no_weights", f"{folder}: no *.safetensors files (PyTorch .bin checkpoints are not supported)")
    loaders, shapes = {}, {}
    for f in files:
        if not f.exists():
            raise ModelError("hf_missing_file", f"{f}: listed in the safetensors index but missing")
        for name, (dtype, shape) in _safetensors_table(f).items():
            loaders[name] = _tensor_loader(f, name, dtype)
            shapes[name] = shape
    tok_path = folder / "tokenizer.json"
    if not tok_path.exists():
        raise ModelError("hf_missing_file", f"{tok_path}: tokenizer.json is missing (Calculet needs a fast tokenizer file)")
    tok_config = read_json(folder / "tokenizer_config.json", "tokenizer_config.json") if (folder / "tokenizer_config.json").exists() else {}
    if "chat_template" not in tok_config and (folder / "chat_template.jinja").exists():
        tok_config["chat_template"] = (folder / "chat_template.jinja").read_text()
    gen_config = read_json(folder / "generation_config.json", "generation_config.json") if (folder / "generation_config.json").exists() else {}
    return SourceModel(
        kind="hf",
        path=str(folder),
        config=config,
        tensors=LazyTensors(loaders, shapes),
        tokenizer_json=tok_path.read_text(),
        tokenizer_config=tok_config,
        generation_config=gen_config,
        source_sha256=sha256_files(files),
    )
