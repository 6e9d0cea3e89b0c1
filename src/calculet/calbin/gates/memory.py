"""Gate D, memory: the memory plan states what the runtime will really allocate, in bytes.

    weights_bytes  == weights.bytes (the mapped weights file)
    kv             == the KV layout: per layer 2 buffers of [lanes, kv_heads, length, head_dim] x dtype bytes
                      (length = context, or the ring of a sliding-window layer), grouped by length; bytes
                      per lane = (full layers x context + ring layers x ring) x 2 x kv_heads x head_dim x
                      dtype bytes; every body graph's past_* / present_* tensor is a view of its layer's buffer
    staging        == one entry per graph: the bytes of one IO binding (every non-KV input and output;
                      a body's hidden is its head's input) x the bindings the runtime may create
                      (a prefill graph one per first lane, decode and head graphs one, each
                      times STAGING_SLOTS: ping and pong for two jobs in flight)
    total_bytes    == weights + kv + staging
    workspace_estimate_bytes  an estimate of ONNX Runtime's activations: positive and within
                      PLAUSIBLE_FACTOR of the total (a "16777216 MB" typed where bytes were meant is
                      off by a factor of a million)

The runtime allocates from the graphs and the KV layout (runtime/lanes.py, runtime/bindings.py),
not from the plan, so this gate recomputes each number the way the runtime allocates it.
"""

from __future__ import annotations

from calculet.calbin.gates.context import GateContext
from calculet.calbin.graphspec import DTYPE_BYTES, PREFILL, is_kv
from calculet.calbin.memory_plan import STAGING_SLOTS
from calculet.calbin.validate_report import Check, Rule

WEIGHTS = Rule("D.weights", "the plan's weights bytes equal the weights file the runtime maps")
KV = Rule("D.kv", "KV bytes per lane = (full layers x context + ring layers x ring) x 2 x kv_heads x head_dim x "
                  "dtype bytes, as the KV layout says, and every body graph's KV tensors are views of those buffers")
STAGING = Rule("D.staging", "one staging entry per graph, sized as the runtime's IO bindings of that graph")
TOTAL = Rule("D.total", "total_bytes = weights + KV + staging")
WORKSPACE = Rule("D.workspace_plausible", "the workspace estimate is positive and within a sane factor of the total")
RULES = (WEIGHTS, KV, STAGING, TOTAL, WORKSPACE)

PLAUSIBLE_FACTOR = 4.0  # activations add tens of percent to the total, never a multiple of the model


def run(ctx: GateContext) -> list[Check]:
    m = ctx.manifest
    plan = m.memory_plan
    parts = plan.weights_bytes + plan.kv.total_bytes + sum(s.total_bytes for s in plan.staging)
    ratio = (plan.total_bytes + plan.workspace_estimate_bytes) / plan.total_bytes if plan.total_bytes else float("inf")
    return [
        WEIGHTS.check([] if plan.weights_bytes == m.weights.bytes else
                      [f"memory_plan.weights_bytes {plan.weights_bytes} != weights.bytes {m.weights.bytes}"],
                      f"weights {plan.weights_bytes} bytes"),
        KV.check(_kv_problems(m, ctx.kv_layers), f"KV {' + '.join(f'{g.buffers} x {list(g.buffer_shape)}' for g in plan.kv.groups)} "
                                  f"{plan.kv.dtype} = {plan.kv.total_bytes} bytes"),
        STAGING.check(_staging_problems(m), f"staging for {len(plan.staging)} graphs"),
        TOTAL.check([] if plan.total_bytes == parts else
                    [f"total_bytes {plan.total_bytes} != weights + KV + staging = {parts}"],
                    f"total {plan.total_bytes} bytes = weights + KV + staging"),
        WORKSPACE.check(_workspace_problems(plan.workspace_estimate_bytes, ratio),
                        f"workspace estimate {plan.workspace_estimate_bytes} bytes ({ratio:.2f} x with the total)",
                        {"workspace_estimate_bytes": plan.workspace_estimate_bytes, "total_bytes": plan.total_bytes,
                         "ratio": round(ratio, 4), "max_ratio": PLAUSIBLE_FACTOR}),
    ]


