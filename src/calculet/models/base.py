"""The typed model description every architecture family produces from a Hugging Face config.

A family module (one file per family in this package) exposes:
- `MODEL_TYPES`: the Hugging Face `model_type` strings it accepts;
- `parse_config(config: dict) -> ModelSpec`: hyperparameters, validated;
- `LAYER_NORMS`: the norm weights of one layer, in order (`compiler/weight_plan.py` lists them);
- `prepare_weights(spec, tensors) -> dict[str, np.ndarray]`: HF tensors -> the graph's initializers;
- `build_layer(g, spec, i, x, attn) -> str`: one decoder layer in the graph builder.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from calculet.errors import ModelError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeSpec:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    # llama3 only
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self):
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ModelError("unsupported_rope", f"rope_type {self.rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
        if self.theta <= 0:
            raise ModelError("bad_config", f"rope theta must be > 0, got {self.theta}")

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """float32 [head_dim/2], computed in float32 like the reference."""
        exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
        inv = (np.float32(1.0) / np.power(np.float32(self.theta), exponent)).astype(np.float32)
        if self.rope_type == "linear":
            inv = inv / np.float32(self.factor)
        elif self.rope_type == "llama3":
            low_wavelen = self.original_max_position_embeddings / self.low_freq_factor
            high_wavelen = self.original_max_position_embeddings / self.high_freq_factor
            wavelen = 2 * np.pi / inv
            scaled = np.where(wavelen > low_wavelen, inv / self.factor, inv)
            smooth = (self.original_max_position_embeddings / wavelen - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor)
            smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
            medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
            inv = np.where(medium, smoothed, scaled).astype(np.float32)
        return inv.astype(np.float32)

    def cos_sin(self, head_dim: int, positions: int) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin caches float32 [positions, head_dim/2] (rotate-half layout)."""
        freqs = np.arange(positions, dtype=np.float32)[:, None] * self.inv_freq(head_dim)[None, :]
        return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)

    @staticmethod
    def from_hf(params: dict | None, fallback_theta: float | None) -> "RopeSpec":
        """Read transformers-5 `rope_parameters` (or older `rope_scaling` + `rope_theta`)."""
        params = dict(params or {})
        theta = params.get("rope_theta", fallback_theta)
        if theta is None:
            raise ModelError("bad_config", "config has no rope_theta (nor rope_parameters.rope_theta)")
        rope_type = params.get("rope_type", params.get("type", "default")) or "default"
        return RopeSpec(
            theta=float(theta),
            rope_type=rope_type,
            factor=float(params.get("factor", 1.0)),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
        )


@dataclass(frozen=True)
class MoeSpec:
    """The routed-expert part of a mixture-of-experts family (Hugging Face key names in comments)."""
    num_experts: int                      # num_experts / num_local_experts: routed experts, all resident
    experts_per_token: int                # num_experts_per_tok: top-k experts each token runs through
    expert_intermediate_size: int         # moe_intermediate_size (mixtral: intermediate_size)
    sparse_layers: tuple[int, ...]        # layers whose MLP is the expert block; the rest are dense
    norm_topk_prob: bool = True           # renormalise the top-k router probabilities to sum to 1
    shared_expert_intermediate_size: int = 0   # qwen2_moe: one always-on expert (0: none)

    def __post_init__(self):
        if self.num_experts < 1 or self.expert_intermediate_size < 1:
            raise ModelError("bad_config", f"num_experts ({self.num_experts}) and moe_intermediate_size "
                             f"({self.expert_intermediate_size}) must be > 0")
        if not 0 < self.experts_per_token <= self.num_experts:
            raise ModelError("bad_config", f"num_experts_per_tok ({self.experts_per_token}) must be between 1 "
                             f"and num_experts ({self.num_experts})")

    def is_sparse(self, layer: int) -> bool:
        return layer in self.sparse_layers


