"""Model-local ONNX functions that let ONNX shape inference see through ONNX Runtime ops.

ONNX does not define com.microsoft.GroupQueryAttention, MatMulNBits and friends, so its shape
inference stops at them and everything downstream stays unknown. In the checker's copy of a graph
each such op gets a function whose body has the same output shapes and types, built from standard
ops (the body is never run; ONNX Runtime uses its own kernels):

    SimplifiedLayerNormalization(X, W)      -> Identity(X)
    GroupQueryAttention(Q, K, V, pk, pv, …) -> Identity(Q), Identity(pk), Identity(pv)
    MatMulNBits(A, codes, scales) <K, N>    -> MatMul(A, ConstantOfShape([K, N]))           [.., N]
    GatherBlockQuantized(codes, ids, s)     -> CastLike(Gather(codes, ids), s)               [*ids, K]
                                               (4-bit: two codes per byte, so the last dim doubles)
    MatMulIntegerToFloat(A, B, a_s, b_s, …) -> CastLike(MatMul(Cast(A), Cast(B)), a_s)       [.., N]
    FusedMatMul(A, B) <transA, transB>      -> Einsum(A, B) with the transposes in its equation

Nodes inside If branches count as uses too (the `cpu` target's ring layers run their products in
branches), and a value a branch reads from the enclosing graph counts as read.

An op is given a function only when every node using it fits the pattern (e.g. not attention with
packed QKV, whose output is not the query's shape); otherwise its outputs simply stay unknown.
Outputs no node reads (a norm's mean and inv_std_var) get a placeholder of any shape.
"""

from __future__ import annotations

from collections.abc import Iterator

from onnx import AttributeProto, FunctionProto, GraphProto, ModelProto, NodeProto, TensorProto, helper

# (input, output) pairs where the output has the input's shape and type.
PASS_THROUGH = {
    "SimplifiedLayerNormalization": ((0, 0),),
    "SkipSimplifiedLayerNormalization": ((0, 0), (0, 3)),   # output, input + skip (outputs 1, 2: mean, inv_std_var)
    "SkipLayerNormalization": ((0, 0), (0, 3)),
    "RotaryEmbedding": ((0, 0),),
    "GroupQueryAttention": ((0, 0), (3, 1), (4, 2)),   # output = query; present_key/value = past_key/value
}