def _kv_problems(m, kv_layers: tuple[int, ...] | None = None) -> list[str]:
    """`kv_layers`: the model layers the KV layout's layers are (a pp chip's range); None: 0..n-1."""
    kv, planned = m.kv, m.memory_plan.kv
    local = {layer: i for i, layer in enumerate(kv_layers)} if kv_layers is not None else {}
    problems = []
    if planned.dtype != kv.dtype:
        problems.append(f"memory_plan.kv.dtype {planned.dtype!r} != the KV layout's {kv.dtype!r}")
    if len(kv.layer_lengths) != kv.num_layers or not all(_positive(n) for n in kv.layer_lengths):
        return problems + [f"kv.layer_lengths {list(kv.layer_lengths)[:8]} is not one whole number > 0 per layer "
                           f"({kv.num_layers} layers); KV bytes not checked"]
    position = kv.kv_heads * kv.head_dim * DTYPE_BYTES.get(kv.dtype, 0)
    listed = sorted(i for g in planned.groups for i in g.layers)
    if listed != list(range(kv.num_layers)):
        problems.append(f"memory_plan.kv.groups list layers {listed}; every layer 0..{kv.num_layers - 1} exactly once")
    for g in planned.groups:
        lengths = {kv.layer_lengths[i] for i in g.layers if 0 <= i < kv.num_layers}
        length = lengths.pop() if len(lengths) == 1 else None
        want_shape = (kv.lanes, kv.kv_heads, length, kv.head_dim)
        if length is None or tuple(g.buffer_shape) != want_shape:
            problems.append(f"memory_plan.kv group of layers {list(g.layers)}: buffer_shape {list(g.buffer_shape)}; the KV "
                            f"layout says [lanes, kv_heads, length, head_dim] = "
                            f"{[kv.lanes, kv.kv_heads, sorted({kv.layer_lengths[i] for i in g.layers if 0 <= i < kv.num_layers}), kv.head_dim]}")
            continue
        if g.buffers != 2 * len(g.layers):
            problems.append(f"memory_plan.kv group of layers {list(g.layers)}: {g.buffers} buffers != 2 x {len(g.layers)} (K and V)")
        if g.buffer_bytes != kv.lanes * length * position:
            problems.append(f"memory_plan.kv group of layers {list(g.layers)}: buffer_bytes {g.buffer_bytes} != "
                            f"{' x '.join(map(str, want_shape))} x {kv.dtype} = {kv.lanes * length * position}")
        if g.total_bytes != g.buffers * g.buffer_bytes:
            problems.append(f"memory_plan.kv group of layers {list(g.layers)}: total_bytes {g.total_bytes} != "
                            f"{g.buffers} x {g.buffer_bytes}")
    per_lane = 2 * sum(kv.layer_lengths) * position
    if planned.bytes_per_lane != per_lane:
        full, ring = kv.layer_lengths.count(kv.context), kv.num_layers - kv.layer_lengths.count(kv.context)
        problems.append(f"memory_plan.kv.bytes_per_lane {planned.bytes_per_lane} != ({full} full layers x {kv.context} + "
                        f"{ring} ring layers x {kv.ring or 0}) x 2 x {kv.kv_heads} x {kv.head_dim} x {kv.dtype} = {per_lane}")
    if planned.total_bytes != kv.lanes * per_lane or planned.total_bytes != sum(g.total_bytes for g in planned.groups):
        problems.append(f"memory_plan.kv.total_bytes {planned.total_bytes} != {kv.lanes} lanes x {per_lane} = "
                        f"{kv.lanes * per_lane} (and the sum of its groups)")
    for g in m.graphs:
        for t in (*g.inputs, *g.outputs):
            if not is_kv(t.name):
                continue
            layer = _layer_of(t.name)
            if kv_layers is not None:
                layer = local.get(layer)
            want = kv.layer_shape(layer)[1:] if layer is not None and 0 <= layer < kv.num_layers else None
            if want is None or len(t.shape) != 4 or t.shape[0] > kv.lanes or tuple(t.shape[1:]) != want or t.dtype != kv.dtype:
                problems.append(f"graph {g.name!r}: {t.name} {list(t.shape)} {t.dtype} is not a view of its layer's KV "
                                f"buffer {list(kv.layer_shape(layer)) if want else '(no such layer)'} {kv.dtype}")
    return problems


def _positive(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > 0


def _layer_of(name: str) -> int | None:
    """past_key.3 -> 3"""
    tail = name.rsplit(".", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _staging_problems(m) -> list[str]:
    staging = m.memory_plan.staging
    by_graph = {}
    problems = []
    for s in staging:
        if s.graph in by_graph:
            problems.append(f"staging for graph {s.graph!r} is listed twice")
        by_graph[s.graph] = s
    names = {g.name for g in m.graphs}
    for extra in sorted(set(by_graph) - names):
        problems.append(f"staging for {extra!r}, which is not a graph of this calbin")
    for g in m.graphs:
        s = by_graph.get(g.name)
        if s is None:
            problems.append(f"graph {g.name!r} has no staging entry")
            continue
        bindings = STAGING_SLOTS * (m.kv.lanes if g.type == PREFILL else 1)
        if s.bindings != bindings:
            problems.append(f"graph {g.name!r}: {s.bindings} bindings; the runtime creates up to {bindings} "
                            f"({'one per first lane' if g.type == PREFILL else 'one'} per staging slot, "
                            f"{STAGING_SLOTS} slots)")
        if s.binding_bytes != g.staging_bytes():
            problems.append(f"graph {g.name!r}: binding_bytes {s.binding_bytes}, its non-KV inputs and outputs take "
                            f"{g.staging_bytes()}")
        if s.total_bytes != s.bindings * s.binding_bytes:
            problems.append(f"graph {g.name!r}: total_bytes {s.total_bytes} != {s.bindings} x {s.binding_bytes}")
    return problems


def _workspace_problems(workspace: int, ratio: float) -> list[str]:
    if workspace <= 0:
        return [f"workspace_estimate_bytes {workspace} is not positive: every graph call needs activations"]
    if ratio > PLAUSIBLE_FACTOR:
        return [f"workspace_estimate_bytes {workspace} makes {ratio:.3g} x the total; at most {PLAUSIBLE_FACTOR:g} x "
                f"is plausible (a unit mistake, e.g. MB written as bytes?)"]
    return []
