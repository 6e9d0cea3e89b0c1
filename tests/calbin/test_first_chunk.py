"""calbin/first_chunk.py: the feeds that run a prefill graph as a lane's first chunk without the
runtime (the probe readers; tests/numerics/test_probe.py checks their outputs against the reference)."""

import numpy as np
import pytest

from calculet.calbin.first_chunk import first_chunk_feeds, probe_rows
from calculet.calbin.graphspec import PROBE_PREFIX, is_kv
from calculet.calbin.manifest import read_manifest


def _prefill(calbin, tokens: int):
    return next(g for g in read_manifest(calbin).graphs if g.type == "prefill" and g.tokens == tokens)


def test_a_first_chunk_is_right_padded_at_position_zero_on_zero_kv(tiny_calbin):
    graph = _prefill(tiny_calbin("llama"), 16)
    feeds = first_chunk_feeds(graph, [5, 6, 7])
    assert set(feeds) == {t.name for t in graph.inputs}
    assert feeds["input_ids"][0, :4].tolist() == [5, 6, 7, 0] and not feeds["input_ids"][1:].any()
    assert feeds["seqlens_k"][0] == 15 and feeds["total_seq_len"] == 16 and feeds["last_index"][0] == 2
    kv = [name for name in feeds if is_kv(name)]
    assert kv and all(not feeds[name].any() for name in kv)


def test_a_prompt_that_does_not_fit_says_the_limit(tiny_calbin):
    graph = _prefill(tiny_calbin("llama"), 4)
    with pytest.raises(ValueError, match=r"5 prompt tokens do not fit graph prefill_4 \(1..4\)"):
        first_chunk_feeds(graph, [1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="0 prompt tokens"):
        first_chunk_feeds(graph, [])


def test_probe_rows_keep_the_prompt_rows_and_the_final_norms_one_row(tiny_calbin):
    graph = _prefill(tiny_calbin("llama"), 16)
    per_token = np.arange(2 * 16 * 3, dtype=np.float32).reshape(2, 16, 3)
    last_only = np.ones((2, 1, 3), np.float32)
    rows = probe_rows(graph, [PROBE_PREFIX + "model.layers.0.mlp", PROBE_PREFIX + "model.norm"],
                      [per_token, last_only], 5)
    assert rows["model.layers.0.mlp"].shape == (5, 3) and rows["model.layers.0.mlp"][4, 0] == 12.0
    assert rows["model.norm"].shape == (1, 3)
