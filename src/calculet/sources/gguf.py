"""GGUF weight source: one llama.cpp `.gguf` file -> the normalised `SourceModel`.

    file ──▶ read_gguf (header, metadata, tensor table; bounds-checked) ──▶ GgufFile
    GgufFile ──▶ gguf_config   (llama.cpp keys -> Hugging Face config.json keys)
             ──▶ LazyTensors   (dequantize with `gguf.quants`, rename, undo llama.cpp's transforms)
             ──▶ gguf_tokenizer (vocabulary in metadata -> tokenizer.json)

llama.cpp's converter changes two things on the way in, and both are undone here:
- Gemma 3: every `*norm.weight` is stored as `w + 1` (HF keeps `w` and computes `x * (1 + w)`).
- llama: the rows of `attn_q` / `attn_k` are permuted per head from HF's half-split RoPE layout to
  llama.cpp's interleaved pairs. Qwen2/Qwen3 use half-split RoPE in llama.cpp too: no permutation.

Everything here is numpy + `gguf` + `tokenizers`; torch and transformers are never imported.
The tables are read here rather than with `gguf.GGUFReader`: on the default model the library took
11 s and 714 MB of heap (one numpy array per part of every vocabulary string) where this takes 0.4 s
and 35 MB; docs/ARCHITECTURE.md has the measurement.
"""

from __future__ import annotations

import math
import mmap
import os
import re
import struct
from dataclasses import dataclass
from typing import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from calculet.errors import ModelError
from calculet.sources.base import LazyTensors, SourceModel, sha256_files
from calculet.sources.gguf_tokenizer import convert_tokenizer

SUPPORTED_ARCHS = ("gemma3", "llama", "qwen2", "qwen3", "qwen3moe")
SUPPORTED_VERSIONS = (2, 3)
GGUF_MAGIC = b"GGUF"
MAX_DIMS = 4  # GGML_MAX_DIMS


# ── reading the file ────────────────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class GgufTensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order, outermost first (GGUF lists dims innermost first)
    ggml_type: int
    offset: int             # absolute byte offset of the tensor's data in the file
    n_bytes: int


@dataclass(frozen=True)
class GgufFile:
    path: str
    size: int                              # bytes on disk
    version: int
    metadata: dict[str, object]            # numeric arrays as numpy arrays, string arrays as lists
    tensors: dict[str, GgufTensorInfo]     # in file order


class _OutOfBytes(Exception):
    def __init__(self, what: str, needed: int):
        self.what, self.needed = what, needed


# value type id -> (struct format, numpy dtype)
_SCALARS = {0: ("<B", "<u1"), 1: ("<b", "<i1"), 2: ("<H", "<u2"), 3: ("<h", "<i2"), 4: ("<I", "<u4"),
            5: ("<i", "<i4"), 6: ("<f", "<f4"), 7: ("<?", "<u1"), 10: ("<Q", "<u8"), 11: ("<q", "<i8"),
            12: ("<d", "<f8")}
_STRING, _ARRAY = 8, 9


class _Cursor:
    """Reads little-endian GGUF values from a buffer; never reads past its end."""

    def __init__(self, buf: mmap.mmap):
        self.buf, self.pos = buf, 0

    def take(self, n: int, what: str) -> int:
        start, end = self.pos, self.pos + n
        if end > len(self.buf):
            raise _OutOfBytes(what, end)
        self.pos = end
        return start

    def scalar(self, fmt: str, what: str):
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        start = self.take(n, what)
        return self.buf[start:start + n].decode("utf-8")

    def value(self, vtype: int, what: str):
        if vtype in _SCALARS:
            v = self.scalar(_SCALARS[vtype][0], what)
            return bool(v) if vtype == 7 else v
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            etype, count = self.scalar("<I", what), self.scalar("<Q", what)
            if etype in _SCALARS:
                dtype = np.dtype(_SCALARS[etype][1])
                start = self.take(count * dtype.itemsize, what)
                arr = np.frombuffer(self.buf[start:start + count * dtype.itemsize], dtype=dtype)
                return arr.astype(bool) if etype == 7 else arr.astype(dtype.newbyteorder("="))
            return [self.value(etype, what) for _ in range(count)]
        raise ValueError(f"unknown value type {vtype} in {what}")


