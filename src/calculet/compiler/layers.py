"""Building blocks shared by every family: norms, linears, MLPs and attention with in-place KV.

Shapes in comments: L = lanes in this graph, S = tokens per lane in this graph, H = hidden size,
N = query heads, Nkv = KV heads, D = head dim, C = context (KV buffer length).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from calculet.calbin.graphspec import kv_names
from calculet.compiler.builder import MS_DOMAIN, GraphBuilder
from calculet.compiler import prefill_int8


def rmsnorm(g: GraphBuilder, x: str, weight: str, eps: float, scope: str, probe: bool = True) -> str:
    """y = x / sqrt(mean(x^2) + eps) * w over the last axis (weight already holds any +1 offset)."""
    w = g.weight(weight)
    if g.target == "cpu":
        y = g.op("SimplifiedLayerNormalization", [x, w], name=f"{scope}/SimplifiedLayerNorm",
                 axis=-1, epsilon=float(eps), stash_type=1)
    else:
        sq = g.op("Mul", [x, x], name=f"{scope}/Square")
        mean = g.op("ReduceMean", [sq, g.const([-1])], name=f"{scope}/ReduceMean", keepdims=1)
        var = g.op("Add", [mean, g.const(eps, np.float32)], name=f"{scope}/AddEps")
        inv = g.op("Reciprocal", [g.op("Sqrt", [var], name=f"{scope}/Sqrt")], name=f"{scope}/Reciprocal")
        y = g.op("Mul", [g.op("Mul", [x, inv], name=f"{scope}/Normalize"), w], name=f"{scope}/Scale")
    if probe:
        g.probe(weight.removesuffix(".weight"), y, _out_features(g, weight))
    return y


def _out_features(g: GraphBuilder, weight: str) -> int:
    """Output width of a norm ([H]) or a MatMul weight ([in, out], or quantized codes of N rows)."""
    q = g.weights.quant(weight)
    return q.n if q is not None else g.weights.entry(weight).shape[-1]


@dataclass(frozen=True)
class Stream:
    """The residual stream between layers: x plus a `pending` branch output not yet added.

    Keeping the add pending lets the next norm fuse it: SkipSimplifiedLayerNormalization computes
    (x + pending) and its RMSNorm in one kernel ("skip-norm" fusion), replacing the pattern
        x = Add(x, branch);  n = SimplifiedLayerNormalization(x)
    """
    x: str
    pending: str | None = None


def add_norm(g: GraphBuilder, stream: Stream, weight: str, eps: float, scope: str) -> tuple[str, Stream]:
    """(RMSNorm(x + pending), new stream with the sum as x)."""
    if stream.pending is None:
        return rmsnorm(g, stream.x, weight, eps, scope), Stream(stream.x)
    if g.target == "cpu" and "skip-norm" in g.fusions:
        normed, _mean, _inv, total = g.op(
            "SkipSimplifiedLayerNormalization", [stream.x, stream.pending, g.weight(weight)],
            name=f"{scope}/SkipSimplifiedLayerNorm", n_out=4, domain=MS_DOMAIN, epsilon=float(eps))
        g.probe(weight.removesuffix(".weight"), normed, _out_features(g, weight))
        return normed, Stream(total)
    total = g.op("Add", [stream.x, stream.pending], name=f"{scope}/ResidualAdd")
    return rmsnorm(g, total, weight, eps, scope), Stream(total)


def head_rmsnorm(g: GraphBuilder, x: str, heads: int, head_dim: int, weight: str, eps: float, scope: str) -> str:
    """RMSNorm over each head: [L, S, heads*D] -> [L, S, heads, D] -> norm -> [L, S, heads*D]."""
    split = g.op("Reshape", [x, g.const([0, 0, heads, head_dim])], name=f"{scope}/SplitHeads")
    normed = rmsnorm(g, split, weight, eps, scope, probe=False)
    merged = g.op("Reshape", [normed, g.const([0, 0, heads * head_dim])], name=f"{scope}/MergeHeads")
    g.probe(weight.removesuffix(".weight"), merged, heads * head_dim)
    return merged


def embedding(g: GraphBuilder, weight: str, ids: str, scope: str) -> str:
    """Rows of the embedding table for ids [L, S] -> [L, S, H] (int8 codes dequantized on the fly)."""
    q = g.weights.quant(weight)
    if q is None:
        rows = g.op("Gather", [g.weight(weight), ids], name=f"{scope}/Gather", axis=0)
        return _to_float(g, rows, weight, scope)
    return g.op("GatherBlockQuantized", [g.weight(f"{weight}.gather_codes"), ids, g.weight(f"{weight}.qscales")],
                name=f"{scope}/GatherBlockQuantized", domain=MS_DOMAIN, bits=q.bits, block_size=q.block,
                gather_axis=0, quantize_axis=1)


def linear(g: GraphBuilder, x: str, weight: str, scope: str, bias: str | None = None) -> str:
    """x [.., in] @ W [in, out] (+ b); quantized weights run as MatMulNBits on [out, in] codes, or in a
    prefill graph with the prefill-int8 pass's weights as a per-token int8 GEMM, or from its float32
    copy as a float32 GEMM (compiler/prefill_int8.py)."""
    q = g.weights.quant(weight)
    if q is not None and g.target == "portable":
        y = _dequantized_matmul(g, x, weight, q, scope)
    elif g.on_int8_rows(weight) and prefill_int8.has_weights(g.weights, weight):
        y = prefill_int8.linear(g, x, weight, *g.prefill_shape, scope)
    elif g.prefill_shape is not None and g.float32_copies and prefill_int8.has_float32_copy(g.weights, weight):
        y = g.op("MatMul", [x, g.weight(f"{weight}.f32")], name=f"{scope}/MatMul")
    elif q is not None:
        y = g.op("MatMulNBits", [x, g.weight(f"{weight}.qcodes"), g.weight(f"{weight}.qscales")],
                 name=f"{scope}/MatMulNBits", domain=MS_DOMAIN, K=q.k, N=q.n, bits=q.bits,
                 block_size=q.block, accuracy_level=q.accuracy_level)
    elif is_half(g, weight):
        y = half_product(g, "MatMul", x, weight, scope)
    else:
        y = g.op("MatMul", [x, g.weight(weight)], name=f"{scope}/MatMul")
    if bias is not None:
        y = g.op("Add", [y, g.weight(bias)], name=f"{scope}/BiasAdd")
    return y


def is_half(g: GraphBuilder, weight: str) -> bool:
    return weight in g.weights and g.weights.entry(weight).dtype == "float16"


def half_product(g: GraphBuilder, op_type: str, x: str, weight: str, scope: str, **attrs) -> str:
    """fp32 x times an fp16 weight (MatMul or Gemm) in half precision; the result is fp32 again, so
    the stream around it stays fp32."""
    x16 = g.op("Cast", [x], name=f"{scope}/CastToHalf", to=10)
    y = g.op(op_type, [x16, g.weight(weight)], name=f"{scope}/{op_type}", **attrs)
    return g.op("Cast", [y], name=f"{scope}/CastToFloat", to=1)


def _to_float(g: GraphBuilder, x: str, weight: str, scope: str) -> str:
    return g.op("Cast", [x], name=f"{scope}/CastToFloat", to=1) if is_half(g, weight) else x


def _dequantized_matmul(g: GraphBuilder, x: str, weight: str, q, scope: str) -> str:
    """Standard ONNX: blocked DequantizeLinear (opset 21) of the int8 codes, then Gemm with transB.
    A QDQ-aware NPU compiler folds this pair into its own int8 matmul."""
    if q.bits != 8:
        raise ValueError("the portable target supports int8 weights only")
    codes = g.op("Reshape", [g.weight(f"{weight}.qcodes"), g.const([q.n, q.k])], name=f"{scope}/Codes")
    zero = g.const(np.full((q.n, q.k // q.block), 128, np.uint8), np.uint8)
    w = g.op("DequantizeLinear", [codes, g.weight(f"{weight}.qscales"), zero], name=f"{scope}/DequantizeLinear",
             axis=1, block_size=q.block)                                                     # [N, K]
    flat = g.op("Reshape", [x, g.const([-1, q.k])], name=f"{scope}/Flatten")
    y = g.op("Gemm", [flat, w], name=f"{scope}/Gemm", transB=1)
    shape = g.op("Concat", [g.op("Shape", [x], name=f"{scope}/Shape", start=0, end=-1), g.const([q.n])],
                 name=f"{scope}/OutShape", axis=0)
    return g.op("Reshape", [y, shape], name=f"{scope}/Unflatten")


def _split(g: GraphBuilder, x: str, sizes: list[int], scope: str) -> list[str]:
    return g.op("Split", [x, g.const(sizes)], name=f"{scope}/Split", n_out=len(sizes), axis=-1)


def qkv_projections(g: GraphBuilder, spec, x: str, prefix: str, scope: str) -> tuple[str, str, str]:
    """q [.., N*D], k, v [.., Nkv*D]. With the "qkv" fusion the three weights were packed into one
    `qkv_proj` at compile time: one MatMul then a Split replaces three MatMuls."""
    sizes = [spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim]
    bias = (lambda proj: f"{prefix}.{proj}.bias") if spec.qkv_bias else (lambda proj: None)
    packed = f"{prefix}.qkv_proj.weight"
    if packed in g.weights or g.weights.quant(packed) is not None:
        qkv = linear(g, x, packed, f"{scope}/qkv_proj", bias("qkv_proj"))
        q, k, v = _split(g, qkv, sizes, f"{scope}/qkv_proj")
        return q, k, v
    return tuple(linear(g, x, f"{prefix}.{p}.weight", f"{scope}/{p}", bias(p)) for p in ("q_proj", "k_proj", "v_proj"))


def gated_mlp(g: GraphBuilder, x: str, prefix: str, activation: str, scope: str) -> str:
    """down(act(gate(x)) * up(x)); activation is "silu" or "gelu_tanh". With the "gate-up" fusion the
    gate and up weights were packed into one `gate_up_proj`: one MatMul then a Split."""
    packed = f"{prefix}.gate_up_proj.weight"
    if packed in g.weights or g.weights.quant(packed) is not None:
        both = linear(g, x, packed, f"{scope}/gate_up_proj")
        q = g.weights.quant(packed)
        width = (q.n if q is not None else g.weights.entry(packed).shape[1]) // 2
        gate, up = _split(g, both, [width, width], f"{scope}/gate_up_proj")
    else:
        gate = linear(g, x, f"{prefix}.gate_proj.weight", f"{scope}/gate_proj")
        up = linear(g, x, f"{prefix}.up_proj.weight", f"{scope}/up_proj")
    if activation == "silu":
        act = g.op("Mul", [gate, g.op("Sigmoid", [gate], name=f"{scope}/act/Sigmoid")], name=f"{scope}/act/Mul")
    elif activation == "gelu_tanh":
        act = g.op("Gelu", [gate], name=f"{scope}/act/Gelu", approximate="tanh")
    else:
        raise ValueError(f"unknown activation {activation!r}")
    hidden = g.op("Mul", [act, up], name=f"{scope}/GateMulUp")
    out = linear(g, hidden, f"{prefix}.down_proj.weight", f"{scope}/down_proj")
    g.probe(prefix, out, _out_features(g, f"{prefix}.down_proj.weight"))
    return out


@dataclass(frozen=True)
class AttentionInputs:
    """Graph-level tensors every attention layer reads."""
    seqlens_k: str          # int32 [L]: each lane's total length after this step, minus one
    total_seq_len: str      # int32 scalar: the longest lane's total length
    rope: dict              # layer type ("full"/"sliding") -> (cos name, sin name), each [C, D/2]
    portable: object = None  # attention_portable.PortableContext on the portable target
    ring: object = None      # attention_ring.RingContext when sliding-window layers keep a KV ring (cpu target)
    ring_layers: frozenset = frozenset()  # layers whose KV buffer is that ring
    rows: int = 0            # tokens this graph carries (L * S); the MoE block picks its formulation by it
    expert_masks: list | None = None  # --expert-stats: each sparse layer's routing mask [N, E] is appended here
    kv_dtype: str = "float32"  # the KV buffers' dtype; float16: GroupQueryAttention runs in float16 (see attention)


def self_attention(g: GraphBuilder, spec, layer: int, x: str, ctx: AttentionInputs) -> str:
    """The attention sub-block every family shares: q/k/v projections, per-head q/k RMSNorm when the
    spec has it (Qwen3, Gemma 3), attention with in-place KV, o_proj. x is the normed input [L, S, H]."""
    p, s = f"model.layers.{layer}.self_attn", f"/model/layers.{layer}/attn"
    q, k, v = qkv_projections(g, spec, x, p, s)
    if spec.qk_norm:
        q = head_rmsnorm(g, q, spec.num_heads, spec.head_dim, f"{p}.q_norm.weight", spec.rms_norm_eps, f"{s}/q_norm")
        k = head_rmsnorm(g, k, spec.num_kv_heads, spec.head_dim, f"{p}.k_norm.weight", spec.rms_norm_eps, f"{s}/k_norm")
    a = attention(g, spec, layer, q, k, v, ctx, s)
    g.probe(f"{p}.o_proj:input", a, spec.num_heads * spec.head_dim)   # the context (prefill-int8 calibrates on it)
    out = linear(g, a, f"{p}.o_proj.weight", f"{s}/o_proj")
    g.probe(p, out, spec.hidden_size)
    return out


def attention(g: GraphBuilder, spec, layer: int, q: str, k: str, v: str, ctx: AttentionInputs, scope: str) -> str:
    """Grouped-query attention with RoPE and an in-place KV update.

    q [L, S, N*D], k/v [L, S, Nkv*D]; past/present K/V [L, Nkv, C, D] are bound to the same buffer
    by the runtime, so the op writes this step's K/V at each lane's position and copies nothing else.
    Sliding layers pass local_window_size = window: token i sees keys j with i - j < window; those
    compiled with a ring buffer run attention_ring instead.
    """
    past_k, past_v, present_k, present_v = kv_names(layer)
    layer_type = spec.layer_types[layer]
    cos, sin = ctx.rope[layer_type]
    if ctx.portable is not None:
        from calculet.compiler import attention_portable
        return attention_portable.attention(g, spec, layer, q, k, v, (cos, sin), ctx.portable, scope)
    if layer in ctx.ring_layers:  # GroupQueryAttention cannot wrap around a ring
        from calculet.compiler import attention_ring
        return attention_ring.attention(g, spec, layer, q, k, v, (cos, sin), ctx.ring, scope)
    window = spec.sliding_window if layer_type == "sliding" else -1
    half = ctx.kv_dtype == "float16"
    if half:
        # A float16 cache: q/k/v and the rope tables go in as float16 too, and the output comes back as
        # float32. The CPU kernel also takes float32 q/k/v with a float16 cache, but measured 2.3x
        # slower than all-float16 (8 lanes x 3,000 past positions, 4 heads / 1 KV head of 256:
        # 185 vs 81 ms; float32 throughout 37 ms), so the inputs are cast instead.
        q, k, v, cos, sin = (g.op("Cast", [x], name=f"{scope}/{nm}Half", to=TensorProto.FLOAT16)
                             for x, nm in ((q, "Q"), (k, "K"), (v, "V"), (cos, "Cos"), (sin, "Sin")))
    out = g.op(
        "GroupQueryAttention",
        [q, k, v, past_k, past_v, ctx.seqlens_k, ctx.total_seq_len, cos, sin],
        name=f"{scope}/GroupQueryAttention",
        outputs=[f"{scope}/attn_output", present_k, present_v],
        domain=MS_DOMAIN,
        num_heads=spec.num_heads,
        kv_num_heads=spec.num_kv_heads,
        scale=float(spec.attn_scale),
        local_window_size=int(window),
        do_rotary=1,
        rotary_interleaved=0,
    )
    if half:
        return g.op("Cast", [out[0]], name=f"{scope}/OutFloat", to=TensorProto.FLOAT)
    return out[0]
