"""The mixture-of-experts MLP block (Qwen3-MoE, Mixtral, Qwen2-MoE): a float32 router picks k of E
SwiGLU experts per token (Qwen2-MoE adds a sigmoid-gated shared expert, built from the dense blocks).

    x [L, S, H] ─ flatten ─ [N, H]                                             N = L * S tokens
    router:  logits = x . Wr                      [N, E]   (float32 always: the top-k choice stays exact)
             p = softmax(logits); w, idx = TopK(p, k); w /= sum(w) if norm_topk_prob
    experts: y = sum_j  w_j * down_e(silu(gate_e(x)) * up_e(x)),   e = idx_j

Weights (see models/qwen3_moe.py): gate/up stack W1 [E, 2I, H] with gate and up rows interleaved,
down stack W2 [E, H, I]; rows are output features, so each expert is the [N, K] layout MatMulNBits
and QMoE read.

Three formulations, chosen by target and weight format:
- `contrib` (default target, fp32 / int8 / int4 experts): one ONNX Runtime `com.microsoft.MoE` (fp32)
  or `QMoE` (block int8/int4 codes) node per layer. Routing, SwiGLU (`swiglu_fusion=1`, the
  interleaved rows) and the weighted sum run inside the kernel; it computes only the selected
  experts. Checked against a numpy reference: fp32 equal to 2e-7; int4 with fp32 activations equal
  to the dequantized weights to 3e-7; 8-bit blocks always run with int8 activations.
- `gather` (standard ONNX; few tokens): gather each token's k expert matrices and multiply,
      W1[idx] [N, k, 2I, H] . x [N, 1, H, 1] -> [N, k, 2I, 1]     W2[idx] [N, k, H, I] . h -> [N, k, H, 1]
  reads N*k expert matrices: the cheap choice for decode steps.
- `dense` (standard ONNX; many tokens): every expert runs on every token, weighted by the routing
  matrix R [N, E] (zero off the top k, built with ScatterElements),
      W1 [E, 2I, H] . x^T [H, N] -> [E, 2I, N] -> h [E, I, N];  (W2 . h) [E, H, N] * R^T -> sum over E
  reads each expert once however many tokens there are, so a prefill chunk does not gather
  N*k copies. `gather` is used while 2*N*k <= E: gathering copies the matrices it reads, so it wins
  only well below E copies (benchmarks/moe.py, hidden 512, 32 experts x 256, top 4, fp32, ms per
  call: 1 token gather 0.91 / dense 5.4; 8 tokens 8.7 / 6.8; 128 tokens 132 / 48).
On the default target the contrib kernels beat both (same block: MoE 0.70 / 3.2 / 10.3 ms; QMoE
int8 0.29 / 0.78 / 5.3 ms), which is why they are the default.
`--partition ep` (compiler/expert_parallel.py) builds `local_experts`: chip c holds experts [a, b)
and needs their share of the *global* routing, exactly. The contrib kernels route inside (softmax,
top k over the experts they are given, QMoE renormalising unless given router_weights), so a chip
cannot hand them its slice of the logits. Instead the global routing is computed in ONNX ops, as
`routing` does, and scattered to R [N, E] (zero off each token's top k); the chip's columns
Rc = R[:, a:b] hold at most k non-zero (positive) weights per token, so its top min(k, b - a) of Rc
covers all of them and mixes exactly Rc:
    QMoE (int8 / int4 experts):  router_probs = Rc (selection), router_weights = Rc (mixing),
                                 k = min(k, b - a), normalize_routing_weights = 0
    fp32 / fp16 experts:         TopK(Rc) -> the `gather` or `dense` formulation over the local stacks
(com.microsoft.MoE has no router_weights input: it would softmax Rc again.) The chips' outputs are
partial sums over their experts; their sum is the layer's output.

Standard formulations serve the portable target (fp32, fp16, int8 via blocked DequantizeLinear)
and fp16 experts on the default target (the contrib kernels take a half-precision router input,
which would round the router logits before the top-k choice).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from calculet.compiler import layers
from calculet.compiler.builder import MS_DOMAIN, GraphBuilder
from calculet.models.base import ModelSpec


def weight_names(layer: int) -> tuple[str, str, str]:
    """(router [H, E], gate/up stack [E, 2I, H], down stack [E, H, I]) of a sparse layer."""
    p = f"model.layers.{layer}.mlp"
    return f"{p}.gate.weight", f"{p}.experts.gate_up_proj.weight", f"{p}.experts.down_proj.weight"


def formulation(g: GraphBuilder, spec: ModelSpec, layer: int, rows: int) -> str:
    """"contrib", "gather" or "dense" for this graph (rows = tokens it carries)."""
    _, fc1, _ = weight_names(layer)
    if g.target == "cpu" and not layers.is_half(g, fc1):
        return "contrib"
    return "gather" if 2 * rows * spec.moe.experts_per_token <= spec.moe.num_experts else "dense"


def sparse_mlp(g: GraphBuilder, spec: ModelSpec, layer: int, x: str, rows: int, scope: str,
               expert_masks: list | None = None) -> str:
    """x [L, S, H] (normed) -> the weighted expert outputs [L, S, H]. With `expert_masks` (the
    --expert-stats compile flag) this layer's routing mask [1, N, E] is appended to it."""
    router, fc1, fc2 = weight_names(layer)
    h = spec.hidden_size
    flat = g.op("Reshape", [x, g.const([-1, h])], name=f"{scope}/Flatten")                       # [N, H]
    logits = g.op("MatMul", [flat, g.weight(router)], name=f"{scope}/router/MatMul")             # [N, E]
    how = formulation(g, spec, layer, rows)
    idx = None
    if how == "contrib":
        y = _contrib(g, spec, flat, logits, fc1, fc2, scope)
    else:
        weights, idx = routing(g, spec, logits, f"{scope}/router")                               # [N, k] each
        w1, w2 = _expert_stack(g, fc1, f"{scope}/experts/fc1"), _expert_stack(g, fc2, f"{scope}/experts/fc2")
        if how == "gather":
            y = _gathered(g, spec, flat, weights, idx, w1, w2, layers.is_half(g, fc1), scope)
        else:
            y = _dense(g, spec, flat, weights, idx, logits, w1, w2, layers.is_half(g, fc1), scope)
    if expert_masks is not None:
        expert_masks.append(_routing_mask(g, spec, logits, idx, f"{scope}/stats"))
    shape = g.op("Shape", [x], name=f"{scope}/Shape")
    y = g.op("Reshape", [y, shape], name=f"{scope}/Unflatten")                                   # [L, S, H]
    if spec.moe.shared_expert_intermediate_size:
        y = g.op("Add", [y, _shared_expert(g, layer, x, f"{scope}/shared_expert")], name=f"{scope}/AddShared")
    return y


