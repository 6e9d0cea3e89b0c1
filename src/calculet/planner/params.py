"""Parameters and weight bytes per module class, per chip, from the compiler's own tensor list.

`compiler/weight_plan.py` lists every tensor `compile` stores (name, module class, shape, format);
this module counts parameters and splits each tensor over chips as its `Split` declares.

Tensor-parallel layout (Megatron style), stated once here and echoed in each plan:
- q/k/v projections split by head (column parallel); o_proj split along its input (row parallel).
  KV heads are split too; with fewer KV heads than chips each KV head is replicated on
  `chips / kv_heads` chips, so every chip holds one.
- Dense MLP and each expert: gate/up split along the FFN width, down along its input. All experts
  stay resident on every chip (tensor parallel inside each expert, no expert parallelism).
- Embeddings, lm_head and its coarse copies split by vocabulary rows (padded to a multiple of chips).
- Norms, q/k norms, routers and rope tables are replicated on every chip.
The compiler builds one chip today; for chips > 1 this is the split a partitioned compile would do.
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.compiler.weight_plan import COPY, PARAMETER, StoredTensor, WeightPlan, tensor_bytes
from calculet.errors import RequestError
from calculet.models.base import ModelSpec

# Module classes in report order (compiler/quantize.module_class, plus the MoE classes and rope).
MODULES = ("embedding", "attention", "mlp", "experts", "router", "lm_head", "norm", "other", "rope")


def _split(n: int, chips: int) -> int:
    return -(-n // chips)


@dataclass(frozen=True)
class Sharding:
    chips: int
    q_heads_per_chip: int
    kv_heads_per_chip: int
    kv_replicas: int          # copies of each KV head across chips (1: split, >1: replicated)
    notes: tuple[str, ...]


def shard(spec: ModelSpec, chips: int) -> Sharding:
    """Head split over `chips`; raises `RequestError(bad_parallelism)` when heads do not divide."""
    heads, kv = spec.num_heads, spec.num_kv_heads
    if heads % chips:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0]
        raise RequestError("bad_parallelism", f"{heads} query heads do not split evenly over {chips} "
                           f"chips; chips must divide the head count: {', '.join(map(str, divisors))}")
    notes = [f"tensor parallel over {chips} chip(s): {heads // chips} of {heads} query heads per chip"]
    if kv >= chips:
        if kv % chips:
            raise RequestError("bad_parallelism", f"{kv} KV heads do not split evenly over {chips} "
                               f"chips; use a chip count that divides {kv} or is a multiple of it")
        kv_per_chip, replicas = kv // chips, 1
        notes.append(f"{kv_per_chip} of {kv} KV heads per chip")
    else:
        if chips % kv:
            raise RequestError("bad_parallelism", f"{kv} KV heads cannot be replicated evenly over "
                               f"{chips} chips; use a chip count that is a multiple of {kv}")
        kv_per_chip, replicas = 1, chips // kv
        notes.append(f"KV heads replicated: {kv} KV head(s) < {chips} chips, so each KV head (its "
                     f"k/v weights and its KV cache) is held on {replicas} chips")
    for what, width in (("MLP width", spec.intermediate_size), ("vocabulary", spec.vocab_size),
                        ("expert width", spec.moe.expert_intermediate_size if spec.moe else 0)):
        if width and width % chips:
            notes.append(f"{what} {width} does not divide by {chips}; padded to "
                         f"{_split(width, chips) * chips}")
    return Sharding(chips, heads // chips, kv_per_chip, replicas, tuple(notes))


def shape_per_chip(t: StoredTensor, spec: ModelSpec, sh: Sharding) -> tuple[int, ...]:
    if t.split is None:
        return t.shape
    hd = spec.head_dim
    per_unit = {"heads": lambda n: n // (spec.num_heads * hd) * sh.q_heads_per_chip * hd,
                "kv_heads": lambda n: n // (spec.num_kv_heads * hd) * sh.kv_heads_per_chip * hd,
                "ffn": lambda n: _split(n, sh.chips), "vocab": lambda n: _split(n, sh.chips)}
    shape = list(t.shape)
    shape[t.split.axis] = sum(per_unit[unit](n) for unit, n in t.split.parts)
    return tuple(shape)


@dataclass(frozen=True)
class ParamRow:
    module: str               # module class
    formats: str              # storage formats in this class, e.g. "int8 b32 (int8 compute), fp32"
    params: int               # parameters of the whole model (copies and tables not counted)
    bytes: int                # stored bytes on one chip (chips = 1: what compile writes)
    bytes_per_chip: int
    replicated_bytes_per_chip: int   # of bytes_per_chip, the tensors every chip holds whole


@dataclass(frozen=True)
class ParamSummary:
    total_params: int
    active_params_per_token: int   # counts the whole embedding and lm_head, as model cards do
    bytes: int                     # all stored tensors on one chip, unpadded
    bytes_per_chip: int
    weights_file_bytes: int        # graphs/weights.bin as compile lays it out (64-byte aligned, one chip)
    rows: tuple[ParamRow, ...]     # by module class, in MODULES order


def format_name(t: StoredTensor) -> str:
    f = t.fmt
    if f.kind in ("fp32", "fp16"):
        return f.kind
    block = "per row" if f.block >= t.shape[1] else f"b{f.block}"
    return f"{f.kind} {block} ({f.compute} compute)"


def summarize_params(spec: ModelSpec, sh: Sharding, plan: WeightPlan) -> ParamSummary:
    rows = []
    for module in MODULES:
        mine = [t for t in plan.tensors if t.module == module]
        if not mine:
            continue
        per_chip = [tensor_bytes(t.fmt, shape_per_chip(t, spec, sh)) for t in mine]
        formats = sorted({format_name(t) for t in mine}, key=lambda f: -sum(
            t.nbytes for t in mine if format_name(t) == f))
        rows.append(ParamRow(module, ", ".join(formats),
                             sum(t.params for t in mine if t.role == PARAMETER),
                             sum(t.nbytes for t in mine), sum(per_chip),
                             sum(b for t, b in zip(mine, per_chip) if t.split is None)))
    total = sum(r.params for r in rows)
    experts = next((r.params for r in rows if r.module == "experts"), 0)
    active = total - experts
    if spec.moe and experts:
        active += experts * spec.moe.experts_per_token // spec.moe.num_experts
    assert all(t.role in (PARAMETER, COPY) or t.module == "rope" for t in plan.tensors)
    return ParamSummary(total, active, sum(r.bytes for r in rows), sum(r.bytes_per_chip for r in rows),
                        plan.file_bytes, tuple(rows))
