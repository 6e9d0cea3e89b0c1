"""The decoder stack of each architecture family, in the graph builder.

`models/` describes a family (its config keys and weight names); this module builds it:

    embed(g, spec, input_ids)                  -> x [L, S, H]
    build_layer(g, spec, i, stream, ctx)       -> stream [L, S, H]   (one decoder layer)

Llama family (Llama, Mistral, Qwen2, Qwen3), pre-norm:
    x = x + o_proj(attn(rope(qk_norm?(q_proj(n))), rope(qk_norm?(k_proj(n))), v_proj(n)))   n = norm_in(x)
    x = x + down(silu(gate(m)) * up(m))                                                     m = norm_post(x)
Qwen3-MoE and Mixtral: the Qwen3 / Mistral layer, with the routed-expert block (compiler/moe.py) as the
MLP of sparse layers.
Gemma 3, four norms per layer ("sandwich"), embeddings scaled by sqrt(hidden), GELU-tanh MLP:
    x = x + post_attn_norm(o_proj(attn(...)))      attn input = input_norm(x)
    x = x + post_ffw_norm(mlp(pre_ffw_norm(x)))
Each residual add is left pending in the Stream so the next norm can fuse it (skip-norm).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from calculet.compiler import layers, moe
from calculet.errors import ModelError
from calculet.models.base import ModelSpec


def _plain_embed(g, spec: ModelSpec, input_ids: str) -> str:
    return layers.embedding(g, "model.embed_tokens.weight", input_ids, "/model/embed_tokens")


def _scaled_embed(g, spec: ModelSpec, input_ids: str) -> str:
    x = _plain_embed(g, spec, input_ids)
    scale = g.const(np.float32(spec.hidden_size ** 0.5), np.float32)
    return g.op("Mul", [x, scale], name="/model/embed_tokens/Scale")


# (graph builder, the MLP's input, its scope) -> its output: a sparse layer's expert block
SparseMlp = Callable[[object, str, str], str]


def llama_layer(g, spec: ModelSpec, i: int, stream: layers.Stream, ctx: layers.AttentionInputs,
                sparse_mlp: SparseMlp | None = None) -> layers.Stream:
    """One Llama-family layer. A sparse layer's MLP is `sparse_mlp` when given (expert parallelism: the
    chip's local experts), else every expert (compiler/moe.py)."""
    p, s = f"model.layers.{i}", f"/model/layers.{i}"
    eps = spec.rms_norm_eps
    n, stream = layers.add_norm(g, stream, f"{p}.input_layernorm.weight", eps, f"{s}/input_layernorm")
    o = layers.self_attention(g, spec, i, n, ctx)
    m, stream = layers.add_norm(g, layers.Stream(stream.x, o), f"{p}.post_attention_layernorm.weight", eps,
                                f"{s}/post_attention_layernorm")
    if spec.moe is not None and spec.moe.is_sparse(i):   # Qwen3-MoE: routed experts instead
        if sparse_mlp is not None:
            return layers.Stream(stream.x, sparse_mlp(g, m, f"{s}/moe"))
        return layers.Stream(stream.x, moe.sparse_mlp(g, spec, i, m, ctx.rows, f"{s}/moe", ctx.expert_masks))
    return layers.Stream(stream.x, layers.gated_mlp(g, m, f"{p}.mlp", "silu", f"{s}/mlp"))


def _gemma3_layer(g, spec: ModelSpec, i: int, stream: layers.Stream, ctx: layers.AttentionInputs) -> layers.Stream:
    p, s = f"model.layers.{i}", f"/model/layers.{i}"
    eps = spec.rms_norm_eps
    n, stream = layers.add_norm(g, stream, f"{p}.input_layernorm.weight", eps, f"{s}/input_layernorm")
    o = layers.self_attention(g, spec, i, n, ctx)
    o = layers.rmsnorm(g, o, f"{p}.post_attention_layernorm.weight", eps, f"{s}/post_attention_layernorm")
    m, stream = layers.add_norm(g, layers.Stream(stream.x, o), f"{p}.pre_feedforward_layernorm.weight", eps,
                                f"{s}/pre_feedforward_layernorm")
    m = layers.gated_mlp(g, m, f"{p}.mlp", "gelu_tanh", f"{s}/mlp")
    m = layers.rmsnorm(g, m, f"{p}.post_feedforward_layernorm.weight", eps, f"{s}/post_feedforward_layernorm")
    return layers.Stream(stream.x, m)


Embed = Callable[..., str]
Layer = Callable[..., layers.Stream]
# ModelSpec.family -> (embedding, one decoder layer)
DECODERS: dict[str, tuple[Embed, Layer]] = {
    "llama": (_plain_embed, llama_layer),
    "gemma3": (_scaled_embed, _gemma3_layer),
    "qwen3_moe": (_plain_embed, llama_layer),     # sparse layers' MLP: compiler/moe.py
    "mixtral": (_plain_embed, llama_layer),       # every layer sparse
    "qwen2_moe": (_plain_embed, llama_layer),     # + a shared expert per sparse layer
}


def _decoder(spec: ModelSpec) -> tuple[Embed, Layer]:
    try:
        return DECODERS[spec.family]
    except KeyError:
        raise ModelError("unsupported_architecture",
                         f"the compiler cannot build the {spec.model_type!r} family yet; it builds: "
                         f"{', '.join(sorted(DECODERS))}") from None


def require_buildable(spec: ModelSpec) -> None:
    _decoder(spec)


def embed(g, spec: ModelSpec, input_ids: str) -> str:
    return _decoder(spec)[0](g, spec, input_ids)


def build_layer(g, spec: ModelSpec, i: int, stream: layers.Stream, ctx: layers.AttentionInputs) -> layers.Stream:
    return _decoder(spec)[1](g, spec, i, stream, ctx)
