"""Weight quantization: policies per module and block-wise int8/int4 encoders for MatMulNBits.

Encoding (ONNX Runtime's MatMulNBits / GatherBlockQuantized layout): a weight W [N, K] is cut into
blocks of `block` along K; each block stores codes q (uint8; two 4-bit codes per byte, low nibble
first) and a float32 scale s, and decodes as (q - z) * s with the default zero point z = 2^(bits-1).

Exact grids: a weight dequantized from GGUF already lies on a small integer grid per block
(Q8_0: d*q, Q5_0: d*(q-16), Q6_K: d*(q-32) per 16). When a block's values are integer multiples of
amax/m for a small m, we pick s = amax/(m*k) with k = floor(max_code/m), which represents the block
*exactly*: re-quantizing a GGUF model to int8 then adds no error on those blocks. Other blocks get
the usual s = amax / max_code. The per-tensor fraction of exact blocks and max error are recorded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calculet.compiler.int8_pairs import PAIR_SUM_LIMIT, column_codes
from calculet.compiler.weights import QuantInfo
from calculet.cpu_features import FULL_INT8_RANGE
from calculet.errors import RequestError

_GRID_CANDIDATES = (127, 16, 15, 32, 31, 64, 63, 8, 7, 4, 3, 2, 1)
_GRID_SAMPLE = 4     # values of a block _block_scales tests before the whole block
INT8_ACCURACY_LEVEL = 4   # MatMulNBits' accuracy_level for int8 compute (dynamic int8 activations)


@dataclass(frozen=True)
class QuantFormat:
    kind: str = "fp32"          # "fp32" | "fp16" (stored and multiplied in half precision) | "int8" | "int4"
    block: int = 32
    compute: str = "fp32"       # "fp32" (accuracy_level 1) | "int8" (accuracy_level 4: dynamic int8 activations)

    @property
    def bits(self) -> int:
        return {"int8": 8, "int4": 4}[self.kind]

    @property
    def accuracy_level(self) -> int:
        return INT8_ACCURACY_LEVEL if self.compute == "int8" else 1

    def to_json(self) -> dict:
        return {"kind": self.kind, "block": self.block, "compute": self.compute}


FP32 = QuantFormat()


def _fmt(kind: str, block: int, compute: str) -> QuantFormat:
    return QuantFormat(kind, block, compute)


def policy_table(name: str, block: int = 32) -> dict[str, QuantFormat]:
    """Module class -> format for a named policy."""
    if block not in (16, 32, 64, 128, 256):
        raise RequestError("bad_option", f"--block-size {block} is not supported; allowed: 16, 32, 64, 128, 256")
    w8a8 = _fmt("int8", block, "int8")
    w4a8 = _fmt("int4", block, "int8")
    fp16 = _fmt("fp16", block, "fp16")
    tables = {
        "fp32": {},
        # Half-precision weights and matmuls (activations cast to fp16 around each matmul); norms,
        # attention and the residual stream stay fp32.
        "fp16": {"attention": fp16, "mlp": fp16, "lm_head": fp16, "embedding": fp16},
        "int8": {"attention": _fmt("int8", block, "fp32"), "mlp": _fmt("int8", block, "fp32"), "lm_head": _fmt("int8", block, "fp32")},
        "w8a8": {"attention": w8a8, "mlp": w8a8, "lm_head": w8a8, "embedding": w8a8},
        "int4": {"attention": _fmt("int4", block, "fp32"), "mlp": _fmt("int4", block, "fp32"), "lm_head": _fmt("int8", block, "int8")},
        "w4a8": {"attention": w4a8, "mlp": w4a8, "lm_head": w4a8, "embedding": w4a8},
        # Default: embeddings share the lm_head's int8 codes; projections int8 with int8 compute; norms fp32.
        "default": {"attention": w8a8, "mlp": w8a8, "lm_head": w8a8, "embedding": w8a8},
    }
    for table in tables.values():  # mixture-of-experts layers (compiler/moe.py)
        table["router"] = FP32                                   # top-k choices stay exact
        if "mlp" in table:
            table["experts"] = table["mlp"]
    # ONNX Runtime's QMoE has no fp32-activation kernel for 8-bit blocks: say what it computes
    tables["int8"]["experts"] = w8a8
    if name not in tables:
        raise RequestError("bad_option", f"--weights {name!r} is not supported; supported: {', '.join(WEIGHT_POLICIES)}")
    return tables[name]


WEIGHT_POLICIES = ("default", "fp32", "fp16", "int8", "w8a8", "int4", "w4a8")


def module_class(name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "embedding"
    if name == "lm_head.weight":
        return "lm_head"
    if ".self_attn." in name and name.endswith("_proj.weight"):
        return "attention"
    if ".mlp.experts." in name:
        return "experts"
    if name.endswith((".mlp.gate.weight", ".mlp.shared_expert_gate.weight")):
        return "router"
    if ".mlp." in name and name.endswith("_proj.weight"):
        return "mlp"
    if "norm" in name:
        return "norm"
    return "other"


@dataclass(frozen=True)
class Quantized:
    codes: np.ndarray       # uint8 [N, K/block, block*bits/8]
    scales: np.ndarray      # float32 [N, K/block]
    exact_fraction: float   # blocks represented with zero error
    max_abs_error: float

    def dequantize(self, bits: int) -> np.ndarray:
        n, kb, _ = self.codes.shape
        q = unpack(self.codes, bits).astype(np.float32) - 2 ** (bits - 1)
        return (q * self.scales[:, :, None]).reshape(n, -1)


def unpack(codes: np.ndarray, bits: int) -> np.ndarray:
    if bits == 8:
        return codes
    low, high = codes & 0x0F, codes >> 4
    return np.stack([low, high], axis=-1).reshape(codes.shape[0], codes.shape[1], -1)


def _block_scales(blocks: np.ndarray, max_code: int) -> np.ndarray:
    """Per-block scale: on an exact integer grid when the block has one, else amax / max_code."""
    amax = np.abs(blocks).max(axis=-1)                                  # [B]
    scale = np.where(amax > 0, amax / max_code, 1.0).astype(np.float32)
    todo = np.flatnonzero(amax > 0)
    for m in _GRID_CANDIDATES:
        if m > max_code or todo.size == 0:
            continue
        d = amax[todo] / m
        # A block off the grid is usually off it in its first few values already: test those first
        # and the whole block only where they pass (the same test, on fewer values; ~4x faster).
        head = blocks[todo, :_GRID_SAMPLE] / d[:, None]
        maybe = np.flatnonzero(np.abs(head - np.round(head)).max(axis=-1) < 1e-3)
        r = blocks[todo[maybe]] / d[maybe, None]
        on_grid = np.zeros(todo.size, bool)
        on_grid[maybe[np.abs(r - np.round(r)).max(axis=-1) < 1e-3]] = True
        hit = todo[on_grid]
        scale[hit] = d[on_grid] / (max_code // m)
        todo = todo[~on_grid]
    return scale


def quantize(w: np.ndarray, fmt: QuantFormat, rows_per_chunk: int = 16384) -> Quantized:
    """w: float32 [N, K] (rows = output features) -> block codes and scales."""
    n, k = w.shape
    bits, block = fmt.bits, fmt.block
    if k % block:
        raise RequestError("bad_option", f"K={k} is not a multiple of the block size {block}; choose a --block-size that divides it")
    max_code, zero = 2 ** (bits - 1) - 1, 2 ** (bits - 1)
    kb = k // block
    codes = np.empty((n, kb, block * bits // 8), np.uint8)
    scales = np.empty((n, kb), np.float32)
    exact_blocks, max_err = 0, 0.0
    for r0 in range(0, n, rows_per_chunk):                                  # bounded temporaries
        blocks = np.asarray(w[r0:r0 + rows_per_chunk], np.float32).reshape(-1, block)
        scale = _block_scales(blocks, max_code)
        q = np.clip(np.round(blocks / scale[:, None]), -max_code - 1, max_code).astype(np.int16)
        err = np.abs(q * scale[:, None] - blocks).max(axis=-1)
        exact_blocks += int(np.count_nonzero(err <= 1e-6 * np.abs(blocks).max(axis=-1)))
        max_err = max(max_err, float(err.max()))
        q = (q + zero).astype(np.uint8)
        rows = q.shape[0] // kb
        packed = q if bits == 8 else (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
        codes[r0:r0 + rows] = packed.reshape(rows, kb, -1)
        scales[r0:r0 + rows] = scale.reshape(rows, kb)
    return Quantized(codes, scales, exact_blocks / (n * kb), max_err)


def quantize_best_block(w: np.ndarray, fmt: QuantFormat) -> tuple[QuantFormat, Quantized]:
    """Use the policy's block, or 16 when that keeps clearly more blocks exact (e.g. GGUF Q6_K)."""
    first = quantize(w, fmt)
    if first.exact_fraction >= 0.99 or fmt.block == 16 or w.shape[1] % 16:
        return fmt, first
    alt_fmt = QuantFormat(fmt.kind, 16, fmt.compute)
    alt = quantize(w, alt_fmt)
    return (alt_fmt, alt) if alt.exact_fraction > first.exact_fraction + 0.5 else (fmt, first)


