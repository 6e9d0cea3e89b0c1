"""Sliding-window attention over a KV ring, with the ring updated in place (the `cpu` target).

GroupQueryAttention writes position p at row p of its buffer, so it cannot wrap by itself. A ring
layer's buffer has R rows (compiler/kv_layout.py) and holds position p at row p mod R. Prefill chunks:

    pos[l, j]   = seqlens_k[l] + 1 - S + j                         positions of this step's tokens   [L, S]
    slot        = pos mod R                                                                         [L, S]
    K_new, V_new  (RoPE applied to K)                                                               [L, Nkv, S, D]
    prefill:  K_new = Where(j <= last_index, K_new, K_ring[slot])  padding rewrites what was there
    K_ring      = ScatterND(K_ring, (l, h, slot), K_new)            present_key aliases past_key: in place
    d[l, j, s]  = (pos[l, j] - s) mod R                             how far back slot s is for query j
    visible     = d < window  and  d <= pos[l, j]                   (the second: never written yet)
    out         = softmax(Q . K_ring^T * scale + bias(visible)) . V_ring

A float16 ring (--kv-dtype fp16) gets K_new/V_new cast to float16 before the write and the ring cast
back to float32 before the products (the attention math stays float32).

Prefill chunks over a float32 ring take GroupQueryAttention while every position the chunk writes is
below R (the `InRows` branch): ring row = position there, so the op writes the chunk's K/V and attends in
place with the layer's window, as the full-context build does (layers.attention). Its padding rows land
past the lane's end, on rows no position of the lane holds yet. The chunks past R take the ring's own
write and products, below.

Those read only the rows written so far: while no lane of the graph has reached row `limit`
of its ring (5/8 of R, on a 128-row grain), the products run on the ring's first `rows` rows, copied out
(an If per layer: rows = max(seqlens_k) + 1 rounded up to the grain, at least two grains: ONNX Runtime's
products over 128 rows or fewer round differently from longer ones). A ring of 640 rows at 200
positions reads 256 rows per lane instead of 640; past the limit the copy would cost more than it
saves, so the products read the whole ring in place. The rows past a lane's length are masked
either way (exact zeros in the softmax), so a lane's logits do not depend on which branch ran or on
how many rows it read (bit-identical).

Decode steps (float32 ring): GroupQueryAttention does the write, given each
lane's ring row p mod R as its seqlens_k, and its attention (rows 0..p of each lane, in place) is the
layer's while every lane of the graph is below min(window, R); otherwise the products read the whole
ring. A short lane batched with a wrapped one therefore differs from alone by float32 rounding
(< 1e-5 on the logits, greedy tokens equal; tests/compiler/test_kv_ring.py).

Every query reads the ring after this step's writes, so a query sees its own chunk causally (a
later token of the chunk sits R - 1 rows "back", outside the window). Writes never reach a row a
query still reads while R >= window + S - 1 (gate C checks it). Padding tokens of a prefill chunk
write back what their slots held, so the positions just before the lane's end stay intact for
`Program.max_rewind`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper

from calculet.calbin.graphspec import kv_names
from calculet.compiler.builder import MS_DOMAIN, GraphBuilder

NEG = -1e30  # additive mask; finite so a fully masked row cannot produce NaN
GRAIN = 128  # rows of a ring the products read: a multiple of this, at least two (ring // 8 on small rings)


@dataclass(frozen=True)
class RingContext:
    """Per-graph tensors every ring layer shares."""
    ring: int
    lanes: int
    tokens: int
    positions: str           # int64 [L, S]
    index: str | None        # int64 [L, Nkv, S, 3]: (lane, kv head, slot) of every new K/V row (None: decode)
    real: str | None         # bool [1, 1, S, 1]: prefill tokens j <= last_index (None: decode, all real)
    bias: str                # float32 [L, 1, 1, S, R] ([L, 1, 1, R] when S = 1): 0 where visible, NEG elsewhere
    kv_dtype: str = "float32"  # the ring's dtype; float16 (--kv-dtype fp16) is cast on write and on read
    rows: str | None = None        # int64 [1]: ring rows the products read while `short` holds
    short: str | None = None       # bool [1]: every lane of the graph is short of the ring's limit
    short_bias: str | None = None  # `bias` cut to `rows` rows
    write_rows: str | None = None  # decode: int32 [L] ring row of each lane's new K/V (GroupQueryAttention's seqlens_k)
    write_total: str | None = None  # decode: int32 [] max(write_rows) + 1 (its total_sequence_length)
    unwrapped: str | None = None   # decode: bool [] every lane's position is below min(window, R): nothing
                                   # wrapped and nothing left the window, so attention is plain causal
    in_rows: str | None = None     # prefill, float32 ring: bool [] every position this step writes is below R,
                                   # so ring row = position and GroupQueryAttention works in place
    total: str | None = None       # prefill, float32 ring: int32 [] max(seqlens_k) + 1 (its total_sequence_length)


def build_context(g: GraphBuilder, spec, lanes: int, tokens: int, ring: int, prefill: bool,
                  kv_dtype: str = "float32") -> RingContext:
    s, nkv = "/model/ring", spec.num_kv_heads
    seq = g.op("Cast", ["seqlens_k"], name=f"{s}/Cast", to=7)                                       # [L] int64
    start = g.op("Unsqueeze", [g.op("Add", [seq, g.const(1 - tokens)], name=f"{s}/Start"), g.const([1])],
                 name=f"{s}/StartCol")                                                             # [L, 1]
    positions = g.op("Add", [start, g.const(np.arange(tokens)[None, :])], name=f"{s}/Positions")   # [L, S]
    slot = g.op("Mod", [positions, g.const(ring)], name=f"{s}/Slot")                              # [L, S]
    gqa = tokens == 1 and kv_dtype == "float32"   # decode: GroupQueryAttention writes the ring (attention)
    index = None if gqa else _scatter_index(g, s, slot, lanes, nkv, tokens)
    real = None
    if prefill:
        j = g.const(np.arange(tokens).reshape(1, 1, tokens, 1))
        real = g.op("LessOrEqual", [j, "last_index"], name=f"{s}/RealTokens")                      # [1, 1, S, 1]
    query = g.op("Unsqueeze", [positions, g.const([2])], name=f"{s}/QueryCol")                     # [L, S, 1]
    back = g.op("Mod", [g.op("Sub", [query, g.const(np.arange(ring)[None, None, :])], name=f"{s}/Back"),
                        g.const(ring)], name=f"{s}/BackMod")                                       # [L, S, R]
    visible = g.op("And", [g.op("Less", [back, g.const(spec.sliding_window)], name=f"{s}/InWindow"),
                           g.op("LessOrEqual", [back, query], name=f"{s}/Written")], name=f"{s}/Visible")
    bias = g.op("Where", [visible, g.const(0.0, np.float32), g.const(NEG, np.float32)], name=f"{s}/Bias")
    if tokens == 1:   # decode: [L, 1, 1, R] broadcasts over the [L, Nkv, g, R] scores (see attention)
        bias = g.op("Unsqueeze", [bias, g.const([1])], name=f"{s}/Bias4")                          # [L, 1, 1, R]
    else:
        bias = g.op("Unsqueeze", [bias, g.const([1, 2])], name=f"{s}/Bias5")                       # [L, 1, 1, S, R]
    if gqa:
        rows32 = g.op("Cast", [g.op("Reshape", [slot, g.const([lanes])], name=f"{s}/WriteRows64")], name=f"{s}/WriteRows", to=6)
        top = g.op("ReduceMax", [rows32], name=f"{s}/WriteTop", keepdims=0)
        decode = {"write_rows": rows32, "write_total": g.op("Add", [top, g.const(1, np.int32)], name=f"{s}/WriteTotal"),
                  "unwrapped": g.op("Less", [g.op("ReduceMax", [seq], name=f"{s}/Newest", keepdims=0),
                                             g.const(min(spec.sliding_window, ring), np.int64)], name=f"{s}/Unwrapped")}
        return RingContext(ring, lanes, tokens, positions, index, real, bias, kv_dtype, **decode)
    rows_ctx = {}
    if prefill and kv_dtype == "float32":   # GroupQueryAttention in place while no position reaches R
        total = g.op("Add", [g.op("ReduceMax", ["seqlens_k"], name=f"{s}/NewestRow", keepdims=0), g.const(1, np.int32)],
                     name=f"{s}/Total")                                                            # int32 []
        rows_ctx = {"total": total, "in_rows": g.op("LessOrEqual", [total, g.const(ring, np.int32)], name=f"{s}/InRows")}
    grain = max(1, min(GRAIN, ring // 8))
    limit = ring * 5 // 8 // grain * grain
    if limit < 2 * grain:
        return RingContext(ring, lanes, tokens, positions, index, real, bias, kv_dtype, **rows_ctx)
    written = g.op("Add", [g.op("ReduceMax", [seq], name=f"{s}/Longest", keepdims=1), g.const([grain])],
                   name=f"{s}/WrittenUp")                                        # max(seqlens_k) + 1 + grain - 1
    grains = g.op("Max", [g.op("Div", [written, g.const([grain])], name=f"{s}/Grains"), g.const([2])], name=f"{s}/TwoGrains")
    rows = g.op("Min", [g.op("Mul", [grains, g.const([grain])], name=f"{s}/RowsUp"), g.const([ring])], name=f"{s}/Rows")  # [1]
    short = g.op("LessOrEqual", [rows, g.const([limit])], name=f"{s}/Short")                          # [1] bool
    short_bias = g.op("Slice", [bias, g.const([0]), rows, g.const([-1])], name=f"{s}/ShortBias")
    return RingContext(ring, lanes, tokens, positions, index, real, bias, kv_dtype, rows, short, short_bias, **rows_ctx)


def _scatter_index(g: GraphBuilder, s: str, slot: str, lanes: int, nkv: int, tokens: int) -> str:
    """int64 [L, Nkv, S, 3]: (lane, kv head, slot) of every new K/V row, ScatterND's index."""
    slot4 = g.op("Expand", [g.op("Unsqueeze", [slot, g.const([1, 3])], name=f"{s}/Slot4"), g.const([lanes, nkv, tokens, 1])],
                 name=f"{s}/SlotExpand")                                                           # [L, Nkv, S, 1]
    lane_ids = np.broadcast_to(np.arange(lanes).reshape(lanes, 1, 1, 1), (lanes, nkv, tokens, 1))
    head_ids = np.broadcast_to(np.arange(nkv).reshape(1, nkv, 1, 1), (lanes, nkv, tokens, 1))
    return g.op("Concat", [g.const(np.ascontiguousarray(lane_ids)), g.const(np.ascontiguousarray(head_ids)), slot4],
                name=f"{s}/ScatterIndex", axis=-1)


