"""Gate C, contract (mixture-of-experts part): the expert tensors agree with the model's routing.

    hyperparameters.moe: 0 < experts_per_token <= num_experts; sparse layers inside the model
    each sparse layer i (p = model.layers.i.mlp), in the manifest's weight table:
        p.gate.weight                    router [hidden, E], float32 (recorded as fp32)
        p.experts.gate_up_proj.weight    [E, 2I, hidden]   (int8/int4: .qcodes [E, 2I, hidden*bits/8],
        p.experts.down_proj.weight       [E, hidden, I]                .qscales [E, rows, cols/block])
A dense model passes these checks with nothing to check.
"""

from __future__ import annotations

from calculet.calbin.gates.context import GateContext
from calculet.calbin.validate_report import Check, Rule

TOPK = Rule("C.moe_topk", "mixture of experts: 0 < experts per token <= experts, sparse layers inside the model")
EXPERTS = Rule("C.moe_experts", "mixture of experts: every sparse layer's expert stacks have the shapes the routing implies")
ROUTER = Rule("C.moe_router", "mixture of experts: every sparse layer's router is a float32 [hidden, experts] tensor")
RULES = (TOPK, EXPERTS, ROUTER)

_BITS = {"int8": 8, "int4": 4}


def run(ctx: GateContext) -> list[Check]:
    hp = ctx.hparams()
    moe = hp.get("moe")
    if not isinstance(moe, dict):
        return [rule.check([], "not a mixture-of-experts model") for rule in RULES]
    e, k, width = moe.get("num_experts"), moe.get("experts_per_token"), moe.get("expert_intermediate_size")
    layers = list(moe.get("sparse_layers") or [])
    topk = []
    if not (isinstance(e, int) and isinstance(k, int) and 0 < k <= e):
        topk.append(f"experts_per_token {k} must be between 1 and num_experts {e}")
    outside = [i for i in layers if not (isinstance(i, int) and 0 <= i < hp.get("num_layers", 0))]
    if outside:
        topk.append(f"sparse layers {outside} lie outside 0..{hp.get('num_layers', 0) - 1}")
    if not layers:
        topk.append("no sparse layers: a mixture-of-experts model routes at least one layer")
    if topk:
        return [TOPK.check(topk, ""), EXPERTS.skip("the routing is malformed"), ROUTER.skip("the routing is malformed")]
    shapes = {t.get("name"): (list(t.get("shape", [])), t.get("dtype")) for t in ctx.section("weights").get("tensors", [])
              if isinstance(t, dict)}
    records = ctx.section("quantization").get("tensors", {})
    h = hp.get("hidden_size")
    experts, routers = [], []
    for i in layers:
        p = f"model.layers.{i}.mlp"
        experts += _stack(shapes, records, f"{p}.experts.gate_up_proj.weight", [e, 2 * width, h])
        experts += _stack(shapes, records, f"{p}.experts.down_proj.weight", [e, h, width])
        router = f"{p}.gate.weight"
        shape, dtype = shapes.get(router, (None, None))
        kind = records.get(router, {}).get("kind") if isinstance(records.get(router), dict) else None
        if shape != [h, e] or dtype != "float32" or kind not in (None, "fp32"):
            routers.append(f"{router}: {dtype} {shape} ({kind}), expected float32 {[h, e]}")
    return [TOPK.check([], f"{e} experts, top {k}, sparse layers {layers}"),
            EXPERTS.check(experts, f"{2 * len(layers)} expert stacks of {e} experts"),
            ROUTER.check(routers, f"{len(layers)} float32 routers [{h}, {e}]")]


def _stack(shapes: dict, records: dict, name: str, want: list) -> list[str]:
    record = records.get(name) if isinstance(records.get(name), dict) else {}
    bits = _BITS.get(record.get("kind"))
    if bits is None:
        got = shapes.get(name, (None, None))[0]
        return [] if got == want else [f"{name}: shape {got}, expected {want}"]
    block = record.get("block") or 0
    codes, scales = shapes.get(f"{name}.qcodes", (None,))[0], shapes.get(f"{name}.qscales", (None,))[0]
    want_codes = [*want[:2], want[2] * bits // 8]
    want_scales = [*want[:2], want[2] // block if block else None]
    problems = []
    if codes != want_codes:
        problems.append(f"{name}.qcodes: shape {codes}, expected {want_codes}")
    if scales != want_scales:
        problems.append(f"{name}.qscales: shape {scales}, expected {want_scales}")
    return problems
