"""compiler/chip_kv.py: each chip's KV layout keeps the sliding-window layers' rings, over its own
layers and KV heads; `--no-kv-ring` gives every chip the context. Figures on the embedded default model
(Gemma 3 270M: 18 layers, full attention at 5, 11 and 17, 4 query heads on 1 KV head x 256, window 512)."""

from __future__ import annotations

import pytest

from calculet.compiler.chip_kv import chip_kv_layout, host_inputs
from calculet.calbin.graphspec import DECODE, PREFILL, GraphSpec

CONTEXT, CHUNKS, LANES = 32768, (16, 128), 8
RING = 512 + 128
POSITION = 2 * 256 * 4           # K and V of one position of the one KV head, fp32


@pytest.fixture(scope="module")
def spec():
    from calculet.models import family_for
    from calculet.sources.resolve import load_config

    config = load_config(None).config
    return family_for(config).parse_config(config)


def test_default_model_on_two_tp_chips_holds_three_full_layers_and_fifteen_rings_each(spec):
    """The issue's motivating figure: at 32k a 2-chip Gemma 3 held full-context KV on all 18 layers
    (1152 MiB per lane per chip); with rings each chip holds 3 x 32768 + 15 x 640 rows of its
    replicated KV head (210.75 MiB per lane)."""
    for c in range(2):
        kv = chip_kv_layout(spec, "tp", 2, c, LANES, CONTEXT, CHUNKS)
        assert kv.kv_heads == 1 and kv.ring == RING and len(kv.ring_layers) == 15
        assert kv.bytes_per_lane == (3 * CONTEXT + 15 * RING) * POSITION == 210.75 * 2**20
        full = chip_kv_layout(spec, "tp", 2, c, LANES, CONTEXT, CHUNKS, rings=False)
        assert full.ring is None and full.bytes_per_lane == 18 * CONTEXT * POSITION == 1152 * 2**20


def test_default_model_pp_stages_hold_their_own_layers_lengths(spec):
    stages = [chip_kv_layout(spec, "pp", 2, c, LANES, CONTEXT, CHUNKS) for c in range(2)]
    assert [kv.num_layers for kv in stages] == [9, 9]
    assert stages[0].layer_lengths == (RING,) * 5 + (CONTEXT,) + (RING,) * 3          # layers 0..8, full at 5
    assert stages[1].layer_lengths == (RING,) * 2 + (CONTEXT,) + (RING,) * 5 + (CONTEXT,)  # 9..17, full at 11, 17
    assert [kv.bytes_per_lane for kv in stages] == [(1 * CONTEXT + 8 * RING) * POSITION, (2 * CONTEXT + 7 * RING) * POSITION]


def test_a_segment_reads_total_seq_len_with_a_full_layer_and_last_index_with_a_ring_in_prefill():
    lengths = (24, 64, 24)
    prefill = GraphSpec("prefill_4", PREFILL, 1, 4, (), ())
    decode = GraphSpec("decode_4", DECODE, 4, 1, (), ())
    names = lambda gs, block, **kw: [t.name for t in host_inputs(gs, block, lengths, 64, **kw)]  # noqa: E731
    assert names(prefill, (0,)) == ["seqlens_k", "last_index"]
    assert names(prefill, (1,)) == ["seqlens_k", "total_seq_len"]
    assert names(prefill, (0, 1)) == ["seqlens_k", "total_seq_len", "last_index"]
    assert names(decode, (0, 1)) == ["seqlens_k", "total_seq_len"]
    assert names(decode, (1,), last_index=True) == ["seqlens_k", "total_seq_len", "last_index"]
