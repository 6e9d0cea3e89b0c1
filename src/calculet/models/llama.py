"""Llama family: Llama, Mistral, Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm).

This module describes the family (config keys, weight names and layouts); `compiler/decoder.py`
builds its layers.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from calculet.errors import ModelError
from calculet.models.base import ModelSpec, RopeSpec, eos_ids, get_tensor, layer_projection_weights, require_positive

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
LAYER_NORMS = ("input_layernorm", "post_attention_layernorm")  # per layer, in the order prepare_weights yields them


def parse_config(config: dict) -> ModelSpec:
    model_type = config["model_type"]
    hidden = require_positive(config, "hidden_size")
    heads = require_positive(config, "num_attention_heads")
    head_dim = int(config.get("head_dim") or hidden // heads)
    layers_n = require_positive(config, "num_hidden_layers")
    rope = RopeSpec.from_hf(config.get("rope_parameters") or config.get("rope_scaling"), config.get("rope_theta"))
    window = config.get("sliding_window") if (model_type == "mistral" or config.get("use_sliding_window")) else None
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ModelError("unsupported_activation", f"hidden_act {act!r} is not supported for {model_type}; supported: silu")
    return ModelSpec(
        family="llama",
        model_type=model_type,
        vocab_size=require_positive(config, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=require_positive(config, "intermediate_size"),
        num_layers=layers_n,
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        layer_types=tuple("sliding" if window else "full" for _ in range(layers_n)),
        rope_full=rope,
        rope_sliding=rope if window else None,
        sliding_window=int(window) if window else None,
        attn_scale=head_dim ** -0.5,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
        qk_norm=model_type == "qwen3",
        max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
        bos_token_id=config.get("bos_token_id"),
        eos_token_ids=eos_ids(config),
        pad_token_id=config.get("pad_token_id"),
    )


def prepare_weights(spec: ModelSpec, tensors) -> Iterator[tuple[str, np.ndarray]]:
    """HF tensors -> initializers: Linear weights transposed to [in, out]; norms as they are."""
    yield "model.embed_tokens.weight", get_tensor(tensors, "model.embed_tokens.weight")
    for i in range(spec.num_layers):
        p = f"model.layers.{i}"
        for norm in LAYER_NORMS:
            yield f"{p}.{norm}.weight", get_tensor(tensors, f"{p}.{norm}.weight")
        yield from layer_projection_weights(spec, tensors, p)
    yield "model.norm.weight", get_tensor(tensors, "model.norm.weight")
    if not spec.tie_word_embeddings:
        yield "lm_head.weight", get_tensor(tensors, "lm_head.weight")  # [V, H], used with transB

