"""How long each layer's KV buffer is: the one rule, used by compile, the graphs' signatures and `plan`.

A full-attention layer keeps the whole context. A sliding-window layer only ever reads the last
`window` positions, so it keeps a ring instead (position p in row p mod ring) of

    ring = window + largest prefill chunk

rows: a chunk of S tokens writes S rows while its first query still reads the window - 1 rows
before it, so window + S - 1 rows would do; the extra row and the chunk's slack let a lane be cut
back by `ring - window` positions and continue (runtime `Program.max_rewind`). When the ring would
not be shorter than the context, the layer keeps the context like a full one. So does a model whose
every layer is a sliding-window one (Mistral): a graph tells the context from its longest KV buffer,
so at least one layer must hold it (rings for such models are left for later).

    KV bytes per lane = (full layers x context + ring layers x ring) x 2 (K, V) x kv_heads x head_dim x dtype bytes
"""

from __future__ import annotations

from calculet.calbin.manifest import KVLayout
from calculet.models.base import ModelSpec

KV_DTYPE = "float32"


def ring_length(spec: ModelSpec, context: int, prefill_chunks: tuple[int, ...], enabled: bool = True) -> int | None:
    """Rows of a sliding-window layer's ring, or None when those layers keep the whole context."""
    if not enabled or not spec.sliding_window or "sliding" not in spec.layer_types or "full" not in spec.layer_types:
        return None
    ring = spec.sliding_window + max(prefill_chunks)
    return ring if ring < context else None


def layer_lengths(spec: ModelSpec, context: int, prefill_chunks: tuple[int, ...], enabled: bool = True) -> tuple[int, ...]:
    ring = ring_length(spec, context, prefill_chunks, enabled)
    return tuple(ring if ring is not None and t == "sliding" else context for t in spec.layer_types)


def kv_layout(spec: ModelSpec, lanes: int, context: int, prefill_chunks: tuple[int, ...], in_place: bool,
              rings: bool = True) -> KVLayout:
    return KVLayout("BNSH", KV_DTYPE, spec.num_layers, lanes, spec.num_kv_heads, context, spec.head_dim, in_place,
                    layer_lengths(spec, context, prefill_chunks, rings))
