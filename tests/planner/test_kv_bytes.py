"""KV bytes per lane = (global layers x context + local layers x ring) x 2 x KV head bytes, and the
manifest's KV layout, its memory plan, the runtime's arrays and `calculet plan` all say the same.

Guards the sliding-window ring (issue 13): before it, every layer held the whole context, and
`plan` would keep pricing it that way if the two drifted apart."""

from __future__ import annotations

import json

import pytest

from calculet.calbin.manifest import read_manifest
from calculet.cli import main
from calculet.runtime.device import Device

LANES, CONTEXT, CHUNKS = 4, 64, (4, 16)   # the tiny_calbin fixture's profile
WINDOW = 8                                # the tiny gemma3's sliding window


@pytest.mark.parametrize("arch, ring, kv_dtype", [("gemma3", 8 + 16, "fp32"), ("llama", None, "fp32"),
                                                  ("gemma3", 8 + 16, "fp16"), ("llama", None, "fp16")])
def test_manifest_memory_plan_runtime_and_plan_agree_on_kv_bytes(arch, ring, kv_dtype, tiny_calbin, tiny_model_dir,
                                                                 capsys):
    """With --kv-dtype fp16 (plan --kv-dtype fp16 likewise) every figure is half the fp32 one."""
    path = tiny_calbin(arch, lanes=LANES, context=CONTEXT, chunks=CHUNKS, kv_dtype=kv_dtype)
    m = read_manifest(path)
    spec, kv = m.spec, m.kv
    size = {"fp32": 4, "fp16": 2}[kv_dtype]
    assert kv.dtype == m.memory_plan.kv.dtype == {"fp32": "float32", "fp16": "float16"}[kv_dtype]
    head_bytes = spec.num_kv_heads * spec.head_dim * size                      # one position, K or V
    local = spec.layer_types.count("sliding") if ring else 0
    per_lane = ((spec.num_layers - local) * CONTEXT + local * (ring or 0)) * 2 * head_bytes
    assert kv.ring == ring
    assert kv.bytes_per_lane == per_lane and kv.total_bytes == LANES * per_lane
    assert m.memory_plan.kv.bytes_per_lane == per_lane
    assert m.memory_plan.kv.total_bytes == sum(g.total_bytes for g in m.memory_plan.kv.groups) == LANES * per_lane
    assert sorted(i for g in m.memory_plan.kv.groups for i in g.layers) == list(range(spec.num_layers))

    device = Device()
    device.configure(device.load(path))
    try:
        assert device.lanes.nbytes == LANES * per_lane
        for i, (k, v) in enumerate(zip(device.lanes.keys, device.lanes.values)):
            assert k.shape == v.shape == kv.layer_shape(i)
            assert k.dtype == v.dtype == kv.dtype
        assert device.program.max_rewind == (None if ring is None else ring - spec.sliding_window)
    finally:
        device.close()

    rc = main(["plan", str(tiny_model_dir(arch)), "--context", str(CONTEXT), "--lanes", str(LANES),
               "--prefill-chunk", str(max(CHUNKS)), "--device-memory", "1GiB", "--kv-dtype", kv_dtype, "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    plan = json.loads(out)
    assert not any("planning assumption" in n for n in plan["assumptions"])   # fp32 and fp16 are built
    assert plan["kv"]["bytes_total"] == plan["budget"]["kv_bytes"] == LANES * per_lane
    assert plan["kv"]["bytes_per_lane_per_chip"] == per_lane
    assert plan["kv"]["ring"] == ring


def test_default_model_kv_per_lane_before_and_after_the_ring():
    """The figures quoted in the docs: Gemma 3 270M, 3 global + 15 local layers, 1 KV head x 256, fp32.
    Full context everywhere was 18 x C x 2 KiB per lane; with rings of 512 + 128 it is 3 x C + 15 x 640."""
    from calculet.compiler.kv_layout import kv_layout
    from calculet.models import family_for
    from calculet.sources.resolve import load_config

    config = load_config(None).config
    spec = family_for(config).parse_config(config)
    assert (spec.num_layers, spec.layer_types.count("sliding"), spec.sliding_window) == (18, 15, 512)
    for context, before_mib, after_mib in ((1024, 36, 24.75), (32768, 1152, 210.75)):
        ring = kv_layout(spec, 8, context, (16, 128), True)
        full = kv_layout(spec, 8, context, (16, 128), True, rings=False)
        assert full.bytes_per_lane == before_mib * 2**20
        assert ring.bytes_per_lane == (3 * context + 15 * 640) * 2 * 256 * 4 == after_mib * 2**20


@pytest.mark.parametrize("partition", ["pp", "tp"])
def test_plan_with_chips_prices_the_rings_compile_chips_build(tiny_calbin, tiny_model_dir, capsys, partition):
    """Guards the kvring x chips merge: compile --chips 2 keeps the sliding-window layers' rings, so
    plan --chips 2 (with and without --partition) prices them too, the total and each chip's share."""
    path = tiny_calbin("gemma3", lanes=LANES, context=CONTEXT, chunks=CHUNKS, chips=2, partition=partition)
    compiled = read_manifest(path)
    argv = ["plan", str(tiny_model_dir("gemma3")), "--context", str(CONTEXT), "--lanes", str(LANES),
            "--prefill-chunk", str(max(CHUNKS)), "--device-memory", "1GiB", "--chips", "2", "--json"]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    plan = json.loads(out)
    ring = WINDOW + max(CHUNKS)
    assert plan["kv"]["ring"] == compiled.kv.ring == ring
    rows = sum(CONTEXT if t == "full" else ring for t in compiled.spec.layer_types)
    assert plan["kv"]["bytes_total"] == compiled.kv.total_bytes == LANES * 2 * rows \
        * compiled.spec.num_kv_heads * compiled.spec.head_dim * 4
    rc = main(argv + ["--partition", partition])
    out, err = capsys.readouterr()
    assert rc == 0, err
    chips = json.loads(out)["partition"]["chips"]
    assert [c["kv_bytes"] for c in chips] == [read_manifest(path / c.folder).kv.total_bytes
                                              for c in compiled.partition.chips]
