"""2-chip calbins keep KV rings on Gemma 3's sliding-window layers (compiler/chip_kv.py) and give the
1-chip ring calbin's greedy tokens, batched, over generations that cross the window many times; each
chip's KV bytes are its own layers' context or ring rows times its own KV heads.

The tiny Gemma 3 (tests/tiny_models.py) has layers (sliding, full, sliding), a window of 8 and 2 KV
heads; with prefill chunks of 4 and 16 its rings hold 8 + 16 = 24 rows, against a context of 128.
2-chip pp puts layers 0-1 on chip 0 and layer 2 (a ring only) on chip 1; 2-chip tp one KV head per chip.
"""

from __future__ import annotations

import numpy as np
import pytest

from calculet.calbin.manifest import read_manifest
from calculet.runtime.chips import chip_configs, open_device
from decoding import greedy_together

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
