"""Qwen3-MoE: the Qwen3 attention block (q/k RMSNorm, no bias) with routed SwiGLU experts.

A layer is sparse (expert MLP) when it is not in `mlp_only_layers` and (i + 1) is a multiple of
`decoder_sparse_step`; other layers keep a dense MLP of `intermediate_size`. The router is a linear
[H -> E] followed by softmax and top-k (`num_experts_per_tok`); with `norm_topk_prob` the k weights
are renormalised to sum to 1. `compiler/moe.py` builds the sparse block.

Weights of a sparse layer i (p = model.layers.i.mlp), as the graph stores them:

    p.gate.weight                     router, [H, E] (MatMul layout), always float32
    p.experts.gate_up_proj.weight     [E, 2I, H]: each expert's gate and up rows *interleaved*
                                      (row 2j = gate_j, row 2j+1 = up_j), rows = output features
    p.experts.down_proj.weight        [E, H, I]: rows = output features

Sources give the experts either one tensor per expert, as `save_pretrained` writes them
(`p.experts.{e}.{gate,up,down}_proj.weight`, HF Linear [out, in]), or stacked the way
transformers 5 holds them in memory (`p.experts.gate_up_proj` [E, 2I, H] with the I gate rows
first, `p.experts.down_proj` [E, H, I]); the GGUF source uses the stacked form.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import numpy as np

from calculet.errors import ModelError
from calculet.models import llama
from calculet.models.base import ModelSpec, MoeSpec, get_tensor, layer_projection_weights, linear_weight, require_positive

MODEL_TYPES = ("qwen3_moe",)
LAYER_NORMS = llama.LAYER_NORMS


def moe_spec(config: dict, num_layers: int) -> MoeSpec:
    step = int(config.get("decoder_sparse_step") or 1)
    dense = config.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        raise ModelError("bad_config", f"mlp_only_layers must be a list of layer indices, got {dense!r}")
    sparse = tuple(i for i in range(num_layers) if i not in set(dense) and (i + 1) % step == 0)
    # save_pretrained in transformers 5 writes `num_local_experts`; Qwen's own configs say `num_experts`
    key = "num_experts" if config.get("num_experts") is not None else "num_local_experts"
    if config.get(key) is None:
        raise ModelError("missing_config_key", "config.json has neither 'num_experts' nor 'num_local_experts', "
                         "which qwen3_moe needs")
    return MoeSpec(
        num_experts=require_positive(config, key),
        experts_per_token=require_positive(config, "num_experts_per_tok"),
        expert_intermediate_size=require_positive(config, "moe_intermediate_size"),
        sparse_layers=sparse,
        norm_topk_prob=bool(config.get("norm_topk_prob", False)),  # transformers' default
    )


def parse_config(config: dict) -> ModelSpec:
    dense = llama.parse_config({**config, "model_type": "qwen3"})
    return replace(dense, family="qwen3_moe", model_type="qwen3_moe",
                   moe=moe_spec(config, dense.num_layers))


def prepare_weights(spec: ModelSpec, tensors, sparse_extra=None) -> Iterator[tuple[str, np.ndarray]]:
    """HF tensors -> initializers: dense layers as llama's; sparse layers' router and expert stacks,
    then `sparse_extra(tensors, prefix)`'s weights when a family has more (qwen2_moe's shared expert)."""
    yield "model.embed_tokens.weight", get_tensor(tensors, "model.embed_tokens.weight")
    for i in range(spec.num_layers):
        p = f"model.layers.{i}"
        sparse = spec.moe.is_sparse(i)
        yield f"{p}.input_layernorm.weight", get_tensor(tensors, f"{p}.input_layernorm.weight")
        yield f"{p}.post_attention_layernorm.weight", get_tensor(tensors, f"{p}.post_attention_layernorm.weight")
        yield from layer_projection_weights(spec, tensors, p, mlp=not sparse)
        if sparse:
            yield from expert_weights(spec, tensors, p)
            if sparse_extra is not None:
                yield from sparse_extra(tensors, p)
    yield "model.norm.weight", get_tensor(tensors, "model.norm.weight")
    if not spec.tie_word_embeddings:
        yield "lm_head.weight", get_tensor(tensors, "lm_head.weight")  # [V, H], used with transB


# Per-expert source names: (router, gate, up, down) under model.layers.i; {e} is the expert index.
QWEN3_MOE_NAMES = ("mlp.gate.weight", "mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight",
                   "mlp.experts.{e}.down_proj.weight")


def expert_weights(spec: ModelSpec, tensors, p: str, names: tuple[str, str, str, str] = QWEN3_MOE_NAMES
                   ) -> Iterator[tuple[str, np.ndarray]]:
    """One sparse layer (p = model.layers.i): router [H, E], gate/up stack [E, 2I, H] interleaved,
    down stack [E, H, I], under the graph's names (p.mlp.gate.weight, p.mlp.experts.*). `names` are
    the source's per-expert names; transformers 5's stacked form is read under p.mlp.* whatever they are."""
    m = spec.moe
    e_n, h, i_n = m.num_experts, spec.hidden_size, m.expert_intermediate_size
    router_name = f"{p}.{names[0]}" if f"{p}.{names[0]}" in tensors else f"{p}.mlp.gate.weight"
    router = linear_weight(tensors, router_name)
    _check(router, (h, e_n), f"{router_name} (transposed)")
    yield f"{p}.mlp.gate.weight", router
    if f"{p}.mlp.experts.gate_up_proj" in tensors:
        both = _checked(tensors, f"{p}.mlp.experts.gate_up_proj", (e_n, 2 * i_n, h))
        gate, up = both[:, :i_n], both[:, i_n:]
        down = _checked(tensors, f"{p}.mlp.experts.down_proj", (e_n, h, i_n))
    else:
        def stack(name: str, shape: tuple[int, int]) -> np.ndarray:
            return np.stack([_checked(tensors, f"{p}.{name.format(e=e)}", shape) for e in range(e_n)])

        gate, up, down = stack(names[1], (i_n, h)), stack(names[2], (i_n, h)), stack(names[3], (h, i_n))
    yield f"{p}.mlp.experts.gate_up_proj.weight", np.ascontiguousarray(np.stack([gate, up], axis=2).reshape(e_n, 2 * i_n, h))
    yield f"{p}.mlp.experts.down_proj.weight", np.ascontiguousarray(down)


def _checked(tensors, name: str, shape: tuple[int, ...]) -> np.ndarray:
    array = get_tensor(tensors, name)
    _check(array, shape, name)
    return array


def _check(array: np.ndarray, shape: tuple[int, ...], name: str) -> None:
    if tuple(array.shape) != shape:
        raise ModelError("bad_tensor_shape", f"weight {name!r} has shape {list(array.shape)}, the config implies {list(shape)}")