def local_experts(g: GraphBuilder, spec: ModelSpec, layer: int, x: str, rows: int, scope: str,
                  experts: tuple[int, int], shared: bool) -> str:
    """x [L, S, H] (normed) -> this chip's partial output [L, S, H]: the weighted sum over experts
    [first, end) of the layer (the graph's store holds only their rows of each stack), with the
    global top-k routing (module docstring); `shared`: also the shared expert (Qwen2-MoE, one chip)."""
    router, fc1, fc2 = weight_names(layer)
    moe, h = spec.moe, spec.hidden_size
    first, end = experts
    local_k = min(moe.experts_per_token, end - first)
    flat = g.op("Reshape", [x, g.const([-1, h])], name=f"{scope}/Flatten")                       # [N, H]
    logits = g.op("MatMul", [flat, g.weight(router)], name=f"{scope}/router/MatMul")             # [N, E]
    weights, idx = routing(g, spec, logits, f"{scope}/router")                                   # [N, k] each
    zeros = g.op("ConstantOfShape", [g.op("Shape", [logits], name=f"{scope}/route/Shape")], name=f"{scope}/route/Zeros")
    route = g.op("ScatterElements", [zeros, idx, weights], name=f"{scope}/route/Scatter", axis=1)  # R [N, E]
    local = g.op("Slice", [route, g.const([first]), g.const([end]), g.const([1])],
                 name=f"{scope}/route/Local")                                                     # Rc [N, E/P]
    q = g.weights.quant(fc1)
    if g.target == "cpu" and q is not None and q.bits in (4, 8):
        q2 = g.weights.quant(fc2)
        assert (q2.bits, q2.block) == (q.bits, q.block), "a layer's expert stacks share one format"
        y = g.op("QMoE", [flat, local, g.weight(f"{fc1}.qcodes"), g.weight(f"{fc1}.qscales"), "",
                          g.weight(f"{fc2}.qcodes"), g.weight(f"{fc2}.qscales"), "", "", "", "", "", "", "", local],
                 name=f"{scope}/experts/QMoE", domain=MS_DOMAIN, expert_weight_bits=q.bits, block_size=q.block,
                 weights_prepacked=0, accuracy_level=q.accuracy_level, k=local_k, activation_type="swiglu",
                 swiglu_fusion=1, normalize_routing_weights=0)
    else:
        lspec = replace(spec, moe=replace(moe, num_experts=end - first, experts_per_token=local_k))
        w_local, idx_local = g.op("TopK", [local, g.const([local_k])], name=f"{scope}/route/LocalTopK", n_out=2,
                                  axis=-1, largest=1, sorted=1)                                   # [N, k'] each
        w1, w2 = _expert_stack(g, fc1, f"{scope}/experts/fc1"), _expert_stack(g, fc2, f"{scope}/experts/fc2")
        half = layers.is_half(g, fc1)
        if 2 * rows * local_k <= end - first:
            y = _gathered(g, lspec, flat, w_local, idx_local, w1, w2, half, scope)
        else:
            y = _dense(g, lspec, flat, w_local, idx_local, local, w1, w2, half, scope)
    y = g.op("Reshape", [y, g.op("Shape", [x], name=f"{scope}/Shape")], name=f"{scope}/Unflatten")  # [L, S, H]
    if shared and moe.shared_expert_intermediate_size:
        y = g.op("Add", [y, _shared_expert(g, layer, x, f"{scope}/shared_expert")], name=f"{scope}/AddShared")
    return y


