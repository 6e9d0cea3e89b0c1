"""2-chip calbins keep KV rings on Gemma 3's sliding-window layers (compiler/chip_kv.py) and give the
1-chip ring calbin's greedy tokens, batched, over generations that cross the window many times; each
chip's KV bytes are its own layers' context or ring rows times its own KV heads.

The tiny Gemma 3 (tests/tiny_models.py) has layers (sliding, full, sliding), a window of 8 and 2 KV
heads; with prefill chunks of 4 and 16 its rings hold 8 + 16 = 24 rows, against a context of 128.
2-chip pp puts layers 0-1 on chip 0 and layer 2 (a ring only) on chip 1; 2-chip tp one KV head per chip,
4-chip tp the replicated one. Also: Program.max_rewind holds on chips, and ep blocks with ring layers
(on a tiny MoE whose spec is patched to have sliding-window layers: no MoE family here has them).
"""

from __future__ import annotations

import numpy as np
import pytest

from calculet.calbin.manifest import read_manifest
from calculet.runtime.chips import chip_configs, open_device
from calculet.runtime.jobs import DecodeJob, PrefillJob
from decoding import greedy_together, prefill

CONTEXT, WINDOW, RING = 128, 8, 8 + 16
PROMPTS = [(11, 3), (12, 9), (13, 17), (14, 30)]    # (seed, length): below, past the window, past the ring
STEPS = 64                                           # prompt + 64 tokens: the window crossed 8+ times


def _prompts():
    return [np.random.default_rng(s).integers(3, 300, size=n).tolist() for s, n in PROMPTS]


@pytest.fixture(scope="module")
def one_chip_tokens(tiny_calbin):
    path = tiny_calbin("gemma3", context=CONTEXT)
    assert read_manifest(path).kv.ring == RING, "the 1-chip reference has no ring; the test would not cover rings"
    device = open_device(path)
    try:
        return greedy_together(device, _prompts(), STEPS)
    finally:
        device.close()


@pytest.mark.parametrize("partition", ["pp", "tp"])
def test_two_chip_rings_give_the_one_chip_ring_tokens_batched(tiny_calbin, one_chip_tokens, partition):
    """Guards rings on chips: ring writes at row p mod 24 on each chip's own buffers (tp: its KV head;
    pp: chip 1's stage of one ring layer, which reads last_index but no total_seq_len)."""
    path = tiny_calbin("gemma3", context=CONTEXT, chips=2, partition=partition)
    device = open_device(path, chip_configs(2))
    try:
        assert device.program.max_rewind == RING - WINDOW
        assert [lanes.layout.layer_lengths for lanes in device.program.chip_lanes] == (
            [(RING, CONTEXT), (RING,)] if partition == "pp" else [(RING, CONTEXT, RING)] * 2)
        batched = greedy_together(device, _prompts(), STEPS)
        alone = greedy_together(device, _prompts()[2:3], STEPS)
    finally:
        device.close()
    assert len({t for seq in one_chip_tokens for t in seq}) > 4, "degenerate reference; the test would be weak"
    assert batched == one_chip_tokens, f"{partition}: 2-chip ring tokens differ from the 1-chip ring calbin's"
    assert alone == one_chip_tokens[2:3]


@pytest.mark.parametrize("partition", ["pp", "tp"])
def test_chip_kv_bytes_are_its_layers_rows_times_its_kv_heads(tiny_calbin, partition):
    path = tiny_calbin("gemma3", context=CONTEXT, chips=2, partition=partition)
    top = read_manifest(path)
    spec = top.spec
    for chip in top.partition.chips:
        m = read_manifest(path / chip.folder)
        kv_heads = chip.kv_heads[1] - chip.kv_heads[0]
        rows = sum(CONTEXT if spec.layer_types[i] == "full" else RING for i in chip.layers)
        want = rows * 2 * kv_heads * spec.head_dim * 4 * top.profile.lanes      # K and V, float32
        assert m.kv.total_bytes == m.memory_plan.kv.total_bytes == want
        assert m.memory_plan.total_bytes == chip_memory_total(m)
    # pp: the layers split; tp: the 2 KV heads split one per chip. Either way the chips hold the whole KV once.
    assert sum(read_manifest(path / c.folder).kv.total_bytes for c in top.partition.chips) == top.kv.total_bytes


def chip_memory_total(m) -> int:
    plan = m.memory_plan
    return plan.weights_bytes + plan.kv.total_bytes + sum(s.total_bytes for s in plan.staging)


