"""What every weight source hands the compiler: HF-style config, HF-named tensors, a tokenizer.

A source (Hugging Face folder, GGUF file, the embedded default) is normalised to one shape so the
compiler never knows where weights came from:
- `config`: a dict with Hugging Face `config.json` key names (`model_type`, `hidden_size`, ...).
- `tensors`: name -> float32 numpy array, Hugging Face parameter names and layouts
  (`model.layers.0.self_attn.q_proj.weight` is [out_features, in_features]); loaded lazily.
- `tokenizer_json`: the text of a Hugging Face `tokenizers` tokenizer.json.
- `tokenizer_config`: bos/eos/pad token strings or ids, `add_bos_token`, `chat_template` (or None).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping

import numpy as np


class LazyTensors(Mapping[str, np.ndarray]):
    """A read-only mapping whose values are produced on first access (then not cached)."""

    def __init__(self, loaders: dict[str, Callable[[], np.ndarray]], shapes: dict[str, tuple[int, ...]]):
        self._loaders = loaders
        self._shapes = shapes

    def __getitem__(self, name: str) -> np.ndarray:
        return self._loaders[name]()

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaders)

    def __len__(self) -> int:
        return len(self._loaders)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]


@dataclass(frozen=True)
class SourceModel:
    kind: str                      # "hf" | "gguf"
    path: str                      # folder or file it was read from
    config: dict                   # Hugging Face config.json keys
    tensors: LazyTensors           # HF names -> float32 arrays, HF layouts
    tokenizer_json: str            # tokenizer.json text
    tokenizer_config: dict = field(default_factory=dict)
    generation_config: dict = field(default_factory=dict)
    source_sha256: str = ""        # of the file (GGUF) or of the concatenated weight files (HF)


def sha256_files(paths: Iterable[str | os.PathLike], chunk_bytes: int = 4 << 20) -> str:
    """SHA-256 of the files' bytes, concatenated in the order given (`SourceModel.source_sha256`)."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while block := f.read(chunk_bytes):
                digest.update(block)
    return digest.hexdigest()
