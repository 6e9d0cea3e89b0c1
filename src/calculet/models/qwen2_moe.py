"""Qwen2-MoE (Qwen1.5-MoE): the Qwen2 attention block (q/k/v bias) with routed SwiGLU experts plus one
always-on shared expert per sparse layer, scaled by a sigmoid gate:

    y = routed(x) + sigmoid(x . g) * shared(x)          g = mlp.shared_expert_gate [H -> 1]

Which layers are sparse, the router and the expert stacks are Qwen3-MoE's (models/qwen3_moe.py); the
shared expert is a dense SwiGLU MLP of `shared_expert_intermediate_size` (`mlp.shared_expert.*`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import numpy as np

from calculet.models import llama, qwen3_moe
from calculet.models.base import ModelSpec, get_tensor, layer_projection_weights, linear_weight, require_positive

MODEL_TYPES = ("qwen2_moe",)
LAYER_NORMS = llama.LAYER_NORMS


def parse_config(config: dict) -> ModelSpec:
    dense = llama.parse_config({**config, "model_type": "qwen2"})
    moe = replace(qwen3_moe.moe_spec(config, dense.num_layers),
                  shared_expert_intermediate_size=require_positive(config, "shared_expert_intermediate_size"))
    return replace(dense, family="qwen2_moe", model_type="qwen2_moe", qkv_bias=bool(config.get("qkv_bias", True)),
                   moe=moe)


def prepare_weights(spec: ModelSpec, tensors) -> Iterator[tuple[str, np.ndarray]]:
    yield "model.embed_tokens.weight", get_tensor(tensors, "model.embed_tokens.weight")
    for i in range(spec.num_layers):
        p = f"model.layers.{i}"
        sparse = spec.moe.is_sparse(i)
        yield f"{p}.input_layernorm.weight", get_tensor(tensors, f"{p}.input_layernorm.weight")
        yield f"{p}.post_attention_layernorm.weight", get_tensor(tensors, f"{p}.post_attention_layernorm.weight")
        yield from layer_projection_weights(spec, tensors, p, mlp=not sparse)
        if sparse:
            yield from qwen3_moe.expert_weights(spec, tensors, p)
            for proj in ("gate_proj", "up_proj", "down_proj"):
                name = f"{p}.mlp.shared_expert.{proj}.weight"
                yield name, linear_weight(tensors, name)
            yield f"{p}.mlp.shared_expert_gate.weight", linear_weight(tensors, f"{p}.mlp.shared_expert_gate.weight")  # [H, 1]
    yield "model.norm.weight", get_tensor(tensors, "model.norm.weight")
    if not spec.tie_word_embeddings:
        yield "lm_head.weight", get_tensor(tensors, "lm_head.weight")
