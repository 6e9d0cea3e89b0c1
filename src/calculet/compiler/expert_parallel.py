"""`--partition ep`: the routed experts of a mixture-of-experts model distributed over P chips.

Chip c holds experts [c E/P, (c+1) E/P) of every sparse layer (its rows of the two expert stacks,
under the stacks' names: `partition.sharded`). Everything else is replicated or on chip 0:

    router              every chip (tiny, fp32): each computes the same global top-k routing
    attention, KV       every chip, whole (replicated attention: the simplest correct choice; KV
                        memory is the 1-chip calbin's on every chip, not split), but for dense
                        layers after the last sparse one, which only chip 0 holds
    dense-MLP layers    every chip, whole (qwen3_moe's mlp_only_layers, qwen2_moe's first layer)
    shared expert       chip 0 only, added to chip 0's partial (qwen2_moe)
    embedding, head     chip 0 (the head chip)

Each chip's MoE block mixes its local experts with its columns of the global routing weights
(compiler/moe.py `local_experts`: exact, not renormalised over the local experts), so the layer's
output is the sum of the chips' partial outputs: an all-reduce, the host form of the all-to-all
token exchange (every token's hidden goes to every chip and the weighted results come back).

A body graph runs as segments, each ending at a sparse layer (dense layers ride along with the
next sparse one; dense layers after the last sparse one run in chip 0's final graph):

    embed       chip 0: input_ids -> hidden_out [L, S, H]                              ─ broadcast ─▶ residual_in
    layers.a-b  x = residual_in (+ branch_in: the previous block's reduced experts)
                layers a..b-1 whole; layer b's attention whole and its local experts
                partial_out = local experts (+ shared expert on chip 0)  residual_out   ─ all_reduce ─▶ branch_in
                (the last block's partials are reduced to chip 0 only)
    final       chip 0: x = residual_in + branch_in -> trailing dense layers -> (gather last_index) -> norm -> hidden
"""

from __future__ import annotations

from dataclasses import replace

from calculet.calbin.graphspec import HEAD, PREFILL, GraphSpec, TensorSpec, kv_names
from calculet.calbin.partition import Collective, Schedule, Segment
from calculet.compiler import chip_kv, decoder, graphs as G, layers, moe
from calculet.compiler.kv_layout import layer_lengths
from calculet.compiler.partition import ChipBuild, chip_graphs, segment_graph
from calculet.errors import RequestError
from calculet.models.base import ModelSpec

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe")


def check_ep(spec: ModelSpec, chips: int) -> None:
    if spec.moe is None or spec.family not in FAMILIES:
        raise RequestError("bad_option", f"--partition ep distributes the routed experts of the mixture-of-experts "
                                         f"families {', '.join(FAMILIES)}; {spec.model_type} has none (use "
                                         f"--partition tp or pp)")
    e = spec.moe.num_experts
    if e % chips:
        allowed = [n for n in range(2, e + 1) if e % n == 0]
        raise RequestError("bad_option", f"--partition ep --chips {chips}: {e} experts do not split evenly over "
                                         f"{chips} chips; allowed --chips: {', '.join(map(str, allowed))}")


def chip_experts(spec: ModelSpec, chips: int, c: int) -> tuple[int, int]:
    """[first, end) of the routed experts chip c holds."""
    per = spec.moe.num_experts // chips
    return c * per, (c + 1) * per


def chip_spec(spec: ModelSpec, chips: int) -> ModelSpec:
    """The spec a chip's expert stacks follow (E/P experts; the router stays [H, E]: see planned_chip_weights)."""
    per = spec.moe.num_experts // chips
    return replace(spec, moe=replace(spec.moe, num_experts=per, experts_per_token=min(spec.moe.experts_per_token, per)))


def blocks(spec: ModelSpec) -> tuple[list[tuple[int, ...]], tuple[int, ...]]:
    """(layer blocks, each ending at a sparse layer; the dense layers after the last sparse one)."""
    out, pending = [], []
    for i in range(spec.num_layers):
        pending.append(i)
        if spec.moe.is_sparse(i):
            out.append(tuple(pending))
            pending = []
    return out, tuple(pending)


def chip_layers(spec: ModelSpec, c: int) -> tuple[int, ...]:
    """The layers whose weights and KV chip c holds: all on chip 0; the others stop at the last sparse layer."""
    _, tail = blocks(spec)
    return tuple(i for i in range(spec.num_layers) if c == 0 or i not in tail)


def block_name(block: tuple[int, ...]) -> str:
    return f"layers.{block[0]}" if len(block) == 1 else f"layers.{block[0]}-{block[-1]}"


def stack_names(spec: ModelSpec) -> list[str]:
    """The stacked expert tensors each chip holds a slice of."""
    return [n for i in spec.moe.sparse_layers for n in moe.weight_names(i)[1:]]


def shared_only(name: str) -> bool:
    """Arrays only chip 0 holds: the shared expert and its gate."""
    return ".mlp.shared_expert" in name


def ep_schedule(spec: ModelSpec, chips: int, graph: str, lanes: int, tokens: int) -> Schedule:
    everyone = tuple(range(chips))
    rows = (lanes, tokens, spec.hidden_size)
    groups, _ = blocks(spec)
    segments = [Segment(((0, f"{graph}.embed"),))]
    collectives = [Collective("broadcast", "hidden_out", "residual_in", (0,), everyone, rows, "float32", chips)]
    for k, block in enumerate(groups):
        segments.append(Segment(tuple((c, f"{graph}.{block_name(block)}") for c in everyone)))
        last = k == len(groups) - 1
        collectives.append(Collective("reduce" if last else "all_reduce", "partial_out", "branch_in", everyone,
                                      (0,) if last else everyone, rows, "float32", chips))
    segments.append(Segment(((0, f"{graph}.final"),)))
    return Schedule(graph, tuple(segments), tuple(collectives))


