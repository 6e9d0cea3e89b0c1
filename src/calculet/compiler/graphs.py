"""The compiled entry points, their static signatures (`calbin.graphspec` types) and the graph each becomes.

Entry points (one shape profile: B lanes, context C, prefill chunk sizes S1 < S2 < ..., decode
batch sizes n1 < ... < B):

    prefill_<S>  body, one lane, S tokens (right-padded)   input_ids [1, S], last_index [1] -> hidden [1, H]
    decode_<n>   body, lanes 0..n-1, one token each         input_ids [n, 1]                 -> hidden [n, H]
    head_<n>     lm_head (+ sampling head), n rows          hidden [n, H] -> logits [n, V], topk_values/ids [n, K]

Bodies take seqlens_k int32 [lanes] (each lane's length after this step, minus one), total_seq_len
int32 [] (the longest such length; in-place bodies with full-context layers only), and past_key.i /
past_value.i [lanes, Nkv, C_i, D] per layer in the KV dtype (float32, or float16 with --kv-dtype fp16;
C_i = the context, or a sliding-window layer's ring: compiler/kv_layout.py), which they update in place
(present_* outputs alias the past_* buffers). The lm_head lives in its own small graphs so its (large)
weights are prepared once per row count, not once per body.

    input_ids ─ embed ─ layer 0 ─ ... ─ layer n-1 ─ norm ─ (gather last_index) ─ hidden
                        └─ each layer reads/writes its KV buffer at every lane's own position
    hidden ─ lm_head ─ logits ─ TopK(K) ─ topk_values, topk_ids      (the on-graph sampling head)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import ModelProto

from calculet.calbin.graphspec import DECODE, HEAD, PREFILL, PROBE_PREFIX, GraphSpec, TensorSpec, kv_names
from calculet.compiler import attention_portable, attention_ring, decoder, layers
from calculet.compiler.builder import GraphBuilder
from calculet.compiler.prefill_int8 import per_row_int8_product
from calculet.compiler.topk import top_k
from calculet.compiler.weights import WeightStore
from calculet.models.base import ModelSpec, lm_head_name


@dataclass(frozen=True)
class Stage:
    """A pipeline stage's share of a body graph (`--partition pp`): its layers, and whether it embeds
    the tokens (the first stage) and ends with the final norm (the last stage). Other stages take
    `hidden_in [L, S, H]` and give `hidden_out [L, S, H]`, the residual stream after their last layer.
    `context`: the full-attention layers' KV rows, so a stage of sliding-window layers only still tells
    its rings from full buffers (0: the longest buffer of its layers)."""
    layers: tuple[int, ...]
    first: bool
    last: bool
    context: int = 0


def _body_signature(spec: ModelSpec, name: str, kind: str, lanes: int, tokens: int, lengths: tuple[int, ...],
                    in_place: bool = True, expert_stats: bool = False, stage: Stage | None = None,
                    kv_dtype: str = "float32") -> GraphSpec:
    """`lengths`: rows of each layer's KV buffer, for every layer of the model (compiler/kv_layout.py:
    the context, or a ring); a pipeline `stage` takes only its own layers' buffers. `kv_dtype`: the
    buffers' dtype (--kv-dtype), also that of a portable body's new_keys/new_values."""
    stage = stage or Stage(tuple(range(spec.num_layers)), True, True)
    context = max(lengths)
    inputs = [
        TensorSpec("input_ids", (lanes, tokens), "int64") if stage.first
        else TensorSpec("hidden_in", (lanes, tokens, spec.hidden_size), "float32"),
        TensorSpec("seqlens_k", (lanes,), "int32"),
    ]
    if in_place and any(lengths[i] == context for i in stage.layers):  # GroupQueryAttention (full-context buffers) reads it
        inputs.append(TensorSpec("total_seq_len", (), "int32"))
    ring = in_place and any(lengths[i] != context for i in stage.layers)
    if kind == PREFILL and (stage.last or ring):  # a ring's padding rows write back what they held (attention_ring)
        inputs.append(TensorSpec("last_index", (1,), "int64"))
    outputs = [TensorSpec("hidden", (lanes, spec.hidden_size), "float32") if stage.last
               else TensorSpec("hidden_out", (lanes, tokens, spec.hidden_size), "float32")]
    for i in stage.layers:
        kv_shape = (lanes, spec.num_kv_heads, lengths[i], spec.head_dim)
        pk, pv, nk, nv = kv_names(i)
        inputs += [TensorSpec(pk, kv_shape, kv_dtype), TensorSpec(pv, kv_shape, kv_dtype)]
        if in_place:
            outputs += [TensorSpec(nk, kv_shape, kv_dtype), TensorSpec(nv, kv_shape, kv_dtype)]
    if not in_place:  # portable: this step's K/V come back for the runtime to write
        new_shape = (spec.num_layers, lanes, spec.num_kv_heads, tokens, spec.head_dim)
        outputs += [TensorSpec("new_keys", new_shape, kv_dtype), TensorSpec("new_values", new_shape, kv_dtype)]
    if expert_stats and spec.moe is not None:  # 1 where a row was routed to an expert, per sparse layer
        outputs.append(TensorSpec("expert_mask", (len(spec.moe.sparse_layers), lanes * tokens, spec.moe.num_experts), "uint8"))
    return GraphSpec(name, kind, lanes, tokens, tuple(inputs), tuple(outputs))


def stage_signature(spec: ModelSpec, logical: GraphSpec, lengths: tuple[int, ...], stage: Stage) -> GraphSpec:
    """A pipeline stage's version of the logical body graph `logical` (same name, kind and shape), with
    its layers' KV buffers at `lengths` (every layer's rows: the context, or a ring)."""
    if len(lengths) != spec.num_layers or stage.context not in (0, max(lengths)):
        raise ValueError(f"a stage signature needs one KV length per layer ({spec.num_layers}) whose longest is the "
                         f"stage's context {stage.context}; got {list(lengths)}")
    return _body_signature(spec, logical.name, logical.type, logical.lanes, logical.tokens, lengths, True, False, stage)


def _head_signature(spec: ModelSpec, rows: int, topk: int, row_scaled: bool = False) -> GraphSpec:
    """`row_scaled`: the head leaves `logits` unscaled per row and outputs the scales as `logits_scale`
    [rows, 1] (a multi-row coarse head: see _build_coarse_head); the runtime multiplies a fetched row."""
    outputs = [TensorSpec("logits", (rows, spec.vocab_size), "float32")]
    if topk:
        outputs += [TensorSpec("topk_values", (rows, topk), "float32"), TensorSpec("topk_ids", (rows, topk), "int64")]
    if row_scaled:
        outputs.append(TensorSpec("logits_scale", (rows, 1), "float32"))
    return GraphSpec(f"head_{rows}", HEAD, rows, 1, (TensorSpec("hidden", (rows, spec.hidden_size), "float32"),),
                     tuple(outputs))


def entry_points(spec: ModelSpec, lanes: int, context: int, prefill_chunks: tuple[int, ...],
                 decode_lanes: tuple[int, ...] = (), topk: int = 0, in_place: bool = True,
                 expert_stats: bool = False, kv_lengths: tuple[int, ...] | None = None,
                 kv_dtype: str = "float32", row_scaled_heads: bool = False) -> list[GraphSpec]:
    """`kv_lengths`: each layer's KV buffer rows (the KV layout's); None: the context for every layer.
    `kv_dtype`: the KV buffers' numpy dtype name (the KV layout's). `row_scaled_heads`: the heads of
    more than one row are coarse heads with per-row scales (`has_row_scaled_heads`)."""
    lengths = tuple(kv_lengths) if kv_lengths is not None else (context,) * spec.num_layers
    decode_sizes = sorted(set(decode_lanes) | {lanes})
    graphs = [_body_signature(spec, f"prefill_{s}", PREFILL, 1, s, lengths, in_place, expert_stats, kv_dtype=kv_dtype)
              for s in sorted(prefill_chunks)]
    graphs += [_body_signature(spec, f"decode_{n}", DECODE, n, 1, lengths, in_place, expert_stats, kv_dtype=kv_dtype)
               for n in decode_sizes]
    graphs += [_head_signature(spec, n, topk, row_scaled_heads and n > 1) for n in sorted(set(decode_sizes) | {1})]
    return graphs


def has_row_scaled_heads(weights: WeightStore, target: str, topk: int) -> bool:
    """Whether the multi-row heads _build_head makes are int8 coarse heads with per-row activation
    scales (and so output `logits_scale`): the cpu target, a sampling head, and the coarse-head pass's
    int8 copy of the lm_head in the store."""
    return target == "cpu" and topk > 0 and "lm_head.coarse8.weight" in weights and \
        weights.quant("lm_head.coarse") is not None


def add_rope_tables(spec: ModelSpec, context: int, weights: WeightStore) -> dict:
    """cos/sin caches [C, D/2] per layer type, stored with the weights."""
    tables = {}
    for layer_type, rope in (("full", spec.rope_full), ("sliding", spec.rope_sliding)):
        if layer_type not in spec.layer_types:
            continue
        cos, sin = rope.cos_sin(spec.head_dim, context)
        names = (f"rope.{layer_type}.cos", f"rope.{layer_type}.sin")
        for name, table in zip(names, (cos, sin)):
            if name not in weights:
                weights.add(name, table)
        tables[layer_type] = names
    return tables


def build_graph(spec: ModelSpec, gs: GraphSpec, weights: WeightStore,
                rope_tables: dict, target: str = "cpu", fusions: frozenset[str] = frozenset(),
                probes: bool = False, stage: Stage | None = None, decode_int8: tuple[str, ...] = (),
                outlier_add_apart: bool = False) -> ModelProto:
    """The graph of `gs`. With `probes` (a debug build), bodies also output every module's result
    as `probe:<HF module name>` [L, S, width], in execution order (see `probe_outputs`). With
    `decode_int8` (weight suffixes) decode bodies run those projections on the prefill-int8 pass's int8 rows
    too (prefill_int8.decode_int8), the others on their block kernels. With `outlier_add_apart` prefill chunks add
    the float32 outlier channels as a 3-D MatMul and Add (prefill_int8.outlier_add_apart)."""
    g = GraphBuilder(gs.name, weights, target, fusions, probes=probes and gs.type != HEAD)
    # Decode keeps the block kernels: with AMX the int8 rows were 0.91x at 8 lanes but 1.11x at one
    # (benchmarks/RESULTS.md, 2026-12-05), on a Zen 5 EPYC 0.98x and 1.04x (2026-12-06 (3)), and decode_1
    # and decode_n must share one formulation. Without an int8 dot (the AVX2 view) the int8 rows with
    # down_proj on the blocks took 0.88x at 8 lanes and about 1.0x at one: `decode_int8` there (gate/up only
    # by default: most of the 8-lane gain for a fraction of the glue one lane pays).
    if gs.type == PREFILL:
        g.prefill_shape, g.outlier_add_apart = (gs.lanes, gs.tokens), outlier_add_apart
    elif gs.type == DECODE and decode_int8:   # every decode graph alike: batched = alone
        g.prefill_shape, g.float32_copies, g.int8_rows = (gs.lanes, gs.tokens), False, decode_int8
    for t in gs.inputs:
        g.input(t.name, np.dtype(t.dtype), t.shape)
    if gs.type == HEAD:
        outputs = _build_head(g, spec, gs)
    else:
        outputs = _build_body(g, spec, gs, rope_tables, stage or Stage(tuple(range(spec.num_layers)), True, True))
    for t in gs.outputs:
        g.output(outputs.get(t.name, t.name), t.name, np.dtype(t.dtype), t.shape)
    for module, value, width, positions in g.probes:
        g.output(value, PROBE_PREFIX + module, np.float32, (gs.lanes, positions or gs.tokens, width))
    return g.build()


def probe_outputs(model: ModelProto) -> tuple[TensorSpec, ...]:
    """The probe outputs of a built graph, for its GraphSpec (the manifest lists every output)."""
    out = []
    for o in model.graph.output:
        if o.name.startswith(PROBE_PREFIX):
            shape = tuple(d.dim_value for d in o.type.tensor_type.shape.dim)
            out.append(TensorSpec(o.name, shape, "float32"))
    return tuple(out)


def _build_body(g: GraphBuilder, spec: ModelSpec, gs: GraphSpec, rope_tables: dict, stage: Stage) -> dict:
    lengths = {i: gs.input(kv_names(i)[0]).shape[2] for i in stage.layers}
    context = stage.context or max(lengths.values(), default=0)
    ring_layers = frozenset(i for i, n in lengths.items() if n != context)
    ring = min((lengths[i] for i in ring_layers), default=None)
    kv_dtype = gs.input(kv_names(stage.layers[0])[0]).dtype if stage.layers else "float32"
    portable = ring_ctx = None
    if g.target == "portable":
        portable = attention_portable.build_context(g, spec, gs.lanes, gs.tokens, context, ring, kv_dtype)
    elif ring is not None:
        ring_ctx = attention_ring.build_context(g, spec, gs.lanes, gs.tokens, ring, gs.type == PREFILL, kv_dtype)
    ctx = layers.AttentionInputs(
        seqlens_k="seqlens_k",
        total_seq_len="total_seq_len",
        rope={k: (g.weight(c), g.weight(s)) for k, (c, s) in rope_tables.items()},
        portable=portable,
        ring=ring_ctx,
        ring_layers=ring_layers,
        rows=gs.lanes * gs.tokens,
        expert_masks=[] if any(t.name == "expert_mask" for t in gs.outputs) else None,
        kv_dtype=kv_dtype,
    )
    if stage.first:
        stream = layers.Stream(decoder.embed(g, spec, "input_ids"))         # [L, S, H]
        g.probe("model.embed_tokens", stream.x, spec.hidden_size)
    else:
        stream = layers.Stream("hidden_in")                                  # [L, S, H] from the stage before
    for i in stage.layers:
        stream = decoder.build_layer(g, spec, i, stream, ctx)                # [L, S, H]
        if g.probing:  # the layer's output is the residual sum the next norm would fuse
            total = stream.x if stream.pending is None else g.op("Add", [stream.x, stream.pending],
                                                                  name=f"/probes/layers.{i}/ResidualAdd")
            g.probe(f"model.layers.{i}", total, spec.hidden_size)
    if not stage.last:  # hand the residual stream on: x plus the pending branch, added here
        total = stream.x if stream.pending is None else g.op("Add", [stream.x, stream.pending],
                                                              name="/model/stage_out/ResidualAdd")
        return {"hidden_out": total}
    if gs.type == PREFILL:  # only the last real token goes on: gather before the final norm
        gather = lambda v, n: g.op("Gather", [v, "last_index"], name=f"/model/last_token/{n}", axis=1)  # noqa: E731
        stream = layers.Stream(gather(stream.x, "GatherX"), gather(stream.pending, "GatherBranch"))  # [1, 1, H]
    g.probe_positions = 1  # the final norm sees one token per lane (prefill: the last real one)
    x, _ = layers.add_norm(g, stream, "model.norm.weight", spec.rms_norm_eps, "/model/norm")
    out = {"hidden": g.op("Reshape", [x, g.const([gs.lanes, spec.hidden_size])], name="/model/flatten/Reshape")}
    if portable is not None:
        out["new_keys"], out["new_values"] = attention_portable.stack_new_kv(g, portable)
    if ctx.expert_masks is not None:
        out["expert_mask"] = g.op("Concat", ctx.expert_masks, name="/model/expert_mask/Concat", axis=0)  # [layers, N, E]
    return out


def _build_head(g: GraphBuilder, spec: ModelSpec, gs: GraphSpec) -> dict[str, str]:
    head = lm_head_name(spec, g.weights)
    topk = next((t.shape[1] for t in gs.outputs if t.name == "topk_ids"), 0)
    if topk and g.weights.quant("lm_head.coarse") is not None and g.target == "cpu":
        return _build_coarse_head(g, head, topk, gs.lanes, spec.vocab_size,
                                  any(t.name == "logits_scale" for t in gs.outputs))
    if g.weights.quant(head) is not None:
        logits = layers.linear(g, "hidden", head, "/lm_head")                                  # [R, V]
    elif layers.is_half(g, head):
        logits = layers.half_product(g, "Gemm", "hidden", head, "/lm_head", transB=1)            # [R, V]
    else:
        logits = g.op("Gemm", ["hidden", g.weight(head)], name="/lm_head/Gemm", transB=1)      # [R, V]
    out = {"logits": logits}
    if topk:  # sampling head: the host fetches K candidates per row instead of the whole vocabulary
        values, ids = top_k(g, logits, gs.lanes, spec.vocab_size, topk, "/sampling_head")
        out.update(topk_values=values, topk_ids=ids)
    return out


# Candidates the coarse head rescores per K it returns. The exact top token must be among them for
# greedy (and top-k <= K) to be the int8 head's, and the same whether a lane runs alone (the int4 copy)
# or batched (the int8 rows): the int4 copy's rounding moves a top token down to rank ~100 on
# non-Latin text (quantize.COARSE_BLOCKS). 2K rows cost ~0.1 ms more to gather and rescore than K.
CANDIDATE_POOL = 2


def _build_coarse_head(g: GraphBuilder, head: str, topk: int, rows_n: int, vocab: int,
                       row_scaled: bool) -> dict[str, str]:
    """Coarse-then-exact lm_head (the "coarse-head" pass):

        coarse = hidden . Wc^T                      [R, V]   R = 1: int4 blocks (half the bytes);
                                                             R > 1: int8 per column, rows quantized
                                                             one by one (a faster GEMM)
        cand   = TopK(coarse, P)                    [R, P]   P = CANDIDATE_POOL x K; two levels on a wide
                                                             vocabulary (compiler/topk.py)
        rows   = GatherBlockQuantized(W8, cand)     [R, P, H] exact int8 rows, dequantized
        exact  = rows . hidden                      [R, P]
        topk_values/ids = the K largest of exact    [R, K]
        logits = coarse                             [R, V]

    The graph leaves the coarse values in `logits`: a full row is only fetched when the host samples
    from it, and the runtime then writes the K exact values in at their ids (see Device._fetch), so
    no step pays a [R, V] scatter and copy for rows that only need their candidates. The R > 1 head
    leaves them unscaled too: a row's scale is positive, so TopK picks the same candidates from the
    unscaled product, and the runtime multiplies a fetched row by `logits_scale` [R, 1] (the same
    float32 product a Mul here would make) instead of every step rescaling [R, V] in the graph.
    """
    q = g.weights.quant(head)
    extra = {}
    if row_scaled:   # the signature says so: has_row_scaled_heads (R > 1 and the int8 copy stored)
        coarse, extra["logits_scale"] = per_row_int8_product(g, "hidden", "lm_head.coarse8", rows_n,
                                                              "/lm_head/coarse")                  # [R, V], [R, 1]
    else:
        coarse = layers.linear(g, "hidden", "lm_head.coarse", "/lm_head/coarse")                  # [R, V]
    pool = min(CANDIDATE_POOL * topk, vocab)
    _, cand = top_k(g, coarse, rows_n, vocab, pool, "/lm_head/candidates")                      # [R, P]
    rows = g.op("GatherBlockQuantized", [g.weight(f"{head}.gather_codes"), cand, g.weight(f"{head}.qscales")],
                name="/lm_head/rescore/GatherBlockQuantized", domain="com.microsoft", bits=q.bits,
                block_size=q.block, gather_axis=0, quantize_axis=1)                             # [R, P, H]
    h = g.op("Unsqueeze", ["hidden", g.const([2])], name="/lm_head/rescore/Hidden")              # [R, H, 1]
    exact = g.op("Squeeze", [g.op("MatMul", [rows, h], name="/lm_head/rescore/MatMul"), g.const([2])],
                 name="/lm_head/rescore/Squeeze")                                                # [R, P]
    values, order = g.op("TopK", [exact, g.const([topk])], name="/sampling_head/TopK", n_out=2, axis=-1,
                         largest=1, sorted=1)
    ids = g.op("GatherElements", [cand, order], name="/sampling_head/Ids", axis=1)
    return {"logits": coarse, "topk_values": values, "topk_ids": ids, **extra}
