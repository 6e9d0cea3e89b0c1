"""`--partition tp`: attention heads and FFN columns split over P chips, partial outputs all-reduced.

Chip c holds, of every layer, query heads [c N/P, (c+1) N/P) and their KV heads (when Nkv < P, the
one KV head its query heads read: KV heads are then replicated), q/k/v rows and o_proj columns of
those heads, and FFN columns [c F/P, (c+1) F/P) (gate/up rows, down_proj columns). Its o_proj and
down_proj outputs are partial sums; the host all-reduces them. The weights are the source's
tensors sliced in Hugging Face layout and run through the ordinary weight pipeline with a narrow
spec (N/P heads, F/P FFN), so every weight policy (int8/int4 blocks along K included) applies.

Each body graph is cut at the reduce points into segment graphs, one per chip per segment:

    embed            chip 0: input_ids -> hidden_out [L, S, H]                            ─ broadcast ─▶ residual_in
    layers.i.attn    x = residual_in (+ mlp branch of layer i-1, post-normed in Gemma 3)
                     partial_out = o_proj_c(attn_c(norm(x)))   residual_out = x            ─ all_reduce ─▶ branch_in
    layers.i.mlp     x = residual_in + (post-normed) branch_in
                     partial_out = down_c(act(gate_c(m)) * up_c(m)), m = norm(x)          ─ all_reduce ─▶ branch_in
    final            chip 0: x = residual_in + branch_in -> (gather last_index) -> norm -> hidden [L, H] -> head

Each chip's KV is its KV heads of every layer, a sliding-window layer's as a ring (compiler/chip_kv.py):
that layer's attn segment runs attention_ring over the chip's own KV heads.

Every chip computes the same residual x from the same reduced sums (replicated, chip-local carry).
The embedding, final norm and lm_head live on chip 0 (the head chip). One graph per segment was
chosen over fusing an all-reduce into a graph: ONNX Runtime has no host callback inside a run, so a
reduce point is a graph boundary whichever way the graphs are cut.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from calculet.calbin.graphspec import HEAD, PREFILL, GraphSpec, TensorSpec, kv_names
from calculet.calbin.partition import Collective, Schedule, Segment
from calculet.compiler import chip_kv, decoder, graphs as G, layers
from calculet.compiler.kv_layout import layer_lengths
from calculet.compiler.partition import ChipBuild, chip_graphs, segment_graph
from calculet.compiler.quantize import policy_table, store_weights
from calculet.compiler.weights import WeightStore
from calculet.cpu_features import detect
from calculet.errors import RequestError
from calculet.models.base import ModelSpec

# family -> (norm after attention, norm before the MLP, norm after the MLP, activation)
_LAYER = {
    "llama": (None, "post_attention_layernorm", None, "silu"),
    "gemma3": ("post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm", "gelu_tanh"),
}


def post_mlp_norm(spec: ModelSpec) -> str | None:
    return _LAYER[spec.family][2] if spec.family in _LAYER else None


def check_tp(spec: ModelSpec, chips: int) -> None:
    if spec.family not in _LAYER or spec.moe is not None:
        raise RequestError("bad_option", f"--partition tp builds the dense families {', '.join(sorted(_LAYER))}; "
                                         f"{spec.model_type} is not one (use --partition pp)")
    if spec.num_heads % chips:
        raise RequestError("bad_option", f"--partition tp --chips {chips}: {spec.num_heads} attention heads do not "
                                         f"split evenly; use a --chips that divides {spec.num_heads}")
    if spec.num_kv_heads >= chips and spec.num_kv_heads % chips:
        raise RequestError("bad_option", f"--partition tp --chips {chips}: {spec.num_kv_heads} KV heads do not split "
                                         f"evenly; use a --chips that divides {spec.num_kv_heads}")
    if spec.num_kv_heads < chips and chips % spec.num_kv_heads:
        raise RequestError("bad_option", f"--partition tp --chips {chips}: {spec.num_kv_heads} KV heads cannot be "
                                         f"replicated evenly; use a --chips that is a multiple of {spec.num_kv_heads}")
    if spec.intermediate_size % chips:
        raise RequestError("bad_option", f"--partition tp --chips {chips}: FFN width {spec.intermediate_size} does not "
                                         f"split evenly")


def chip_slices(spec: ModelSpec, chips: int, c: int) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """(query heads, KV heads, FFN columns) of chip c, each [first, end)."""
    per = spec.num_heads // chips
    heads = (c * per, (c + 1) * per)
    group = spec.num_heads // spec.num_kv_heads            # query heads per KV head
    kv = (heads[0] // group, max(heads[0] // group + 1, heads[1] // group))
    f = spec.intermediate_size // chips
    return heads, kv, (c * f, (c + 1) * f)


class _Sliced:
    """The source's tensors as chip c sees them: its heads' and FFN columns' rows/columns (HF layout [out, in])."""

    def __init__(self, tensors, spec: ModelSpec, heads, kv, ffn):
        self.tensors, self.d = tensors, spec.head_dim
        self.rows = {"q_proj": heads, "k_proj": kv, "v_proj": kv}
        self.ffn = ffn

    def __getitem__(self, name: str):
        t = self.tensors[name]
        parts = name.split(".")
        if len(parts) < 5 or parts[0] != "model" or parts[1] != "layers":
            return t
        proj, kind = parts[-2], parts[-1]
        if proj in self.rows:
            a, b = self.rows[proj]
            return np.asarray(t)[a * self.d:b * self.d]                      # weight [out, in] or bias [out]
        if proj == "o_proj" and kind == "weight":
            a, b = self.rows["q_proj"]
            return np.asarray(t)[:, a * self.d:b * self.d]
        if proj in ("gate_proj", "up_proj"):
            return np.asarray(t)[self.ffn[0]:self.ffn[1]]
        if proj == "down_proj":
            return np.asarray(t)[:, self.ffn[0]:self.ffn[1]]
        return t

    def __contains__(self, name):
        return name in self.tensors


