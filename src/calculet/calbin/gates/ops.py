"""Op inventory of one ONNX graph (shared by gate E and `inspect`), and the copy the ONNX checker reads.

A node is *standard* when its domain is an ONNX domain ("" / ai.onnx / ai.onnx.ml) and ONNX defines
the op there. Everything else is ONNX Runtime specific: contrib ops in their own domain
(com.microsoft.GroupQueryAttention) and the few ops ONNX Runtime registers in the ONNX domain itself
(SimplifiedLayerNormalization). A portable calbin may hold standard ops only.

Shape families group nodes by op and input shapes, e.g. `MatMul([1,16,640], [640,2048]) x 18`: one
family per distinct shape signature, so repeated layers read as one line.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from dataclasses import dataclass

import onnx
from onnx import ModelProto, TensorProto, helper

from calculet.calbin.gates.shape_functions import graph_nodes, shape_functions, subgraphs

STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
UNCHECKED_DOMAIN = "calculet.unchecked"  # where the checker copy parks ops ONNX does not define


@dataclass(frozen=True)
class OpCount:
    domain: str        # "ai.onnx" for the default domain
    op_type: str
    count: int
    standard: bool


@dataclass(frozen=True)
class ShapeFamily:
    op: str                       # "MatMul" or "com.microsoft.GroupQueryAttention"
    inputs: tuple[str, ...]       # "[1,16,640]", "?" when unknown, "" for an omitted optional input
    count: int


@dataclass(frozen=True)
class OpInventory:
    graph: str
    nodes: int
    standard_nodes: int
    ops: tuple[OpCount, ...]              # most frequent first
    nodes_by_domain: dict[str, int]
    shape_families: tuple[ShapeFamily, ...]

    @property
    def nonstandard(self) -> list[OpCount]:
        return [o for o in self.ops if not o.standard]

    def to_json(self) -> dict:
        return {
            "graph": self.graph, "nodes": self.nodes, "standard_nodes": self.standard_nodes,
            "nonstandard_nodes": self.nodes - self.standard_nodes, "nodes_by_domain": self.nodes_by_domain,
            "ops": [{"domain": o.domain, "op_type": o.op_type, "count": o.count, "standard": o.standard} for o in self.ops],
            "shape_families": [{"op": f.op, "inputs": list(f.inputs), "count": f.count} for f in self.shape_families],
        }


def domain_name(domain: str) -> str:
    return domain or "ai.onnx"


def is_standard(domain: str, op_type: str) -> bool:
    return domain in STANDARD_DOMAINS and onnx.defs.has(op_type, domain)


def qualified(domain: str, op_type: str) -> str:
    return op_type if domain in ("", "ai.onnx") else f"{domain}.{op_type}"


def checker_copy(model: ModelProto) -> ModelProto:
    """A copy the ONNX checker and shape inference can read without the weights file.

    External initializers become graph inputs of the same type and shape (their bytes are checked
    against weights.bin by E.external_data instead), and ops ONNX does not define in its own domain
    move to a private domain the checker does not know, so it checks everything else. ONNX Runtime
    ops get model-local functions with the same output shapes (see shape_functions), so shape
    inference carries shapes through them and checks the rest of the graph too.
    """
    m = copy.deepcopy(model)
    external = [t for t in m.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    keep = [t for t in m.graph.initializer if t.data_location != TensorProto.EXTERNAL]
    for t in external:
        m.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep)
    moved = False
    for node in graph_nodes(m.graph):
        if node.domain in STANDARD_DOMAINS and not onnx.defs.has(node.op_type, node.domain):
            node.domain = UNCHECKED_DOMAIN
            moved = True
    if moved:
        m.opset_import.append(helper.make_opsetid(UNCHECKED_DOMAIN, 1))
    m.functions.extend(shape_functions(m, STANDARD_DOMAINS))
    _constants_into_branches(m.graph)
    return m


SMALL_CONSTANT = 64   # elements: shapes, axes, scalars


def _constants_into_branches(graph) -> None:
    """Give each If branch its own copy of the small constants it reads from the main graph.

    Shape inference propagates a constant's value (a Reshape's target shape) only within the graph
    that holds it, so a branch's Reshape to a main-graph constant shape would get unknown dims; a
    copy under the branch's own name keeps them known. Only the checker's copy is changed."""
    small = {t.name: t for t in graph.initializer if len(t.dims) <= 1 and math.prod(t.dims) <= SMALL_CONSTANT}
    for sub in subgraphs(graph):
        if sub is graph:
            continue
        local = {}
        for node in sub.node:
            for i, name in enumerate(node.input):
                if name in small:
                    if name not in local:
                        local[name] = f"{name}@{sub.name}"
                        copy_ = TensorProto()
                        copy_.CopyFrom(small[name])
                        copy_.name = local[name]
                        sub.initializer.append(copy_)
                    node.input[i] = local[name]


def _shape_text(value_type) -> str:
    tt = value_type.tensor_type
    if not tt.HasField("shape"):
        return "?"
    return "[" + ",".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim) + "]"


def known_shapes(model: ModelProto, inferred: ModelProto | None = None) -> dict[str, str]:
    """value name -> shape text, from inputs, outputs, initializers and (when given) shape inference,
    in the graph and in every If branch."""
    shapes = {}
    for g in subgraphs(inferred.graph if inferred is not None else model.graph):
        for v in list(g.input) + list(g.value_info) + list(g.output):
            shapes[v.name] = _shape_text(v.type)
    for g in subgraphs(model.graph):
        for t in g.initializer:
            shapes[t.name] = "[" + ",".join(str(d) for d in t.dims) + "]"
    return shapes


def op_inventory(model: ModelProto, name: str, shapes: dict[str, str] | None = None) -> OpInventory:
    shapes = shapes if shapes is not None else known_shapes(model)
    counts: Counter = Counter()
    families: Counter = Counter()
    nodes = list(graph_nodes(model.graph))   # If branches included: every op the graph may run
    for node in nodes:
        counts[(node.domain, node.op_type)] += 1
        signature = tuple(shapes.get(i, "?") if i else "" for i in node.input)
        families[(qualified(node.domain, node.op_type), signature)] += 1
    ops = tuple(OpCount(domain_name(d), op, n, is_standard(d, op))
                for (d, op), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    by_domain: Counter = Counter()
    for o in ops:
        by_domain[o.domain] += o.count
    return OpInventory(
        graph=name,
        nodes=len(nodes),
        standard_nodes=sum(o.count for o in ops if o.standard),
        ops=ops,
        nodes_by_domain=dict(by_domain),
        shape_families=tuple(ShapeFamily(op, sig, n) for (op, sig), n in sorted(families.items(), key=lambda kv: (-kv[1], kv[0]))),
    )


def infer(checkable: ModelProto) -> ModelProto:
    """Strict shape inference on a `checker_copy`; raises onnx's InferenceError on a conflict."""
    return onnx.shape_inference.infer_shapes(checkable, check_type=True, strict_mode=True, data_prop=True)
