"""Gate P, partition (calbins compiled with --chips N): each chip's sub-calbin is sound, every tensor
sits on exactly one chip or is declared replicated, the two sides of every collective agree on shape
and dtype, and each chip's memory is what its plan says (and within --chip-memory when given).

A one-chip calbin passes every rule with "not partitioned".
"""

from __future__ import annotations

from calculet.calbin.gates import files, graphs, memory, schema
from calculet.calbin.gates.context import GateContext, inside
from calculet.calbin.manifest import read_manifest_json
from calculet.calbin.partition import HOST_INPUTS
from calculet.calbin.validate_report import Check, Rule, Status

CHIPS = Rule("P.chips", "every chip's sub-calbin passes gates A (files), B (manifest), D (memory) and E (graphs)")
PLACEMENT = Rule("P.placement", "every weight is held by a chip; one held by several chips is declared replicated (same bytes) "
                                "or sharded (a slice each); ep: the chips' expert ranges tile the experts and each "
                                "chip's expert stacks hold exactly its range")
COLLECTIVES = Rule("P.collectives", "every collective's source outputs and target inputs exist with its shape and dtype; "
                                    "every chip graph input is fed")
MEMORY = Rule("P.memory", "each chip's weights and memory total equal its sub-calbin's plan (and fit --chip-memory)")
RULES = (CHIPS, PLACEMENT, COLLECTIVES, MEMORY)
_CHIP_GATES = (("A", files), ("B", schema), ("D", memory), ("E", graphs))
# Not a chip's business: its graphs are stages or segments named by the schedule (P.collectives checks
# them), and the tokenizer is the whole calbin's (gate A checks it there).
_NOT_FOR_CHIPS = {"B.graph_name_exact", "A.references"}


def run(ctx: GateContext) -> list[Check]:
    part = ctx.manifest.partition
    if part is None:
        return [rule.check([], "not partitioned") for rule in RULES]
    chip_ctx, problems = [], []
    for chip in part.chips:
        if not inside(ctx.folder, chip.folder):
            problems.append(f"chip {chip.index}: folder {chip.folder!r} leaves the calbin")
            chip_ctx.append(None)
            continue
        sub = GateContext(ctx.folder / chip.folder, read_manifest_json(ctx.folder / chip.folder), ctx.options,
                          kv_layers=tuple(chip.layers))
        for gate, module in _CHIP_GATES:
            for c in module.run(sub):
                if c.status is Status.FAIL and c.id not in _NOT_FOR_CHIPS:
                    problems.append(f"chip {chip.index}: {c.id}: {c.message}")
        files_listed = ctx_files(sub)
        problems += [f"chip {chip.index}: {what} {rel!r} is not listed in its manifest.files"
                     for what, rel in files._references(sub) if what != "tokenizer file" and rel not in files_listed]
        chip_ctx.append(sub)
    checks = [CHIPS.check(problems, f"{len(part.chips)} chip sub-calbins pass gates A, B, D and E")]
    if any(c is None or c.manifest is None for c in chip_ctx):
        return checks + [rule.skip("not run: a chip's manifest is unreadable (see P.chips)") for rule in RULES[1:]]
    manifests = [c.manifest for c in chip_ctx]
    checks.append(_placement(ctx, part, manifests))
    checks.append(_collectives(part, manifests))
    checks.append(_memory(ctx, part, manifests))
    return checks


def ctx_files(ctx: GateContext) -> set[str]:
    listed = ctx.raw.get("files")
    return set(listed) if isinstance(listed, dict) else set()


def _placement(ctx: GateContext, part, manifests) -> Check:
    holders: dict[str, list[int]] = {}
    for i, m in enumerate(manifests):
        for t in m.weights.tensors:
            holders.setdefault(t.name, []).append(i)
    problems = []
    for name in ctx.manifest.quantization.tensors:
        if not any(n in holders for n in (name, f"{name}.qcodes", f"{name}.weight")):   # .weight: lm_head.coarse8
            problems.append(f"weight {name!r} is held by no chip")
    for name, chips in sorted(holders.items()):
        if len(chips) > 1 and name not in part.replicated and name not in part.sharded:
            problems.append(f"weight {name!r} is stored on chips {chips} but declared neither replicated nor sharded")
    for name in part.replicated:
        if len(holders.get(name, ())) < 2:
            problems.append(f"weight {name!r} is declared replicated but held by chips {holders.get(name, [])}")
    for name in part.sharded:
        if len(holders.get(name, ())) < 2:
            problems.append(f"weight {name!r} is declared sharded but held by chips {holders.get(name, [])}")
    if part.scheme == "ep":
        problems += _experts(ctx.manifest.spec, part, manifests)
    return PLACEMENT.check(problems, f"{len(holders)} tensors placed; {len(part.replicated)} replicated, "
                                     f"{len(part.sharded)} sharded")