def narrow_spec(spec: ModelSpec, heads, kv, ffn) -> ModelSpec:
    return replace(spec, num_heads=heads[1] - heads[0], num_kv_heads=kv[1] - kv[0], intermediate_size=ffn[1] - ffn[0])


def build_tp(spec: ModelSpec, logical: list[GraphSpec], _weights, _rope, options, context: int, lanes: int,
             source=None, family=None):
    """(chip builds, one schedule per body graph, head chip 0)."""
    chips = options.chips
    check_tp(spec, chips)
    table = policy_table(options.weights, options.block_size)
    lengths = layer_lengths(spec, context, tuple(options.prefill_chunks), options.kv_rings)
    builds = []
    for c in range(chips):
        heads, kv, ffn = chip_slices(spec, chips, c)
        nspec = narrow_spec(spec, heads, kv, ffn)
        store = WeightStore()
        record = store_weights(nspec, family, _Sliced(source.tensors, spec, heads, kv, ffn), table, store, None,
                               options.fusions, options.quant, detect().int8_code_range)   # as compile_calbin's CPU
        rope = G.add_rope_tables(nspec, context, store)
        sigs, models = chip_graphs(
            logical, c == 0,
            lambda gs: G.build_graph(nspec, gs, store, rope, options.target, options.fusions),
            lambda gs: _segments(nspec, spec, gs, store, rope, options, lengths, context, c))
        kv_layout = chip_kv.chip_kv_layout(spec, "tp", chips, c, lanes, context, tuple(options.prefill_chunks),
                                           options.kv_rings)   # its KV heads; rings on the sliding-window layers
        builds.append(ChipBuild(c, sigs, models, kv_layout,
                                dict(layers=tuple(range(spec.num_layers)), heads=heads, kv_heads=kv, ffn=ffn,
                                     embedding=c == 0, head=c == 0), store,
                                {n: r["block"] for n, r in record.items() if r.get("kind") in ("int8", "int4")}))
    schedules = [tp_schedule(spec, chips, gs.name, gs.lanes, gs.tokens) for gs in logical if gs.type != HEAD]
    return builds, schedules, 0


class _Named:
    def __init__(self, name: str):
        self.name = name


def _name(gs, part: str) -> str:
    return f"{gs.name}.{part}"


def tp_schedule(spec: ModelSpec, chips: int, graph: str, lanes: int, tokens: int) -> Schedule:
    """embed on chip 0, broadcast; per layer attn and mlp on every chip, each followed by an all-reduce
    (the last one a reduce to chip 0); final on chip 0."""
    everyone = tuple(range(chips))
    rows = (lanes, tokens, spec.hidden_size)
    gs = _Named(graph)
    segments = [Segment(((0, _name(gs, "embed")),))]
    collectives = [Collective("broadcast", "hidden_out", "residual_in", (0,), everyone, rows, "float32", chips)]
    for i in range(spec.num_layers):
        for part in ("attn", "mlp"):
            segments.append(Segment(tuple((c, _name(gs, f"layers.{i}.{part}")) for c in everyone)))
            last = i == spec.num_layers - 1 and part == "mlp"
            collectives.append(Collective("reduce" if last else "all_reduce", "partial_out", "branch_in", everyone,
                                          (0,) if last else everyone, rows, "float32", chips))
    segments.append(Segment(((0, _name(gs, "final")),)))
    return Schedule(graph, tuple(segments), tuple(collectives))


