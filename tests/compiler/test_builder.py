"""GraphBuilder: the checks it makes before it hands out a model."""

from __future__ import annotations

import numpy as np
import pytest

from calculet.compiler.builder import GraphBuilder
from calculet.compiler.weights import WeightStore


def test_build_refuses_an_input_no_node_reads():
    """Regression (issue 17): an unused input before the last one shifts ONNX Runtime's OpenVINO
    provider's input binding by one (later inputs read the previous buffer: NaN outputs)."""
    g = GraphBuilder("g", WeightStore())
    g.input("unused", np.dtype("int32"), ())
    x = g.input("x", np.dtype("float32"), (2, 3))
    g.output(g.op("Relu", [x], name="/relu"), "y", np.dtype("float32"), (2, 3))
    with pytest.raises(ValueError, match=r"declares inputs no node reads: \['unused'\]"):
        g.build()


def test_build_accepts_a_graph_reading_every_input():
    g = GraphBuilder("g", WeightStore())
    x = g.input("x", np.dtype("float32"), (2, 3))
    g.output(g.op("Relu", [x], name="/relu"), "y", np.dtype("float32"), (2, 3))
    model = g.build()
    assert [i.name for i in model.graph.input] == ["x"]


def test_build_counts_an_input_that_only_an_if_branch_reads():
    """A ring layer's KV inputs are read only inside its prefill `If` branches (attention_ring.attention)."""
    from onnx import TensorProto

    g = GraphBuilder("g", WeightStore())
    c = g.input("c", np.dtype("float32"), ())
    x = g.input("x", np.dtype("float32"), (2, 3))   # read only inside the branches
    flag = g.op("Greater", [c, g.const(0.0, np.float32)], name="/flag")
    then = g.branch("then", lambda: g.op("Relu", [x], name="/relu"), TensorProto.FLOAT)
    other = g.branch("else", lambda: g.op("Neg", [x], name="/neg"), TensorProto.FLOAT)
    g.output(g.op("If", [flag], name="/if", then_branch=then, else_branch=other), "y", np.dtype("float32"), (2, 3))
    assert [i.name for i in g.build().graph.input] == ["c", "x"]


def test_build_renames_a_value_exposed_as_output_inside_if_branches_too():
    """`output` renames the producing value instead of copying it; a branch reading that value (or
    returning it) must read the new name, or the model names a value nothing produces."""
    import onnxruntime as ort
    from onnx import TensorProto

    g = GraphBuilder("g", WeightStore())
    c = g.input("c", np.dtype("float32"), ())
    x = g.input("x", np.dtype("float32"), (2, 3))
    flag = g.op("Greater", [c, g.const(0.0, np.float32)], name="/flag")
    shared = g.op("Relu", [x], name="/relu")               # exposed below as output "r", read by both branches
    then = g.branch("then", lambda: g.op("Neg", [shared], name="/neg"), TensorProto.FLOAT)
    other = g.branch("else", lambda: shared, TensorProto.FLOAT)
    g.output(shared, "r", np.dtype("float32"), (2, 3))
    g.output(g.op("If", [flag], name="/if", then_branch=then, else_branch=other), "y", np.dtype("float32"), (2, 3))
    model = g.build()
    from calculet.calbin.gates.shape_functions import graph_nodes

    assert shared not in {name for node in graph_nodes(model.graph) for name in node.input}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    xv = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)
    for cv, want in ((1.0, -np.maximum(xv, 0)), (-1.0, np.maximum(xv, 0))):
        r, y = session.run(["r", "y"], {"c": np.array(cv, np.float32), "x": xv})
        np.testing.assert_array_equal(r, np.maximum(xv, 0))
        np.testing.assert_array_equal(y, want)


def test_build_imports_the_microsoft_domain_when_only_a_branch_uses_it():
    """The opset imports are read from every node, If branches included: a com.microsoft op held only
    inside a branch (as GroupQueryAttention in a ring layer's prefill) still needs its domain imported."""
    import onnxruntime as ort
    from onnx import TensorProto

    g = GraphBuilder("g", WeightStore())
    c = g.input("c", np.dtype("float32"), ())
    x = g.input("x", np.dtype("float32"), (2, 3))
    flag = g.op("Greater", [c, g.const(0.0, np.float32)], name="/flag")
    then = g.branch("then", lambda: g.op("Gelu", [x], name="/gelu", domain="com.microsoft"), TensorProto.FLOAT)
    other = g.branch("else", lambda: g.op("Neg", [x], name="/neg"), TensorProto.FLOAT)
    g.output(g.op("If", [flag], name="/if", then_branch=then, else_branch=other), "y", np.dtype("float32"), (2, 3))
    model = g.build()
    assert "com.microsoft" in {o.domain for o in model.opset_import}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(["y"], {"c": np.array(-1.0, np.float32), "x": np.ones((2, 3), np.float32)})
    np.testing.assert_array_equal(y, -np.ones((2, 3), np.float32))