_PACKS = {  # fusion -> (member suffixes in output order, packed suffix)
    "qkv": ((".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj"), ".self_attn.qkv_proj"),
    "gate-up": ((".mlp.gate_proj", ".mlp.up_proj"), ".mlp.gate_up_proj"),
}


def _packed(weights, fusions: frozenset[str]):
    """Concatenate the members of each enabled pack along the output axis ([in, out] layout; biases 1-D).

    Row-wise block quantization runs along K per output feature, so packing first gives exactly the
    codes each member would have had on its own."""
    pending: dict[str, dict[str, np.ndarray]] = {}
    for name, array in weights:
        hit = None
        for fusion, (members, packed) in _PACKS.items():
            if fusion not in fusions:
                continue
            for member in members:
                for kind in (".weight", ".bias"):
                    if name.endswith(member + kind):
                        hit = (name[: -len(member + kind)], members, packed, member, kind)
        if hit is None:
            yield name, array
            continue
        prefix, members, packed, member, kind = hit
        group = pending.setdefault(prefix + packed + kind, {})
        group[member] = array
        if len(group) == len(members):
            yield prefix + packed + kind, np.concatenate([group[m] for m in members], axis=-1)
            del pending[prefix + packed + kind]
    assert not pending, f"incomplete packs: {sorted(pending)}"


