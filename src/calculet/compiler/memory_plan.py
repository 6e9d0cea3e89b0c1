"""The memory plan of a calbin (`calbin.memory_plan.MemoryPlan`): what the runtime will allocate.

The runtime does not read the plan; it is built here from the same facts the runtime allocates
from (the KV layout, each graph's signature, runtime/bindings.py's rule of one binding per prefill
graph, first lane and staging slot), and gate D holds the two together. The workspace is an estimate
(compiler/workspace.py, the formula `calculet plan` uses too).
"""

from __future__ import annotations

from calculet.calbin.graphspec import PREFILL, GraphSpec
from calculet.calbin.manifest import KVLayout
from calculet.calbin.memory_plan import STAGING_SLOTS, KVBuffers, KVGroup, MemoryPlan, Staging
from calculet.compiler.workspace import workspace_bytes
from calculet.models.base import ModelSpec


def bindings_for(graph: GraphSpec, kv: KVLayout) -> int:
    """IO bindings the runtime may create for a graph: per staging slot (ping and pong), a prefill
    graph one per first lane, others one."""
    return STAGING_SLOTS * (kv.lanes if graph.type == PREFILL else 1)


def kv_buffers_of(kv: KVLayout) -> KVBuffers:
    """The KV layout's buffers grouped by length (longest first), as runtime/lanes.py allocates them."""
    groups = []
    for length in sorted(set(kv.layer_lengths), reverse=True):
        layers = tuple(i for i, n in enumerate(kv.layer_lengths) if n == length)
        shape = kv.layer_shape(layers[0])
        buffer_bytes = kv.lanes * length * kv.bytes_per_position
        groups.append(KVGroup(layers, shape, 2 * len(layers), buffer_bytes, 2 * len(layers) * buffer_bytes))
    return KVBuffers(kv.dtype, tuple(groups), kv.bytes_per_lane, sum(g.total_bytes for g in groups))


def build_memory_plan(spec: ModelSpec, kv: KVLayout, weights_bytes: int, graphs: list[GraphSpec]) -> MemoryPlan:
    kv_buffers = kv_buffers_of(kv)
    staging = tuple(Staging(g.name, bindings_for(g, kv), g.staging_bytes(), bindings_for(g, kv) * g.staging_bytes())
                    for g in graphs)
    workspace = max(workspace_bytes(spec, g.lanes, g.tokens, kv.context) for g in graphs)
    total = weights_bytes + kv_buffers.total_bytes + sum(s.total_bytes for s in staging)
    return MemoryPlan(weights_bytes, kv_buffers, staging, total, workspace)
