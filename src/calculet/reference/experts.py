"""Expert tensors for the transformers reference: checkpoint names -> the parameters in memory.

transformers 5 holds a MoE layer (Qwen3-MoE, Mixtral) as `mlp.gate.weight` (router) and two stacked
parameters, `mlp.experts.gate_up_proj` [E, 2I, H] (the I gate rows, then the I up rows) and
`mlp.experts.down_proj` [E, H, I], while `save_pretrained` writes the checkpoint's own names, one
tensor per expert:

    qwen3_moe   mlp.experts.{e}.gate_proj / up_proj / down_proj            router mlp.gate
    mixtral     block_sparse_moe.experts.{e}.w1 / w3 / w2                  router block_sparse_moe.gate

Such a source is viewed in the in-memory form here, lazily, so the reference is loaded with exactly
the tensors the compiler read.
"""

from __future__ import annotations

import re

import numpy as np

from calculet.sources.base import LazyTensors

_WANTED = re.compile(r"^(?P<layer>.+)\.mlp\.(?:experts\.(?P<stack>gate_up_proj|down_proj)|gate\.weight)$")
# per-expert prefix under the layer -> {stacked parameter: member names, in order}
_SCHEMES = {"mlp.experts": {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)},
            "block_sparse_moe.experts": {"gate_up_proj": ("w1", "w3"), "down_proj": ("w2",)}}
_ROUTERS = ("block_sparse_moe.gate.weight",)


def stacked_view(tensors, wanted: set[str]) -> LazyTensors | None:
    """`tensors` with every expert parameter in `wanted` that the source holds under checkpoint names
    built from those tensors (which then leave the view); None when nothing changes."""
    loaders = {name: (lambda n=name: tensors[n]) for name in tensors}
    shape_of = getattr(tensors, "shape", None)
    shapes = {name: tuple(shape_of(name)) if shape_of else tuple(tensors[name].shape) for name in tensors}
    changed = False
    for name in sorted(wanted - set(tensors)):
        m = _WANTED.match(name)
        if m is None:
            continue
        layer = m["layer"]
        if m["stack"] is None:                                   # the router under another name
            source = next((f"{layer}.{r}" for r in _ROUTERS if f"{layer}.{r}" in loaders), None)
            if source is not None:
                loaders[name], shapes[name] = loaders.pop(source), shapes.pop(source)
                changed = True
            continue
        parts = _members(tensors, layer, m["stack"])
        if parts is None:
            continue  # leave it missing: the strict loader says which tensors are absent
        loaders[name] = (lambda groups=parts: np.stack([np.concatenate([tensors[n] for n in names], axis=0)
                                                         for names in zip(*groups)]))
        first = [shapes[group[0]] for group in parts]
        shapes[name] = (len(parts[0]), sum(s[0] for s in first), first[0][1])
        for group in parts:
            for p in group:
                loaders.pop(p), shapes.pop(p)
        changed = True
    return LazyTensors(loaders, shapes) if changed else None


def _members(tensors, layer: str, stack: str) -> list[list[str]] | None:
    """Per member (gate, up / down), the per-expert names of the first scheme the source uses fully."""
    for prefix, stacks in _SCHEMES.items():
        members = stacks[stack]
        first = re.compile(rf"^{re.escape(layer)}\.{re.escape(prefix)}\.(\d+)\.{members[0]}\.weight$")
        count = sum(1 for k in tensors if first.match(k))
        if count == 0:
            continue
        parts = [[f"{layer}.{prefix}.{e}.{mem}.weight" for e in range(count)] for mem in members]
        if all(p in tensors for group in parts for p in group):
            return parts
    return None
