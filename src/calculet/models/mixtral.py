"""Mixtral: Mistral attention with every layer's MLP replaced by routed SwiGLU experts.

Description only: `compiler/decoder.py` has no Mixtral decoder yet, so `compile` refuses it and
`calculet plan` plans it as a capacity estimate. Every layer is sparse; `intermediate_size` is the
width of one expert; `num_local_experts` experts, `num_experts_per_tok` active per token, and the
top-k router weights are always renormalised (Mixtral has no `norm_topk_prob` switch).
"""

from __future__ import annotations

from dataclasses import replace

from calculet.models import llama
from calculet.models.base import ModelSpec, MoeSpec, require_positive

MODEL_TYPES = ("mixtral",)
LAYER_NORMS = llama.LAYER_NORMS


def parse_config(config: dict) -> ModelSpec:
    dense = llama.parse_config({**config, "model_type": "mistral"})
    moe = MoeSpec(
        num_experts=require_positive(config, "num_local_experts"),
        experts_per_token=require_positive(config, "num_experts_per_tok"),
        expert_intermediate_size=dense.intermediate_size,
        sparse_layers=tuple(range(dense.num_layers)),
        norm_topk_prob=True,
    )
    return replace(dense, family="mixtral", model_type="mixtral", moe=moe)
