"""One copy of the weights: a flat, 64-byte aligned `weights.bin` shared by every graph.

Graphs reference each tensor as ONNX external data (location, offset, length) into the same file,
and the runtime memory-maps the file once and hands the same buffers to every session.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from calculet.errors import RequestError

ALIGN = 64
WEIGHTS_FILE = "weights.bin"

_NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int64): TensorProto.INT64,
}


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str          # numpy dtype name
    shape: tuple[int, ...]
    offset: int         # bytes from the start of weights.bin
    nbytes: int

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "offset": self.offset, "nbytes": self.nbytes}


@dataclass(frozen=True)
class QuantInfo:
    """A weight stored as MatMulNBits codes: `<name>.qcodes` [N, K/block, blob], `<name>.qscales` [N, K/block]."""
    bits: int
    block: int
    n: int
    k: int
    accuracy_level: int


class WeightStore:
    """Ordered name -> array; lays tensors out with alignment and writes them once.

    A quantized weight is stored as two tensors (`<name>.qcodes`, `<name>.qscales`) and described by
    `quant(name)`. An alias is a second tensor name (and shape) over the same bytes: the int8 codes of
    a tied embedding serve both the lm_head (MatMulNBits, [V, K/block, block]) and the embedding
    lookup (GatherBlockQuantized, [V, K]).
    """

    def __init__(self):
        self._arrays: dict[str, np.ndarray] = {}
        self._entries: dict[str, TensorEntry] = {}
        self._quant: dict[str, QuantInfo] = {}
        self._size = 0
        self.inline: dict[str, np.ndarray] = {}   # small arrays graphs embed as constants (not in weights.bin)

    def add(self, name: str, array: np.ndarray) -> None:
        if name in self._arrays:
            raise ValueError(f"weight {name!r} added twice")
        array = np.ascontiguousarray(array)
        offset = -(-self._size // ALIGN) * ALIGN
        self._arrays[name] = array
        self._entries[name] = TensorEntry(name, array.dtype.name, tuple(array.shape), offset, array.nbytes)
        self._size = offset + array.nbytes

    def add_quantized(self, name: str, info: QuantInfo, codes: np.ndarray, scales: np.ndarray) -> None:
        self.add(f"{name}.qcodes", codes)
        self.add(f"{name}.qscales", scales)
        self._quant[name] = info

    def quant(self, name: str) -> QuantInfo | None:
        return self._quant.get(name)

    def copy(self) -> "WeightStore":
        """A second store over the same arrays (none is copied): adding to one leaves the other as it was."""
        other = WeightStore()
        other._arrays, other._entries, other._quant = dict(self._arrays), dict(self._entries), dict(self._quant)
        other._size, other.inline = self._size, dict(self.inline)
        return other

    def add_alias(self, name: str, base: str, shape: tuple[int, ...]) -> None:
        e = self._entries[base]
        if int(np.prod(shape)) * np.dtype(e.dtype).itemsize != e.nbytes:
            raise ValueError(f"alias {name!r} of shape {shape} does not cover {base!r} ({e.nbytes} bytes)")
        self._entries[name] = TensorEntry(name, e.dtype, tuple(shape), e.offset, e.nbytes)

    def __contains__(self, name: str) -> bool:
        return name in self._arrays

    def array(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def entry(self, name: str) -> TensorEntry:
        return self._entries[name]

    @property
    def entries(self) -> list[TensorEntry]:
        return list(self._entries.values())

    @property
    def nbytes(self) -> int:
        return self._size

    def external_initializer(self, name: str) -> TensorProto:
        e = self._entries[name]
        t = TensorProto()
        t.name = name
        t.data_type = _NP_TO_ONNX[np.dtype(e.dtype)]
        t.dims.extend(e.shape)
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", WEIGHTS_FILE), ("offset", str(e.offset)), ("length", str(e.nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        return t

    def subset(self, names) -> "WeightStore":
        """A new store holding `names` (and the base tensor of any alias among them), in this store's
        order: one chip's share of the weights (`--chips N`)."""
        wanted = set(names)
        by_offset = {self._entries[n].offset: n for n in self._arrays}
        bases = {by_offset[self._entries[n].offset] for n in wanted if n not in self._arrays}
        out = WeightStore()
        for name in self._arrays:
            if name in wanted or name in bases:
                out.add(name, self._arrays[name])
        for name in wanted - set(self._arrays):
            out.add_alias(name, by_offset[self._entries[name].offset], self._entries[name].shape)
        out._quant = {n: q for n, q in self._quant.items() if f"{n}.qcodes" in out}
        return out

    def slice_rows(self, rows: dict[str, tuple[int, int]]) -> "WeightStore":
        """A new store, in this store's order, where each weight named in `rows` (plain, or its
        `.qcodes` and `.qscales`) keeps rows [first, end) of axis 0 and every other tensor is shared
        as is: one chip's experts of each stacked expert tensor (`--partition ep`)."""
        out = WeightStore()
        cut = {}
        for name, (a, b) in rows.items():
            cut.update({n: (a, b) for n in (name, f"{name}.qcodes", f"{name}.qscales")})
        for e in self._entries.values():
            if e.name not in self._arrays:                       # an alias: after its base, same bytes
                base = next(n for n, x in self._entries.items() if n in self._arrays and x.offset == e.offset)
                out.add_alias(e.name, base, e.shape)
            elif e.name in cut:
                a, b = cut[e.name]
                out.add(e.name, self._arrays[e.name][a:b])
            else:
                out.add(e.name, self._arrays[e.name])
        out._quant = dict(self._quant)
        return out

    def write(self, path: Path, progress=None) -> None:
        check_free_space(path.parent, self._size, path.name)
        with open(path, "wb") as f:
            for e in self._entries.values():
                if e.name not in self._arrays:  # an alias: its bytes are written under its base name
                    continue
                f.seek(e.offset)
                f.write(self._arrays[e.name].tobytes())
                if progress is not None:
                    progress.update(e.nbytes)
            f.truncate(self._size)


def check_free_space(folder: Path, needed: int, what: str) -> None:
    """Refuse before writing `needed` bytes into `folder` when its file system has less free: a clear
    error instead of a half-written file and ENOSPC (a test suite's temporary folder on a full disk, say)."""
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise RequestError("disk_full", f"writing {what} needs {needed / 2**30:.2f} GiB and {folder} has "
                           f"{free / 2**30:.2f} GiB free: free space there or compile to another disk (-o)")


def used_weights(model) -> list[str]:
    """Names of the external initializers a built graph reads."""
    return [t.name for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL]


def relocate(model, store: WeightStore) -> None:
    """Point a built graph's external initializers at their offsets in `store` (a chip's own weights file)."""
    for t in model.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL:
            continue
        e = store.entry(t.name)
        for entry in t.external_data:
            if entry.key == "offset":
                entry.value = str(e.offset)


def onnx_dtype(np_dtype) -> int:
    return _NP_TO_ONNX[np.dtype(np_dtype)]


def make_value_info(name: str, np_dtype, shape) -> "helper.ValueInfoProto":
    return helper.make_tensor_value_info(name, onnx_dtype(np_dtype), list(shape))