def _segments(nspec: ModelSpec, spec: ModelSpec, gs: GraphSpec, store, rope, options, lengths: tuple[int, ...],
              context: int, chip: int):
    """(signature, model) of every segment graph chip `chip` runs for body graph `gs`. `lengths`: every
    layer's KV rows (the context, or a sliding-window layer's ring)."""
    L, S, H = gs.lanes, gs.tokens, spec.hidden_size
    x3 = lambda name: TensorSpec(name, (L, S, H), "float32")  # noqa: E731
    post_attn, pre_mlp, post_mlp, act = _LAYER[spec.family]

    def graph(part, inputs, outputs, body):
        return segment_graph(GraphSpec(_name(gs, part), gs.type, L, S, tuple(inputs), tuple(outputs)), store, options, body)

    def branch(g, post_norm, scope):  # the reduced partial, through the norm Gemma 3 puts after a block
        return "branch_in" if post_norm is None else layers.rmsnorm(
            g, "branch_in", f"model.layers.{scope}.{post_norm}.weight", spec.rms_norm_eps, f"/model/layers.{scope}/{post_norm}")

    if chip == 0:
        yield graph("embed", [TensorSpec("input_ids", (L, S), "int64")], [x3("hidden_out")],
                    lambda g: {"hidden_out": decoder.embed(g, spec, "input_ids")})
    for i in range(spec.num_layers):
        pk, pv, nk, nv = kv_names(i)
        kv_shape = (L, nspec.num_kv_heads, lengths[i], spec.head_dim)               # a ring is shorter
        kv_in = [TensorSpec(pk, kv_shape, "float32"), TensorSpec(pv, kv_shape, "float32")]
        kv_out = [TensorSpec(nk, kv_shape, "float32"), TensorSpec(nv, kv_shape, "float32")]

        def attn(g, i=i):
            ctx = chip_kv.attention_inputs(g, nspec, gs, rope, (i,), lengths, context)
            stream = layers.Stream("residual_in", branch(g, post_mlp, i - 1) if i else None)
            n, stream = layers.add_norm(g, stream, f"model.layers.{i}.input_layernorm.weight", spec.rms_norm_eps,
                                        f"/model/layers.{i}/input_layernorm")
            return {"partial_out": layers.self_attention(g, nspec, i, n, ctx), "residual_out": stream.x}

        def mlp(g, i=i):
            stream = layers.Stream("residual_in", branch(g, post_attn, i))
            m, stream = layers.add_norm(g, stream, f"model.layers.{i}.{pre_mlp}.weight", spec.rms_norm_eps,
                                        f"/model/layers.{i}/{pre_mlp}")
            return {"partial_out": layers.gated_mlp(g, m, f"model.layers.{i}.mlp", act, f"/model/layers.{i}/mlp"),
                    "residual_out": stream.x}

        yield graph(f"layers.{i}.attn", [x3("residual_in")] + ([x3("branch_in")] if i else []) + chip_kv.host_inputs(gs, (i,), lengths, context) + kv_in,
                    [x3("partial_out"), x3("residual_out")] + kv_out, attn)
        yield graph(f"layers.{i}.mlp", [x3("residual_in"), x3("branch_in")], [x3("partial_out"), x3("residual_out")], mlp)
    if chip == 0:
        last = spec.num_layers - 1

        def final(g):
            stream = layers.Stream("residual_in", branch(g, post_mlp, last))
            if gs.type == PREFILL:  # only the last real token goes on
                gather = lambda v, n: g.op("Gather", [v, "last_index"], name=f"/model/last_token/{n}", axis=1)  # noqa: E731
                stream = layers.Stream(gather(stream.x, "GatherX"), gather(stream.pending, "GatherBranch"))
            x, _ = layers.add_norm(g, stream, "model.norm.weight", spec.rms_norm_eps, "/model/norm")
            return {"hidden": g.op("Reshape", [x, g.const([L, H])], name="/model/flatten/Reshape")}

        yield graph("final", [x3("residual_in"), x3("branch_in")] + ([TensorSpec("last_index", (1,), "int64")] if gs.type == PREFILL else []),
                    [TensorSpec("hidden", (L, H), "float32")], final)
