"""A small ONNX graph builder: readable node names, shared external weights, inline constants.

Node names follow a namespace such as `/model/layers.0/attn/q_proj/MatMul`, so a profile or an
op inventory points straight at the module it came from.
"""

from __future__ import annotations

import numpy as np
from onnx import GraphProto, ModelProto, helper, numpy_helper

from calculet.calbin.gates.shape_functions import graph_nodes, subgraphs
from calculet.compiler.weights import WeightStore, make_value_info

OPSET = 21
MS_DOMAIN = "com.microsoft"


class GraphBuilder:
    def __init__(self, name: str, weights: WeightStore, target: str = "cpu", fusions: frozenset[str] = frozenset(),
                 probes: bool = False):
        self.name = name
        self.weights = weights
        self.target = target  # "cpu" may use ONNX Runtime contrib ops; "portable" may not
        self.fusions = fusions
        self.probing = probes  # debug build: module outputs become extra graph outputs (see probe())
        self.probes: list[tuple[str, str, int, int | None]] = []  # (module, value, width, positions)
        self.probe_positions: int | None = None  # tokens per lane from here on when not the graph's S
        self.prefill_shape: tuple[int, int] | None = None  # (lanes, tokens) of a graph on the prefill-int8 pass's rows
        self.float32_copies = True   # prefill_shape graphs run FLOAT32_PREFILL copies (False: decode keeps the blocks)
        self.int8_rows: tuple[str, ...] | None = None   # prefill_shape graphs: the weight suffixes on the int8 rows (None: all)
        self.outlier_add_apart = False   # prefill chunks add the outlier channels as 3-D MatMul + Add (prefill_int8.outlier_add_apart)
        self._nodes = []
        self._inputs = []
        self._outputs = []
        self._initializers = {}
        self._consts = {}
        self._renames: dict[str, str] = {}

    def on_int8_rows(self, weight: str) -> bool:
        """Whether this graph runs `weight` on the prefill-int8 pass's rows, where the store has them."""
        return self.prefill_shape is not None and (self.int8_rows is None or weight.endswith(self.int8_rows))

    # --- graph interface -------------------------------------------------------------------
    def input(self, name: str, dtype, shape) -> str:
        self._inputs.append(make_value_info(name, dtype, shape))
        return name

    def output(self, value: str, name: str, dtype, shape) -> None:
        """Expose `value` as graph output `name`: the producing tensor is renamed, not copied by an Identity."""
        if value != name:
            if value in self._renames or value in self._renames.values() or any(i.name == value for i in self._inputs):
                self.op("Identity", [value], name=f"/outputs/{name}", outputs=[name])  # already an output / an input
            else:
                self._renames[value] = name
        self._outputs.append(make_value_info(name, dtype, shape))

    def probe(self, module: str, value: str, width: int) -> None:
        """Debug builds: expose `value` [L, S, width] as the output `probe:<module>`, where <module>
        is the Hugging Face module name whose forward output it equals (e.g. model.layers.3.mlp)."""
        if self.probing:
            self.probes.append((module, value, int(width), self.probe_positions))

    def weight(self, name: str) -> str:
        """Reference a tensor of the shared weight store (external data in weights.bin)."""
        if name not in self._initializers:
            self._initializers[name] = self.weights.external_initializer(name)
        return name

    def const(self, value, dtype=np.int64, name: str | None = None) -> str:
        """A small inline constant (shapes, axes, epsilons); identical values are shared."""
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            cname = name or f"/const/{len(self._consts)}"
            self._consts[key] = numpy_helper.from_array(array, cname)
        return self._consts[key].name

    def op(self, op_type: str, inputs: list[str], *, name: str, outputs: list[str] | None = None,
           n_out: int = 1, domain: str = "", **attrs) -> str | list[str]:
        if outputs is None:
            outputs = [f"{name}/output_{i}" for i in range(n_out)]
        self._nodes.append(helper.make_node(op_type, inputs, outputs, name=name, domain=domain or None, **attrs))
        return outputs[0] if len(outputs) == 1 else outputs

    def branch(self, name: str, build, dtype) -> GraphProto:
        """The nodes `build()` adds, as a subgraph (an If branch) whose outputs are the value `build()`
        returns (of `dtype`), or the values of the tuple it returns (of the matching dtypes of the tuple
        `dtype`); its nodes read the enclosing graph's values by name."""
        outer, self._nodes = self._nodes, []
        try:
            value = build()
            nodes = self._nodes
        finally:
            self._nodes = outer
        values, dtypes = (value, dtype) if isinstance(value, tuple) else ((value,), (dtype,))
        made = {o for node in nodes for o in node.output}
        # ONNX Runtime refuses a branch output that is an enclosing graph's value: copy such a value in the branch
        values = tuple(v if v in made else _copy_in_branch(nodes, name, v) for v in values)
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(v, t, None) for v, t in zip(values, dtypes)])

    def build(self) -> ModelProto:
        graph = helper.make_graph(
            self._nodes, self.name, self._inputs, self._outputs,
            initializer=list(self._consts.values()) + list(self._initializers.values()),
        )
        _apply_renames(graph, self._renames)
        _check_inputs_used(graph)
        opsets = [helper.make_opsetid("", OPSET)]
        if any(n.domain == MS_DOMAIN for n in graph_nodes(graph)):   # an If branch may hold the only one
            opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
        model = helper.make_model(graph, opset_imports=opsets, producer_name="calculet")
        model.ir_version = 10
        return model


def _copy_in_branch(nodes: list, branch: str, value: str) -> str:
    """Append to a branch's `nodes` an Identity of the enclosing graph's `value`; the copy's name."""
    copy = f"{branch}/copy:{value}"
    nodes.append(helper.make_node("Identity", [value], [copy], name=copy))
    return copy


def _apply_renames(graph: GraphProto, renames: dict[str, str]) -> None:
    """Give every value that `output` exposed under another name that name wherever a node reads or makes
    it: in the graph and in every If branch, whose nodes may read the enclosing graph's values."""
    for g in subgraphs(graph):
        for node in g.node:
            for field in (node.input, node.output):
                for i, tensor in enumerate(field):
                    if tensor in renames:
                        field[i] = renames[tensor]


def _check_inputs_used(graph: GraphProto) -> None:
    """Every declared input must feed a node (of the graph or of an If branch). Not an ONNX rule, but ONNX
    Runtime's OpenVINO execution provider (1.24) binds the inputs of a graph with an unused input before its
    last one shifted by one: each later input reads the previous one's buffer, so the outputs came back NaN
    or garbage."""
    read = {name for node in graph_nodes(graph) for name in node.input}
    unused = [v.name for v in graph.input if v.name not in read]
    if unused:
        raise ValueError(f"graph {graph.name!r} declares inputs no node reads: {unused}; "
                         "drop them from its signature")
