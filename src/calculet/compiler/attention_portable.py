"""Attention for the portable target: standard ONNX ops only, no in-place KV.

Standard ONNX has no op that updates a graph input in place, so a portable body reads the lanes'
past K/V [L, Nkv, C, D] and returns this step's new K/V; the runtime writes those rows into the KV
buffers (one array assignment for all layers). Attention runs over two key sets and one softmax:

    scores_past = Q . K_past^T   [L, Nkv, g, S, C]   key c valid iff c < start (and inside the window)
    scores_new  = Q . K_new^T    [L, Nkv, g, S, S]   causal among the new tokens (and the window)
    p = softmax(concat(scores_past, scores_new));  out = p_past . V_past + p_new . V_new

with g = N / Nkv query heads per KV head, positions pos[l, j] = seqlens_k[l] + 1 - S + j, and RoPE
applied with Gather on the cos/sin tables (rotate-half layout).

A sliding-window layer compiled with a ring (compiler/kv_layout.py) has R rows of past, position p
in row p mod R; the runtime stores only real tokens, so before this step row c holds position
start - 1 - e with e = (start - 1 - c) mod R, valid when e <= start - 1 and j + 1 + e < window.

float16 KV (--kv-dtype fp16): past K/V are cast to float32 after reading, new K/V to float16 at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper

from calculet.compiler.builder import GraphBuilder

NEG = -1e30  # additive mask; finite so a fully masked row cannot produce NaN


@dataclass(frozen=True)
class PortableContext:
    """Per-graph tensors shared by every layer."""
    positions: str           # int64 [L, S]
    masks: dict              # layer type -> (past bias [L,1,1,S,C], new bias [L,1,1,S,S])
    lanes: int
    tokens: int
    context: int
    ring: int | None         # rows of the sliding-window layers' ring buffers (None: they hold the context)
    new_kv: list             # (new_k, new_v) per layer, filled as layers are built
    kv_dtype: str = "float32"  # past K/V and new_keys/new_values dtype; float16 is cast to float32 after reading


def build_context(g: GraphBuilder, spec, lanes: int, tokens: int, context: int, ring: int | None = None,
                  kv_dtype: str = "float32") -> PortableContext:
    s = "/model/positions"
    seq = g.op("Cast", ["seqlens_k"], name=f"{s}/Cast", to=7)                                   # [L] int64
    start = g.op("Add", [seq, g.const(1 - tokens)], name=f"{s}/Start")                           # [L]
    start = g.op("Unsqueeze", [start, g.const([1])], name=f"{s}/StartCol")                       # [L, 1]
    positions = g.op("Add", [start, g.const(np.arange(tokens)[None, :])], name=f"{s}/Positions")  # [L, S]
    q_pos = g.op("Unsqueeze", [positions, g.const([2])], name=f"{s}/QueryCol")                  # [L, S, 1]
    key_c = g.const(np.arange(context)[None, None, :])                                          # [1, 1, C]
    start3 = g.op("Unsqueeze", [start, g.const([2])], name=f"{s}/Start3")                       # [L, 1, 1]
    past_ok = g.op("Less", [key_c, start3], name=f"{s}/PastValid")                              # [L, 1, C]
    i = np.arange(tokens)
    new_ok = g.const((i[None, :] <= i[:, None])[None], np.bool_)                                # [1, S, S]
    masks = {}
    for layer_type in sorted(set(spec.layer_types)):
        past, new = past_ok, new_ok
        if layer_type == "sliding" and ring is not None:
            past = _ring_past(g, spec, start3, tokens, ring, s)
            new = g.const(((i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < spec.sliding_window))[None], np.bool_)
        elif layer_type == "sliding":
            dist = g.op("Sub", [q_pos, key_c], name=f"{s}/sliding/Distance")                   # [L, S, C]
            in_window = g.op("Less", [dist, g.const(spec.sliding_window)], name=f"{s}/sliding/InWindow")
            past = g.op("And", [past_ok, in_window], name=f"{s}/sliding/PastValid")
            new = g.const(((i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < spec.sliding_window))[None], np.bool_)
        masks[layer_type] = tuple(
            g.op("Unsqueeze", [g.op("Where", [m, g.const(0.0, np.float32), g.const(NEG, np.float32)],
                                    name=f"{s}/{layer_type}/{tag}/Bias"), g.const([1, 2])],
                 name=f"{s}/{layer_type}/{tag}/Expand")
            for tag, m in (("past", past), ("new", new)))
    return PortableContext(positions, masks, lanes, tokens, context, ring, [], kv_dtype)


def _ring_past(g: GraphBuilder, spec, start3: str, tokens: int, ring: int, s: str) -> str:
    """bool [L, S, R]: ring row c (position start-1-e, e = (start-1-c) mod R) is visible to token j."""
    before = g.op("Sub", [start3, g.const(1)], name=f"{s}/ring/LastPast")                          # [L, 1, 1]
    back = g.op("Mod", [g.op("Sub", [before, g.const(np.arange(ring)[None, None, :])], name=f"{s}/ring/Back"),
                        g.const(ring)], name=f"{s}/ring/BackMod")                                  # [L, 1, R]
    written = g.op("LessOrEqual", [back, before], name=f"{s}/ring/Written")
    reach = g.op("Add", [back, g.const(np.arange(1, tokens + 1)[None, :, None])], name=f"{s}/ring/Reach")  # [L, S, R]
    in_window = g.op("Less", [reach, g.const(spec.sliding_window)], name=f"{s}/ring/InWindow")
    return g.op("And", [written, in_window], name=f"{s}/ring/PastValid")


def _rope(g: GraphBuilder, x: str, heads: int, head_dim: int, cos: str, sin: str, scope: str) -> str:
    """x [L, S, heads*D] -> [L, S, heads, D] rotated (rotate-half); cos/sin [L, S, 1, D/2]."""
    x = g.op("Reshape", [x, g.const([0, 0, heads, head_dim])], name=f"{scope}/Heads")
    x1, x2 = g.op("Split", [x, g.const([head_dim // 2, head_dim // 2])], name=f"{scope}/Halves", n_out=2, axis=-1)
    a = g.op("Sub", [g.op("Mul", [x1, cos], name=f"{scope}/x1cos"), g.op("Mul", [x2, sin], name=f"{scope}/x2sin")],
             name=f"{scope}/First")
    b = g.op("Add", [g.op("Mul", [x2, cos], name=f"{scope}/x2cos"), g.op("Mul", [x1, sin], name=f"{scope}/x1sin")],
             name=f"{scope}/Second")
    return g.op("Concat", [a, b], name=f"{scope}/Rotated", axis=-1)


def attention(g: GraphBuilder, spec, layer: int, q: str, k: str, v: str, rope: tuple[str, str],
              ctx: PortableContext, scope: str) -> str:
    """-> output [L, S, N*D]; this layer's new K/V [L, Nkv, S, D] are recorded in ctx.new_kv."""
    n, nkv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    lanes, tokens = ctx.lanes, ctx.tokens
    group = n // nkv
    cos = g.op("Unsqueeze", [g.op("Gather", [rope[0], ctx.positions], name=f"{scope}/rope/GatherCos", axis=0),
                             g.const([2])], name=f"{scope}/rope/Cos")                                # [L, S, 1, D/2]
    sin = g.op("Unsqueeze", [g.op("Gather", [rope[1], ctx.positions], name=f"{scope}/rope/GatherSin", axis=0),
                             g.const([2])], name=f"{scope}/rope/Sin")
    q = _rope(g, q, n, d, cos, sin, f"{scope}/rope_q")                                               # [L, S, N, D]
    q = g.op("Mul", [q, g.const(np.float32(spec.attn_scale), np.float32)], name=f"{scope}/ScaleQ")
    q = g.op("Reshape", [q, g.const([lanes, tokens, nkv, group, d])], name=f"{scope}/GroupQ")
    q = g.op("Transpose", [q], name=f"{scope}/Qt", perm=[0, 2, 3, 1, 4])                             # [L, Nkv, g, S, D]
    new_k = g.op("Transpose", [_rope(g, k, nkv, d, cos, sin, f"{scope}/rope_k")], name=f"{scope}/NewK",
                 perm=[0, 2, 1, 3])                                                                   # [L, Nkv, S, D]
    new_v = g.op("Transpose", [g.op("Reshape", [v, g.const([0, 0, nkv, d])], name=f"{scope}/Vheads")],
                 name=f"{scope}/NewV", perm=[0, 2, 1, 3])                                             # [L, Nkv, S, D]
    five = lambda t, nm: g.op("Unsqueeze", [t, g.const([2])], name=f"{scope}/{nm}")  # noqa: E731  [L, Nkv, 1, *, D]
    past_k, past_v = f"past_key.{layer}", f"past_value.{layer}"
    if ctx.kv_dtype != "float32":   # float16 buffers: the attention math stays float32
        past_k = g.op("Cast", [past_k], name=f"{scope}/PastKFloat", to=TensorProto.FLOAT)
        past_v = g.op("Cast", [past_v], name=f"{scope}/PastVFloat", to=TensorProto.FLOAT)
    past_k, past_v = five(past_k, "PastK5"), five(past_v, "PastV5")
    nk5, nv5 = five(new_k, "NewK5"), five(new_v, "NewV5")
    s_past = g.op("MatMul", [q, g.op("Transpose", [past_k], name=f"{scope}/PastKt", perm=[0, 1, 2, 4, 3])],
                  name=f"{scope}/ScoresPast")                                                         # [L, Nkv, g, S, C]
    s_new = g.op("MatMul", [q, g.op("Transpose", [nk5], name=f"{scope}/NewKt", perm=[0, 1, 2, 4, 3])],
                 name=f"{scope}/ScoresNew")                                                           # [L, Nkv, g, S, S]
    bias_past, bias_new = ctx.masks[spec.layer_types[layer]]
    scores = g.op("Concat", [g.op("Add", [s_past, bias_past], name=f"{scope}/MaskPast"),
                             g.op("Add", [s_new, bias_new], name=f"{scope}/MaskNew")], name=f"{scope}/Scores", axis=-1)
    probs = g.op("Softmax", [scores], name=f"{scope}/Softmax", axis=-1)
    past_rows = ctx.ring if ctx.ring is not None and spec.layer_types[layer] == "sliding" else ctx.context
    p_past, p_new = g.op("Split", [probs, g.const([past_rows, tokens])], name=f"{scope}/SplitProbs", n_out=2, axis=-1)
    out = g.op("Add", [g.op("MatMul", [p_past, past_v], name=f"{scope}/AttnPast"),
                       g.op("MatMul", [p_new, nv5], name=f"{scope}/AttnNew")], name=f"{scope}/AttnSum")  # [L, Nkv, g, S, D]
    out = g.op("Transpose", [out], name=f"{scope}/Outt", perm=[0, 3, 1, 2, 4])                        # [L, S, Nkv, g, D]
    ctx.new_kv.append((new_k, new_v))
    return g.op("Reshape", [out, g.const([0, 0, n * d])], name=f"{scope}/Merge")


def stack_new_kv(g: GraphBuilder, ctx: PortableContext) -> tuple[str, str]:
    """All layers' new K (and V) as one tensor [layers, L, Nkv, S, D]: one write for the runtime."""
    stacked = []
    for part, index in (("keys", 0), ("values", 1)):
        parts = [g.op("Unsqueeze", [kv[index], g.const([0])], name=f"/model/new_{part}/Unsqueeze{i}")
                 for i, kv in enumerate(ctx.new_kv)]
        out = g.op("Concat", parts, name=f"/model/new_{part}/Concat", axis=0)
        if ctx.kv_dtype != "float32":
            out = g.op("Cast", [out], name=f"/model/new_{part}/Cast",
                       to=helper.np_dtype_to_tensor_dtype(np.dtype(ctx.kv_dtype)))
        stacked.append(out)
    return stacked[0], stacked[1]
