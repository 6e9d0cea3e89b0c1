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
from calculet.models.base import ModelSpec, linear_weight, require_positive

MODEL_TYPES = ("qwen2_moe",)
LAYER_NORMS = llama.LAYER_NORMS


def parse_config(config: dict) -> ModelSpec:
    dense = llama.parse_config({**config, "model_type": "qwen2"})
    moe = replace(qwen3_moe.moe_spec(config, dense.num_layers),
                  shared_expert_intermediate_size=require_positive(config, "shared_expert_intermediate_size"))
    return replace(dense, family="qwen2_moe", model_type="qwen2_moe", qkv_bias=bool(config.get("qkv_bias", True)),
                   moe=moe)


def _shared_expert(tensors, p: str) -> Iterator[tuple[str, np.ndarray]]:
    for proj in ("gate_proj", "up_proj", "down_proj"):
        name = f"{p}.mlp.shared_expert.{proj}.weight"
        yield name, linear_weight(tensors, name)
    yield f"{p}.mlp.shared_expert_gate.weight", linear_weight(tensors, f"{p}.mlp.shared_expert_gate.weight")  # [H, 1]


def prepare_weights(spec: ModelSpec, tensors) -> Iterator[tuple[str, np.ndarray]]:
    """Qwen3-MoE's layout plus each sparse layer's shared expert and its sigmoid gate."""
    return qwen3_moe.prepare_weights(spec, tensors, sparse_extra=_shared_expert)
