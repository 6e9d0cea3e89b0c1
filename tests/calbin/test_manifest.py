"""The typed manifest: JSON is only its on-disk form, read and written in one place."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

from calculet.calbin.graphspec import TensorSpec
from calculet.calbin.manifest import (MANIFEST, SCHEMA_VERSION, Manifest, TensorFormat, read_manifest,
                                      write_manifest)
from calculet.errors import ModelError
from calculet.models.base import MoeSpec


@pytest.fixture(scope="module")
def llama(tiny_calbin):
    return tiny_calbin("llama")


def test_json_round_trip_is_exact(llama):
    """The compiler's manifest.json reads into the typed Manifest and writes back the same document."""
    text = (llama / MANIFEST).read_text()
    raw = json.loads(text)
    m = Manifest.from_json(raw)
    assert m.schema_version == SCHEMA_VERSION == "calculet.calbin/3"
    assert json.dumps(m.to_json(), indent=1) + "\n" == text
    assert Manifest.from_json(m.to_json()) == m


def test_sections_are_typed_and_frozen(llama):
    m = read_manifest(llama)
    assert m.spec.vocab_size >= m.tokenizer.vocab_size and m.model.source.sha256
    assert all(g.file == f"graphs/{g.name}.onnx" for g in m.graphs)
    assert m.memory_plan.kv.total_bytes == m.kv.total_bytes == m.kv.lanes * 2 * sum(m.kv.layer_lengths) * m.kv.bytes_per_position
    with pytest.raises(AttributeError):
        m.target = "portable"  # type: ignore[misc]


def test_types_stay_open_to_new_module_classes_and_graph_outputs(llama, tmp_path):
    """A family may add module classes (router, experts), a MoE spec and extra graph outputs: the
    format carries them without a schema change."""
    m = read_manifest(llama)
    moe = MoeSpec(num_experts=4, experts_per_token=2, expert_intermediate_size=16, sparse_layers=(0,))
    decode = m.graphs[-1]
    more = replace(decode, outputs=decode.outputs + (TensorSpec("expert_counts", (decode.lanes, 4), "int32"),))
    m2 = replace(m, model=replace(m.model, hyperparameters=replace(m.spec, moe=moe)),
                 graphs=m.graphs[:-1] + (more,),
                 quantization=replace(m.quantization, table={**m.quantization.table, "experts": TensorFormat("int8", 32, "int8")}))
    folder = tmp_path / "c.calbin"
    shutil.copytree(llama, folder)
    write_manifest(m2, folder)
    back = read_manifest(folder)
    assert back == m2 and back.spec.moe == moe and back.quantization.table["experts"].label == "int8 b32 (int8 compute)"


def test_old_schema_is_refused_with_the_command_that_recompiles(llama, tmp_path):
    """Guards the move to calculet.calbin/2: a /1 calbin gets one clear error that says how to recompile."""
    folder = tmp_path / "old.calbin"
    shutil.copytree(llama, folder)
    raw = json.loads((folder / MANIFEST).read_text())
    raw["schema_version"] = "calculet.calbin/1"
    (folder / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(ModelError) as exc:
        read_manifest(folder)
    assert exc.value.code == "manifest_schema"
    assert "calculet.calbin/1" in exc.value.message and "calculet compile" in exc.value.message
    raw["schema_version"] = "calculet.calbin/99"
    (folder / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(ModelError) as exc:
        read_manifest(folder)
    assert "not supported; supported: calculet.calbin/3" in exc.value.message
