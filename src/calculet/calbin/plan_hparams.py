"""The hyperparameters the capacity planner needs, read from a Hugging Face `config.json` dict.

Key names are the Hugging Face ones. Where Transformers gives a key a default, the same default
applies here (per architecture); a key with no default must be present, and its absence is named.
GGUF metadata is mapped onto these same fields by `plan_source`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from calculet.errors import RequestError


@dataclass(frozen=True)
class MoeSpec:
    num_experts: int                  # routed experts per sparse layer, all resident
    experts_per_token: int            # experts each token runs through
    expert_intermediate_size: int     # FFN width of one expert
    sparse_layers: tuple[int, ...]    # layer indices that use experts; the rest use the dense MLP

    def __post_init__(self) -> None:
        if not 0 < self.experts_per_token <= self.num_experts:
            raise RequestError("config_bad_value", f"experts per token ({self.experts_per_token}) must be "
                               f"between 1 and the expert count ({self.num_experts})")


@dataclass(frozen=True)
class ModelHParams:
    architecture: str                 # Hugging Face model_type (gemma3 text part -> gemma3_text)
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int            # dense MLP width (used by layers without experts)
    vocab_size: int
    tie_word_embeddings: bool
    norms_per_layer: int = 2          # llama: input + post-attention; gemma3: 4 (pre/post attn and FFN)
    qk_norm: bool = False             # RMSNorm over head_dim on q and k (qwen3, gemma3)
    qkv_bias: bool = False            # bias on q, k, v projections (qwen2; llama attention_bias)
    o_bias: bool = False              # bias on the output projection (llama attention_bias)
    mlp_bias: bool = False            # bias on gate/up/down (llama mlp_bias)
    max_position_embeddings: int | None = None
    sliding_window: int | None = None
    moe: MoeSpec | None = None

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "head_dim", "intermediate_size", "vocab_size", "norms_per_layer"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise RequestError("config_bad_value", f"{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise RequestError("config_bad_value", f"num_attention_heads ({self.num_attention_heads}) must "
                               f"be a multiple of num_key_value_heads ({self.num_key_value_heads})")
        if self.moe and any(not 0 <= i < self.num_hidden_layers for i in self.moe.sparse_layers):
            raise RequestError("config_bad_value", f"sparse layer indices must lie in "
                               f"0..{self.num_hidden_layers - 1}")

    def is_sparse(self, layer: int) -> bool:
        return self.moe is not None and layer in self.moe.sparse_layers


@dataclass(frozen=True)
class _Family:
    """What differs between architectures, beyond the shared Llama-style keys."""
    head_dim_default: int | None      # None: hidden_size // num_attention_heads
    tie_default: bool
    norms_per_layer: int = 2
    qk_norm: bool = False
    qkv_bias_always: bool = False     # qwen2 hard-codes q/k/v bias
    has_attention_bias_key: bool = False
    has_mlp_bias_key: bool = False
    moe: str | None = None            # "qwen3_moe" | "mixtral"
    window_needs_flag: bool = False   # qwen: sliding_window only counts when use_sliding_window


FAMILIES: dict[str, _Family] = {
    "llama": _Family(None, False, has_attention_bias_key=True, has_mlp_bias_key=True),
    "mistral": _Family(None, False),
    "mixtral": _Family(None, False, moe="mixtral"),
    "qwen2": _Family(None, False, qkv_bias_always=True, window_needs_flag=True),
    "qwen3": _Family(128, True, qk_norm=True, has_attention_bias_key=True, window_needs_flag=True),
    "qwen3_moe": _Family(128, False, qk_norm=True, has_attention_bias_key=True, moe="qwen3_moe",
                         window_needs_flag=True),
    "gemma3_text": _Family(256, True, norms_per_layer=4, qk_norm=True, has_attention_bias_key=True),
}
SUPPORTED = tuple(sorted(FAMILIES) + ["gemma3"])


class _Keys:
    """Reads typed values from a config mapping; every failure names the key and the source."""

    def __init__(self, config: Mapping[str, Any], source: str, arch: str):
        self.config, self.source, self.arch = config, source, arch

    def has(self, key: str) -> bool:
        return self.config.get(key) is not None

    def int(self, key: str, default: int | None = None) -> int:
        value = self.config.get(key)
        if value is None:
            if default is not None:
                return default
            raise RequestError("config_missing_key", f"{self.source} has no {key!r} "
                               f"(needed for the {self.arch} architecture)")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise RequestError("config_bad_value", f"{self.source}: {key!r} must be a positive "
                               f"integer, got {value!r}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.config.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise RequestError("config_bad_value", f"{self.source}: {key!r} must be true or false, "
                               f"got {value!r}")
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.config.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                  for v in value):
            raise RequestError("config_bad_value", f"{self.source}: {key!r} must be a list of layer "
                               f"indices, got {value!r}")
        return value


def hparams_from_config(config: Mapping[str, Any], source: str = "config.json") -> ModelHParams:
    """Build `ModelHParams` from a parsed Hugging Face config (dense and MoE families)."""
    if not isinstance(config, Mapping):
        raise RequestError("config_bad_value", f"{source} must hold a JSON object, "
                           f"got {type(config).__name__}")
    arch = config.get("model_type")
    if arch is None:
        raise RequestError("config_missing_key", f"{source} has no 'model_type'; supported: "
                           f"{', '.join(SUPPORTED)}")
    if arch == "gemma3":  # multimodal wrapper: plan the text decoder only
        text = config.get("text_config")
        if not isinstance(text, Mapping):
            raise RequestError("config_missing_key", f"{source} has model_type 'gemma3' but no "
                               f"'text_config' object")
        config, arch = {**text, "model_type": "gemma3_text"}, "gemma3_text"
    family = FAMILIES.get(arch)
    if family is None:
        raise RequestError("unsupported_architecture", f"{source}: model_type {arch!r} is not "
                           f"supported; supported: {', '.join(SUPPORTED)}")
    keys = _Keys(config, source, arch)
    hidden = keys.int("hidden_size")
    layers = keys.int("num_hidden_layers")
    heads = keys.int("num_attention_heads")
    head_dim = keys.int("head_dim", family.head_dim_default or max(1, hidden // heads))
    attention_bias = family.has_attention_bias_key and keys.bool("attention_bias", False)
    window = None
    if keys.has("sliding_window") and (not family.window_needs_flag
                                       or keys.bool("use_sliding_window", False)):
        window = keys.int("sliding_window")
    return ModelHParams(
        architecture=arch,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=keys.int("num_key_value_heads", heads),
        head_dim=head_dim,
        intermediate_size=keys.int("intermediate_size"),
        vocab_size=keys.int("vocab_size"),
        tie_word_embeddings=keys.bool("tie_word_embeddings", family.tie_default),
        norms_per_layer=family.norms_per_layer,
        qk_norm=family.qk_norm,
        qkv_bias=family.qkv_bias_always or attention_bias,
        o_bias=attention_bias,
        mlp_bias=family.has_mlp_bias_key and keys.bool("mlp_bias", False),
        max_position_embeddings=keys.int("max_position_embeddings", 0) or None,
        sliding_window=window,
        moe=_moe(keys, family, layers),
    )


def _moe(keys: _Keys, family: _Family, layers: int) -> MoeSpec | None:
    if family.moe == "mixtral":  # every layer routes; intermediate_size is the expert width
        return MoeSpec(keys.int("num_local_experts"), keys.int("num_experts_per_tok"),
                       keys.int("intermediate_size"), tuple(range(layers)))
    if family.moe == "qwen3_moe":
        experts = keys.int("num_experts")
        step = keys.int("decoder_sparse_step", 1)
        dense = set(keys.int_list("mlp_only_layers"))
        sparse = tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)
        return MoeSpec(experts, keys.int("num_experts_per_tok"), keys.int("moe_intermediate_size"),
                       sparse)
    return None
