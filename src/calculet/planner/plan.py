"""Capacity planner: will this model, at these lanes × context, fit on these chips?

    plan_capacity(model, PlanRequest(...)) -> PlanReport

Per chip it adds up
    weights    = every tensor compile would store with these options (compiler/weight_plan.py:
                 the compiler's policy table and byte formula), split over chips (params.py)
  + KV cache   = (full layers × context + ring layers × ring) × kv_heads_per_chip × 2 × head_dim × lanes
                 × bytes per element; sliding-window layers keep a ring of window + prefill chunk rows
                 when that is shorter than the context (compiler/kv_layout.py, compile's rule)
  + workspace  = the larger of one decode step (all lanes) and one prefill chunk (one lane),
                 compiler/workspace.py (the formula the memory plan uses)
  + step I/O   = inputs and outputs (logits) of one decode step and one prefill chunk
and compares the sum with the device memory less a guard (safety margin). It also searches the
largest lanes at the requested context and the largest context at the requested lanes that fit.
Defaults are what compile builds (fp32 KV, activations and logits); `--kv-dtype fp16` is built too,
`--kv-dtype bf16` and the like are planning assumptions for accelerators, and the report says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass

from calculet.calbin.graphspec import DTYPE_BYTES, KV_DTYPE_OPTIONS
from calculet.compiler.kv_layout import KV_DTYPE_BUILT, layer_lengths, ring_length
from calculet.compiler.options import FUSIONS, PREFILL_INT8_OUTLIERS, PREFILL_INT8_SMOOTH
from calculet.compiler.quantize import policy_table
from calculet.compiler.weight_plan import weight_plan
from calculet.compiler.workspace import workspace_bytes as _workspace
from calculet.errors import RequestError
from calculet.models.base import ModelSpec
from calculet.planner.params import ParamSummary, Sharding, shard, summarize_params
from calculet.planner.source import PlannedModel
from calculet.units import MAX_DEVICE_BYTES, MIN_DEVICE_BYTES, human_bytes

COMPILED_DTYPE = "fp32"   # compile's KV cache, activations and logits
# --kv-dtype -> bytes per value: compile's names (calbin KV_DTYPE_OPTIONS, sized by DTYPE_BYTES), plus fp8
# for accelerator planning. compile builds KV_DTYPE_BUILT (fp32, fp16); the others are planning assumptions.
KV_DTYPES = {**{name: DTYPE_BYTES[dtype] for name, dtype in KV_DTYPE_OPTIONS.items()}, "fp8": 1}
ACT_DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2}
MAX_LANES = 1 << 16
MAX_CONTEXT = 1 << 24
MAX_CHIPS = 1024
MAX_GUARD_FRACTION = 0.9
# Per-step inputs: input_ids int64, position_ids int64 per token; seqlens_k int32 per lane;
# total_sequence_length int32 once.
_INPUT_BYTES_PER_TOKEN = 8 + 8
_INPUT_BYTES_PER_LANE = 4
_INPUT_BYTES_FIXED = 4


@dataclass(frozen=True)
class PlanRequest:
    lanes: int                        # batch rows of the decode graph
    context: int                      # KV positions per lane
    device_memory_bytes: int          # per chip
    chips: int = 1                    # tensor-parallel degree
    kv_dtype: str = COMPILED_DTYPE    # compile's --kv-dtype (fp32, fp16); bf16, int8, fp8: planning assumptions
    weights: str = "default"          # compile's weight policy (compiler/quantize.policy_table)
    block_size: int = 32              # int8/int4 block size, as compile --block-size
    activation_dtype: str = COMPILED_DTYPE
    logits_dtype: str = COMPILED_DTYPE
    prefill_chunk: int = 128          # tokens per prefill step (compile's largest default chunk)
    guard_fraction: float = 0.10      # share of device memory held back
    fusions: frozenset[str] = frozenset(FUSIONS)   # compile's passes; coarse-head adds lm_head copies
    prefill_int8_smooth: float | None = PREFILL_INT8_SMOOTH   # compile's --prefill-int8-smooth (None: auto; 0: float32 outlier rows too)
    prefill_int8_outliers: int = PREFILL_INT8_OUTLIERS  # compile's prefill-int8 pass (on a VNNI CPU): int8 copies

    def __post_init__(self) -> None:
        for name, limit in (("lanes", MAX_LANES), ("context", MAX_CONTEXT), ("chips", MAX_CHIPS),
                            ("prefill_chunk", MAX_CONTEXT)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
                raise RequestError("bad_argument", f"{name} must be an integer from 1 to {limit:,}, "
                                   f"got {value!r}")
        _check_choice("kv dtype", self.kv_dtype, KV_DTYPES)
        _check_choice("activation dtype", self.activation_dtype, ACT_DTYPES)
        _check_choice("logits dtype", self.logits_dtype, ACT_DTYPES)
        policy_table(self.weights, self.block_size)  # raises on an unknown policy or block size
        if unknown := set(self.fusions) - set(FUSIONS):
            raise RequestError("bad_option", f"unknown fusion {sorted(unknown)}; known: {', '.join(FUSIONS)}")
        if not MIN_DEVICE_BYTES <= self.device_memory_bytes <= MAX_DEVICE_BYTES:
            raise RequestError("bad_size", f"device memory {self.device_memory_bytes:,} B is out of "
                               f"range; allowed {human_bytes(MIN_DEVICE_BYTES)} to "
                               f"{human_bytes(MAX_DEVICE_BYTES)}")
        if not 0.0 <= self.guard_fraction <= MAX_GUARD_FRACTION:
            raise RequestError("bad_argument", f"guard must be from 0% to "
                               f"{MAX_GUARD_FRACTION:.0%} of device memory, got {self.guard_fraction:.1%}")


def _check_choice(what: str, value: str, allowed: dict) -> None:
    if value not in allowed:
        raise RequestError("unknown_dtype", f"unknown {what} {value!r}; allowed: {', '.join(allowed)}")


@dataclass(frozen=True)
class KvPlan:
    dtype: str
    layers: int
    kv_heads: int
    kv_heads_per_chip: int
    head_dim: int
    context: int
    lanes: int
    ring: int | None                  # rows of the sliding-window layers' rings (None: every layer holds the context)
    ring_layers: int                  # layers that keep the ring
    bytes_per_lane_per_chip: int      # (full layers × context + ring layers × ring) × kv heads × 2 × head_dim × bytes
    bytes_per_token_per_chip: int     # one more context position of one lane (the full-context layers), this chip
    bytes_total: int                  # the whole cache, each KV head counted once
    bytes_per_chip: int               # includes replicated KV heads


@dataclass(frozen=True)
class StepIO:
    tokens: int                       # tokens the step processes
    inputs_bytes: int                 # ids, positions, sequence lengths
    logits_bytes: int                 # rows that emit logits × vocab × logits dtype
    outputs_bytes: int                # all outputs; the KV cache is written in place, so = logits


@dataclass(frozen=True)
class Workspace:
    decode_bytes: int                 # one decode step over all lanes
    prefill_bytes: int                # one prefill chunk of one lane
    bytes: int                        # the larger of the two


@dataclass(frozen=True)
class Budget:
    device_memory_bytes: int
    guard_bytes: int
    usable_bytes: int                 # device memory less the guard
    weights_bytes: int
    kv_bytes: int
    workspace_bytes: int
    io_bytes: int                     # decode step and prefill chunk buffers, both allocated
    required_bytes: int
    headroom_bytes: int               # usable - required; negative when it does not fit


@dataclass(frozen=True)
class Fit:
    fits: bool
    max_lanes_at_context: int         # 0: not even one lane fits at this context
    max_context_at_lanes: int         # 0: no context fits at these lanes
    context_limited_by: str           # "memory" or "max_position_embeddings"


@dataclass(frozen=True)
class PlanReport:
    source: str
    model: ModelSpec
    buildable: bool                   # compile can build this family today
    request: PlanRequest
    params: ParamSummary
    kv: KvPlan
    decode: StepIO
    prefill: StepIO
    workspace: Workspace
    budget: Budget
    fit: Fit
    assumptions: tuple[str, ...]
    warnings: tuple[str, ...]
    partition: object = None          # planner/partition.PartitionPlan with --partition pp|tp|ep

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=sorted)  # fusions: a sorted list


def kv_cache_bytes(hp: ModelSpec, lanes: int, context: int, kv_dtype: str, kv_heads: int,
                   prefill_chunk: int | None = None) -> int:
    """Σ over layers of its buffer rows × kv_heads × 2 (K and V) × head_dim × lanes × bytes per element.
    A layer's rows are the context, or with `prefill_chunk` given a sliding-window layer's ring of
    window + prefill_chunk when that is shorter (compile's rule)."""
    lengths = layer_lengths(hp, context, (prefill_chunk,)) if prefill_chunk else (context,) * hp.num_layers
    return sum(lengths) * kv_heads * 2 * hp.head_dim * lanes * KV_DTYPES[kv_dtype]


def step_io(hp: ModelSpec, tokens: int, lanes: int, logit_rows: int, logits_dtype: str) -> StepIO:
    inputs = tokens * _INPUT_BYTES_PER_TOKEN + lanes * _INPUT_BYTES_PER_LANE + _INPUT_BYTES_FIXED
    logits = logit_rows * hp.vocab_size * ACT_DTYPES[logits_dtype]
    return StepIO(tokens, inputs, logits, logits)


def workspace_bytes(hp: ModelSpec, sh: Sharding, lanes: int, tokens: int, context: int, act: str) -> int:
    """compiler/workspace.py's formula, per chip, at the planned activation dtype."""
    return _workspace(hp, lanes, tokens, context, chips=sh.chips, act_bytes=ACT_DTYPES[act])


def plan_capacity(model: PlannedModel, request: PlanRequest, source: str = "") -> PlanReport:
    """The full per-chip memory plan for `request`, with the largest lanes / context that fit."""
    r, hp = request, model.spec
    sh = shard(hp, r.chips)
    params = summarize_params(hp, sh, weight_plan(hp, r))
    rope = params_rope_bytes(params)
    guard = int(r.device_memory_bytes * r.guard_fraction)
    usable = r.device_memory_bytes - guard
    budget_for = _budget_function(hp, sh, r, params.bytes_per_chip - rope, rope // r.context)

    chunk = min(r.prefill_chunk, r.context)
    rows = chunk   # it sizes the sliding-window rings, on one chip and on every chip of a partition alike
    kv_total = kv_cache_bytes(hp, r.lanes, r.context, r.kv_dtype, hp.num_kv_heads, rows)
    kv_chip = kv_cache_bytes(hp, r.lanes, r.context, r.kv_dtype, sh.kv_heads_per_chip, rows)
    ring = ring_length(hp, r.context, (chunk,)) if rows else None
    ring_layers = hp.layer_types.count("sliding") if ring is not None else 0
    per_position = sh.kv_heads_per_chip * 2 * hp.head_dim * KV_DTYPES[r.kv_dtype]
    kv = KvPlan(r.kv_dtype, hp.num_layers, hp.num_kv_heads, sh.kv_heads_per_chip,
                hp.head_dim, r.context, r.lanes, ring, ring_layers,
                kv_cache_bytes(hp, 1, r.context, r.kv_dtype, sh.kv_heads_per_chip, rows),
                (hp.num_layers - ring_layers) * per_position, kv_total, kv_chip)
    decode = step_io(hp, r.lanes, r.lanes, r.lanes, r.logits_dtype)
    prefill = step_io(hp, chunk, 1, 1, r.logits_dtype)
    ws_decode = workspace_bytes(hp, sh, r.lanes, 1, r.context, r.activation_dtype)
    ws_prefill = workspace_bytes(hp, sh, 1, chunk, r.context, r.activation_dtype)
    workspace = Workspace(ws_decode, ws_prefill, max(ws_decode, ws_prefill))
    required = budget_for(r.lanes, r.context)
    budget = Budget(r.device_memory_bytes, guard, usable, params.bytes_per_chip, kv_chip,
                    workspace.bytes, decode.inputs_bytes + decode.outputs_bytes
                    + prefill.inputs_bytes + prefill.outputs_bytes, required, usable - required)
    assert required == (budget.weights_bytes + budget.kv_bytes + budget.workspace_bytes
                        + budget.io_bytes), "budget terms must add up"

    max_lanes = _largest(lambda n: budget_for(n, r.context) <= usable, MAX_LANES)
    model_max = hp.max_position_embeddings
    memory_ctx = _largest(lambda n: budget_for(r.lanes, n) <= usable, MAX_CONTEXT)
    limited_by = "memory"
    if model_max and memory_ctx > model_max:
        memory_ctx, limited_by = model_max, "max_position_embeddings"
    fit = Fit(required <= usable, max_lanes, memory_ctx, limited_by)
    return PlanReport(source, hp, model.buildable, r, params, kv, decode, prefill, workspace, budget, fit,
                      _assumptions(hp, sh, r, chunk), _warnings(model, r))


def params_rope_bytes(params: ParamSummary) -> int:
    """Rope tables grow with the context (the rest of the weights do not)."""
    return next((row.bytes_per_chip for row in params.rows if row.module == "rope"), 0)


def _budget_function(hp: ModelSpec, sh: Sharding, r: PlanRequest, weights: int,
                     rope_per_position: int) -> Callable[[int, int], int]:
    """required bytes per chip as a function of (lanes, context); increasing in both."""
    def required(lanes: int, context: int) -> int:
        chunk = min(r.prefill_chunk, context)
        decode = step_io(hp, lanes, lanes, lanes, r.logits_dtype)
        prefill = step_io(hp, chunk, 1, 1, r.logits_dtype)
        work = max(workspace_bytes(hp, sh, lanes, 1, context, r.activation_dtype),
                   workspace_bytes(hp, sh, 1, chunk, context, r.activation_dtype))
        return (weights + rope_per_position * context
                + kv_cache_bytes(hp, lanes, context, r.kv_dtype, sh.kv_heads_per_chip, chunk)
                + work + decode.inputs_bytes + decode.outputs_bytes
                + prefill.inputs_bytes + prefill.outputs_bytes)
    return required


def _largest(ok: Callable[[int], bool], limit: int) -> int:
    """Largest n in 1..limit with ok(n), for a monotone ok; 0 when ok(1) is false."""
    if not ok(1):
        return 0
    lo, hi = 1, limit  # ok(lo) holds
    if ok(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def _assumptions(hp: ModelSpec, sh: Sharding, r: PlanRequest, chunk: int) -> tuple[str, ...]:
    notes = list(sh.notes)
    if r.chips > 1:
        notes.append("the budget above splits evenly: q/k/v by head, o_proj by input; MLP and each expert "
                     "along the FFN width; embeddings, lm_head and its copies by vocabulary rows; norms, "
                     "routers and rope tables replicated. `--partition pp|tp|ep` adds what compile --chips "
                     "really writes per chip (embedding and lm_head whole on one chip)")
    if hp.moe:
        notes.append(f"all {hp.moe.num_experts} experts resident on every chip "
                     f"({len(hp.moe.sparse_layers)} of {hp.num_layers} layers routed); "
                     f"{hp.moe.experts_per_token} active per token; router fp32, experts in the mlp format")
    notes.append(f"weights: compile's --weights {r.weights} --block-size {r.block_size} policy table; "
                 f"int8/int4 codes plus a float32 scale per block; norms and biases fp32; passes "
                 f"{', '.join(sorted(r.fusions)) or 'none'} (coarse-head adds int4 and int8 lm_head copies)")
    notes.append("a GGUF source whose blocks sit on an exact grid may get block 16 (twice the scales) "
                 "on those tensors")
    if r.kv_dtype not in KV_DTYPE_BUILT:
        notes.append(f"KV cache {r.kv_dtype}: a planning assumption for accelerators; compile builds "
                     f"--kv-dtype {' or '.join(KV_DTYPE_BUILT)}")
    for what, dtype in (("activations", r.activation_dtype), ("logits", r.logits_dtype)):
        if dtype != COMPILED_DTYPE:
            notes.append(f"{what} {dtype}: a planning assumption for accelerators; compile writes "
                         f"{COMPILED_DTYPE} {what}")
    notes += [
        f"KV cache: static {r.kv_dtype} buffers updated in place, the full context for every "
        "full-attention layer and lane" + (f"; sliding-window layers a ring of window {hp.sliding_window} + "
                                           f"prefill chunk {chunk} rows when shorter than the context"
                                           if hp.sliding_window else ""),
        f"workspace: one layer's intermediates live at once, attention scores [heads, tokens, "
        f"context] in fp32 (unfused attention, an upper bound); the larger of one decode step over "
        f"{r.lanes} lane(s) and one prefill chunk of {chunk} tokens (compiler/workspace.py)",
        f"logits: {r.logits_dtype}, gathered to the full vocabulary on every chip (an upper bound); "
        "a prefill chunk emits logits for its last token only",
        "inputs per step: input_ids and position_ids int64 per token, seqlens_k int32 per lane, "
        "total_sequence_length int32; decode and prefill buffers are both allocated",
        f"guard: {r.guard_fraction:.0%} of device memory held back for the runtime, execution "
        "provider context and allocator fragmentation",
        "active parameters per token count the whole embedding and lm_head, as model cards do",
    ]
    return tuple(notes)


def _warnings(model: PlannedModel, r: PlanRequest) -> tuple[str, ...]:
    hp = model.spec
    out = [model.note] if model.note else []
    if hp.max_position_embeddings and r.context > hp.max_position_embeddings:
        out.append(f"context {r.context:,} exceeds the model's max_position_embeddings "
                   f"{hp.max_position_embeddings:,}")
    if hp.sliding_window and r.context < hp.sliding_window:
        out.append(f"context {r.context:,} is below the sliding window {hp.sliding_window:,}; "
                   f"static KV buffers must hold at least the window")
    return tuple(out)