def _shared_expert(g: GraphBuilder, layer: int, x: str, scope: str) -> str:
    """Qwen2-MoE's always-on expert: sigmoid(x . g) * down(silu(gate(x)) * up(x)), [L, S, H]."""
    p = f"model.layers.{layer}.mlp"
    shared = layers.gated_mlp(g, x, f"{p}.shared_expert", "silu", scope)
    gate = g.op("Sigmoid", [layers.linear(g, x, f"{p}.shared_expert_gate.weight", f"{scope}/gate")],
                name=f"{scope}/gate/Sigmoid")                                                    # [L, S, 1]
    return g.op("Mul", [shared, gate], name=f"{scope}/Gated")


def _routing_mask(g: GraphBuilder, spec: ModelSpec, logits: str, idx: str | None, scope: str) -> str:
    """uint8 [1, N, E]: 1 where a token was routed to an expert. The contrib kernels keep their routing
    inside, so there the top k is taken again from the logits (softmax keeps the order)."""
    moe = spec.moe
    if idx is None:
        _, idx = g.op("TopK", [logits, g.const([moe.experts_per_token])], name=f"{scope}/TopK", n_out=2, axis=-1,
                      largest=1, sorted=1)
    hot = g.op("OneHot", [idx, g.const(moe.num_experts), g.const([0, 1], np.float32)], name=f"{scope}/OneHot",
               axis=-1)                                                                          # [N, k, E]
    mask = g.op("ReduceSum", [hot, g.const([1])], name=f"{scope}/PerToken", keepdims=0)         # [N, E]
    mask = g.op("Unsqueeze", [mask, g.const([0])], name=f"{scope}/Layer")                       # [1, N, E]
    return g.op("Cast", [mask], name=f"{scope}/Cast", to=2)                                      # uint8


