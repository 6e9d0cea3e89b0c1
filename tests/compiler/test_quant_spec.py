"""Per-module quantization overrides (`--quant`): parsing, the tensors they change, the manifest."""

from __future__ import annotations

import re
import shlex

import pytest

from calculet.compiler.quant_spec import canonical, format_for, parse_quant
from calculet.compiler.quantize import policy_table
from calculet.errors import RequestError


def test_items_parse_into_module_layer_and_format():
    o = parse_quant("attn=int8, mlp:1-2=int4/b16,lm_head=w8a8,embed=fp16,router=fp32,mlp:3=fp32", block_size=32)
    assert [(x.module, x.layers, x.fmt.kind, x.fmt.block, x.fmt.compute) for x in o] == [
        ("attention", None, "int8", 32, "fp32"), ("mlp", (1, 2), "int4", 16, "fp32"), ("lm_head", None, "int8", 32, "int8"),
        ("embedding", None, "fp16", 32, "fp16"), ("router", None, "fp32", 32, "fp32"), ("mlp", (3, 3), "fp32", 32, "fp32")]
    assert parse_quant(canonical(o)) == o
    assert parse_quant("") == ()


def test_the_last_matching_item_wins_and_layers_are_respected():
    o = parse_quant("mlp=int8,mlp:2-3=int4")
    table = policy_table("fp32")
    assert format_for("model.layers.0.mlp.down_proj.weight", "mlp", table, o).kind == "int8"
    assert format_for("model.layers.2.mlp.down_proj.weight", "mlp", table, o).kind == "int4"
    assert format_for("model.layers.2.self_attn.o_proj.weight", "attention", table, o).kind == "fp32"
    assert format_for("model.layers.2.self_attn.o_proj.weight", "attention", policy_table("default"), o).kind == "int8"


@pytest.mark.parametrize("text,message", [
    ("attn", "is not MODULE[:LAYERS]=FORMAT"),
    ("ffn=int8", "module 'ffn' is unknown; allowed: attn, mlp, lm_head, embed, router"),
    ("mlp=int3", "format 'int3' is unknown; allowed: fp32, fp16, int8, int4, w8a8, w4a8"),
    ("mlp=int4/b48", "block 48 is not allowed; allowed: 16, 32, 64, 128, 256"),
    ("mlp:4-2=int8", "layer range 4-2 is empty"),
    ("lm_head:0=int8", "layer ranges apply to attn and mlp only"),
    ("router=int8", "router weights stay fp32"),
])
def test_bad_items_say_what_is_allowed(text, message):
    with pytest.raises(RequestError, match=re.escape(message)):
        parse_quant(text)


pytest.importorskip("torch")


def test_overrides_reach_the_weights_and_the_manifest(tiny_model_dir, tmp_path):
    from calculet.calbin.manifest import read_manifest
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions

    quant = parse_quant("attn=int8,mlp:1-2=int4/b16,lm_head=int8")
    options = CompileOptions(lanes=1, context=64, prefill_chunks=(16,), golden=False, weights="fp32", quant=quant,
                             decode_lanes=())
    calbin = compile_calbin(str(tiny_model_dir("llama")), tmp_path / "q.calbin", options, log=lambda _m: None)
    m = read_manifest(calbin)
    tensors = m.quantization.tensors
    assert tensors["model.layers.0.mlp.down_proj.weight"].kind == "fp32"
    assert tensors["model.layers.1.mlp.down_proj.weight"].kind == "int4"
    assert tensors["model.layers.2.mlp.gate_up_proj.weight"].block == 16
    assert tensors["model.layers.0.self_attn.qkv_proj.weight"].kind == "int8"
    assert tensors["lm_head.weight"].kind == "int8"
    assert m.quantization.overrides[1] == {"module": "mlp", "layers": [1, 2], "kind": "int4", "block": 16, "compute": "fp32"}
    argv = shlex.split(m.provenance.command)
    assert argv[argv.index("--quant") + 1] == canonical(quant)
    # the build runs: prefill logits are finite
    import numpy as np

    from calculet.numerics.walk import prefill_row
    from calculet.runtime.device import Device
    device = Device()
    try:
        device.configure(device.load(calbin))
        assert np.isfinite(prefill_row(device, device.lanes.allocate(), [2, 40, 41, 42])).all()
    finally:
        device.close()


def test_a_layer_range_outside_the_model_is_refused(tiny_model_dir, tmp_path, capsys):
    from calculet.cli import main

    rc = main(["compile", str(tiny_model_dir("llama")), "-o", str(tmp_path / "x.calbin"), "--lanes", "1", "--context", "64",
               "--prefill-chunks", "16", "--no-golden", "--quant", "mlp:2-7=int8"])
    assert rc == 2
    assert "layer range 2-7 is outside the model's layers 0-2" in capsys.readouterr().err
