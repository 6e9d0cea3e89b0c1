"""The memory plan: what the runtime really allocates or maps for a calbin, in bytes.

    weights     graphs/weights.bin, memory-mapped once and shared by every session
    kv          one K and one V buffer per layer, [lanes, kv_heads, length, head_dim] each, in groups
                of one length: full-attention layers hold the context, sliding-window layers a ring
                (runtime/lanes.py allocates each group as two [layers, lanes, kv_heads, length, head_dim]
                arrays); bytes per lane = (full layers x context + ring layers x ring) x 2 x kv_heads
                x head_dim x dtype bytes
    staging     per graph, the arrays of its IO bindings (runtime/bindings.py): every input and output
                but the KV views (and a body's `hidden`, which is its head's input array); a prefill
                graph may get one binding per first lane and staging slot, a decode or head graph one
                per slot (STAGING_SLOTS: ping and pong, for two jobs in flight)
    total       weights + kv + staging: the upper bound of what calculet itself holds
    workspace   ONNX Runtime's activations for the largest graph call: an ESTIMATE, not allocated by
                calculet and not part of total_bytes

The plan describes the runtime; the runtime does not read it (it allocates from the graphs' shapes
and the KV layout), and gate D checks that the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass

UNIT = "bytes"
STAGING_SLOTS = 2   # staging sets the runtime keeps per binding, so two jobs in flight own separate buffers


@dataclass(frozen=True)
class KVGroup:
    """The K and V buffers of the layers whose buffers have one length."""
    layers: tuple[int, ...]         # layer indices, ascending
    buffer_shape: tuple[int, ...]   # one layer's K (or V): [lanes, kv_heads, length, head_dim]
    buffers: int                    # layers x 2 (K and V)
    buffer_bytes: int               # bytes of one buffer
    total_bytes: int                # buffers x buffer_bytes

    def to_json(self) -> dict:
        return {"layers": list(self.layers), "buffer_shape": list(self.buffer_shape), "buffers": self.buffers,
                "buffer_bytes": self.buffer_bytes, "total_bytes": self.total_bytes}

    @staticmethod
    def from_json(d: dict) -> "KVGroup":
        return KVGroup(tuple(d["layers"]), tuple(d["buffer_shape"]), d["buffers"], d["buffer_bytes"], d["total_bytes"])


@dataclass(frozen=True)
class KVBuffers:
    dtype: str
    groups: tuple[KVGroup, ...]     # by buffer length, longest (the context) first
    bytes_per_lane: int             # every layer's K and V rows of one lane
    total_bytes: int                # sum of the groups = lanes x bytes_per_lane

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "groups": [g.to_json() for g in self.groups],
                "bytes_per_lane": self.bytes_per_lane, "total_bytes": self.total_bytes}

    @staticmethod
    def from_json(d: dict) -> "KVBuffers":
        return KVBuffers(d["dtype"], tuple(KVGroup.from_json(g) for g in d["groups"]), d["bytes_per_lane"],
                         d["total_bytes"])


@dataclass(frozen=True)
class Staging:
    graph: str
    bindings: int                   # IO bindings the runtime may create for this graph (at most)
    binding_bytes: int              # staging arrays of one binding
    total_bytes: int                # bindings x binding_bytes

    def to_json(self) -> dict:
        return {"graph": self.graph, "bindings": self.bindings, "binding_bytes": self.binding_bytes,
                "total_bytes": self.total_bytes}


@dataclass(frozen=True)
class MemoryPlan:
    weights_bytes: int
    kv: KVBuffers
    staging: tuple[Staging, ...]
    total_bytes: int                # weights + kv + staging
    workspace_estimate_bytes: int   # an estimate of ONNX Runtime's activations, not allocated by calculet
    unit: str = UNIT

    def to_json(self) -> dict:
        return {"unit": self.unit, "weights_bytes": self.weights_bytes, "kv": self.kv.to_json(),
                "staging": [s.to_json() for s in self.staging], "total_bytes": self.total_bytes,
                "workspace_estimate_bytes": self.workspace_estimate_bytes}

    @staticmethod
    def from_json(d: dict) -> "MemoryPlan":
        return MemoryPlan(d["weights_bytes"], KVBuffers.from_json(d["kv"]), tuple(Staging(**s) for s in d["staging"]),
                          d["total_bytes"], d["workspace_estimate_bytes"], d["unit"])
