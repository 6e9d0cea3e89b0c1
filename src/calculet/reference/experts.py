"""Expert tensors for the transformers reference: per-expert names -> the stacked parameters.

transformers 5 holds a Qwen3-MoE layer's experts as two stacked parameters,
`mlp.experts.gate_up_proj` [E, 2I, H] (the I gate rows, then the I up rows) and
`mlp.experts.down_proj` [E, H, I], while `save_pretrained` writes one tensor per expert
(`mlp.experts.{e}.{gate,up,down}_proj.weight`). A source in the per-expert form is viewed in the
stacked form here, lazily, so the reference is loaded with exactly the tensors the compiler read.
"""

from __future__ import annotations

import re

import numpy as np

from calculet.sources.base import LazyTensors

_STACKED = re.compile(r"^(?P<p>.+\.mlp\.experts)\.(?P<which>gate_up_proj|down_proj)$")


def stacked_view(tensors, wanted: set[str]) -> LazyTensors | None:
    """`tensors` with every stacked expert parameter in `wanted` that the source holds per expert
    built from those per-expert tensors (which then leave the view); None when nothing changes."""
    loaders = {name: (lambda n=name: tensors[n]) for name in tensors}
    shape_of = getattr(tensors, "shape", None)
    shapes = {name: tuple(shape_of(name)) if shape_of else tuple(tensors[name].shape) for name in tensors}
    changed = False
    for name in sorted(wanted - set(tensors)):
        m = _STACKED.match(name)
        if m is None:
            continue
        prefix, which = m["p"], m["which"]
        members = (("gate_proj", "up_proj") if which == "gate_up_proj" else ("down_proj",))
        count = len({k for k in tensors if k.startswith(prefix + ".") and k.endswith(f".{members[0]}.weight")})
        if count == 0:
            continue
        parts = [[f"{prefix}.{e}.{mem}.weight" for e in range(count)] for mem in members]
        if any(p not in tensors for group in parts for p in group):
            continue  # leave it missing: the strict loader says which tensors are absent
        loaders[name] = (lambda groups=parts: np.stack([np.concatenate([tensors[n] for n in names], axis=0)
                                                         for names in zip(*groups)]))
        first = [shapes[group[0]] for group in parts]
        shapes[name] = (count, sum(s[0] for s in first), first[0][1])
        for group in parts:
            for p in group:
                loaders.pop(p), shapes.pop(p)
        changed = True
    return LazyTensors(loaders, shapes) if changed else None