def _attr(node: NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _ref(name: str, attr: str) -> AttributeProto:
    a = AttributeProto()
    a.name, a.ref_attr_name, a.type = name, attr, AttributeProto.INT
    return a


def _pass_through(op: str, nodes: list[NodeProto], used: set[str]) -> list[NodeProto] | None:
    source = {o: i for i, o in PASS_THROUGH[op]}
    n_out = max(len(n.output) for n in nodes)
    if any(i < len(n.input) and not n.input[i] for n in nodes for i in source.values()):
        return None  # e.g. packed QKV attention: the output is not the query's shape
    body = []
    for o in range(n_out):
        if o in source:
            body.append(helper.make_node("Identity", [f"in{source[o]}"], [f"out{o}"]))
        elif all(o >= len(n.output) or n.output[o] not in used for n in nodes):
            body.append(helper.make_node("Identity", ["in0"], [f"out{o}"]))  # an output no node uses: any shape will do
        else:
            return None
    return body


def _matmul_nbits(nodes: list[NodeProto], used: set[str]) -> list[NodeProto] | None:
    if any(len(n.output) != 1 for n in nodes):
        return None
    k = helper.make_node("Constant", [], ["k"])
    k.attribute.append(_ref("value_int", "K"))
    n = helper.make_node("Constant", [], ["n"])
    n.attribute.append(_ref("value_int", "N"))
    return [k, n,
            helper.make_node("Constant", [], ["axes"], value_ints=[0]),
            helper.make_node("Unsqueeze", ["k", "axes"], ["k1"]),
            helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
            helper.make_node("Concat", ["k1", "n1"], ["kn"], axis=0),
            helper.make_node("ConstantOfShape", ["kn"], ["w"]),          # float zeros [K, N]
            helper.make_node("CastLike", ["w", "in0"], ["w_typed"]),
            helper.make_node("MatMul", ["in0", "w_typed"], ["out0"])]


def _gather_block_quantized(nodes: list[NodeProto], used: set[str]) -> list[NodeProto] | None:
    bits = {_attr(n, "bits", 4) for n in nodes}
    if len(bits) != 1 or any(_attr(n, "gather_axis", 0) != 0 or _attr(n, "quantize_axis", 1) != 1 or len(n.output) != 1
                             for n in nodes):
        return None
    body = [helper.make_node("Gather", ["in0", "in1"], ["g"], axis=0),
            helper.make_node("CastLike", ["g", "in2"], ["f"])]
    if bits == {4}:
        return body + [helper.make_node("Concat", ["f", "f"], ["out0"], axis=-1)]
    if bits == {8}:
        return body + [helper.make_node("Identity", ["f"], ["out0"])]
    return None


def _matmul_integer_to_float(nodes: list[NodeProto], used: set[str]) -> list[NodeProto] | None:
    if any(len(n.output) != 1 or len(n.input) < 4 for n in nodes):
        return None
    return [helper.make_node("Cast", ["in0"], ["a"], to=TensorProto.FLOAT),
            helper.make_node("Cast", ["in1"], ["b"], to=TensorProto.FLOAT),
            helper.make_node("MatMul", ["a", "b"], ["p"]),
            helper.make_node("CastLike", ["p", "in2"], ["out0"])]


def _fused_matmul(nodes: list[NodeProto], used: set[str]) -> list[NodeProto] | None:
    """One Einsum per (transA, transB) the nodes share; batch dims broadcast through the ellipsis."""
    flags = {(_attr(n, "transA", 0), _attr(n, "transB", 0), _attr(n, "transBatchA", 0), _attr(n, "transBatchB", 0))
             for n in nodes}
    if len(flags) != 1 or any(len(n.output) != 1 for n in nodes):
        return None
    trans_a, trans_b, batch_a, batch_b = flags.pop()
    if batch_a or batch_b:
        return None
    a = "...ki" if trans_a else "...ik"
    b = "...jk" if trans_b else "...kj"
    return [helper.make_node("Einsum", ["in0", "in1"], ["out0"], equation=f"{a},{b}->...ij")]


BODIES = {op: (lambda nodes, used, op=op: _pass_through(op, nodes, used)) for op in PASS_THROUGH}
BODIES["MatMulNBits"] = _matmul_nbits
BODIES["GatherBlockQuantized"] = _gather_block_quantized
BODIES["MatMulIntegerToFloat"] = _matmul_integer_to_float
BODIES["FusedMatMul"] = _fused_matmul


def _branches(node: NodeProto) -> Iterator[GraphProto]:
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == AttributeProto.GRAPHS:
            yield from attr.graphs


def subgraphs(graph: GraphProto) -> Iterator[GraphProto]:
    """The graph and, depth first, every subgraph its nodes hold (an If's branches)."""
    yield graph
    for node in graph.node:
        for sub in _branches(node):
            yield from subgraphs(sub)


def graph_nodes(graph: GraphProto) -> Iterator[NodeProto]:
    """The nodes of the graph and of every subgraph it holds."""
    return (node for g in subgraphs(graph) for node in g.node)


def _read_values(graph: GraphProto) -> set[str]:
    """Every value some node reads, in the graph or in any branch (which may read the enclosing
    graph's values), and the outputs of the graph and of every branch."""
    used = {o.name for g in subgraphs(graph) for o in g.output}
    for node in graph_nodes(graph):
        used.update(node.input)
    return used


def shape_functions(model: ModelProto, standard_domains: tuple[str, ...]) -> list[FunctionProto]:
    """One function per ONNX Runtime op used in `model` whose nodes all fit its pattern."""
    uses: dict[tuple[str, str], list[NodeProto]] = {}
    for node in graph_nodes(model.graph):
        if node.domain not in standard_domains and node.op_type in BODIES:
            uses.setdefault((node.domain, node.op_type), []).append(node)
    opset = next((o.version for o in model.opset_import if o.domain in standard_domains), 21)
    used = _read_values(model.graph)
    functions = []
    for (domain, op), nodes in uses.items():
        body = BODIES[op](nodes, used)
        if body is None:
            continue
        n_in, n_out = max(len(n.input) for n in nodes), max(len(n.output) for n in nodes)
        attributes = sorted({a.name for n in nodes for a in n.attribute})
        functions.append(helper.make_function(domain, op, [f"in{i}" for i in range(n_in)], [f"out{o}" for o in range(n_out)],
                                              body, [helper.make_opsetid("", opset)], attributes=attributes))
    return functions
