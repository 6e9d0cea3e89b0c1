"""compiler/topk.py: the two-level top-k gives exactly what one TopK over the row gives, ties included."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from calculet.compiler.builder import GraphBuilder
from calculet.compiler.topk import GROUP, top_k, two_level
from calculet.compiler.weights import WeightStore


def _session(rows: int, width: int, k: int):
    g = GraphBuilder("topk", WeightStore())
    g.input("x", np.float32, (rows, width))
    values, ids = top_k(g, "x", rows, width, k, "/t")
    g.output(values, "values", np.float32, (rows, k))
    g.output(ids, "ids", np.int64, (rows, k))
    return ort.InferenceSession(g.build().SerializeToString(), providers=["CPUExecutionProvider"])


def _one_topk(x: np.ndarray, k: int):
    """TopK's order: value descending, then id ascending."""
    order = np.lexsort((np.broadcast_to(np.arange(x.shape[1]), x.shape), -x), axis=1)[:, :k]
    return np.take_along_axis(x, order, axis=1), order


@pytest.mark.parametrize("rows,width,k", [(1, GROUP * 4096, 64), (3, GROUP * 300, 16), (2, 1000, 8)])
def test_top_k_equals_one_topk_with_ties(rows, width, k):
    session = _session(rows, width, k)
    assert two_level(width, k) == (width % GROUP == 0)
    rng = np.random.default_rng(width + k)
    for spread in (0.5, 3.0, 40.0, None):   # rounded values: rows full of ties at the k-th value
        x = rng.standard_normal((rows, width)).astype(np.float32)
        if spread is not None:
            x = np.round(x * spread).astype(np.float32)
        values, ids = session.run(["values", "ids"], {"x": x})
        want_values, want_ids = _one_topk(x, k)
        assert np.array_equal(values, want_values)
        assert np.array_equal(ids, want_ids)


def test_top_k_finds_a_group_whose_only_large_value_is_not_its_first():
    """Every large value in a different group, at different offsets: each group is found by its maximum."""
    rows, width, k = 1, GROUP * 512, 32
    x = np.zeros((rows, width), np.float32)
    where = [g * GROUP + (g * 7) % GROUP for g in range(0, 512, 16)]
    x[0, where] = np.arange(len(where), dtype=np.float32) + 1
    values, ids = _session(rows, width, k).run(["values", "ids"], {"x": x})
    assert ids[0].tolist() == where[::-1] and values[0].tolist() == list(range(len(where), 0, -1))