def build_ep(spec: ModelSpec, logical: list[GraphSpec], weights, rope, options, context: int, lanes: int):
    """(chip builds, one schedule per body graph, head chip 0)."""
    chips = options.chips
    check_ep(spec, chips)
    lengths = layer_lengths(spec, context, tuple(options.prefill_chunks), options.kv_rings)
    builds = []
    for c in range(chips):
        experts = chip_experts(spec, chips, c)
        store = weights.slice_rows({n: experts for n in stack_names(spec)})
        sigs, models = chip_graphs(
            logical, c == 0, lambda gs: G.build_graph(spec, gs, store, rope, options.target, options.fusions),
            lambda gs: _segments(spec, gs, store, rope, options, lengths, context, c, experts))
        held = chip_layers(spec, c)
        kv = chip_kv.chip_kv_layout(spec, "ep", chips, c, lanes, context, tuple(options.prefill_chunks),
                                    options.kv_rings)   # attention replicated; rings on the sliding-window layers
        builds.append(ChipBuild(c, sigs, models, kv,
                                dict(layers=held, heads=(0, spec.num_heads),
                                     kv_heads=(0, spec.num_kv_heads), ffn=(0, spec.intermediate_size),
                                     embedding=c == 0, head=c == 0, experts=experts), store))
    schedules = [ep_schedule(spec, chips, gs.name, gs.lanes, gs.tokens) for gs in logical if gs.type != HEAD]
    return builds, schedules, 0


def _layer(g, spec: ModelSpec, i: int, stream: layers.Stream, ctx: layers.AttentionInputs,
           experts: tuple[int, int], chip: int) -> layers.Stream:
    """decoder.llama_layer (every MoE family's layer) with the chip's local experts in a sparse layer."""
    def local(g, m: str, scope: str) -> str:
        return moe.local_experts(g, spec, i, m, ctx.rows, scope, experts, chip == 0)
    return decoder.llama_layer(g, spec, i, stream, ctx, sparse_mlp=local)


def _segments(spec: ModelSpec, gs: GraphSpec, store, rope, options, lengths: tuple[int, ...], context: int, chip: int,
              experts):
    """(signature, model) of every segment graph chip `chip` runs for body graph `gs`. `lengths`: every
    layer's KV rows (the context, or a sliding-window layer's ring)."""
    L, S, H = gs.lanes, gs.tokens, spec.hidden_size
    x3 = lambda name: TensorSpec(name, (L, S, H), "float32")  # noqa: E731

    def kv(block, past: bool):
        return [TensorSpec(n, (L, spec.num_kv_heads, lengths[i], spec.head_dim), "float32")
                for i in block for n in kv_names(i)[(0 if past else 2):(2 if past else 4)]]

    def graph(part, inputs, outputs, body):
        return segment_graph(GraphSpec(f"{gs.name}.{part}", gs.type, L, S, tuple(inputs), tuple(outputs)), store, options, body)

    def run(g, block, stream):
        ctx = chip_kv.attention_inputs(g, spec, gs, rope, block, lengths, context)
        for i in block:
            stream = _layer(g, spec, i, stream, ctx, experts, chip)
        return stream

    if chip == 0:
        yield graph("embed", [TensorSpec("input_ids", (L, S), "int64")], [x3("hidden_out")],
                    lambda g: {"hidden_out": decoder.embed(g, spec, "input_ids")})
    groups, tail = blocks(spec)
    for k, block in enumerate(groups):
        def body(g, block=block, k=k):
            stream = run(g, block, layers.Stream("residual_in", "branch_in" if k else None))
            return {"partial_out": stream.pending, "residual_out": stream.x}

        yield graph(block_name(block), [x3("residual_in")] + ([x3("branch_in")] if k else [])
                    + chip_kv.host_inputs(gs, block, lengths, context) + kv(block, True),
                    [x3("partial_out"), x3("residual_out")] + kv(block, False), body)
    if chip == 0:
        def final(g):
            stream = run(g, tail, layers.Stream("residual_in", "branch_in"))
            if gs.type == PREFILL:  # only the last real token goes on
                gather = lambda v, n: g.op("Gather", [v, "last_index"], name=f"/model/last_token/{n}", axis=1)  # noqa: E731
                stream = layers.Stream(gather(stream.x, "GatherX"), gather(stream.pending, "GatherBranch"))
            x, _ = layers.add_norm(g, stream, "model.norm.weight", spec.rms_norm_eps, "/model/norm")
            return {"hidden": g.op("Reshape", [x, g.const([L, H])], name="/model/flatten/Reshape")}

        prefill = gs.type == PREFILL
        inputs = [x3("residual_in"), x3("branch_in")] + (
            chip_kv.host_inputs(gs, tail, lengths, context, last_index=prefill) + kv(tail, True) if tail
            else [TensorSpec("last_index", (1,), "int64")] if prefill else [])
        yield graph("final", inputs, [TensorSpec("hidden", (L, H), "float32")] + kv(tail, False), final)
