"""Peak activation bytes of one graph call: the one workspace formula, used by the memory plan
(`compiler/memory_plan.py`) and by `calculet plan` (per chip, for other activation dtypes).

One decoder layer's intermediates are alive at once (the graph frees a layer's tensors before the
next); for `rows = lanes × tokens` rows, with tensor-parallel shares per chip:

    hidden   3 · rows · H                      residual, normed input, partial sum
    qkv      rows · (q + 2·kv) per chip
    scores   lanes · q_heads · tokens · context, always fp32 (unfused attention: an upper bound)
    attn     rows · q per chip
    mlp      3 · rows · F per chip              gate, up, gate·up (dense layers)
    experts  3 · rows · k · F_e per chip + rows · E fp32 router logits (sparse layers)

each × the activation size except where fp32 is stated. Logits are a graph output (staging), not here.
"""

from __future__ import annotations

from calculet.models.base import ModelSpec


def _per_chip(n: int, chips: int) -> int:
    return -(-n // chips)


def workspace_bytes(spec: ModelSpec, lanes: int, tokens: int, context: int, *,
                    chips: int = 1, act_bytes: int = 4) -> int:
    a, rows, hd = act_bytes, lanes * tokens, spec.head_dim
    q_heads = _per_chip(spec.num_heads, chips)
    kv_heads = max(1, spec.num_kv_heads // chips)  # fewer KV heads than chips: each chip holds one
    hidden = 3 * rows * spec.hidden_size * a
    qkv = rows * (q_heads + 2 * kv_heads) * hd * a
    scores = lanes * q_heads * tokens * context * 4
    attn = rows * q_heads * hd * a
    moe = spec.moe
    mlp = 0
    if moe is None or len(moe.sparse_layers) < spec.num_layers:
        mlp = 3 * rows * _per_chip(spec.intermediate_size, chips) * a
    if moe is not None:
        routed = 3 * rows * moe.experts_per_token * _per_chip(moe.expert_intermediate_size, chips) * a
        mlp = max(mlp, routed + rows * moe.num_experts * 4)
    return hidden + qkv + scores + attn + mlp
