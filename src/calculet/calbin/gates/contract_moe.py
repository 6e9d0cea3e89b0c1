"""Gate C, contract (mixture-of-experts part): the expert tensors agree with the model's routing.

    hyperparameters.moe: 0 < experts_per_token <= num_experts; sparse layers inside the model
    each sparse layer i (p = model.layers.i.mlp), in the manifest's weight table:
        p.gate.weight                    router [hidden, E], float32 (recorded as fp32)
        p.experts.gate_up_proj.weight    [E, 2I, hidden]   (int8/int4: .qcodes [E, 2I, hidden*bits/8],
        p.experts.down_proj.weight       [E, hidden, I]                .qscales [E, rows, cols/block])
A dense model passes these checks with nothing to check. A calbin split over chips keeps its weight
table in the chips' manifests: the table checked is theirs, an expert stack sharded by `--partition
ep` counted as the sum of the chips' experts.
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
    m = ctx.manifest
    hp = m.model.hyperparameters
    moe = hp.moe
    if moe is None:
        return [rule.check([], "not a mixture-of-experts model") for rule in RULES]
    e, k, width = moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size
    layers = list(moe.sparse_layers)
    topk = []
    if not 0 < k <= e:  # ModelSpec refuses these when the manifest parses; kept for a hand-built Manifest
        topk.append(f"experts_per_token {k} must be between 1 and num_experts {e}")
    outside = [i for i in layers if not 0 <= i < hp.num_layers]
    if outside:
        topk.append(f"sparse layers {outside} lie outside 0..{hp.num_layers - 1}")
    if not layers:
        topk.append("no sparse layers: a mixture-of-experts model routes at least one layer")
    if topk:
        return [TOPK.check(topk, ""), EXPERTS.skip("the routing is malformed"), ROUTER.skip("the routing is malformed")]
    shapes = _weight_shapes(ctx)
    records = m.quantization.tensors
    h = hp.hidden_size
    experts, routers = [], []
    for i in layers:
        p = f"model.layers.{i}.mlp"
        experts += _stack(shapes, records, f"{p}.experts.gate_up_proj.weight", [e, 2 * width, h])
        experts += _stack(shapes, records, f"{p}.experts.down_proj.weight", [e, h, width])
        router = f"{p}.gate.weight"
        shape, dtype = shapes.get(router, (None, None))
        kind = records[router].kind if router in records else None
        if shape != [h, e] or dtype != "float32" or kind not in (None, "fp32"):
            routers.append(f"{router}: {dtype} {shape} ({kind}), expected float32 {[h, e]}")
    return [TOPK.check([], f"{e} experts, top {k}, sparse layers {layers}"),
            EXPERTS.check(experts, f"{2 * len(layers)} expert stacks of {e} experts"),
            ROUTER.check(routers, f"{len(layers)} float32 routers [{h}, {e}]")]


def _weight_shapes(ctx: GateContext) -> dict[str, tuple[list, str]]:
    """name -> (shape, dtype) of the calbin's weights (a partitioned calbin's: from its chips; a chip
    manifest that does not read is gate P's to report)."""
    m = ctx.manifest
    if m.partition is None:
        return {t.name: (list(t.shape), t.dtype) for t in m.weights.tensors}
    from calculet.calbin.gates.context import inside
    from calculet.calbin.manifest import read_manifest

    shapes: dict[str, tuple[list, str]] = {}
    for chip in m.partition.chips:
        try:
            if not inside(ctx.folder, chip.folder):
                continue
            tensors = read_manifest(ctx.folder / chip.folder).weights.tensors
        except Exception:  # noqa: BLE001 - reported by gate P
            continue
        for t in tensors:
            if t.name in shapes and t.name in m.partition.sharded and ".mlp.experts." in t.name:
                have = shapes[t.name][0]
                shapes[t.name] = ([have[0] + t.shape[0], *have[1:]], t.dtype)
            else:
                shapes.setdefault(t.name, (list(t.shape), t.dtype))
    return shapes


def _stack(shapes: dict, records: dict, name: str, want: list) -> list[str]:
    record = records.get(name)
    bits = _BITS.get(record.kind) if record is not None else None
    if bits is None:
        got = shapes.get(name, (None, None))[0]
        return [] if got == want else [f"{name}: shape {got}, expected {want}"]
    block = record.block
    codes, scales = shapes.get(f"{name}.qcodes", (None,))[0], shapes.get(f"{name}.qscales", (None,))[0]
    want_codes = [*want[:2], want[2] * bits // 8]
    want_scales = [*want[:2], want[2] // block if block else None]
    problems = []
    if codes != want_codes:
        problems.append(f"{name}.qcodes: shape {codes}, expected {want_codes}")
    if scales != want_scales:
        problems.append(f"{name}.qscales: shape {scales}, expected {want_scales}")
    return problems
