"""models/qwen3_moe.py: config parsing and the expert weight layouts, on small numpy tensors."""

from __future__ import annotations

import numpy as np
import pytest

from calculet.errors import ModelError
from calculet.models import qwen3_moe

H, I, E, V, INTER = 16, 8, 4, 10, 24
CONFIG = {"model_type": "qwen3_moe", "vocab_size": V, "hidden_size": H, "intermediate_size": INTER,
          "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
          "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "num_experts": E,
          "num_experts_per_tok": 2, "moe_intermediate_size": I, "mlp_only_layers": [0], "norm_topk_prob": True}


def _tensors(rng, stacked: bool) -> dict[str, np.ndarray]:
    t = {"model.embed_tokens.weight": rng.standard_normal((V, H)), "model.norm.weight": np.ones(H),
         "lm_head.weight": rng.standard_normal((V, H))}
    for i in range(2):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = t[f"{p}.post_attention_layernorm.weight"] = np.ones(H)
        for proj, shape in (("q_proj", (16, H)), ("k_proj", (8, H)), ("v_proj", (8, H)), ("o_proj", (H, 16))):
            t[f"{p}.self_attn.{proj}.weight"] = rng.standard_normal(shape)
        t[f"{p}.self_attn.q_norm.weight"] = t[f"{p}.self_attn.k_norm.weight"] = np.ones(8)
    for proj, shape in (("gate_proj", (INTER, H)), ("up_proj", (INTER, H)), ("down_proj", (H, INTER))):
        t[f"model.layers.0.mlp.{proj}.weight"] = rng.standard_normal(shape)
    p = "model.layers.1.mlp"
    t[f"{p}.gate.weight"] = rng.standard_normal((E, H))
    gate, up, down = rng.standard_normal((E, I, H)), rng.standard_normal((E, I, H)), rng.standard_normal((E, H, I))
    if stacked:  # transformers 5 in memory (and the GGUF source): gate rows then up rows
        t[f"{p}.experts.gate_up_proj"] = np.concatenate([gate, up], axis=1)
        t[f"{p}.experts.down_proj"] = down
    else:        # save_pretrained: one tensor per expert
        for e in range(E):
            t[f"{p}.experts.{e}.gate_proj.weight"], t[f"{p}.experts.{e}.up_proj.weight"] = gate[e], up[e]
            t[f"{p}.experts.{e}.down_proj.weight"] = down[e]
    return {k: np.asarray(v, np.float32) for k, v in t.items()}


def test_sparse_layers_and_saved_config_key():
    spec = qwen3_moe.parse_config({**CONFIG, "num_local_experts": E, "num_experts": None})
    assert spec.moe.sparse_layers == (1,) and spec.moe.num_experts == E and spec.moe.norm_topk_prob
    with pytest.raises(ModelError) as e:
        qwen3_moe.parse_config({k: v for k, v in CONFIG.items() if k != "num_experts"})
    assert "num_experts" in str(e.value) and "num_local_experts" in str(e.value)


def test_per_expert_and_stacked_sources_give_the_same_interleaved_stacks():
    spec = qwen3_moe.parse_config(CONFIG)
    a = dict(qwen3_moe.prepare_weights(spec, _tensors(np.random.default_rng(0), stacked=False)))
    b = dict(qwen3_moe.prepare_weights(spec, _tensors(np.random.default_rng(0), stacked=True)))
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    src = _tensors(np.random.default_rng(0), stacked=False)
    fc1 = a["model.layers.1.mlp.experts.gate_up_proj.weight"]
    assert fc1.shape == (E, 2 * I, H) and a["model.layers.1.mlp.experts.down_proj.weight"].shape == (E, H, I)
    np.testing.assert_array_equal(fc1[2, 0::2], src["model.layers.1.mlp.experts.2.gate_proj.weight"])
    np.testing.assert_array_equal(fc1[2, 1::2], src["model.layers.1.mlp.experts.2.up_proj.weight"])
    assert a["model.layers.1.mlp.gate.weight"].shape == (H, E)            # router in MatMul layout
    assert "model.layers.1.mlp.gate_proj.weight" not in a and "model.layers.0.mlp.gate_proj.weight" in a


def test_expert_of_the_wrong_shape_is_named():
    spec = qwen3_moe.parse_config(CONFIG)
    t = _tensors(np.random.default_rng(0), stacked=False)
    t["model.layers.1.mlp.experts.3.up_proj.weight"] = np.zeros((I + 1, H), np.float32)
    with pytest.raises(ModelError) as e:
        dict(qwen3_moe.prepare_weights(spec, t))
    assert "experts.3.up_proj" in str(e.value) and f"[{I}, {H}]" in str(e.value)