def store_weights(spec, family, tensors, table: dict[str, QuantFormat], store, progress=None,
                  fusions: frozenset[str] = frozenset(), overrides: tuple = (),
                  code_range: int = FULL_INT8_RANGE) -> dict[str, dict]:
    """Run the family's weights through the policy into the store; returns the per-tensor record.

    `overrides` (compiler/quant_spec.py, from --quant) replace the table's format per module class,
    and per layer for attention and MLP weights. `code_range` bounds the int8 codes that meet u8
    activations in an integer GEMM (the coarse head's several-row copy): CpuFeatures.int8_code_range.

    Linear weights arrive as [in, out] (MatMul layout) and are quantized as [out, in] rows. With tied
    embeddings and a quantized embedding, one set of int8 codes serves both the lookup and the lm_head.
    """
    record: dict[str, dict] = {}

    def put_quantized(name: str, w_nk: np.ndarray, fmt: QuantFormat) -> None:
        fmt, q = quantize_best_block(w_nk, fmt)
        n, k = w_nk.shape
        store.add_quantized(name, QuantInfo(fmt.bits, fmt.block, n, k, fmt.accuracy_level), q.codes, q.scales)
        record[name] = {**fmt.to_json(), "module": module_class(name), "exact_blocks": round(q.exact_fraction, 4),
                        "max_abs_error": q.max_abs_error}

    def put_expert_stack(name: str, w_enk: np.ndarray, fmt: QuantFormat) -> None:
        """[E, N, K] -> codes [E, N, K*bits/8], scales [E, N, K/block]: each expert's rows as
        MatMulNBits would store them, which is QMoE's raw layout too. One block size for every
        expert stack (QMoE takes a single block_size for both of a layer's stacks)."""
        e, n, k = w_enk.shape
        q = quantize(w_enk.reshape(e * n, k), fmt)
        store.add_quantized(name, QuantInfo(fmt.bits, fmt.block, n, k, fmt.accuracy_level),
                            q.codes.reshape(e, n, -1), q.scales.reshape(e, n, -1))
        record[name] = {**fmt.to_json(), "module": "experts", "exact_blocks": round(q.exact_fraction, 4),
                        "max_abs_error": q.max_abs_error}

    from calculet.compiler.quant_spec import format_for

    table = {**table, **{o.module: o.fmt for o in overrides if o.layers is None}}  # whole-module overrides
    for name, array in _packed(family.prepare_weights(spec, tensors), fusions):
        cls = module_class(name)
        fmt = format_for(name, cls, table, overrides)
        if fmt.kind == "fp16":
            _put_half(spec, store, record, name, array, cls, table)
        elif cls == "embedding":
            head_fmt = table.get("lm_head", FP32)
            if fmt.kind != "fp32" and spec.tie_word_embeddings:
                if head_fmt != fmt:
                    raise RequestError("bad_option", "a tied embedding and lm_head must share one format; "
                                       f"got embedding {fmt.to_json()} and lm_head {head_fmt.to_json()}")
                put_quantized(name, array, fmt)
                info = store.quant(name)
                store.add_alias(f"{name}.gather_codes", f"{name}.qcodes", (info.n, info.k * info.bits // 8))
            else:
                store.add(name, array)
                record[name] = {**FP32.to_json(), "module": cls}
                if spec.tie_word_embeddings and head_fmt.kind != "fp32":
                    put_quantized("lm_head.weight", array, head_fmt)
        elif cls == "lm_head" and fmt.kind != "fp32":
            put_quantized(name, array, fmt)                      # [V, H] is already [N, K]
        elif cls in ("attention", "mlp") and fmt.kind != "fp32":
            put_quantized(name, np.ascontiguousarray(array.T), fmt)
        elif cls == "experts" and fmt.kind != "fp32":
            put_expert_stack(name, array, fmt)
        else:
            store.add(name, array)
            record[name] = {**FP32.to_json(), "module": cls}
        if progress is not None:
            progress.update(1)
    if "coarse-head" in fusions:
        _add_coarse_head(spec, store, record, table, code_range)
    return record


# The one-row coarse copy's block. Block 128 was faster (2.8 ms a row against 3.7 for block 64 on a Zen 4
# EPYC) but missed: on the default model's hidden states over the reference passages (ru, zh, ja, ko/ar/hi)
# the int8 head's top token fell outside block 128's 64 candidates at 9 of 936 positions (up to rank
# 1,399), so a lane decoding alone picked another greedy token than the same lane batched (the int8 rows
# of the several-row head found it every time). Block 64 puts it at rank 106 at worst, inside the
# graph's candidate pool (graphs.CANDIDATE_POOL x K) at every one of them.
COARSE_BLOCKS = (64, 32, 16)


def _put_half(spec, store, record: dict, name: str, array: np.ndarray, cls: str, table: dict) -> None:
    """fp16 copy of a weight. A tied embedding serves the lm_head only when both are fp16."""
    if cls == "embedding" and spec.tie_word_embeddings and table.get("lm_head", FP32).kind != "fp16":
        raise RequestError("bad_option", "a tied embedding and lm_head must share one format; "
                           f"got embedding fp16 and lm_head {table.get('lm_head', FP32).to_json()}")
    if np.abs(array).max(initial=0.0) > np.finfo(np.float16).max:
        raise RequestError("bad_option", f"weight {name!r} has values beyond the fp16 range (65504); use --weights fp32 or int8")
    half = array.astype(np.float16)
    store.add(name, half)
    err = float(np.abs(half.astype(np.float32) - array).max(initial=0.0))
    record[name] = {"kind": "fp16", "block": 0, "compute": "fp16", "module": cls, "max_abs_error": err}


def int8_block_values(store, name: str) -> np.ndarray:
    """The exact float32 values [out, in] of `name`'s stored 8-bit blocks ((code - 128) x block scale)."""
    info = store.quant(name)
    codes, scales = store.array(f"{name}.qcodes"), store.array(f"{name}.qscales")
    return ((codes.astype(np.float32) - 128.0) * scales[:, :, None]).reshape(info.n, info.k)


# COARSE8_PAIRED: why the several-row coarse copy is pair-bounded rather than 7-bit where the CPU has no
# int8 dot (it was 7-bit until 2026-12-07). Over 2,855 final hidden states of the default model (the 16
# reference passages, teacher-forced and continued greedily, and English docs text, from the fp32
# reference; benchmarks/results/coarse_head_20261207_intel/), the exact head's top token ranked at worst 43rd
# among 7-bit coarse logits and 16th among pair-bounded ones (full-range codes: 20th), and all of its
# top 64 were among the 128 candidates at 98.4 % of the positions with 7-bit codes and 99.7 % with
# pair-bounded or full-range ones. The kernel, and so the time, is the same.
def _add_coarse_head(spec, store, record: dict, table: dict, code_range: int = FULL_INT8_RANGE) -> None:
    """The "coarse-head" pass: an int4 copy of an int8 lm_head picks K candidates per row, and the
    candidates are rescored exactly from the int8 codes (GatherBlockQuantized rows . hidden). The
    int4 matrix is half the bytes a decode step must read; the answer for greedy and top-k <= K is
    the int8 head's whenever its top tokens are among the K candidates."""
    from calculet.models.base import lm_head_name

    head = lm_head_name(spec, store)
    info = store.quant(head)
    if info is None or info.bits != 8:
        return  # only an int8 head has exact codes to rescore from
    if f"{head}.gather_codes" not in store:
        store.add_alias(f"{head}.gather_codes", f"{head}.qcodes", (info.n, info.k))
    block = next((b for b in COARSE_BLOCKS if info.k % b == 0), None)
    if block is None:
        return  # no block size divides the hidden size: no candidate copy
    coarse = QuantFormat("int4", block, "int8")
    w = int8_block_values(store, head)                                             # the int8 head, exactly
    put = quantize(w, coarse)
    store.add_quantized("lm_head.coarse", QuantInfo(4, coarse.block, info.n, info.k, coarse.accuracy_level),
                        put.codes, put.scales)
    record["lm_head.coarse"] = {**coarse.to_json(), "module": "lm_head", "exact_blocks": round(put.exact_fraction, 4),
                                "max_abs_error": put.max_abs_error, "role": "candidate selection (1 row); rescored from " + head}
    # For several rows at once ONNX Runtime's int8 GEMM (DynamicQuantizeMatMul, per-column scales)
    # beats the block kernels: measured 9.2 ms vs 13.0 ms (int4) for 8 rows of the default model's head.
    # Its u8 x s8 GEMM saturates 16-bit pair sums on x86 without VNNI/AMX: there the codes are pair-bounded
    # along H (compiler/int8_pairs.py), which that kernel multiplies exactly. Pair-bounded codes pick
    # better candidates than 7-bit ones in the same time (COARSE8_PAIRED above).
    paired = code_range < FULL_INT8_RANGE
    codes8, scale = column_codes(w, paired)                                        # [V, H], [V]
    store.add("lm_head.coarse8.weight", np.ascontiguousarray(codes8.T))            # [H, V]
    store.add("lm_head.coarse8.scale", scale.astype(np.float32))
    err = float(np.abs(codes8 * scale[:, None] - w).max())
    coding = f"; codes pair-bounded: |c[2j]| + |c[2j+1]| <= {PAIR_SUM_LIMIT}" if paired else ""
    record["lm_head.coarse8"] = {"kind": "int8", "block": info.k, "compute": "int8", "module": "lm_head",
                                 "exact_blocks": 0.0, "max_abs_error": err, "code_range": FULL_INT8_RANGE,
                                 **({"pair_sum": PAIR_SUM_LIMIT} if paired else {}),
                                 "role": f"candidate selection (several rows, per-column scales{coding}); "
                                         f"rescored from {head}"}
