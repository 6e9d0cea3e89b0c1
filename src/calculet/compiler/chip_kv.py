"""KV on partitioned calbins: which layers and KV heads a chip holds, how long each buffer is, and what a
segment graph's attention reads. One rule for compile (the chips' KV layouts and graphs) and `plan`.

A chip keeps KV rings on its sliding-window layers like a one-chip calbin (compiler/kv_layout.py):

    chip KV bytes per lane = (its full layers x context + its ring layers x ring) x 2 x its KV heads x head_dim x 4

    pp   its stage's layers, every KV head
    tp   every layer, its KV heads (the one it reads when KV heads are fewer than chips: replicated)
    ep   the layers it runs (attention replicated), every KV head

A segment or stage graph with a ring layer builds the ring context (attention_ring.build_context) over
its own KV heads; it reads seqlens_k always, total_seq_len only when it has a full-context layer
(GroupQueryAttention), and last_index in a prefill graph (the ring's padding rows keep what they held).
"""

from __future__ import annotations

from calculet.calbin.graphspec import PREFILL, GraphSpec, TensorSpec
from calculet.calbin.manifest import KVLayout
from calculet.compiler import layers
from calculet.compiler.builder import GraphBuilder
from calculet.compiler.kv_layout import layer_lengths
from calculet.models.base import ModelSpec


def chip_layers_and_kv_heads(spec: ModelSpec, scheme: str, chips: int, c: int) -> tuple[tuple[int, ...], int]:
    """(model layers whose KV chip c holds, in its KV layout's order; KV heads per layer on chip c)."""
    if scheme == "pp":
        from calculet.compiler.partition import pp_layer_ranges
        return pp_layer_ranges(spec.num_layers, chips)[c], spec.num_kv_heads
    if scheme == "ep":
        from calculet.compiler.expert_parallel import chip_layers
        return chip_layers(spec, c), spec.num_kv_heads
    from calculet.compiler.tensor_parallel import chip_slices
    _, kv, _ = chip_slices(spec, chips, c)
    return tuple(range(spec.num_layers)), kv[1] - kv[0]


def chip_kv_layout(spec: ModelSpec, scheme: str, chips: int, c: int, lanes: int, context: int,
                   prefill_chunks: tuple[int, ...], rings: bool = True) -> KVLayout:
    """Chip c's KV buffers: its layers' lengths (the context, or a sliding-window layer's ring)."""
    held, kv_heads = chip_layers_and_kv_heads(spec, scheme, chips, c)
    lengths = layer_lengths(spec, context, tuple(prefill_chunks), rings)
    return KVLayout("BNSH", "float32", len(held), lanes, kv_heads, context, spec.head_dim, True,
                    tuple(lengths[i] for i in held))


def ring_in(block: tuple[int, ...], lengths: tuple[int, ...], context: int) -> bool:
    return any(lengths[i] != context for i in block)


def host_inputs(gs: GraphSpec, block: tuple[int, ...], lengths: tuple[int, ...], context: int,
                last_index: bool = False) -> list[TensorSpec]:
    """The host arrays a segment running the attention of `block` reads (`last_index`: it reads it anyway)."""
    out = [TensorSpec("seqlens_k", (gs.lanes,), "int32")]
    if any(lengths[i] == context for i in block):
        out.append(TensorSpec("total_seq_len", (), "int32"))
    if last_index or (gs.type == PREFILL and ring_in(block, lengths, context)):
        out.append(TensorSpec("last_index", (1,), "int64"))
    return out


def attention_inputs(g: GraphBuilder, spec: ModelSpec, gs: GraphSpec, rope: dict, block: tuple[int, ...],
                     lengths: tuple[int, ...], context: int) -> layers.AttentionInputs:
    """`spec`: the chip's (tp: its narrow spec, whose KV heads the ring holds); `rope`: name pairs per layer type."""
    from calculet.compiler import attention_ring

    rings = frozenset(i for i in block if lengths[i] != context)
    ring = attention_ring.build_context(g, spec, gs.lanes, gs.tokens, min(lengths[i] for i in rings),
                                        gs.type == PREFILL) if rings else None
    return layers.AttentionInputs("seqlens_k", "total_seq_len", {k: (g.weight(c), g.weight(s)) for k, (c, s) in rope.items()},
                                  ring=ring, ring_layers=rings, rows=gs.lanes * gs.tokens)
