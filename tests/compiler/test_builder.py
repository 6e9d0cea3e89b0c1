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
