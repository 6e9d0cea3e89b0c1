"""Every tensor `compile` stores in weights.bin, listed from the model description alone.

    weight_plan(spec, options) -> WeightPlan        (no weight is read)

The rules are `quantize.store_weights`'s, as shapes and formats instead of arrays, so `calculet plan`
reports what `compile` writes and `compile` checks what it wrote against this list (`check_stored`):
- attention / mlp / lm_head / embedding follow `policy_table`; norms, biases and the MoE router stay
  fp32; routed experts (two stacks per sparse layer, compiler/moe.py) take the `experts` format;
- int8/int4 weights store codes (N·K·bits/8 bytes) and one float32 scale per block of K;
- a tied, quantized embedding stores its codes once (the lm_head reads the same bytes); a tied fp32
  embedding with a quantized lm_head gets a quantized lm_head copy;
- the coarse-head pass adds an int4 copy and an int8 per-row copy of an int8 lm_head;
- packing (qkv, gate-up) concatenates members along the output axis: same bytes, one name;
- rope cos/sin tables [context, head_dim/2] fp32 per layer type sit in the same file;
- the prefill-int8 pass adds per-column int8 copies and float32 outlier rows of its projections, and
  on a CPU without an int8 dot product a float32 copy of each down_proj.
Tensor-parallel splits are declared per tensor (`Split`) for the planner; the compiler has one chip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from calculet.compiler.isa_policy import concrete_policy   # `auto`: the policy compile picks on this CPU
from calculet.compiler import prefill_int8
from calculet.compiler.prefill_int8 import FLOAT32_PREFILL, PROJECTED, TWO_LEVEL_PREFILL, outlier_count
from calculet.cpu_features import detect
from calculet.compiler.quantize import COARSE_BLOCKS, FP32, QuantFormat, policy_table
from calculet.compiler.weights import ALIGN
from calculet.errors import RequestError
from calculet.models import family_for
from calculet.models.base import ModelSpec

FLOAT_BYTES = {"fp32": 4, "fp16": 2}
# Roles: a parameter of the model, another encoding of one already listed, or a lookup table.
PARAMETER, COPY, TABLE = "parameter", "copy", "table"
# Shard units: q heads, KV heads, an FFN width (dense, expert or shared), vocabulary rows.
UNITS = ("heads", "kv_heads", "ffn", "vocab")


@dataclass(frozen=True)
class Split:
    """How tensor parallelism cuts one axis: the axis is the concatenation of `parts` (unit, size)."""
    axis: int
    parts: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class StoredTensor:
    name: str                  # a quantized weight is stored as <name>.qcodes and <name>.qscales
    module: str                # module class: embedding, attention, mlp, experts, router, lm_head, norm, other, rope
    shape: tuple[int, ...]     # [N, K] = [out, in] as quantized; 1-D for norms and biases
    fmt: QuantFormat
    role: str = PARAMETER
    split: Split | None = None  # None: replicated on every chip

    @property
    def params(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.fmt, self.shape)

    def stored(self, block: int | None = None) -> tuple[tuple[str, int], ...]:
        """(name in weights.bin, bytes) of each stored array; `block` overrides the format's block."""
        fmt = self.fmt if block is None else QuantFormat(self.fmt.kind, block, self.fmt.compute)
        sizes = array_bytes(fmt, self.shape)
        if fmt.kind in FLOAT_BYTES:
            names = (self.name,)
        elif self.name == "lm_head.coarse8" or self.name.endswith(".rows8"):  # int8 [in, out], a scale per output
            names = (f"{self.name}.weight", f"{self.name}.scale")
        else:
            names = (f"{self.name}.qcodes", f"{self.name}.qscales")
        return tuple(zip(names, sizes))


