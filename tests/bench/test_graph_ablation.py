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


def test_bypass_prunes_what_only_the_bypassed_node_read():
    # Sum reads a side product P (MatMul of a Gather): bypassing Sum must drop both, or they would still run
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])
    w = helper.make_tensor("W", TensorProto.FLOAT, [1, 3], [1.0, 2.0, 3.0])
    ids = helper.make_tensor("ids", TensorProto.INT64, [1], [0])
    nodes = [helper.make_node("Mul", ["X", "X"], ["sq"], name="/l/Scaled"),
             helper.make_node("Gather", ["X", "ids"], ["g"], name="/l/OutlierChannels", axis=1),
             helper.make_node("MatMul", ["g", "W"], ["p"], name="/l/OutlierMatMul"),
             helper.make_node("Add", ["sq", "p"], ["s"], name="/l/Sum"),
             helper.make_node("Mul", ["s", "X"], ["Y"], name="/l/Out")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w, ids]), opset_imports=[helper.make_opsetid("", 17)])
    assert graph_ablation.bypass(model, r"Sum$") == 1
    assert [n.name for n in model.graph.node] == ["/l/Scaled", "/l/Out"]
    x_ = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(_run(model, x_), x_ * x_ * x_)


def test_prune_keeps_a_value_that_only_a_subgraph_reads():
    # an If branch reading an outer-scope value keeps that value's producer alive
    branch_out = helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3])
    then = helper.make_graph([helper.make_node("Identity", ["outer"], ["b"])], "then", [], [branch_out])
    orelse = helper.make_graph([helper.make_node("Identity", ["X"], ["b"])], "else", [], [branch_out])
    nodes = [helper.make_node("Mul", ["X", "X"], ["outer"], name="/outer"),
             helper.make_node("Mul", ["X", "X"], ["dead"], name="/dead"),
             helper.make_node("If", ["c"], ["Y"], name="/if", then_branch=then, else_branch=orelse)]
    kept = graph_ablation.prune(nodes, {"Y"})
    assert [n.name for n in kept] == ["/outer", "/if"]


def test_decode_feeds_put_every_lane_at_the_position():
    from calculet.calbin.graphspec import GraphSpec, TensorSpec

    spec = GraphSpec(name="decode_2", type="decode", lanes=2, tokens=1, file="decode_2.onnx",
                     inputs=(TensorSpec("input_ids", (2, 1), "int64"), TensorSpec("seqlens_k", (2,), "int32"),
                             TensorSpec("total_seq_len", (), "int32"), TensorSpec("past_key.0", (2, 1, 8, 4), "float32")),
                     outputs=())
    feeds = graph_ablation.decode_feeds(spec, 200, np.random.default_rng(0))
    assert feeds["seqlens_k"].tolist() == [200, 200] and int(feeds["total_seq_len"]) == 201
    assert feeds["input_ids"].shape == (2, 1) and (feeds["input_ids"] >= 3).all()
    assert not feeds["past_key.0"].any()