def routing(g: GraphBuilder, spec: ModelSpec, logits: str, scope: str) -> tuple[str, str]:
    """Softmax over the experts, top k, renormalised when the model says so -> (weights, ids) [N, k]."""
    probs = g.op("Softmax", [logits], name=f"{scope}/Softmax", axis=-1)
    weights, idx = g.op("TopK", [probs, g.const([spec.moe.experts_per_token])], name=f"{scope}/TopK", n_out=2,
                        axis=-1, largest=1, sorted=1)
    if spec.moe.norm_topk_prob:
        total = g.op("ReduceSum", [weights, g.const([-1])], name=f"{scope}/TopKSum", keepdims=1)
        weights = g.op("Div", [weights, total], name=f"{scope}/Normalize")
    return weights, idx


def _contrib(g: GraphBuilder, spec: ModelSpec, flat: str, logits: str, fc1: str, fc2: str, scope: str) -> str:
    moe = spec.moe
    common = dict(k=moe.experts_per_token, activation_type="swiglu", swiglu_fusion=1,
                  normalize_routing_weights=int(moe.norm_topk_prob))
    q = g.weights.quant(fc1)
    if q is None:
        return g.op("MoE", [flat, logits, g.weight(fc1), "", g.weight(fc2)], name=f"{scope}/experts/MoE",
                    domain=MS_DOMAIN, **common)
    q2 = g.weights.quant(fc2)
    assert (q2.bits, q2.block) == (q.bits, q.block), "a layer's expert stacks share one format"
    # Without its router_weights input the CPU QMoE renormalises the top k whatever
    # normalize_routing_weights says (measured: 0.26 off a numpy reference with the attribute 0);
    # given the softmax probabilities there, it mixes with them and honours the attribute.
    probs = g.op("Softmax", [logits], name=f"{scope}/router/Softmax", axis=-1)                  # [N, E]
    return g.op("QMoE", [flat, logits, g.weight(f"{fc1}.qcodes"), g.weight(f"{fc1}.qscales"), "",
                         g.weight(f"{fc2}.qcodes"), g.weight(f"{fc2}.qscales"), "", "", "", "", "", "", "", probs],
                name=f"{scope}/experts/QMoE", domain=MS_DOMAIN, expert_weight_bits=q.bits, block_size=q.block,
                weights_prepacked=0, accuracy_level=q.accuracy_level, **common)


