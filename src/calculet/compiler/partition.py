"""`compile --chips N --partition pp|tp|ep`: one sub-calbin per chip and the manifest's partition section.

    pp   chip c holds a contiguous range of layers (ranges differ by at most one layer, the earlier
         chips taking the extra ones); chip 0 also embeds the tokens, the last chip also holds the
         final norm and the head graphs. Each body graph becomes one stage graph per chip; the
         residual stream [L, S, H] is sent from chip c to chip c + 1 between them.
    tp   compiler/tensor_parallel.py: heads and FFN columns split, partial outputs all-reduced.
    ep   compiler/expert_parallel.py: a MoE model's routed experts split, partial outputs all-reduced.

Every scheme keeps KV rings on the sliding-window layers as a one-chip calbin does; a chip's KV
layout (its layers, KV heads and buffer lengths) comes from compiler/chip_kv.py, which `plan` reads too.

A chip's weights are exactly the tensors its graphs read: each graph is built against the whole
model's weight store, then `WeightStore.subset` keeps what the chip's graphs name and `relocate`
points their external data at the chip's own weights.bin. A tensor two chips need (only a tied,
quantized embedding whose codes serve the lookup on chip 0 and the lm_head on the last chip) is
stored on both and listed in `partition.replicated`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from calculet.calbin.graphspec import HEAD, GraphSpec
from calculet.calbin.manifest import (SCHEMA_VERSION, KVLayout, Manifest, Quantization, WeightsInfo, WeightTensor,
                                      write_manifest)
from calculet.calbin.partition import ChipPart, Collective, Partition, Schedule, Segment
from calculet.compiler import graphs as G
from calculet.compiler.builder import GraphBuilder
from calculet.compiler.memory_plan import build_memory_plan
from calculet.compiler.weights import WEIGHTS_FILE, WeightStore, relocate, used_weights
from calculet.errors import RequestError
from calculet.models.base import ModelSpec


def chip_folder(index: int) -> str:
    return f"chips/{index}"


def pp_layer_ranges(num_layers: int, chips: int) -> list[tuple[int, ...]]:
    """Contiguous layer ranges, sizes differing by at most one (earlier chips take the extra layers)."""
    if chips > num_layers:
        raise RequestError("bad_option", f"--partition pp --chips {chips}: the model has only {num_layers} layers; "
                                         f"use --chips 2..{num_layers}")
    base, extra = divmod(num_layers, chips)
    ranges, start = [], 0
    for c in range(chips):
        n = base + (1 if c < extra else 0)
        ranges.append(tuple(range(start, start + n)))
        start += n
    return ranges


def pp_schedule(spec: ModelSpec, chips: int, graph: str, lanes: int, tokens: int) -> Schedule:
    """Stage after stage; the residual stream [L, S, H] sent from each chip to the next."""
    hidden = (lanes, tokens, spec.hidden_size)
    return Schedule(graph, tuple(Segment(((c, graph),)) for c in range(chips)),
                    tuple(Collective("send", "hidden_out", "hidden_in", (c,), (c + 1,), hidden, "float32", chips)
                          for c in range(chips - 1)))


def schedule_for(spec: ModelSpec, scheme: str, chips: int, graph: str, lanes: int, tokens: int) -> Schedule:
    """The schedule compile writes for a body graph of `lanes` x `tokens` (the planner prices it)."""
    if scheme == "pp":
        return pp_schedule(spec, chips, graph, lanes, tokens)
    if scheme == "ep":
        from calculet.compiler import expert_parallel
        return expert_parallel.ep_schedule(spec, chips, graph, lanes, tokens)
    from calculet.compiler import tensor_parallel
    return tensor_parallel.tp_schedule(spec, chips, graph, lanes, tokens)


def check_partition(spec: ModelSpec, scheme: str, chips: int) -> None:
    """A clear error when the model cannot be split this way over `chips` chips."""
    if scheme == "pp":
        pp_layer_ranges(spec.num_layers, chips)
    elif scheme == "tp":
        from calculet.compiler import tensor_parallel
        tensor_parallel.check_tp(spec, chips)
    elif scheme == "ep":
        from calculet.compiler import expert_parallel
        expert_parallel.check_ep(spec, chips)


def chip_specs(spec: ModelSpec, scheme: str, chips: int) -> list[ModelSpec]:
    """The model description each chip's weights follow: the whole spec (pp), a narrow one (tp), or
    one with the chip's share of the experts (ep)."""
    if scheme == "pp":
        return [spec] * chips
    if scheme == "ep":
        from calculet.compiler import expert_parallel
        expert_parallel.check_ep(spec, chips)
        return [expert_parallel.chip_spec(spec, chips)] * chips
    from calculet.compiler import tensor_parallel
    return [tensor_parallel.narrow_spec(spec, *tensor_parallel.chip_slices(spec, chips, c)) for c in range(chips)]


