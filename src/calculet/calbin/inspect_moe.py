"""Mixture-of-experts facts for `calculet inspect`: expert count, routing, parameters and the share
a token actually runs through, counted from the weights the calbin stores (not from a formula).

    parameters            every stored weight, in elements (int8/int4 codes counted as the values
                          they encode; the coarse-head candidate copies are not parameters)
    active per token      parameters - expert parameters * (1 - k / E): each token runs k of E experts
"""

from __future__ import annotations

import math

_BITS = {"int8": 8, "int4": 4}


def parameter_counts(weights, quantization) -> dict[str, int]:
    """Module class -> stored parameters, from the manifest's tensor table and per-tensor formats."""
    shapes = {t.name: t.shape for t in weights.tensors}
    counts: dict[str, int] = {}
    for name, record in quantization.tensors.items():
        if record.role is not None:
            continue
        bits = _BITS.get(record.kind)
        if bits is None:
            n = math.prod(shapes.get(name, (0,)))
        else:
            n = math.prod(shapes.get(f"{name}.qcodes", (0,))) * 8 // bits
        module = record.module or "other"
        counts[module] = counts.get(module, 0) + n
    return counts


def moe_facts(spec, weights, quantization) -> dict | None:
    """None for a dense model. spec: ModelSpec; weights, quantization: the manifest's sections."""
    moe = spec.moe
    if moe is None:
        return None
    counts = parameter_counts(weights, quantization)
    experts, total = counts.get("experts", 0), sum(counts.values())
    e, k = moe.num_experts, moe.experts_per_token
    return {"num_experts": e, "experts_per_token": k, "expert_intermediate_size": moe.expert_intermediate_size,
            "sparse_layers": list(moe.sparse_layers), "norm_topk_prob": moe.norm_topk_prob,
            "parameters": total, "expert_parameters": experts,
            "active_parameters_per_token": total - experts + experts * k // e}


def render(facts: dict | None) -> list[str]:
    if not facts:
        return []
    return [f"  moe: {facts['num_experts']} experts, top {facts['experts_per_token']}"
            f"{' (renormalised)' if facts['norm_topk_prob'] else ''}, expert FFN {facts['expert_intermediate_size']}, "
            f"sparse layers {facts['sparse_layers']}; {facts['parameters']:,} parameters, "
            f"{facts['active_parameters_per_token']:,} active per token ({facts['expert_parameters']:,} in experts)"]
