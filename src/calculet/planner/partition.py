"""`calculet plan --chips N --partition pp|tp|ep`: what compile would put on each chip and what crossing
chips costs per step, from the compiler's own rules (plan = compile):

- per-chip weights: `compiler/partition.planned_chip_weights` (the weight plan of the chip's spec,
  placed by the same rule compile checks its chip stores against), laid out as weights.bin is;
- per-chip KV: `compiler/chip_kv.chip_kv_layout`: the chip's layers (pp), KV heads (tp, replicated
  below the chip count), or all of it (ep: attention replicated), with the sliding-window layers' rings
  of window + prefill chunk rows as compile builds them;
- per-chip experts (ep): [c E/P, (c+1) E/P) of each sparse layer;
- collectives: the schedule compile writes for a decode step over all lanes and for one prefill
  chunk (`compiler/partition.schedule_for`), priced by `calbin/partition.collective_bytes`, the
  formula the runtime's `Collectives` counts with;
- link time (with --link-bandwidth and --link-latency): calls x latency + bytes / bandwidth.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from calculet.calbin.partition import PARTITIONS
from calculet.compiler.chip_kv import chip_kv_layout, chip_layers_and_kv_heads
from calculet.compiler.partition import planned_chip_weights, schedule_for, weights_file_bytes
from calculet.errors import RequestError
from calculet.models.base import ModelSpec

_LATENCY = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ns|us|ms|s)\s*$")
_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass(frozen=True)
class Link:
    bandwidth_bytes_per_s: float      # 0: not given (no time predicted)
    latency_s: float = 0.0

    def seconds(self, calls: int, nbytes: int) -> float | None:
        if not self.bandwidth_bytes_per_s:
            return None
        return calls * self.latency_s + nbytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class ChipPlan:
    index: int
    layers: tuple[int, int]           # [first, end)
    kv_heads: int
    weights_bytes: int                # its weights.bin, as compile lays it out
    kv_bytes: int
    experts: tuple[int, int] | None = None   # ep: [first, end) routed experts of each sparse layer


@dataclass(frozen=True)
class CollectiveCost:
    graph: str                        # decode_<lanes> or prefill_<chunk>
    calls: int
    link_bytes: int                   # bytes between chips per call of that graph
    seconds: float | None             # with a link: calls x latency + bytes / bandwidth


@dataclass(frozen=True)
class PartitionPlan:
    scheme: str
    chips: tuple[ChipPlan, ...]
    decode: CollectiveCost            # one decode step over all lanes
    prefill: CollectiveCost           # one prefill chunk of one lane
    link: Link


@dataclass(frozen=True)
class _Options:
    """What planned_chip_weights reads (CompileOptions' fields)."""
    weights: str
    block_size: int
    fusions: frozenset
    context: int
    chips: int
    partition: str
    quant: tuple = ()


def plan_partition(spec: ModelSpec, scheme: str, chips: int, lanes: int, context: int, chunk: int, weights: str,
                   block_size: int, fusions: frozenset, link: Link, rings: bool = True) -> PartitionPlan:
    """`chunk`: the largest prefill chunk (it sizes the rings); `rings`: False for `compile --no-kv-ring`."""
    if scheme not in PARTITIONS:
        raise RequestError("bad_argument", f"--partition must be one of {', '.join(PARTITIONS)}, got {scheme!r}")
    if chips < 2:
        raise RequestError("bad_argument", f"--partition {scheme} needs --chips 2 or more, got {chips}")
    arrays = planned_chip_weights(spec, _Options(weights, block_size, frozenset(fusions), context, chips, scheme))
    out = []
    for c in range(chips):
        layers, _ = chip_layers_and_kv_heads(spec, scheme, chips, c)
        experts = None
        if scheme == "ep":
            from calculet.compiler.expert_parallel import chip_experts
            experts = chip_experts(spec, chips, c)
        kv = chip_kv_layout(spec, scheme, chips, c, lanes, context, (chunk,), rings)
        out.append(ChipPlan(c, (layers[0], layers[-1] + 1), kv.kv_heads, weights_file_bytes(arrays[c]), kv.total_bytes,
                            experts))
    return PartitionPlan(scheme, tuple(out), _cost(spec, scheme, chips, f"decode_{lanes}", lanes, 1, link),
                         _cost(spec, scheme, chips, f"prefill_{chunk}", 1, chunk, link), link)


def _cost(spec, scheme, chips, graph, lanes, tokens, link: Link) -> CollectiveCost:
    s = schedule_for(spec, scheme, chips, graph, lanes, tokens)
    return CollectiveCost(graph, len(s.collectives), s.link_bytes, link.seconds(len(s.collectives), s.link_bytes))


def parse_latency(text: str | None) -> float:
    """'5us', '0.2 ms', '1s' -> seconds; None -> 0."""
    if text is None:
        return 0.0
    m = _LATENCY.match(str(text))
    if not m:
        raise RequestError("bad_argument", f"--link-latency must be a number with a unit (ns, us, ms, s), "
                                           f"e.g. 5us; got {text!r}")
    return float(m.group(1)) * _SECONDS[m.group(2)]


def render(plan: PartitionPlan) -> list[str]:
    from calculet.units import human_bytes

    lines = [f"partition {plan.scheme} over {len(plan.chips)} chips (as `calculet compile --chips "
             f"{len(plan.chips)} --partition {plan.scheme}` writes it)"]
    for c in plan.chips:
        experts = "" if c.experts is None else f", experts {c.experts[0]}..{c.experts[1] - 1}"
        lines.append(f"  chip {c.index}: layers {c.layers[0]}..{c.layers[1] - 1}, {c.kv_heads} KV head(s){experts}; "
                     f"weights {human_bytes(c.weights_bytes)} ({c.weights_bytes:,} B), KV {human_bytes(c.kv_bytes)}")
    for cost in (plan.decode, plan.prefill):
        time = "" if cost.seconds is None else f", {cost.seconds * 1e6:.1f} us on the link"
        lines.append(f"  {cost.graph}: {cost.calls} collectives, {cost.link_bytes:,} B between chips{time}")
    if plan.link.bandwidth_bytes_per_s:
        lines.append(f"  link: {human_bytes(int(plan.link.bandwidth_bytes_per_s))}/s, latency "
                     f"{plan.link.latency_s * 1e6:.2f} us per collective")
    return lines
