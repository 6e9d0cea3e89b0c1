"""Mixtral: Mistral's attention block with routed SwiGLU experts in every layer.

Every layer is sparse: a router [H -> E] (`num_local_experts`), softmax, top-k
(`num_experts_per_tok`), and the k weights always renormalised to sum to 1 (Mixtral has no
`norm_topk_prob` switch); each expert is a SwiGLU MLP of `intermediate_size`. The sparse block is
Qwen3-MoE's (compiler/moe.py). Checkpoints name the experts `block_sparse_moe.experts.{e}.w1`
(gate), `w3` (up) and `w2` (down); they are stored under the same graph names as Qwen3-MoE's (see
models/qwen3_moe.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import numpy as np

from calculet.models import llama, qwen3_moe
from calculet.models.base import ModelSpec, MoeSpec, get_tensor, layer_projection_weights, require_positive

MODEL_TYPES = ("mixtral",)
LAYER_NORMS = llama.LAYER_NORMS
MIXTRAL_NAMES = ("block_sparse_moe.gate.weight", "block_sparse_moe.experts.{e}.w1.weight",
                 "block_sparse_moe.experts.{e}.w3.weight", "block_sparse_moe.experts.{e}.w2.weight")


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


def prepare_weights(spec: ModelSpec, tensors) -> Iterator[tuple[str, np.ndarray]]:
    yield "model.embed_tokens.weight", get_tensor(tensors, "model.embed_tokens.weight")
    for i in range(spec.num_layers):
        p = f"model.layers.{i}"
        yield f"{p}.input_layernorm.weight", get_tensor(tensors, f"{p}.input_layernorm.weight")
        yield f"{p}.post_attention_layernorm.weight", get_tensor(tensors, f"{p}.post_attention_layernorm.weight")
        yield from layer_projection_weights(spec, tensors, p, mlp=False)
        yield from qwen3_moe.expert_weights(spec, tensors, p, MIXTRAL_NAMES)
    yield "model.norm.weight", get_tensor(tensors, "model.norm.weight")
    if not spec.tie_word_embeddings:
        yield "lm_head.weight", get_tensor(tensors, "lm_head.weight")
