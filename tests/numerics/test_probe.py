"""Layer probes (`calculet compare --probe`): a `--probes` build names the module that holds a
corrupted weight, and reports no module for a correct build."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from calculet.numerics.probe import first_jump

torch = pytest.importorskip("torch")


def test_first_jump_needs_both_the_threshold_and_the_jump():
    assert first_jump([1e-7, 2e-7, 1e-6], 0.05, 4) is None          # fp32 noise
    assert first_jump([0.01, 0.02, 0.04, 0.06, 0.08], 0.05, 4) is None  # error growing through a quantized stack
    assert first_jump([1e-7, 1e-7, 0.9, 2.0], 0.05, 4) == 2
    assert first_jump([0.3, 0.4], 0.05, 4) == 0                        # the embedding itself
    assert first_jump([1e-7, float("nan")], 0.05, 4) == 1


@pytest.fixture(scope="module")
def probe_calbin(tiny_model_dir, tmp_path_factory):
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions

    made = {}

    def get(arch: str):
        if arch not in made:
            out = tmp_path_factory.mktemp(f"probe-{arch}") / "model.calbin"
            options = CompileOptions(lanes=2, context=64, prefill_chunks=(4, 16), golden=False, weights="fp32", probes=True)
            made[arch] = compile_calbin(str(tiny_model_dir(arch)), out, options, log=lambda _m: None)
        return made[arch]

    return get


def _corrupted(calbin, tensor: str, tmp_path):
    """A copy of `calbin` whose weights.bin holds noise in `tensor` (the manifest's sizes still hold)."""
    from calculet.calbin.manifest import read_manifest

    copy = shutil.copytree(calbin, tmp_path / "corrupt.calbin")
    manifest = read_manifest(copy)
    entry = next(t for t in manifest.weights.tensors if t.name == tensor)
    count = int(np.prod(entry.shape))
    with open(copy / manifest.weights.file, "r+b") as f:
        f.seek(entry.offset)
        f.write(np.random.default_rng(0).normal(0, 0.5, count).astype(entry.dtype).tobytes())
    return copy


def _probe(calbin, source, capsys) -> tuple[int, dict]:
    from calculet.cli import main

    rc = main(["compare", str(calbin), "--probe", "--source", str(source), "--json", "-"])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_correct_build_has_no_bad_module(arch, probe_calbin, tiny_model_dir, capsys):
    rc, doc = _probe(probe_calbin(arch), tiny_model_dir(arch), capsys)
    assert rc == 0 and doc["first_bad"] is None
    modules = [m["module"] for m in doc["modules"]]
    assert modules[0] == "model.embed_tokens" and modules[-1] == "model.norm"
    assert "model.layers.2.mlp" in modules and "model.layers.1.self_attn" in modules
    if arch == "gemma3":
        assert "model.layers.0.post_feedforward_layernorm" in modules and "model.layers.0.self_attn.q_norm" in modules
    assert max(m["rel_error"] for m in doc["modules"]) < 1e-4


@pytest.mark.parametrize("arch,tensor,module", [
    ("llama", "model.layers.1.mlp.down_proj.weight", "model.layers.1.mlp"),
    ("llama", "model.layers.2.self_attn.qkv_proj.weight", "model.layers.2.self_attn.o_proj:input"),  # the context
    ("llama", "model.layers.0.post_attention_layernorm.weight", "model.layers.0.post_attention_layernorm"),
    ("gemma3", "model.layers.1.post_feedforward_layernorm.weight", "model.layers.1.post_feedforward_layernorm"),
])
def test_a_corrupted_weight_is_named_as_the_first_bad_module(arch, tensor, module, probe_calbin, tiny_model_dir,
                                                            tmp_path, capsys):
    rc, doc = _probe(_corrupted(probe_calbin(arch), tensor, tmp_path), tiny_model_dir(arch), capsys)
    assert rc == 1 and doc["first_bad"] == module
    errors = {m["module"]: m["rel_error"] for m in doc["modules"]}
    assert errors[module] > 0.05


def test_probe_build_serves_the_same_logits(probe_calbin, tiny_calbin):
    """The probe outputs are extra: the runtime binds the usual ones and gets the usual numbers."""
    from calculet.numerics.walk import prefill_row
    from calculet.runtime.device import Device

    rows = []
    for calbin in (probe_calbin("llama"), tiny_calbin("llama")):
        device = Device()
        try:
            device.configure(device.load(calbin))
            rows.append(prefill_row(device, device.lanes.allocate(), list(range(3, 23))))
        finally:
            device.close()
    assert float(np.abs(rows[0] - rows[1]).max()) < 1e-5


def test_probe_needs_a_probe_build(tiny_calbin, tiny_model_dir, capsys):
    from calculet.cli import main

    assert main(["compare", str(tiny_calbin("llama")), "--probe", "--source", str(tiny_model_dir("llama"))]) == 2
    assert "compile a debug build with `calculet compile ... --probes`" in capsys.readouterr().err