@dataclass(frozen=True)
class ModelSpec:
    family: str                 # the module in calculet.models that builds it
    model_type: str             # Hugging Face model_type
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    layer_types: tuple[str, ...]      # "full" | "sliding", one per layer
    rope_full: RopeSpec
    rope_sliding: RopeSpec | None
    sliding_window: int | None
    attn_scale: float
    tie_word_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    pad_token_id: int | None = None
    moe: MoeSpec | None = None        # mixture-of-experts families only

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ModelError("bad_config", f"{name} must be > 0, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelError("bad_config", f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads ({self.num_kv_heads})")
        if len(self.layer_types) != self.num_layers:
            raise ModelError("bad_config", f"layer_types has {len(self.layer_types)} entries, expected num_hidden_layers = {self.num_layers}")
        if "sliding" in self.layer_types and not self.sliding_window:
            raise ModelError("bad_config", "sliding-window layers need sliding_window > 0")
        if self.moe and any(not 0 <= i < self.num_layers for i in self.moe.sparse_layers):
            raise ModelError("bad_config", f"MoE layer indices must lie in 0..{self.num_layers - 1}, "
                             f"got {list(self.moe.sparse_layers)}")

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> "ModelSpec":
        """The inverse of `to_json` (a calbin manifest's `model.hyperparameters`)."""
        moe = d.get("moe")
        return ModelSpec(**{
            **d,
            "layer_types": tuple(d["layer_types"]),
            "rope_full": RopeSpec(**d["rope_full"]),
            "rope_sliding": None if d.get("rope_sliding") is None else RopeSpec(**d["rope_sliding"]),
            "eos_token_ids": tuple(d.get("eos_token_ids", ())),
            "moe": None if moe is None else MoeSpec(**{**moe, "sparse_layers": tuple(moe["sparse_layers"])}),
        })


def require(config: dict, key: str, source: str = "config.json"):
    if key not in config or config[key] is None:
        raise ModelError("missing_config_key", f"{source} has no {key!r}, which this architecture needs")
    return config[key]


def require_positive(config: dict, key: str, source: str = "config.json") -> int:
    """A key that must be a whole number > 0 (checked before anything is derived from it)."""
    value = require(config, key, source)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelError("bad_config", f"{source}: {key} must be a whole number > 0, got {value!r}")
    return value


def eos_ids(config: dict) -> tuple[int, ...]:
    eos = config.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def linear_weight(tensors, name: str) -> np.ndarray:
    """HF Linear [out, in] -> MatMul right operand [in, out], contiguous float32."""
    return np.ascontiguousarray(get_tensor(tensors, name).T, dtype=np.float32)


def layer_projection_weights(spec: "ModelSpec", tensors, prefix: str, norm=None, mlp: bool = True):
    """One layer's attention and MLP initializers, shared by the families: q/k/v/o and gate/up/down
    as [in, out], q/k/v biases when the spec has them, and q/k norms (through `norm`, which applies a
    family's weight convention) when it has those. `mlp=False` leaves the dense MLP out (a
    mixture-of-experts layer brings its own)."""
    norm = norm or get_tensor
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        yield f"{prefix}.self_attn.{proj}.weight", linear_weight(tensors, f"{prefix}.self_attn.{proj}.weight")
    if spec.qkv_bias:
        for proj in ("q_proj", "k_proj", "v_proj"):
            yield f"{prefix}.self_attn.{proj}.bias", get_tensor(tensors, f"{prefix}.self_attn.{proj}.bias")
    if spec.qk_norm:
        for which in ("q_norm", "k_norm"):
            yield f"{prefix}.self_attn.{which}.weight", norm(tensors, f"{prefix}.self_attn.{which}.weight")
    if not mlp:
        return
    for proj in ("gate_proj", "up_proj", "down_proj"):
        yield f"{prefix}.mlp.{proj}.weight", linear_weight(tensors, f"{prefix}.mlp.{proj}.weight")


def get_tensor(tensors, name: str) -> np.ndarray:
    try:
        return np.asarray(tensors[name], dtype=np.float32)
    except KeyError:
        raise ModelError("missing_tensor", f"weight {name!r} is missing from the model source") from None


def lm_head_name(spec: ModelSpec, weights) -> str:
    """The lm_head's tensor: its own (untied, or a quantized copy of a tied embedding) or the embedding."""
    if not spec.tie_word_embeddings or weights.quant("lm_head.weight") is not None:
        return "lm_head.weight"
    return "model.embed_tokens.weight"
