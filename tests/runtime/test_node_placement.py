"""Node placement per execution provider, measured from ONNX Runtime's profiler (runtime/node_placement.py)
and shown by `calculet inspect --provider` and `calculet validate --provider`."""

from __future__ import annotations

import json

import pytest

from calculet.cli import main
from calculet.errors import ModelError
from calculet.runtime.node_placement import GraphPlacement, Placement, _count, measure_placement, render_placement
from calculet.runtime.program import DeviceConfig


def test_cpu_runs_every_node_and_nothing_falls_back(tiny_calbin):
    from calculet.calbin.manifest import read_manifest

    path = tiny_calbin("llama")
    p = measure_placement(path, DeviceConfig("cpu"))
    names = {g.graph for g in p.graphs}
    assert {"decode_1", "prefill_4", "prefill_16"} <= names and any(n.startswith("head_") for n in names)
    for g in p.graphs:
        assert set(g.providers()) == {"CPUExecutionProvider"} and sum(g.providers().values()) > 0
    decode = next(g for g in p.graphs if g.graph == "decode_1")
    layers = read_manifest(path).kv.num_layers
    assert decode.on("CPUExecutionProvider")["GroupQueryAttention"] == layers   # one attention node per layer
    assert p.fallback_ops() == {}


def test_nodes_on_the_cpu_under_another_provider_are_the_fallback(tmp_path):
    """The profile parser counts distinct nodes (a node run twice counts once) and the CPU provider's
    nodes are what falls back when another provider was asked for."""
    events = [{"cat": "Session", "name": "session_initialization", "args": {}}]
    for node, provider, op in (("a", "CUDAExecutionProvider", "MatMul"), ("b", "CPUExecutionProvider", "TopK"),
                               ("c", "CUDAExecutionProvider", "MatMul"), ("a", "CUDAExecutionProvider", "MatMul")):
        events += [{"cat": "Node", "name": f"{node}_fence_before", "args": {"op_name": op}},
                   {"cat": "Node", "name": f"{node}_kernel_time", "args": {"op_name": op, "provider": provider}}]
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(events))
    nodes = _count(profile)
    assert nodes == (("CPUExecutionProvider", "TopK", 1), ("CUDAExecutionProvider", "MatMul", 2))
    p = Placement("cuda", "CUDAExecutionProvider", (GraphPlacement("head_1", nodes),))
    assert p.fallback_ops() == {"TopK": 1}
    assert "falls back to the CPU: TopK x1" in render_placement(p)
    assert Placement("cpu", "CPUExecutionProvider", (GraphPlacement("head_1", nodes),)).fallback_ops() == {}


def test_inspect_and_validate_report_placement(tiny_calbin, capsys):
    path = str(tiny_calbin("llama"))
    assert main(["inspect", path, "--provider", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "placement on cpu (CPUExecutionProvider)" in out and "decode_1" in out
    assert main(["validate", path, "--fast", "--provider", "cpu", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["placement"][0]["provider"] == "cpu" and data["placement"][0]["cpu_fallback"] == {}


def test_a_provider_that_cannot_run_the_calbin_says_so(tiny_calbin, capsys):
    assert main(["inspect", str(tiny_calbin("llama")), "--provider", "openvino"]) == 2
    assert "provider_target_mismatch" in capsys.readouterr().err