@pytest.mark.parametrize("partition", ["pp", "tp"])
@pytest.mark.parametrize("extra, same", [(0, True), (3, False)])
def test_a_lane_cut_back_by_max_rewind_on_chips_continues_like_a_fresh_one(tiny_calbin, partition, extra, same):
    """Program.max_rewind (ring - window) holds on every chip's rings: after a padded prefill chunk and
    a decode step the lane sat out, a lane cut back by max_rewind continues like a fresh lane fed the
    same tokens; cut back 3 further, a ring no longer holds the window and the logits differ."""
    rng = np.random.default_rng(5)
    history, suffix = rng.integers(3, 300, size=60).tolist(), rng.integers(3, 300, size=20).tolist()
    device = open_device(tiny_calbin("gemma3", context=CONTEXT, chips=2, partition=partition), chip_configs(2))
    try:
        a, b, c = (device.lanes.allocate() for _ in range(3))
        prefill(device, a, history[:57])
        device.run(PrefillJob(a, tuple(history[57:60])), 30)     # 3 tokens on the 4-token graph: 1 padded
        prefill(device, b, history[:3])
        device.run(DecodeJob((b,), (5,)), 30)                    # lane a sits out: its next row is written
        k = device.lanes.length(a) - device.program.max_rewind - extra
        device.lanes.rewind(a, k)
        err = float(np.abs(prefill(device, a, suffix) - prefill(device, c, history[:k] + suffix)).max())
    finally:
        device.close()
    assert (err < 1e-4) if same else (err > 1e-3), err


def test_four_tp_chips_replicate_the_kv_head_ring(tiny_calbin, one_chip_tokens):
    """4 tp chips on 2 KV heads: each chip holds the ring of the one KV head its query head reads
    (two chips per KV head, as tp replicates KV heads without rings)."""
    path = tiny_calbin("gemma3", context=CONTEXT, chips=4, partition="tp")
    part = read_manifest(path).partition
    assert [c.kv_heads for c in part.chips] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    device = open_device(path, chip_configs(4))
    try:
        assert all(lanes.layout.kv_heads == 1 and lanes.layout.ring == RING for lanes in device.program.chip_lanes)
        assert greedy_together(device, _prompts()[1:3], STEPS) == one_chip_tokens[1:3]
    finally:
        device.close()


@pytest.mark.parametrize("arch, overrides, held", [("qwen2_moe", {}, [(0, 1, 2), (0, 1, 2)]),
                                                     ("qwen3_moe", {"mlp_only_layers": [0, 2]}, [(0, 1, 2), (0, 1)])])
def test_ep_blocks_with_ring_layers_give_the_one_chip_tokens(tmp_path, monkeypatch, arch, overrides, held):
    """No MoE family built here mixes sliding-window and full layers, so a tiny MoE's spec is patched to
    (sliding, full, sliding) with a window of 8. Qwen2-MoE (layer 0 dense): ep's block (0, 1) holds a
    ring and a full buffer, block (2,) a ring only. Qwen3-MoE with layer 2 dense: that ring layer runs in
    chip 0's final graph. The 2-chip ep calbin gives the 1-chip ring calbin's tokens; plan = compile."""
    from dataclasses import replace

    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import FUSIONS, CompileOptions
    from calculet.models import family_for
    from calculet.planner.partition import Link, plan_partition
    from tiny_models import make_tiny_model

    source = make_tiny_model(arch, tmp_path / "hf", **overrides)
    family = family_for({"model_type": arch})
    parse = family.parse_config

    def windowed(config):
        spec = parse(config)
        return replace(spec, layer_types=("sliding", "full", "sliding"), sliding_window=WINDOW, rope_sliding=spec.rope_full)

    monkeypatch.setattr(family, "parse_config", windowed)
    tokens = []
    for chips, partition in ((1, ""), (2, "ep")):
        options = CompileOptions(lanes=4, context=CONTEXT, prefill_chunks=(4, 16), golden=False, weights="fp32",
                                 chips=chips, partition=partition)
        path = compile_calbin(str(source), tmp_path / f"{chips}.calbin", options, log=lambda _m: None)
        top = read_manifest(path)
        assert top.kv.layer_lengths == (RING, CONTEXT, RING)
        if chips == 2:
            assert [c.layers for c in top.partition.chips] == held
            plan = plan_partition(top.spec, "ep", 2, 4, CONTEXT, 16, "fp32", 32, frozenset(FUSIONS), Link(0.0))
            for chip, part in zip(plan.chips, top.partition.chips):
                kv = read_manifest(path / part.folder).kv
                assert kv.layer_lengths == tuple((RING, CONTEXT, RING)[i] for i in part.layers)
                assert chip.kv_bytes == kv.total_bytes
        device = open_device(path, chip_configs(chips))
        try:
            tokens.append(greedy_together(device, _prompts(), STEPS))
        finally:
            device.close()
    assert len({t for seq in tokens[0] for t in seq}) > 4, "degenerate reference; the test would be weak"
    assert tokens[1] == tokens[0]
