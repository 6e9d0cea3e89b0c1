"""plan = compile for partitions: per-chip weight and KV bytes equal what compile writes, and the
collective bytes per decode step and prefill chunk equal what the runtime counts."""

from __future__ import annotations

import pytest

from calculet.calbin.manifest import read_manifest
from calculet.compiler.options import FUSIONS
from calculet.errors import RequestError
from calculet.planner.partition import Link, parse_latency, plan_partition
from calculet.runtime.chips import chip_configs, open_device
from calculet.runtime.jobs import DecodeJob, PrefillJob

LANES, CONTEXT, CHUNK = 4, 64, 16


@pytest.mark.parametrize("arch, weights, scheme",
                         [(a, w, s) for a, w in [("llama", "default"), ("gemma3", "default"), ("qwen3", "int4"), ("gemma3", "fp32")]
                          for s in ("pp", "tp")]
                         + [("mixtral", "default", "ep"), ("qwen2_moe", "int4", "ep"), ("qwen3_moe", "fp32", "ep")])
def test_plan_equals_compile_and_runtime(tiny_calbin, arch, weights, scheme):
    path = tiny_calbin(arch, lanes=LANES, context=CONTEXT, chunks=(4, CHUNK), weights=weights, chips=2, partition=scheme)
    top = read_manifest(path)
    plan = plan_partition(top.spec, scheme, 2, LANES, CONTEXT, CHUNK, weights, 32, frozenset(FUSIONS),
                          Link(1e9, 2e-6))
    for chip, part in zip(plan.chips, top.partition.chips):
        m = read_manifest(path / part.folder)
        assert chip.weights_bytes == m.weights.bytes == part.weights_bytes
        assert chip.kv_bytes == m.kv.total_bytes
        if arch == "gemma3":   # its chips keep the sliding-window layers' rings (window 8 + chunk 16 rows)
            assert m.kv.ring == 8 + CHUNK and chip.kv_bytes < 2 * len(part.layers) * LANES * chip.kv_heads * CONTEXT \
                * top.spec.head_dim * 4
        assert chip.experts == part.experts        # ep: the manifest's expert ranges; None otherwise
    device = open_device(path, chip_configs(2))
    try:
        lanes = [device.lanes.allocate() for _ in range(LANES)]
        device.run(PrefillJob(lanes[0], tuple(range(3, 3 + CHUNK))), 30)
        assert device.collectives.last_step.bytes == plan.prefill.link_bytes
        assert device.collectives.last_step.calls == plan.prefill.calls
        for lane in lanes[1:]:
            device.run(PrefillJob(lane, (5, 6, 7, 8)), 30)
        device.run(DecodeJob(tuple(lanes), (9,) * LANES), 30)
        assert device.collectives.last_step.bytes == plan.decode.link_bytes
        assert device.collectives.last_step.calls == plan.decode.calls
    finally:
        device.close()
    assert plan.decode.seconds == pytest.approx(plan.decode.calls * 2e-6 + plan.decode.link_bytes / 1e9)


def test_link_and_partition_arguments_are_checked():
    assert parse_latency("5us") == pytest.approx(5e-6) and parse_latency("0.2 ms") == pytest.approx(2e-4)
    with pytest.raises(RequestError, match="ns, us, ms, s"):
        parse_latency("5 parsecs")
    assert Link(0.0).seconds(3, 100) is None


def test_plan_ep_refuses_a_dense_model_and_uneven_experts(tiny_calbin):
    dense = read_manifest(tiny_calbin("llama")).spec
    with pytest.raises(RequestError, match="--partition ep distributes the routed experts"):
        plan_partition(dense, "ep", 2, LANES, CONTEXT, CHUNK, "fp32", 32, frozenset(FUSIONS), Link(0.0))
    moe = read_manifest(tiny_calbin("mixtral")).spec
    with pytest.raises(RequestError, match="allowed --chips: 2, 4, 8"):
        plan_partition(moe, "ep", 3, LANES, CONTEXT, CHUNK, "fp32", 32, frozenset(FUSIONS), Link(0.0))
    plan = plan_partition(moe, "ep", 4, LANES, CONTEXT, CHUNK, "fp32", 32, frozenset(FUSIONS), Link(0.0))
    assert [c.experts for c in plan.chips] == [(0, 2), (2, 4), (4, 6), (6, 8)]


def test_plan_partition_renders(tiny_calbin):
    """Guards a bug: render() imported calculet.planner.units, which no longer exists, so every
    `calculet plan --partition` crashed after computing the plan."""
    from calculet.planner.partition import render

    moe = read_manifest(tiny_calbin("mixtral")).spec
    lines = render(plan_partition(moe, "ep", 2, LANES, CONTEXT, CHUNK, "fp32", 32, frozenset(FUSIONS), Link(1e9, 5e-6)))
    assert lines[0].startswith("partition ep over 2 chips") and "experts 4..7" in lines[2]
    assert any(line.strip().startswith(f"decode_{LANES}: 4 collectives") for line in lines)   # broadcast, 3 sparse layers
