"""Every weight tensor of a decoder, as shapes, and how tensor parallelism splits it over chips.

Tensor-parallel layout (Megatron style), stated once here and echoed in each plan:
- q/k/v projections split by head (column parallel); o_proj split along its input (row parallel).
  KV heads are split too; with fewer KV heads than chips each KV head is replicated on
  `chips / kv_heads` chips, so every chip holds one.
- Dense MLP and each expert: gate/up split along the FFN width, down along its input. All experts
  stay resident on every chip (tensor parallel inside each expert, no expert parallelism).
- Embeddings and lm_head split by vocabulary rows (padded up to a multiple of the chip count).
- Norms, q/k norms, routers and the o/down biases are replicated on every chip.
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.calbin.plan_hparams import ModelHParams
from calculet.calbin.plan_quant import MODULES, WeightPolicy
from calculet.errors import RequestError


def _split(n: int, chips: int) -> int:
    return -(-n // chips)


@dataclass(frozen=True)
class Sharding:
    chips: int
    q_heads_per_chip: int
    kv_heads_per_chip: int
    kv_replicas: int          # copies of each KV head across chips (1: split, >1: replicated)
    notes: tuple[str, ...]


def shard(hp: ModelHParams, chips: int) -> Sharding:
    """Head split over `chips`; raises `RequestError(bad_parallelism)` when heads do not divide."""
    heads, kv = hp.num_attention_heads, hp.num_key_value_heads
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
    for what, width in (("MLP width", hp.intermediate_size), ("vocabulary", hp.vocab_size),
                        ("expert width", hp.moe.expert_intermediate_size if hp.moe else 0)):
        if width and width % chips:
            notes.append(f"{what} {width} does not divide by {chips}; padded to "
                         f"{_split(width, chips) * chips}")
    return Sharding(chips, heads // chips, kv_per_chip, replicas, tuple(notes))


@dataclass(frozen=True)
class WeightGroup:
    """`count` tensors of shape `[rows, cols]` (a 1-D tensor has cols = 1), in one module class."""
    name: str
    module: str               # one of plan_quant.MODULES
    rows: int
    cols: int
    rows_per_chip: int
    cols_per_chip: int
    count: int                # tensors of this shape in the whole model
    active_count: int         # of those, how many one token passes through

    @property
    def params(self) -> int:
        return self.rows * self.cols * self.count

    @property
    def active_params(self) -> int:
        return self.rows * self.cols * self.active_count

    @property
    def params_per_chip(self) -> int:
        return self.rows_per_chip * self.cols_per_chip * self.count

    def bytes_per_chip(self, policy: WeightPolicy) -> int:
        fmt = policy.format(self.module)
        return fmt.bytes_for(self.rows_per_chip, self.cols_per_chip) * self.count


def weight_groups(hp: ModelHParams, sh: Sharding) -> tuple[WeightGroup, ...]:
    """All weights of the decoder, grouped by shape. Sums to the model's parameter count."""
    c, h, hd, v = sh.chips, hp.hidden_size, hp.head_dim, hp.vocab_size
    q, kv = hp.num_attention_heads * hd, hp.num_key_value_heads * hd
    q_c, kv_c = sh.q_heads_per_chip * hd, sh.kv_heads_per_chip * hd
    L = hp.num_hidden_layers
    sparse = len(hp.moe.sparse_layers) if hp.moe else 0
    dense = L - sparse

    def g(name, module, rows, cols, rows_c, cols_c, count, active=None):
        return WeightGroup(name, module, rows, cols, rows_c, cols_c, count,
                           count if active is None else active)

    groups = [g("embed_tokens" + (" (tied lm_head)" if hp.tie_word_embeddings else ""), "embedding",
                v, h, _split(v, c), h, 1)]
    groups += [g("q_proj", "attention", q, h, q_c, h, L), g("k_proj", "attention", kv, h, kv_c, h, L),
               g("v_proj", "attention", kv, h, kv_c, h, L), g("o_proj", "attention", h, q, h, q_c, L)]
    if hp.qkv_bias:
        groups += [g("q_proj.bias", "bias", q, 1, q_c, 1, L),
                   g("k_proj.bias + v_proj.bias", "bias", kv, 1, kv_c, 1, 2 * L)]
    if hp.o_bias:
        groups.append(g("o_proj.bias", "bias", h, 1, h, 1, L))
    if hp.qk_norm:
        groups.append(g("q_norm + k_norm", "norm", hd, 1, hd, 1, 2 * L))
    groups.append(g("layer norms", "norm", h, 1, h, 1, hp.norms_per_layer * L))
    if dense:
        f = hp.intermediate_size
        groups += [g("mlp.gate_proj + up_proj", "mlp", f, h, _split(f, c), h, 2 * dense),
                   g("mlp.down_proj", "mlp", h, f, h, _split(f, c), dense)]
        if hp.mlp_bias:
            groups += [g("mlp gate/up bias", "bias", f, 1, _split(f, c), 1, 2 * dense),
                       g("mlp down bias", "bias", h, 1, h, 1, dense)]
    if sparse:
        e, k, f = hp.moe.num_experts, hp.moe.experts_per_token, hp.moe.expert_intermediate_size
        groups += [g("router", "router", e, h, e, h, sparse),
                   g("experts.gate_proj + up_proj", "experts", f, h, _split(f, c), h,
                     2 * e * sparse, 2 * k * sparse),
                   g("experts.down_proj", "experts", h, f, h, _split(f, c), e * sparse, k * sparse)]
    groups.append(g("final norm", "norm", h, 1, h, 1, 1))
    if not hp.tie_word_embeddings:
        groups.append(g("lm_head", "lm_head", v, h, _split(v, c), h, 1))
    return tuple(groups)


@dataclass(frozen=True)
class ParamRow:
    module: str               # module class
    dtype: str                # storage format label, e.g. "int4+fp16/b32"
    params: int               # whole model
    params_per_chip: int
    bytes_per_chip: int


@dataclass(frozen=True)
class ParamSummary:
    total_params: int
    active_params_per_token: int   # counts the whole embedding and lm_head, as model cards do
    params_per_chip: int
    bytes_per_chip: int
    rows: tuple[ParamRow, ...]     # by module class, in plan_quant.MODULES order


def summarize_params(hp: ModelHParams, sh: Sharding, policy: WeightPolicy) -> ParamSummary:
    groups = weight_groups(hp, sh)
    rows = []
    for module in MODULES:
        mine = [grp for grp in groups if grp.module == module]
        if mine:
            rows.append(ParamRow(module, policy.format(module).label,
                                 sum(grp.params for grp in mine),
                                 sum(grp.params_per_chip for grp in mine),
                                 sum(grp.bytes_per_chip(policy) for grp in mine)))
    return ParamSummary(
        total_params=sum(grp.params for grp in groups),
        active_params_per_token=sum(grp.active_params for grp in groups),
        params_per_chip=sum(r.params_per_chip for r in rows),
        bytes_per_chip=sum(r.bytes_per_chip for r in rows),
        rows=tuple(rows),
    )
