"""inspect: the JSON report parses back and agrees with the manifest and the .onnx files; text sections;
standard vs ONNX Runtime ops; shape families; bad input is one clear line."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import onnx
import pytest

from calculet.calbin.inspect import inspect_calbin
from calculet.calbin.inspect_render import render_text
from calculet.cli import main


@pytest.fixture(scope="module")
def llama(tiny_calbin) -> Path:
    return tiny_calbin("llama")


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def _widest_decode(report):
    return max((g for g in report.graphs if g.graph.type == "decode"), key=lambda g: g.graph.lanes)


def test_inspect_json_parses_back_and_matches_the_calbin(llama, capsys):
    assert main(["inspect", str(llama), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    m = _manifest(llama)
    assert set(doc) == {"path", "summary", "graphs", "memory_plan", "quantization"}
    assert doc["summary"]["schema_version"] == m["schema_version"]
    assert {k: doc["summary"]["profile"][k] for k in m["profile"]} == m["profile"]
    assert doc["summary"]["model"]["num_layers"] == m["model"]["hyperparameters"]["num_layers"]
    assert [g["name"] for g in doc["graphs"]] == [g["name"] for g in m["graphs"]]
    for g, declared in zip(doc["graphs"], m["graphs"]):
        assert g["inputs"] == declared["inputs"] and g["outputs"] == declared["outputs"]
        nodes = onnx.load(str(llama / declared["file"]), load_external_data=False).graph.node
        counts = Counter((n.domain or "ai.onnx", n.op_type) for n in nodes)
        assert {(o["domain"], o["op_type"]): o["count"] for o in g["ops"]["ops"]} == dict(counts)
        assert g["ops"]["nodes"] == len(nodes) == sum(f["count"] for f in g["ops"]["shape_families"])
    assert doc["memory_plan"] == m["memory_plan"]
    per_tensor = m["quantization"]["tensors"]
    assert doc["quantization"]["tensors"] == per_tensor
    assert sum(g["tensors"] for g in doc["quantization"]["groups"]) == len(per_tensor)


def test_standard_and_onnx_runtime_ops_are_told_apart(llama):
    report = inspect_calbin(llama)
    layers = report.summary["model"]["num_layers"]
    decode = _widest_decode(report)
    ops = {(o.domain, o.op_type): o for o in decode.ops.ops}
    gqa = ops[("com.microsoft", "GroupQueryAttention")]
    assert gqa.count == layers and not gqa.standard
    for o in decode.ops.ops:  # ONNX Runtime registers a few ops (SimplifiedLayerNormalization) in the ONNX domain itself
        assert o.standard == (o.domain == "ai.onnx" and onnx.defs.has(o.op_type)), o
    assert any(o.standard for o in decode.ops.ops)
    assert decode.ops.nodes_by_domain["com.microsoft"] == sum(o.count for o in decode.ops.ops if o.domain == "com.microsoft")
    assert decode.ops.nodes - decode.ops.standard_nodes == sum(o.count for o in decode.ops.nonstandard)


def test_shape_families_group_repeated_layers(llama):
    report = inspect_calbin(llama)
    m = _manifest(llama)
    kv = m["kv"]
    decode = _widest_decode(report)
    gqa = [f for f in decode.ops.shape_families if f.op == "com.microsoft.GroupQueryAttention"]
    assert len(gqa) == 1 and gqa[0].count == kv["num_layers"]
    kv_shape = f"[{kv['lanes']},{kv['kv_heads']},{kv['context']},{kv['head_dim']}]"
    assert gqa[0].inputs[3] == kv_shape and gqa[0].inputs[4] == kv_shape
    assert all("?" not in f.inputs for f in decode.ops.shape_families), "shapes should be known through ONNX Runtime ops"


def test_shapes_are_known_inside_if_branches(tiny_calbin):
    """Gemma 3's sliding layers on a KV ring run their products in If branches (FusedMatMul, Softmax):
    the inventory counts those nodes, and shape inference reaches them through the ONNX Runtime ops."""
    report = inspect_calbin(tiny_calbin("gemma3", context=64))
    for g in report.graphs:
        if g.graph.type not in ("decode", "prefill"):
            continue
        ops = {o.op_type: o.count for o in g.ops.ops}
        assert ops.get("If", 0) > 0 and ops.get("FusedMatMul", 0) > 0, (g.graph.name, ops)
        fused = [f for f in g.ops.shape_families if f.op == "com.microsoft.FusedMatMul"]
        assert fused and all(f.inputs[0].startswith(f"[{g.graph.lanes},") for f in fused), fused
        unknown = [f for f in g.ops.shape_families if "?" in f.inputs]
        assert not unknown, f"{g.graph.name}: shapes unknown for {unknown[:3]}"


def test_text_report_has_every_section(llama, capsys):
    decode = _widest_decode(inspect_calbin(llama)).graph.name
    assert main(["inspect", str(llama)]) == 0
    out = capsys.readouterr().out
    for needle in ("schema calculet.calbin/3", "profile: lanes 4", f"graph {decode} (decode, 4 lanes x 1 tokens)",
                   "com.microsoft  GroupQueryAttention", "shape families", "memory plan (bytes",
                   f"staging {decode}", "(an estimate)", "quantization policy", "model.layers.*.",
                   "  isa: weights ", "compiled on "):
        assert needle in out, needle


def test_unreadable_graph_shows_its_error_instead_of_ops(llama, tmp_path):
    folder = tmp_path / "c.calbin"
    shutil.copytree(llama, folder)
    decode = _widest_decode(inspect_calbin(folder))
    (folder / decode.graph.file).write_bytes(b"not onnx at all")
    report = inspect_calbin(folder)
    decode = _widest_decode(report)
    assert decode.ops is None and decode.graph.file in decode.error
    assert "ops: unavailable" in render_text(report)
    json.loads(report.to_json_text())


def _one_clear_line(capsys, code: str) -> None:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error[{code}]:") and "Traceback" not in err, err


def test_inspect_bad_input_is_one_clear_line(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "missing")]) == 2
    _one_clear_line(capsys, "not_a_calbin")
    (tmp_path / "manifest.json").write_text("not json")
    assert main(["inspect", str(tmp_path), "--json"]) == 2
    _one_clear_line(capsys, "manifest_not_json")


def test_inspect_malformed_graph_entry_is_one_clear_line(llama, tmp_path, capsys):
    folder = tmp_path / "c.calbin"
    shutil.copytree(llama, folder)
    m = _manifest(folder)
    del m["graphs"][0]["inputs"]
    (folder / "manifest.json").write_text(json.dumps(m))
    assert main(["inspect", str(folder)]) == 2
    _one_clear_line(capsys, "manifest_missing_field")  # the typed reader names the field
    m["graphs"][0]["inputs"] = [{"name": "input_ids"}]
    (folder / "manifest.json").write_text(json.dumps(m))
    assert main(["inspect", str(folder)]) == 2
    _one_clear_line(capsys, "manifest_missing_field")


def test_old_schema_calbin_says_how_to_recompile(llama, tmp_path, capsys):
    """Guards the schema move to calculet.calbin/2: a /1 calbin must not fail somewhere inside a reader
    but say at once that it is old and which command makes a current one."""
    folder = tmp_path / "old.calbin"
    shutil.copytree(llama, folder)
    m = _manifest(folder)
    m["schema_version"] = "calculet.calbin/1"
    (folder / "manifest.json").write_text(json.dumps(m))
    assert main(["inspect", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "error[manifest_schema]" in err and "calculet.calbin/1" in err and "calculet.calbin/3" in err
    assert f"calculet compile SOURCE -o {folder}" in err