def planned_chip_weights(spec: ModelSpec, options, blocks: dict[str, int] | None = None) -> list[list[tuple[str, int]]]:
    """Per chip, the (name, bytes) arrays compile stores in its weights.bin, in order, from the model
    description alone (compiler/weight_plan.py's list and byte formula, placed by `holds`).
    `calculet plan --chips` sums it; compile checks each chip's store against it, passing `blocks`:
    the block the encoder chose per quantized tensor (a finer one than the policy's where the values
    already sit on a GGUF grid, `quantize.quantize_best_block`), which the description alone cannot know."""
    from calculet.compiler.weight_plan import weight_plan

    blocks = blocks or {}

    def stored_arrays(tensors) -> list[tuple[str, int]]:
        return [x for t in tensors for x in t.stored(blocks.get(t.name) if t.fmt.kind in ("int8", "int4") else None)]

    chips = options.chips
    if options.partition == "pp":
        layers = pp_layer_ranges(spec.num_layers, chips)
    elif options.partition == "ep":
        from calculet.compiler.expert_parallel import check_ep, chip_layers
        check_ep(spec, chips)
        layers = [chip_layers(spec, c) for c in range(chips)]
    else:
        layers = [tuple(range(spec.num_layers))] * chips
    head_chip = chips - 1 if options.partition == "pp" else 0
    out = []
    ep = options.partition == "ep"
    whole = stored_arrays(weight_plan(spec, options).tensors) if ep else []
    for c, cspec in enumerate(chip_specs(spec, options.partition, chips)):
        stored = stored_arrays(weight_plan(cspec, options).tensors)
        if ep:   # the expert stacks' bytes from the chip's share of the experts; everything else (the router) whole
            stacks = _ep_stacks(spec)
            assert [n for n, _ in stored] == [n for n, _ in whole], "the ep chip spec changed the weight list"
            stored = [(n, b if n in stacks else wb) for (n, b), (_, wb) in zip(stored, whole)]
        names = [n for n, _ in stored]
        tied_head = spec.tie_word_embeddings and not any(n.startswith("lm_head.weight") for n in names)
        only_head = _head_only(spec, options.partition)
        out.append([(n, b) for n, b in stored
                    if holds(n, set(layers[c]), c == 0, c == head_chip, tied_head) and (c == head_chip or n not in only_head)
                    and not (ep and c != 0 and _shared_only(n))])
    return out


def _shared_only(name: str) -> bool:
    from calculet.compiler import expert_parallel
    return expert_parallel.shared_only(name)


def _ep_stacks(spec: ModelSpec) -> set[str]:
    from calculet.compiler import expert_parallel
    return {f"{n}{suffix}" for n in expert_parallel.stack_names(spec) for suffix in ("", ".qcodes", ".qscales")}


def _head_only(spec: ModelSpec, scheme: str) -> set[str]:
    """tp: the norm Gemma 3 applies after the last MLP runs in the final segment, on the head chip only."""
    if scheme != "tp":
        return set()
    from calculet.compiler import tensor_parallel
    post_mlp = tensor_parallel.post_mlp_norm(spec)
    return {f"model.layers.{spec.num_layers - 1}.{post_mlp}.weight"} if post_mlp else set()