def read_gguf(path: str) -> GgufFile:
    """Parse the header, metadata and tensor table of a GGUF file (tensor data is read lazily)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ModelError("gguf_not_found", f"GGUF file {path!r} does not exist (or is not a regular file)")
    try:
        return _read_file(path, os.path.getsize(path))
    except OSError as e:
        raise ModelError("gguf_unreadable", f"GGUF file {path!r} cannot be read: {e.strerror or e}") from None


def _read_file(path: str, size: int) -> GgufFile:
    with open(path, "rb") as f:
        head = f.read(8)
        if head[:4] != GGUF_MAGIC[:len(head[:4])]:
            raise ModelError("gguf_bad_magic", f"{path} is not a GGUF file: it starts with {head[:4]!r}, "
                                               f"a GGUF file starts with the magic {GGUF_MAGIC!r}")
        if len(head) < 8:
            raise ModelError("gguf_truncated", f"{path} is cut short: {size} bytes, fewer than the "
                                               f"24-byte GGUF header")
        version = struct.unpack_from("<I", head, 4)[0]
        if version not in SUPPORTED_VERSIONS:
            hint = " (it looks big-endian)" if struct.unpack_from(">I", head, 4)[0] in SUPPORTED_VERSIONS else ""
            raise ModelError("gguf_unsupported_version", f"{path} is GGUF version {version}{hint}; "
                                                         f"supported: little-endian versions {SUPPORTED_VERSIONS}")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                metadata, tensors = _read_tables(_Cursor(buf), path, size)
            except _OutOfBytes as e:
                raise ModelError("gguf_truncated", f"{path} is cut short: it ends at byte {size}, but "
                                                   f"{e.what} needs bytes up to {e.needed}") from None
            except (ValueError, UnicodeDecodeError, OverflowError, MemoryError) as e:
                raise ModelError("gguf_corrupt", f"{path} has a malformed header: {e}") from None
    return GgufFile(path=path, size=size, version=version, metadata=metadata, tensors=tensors)


def _read_tables(cur: _Cursor, path: str, size: int) -> tuple[dict, dict]:
    cur.take(8, "the header")  # magic + version, checked by the caller
    n_tensors, n_kv = cur.scalar("<Q", "the tensor count"), cur.scalar("<Q", "the metadata count")
    metadata: dict[str, object] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        metadata[key] = cur.value(cur.scalar("<I", f"metadata {key!r}"), f"metadata {key!r}")
    raw = []
    for i in range(n_tensors):
        name = cur.string(f"tensor name #{i}")
        n_dims = cur.scalar("<I", f"tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise ValueError(f"tensor {name!r} has {n_dims} dimensions; GGUF allows 1 to {MAX_DIMS}")
        dims = [cur.scalar("<Q", f"tensor {name!r}") for _ in range(n_dims)]
        raw.append((name, dims, cur.scalar("<I", f"tensor {name!r}"), cur.scalar("<Q", f"tensor {name!r}")))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment is {alignment!r}; it must be a power of two")
    data_start = -(-cur.pos // alignment) * alignment
    tensors = {}
    for name, dims, ggml_type, rel in raw:
        if name in tensors:
            raise ValueError(f"tensor {name!r} is listed twice")
        n_bytes = _tensor_bytes(path, name, dims, ggml_type)
        end = data_start + rel + n_bytes
        if end > size:
            raise _OutOfBytes(f"the data of tensor {name!r}", end)
        tensors[name] = GgufTensorInfo(name, tuple(reversed(dims)), ggml_type, data_start + rel, n_bytes)
    return metadata, tensors


def _tensor_bytes(path: str, name: str, dims: list[int], ggml_type: int) -> int:
    try:
        qtype = GGMLQuantizationType(ggml_type)
    except ValueError:
        raise ModelError("gguf_unsupported_tensor_type", f"{path}: tensor {name!r} has ggml type id "
                         f"{ggml_type}, which the gguf package does not know") from None
    block, type_size = GGML_QUANT_SIZES[qtype]
    if dims[0] % block:
        raise ValueError(f"tensor {name!r} has rows of {dims[0]} values, not a multiple of the "
                         f"{qtype.name} block size {block}")
    return math.prod(dims) // block * type_size


# ── config ──────────────────────────────────────────────────────────────────────────────────────

_HF_CLASS = {"gemma3": "Gemma3ForCausalLM", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
             "qwen3": "Qwen3ForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM"}
_HF_MODEL_TYPE = {"gemma3": "gemma3_text", "qwen3moe": "qwen3_moe"}
GEMMA3_SLIDING_PERIOD = 6       # 5 local layers then 1 global (llama.cpp and HF default)
ROPE_BASE_DEFAULT = 10000.0     # llama.cpp's rope.freq_base when a file omits it
GEMMA3_LOCAL_ROPE_BASE = 10000.0
GEMMA3_27B_LAYERS = 62          # llama.cpp scales queries by 1/sqrt(hidden/heads) only for 27B


def architecture(gf: GgufFile) -> str:
    arch = gf.metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ModelError("gguf_unsupported_arch", f"{gf.path} declares architecture {arch!r}; "
                                                  f"supported: {', '.join(SUPPORTED_ARCHS)}")
    return arch


def _key(gf: GgufFile, key: str, kind: type | tuple = (int, float), default=...):
    if key not in gf.metadata:
        if default is not ...:
            return default
        raise ModelError("gguf_missing_key", f"{gf.path} lacks metadata key {key!r}, which a "
                                             f"{gf.metadata.get('general.architecture')} model needs")
    value = gf.metadata[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind != bool:
        raise ModelError("gguf_bad_value", f"{gf.path}: metadata {key!r} is {value!r}; expected {kind}")
    return value


def gguf_config(gf: GgufFile) -> dict:
    """Hugging Face config.json keys for the model this file holds."""
    arch = architecture(gf)
    k = lambda name, **kw: _key(gf, f"{arch}.{name}", **kw)  # noqa: E731
    heads, hidden = k("attention.head_count", kind=int), k("embedding_length", kind=int)
    layers = k("block_count", kind=int)
    tokens = gf.metadata.get("tokenizer.ggml.tokens")
    key_length = k("attention.key_length", kind=int, default=None)
    rope_dims = k("rope.dimension_count", kind=int, default=None)
    head_dim = key_length or rope_dims or hidden // heads
    if rope_dims not in (None, head_dim):
        raise ModelError("gguf_unsupported_rope", f"{gf.path}: RoPE covers {rope_dims} of {head_dim} head "
                                                  f"dimensions; only full-width RoPE is supported")
    rope_theta = float(k("rope.freq_base", default=ROPE_BASE_DEFAULT))
    rope_scaling = _rope_scaling(gf, arch, head_dim, rope_theta)
    config = {
        "model_type": _HF_MODEL_TYPE.get(arch, arch),
        "architectures": [_HF_CLASS[arch]],
        "vocab_size": k("vocab_size", kind=int, default=len(tokens) if isinstance(tokens, list) else None),
        "hidden_size": hidden,
        "intermediate_size": k("feed_forward_length", kind=int,
                               default=k("expert_feed_forward_length", kind=int) if arch == "qwen3moe" else ...),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": k("attention.head_count_kv", kind=int, default=heads),
        "head_dim": head_dim,
        "rms_norm_eps": float(k("attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": k("context_length", kind=int),
        "tie_word_embeddings": "output.weight" not in gf.tensors,
        "attention_bias": "blk.0.attn_q.bias" in gf.tensors,
        "bos_token_id": gf.metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": gf.metadata.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": gf.metadata.get("tokenizer.ggml.padding_token_id"),
    }
    rope_params = {"rope_type": "default", "rope_theta": rope_theta, **(rope_scaling or {})}
    if arch != "gemma3":
        config |= {"hidden_act": "silu", "mlp_bias": False, "rope_parameters": rope_params}
        if arch in ("qwen2", "qwen3", "qwen3moe"):
            config |= {"use_sliding_window": False, "sliding_window": None, "max_window_layers": layers,
                       "layer_types": ["full_attention"] * layers}
        if arch == "qwen3moe":
            config |= _qwen3moe_config(gf, layers)
        if arch == "llama" and "blk.0.ffn_gate_inp.weight" in gf.tensors:  # llama.cpp stores Mixtral as llama
            config |= {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "sliding_window": None,
                       "num_local_experts": k("expert_count", kind=int),
                       "num_experts_per_tok": k("expert_used_count", kind=int)}
        return config
    local_base = float(k("rope.freq_base_swa", default=GEMMA3_LOCAL_ROPE_BASE))
    return config | {
        "sliding_window": k("attention.sliding_window", kind=int),
        "layer_types": _gemma3_layer_types(gf, layers),
        "rope_local_base_freq": local_base,
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": local_base},
                            "full_attention": rope_params},
        "query_pre_attn_scalar": hidden // heads if layers == GEMMA3_27B_LAYERS else head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": k("final_logit_softcapping", kind=float, default=None),
        "attn_logit_softcapping": k("attn_logit_softcapping", kind=float, default=None),
    }


def _qwen3moe_config(gf: GgufFile, layers: int) -> dict:
    """Expert keys. llama.cpp's qwen3moe makes every block sparse; a block without a router
    (`ffn_gate_inp`) is read as a dense one (HF `mlp_only_layers`). llama.cpp renormalises the top-k
    weights for qwen3moe unless the file says otherwise (`expert_weights_norm`)."""
    k = lambda name, **kw: _key(gf, f"qwen3moe.{name}", **kw)  # noqa: E731
    return {"num_experts": k("expert_count", kind=int), "num_experts_per_tok": k("expert_used_count", kind=int),
            "moe_intermediate_size": k("expert_feed_forward_length", kind=int),
            "norm_topk_prob": bool(k("expert_weights_norm", kind=bool, default=True)),
            "decoder_sparse_step": 1,
            "mlp_only_layers": [i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in gf.tensors]}


def _gemma3_layer_types(gf: GgufFile, layers: int) -> list[str]:
    pattern = gf.metadata.get("gemma3.attention.sliding_window_pattern", GEMMA3_SLIDING_PERIOD)
    if isinstance(pattern, np.ndarray) and pattern.dtype == bool and len(pattern) == layers:
        return ["sliding_attention" if s else "full_attention" for s in pattern.tolist()]
    if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]
    raise ModelError("gguf_bad_value", f"{gf.path}: gemma3.attention.sliding_window_pattern is {pattern!r}; "
                                       f"expected a period > 0 or one bool per layer ({layers})")


def _rope_scaling(gf: GgufFile, arch: str, head_dim: int, theta: float) -> dict | None:
    kind = _key(gf, f"{arch}.rope.scaling.type", kind=str, default="none")
    factor = _key(gf, f"{arch}.rope.scaling.factor", default=None)
    if "rope_freqs.weight" in gf.tensors:
        return _llama3_scaling(gf, head_dim, theta)
    if kind == "none" or kind == "linear" and factor in (None, 1.0):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn" and factor:
        original = _key(gf, f"{arch}.rope.scaling.original_context_length", kind=int)
        return {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": original}
    raise ModelError("gguf_unsupported_rope", f"{gf.path}: RoPE scaling {kind!r} (factor {factor}) is not "
                                              f"supported; supported: none, linear, yarn, llama3 rope_freqs")


# Llama 3.1/3.2 defaults; llama.cpp stores only the resulting per-frequency divisors (rope_freqs).
_LLAMA3_LOW, _LLAMA3_HIGH, _LLAMA3_ORIGINAL = 1.0, 4.0, 8192


def _llama3_scaling(gf: GgufFile, head_dim: int, theta: float) -> dict:
    """Recover HF's `llama3` rope parameters from llama.cpp's `rope_freqs` divisors."""
    stored = _load(gf, gf.tensors["rope_freqs.weight"]).reshape(-1)
    factor = float(stored.max())
    wavelen = 2 * math.pi * theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    smooth = np.clip((_LLAMA3_ORIGINAL / wavelen - _LLAMA3_LOW) / (_LLAMA3_HIGH - _LLAMA3_LOW), 0.0, 1.0)
    expected = 1.0 / ((1 - smooth) / factor + smooth)
    if stored.shape != expected.shape or not np.allclose(stored, expected, rtol=1e-4):
        raise ModelError("gguf_unsupported_rope", f"{gf.path}: rope_freqs.weight does not match Llama 3 "
                         f"scaling with low/high factors {_LLAMA3_LOW}/{_LLAMA3_HIGH} and original context "
                         f"{_LLAMA3_ORIGINAL}; only that form is supported")
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": _LLAMA3_LOW,
            "high_freq_factor": _LLAMA3_HIGH, "original_max_position_embeddings": _LLAMA3_ORIGINAL}


# ── tensors ─────────────────────────────────────────────────────────────────────────────────────

_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight"}
_BLOCK = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
          "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj", "ffn_norm": "post_attention_layernorm"}
# Gemma 3 has four norms per block; llama.cpp's `ffn_norm` is the one before the MLP.
_GEMMA3_BLOCK = _BLOCK | {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm":
                          "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
_QWEN3MOE_BLOCK = _BLOCK | {"ffn_gate_inp": "mlp.gate"}       # the router, [E, H]
# Stacked experts (numpy order [E, rows, cols]) -> transformers 5's stacked parameters: gate and up
# rows concatenated into `mlp.experts.gate_up_proj` [E, 2I, H]; `mlp.experts.down_proj` [E, H, I].
_EXPERT_STACKS = {"gate_up_proj": ("ffn_gate_exps", "ffn_up_exps"), "down_proj": ("ffn_down_exps",)}
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_NOT_PARAMETERS = {"rope_freqs.weight"}  # folded into config["rope_scaling"]


def hf_name(arch: str, gguf_name: str, layers: int) -> str | None:
    """HF parameter name for a GGUF tensor name, or None when it has none."""
    if gguf_name in _TOP:
        return _TOP[gguf_name]
    m = _BLOCK_NAME.fullmatch(gguf_name)
    table = _block_table(arch)
    if m is None or m[2] not in table or int(m[1]) >= layers:
        return None
    return f"model.layers.{m[1]}.{table[m[2]]}.{m[3]}"


def _block_table(arch: str) -> dict[str, str]:
    """llama's table has the router too: llama.cpp writes Mixtral as a llama with experts."""
    return {"gemma3": _GEMMA3_BLOCK, "qwen3moe": _QWEN3MOE_BLOCK, "llama": _QWEN3MOE_BLOCK}.get(arch, _BLOCK)