def _experts(spec, part, manifests) -> list[str]:
    """ep: chip c's [first, end) follow one another from 0 to E, and its stacks have end - first experts."""
    if spec.moe is None:
        return ["partition ep on a model without routed experts"]
    at = 0
    for chip in part.chips:
        if chip.experts is None or chip.experts[0] != at or not chip.experts[0] < chip.experts[1]:
            return [f"chip {chip.index}: experts {chip.experts} do not continue the range at expert {at}"]
        at = chip.experts[1]
    problems = [] if at == spec.moe.num_experts else [f"the chips' experts end at {at}, the model has {spec.moe.num_experts}"]
    for chip, m in zip(part.chips, manifests):
        for t in m.weights.tensors:
            if ".mlp.experts." in t.name and t.shape[0] != chip.experts[1] - chip.experts[0]:
                problems.append(f"chip {chip.index}: {t.name} holds {t.shape[0]} experts, its range "
                                f"{list(chip.experts)} says {chip.experts[1] - chip.experts[0]}")
    return problems


def _collectives(part, manifests) -> Check:
    problems, count = [], 0
    for s in part.schedules:
        for k, segment in enumerate(s.segments):
            before = s.collectives[k - 1] if k else None
            after = s.collectives[k] if k < len(s.collectives) else None
            for chip, name in segment.runs:
                g = manifests[chip].graph(name) if 0 <= chip < len(manifests) else None
                if g is None:
                    problems.append(f"{s.graph}: segment {k} runs {name!r} on chip {chip}, which has no such graph")
                    continue
                for t in g.inputs:
                    fed = (t.name in HOST_INPUTS or t.name.startswith("past_") or t.name.endswith("_in") and k > 0)
                    if not fed:
                        problems.append(f"{s.graph}: chip {chip} graph {name!r} input {t.name!r} is fed by nothing")
                    if before is not None and t.name == before.dst and chip in before.targets:
                        if (t.shape, t.dtype) != (before.shape, before.dtype):
                            problems.append(f"{s.graph}: {before.kind} into chip {chip} {name}.{t.name}: "
                                            f"{list(t.shape)} {t.dtype} vs the collective's {list(before.shape)} {before.dtype}")
                if after is not None and chip in after.sources:
                    out = g.output(after.src)
                    if out is None:
                        problems.append(f"{s.graph}: chip {chip} graph {name!r} has no output {after.src!r} for the {after.kind}")
                    elif (out.shape, out.dtype) != (after.shape, after.dtype):
                        problems.append(f"{s.graph}: {after.kind} from chip {chip} {name}.{after.src}: "
                                        f"{list(out.shape)} {out.dtype} vs the collective's {list(after.shape)} {after.dtype}")
            if before is not None:
                count += 1
                runs = {c for c, _ in segment.runs}
                missing = set(before.targets) - runs
                if missing:
                    problems.append(f"{s.graph}: the {before.kind} before segment {k} targets chips {sorted(missing)}, "
                                    f"which run nothing there")
    return COLLECTIVES.check(problems, f"{count} collectives in {len(part.schedules)} schedules agree on both sides")


def _memory(ctx: GateContext, part, manifests) -> Check:
    problems = []
    budget = ctx.options.chip_memory_bytes
    for chip, m in zip(part.chips, manifests):
        if chip.weights_bytes != m.weights.bytes:
            problems.append(f"chip {chip.index}: partition says {chip.weights_bytes} weight bytes, its manifest {m.weights.bytes}")
        if chip.memory_bytes != m.memory_plan.total_bytes:
            problems.append(f"chip {chip.index}: partition says {chip.memory_bytes} bytes, its memory plan {m.memory_plan.total_bytes}")
        if budget and m.memory_plan.total_bytes > budget:
            problems.append(f"chip {chip.index}: {m.memory_plan.total_bytes} bytes exceed --chip-memory {budget}")
    totals = ", ".join(f"chip {c.index} {m.memory_plan.total_bytes}" for c, m in zip(part.chips, manifests))
    return MEMORY.check(problems, f"bytes per chip: {totals}")