def _expert_stack(g: GraphBuilder, name: str, scope: str) -> str:
    """The stack [E, N, K] as a float tensor: as stored (fp32 or fp16), or int8 codes through a
    blocked DequantizeLinear (standard ONNX; a QDQ-aware compiler folds it into its matmul)."""
    q = g.weights.quant(name)
    if q is None:
        return g.weight(name)
    if q.bits != 8:
        raise ValueError("standard-op experts support int8 weights only")
    experts = g.weights.entry(f"{name}.qscales").shape[0]
    zero = g.op("Expand", [g.const(np.uint8(128), np.uint8), g.const([experts, q.n, q.k // q.block])],
                name=f"{scope}/ZeroPoint")
    return g.op("DequantizeLinear", [g.weight(f"{name}.qcodes"), g.weight(f"{name}.qscales"), zero],
                name=f"{scope}/DequantizeLinear", axis=2, block_size=q.block)                     # [E, N, K]


def _half(g: GraphBuilder, x: str, half: bool, scope: str) -> str:
    return g.op("Cast", [x], name=f"{scope}/CastToHalf", to=10) if half else x


def _float(g: GraphBuilder, x: str, half: bool, scope: str) -> str:
    return g.op("Cast", [x], name=f"{scope}/CastToFloat", to=1) if half else x


def _swiglu(g: GraphBuilder, both: str, pairs_shape: list[int], axis: int, out_shape: list[int], scope: str) -> str:
    """Interleaved gate/up rows -> silu(gate) * up. `pairs_shape` puts each (gate, up) pair on `axis`."""
    pairs = g.op("Reshape", [both, g.const(pairs_shape)], name=f"{scope}/Pairs")
    gate, up = g.op("Split", [pairs, g.const([1, 1])], name=f"{scope}/Split", n_out=2, axis=axis)
    act = g.op("Mul", [gate, g.op("Sigmoid", [gate], name=f"{scope}/Sigmoid")], name=f"{scope}/Silu")
    h = g.op("Mul", [act, up], name=f"{scope}/GateMulUp")
    return g.op("Reshape", [h, g.const(out_shape)], name=f"{scope}/Hidden")


def _gathered(g, spec, flat, weights, idx, w1, w2, half: bool, scope: str) -> str:
    """Each token through its own k experts: N*k expert matrices gathered."""
    h, i_n, k = spec.hidden_size, spec.moe.expert_intermediate_size, spec.moe.experts_per_token
    s = f"{scope}/experts"
    w1g = g.op("Gather", [w1, idx], name=f"{s}/fc1/Gather", axis=0)                              # [N, k, 2I, H]
    col = _half(g, g.op("Reshape", [flat, g.const([-1, 1, h, 1])], name=f"{s}/Column"), half, f"{s}/fc1")
    both = g.op("MatMul", [w1g, col], name=f"{s}/fc1/MatMul")                                     # [N, k, 2I, 1]
    act = _swiglu(g, both, [-1, k, i_n, 2], -1, [-1, k, i_n, 1], f"{s}/act")                       # [N, k, I, 1]
    w2g = g.op("Gather", [w2, idx], name=f"{s}/fc2/Gather", axis=0)                              # [N, k, H, I]
    out = _float(g, g.op("MatMul", [w2g, act], name=f"{s}/fc2/MatMul"), half, f"{s}/fc2")        # [N, k, H, 1]
    scale = g.op("Reshape", [weights, g.const([-1, k, 1, 1])], name=f"{s}/RouteWeights")
    weighted = g.op("Mul", [out, scale], name=f"{s}/Weighted")
    summed = g.op("ReduceSum", [weighted, g.const([1])], name=f"{s}/SumExperts", keepdims=0)    # [N, H, 1]
    return g.op("Reshape", [summed, g.const([-1, h])], name=f"{s}/Rows")                          # [N, H]


def _dense(g, spec, flat, weights, idx, logits, w1, w2, half: bool, scope: str) -> str:
    """Every expert on every token, weighted by the routing matrix (zero off each token's top k)."""
    e_n, i_n = spec.moe.num_experts, spec.moe.expert_intermediate_size
    s = f"{scope}/experts"
    zeros = g.op("ConstantOfShape", [g.op("Shape", [logits], name=f"{s}/route/Shape")], name=f"{s}/route/Zeros")
    route = g.op("ScatterElements", [zeros, idx, weights], name=f"{s}/route/Scatter", axis=1)     # [N, E]
    xt = _half(g, g.op("Transpose", [flat], name=f"{s}/Transpose", perm=[1, 0]), half, f"{s}/fc1")  # [H, N]
    both = g.op("MatMul", [w1, xt], name=f"{s}/fc1/MatMul")                                       # [E, 2I, N]
    act = _swiglu(g, both, [e_n, i_n, 2, -1], 2, [e_n, i_n, -1], f"{s}/act")                      # [E, I, N]
    out = _float(g, g.op("MatMul", [w2, act], name=f"{s}/fc2/MatMul"), half, f"{s}/fc2")         # [E, H, N]
    route_t = g.op("Unsqueeze", [g.op("Transpose", [route], name=f"{s}/route/Transpose", perm=[1, 0]),
                                 g.const([1])], name=f"{s}/route/Row")                             # [E, 1, N]
    out = g.op("Mul", [out, route_t], name=f"{s}/Weighted")                                       # [E, H, N]
    summed = g.op("ReduceSum", [out, g.const([0])], name=f"{s}/SumExperts", keepdims=0)          # [H, N]
    return g.op("Transpose", [summed], name=f"{s}/Rows", perm=[1, 0])                            # [N, H]
