"""`compile --chips N --partition pp|tp`: one sub-calbin per chip and the manifest's partition section.

    pp   chip c holds a contiguous range of layers (ranges differ by at most one layer, the earlier
         chips taking the extra ones); chip 0 also embeds the tokens, the last chip also holds the
         final norm and the head graphs. Each body graph becomes one stage graph per chip; the
         residual stream [L, S, H] is sent from chip c to chip c + 1 between them.
    tp   compiler/tensor_parallel.py: heads and FFN columns split, partial outputs all-reduced.

A chip's weights are exactly the tensors its graphs read: each graph is built against the whole
model's weight store, then `WeightStore.subset` keeps what the chip's graphs name and `relocate`
points their external data at the chip's own weights.bin. A tensor two chips need (only a tied,
quantized embedding whose codes serve the lookup on chip 0 and the lm_head on the last chip) is
stored on both and listed in `partition.replicated`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from calculet.calbin.graphspec import HEAD, GraphSpec
from calculet.calbin.manifest import (SCHEMA_VERSION, KVLayout, Manifest, Quantization, WeightsInfo, WeightTensor,
                                      write_manifest)
from calculet.calbin.partition import ChipPart, Collective, Partition, Schedule, Segment
from calculet.compiler import graphs as G
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


@dataclass
class ChipBuild:
    """One chip's graphs (built, not yet relocated) and signatures; `write_chip` stores them."""
    index: int
    signatures: list[GraphSpec]
    models: list
    kv: KVLayout
    part: dict                       # ChipPart fields but the byte counts
    weights: WeightStore | None = None   # the store its graphs were built against (None: the whole model's)


def build_pp(spec: ModelSpec, logical: list[GraphSpec], weights: WeightStore, rope: dict, options,
             context: int, lanes: int) -> tuple[list[ChipBuild], list[Schedule], int]:
    """Pipeline stages: (chip builds, one schedule per body graph, head chip)."""
    ranges = pp_layer_ranges(spec.num_layers, options.chips)
    last = options.chips - 1
    builds = []
    for c, layers in enumerate(ranges):
        stage = G.Stage(layers, first=c == 0, last=c == last)
        sigs, models = [], []
        for gs in logical:
            if gs.type == HEAD:
                if c != last:
                    continue
                sig = gs
                model = G.build_graph(spec, gs, weights, rope, options.target, options.fusions)
            else:
                sig = G.stage_signature(spec, gs, context, stage)
                model = G.build_graph(spec, sig, weights, rope, options.target, options.fusions, stage=stage)
            sigs.append(sig)
            models.append(model)
        kv = KVLayout("BNSH", "float32", len(layers), lanes, spec.num_kv_heads, context, spec.head_dim, True)
        builds.append(ChipBuild(c, sigs, models, kv, dict(layers=layers, heads=(0, spec.num_heads),
                                                          kv_heads=(0, spec.num_kv_heads),
                                                          ffn=(0, spec.intermediate_size),
                                                          embedding=c == 0, head=c == last)))
    schedules = []
    for gs in logical:
        if gs.type == HEAD:
            continue
        hidden = (gs.lanes, gs.tokens, spec.hidden_size)
        schedules.append(Schedule(gs.name, tuple(Segment(((c, gs.name),)) for c in range(options.chips)),
                                  tuple(Collective("send", "hidden_out", "hidden_in", (c,), (c + 1,), hidden, "float32",
                                                   options.chips) for c in range(last))))
    return builds, schedules, last


def write_chip(folder: Path, build: ChipBuild, weights: WeightStore, base: Manifest, file_table) -> tuple[ChipPart, WeightStore]:
    """Write chips/<c>/: its share of the weights, its graphs (relocated onto them) and its manifest."""
    rel = chip_folder(build.index)
    out = folder / rel
    (out / "graphs").mkdir(parents=True)
    names = sorted({n for m in build.models for n in used_weights(m)})
    store = weights.subset(names)
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
        memory_plan=memory, golden=None, toolchain=base.toolchain, files=file_table(out), passes=base.passes)
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
