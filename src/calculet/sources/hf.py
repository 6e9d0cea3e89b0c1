"""Hugging Face folder source: config.json, *.safetensors (single or sharded), tokenizer files."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np

from calculet.errors import ModelError
from calculet.sources.base import LazyTensors, SourceModel

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None, "F64": np.float64}


def read_json(path: Path, what: str) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelError("hf_missing_file", f"{path}: {what} is missing from the model folder") from None
    except json.JSONDecodeError as exc:
        raise ModelError("hf_bad_json", f"{path}: {what} is not valid JSON ({exc})") from None


def _safetensors_header(path: Path) -> tuple[dict, int]:
    """Parse a safetensors header by hand so a truncated or corrupt file gets a clear error."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelError("safetensors_truncated", f"{path}: {size} bytes, too short for a safetensors header (needs >= 8)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > 100 * 2**20:
            raise ModelError("safetensors_corrupt", f"{path}: header length {n} exceeds the file size {size} bytes")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelError("safetensors_corrupt", f"{path}: header is not valid JSON ({exc})") from None
    header.pop("__metadata__", None)
    data_start = 8 + n
    for name, info in header.items():
        end = info.get("data_offsets", [0, 0])[1]
        if data_start + end > size:
            raise ModelError(
                "safetensors_truncated",
                f"{path}: tensor {name!r} ends at byte {data_start + end} but the file has {size} bytes (truncated?)",
            )
    return header, data_start


def _tensor_loader(path: Path, info: dict, data_start: int):
    dtype, shape = info["dtype"], tuple(info["shape"])
    begin, end = info["data_offsets"]

    def load() -> np.ndarray:
        if dtype == "BF16":
            raw = np.fromfile(path, dtype=np.uint16, count=(end - begin) // 2, offset=data_start + begin)
            return (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)
        np_dtype = _ST_DTYPES.get(dtype)
        if np_dtype is None:
            raise ModelError("safetensors_dtype", f"{path}: tensor dtype {dtype} is not supported (supported: F32, F16, BF16, F64)")
        count = (end - begin) // np.dtype(np_dtype).itemsize
        arr = np.fromfile(path, dtype=np_dtype, count=count, offset=data_start + begin)
        return arr.reshape(shape).astype(np.float32, copy=False)

    return load


def _sha256_files(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()


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
        header, start = _safetensors_header(f)
        for name, info in header.items():
            loaders[name] = _tensor_loader(f, info, start)
            shapes[name] = tuple(info["shape"])
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
        source_sha256=_sha256_files(files),
    )