def holds(name: str, layers: set[int], embeds: bool, head: bool, tied_head: bool) -> bool:
    """Whether a chip stores the array `name`: its layers' tensors, rope tables everywhere, the
    embedding where the tokens are embedded (and on the head chip when the lm_head reads it), the
    final norm and lm_head arrays on the head chip."""
    if name.startswith("model.layers."):
        return int(name.split(".")[2]) in layers
    if name.startswith("rope."):
        return True
    if name.startswith("model.embed_tokens."):
        return embeds or (head and tied_head)
    if name.startswith(("lm_head.", "model.norm.")):
        return head
    return True


def weights_file_bytes(arrays: list[tuple[str, int]]) -> int:
    """Size of a weights.bin holding `arrays` in order, each 64-byte aligned (WeightStore's layout)."""
    from calculet.compiler.weights import ALIGN

    size = 0
    for _, nbytes in arrays:
        size = -(-size // ALIGN) * ALIGN + nbytes
    return size


@dataclass
class ChipBuild:
    """One chip's graphs (built, not yet relocated) and signatures; `write_chip` stores them."""
    index: int
    signatures: list[GraphSpec]
    models: list
    kv: KVLayout
    part: dict                       # ChipPart fields but the byte counts
    weights: WeightStore | None = None   # the store its graphs were built against (None: the whole model's)
    blocks: dict[str, int] | None = None  # its own store's encoder-chosen blocks (None: the whole model's)


def segment_graph(sig: GraphSpec, store: WeightStore, options, body) -> tuple[GraphSpec, onnx.ModelProto]:
    """A segment graph of signature `sig`: its inputs declared, `body(g)` builds it and returns
    {output name: value} for outputs whose value has another name."""
    g = GraphBuilder(sig.name, store, options.target, options.fusions)
    for t in sig.inputs:
        g.input(t.name, np.dtype(t.dtype), t.shape)
    values = body(g)
    for t in sig.outputs:
        g.output(values.get(t.name, t.name), t.name, np.dtype(t.dtype), t.shape)
    return sig, g.build()


def chip_graphs(logical, head_chip: bool, build_head, segments) -> tuple[list, list]:
    """(signatures, ONNX models) of one chip: each head graph where `head_chip`, built by
    `build_head(gs)`; every other logical graph as what `segments(gs)` yields, (signature, model) pairs."""
    sigs, models = [], []
    for gs in logical:
        pairs = ([(gs, build_head(gs))] if head_chip else []) if gs.type == HEAD else segments(gs)
        for sig, model in pairs:
            sigs.append(sig)
            models.append(model)
    return sigs, models


def build_pp(spec: ModelSpec, logical: list[GraphSpec], weights: WeightStore, rope: dict, options,
             context: int, lanes: int) -> tuple[list[ChipBuild], list[Schedule], int]:
    """Pipeline stages: (chip builds, one schedule per body graph, head chip)."""
    from calculet.compiler.chip_kv import chip_kv_layout
    from calculet.compiler.kv_layout import layer_lengths

    ranges = pp_layer_ranges(spec.num_layers, options.chips)
    last = options.chips - 1
    chunks = tuple(options.prefill_chunks)
    lengths = layer_lengths(spec, context, chunks, options.kv_rings)   # rings on the sliding-window layers
    builds = []
    for c, layers in enumerate(ranges):
        stage = G.Stage(layers, first=c == 0, last=c == last, context=context)
        def stage_graph(gs):
            sig = G.stage_signature(spec, gs, lengths, stage)
            return [(sig, G.build_graph(spec, sig, weights, rope, options.target, options.fusions, stage=stage))]
        sigs, models = chip_graphs(logical, c == last,
                                   lambda gs: G.build_graph(spec, gs, weights, rope, options.target, options.fusions),
                                   stage_graph)
        kv = chip_kv_layout(spec, "pp", options.chips, c, lanes, context, chunks, options.kv_rings)
        builds.append(ChipBuild(c, sigs, models, kv, dict(layers=layers, heads=(0, spec.num_heads),
                                                          kv_heads=(0, spec.num_kv_heads),
                                                          ffn=(0, spec.intermediate_size),
                                                          embedding=c == 0, head=c == last)))
    schedules = [pp_schedule(spec, options.chips, gs.name, gs.lanes, gs.tokens) for gs in logical if gs.type != HEAD]
    return builds, schedules, last


def write_chip(folder: Path, build: ChipBuild, weights: WeightStore, base: Manifest, file_table,
               planned: list[tuple[str, int]] | None = None) -> tuple[ChipPart, WeightStore]:
    """Write chips/<c>/: its share of the weights, its graphs (relocated onto them) and its manifest."""
    rel = chip_folder(build.index)
    out = folder / rel
    (out / "graphs").mkdir(parents=True)
    names = sorted({n for m in build.models for n in used_weights(m)})
    store = weights.subset(names)
    if planned is not None and [(e.name, e.nbytes) for e in store.entries if e.name in store] != planned:
        have = [(e.name, e.nbytes) for e in store.entries if e.name in store]
        raise AssertionError(f"chip {build.index}: compiler/partition.planned_chip_weights disagrees with the "
                             f"tensors its graphs read: planned only {[x for x in planned if x not in have][:3]}, "
                             f"stored only {[x for x in have if x not in planned][:3]}")
    store.write(out / "graphs" / WEIGHTS_FILE)
    for sig, model in zip(build.signatures, build.models):
        relocate(model, store)
        onnx.save_model(model, str(out / sig.file))
    held = {e.name for e in store.entries}
    tensors = {n: f for n, f in base.quantization.tensors.items()
               if n in held or f"{n}.qcodes" in held}
    memory = build_memory_plan(base.spec, build.kv, store.nbytes, build.signatures)
    manifest = Manifest(
        schema_version=SCHEMA_VERSION, target=base.target, model=base.model, tokenizer=base.tokenizer,
        profile=base.profile, graphs=tuple(build.signatures), kv=build.kv,
        weights=WeightsInfo(f"graphs/{WEIGHTS_FILE}", store.nbytes, base.weights.layout,
                            tuple(WeightTensor(e.name, e.dtype, tuple(e.shape), e.offset, e.nbytes) for e in store.entries)),
        quantization=Quantization(base.quantization.policy, base.quantization.table, tensors, base.quantization.overrides),
        memory_plan=memory, golden=None, toolchain=base.toolchain, files=file_table(out), passes=base.passes,
        isa=base.isa)
    write_manifest(manifest, out)
    part = ChipPart(build.index, rel, weights_bytes=store.nbytes, memory_bytes=memory.total_bytes, **build.part)
    return part, store


def placement(stores: list[WeightStore]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(replicated, sharded): names on several chips with the same bytes, and with different bytes
    (a tensor-parallel slice of one weight under its one name)."""
    import numpy as np

    seen: dict[str, list] = {}
    for store in stores:
        for e in store.entries:
            seen.setdefault(e.name, []).append(store.array(e.name) if e.name in store else None)
    replicated, sharded = [], []
    for name, arrays in sorted(seen.items()):
        if len(arrays) < 2:
            continue
        same = all(a is not None and b is not None and a.shape == b.shape and np.array_equal(a, b)
                   for a, b in zip(arrays, arrays[1:]))
        (replicated if same or arrays[0] is None else sharded).append(name)
    return tuple(replicated), tuple(sharded)


def note(scheme: str, chips: int) -> str:
    if scheme == "ep":
        return (f"expert parallel over {chips} chips: chip c holds routed experts [c E/{chips}, (c+1) E/{chips}) of "
                f"every sparse layer; router, attention (whole, KV on every chip) and dense MLPs replicated; the "
                f"shared expert, embedding, final norm and head graphs on chip 0; the chips' expert outputs all-reduced")
    if scheme == "pp":
        return (f"pipeline over {chips} chips: contiguous layer ranges; chip 0 embeds, chip {chips - 1} holds the "
                f"final norm and the head graphs; the residual stream is sent chip to chip")
    return (f"tensor parallel over {chips} chips: query/KV heads and FFN columns split (KV heads replicated when "
            f"fewer than the chips); o_proj and down_proj partial outputs all-reduced; chip 0 embeds (broadcast) "
            f"and holds the final norm and the head graphs")


def assemble(scheme: str, parts: list[ChipPart], schedules: list[Schedule], head_chip: int,
             stores: list[WeightStore]) -> Partition:
    replicated, sharded = placement(stores)
    return Partition(scheme, tuple(parts), head_chip, tuple(schedules), replicated, note(scheme, len(parts)), sharded)
