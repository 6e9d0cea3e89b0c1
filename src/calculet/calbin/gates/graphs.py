"""Gate E, graphs: every .onnx loads, passes the ONNX checker and strict shape inference, points its
external weights into weights.bin where the manifest says, and (for a portable target) uses only
standard ONNX ops. Weights are never loaded: graphs are read with load_external_data=False and
checked through `ops.checker_copy`.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from calculet.calbin.gates import ops
from calculet.calbin.gates.context import GateContext, inside
from calculet.calbin.graphspec import GraphSpec
from calculet.calbin.manifest import WeightTensor
from calculet.calbin.validate_report import Check, Rule, Severity

LOAD = Rule("E.load", "every graph file parses as an ONNX model")
CHECKER = Rule("E.checker", "the ONNX checker passes (ONNX Runtime-only ops are left to ONNX Runtime)")
SHAPE_INFERENCE = Rule("E.shape_inference", "strict ONNX shape inference passes with no type or shape conflict")
EXTERNAL_DATA = Rule("E.external_data", "every external initializer lies inside weights.bin where the manifest's tensor table says")
OP_INVENTORY = Rule("E.op_inventory", "op inventory per graph (information)", Severity.INFO)
PORTABLE_OPS = Rule("E.portable_ops", "a portable-target calbin uses standard ONNX ops only")
RULES = (LOAD, CHECKER, SHAPE_INFERENCE, EXTERNAL_DATA, OP_INVENTORY, PORTABLE_OPS)


def run(ctx: GateContext) -> list[Check]:
    if ctx.manifest.partition is not None:
        return [rule.skip("not run: a partitioned calbin's graphs are its chips' (gate P runs this gate on each)")
                for rule in RULES]
    graphs = ctx.manifest.graphs
    load, checker, inference, external = [], [], [], []
    inventories: dict[str, ops.OpInventory] = {}
    tensors = {t.name: t for t in ctx.manifest.weights.tensors}
    for g in graphs:
        name, rel = g.name, g.file
        model = ctx.onnx_model(rel)
        if model is None:
            load.append(ctx.onnx_error(rel))
            continue
        checkable = ops.checker_copy(model)
        try:
            onnx.checker.check_model(checkable)
        except onnx.checker.ValidationError as exc:
            checker.append(f"graph {name!r}: {_first_line(exc)}")
        inferred = None
        try:
            inferred = ops.infer(checkable)
        except Exception as exc:  # onnx raises InferenceError and others; all mean the same here
            inference.append(f"graph {name!r}: {_first_line(exc)}")
        external += _external_problems(ctx, g, model, tensors)
        inventories[name] = ops.op_inventory(model, name, ops.known_shapes(model, inferred))
    n = len(graphs)
    return [
        LOAD.check(load, f"{n} graphs load"),
        CHECKER.check(checker, f"{n - len(load)} graphs pass the ONNX checker"),
        SHAPE_INFERENCE.check(inference, f"{n - len(load)} graphs pass strict shape inference"),
        EXTERNAL_DATA.check(external, "external initializers match weights.bin and the tensor table"),
        _inventory(inventories),
        _portable(ctx.manifest.target, inventories),
    ]


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return " ".join(lines[:2])[:300] if lines else type(exc).__name__


def _external_problems(ctx: GateContext, g: GraphSpec, model, tensors: dict[str, WeightTensor]) -> list[str]:
    name = g.name
    graph_dir = Path(g.file).parent
    weights_rel = ctx.manifest.weights.file
    problems = []
    sizes: dict[str, int] = {}
    for t in model.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        location = (graph_dir / info.get("location", "")).as_posix()
        if not inside(ctx.folder, location):
            problems.append(f"graph {name!r}: {t.name} points outside the calbin ({info.get('location')!r})")
            continue
        if location != weights_rel:
            problems.append(f"graph {name!r}: {t.name} lives in {location!r}, not the shared weights file {weights_rel!r}")
        if location not in sizes:
            path = ctx.folder / location
            sizes[location] = path.stat().st_size if path.is_file() else -1
        try:
            offset, length = int(info.get("offset", 0)), int(info["length"])
        except (KeyError, ValueError):
            problems.append(f"graph {name!r}: {t.name} has no integer external offset/length ({info})")
            continue
        if sizes[location] < 0:
            problems.append(f"graph {name!r}: {t.name} points into {location!r}, which does not exist")
        elif offset + length > sizes[location]:
            problems.append(f"graph {name!r}: {t.name} [{offset}, {offset + length}) ends past {location} ({sizes[location]} bytes)")
        entry = tensors.get(t.name)
        if entry is None:
            problems.append(f"graph {name!r}: initializer {t.name!r} is not in the manifest's weights.tensors")
            continue
        dtype = helper.tensor_dtype_to_np_dtype(t.data_type).name
        if (offset, length, dtype, list(t.dims)) != (entry.offset, entry.nbytes, entry.dtype, list(entry.shape)):
            problems.append(f"graph {name!r}: {t.name} is {dtype}{list(t.dims)} at [{offset}, +{length}); the tensor table says "
                            f"{entry.dtype}{list(entry.shape)} at [{entry.offset}, +{entry.nbytes})")
    return problems


def _inventory(inventories: dict[str, ops.OpInventory]) -> Check:
    nodes = sum(inv.nodes for inv in inventories.values())
    types = {(o.domain, o.op_type) for inv in inventories.values() for o in inv.ops}
    nonstandard: dict[str, int] = {}
    for inv in inventories.values():
        for o in inv.nonstandard:
            key = f"{o.domain}.{o.op_type}"
            nonstandard[key] = nonstandard.get(key, 0) + o.count
    message = f"{len(inventories)} graphs, {nodes} nodes, {len(types)} op types"
    if nonstandard:
        message += "; ONNX Runtime-only: " + ", ".join(f"{k} x{n}" for k, n in nonstandard.items())
    return OP_INVENTORY.check([], message, {"graphs": {n: inv.to_json() for n, inv in inventories.items()}})


def _portable(target, inventories: dict[str, ops.OpInventory]) -> Check:
    found = sorted({f"{o.domain}.{o.op_type}" for inv in inventories.values() for o in inv.nonstandard})
    if target != "portable":
        return PORTABLE_OPS.check([], f"not a portable target ({target!r}): ONNX Runtime ops allowed", {"nonstandard_ops": found})
    problems = [f"graph {inv.graph!r}: {o.domain}.{o.op_type} x{o.count} is not a standard ONNX op"
                for inv in inventories.values() for o in inv.nonstandard]
    return PORTABLE_OPS.check(problems, "standard ONNX ops only", {"nonstandard_ops": found})
