"""benchmarks/graph_ablation.py: a bypassed node is gone and its consumers read what it read; a pattern
that would remove a graph output is refused; NAME= alone is an unchanged copy."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import graph_ablation  # noqa: E402


def _model():
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Mul", ["X", "X"], ["sq"], name="/layers.0/Scaled"),
             helper.make_node("Add", ["sq", "X"], ["s"], name="/layers.0/Sum"),
             helper.make_node("Mul", ["s", "X"], ["Y"], name="/layers.0/Out")]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])


def _run(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]


def test_bypass_rewires_consumers_to_the_nodes_input():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    model = _model()
    assert graph_ablation.bypass(model, r"Scaled$") == 1
    assert [n.name for n in model.graph.node] == ["/layers.0/Sum", "/layers.0/Out"]
    np.testing.assert_array_equal(_run(model, x), (x + x) * x)      # Sum now adds X to X
    chained = _model()
    assert graph_ablation.bypass(chained, r"layers\.\d+/(Scaled|Sum)$") == 2
    np.testing.assert_array_equal(_run(chained, x), x * x)          # Out reads X through both


def test_bypass_refuses_a_graph_output_and_parses_variants():
    with pytest.raises(SystemExit, match="graph output"):
        graph_ablation.bypass(_model(), r"Out$")
    assert graph_ablation.parse_variant("control=") == ("control", [])
    assert graph_ablation.parse_variant("v=A$;B@1") == ("v", [("A$", 0), ("B", 1)])
    with pytest.raises(SystemExit, match="NAME=REGEX"):
        graph_ablation.parse_variant("no-equals")