def attention(g: GraphBuilder, spec, layer: int, q: str, k: str, v: str, rope: tuple[str, str],
              ctx: RingContext, scope: str) -> str:
    """q [L, S, N*D], k/v [L, S, Nkv*D] -> [L, S, N*D]; writes this step's K/V into the layer's ring."""
    n, nkv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    group, lanes, tokens = n // nkv, ctx.lanes, ctx.tokens
    past_k, past_v, present_k, present_v = kv_names(layer)
    cos, sin = rope
    rotary = lambda x, heads, nm: g.op("RotaryEmbedding", [x, ctx.positions, cos, sin], name=f"{scope}/{nm}",  # noqa: E731
                                       domain=MS_DOMAIN, interleaved=0, num_heads=heads)
    q = rotary(q, n, "RotaryQ")                                                                        # [L, S, N*D]
    k = rotary(k, nkv, "RotaryK")
    one = tokens == 1   # decode: [L, 1, ...] and [L, ..., 1, ...] share a layout, so reshapes replace transposes

    def heads(x: str, nm: str) -> str:                                                                 # [L, Nkv, S, D]
        if one:
            return g.op("Reshape", [x, g.const([lanes, nkv, 1, d])], name=f"{scope}/{nm}Heads")
        return g.op("Transpose", [g.op("Reshape", [x, g.const([0, 0, nkv, d])], name=f"{scope}/{nm}Heads")],
                    name=f"{scope}/{nm}t", perm=[0, 2, 1, 3])
    half = ctx.kv_dtype != "float32"   # a float16 ring: this step's K/V cast on write, the ring on read

    def write(names: list[str]) -> list[str]:
        """ScatterND this step's K/V into the rings (outputs `names`): the ring values after the write."""
        new_k, new_v = heads(k, "NewK"), heads(v, "NewV")
        if half:
            to = helper.np_dtype_to_tensor_dtype(np.dtype(ctx.kv_dtype))
            new_k = g.op("Cast", [new_k], name=f"{scope}/NewKCast", to=to)
            new_v = g.op("Cast", [new_v], name=f"{scope}/NewVCast", to=to)
        rings = []
        for new, past, name, tag in ((new_k, past_k, names[0], "K"), (new_v, past_v, names[1], "V")):
            if ctx.real is not None:   # padding writes back the rows it would overwrite
                old = g.op("GatherND", [past, ctx.index], name=f"{scope}/Old{tag}")                   # [L, Nkv, S, D]
                new = g.op("Where", [ctx.real, new, old], name=f"{scope}/Keep{tag}")
            rings.append(g.op("ScatterND", [past, ctx.index, new], name=f"{scope}/Write{tag}", outputs=[name]))
        return rings

    def query_rows() -> str:
        if one:
            return g.op("Reshape", [q, g.const([lanes, nkv, group, d])], name=f"{scope}/QRows")       # [L, Nkv, g, D]
        grouped = g.op("Transpose", [g.op("Reshape", [q, g.const([lanes, tokens, nkv, group, d])], name=f"{scope}/GroupQ")],
                       name=f"{scope}/Qt", perm=[0, 2, 3, 1, 4])                                       # [L, Nkv, g, S, D]
        return g.op("Reshape", [grouped, g.const([lanes, nkv, group * tokens, d])], name=f"{scope}/QRows")  # [L, Nkv, g*S, D]

    def products(rows_q: str, keys: str, values: str, bias: str, tag: str) -> str:
        """softmax(Q . K^T * scale + bias) . V over n ring rows: [L, Nkv, g*S, D]."""
        if half:
            keys = g.op("Cast", [keys], name=f"{scope}/RingKFloat{tag}", to=TensorProto.FLOAT)
            values = g.op("Cast", [values], name=f"{scope}/RingVFloat{tag}", to=TensorProto.FLOAT)
        # The g query heads of one KV head go through the products as g*S rows of one matrix, so each
        # (lane, KV head) reads its ring once per product instead of once per query head.
        scores = g.op("FusedMatMul", [rows_q, keys], name=f"{scope}/Scores{tag}", domain=MS_DOMAIN, transB=1,
                      alpha=float(spec.attn_scale))                                                    # [L, Nkv, g*S, n]
        if one:   # decode: no transposes, the bias already 4-D
            probs = g.op("Softmax", [g.op("Add", [scores, bias], name=f"{scope}/Mask{tag}")], name=f"{scope}/Softmax{tag}",
                         axis=-1)
            return g.op("MatMul", [probs, values], name=f"{scope}/Attn{tag}")                          # [L, Nkv, g, D]
        scores = g.op("Reshape", [scores, g.const([lanes, nkv, group, tokens, -1])], name=f"{scope}/Scores5{tag}")
        probs = g.op("Softmax", [g.op("Add", [scores, bias], name=f"{scope}/Mask{tag}")], name=f"{scope}/Softmax{tag}",
                     axis=-1)
        probs = g.op("Reshape", [probs, g.const([lanes, nkv, group * tokens, -1])], name=f"{scope}/ProbRows{tag}")
        return g.op("MatMul", [probs, values], name=f"{scope}/Attn{tag}")                              # [L, Nkv, g*S, D]

    def merge(out: str) -> str:                                                                        # -> [L, S, N*D]
        if one:
            return g.op("Reshape", [out, g.const([lanes, 1, n * d])], name=f"{scope}/Merge")
        out = g.op("Reshape", [out, g.const([lanes, nkv, group, tokens, d])], name=f"{scope}/Attn5")   # [L, Nkv, g, S, D]
        out = g.op("Transpose", [out], name=f"{scope}/Outt", perm=[0, 3, 1, 2, 4])                     # [L, S, Nkv, g, D]
        return g.op("Reshape", [out, g.const([0, 0, n * d])], name=f"{scope}/Merge")

    def on_ring(rings: list[str]) -> str:
        """Attention over the rings after this step's write: [L, S, N*D]."""
        rows_q = query_rows()
        if ctx.short is None:
            return merge(products(rows_q, rings[0], rings[1], ctx.bias, ""))
        # only the rows written so far while every lane is short of the limit (module docstring)
        def first_rows() -> str:
            cut = [g.op("Slice", [r, g.const([0]), ctx.rows, g.const([2])], name=f"{scope}/Ring{tag}Rows")
                   for r, tag in zip(rings, "KV")]
            return products(rows_q, cut[0], cut[1], ctx.short_bias, "Rows")
        then = g.branch(f"{scope}/RowsWritten", first_rows, TensorProto.FLOAT)
        whole = g.branch(f"{scope}/WholeRing", lambda: products(rows_q, rings[0], rings[1], ctx.bias, "Whole"),
                         TensorProto.FLOAT)
        return merge(g.op("If", [ctx.short], name=f"{scope}/ShortRing", then_branch=then, else_branch=whole))

    if one and ctx.write_rows is not None:
        # Decode, float32 ring: GroupQueryAttention with the ring as its in-place buffer writes each
        # lane's new K/V at row seqlens_k, so it is given the ring row (position mod R): that is the
        # ring's write. Its attention reads rows 0..seqlens_k of each lane in place, exactly the ring's
        # visible set while no lane has wrapped or reached the window (`unwrapped`); otherwise the
        # products below read the whole ring after the write. Against copying the rows written so far
        # (the prefill path), each lane's rows are read once, only up to its own length: 8 lanes at
        # 260 positions, one layer, 0.28 ms against 0.57 (ONNX Runtime 1.32, this project's 2-core EPYC).
        causal, *rings = g.op("GroupQueryAttention", [q, k, v, past_k, past_v, ctx.write_rows, ctx.write_total],
                              name=f"{scope}/RingWrite", outputs=[f"{scope}/ring_attn", present_k, present_v],
                              domain=MS_DOMAIN, num_heads=n, kv_num_heads=nkv, scale=float(spec.attn_scale),
                              do_rotary=0)                                                           # [L, 1, N*D]
        then = g.branch(f"{scope}/Causal", lambda: causal, TensorProto.FLOAT)   # the branch copies it (GraphBuilder.branch)
        whole = g.branch(f"{scope}/WholeRing", lambda: merge(products(query_rows(), rings[0], rings[1], ctx.bias, "Whole")),
                         TensorProto.FLOAT)
        return g.op("If", [ctx.unwrapped], name=f"{scope}/ShortRing", then_branch=then, else_branch=whole)
    if ctx.in_rows is None:
        return on_ring(write([present_k, present_v]))
    # Prefill, float32 ring: while every position this step writes is below R, ring row = position, so
    # GroupQueryAttention (its sliding window set, as the full-context build runs it: layers.attention)
    # writes the chunk and attends in place over each lane's rows 0..seqlens_k. Past R the ring's own
    # write and products. A lane's branch depends on its own position only (prefill graphs run one
    # lane), and both follow the reference; a 200-token prompt (all below R) on the default model
    # measured 0.91-0.94x the time of the products (benchmarks/RESULTS.md, 2026-12-08).
    def in_rows() -> tuple[str, str, str]:
        return tuple(g.op("GroupQueryAttention", [q, k, v, past_k, past_v, "seqlens_k", ctx.total], name=f"{scope}/RowsGQA",
                          outputs=[f"{scope}/rows_attn", f"{scope}/RowsK", f"{scope}/RowsV"], domain=MS_DOMAIN,
                          num_heads=n, kv_num_heads=nkv, scale=float(spec.attn_scale),
                          local_window_size=int(spec.sliding_window), do_rotary=0))
    def ring_branch() -> tuple[str, str, str]:
        rings = write([f"{scope}/RingK", f"{scope}/RingV"])
        return on_ring(rings), rings[0], rings[1]
    kinds = (TensorProto.FLOAT,) * 3
    out, _, _ = g.op("If", [ctx.in_rows], name=f"{scope}/InRows", outputs=[f"{scope}/attn_out", present_k, present_v],
                     then_branch=g.branch(f"{scope}/RowsInPlace", in_rows, kinds),
                     else_branch=g.branch(f"{scope}/OnRing", ring_branch, kinds))
    return out
