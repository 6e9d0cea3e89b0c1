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

The KV dtype (`--kv-dtype`) is the buffers' element type; `kv_dtype_problem` says which targets can
run which one, and why not (measured with ONNX Runtime 1.32's CPU provider):

    fp32  both targets (the default)
    fp16  cpu: GroupQueryAttention runs in float16 on the float16 cache, in place (q/k/v and the rope
          tables cast in, the output cast out; float32 q/k/v with a float16 cache also runs but measured
          2.3x slower, and neither matches float32's speed: 81 and 185 vs 37 ms for 8 lanes x 3,000
          positions of one 256-wide KV head); ring layers cast on write and on read (attention in float32).
          portable: past K/V cast to float32 after reading, this step's K/V to float16 before returning.
    bf16  refused: the CPU GroupQueryAttention has no bfloat16 kernel (NOT_IMPLEMENTED, as T or as the
          cache), and the runtime's host buffers cannot be handed to ONNX Runtime as bfloat16
          (OrtValue.ortvalue_from_numpy refuses ml_dtypes.bfloat16). fp16 has the same size.
    int8  refused: GroupQueryAttention's int8 cache (kv_cache_bit_width 8) reads fixed k_scale/v_scale
          inputs (per tensor or per channel) that would have to be calibrated at compile time, and the
          portable path would need a per-(head, position) scale buffer the runtime does not keep yet.
"""

from __future__ import annotations

from calculet.calbin.graphspec import KV_DTYPE_OPTIONS
from calculet.calbin.manifest import KVLayout
from calculet.models.base import ModelSpec

KV_DTYPE = "float32"   # the default, and what a calbin from before --kv-dtype holds
KV_DTYPE_BUILT = ("fp32", "fp16")


def kv_dtype_problem(kv_dtype: str, target: str) -> str | None:
    """Why `--kv-dtype kv_dtype` cannot run on `target`, or None when it can."""
    if kv_dtype not in KV_DTYPE_OPTIONS:
        return f"--kv-dtype {kv_dtype!r} is not known; allowed: {', '.join(KV_DTYPE_OPTIONS)}"
    if kv_dtype == "bf16":
        if target == "cpu":
            return ("--kv-dtype bf16 is not runnable on the cpu target: ONNX Runtime's CPU GroupQueryAttention takes "
                    "float/float16 only; use fp16 (the same 2 bytes per value)")
        return ("--kv-dtype bf16 is not runnable on the portable target: the runtime's host KV buffers cannot be handed "
                "to ONNX Runtime as bfloat16 (OrtValue.ortvalue_from_numpy refuses it); use fp16 (the same 2 bytes)")
    if kv_dtype == "int8":
        return ("--kv-dtype int8 is not built: ONNX Runtime's GroupQueryAttention reads an int8 cache only with fixed "
                "k_scale/v_scale inputs that would need calibrating at compile time, and per-(head, position) scales "
                "need a scale buffer the runtime does not keep yet; use fp16 (half the bytes of fp32)")
    return None


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
              rings: bool = True, dtype: str = KV_DTYPE) -> KVLayout:
    """`dtype`: the buffers' numpy dtype name (KV_DTYPE_OPTIONS' values)."""
    return KVLayout("BNSH", dtype, spec.num_layers, lanes, spec.num_kv_heads, context, spec.head_dim, in_place,
                    layer_lengths(spec, context, prefill_chunks, rings))
