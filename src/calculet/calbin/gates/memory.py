"""Gate D, memory: the memory plan states what the runtime will really allocate, in bytes.

    weights_bytes  == weights.bytes (the mapped weights file)
    kv             == the KV layout: layers x 2 buffers of [lanes, kv_heads, context, head_dim] x dtype bytes,
                      and every body graph's past_* / present_* tensor is a view of those buffers
    staging        == one entry per graph: the bytes of one IO binding (every non-KV input and output;
                      a body's hidden is its head's input) x the bindings the runtime may create
                      (a prefill graph one per first lane, decode and head graphs one)
    total_bytes    == weights + kv + staging
    workspace_estimate_bytes  an estimate of ONNX Runtime's activations: positive and within
                      PLAUSIBLE_FACTOR of the total (a "16777216 MB" typed where bytes were meant is
                      off by a factor of a million)

The runtime allocates from the graphs and the KV layout (runtime/lanes.py, runtime/bindings.py),
not from the plan, so this gate recomputes each number the way the runtime allocates it.
"""

from __future__ import annotations

from calculet.calbin.gates.context import GateContext
from calculet.calbin.graphspec import PREFILL, is_kv
from calculet.calbin.validate_report import Check, Rule

WEIGHTS = Rule("D.weights", "the plan's weights bytes equal the weights file the runtime maps")
KV = Rule("D.kv", "KV bytes = layers x 2 x lanes x kv_heads x context x head_dim x dtype bytes, as the KV layout "
                  "says, and every body graph's KV tensors are views of those buffers")
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
        KV.check(_kv_problems(m), f"KV {plan.kv.buffers} x {list(plan.kv.buffer_shape)} {plan.kv.dtype} = {plan.kv.total_bytes} bytes"),
        STAGING.check(_staging_problems(m), f"staging for {len(plan.staging)} graphs"),
        TOTAL.check([] if plan.total_bytes == parts else
                    [f"total_bytes {plan.total_bytes} != weights + KV + staging = {parts}"],
                    f"total {plan.total_bytes} bytes = weights + KV + staging"),
        WORKSPACE.check(_workspace_problems(plan.workspace_estimate_bytes, ratio),
                        f"workspace estimate {plan.workspace_estimate_bytes} bytes ({ratio:.2f} x with the total)",
                        {"workspace_estimate_bytes": plan.workspace_estimate_bytes, "total_bytes": plan.total_bytes,
                         "ratio": round(ratio, 4), "max_ratio": PLAUSIBLE_FACTOR}),
    ]


def _kv_problems(m) -> list[str]:
    kv, planned = m.kv, m.memory_plan.kv
    problems = []
    if planned.dtype != kv.dtype:
        problems.append(f"memory_plan.kv.dtype {planned.dtype!r} != the KV layout's {kv.dtype!r}")
    if tuple(planned.buffer_shape) != kv.shape:
        problems.append(f"memory_plan.kv.buffer_shape {list(planned.buffer_shape)} != the KV layout's "
                        f"[lanes, kv_heads, context, head_dim] = {list(kv.shape)}")
    if planned.buffers != 2 * kv.num_layers:
        problems.append(f"memory_plan.kv.buffers {planned.buffers} != 2 x {kv.num_layers} layers (K and V)")
    if planned.buffer_bytes != kv.bytes_per_buffer:
        problems.append(f"memory_plan.kv.buffer_bytes {planned.buffer_bytes} != {' x '.join(map(str, kv.shape))} x "
                        f"{kv.dtype} = {kv.bytes_per_buffer}")
    if planned.total_bytes != kv.total_bytes:
        problems.append(f"memory_plan.kv.total_bytes {planned.total_bytes} != {kv.num_layers} layers x 2 x "
                        f"{kv.bytes_per_buffer} = {kv.total_bytes}")
    lanes, rest = kv.shape[0], kv.shape[1:]
    for g in m.graphs:
        for t in (*g.inputs, *g.outputs):
            if is_kv(t.name) and (len(t.shape) != 4 or t.shape[0] > lanes or tuple(t.shape[1:]) != rest or t.dtype != kv.dtype):
                problems.append(f"graph {g.name!r}: {t.name} {list(t.shape)} {t.dtype} is not a view of the KV buffers "
                                f"{list(kv.shape)} {kv.dtype}")
    return problems


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
        bindings = m.kv.lanes if g.type == PREFILL else 1
        if s.bindings != bindings:
            problems.append(f"graph {g.name!r}: {s.bindings} bindings; the runtime creates up to {bindings} "
                            f"({'one per first lane' if g.type == PREFILL else 'one'})")
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
