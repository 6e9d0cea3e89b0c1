"""Test helper: one weight of a calbin as the compiler stored it in weights.bin (dtype and shape from
the manifest's tensor table), read without loading the runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from calculet.calbin.manifest import read_manifest


def stored_weight(calbin, name: str) -> np.ndarray:
    calbin = Path(calbin)
    manifest = read_manifest(calbin)
    t = next(t for t in manifest.weights.tensors if t.name == name)
    raw = np.fromfile(calbin / manifest.weights.file, dtype=np.uint8, count=t.nbytes, offset=t.offset)
    return raw.view(t.dtype).reshape(t.shape)
