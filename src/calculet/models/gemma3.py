"""Gemma 3 text: sliding-window (local) and global layers with their own RoPE bases, q/k norm,
four norms per layer ("sandwich"), embeddings scaled by sqrt(hidden), GELU-tanh MLP, tied lm_head.

`compiler/decoder.py` builds its layers. Gemma's RMSNorm multiplies by (1 + w); the +1 is folded into the weight at compile time.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from calculet.errors import ModelError
from calculet.models.base import ModelSpec, RopeSpec, eos_ids, get_tensor, layer_projection_weights, require_positive

MODEL_TYPES = ("gemma3_text", "gemma3")

LAYER_NORMS = (  # per layer, in the order prepare_weights yields them
    "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def _layer_types(config: dict, n: int) -> tuple[str, ...]:
    types = config.get("layer_types")
    if types is None:
        pattern = int(config.get("sliding_window_pattern") or config.get("_sliding_window_pattern") or 6)
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]
    mapping = {"full_attention": "full", "sliding_attention": "sliding"}
    try:
        return tuple(mapping[t] for t in types)
    except KeyError as exc:
        raise ModelError("bad_config", f"layer_types entry {exc.args[0]!r} is not one of {sorted(mapping)}") from None


def parse_config(config: dict) -> ModelSpec:
    if config.get("model_type") == "gemma3":  # multimodal wrapper: take its text part
        config = {**config.get("text_config", {}), "model_type": "gemma3_text"}
    n = require_positive(config, "num_hidden_layers")
    params = config.get("rope_parameters")
    if params and "full_attention" in params:
        rope_full = RopeSpec.from_hf(params["full_attention"], None)
        rope_local = RopeSpec.from_hf(params["sliding_attention"], None)
    else:
        rope_full = RopeSpec.from_hf(config.get("rope_scaling"), config.get("rope_theta", 1_000_000.0))
        rope_local = RopeSpec(theta=float(config.get("rope_local_base_freq", 10_000.0)))
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if config.get(key):
            raise ModelError("unsupported_config", f"{key}={config[key]} is not supported for gemma3 (expected null)")
    act = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh":
        raise ModelError("unsupported_activation", f"hidden_activation {act!r} is not supported; supported: gelu_pytorch_tanh")
    head_dim = int(config.get("head_dim", 256))
    return ModelSpec(
        family="gemma3",
        model_type="gemma3_text",
        vocab_size=require_positive(config, "vocab_size"),
        hidden_size=require_positive(config, "hidden_size"),
        intermediate_size=require_positive(config, "intermediate_size"),
        num_layers=n,
        num_heads=require_positive(config, "num_attention_heads"),
        num_kv_heads=require_positive(config, "num_key_value_heads"),
        head_dim=head_dim,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        layer_types=_layer_types(config, n),
        rope_full=rope_full,
        rope_sliding=rope_local,
        sliding_window=require_positive(config, "sliding_window"),
        attn_scale=float(config.get("query_pre_attn_scalar", head_dim)) ** -0.5,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        qkv_bias=bool(config.get("attention_bias", False)),
        qk_norm=True,
        max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
        bos_token_id=config.get("bos_token_id"),
        eos_token_ids=eos_ids(config),
        pad_token_id=config.get("pad_token_id"),
    )


def _norm(tensors, name: str) -> np.ndarray:
    return (1.0 + get_tensor(tensors, name)).astype(np.float32)


def prepare_weights(spec: ModelSpec, tensors) -> Iterator[tuple[str, np.ndarray]]:
    yield "model.embed_tokens.weight", get_tensor(tensors, "model.embed_tokens.weight")
    for i in range(spec.num_layers):
        p = f"model.layers.{i}"
        for norm in LAYER_NORMS:
            yield f"{p}.{norm}.weight", _norm(tensors, f"{p}.{norm}.weight")
        yield from layer_projection_weights(spec, tensors, p, norm=_norm)
    yield "model.norm.weight", _norm(tensors, "model.norm.weight")
    if not spec.tie_word_embeddings:
        yield "lm_head.weight", get_tensor(tensors, "lm_head.weight")