def _expert_stacks(gf: GgufFile, layers: int) -> tuple[dict, dict, set[str]]:
    """Loaders and shapes of the stacked expert parameters, and the GGUF names they consume."""
    loaders, shapes, used = {}, {}, set()
    for i in range(layers):
        for param, parts in _EXPERT_STACKS.items():
            infos = [gf.tensors.get(f"blk.{i}.{part}.weight") for part in parts]
            if all(info is None for info in infos):
                continue
            if any(info is None for info in infos) or len({info.shape[::2] for info in infos}) != 1:
                raise ModelError("gguf_bad_shape", f"{gf.path}: block {i} needs {' and '.join(parts)} with one "
                                 f"expert count and width; got {[None if t is None else t.shape for t in infos]}")
            name = f"model.layers.{i}.mlp.experts.{param}"
            loaders[name] = (lambda infos=infos: np.concatenate([_load(gf, t) for t in infos], axis=1))
            shapes[name] = (infos[0].shape[0], sum(t.shape[1] for t in infos), infos[0].shape[2])
            used.update(t.name for t in infos)
    return loaders, shapes, used


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head row permutation of llama q/k projections.

    HF rotates half-split pairs (row j with row j + d/2 of each head); llama.cpp's converter reorders
    each head's rows to interleaved pairs (j, j+d/2 adjacent) for its interleaved RoPE:
    gguf rows per head = [r0, r(d/2), r1, r(d/2+1), ...]  ->  HF rows = [r0, r1, ..., r(d/2), ...].
    """
    if w.shape[0] % (2 * n_heads):
        raise ModelError("gguf_bad_shape", f"a q/k projection has {w.shape[0]} rows, which do not split "
                                           f"into {n_heads} heads of row pairs")
    half = w.shape[0] // n_heads // 2
    # [heads, half, 2, ...] (gguf) -> [heads, 2, half, ...] (HF)
    return np.ascontiguousarray(w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def _load(gf: GgufFile, info: GgufTensorInfo) -> np.ndarray:
    """Read and dequantize one tensor to float32 in numpy order."""
    with open(gf.path, "rb") as f:
        f.seek(info.offset)
        raw = np.frombuffer(f.read(info.n_bytes), dtype=np.uint8)
    if raw.size != info.n_bytes:
        raise ModelError("gguf_truncated", f"{gf.path}: tensor {info.name!r} needs {info.n_bytes} bytes at "
                                           f"offset {info.offset}; the file now ends at {os.path.getsize(gf.path)}")
    qtype = GGMLQuantizationType(info.ggml_type)
    values = dequantize(raw.reshape(-1, info.n_bytes // math.prod(info.shape[:-1])), qtype)
    # F32 comes back as a read-only view of `raw`; everything else is already a fresh float32 array
    return np.require(values.reshape(info.shape), dtype=np.float32, requirements=["C", "W"])


def _check_dequantizable(gf: GgufFile) -> None:
    for qtype in sorted({GGMLQuantizationType(t.ggml_type) for t in gf.tensors.values()}):
        try:
            dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8), qtype)
        except NotImplementedError:
            names = [t.name for t in gf.tensors.values() if t.ggml_type == qtype][:3]
            raise ModelError("gguf_unsupported_tensor_type", f"{gf.path}: tensors {names} are {qtype.name}, "
                             f"which the gguf package cannot dequantize; use a file with float or "
                             f"Q*/K-quant/IQ tensors") from None


def gguf_tensors(gf: GgufFile, config: dict) -> LazyTensors:
    """HF-named float32 tensors, loaded on access."""
    arch = architecture(gf)
    layers = config["num_hidden_layers"]
    _check_dequantizable(gf)
    loaders, shapes, stacked = _expert_stacks(gf, layers)
    for info in gf.tensors.values():
        if info.name in _NOT_PARAMETERS or info.name in stacked:
            continue
        name = hf_name(arch, info.name, layers)
        if name is None:
            raise ModelError("gguf_unknown_tensor", f"{gf.path}: tensor {info.name!r} has no Hugging Face "
                             f"{arch} parameter; expected token_embd, output, output_norm or blk.N (N < "
                             f"{layers}) with {', '.join(sorted(_block_table(arch)))}")
        loaders[name] = _loader(gf, info, _transform(arch, info.name, config))
        shapes[name] = info.shape
    return LazyTensors(loaders, shapes)


def _transform(arch: str, gguf_name: str, config: dict) -> Callable[[np.ndarray], np.ndarray] | None:
    if arch == "gemma3" and gguf_name.endswith("norm.weight"):
        return lambda w: w - np.float32(1.0)
    if arch == "llama" and ".attn_q." in gguf_name:
        return lambda w: unpermute_rope_rows(w, config["num_attention_heads"])
    if arch == "llama" and ".attn_k." in gguf_name:
        return lambda w: unpermute_rope_rows(w, config["num_key_value_heads"])
    return None


def _loader(gf: GgufFile, info: GgufTensorInfo, transform) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        w = _load(gf, info)
        return w if transform is None else transform(w)
    return load


# ── the source ──────────────────────────────────────────────────────────────────────────────────

def file_sha256(path: str, chunk_bytes: int = 4 << 20) -> str:
    return sha256_files([path], chunk_bytes)


def read_gguf_config(path: str) -> dict:
    """Hugging Face config keys from a GGUF file's header alone: metadata and tensor table are
    parsed, no tensor data is read or dequantized (what `calculet plan` needs)."""
    return gguf_config(read_gguf(path))


def load_gguf(path: str) -> SourceModel:
    """Read a GGUF file (gemma3, llama, qwen2, qwen3 or qwen3moe) into HF config, HF-named tensors and tokenizer."""
    gf = read_gguf(path)
    config = gguf_config(gf)
    tensors = gguf_tensors(gf, config)
    tok = convert_tokenizer(gf.metadata, where=gf.path)
    return SourceModel(kind="gguf", path=gf.path, config=config, tensors=tensors,
                       tokenizer_json=tok.tokenizer_json, tokenizer_config=tok.tokenizer_config,
                       generation_config=tok.generation_config, source_sha256=file_sha256(gf.path))
