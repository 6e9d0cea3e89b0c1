"""Qwen3-MoE: the Qwen3 attention block (q/k RMSNorm, no bias) with routed SwiGLU experts.

A layer is sparse (expert MLP) when it is not in `mlp_only_layers` and (i + 1) is a multiple of
`decoder_sparse_step`; other layers keep a dense MLP of `intermediate_size`. The router is a linear
[H -> E] followed by softmax and top-k (`num_experts_per_tok`); with `norm_topk_prob` the k weights
are renormalised to sum to 1.
"""

from __future__ import annotations

from dataclasses import replace

from calculet.errors import ModelError
from calculet.models import llama
from calculet.models.base import ModelSpec, MoeSpec, require_positive

MODEL_TYPES = ("qwen3_moe",)
LAYER_NORMS = llama.LAYER_NORMS


def moe_spec(config: dict, num_layers: int) -> MoeSpec:
    step = int(config.get("decoder_sparse_step") or 1)
    dense = config.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        raise ModelError("bad_config", f"mlp_only_layers must be a list of layer indices, got {dense!r}")
    sparse = tuple(i for i in range(num_layers) if i not in set(dense) and (i + 1) % step == 0)
    return MoeSpec(
        num_experts=require_positive(config, "num_experts"),
        experts_per_token=require_positive(config, "num_experts_per_tok"),
        expert_intermediate_size=require_positive(config, "moe_intermediate_size"),
        sparse_layers=sparse,
        norm_topk_prob=bool(config.get("norm_topk_prob", False)),  # transformers' default
    )


def parse_config(config: dict) -> ModelSpec:
    dense = llama.parse_config({**config, "model_type": "qwen3"})
    return replace(dense, family="qwen3_moe", model_type="qwen3_moe",
                   moe=moe_spec(config, dense.num_layers))