def array_bytes(fmt: QuantFormat, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The arrays one tensor is stored as: (elements,) in fp32/fp16, or (codes, float32 scales)
    with one scale per block of K (a row's last partial block, possible only per chip, counts whole)."""
    if fmt.kind in FLOAT_BYTES:
        return (math.prod(shape) * FLOAT_BYTES[fmt.kind],)
    n, k = shape
    blocks = -(-k // fmt.block)
    return n * blocks * (fmt.block * fmt.bits // 8), n * blocks * 4


def tensor_bytes(fmt: QuantFormat, shape: tuple[int, ...]) -> int:
    """Bytes of one tensor as the compiler stores it (all its arrays)."""
    return sum(array_bytes(fmt, shape))


@dataclass(frozen=True)
class WeightPlan:
    policy: str
    tensors: tuple[StoredTensor, ...]   # in the order compile stores them

    @property
    def file_bytes(self) -> int:
        """weights.bin size: every stored array at a 64-byte aligned offset, in order."""
        size = 0
        for t in self.tensors:
            for _, nbytes in t.stored():
                size = -(-size // ALIGN) * ALIGN + nbytes
        return size

    def by_module(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.module] = out.get(t.module, 0) + t.nbytes
        return out


class WeightOptions(Protocol):
    """What the stored weights depend on: `CompileOptions`, or the planner's `PlanRequest`."""
    weights: str
    block_size: int
    fusions: frozenset[str]
    context: int


def weight_plan(spec: ModelSpec, options: WeightOptions) -> WeightPlan:
    """`options.quant` (CompileOptions' --quant overrides, when it has them) apply as in store_weights."""
    overrides = tuple(getattr(options, "quant", ()))
    weights = concrete_policy(options.weights, getattr(options, "target", "cpu"))
    table = policy_table(weights, options.block_size)
    table = {**table, **{o.module: o.fmt for o in overrides if o.layers is None}}
    tensors = [*_parameters(spec, table, options.fusions, overrides)]
    if "coarse-head" in options.fusions:
        tensors += _coarse_head(spec, tensors)
    tensors += _rope_tables(spec, options.context)
    cpu = detect()   # as compile resolves the pass on this CPU
    if prefill_int8.applicable(options, cpu) is None:
        outliers = 0 if prefill_int8.smooths(options) else options.prefill_int8_outliers
        tensors += _prefill_int8(tensors, outliers, prefill_int8.float32_prefill(cpu),
                                 prefill_int8.two_level_prefill(cpu))
    for t in tensors:
        if t.fmt.kind in ("int8", "int4") and t.shape[1] % t.fmt.block:
            raise RequestError("bad_option", f"K={t.shape[1]} is not a multiple of the block size {t.fmt.block}; "
                               f"choose a --block-size that divides it")
    return WeightPlan(weights, tuple(tensors))


def _parameters(spec: ModelSpec, table: dict[str, QuantFormat], fusions: frozenset[str], overrides: tuple = ()):
    from calculet.compiler.quant_spec import format_for

    fmt = lambda cls: table.get(cls, FP32)  # noqa: E731
    in_layer = lambda p, cls: format_for(f"{p}.{cls}.", cls, table, overrides)  # noqa: E731  (per-layer --quant)
    h, v, hd = spec.hidden_size, spec.vocab_size, spec.head_dim
    q, kv = spec.num_heads * hd, spec.num_kv_heads * hd
    vocab_rows = Split(0, (("vocab", v),))
    emb, head = fmt("embedding"), fmt("lm_head")
    tied_codes = spec.tie_word_embeddings and emb.kind not in ("fp32", "fp16")
    if emb.kind == "fp16" or tied_codes:
        yield StoredTensor("model.embed_tokens.weight", "embedding", (v, h), emb, split=vocab_rows)
    else:  # an untied or fp32 embedding is stored in fp32; a quantized head then needs its own copy
        yield StoredTensor("model.embed_tokens.weight", "embedding", (v, h), FP32, split=vocab_rows)
        if spec.tie_word_embeddings and head.kind != "fp32":
            yield StoredTensor("lm_head.weight", "lm_head", (v, h), head, COPY, vocab_rows)
    norms = family_for({"model_type": spec.model_type}).LAYER_NORMS
    for i in range(spec.num_layers):
        p = f"model.layers.{i}"
        for norm in norms:
            yield StoredTensor(f"{p}.{norm}.weight", "norm", (h,), FP32)
        a = in_layer(p, "attention")
        qkv = (("q_proj", "heads", q), ("k_proj", "kv_heads", kv), ("v_proj", "kv_heads", kv))
        if "qkv" in fusions:
            parts = tuple((unit, n) for _, unit, n in qkv)
            yield StoredTensor(f"{p}.self_attn.qkv_proj.weight", "attention", (q + 2 * kv, h), a, split=Split(0, parts))
        else:
            for proj, unit, n in qkv:
                yield StoredTensor(f"{p}.self_attn.{proj}.weight", "attention", (n, h), a, split=Split(0, ((unit, n),)))
        yield StoredTensor(f"{p}.self_attn.o_proj.weight", "attention", (h, q), a, split=Split(1, (("heads", q),)))
        if spec.qkv_bias:
            if "qkv" in fusions:
                parts = tuple((unit, n) for _, unit, n in qkv)
                yield StoredTensor(f"{p}.self_attn.qkv_proj.bias", "other", (q + 2 * kv,), FP32, split=Split(0, parts))
            else:
                for proj, unit, n in qkv:
                    yield StoredTensor(f"{p}.self_attn.{proj}.bias", "other", (n,), FP32, split=Split(0, ((unit, n),)))
        if spec.qk_norm:
            for which in ("q_norm", "k_norm"):
                yield StoredTensor(f"{p}.self_attn.{which}.weight", "norm", (hd,), FP32)
        if spec.moe and spec.moe.is_sparse(i):
            yield from _expert_block(spec, p, in_layer(p, "experts"), in_layer(p, "mlp"))
        else:
            yield from _gated_mlp(f"{p}.mlp", "mlp", spec.intermediate_size, h, in_layer(p, "mlp"), fusions)
    yield StoredTensor("model.norm.weight", "norm", (h,), FP32)
    if not spec.tie_word_embeddings:
        yield StoredTensor("lm_head.weight", "lm_head", (v, h), head, split=vocab_rows)


def _gated_mlp(prefix: str, module: str, f: int, h: int, fmt: QuantFormat, fusions=frozenset()):
    cols, rows = Split(0, (("ffn", f),)), Split(1, (("ffn", f),))
    if "gate-up" in fusions:
        yield StoredTensor(f"{prefix}.gate_up_proj.weight", module, (2 * f, h), fmt, split=Split(0, (("ffn", f),) * 2))
    else:
        yield StoredTensor(f"{prefix}.gate_proj.weight", module, (f, h), fmt, split=cols)
        yield StoredTensor(f"{prefix}.up_proj.weight", module, (f, h), fmt, split=cols)
    yield StoredTensor(f"{prefix}.down_proj.weight", module, (h, f), fmt, split=rows)


def _expert_block(spec: ModelSpec, p: str, fmt: QuantFormat, mlp: QuantFormat):
    """compiler/moe.py's tensors (models/qwen3_moe.py lays them out): the router in fp32, then two
    expert stacks in the experts format, gate/up [E, 2I, H] (each expert's gate and up rows
    interleaved) and down [E, H, I], quantized row by row like [E*2I, H] and [E*H, I] matrices;
    Qwen2-MoE's shared expert is a dense MLP in the mlp format with an fp32 [H -> 1] gate."""
    moe, h = spec.moe, spec.hidden_size
    e, f = moe.num_experts, moe.expert_intermediate_size
    yield StoredTensor(f"{p}.mlp.gate.weight", "router", (e, h), FP32)
    yield StoredTensor(f"{p}.mlp.experts.gate_up_proj.weight", "experts", (e * 2 * f, h), fmt,
                       split=Split(0, (("ffn", f),) * (2 * e)))
    yield StoredTensor(f"{p}.mlp.experts.down_proj.weight", "experts", (e * h, f), fmt, split=Split(1, (("ffn", f),)))
    if moe.shared_expert_intermediate_size:
        yield from _gated_mlp(f"{p}.mlp.shared_expert", "mlp", moe.shared_expert_intermediate_size, h, mlp)
        yield StoredTensor(f"{p}.mlp.shared_expert_gate.weight", "router", (1, h), FP32)


def _coarse_head(spec: ModelSpec, tensors: list[StoredTensor]) -> list[StoredTensor]:
    """quantize._add_coarse_head: an int8 head (own or tied codes) gets an int4 and an int8 copy."""
    by_name = {t.name: t for t in tensors}
    head = by_name.get("lm_head.weight") or by_name["model.embed_tokens.weight"]
    if head.fmt.kind != "int8":
        return []
    v, h = head.shape
    block = next((b for b in COARSE_BLOCKS if h % b == 0), None)
    if block is None:
        return []
    rows = Split(0, (("vocab", v),))
    return [StoredTensor("lm_head.coarse", "lm_head", (v, h), QuantFormat("int4", block, "int8"), COPY, rows),
            StoredTensor("lm_head.coarse8", "lm_head", (v, h), QuantFormat("int8", h, "int8"), COPY, rows)]


def _prefill_int8(tensors: list[StoredTensor], k: int, float32_prefill: bool,
                  two_level: bool) -> list[StoredTensor]:
    """prefill_int8.add_smoothed_weights / add_weights: each int8 projection of prefill_int8.PROJECTED gets
    per-column int8 codes [in, out] with scales, and where `k` > 0 (no smoothing) its float32 outlier input
    rows [k', out] (one chip: no split);
    then, on a CPU without an int8 dot product, add_float32_copies: each int8 weight of
    FLOAT32_PREFILL gets a float32 copy [in, out]; on a CPU with AMX, add_two_level_weights: each
    int8 weight of TWO_LEVEL_PREFILL gets per-column int8 codes [in, out] with scales."""
    out = []
    for t in tensors:   # as prefill_int8.projections: int8 blocks with int8 compute (not the weight-only reference)
        if t.fmt.kind == "int8" and t.fmt.compute == "int8" and t.name.endswith(tuple(PROJECTED)):
            n, h = t.shape
            out.append(StoredTensor(f"{t.name}.rows8", t.module, (n, h), QuantFormat("int8", h, "int8"), COPY))
            if k:
                out.append(StoredTensor(f"{t.name}.outliers.weight", t.module, (outlier_count(k, h), n), FP32, COPY))
    if not out:   # no projection to run that way: compile turns the pass off
        return []
    if float32_prefill:
        out += [StoredTensor(f"{t.name}.f32", t.module, t.shape, FP32, COPY) for t in tensors
                if t.fmt.kind == "int8" and t.name.endswith(FLOAT32_PREFILL)]
    if two_level:
        out += [StoredTensor(f"{t.name}.rows8", t.module, t.shape, QuantFormat("int8", t.shape[1], "int8"), COPY)
                for t in tensors if t.fmt.kind == "int8" and t.name.endswith(TWO_LEVEL_PREFILL)]
    return out


def _rope_tables(spec: ModelSpec, context: int) -> list[StoredTensor]:
    out = []
    for layer_type in ("full", "sliding"):
        if layer_type in spec.layer_types:
            out += [StoredTensor(f"rope.{layer_type}.{f}", "rope", (context, spec.head_dim // 2), FP32, TABLE)
                    for f in ("cos", "sin")]
    return out


def check_stored(plan: WeightPlan, store, record: dict[str, dict]) -> None:
    """The compiler wrote exactly what the plan lists: same arrays, same order, same bytes.

    Where the encoder chose a finer block than the policy's (an exact GGUF grid, see
    `quantize.quantize_best_block`), the record's block is used. A mismatch is a compiler bug."""
    expected = []
    for t in plan.tensors:
        block = record.get(t.name, {}).get("block") if t.fmt.kind in ("int8", "int4") else None
        expected += t.stored(block)
    actual = [(e.name, e.nbytes) for e in store.entries if e.name in store]
    if expected != actual:
        missing = [x for x in expected if x not in actual][:3]
        extra = [x for x in actual if x not in expected][:3]
        raise AssertionError(f"compiler/weight_plan.py disagrees with what store_weights wrote: "
                             f"planned but not stored {missing}, stored but not planned {extra}")
