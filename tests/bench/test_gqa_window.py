"""benchmarks/gqa_window.py: the window case attends exactly the last W rows ending at seqlens_k (what a
mirrored ring would rely on), the new K/V lands in the bound buffer in place, and the script prints its table."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gqa_window  # noqa: E402


def _reference(q, keys, values, heads: int, dim: int, rows: slice) -> np.ndarray:
    """softmax(q . K[rows]^T / sqrt(D)) . V[rows] per lane, one KV head shared by every query head."""
    lanes = q.shape[0]
    out = np.empty((lanes, heads, dim), np.float64)
    for lane in range(lanes):
        k, v = keys[lane, 0, rows].astype(np.float64), values[lane, 0, rows].astype(np.float64)
        for h in range(heads):
            s = k @ q[lane, 0, h * dim:(h + 1) * dim].astype(np.float64) / np.sqrt(dim)
            p = np.exp(s - s.max())
            out[lane, h] = (p / p.sum()) @ v
    return out.reshape(lanes, 1, heads * dim)


def test_the_window_case_reads_the_last_w_rows_in_place():
    lanes, heads, dim, buffer, window = 2, 4, 16, 40, 8
    seqlen = buffer - 1
    case = gqa_window.Case("mirror", gqa_window._session(lanes, heads, 1, dim, buffer, window, 1),
                           lanes, heads, 1, dim, buffer, seqlen)
    keys, values = (kv.copy() for kv in case.kv)
    feeds = case.feeds
    case.session.run_with_iobinding(case.binding)
    out = case.binding.copy_outputs_to_cpu()[0]
    keys[:, 0, seqlen], values[:, 0, seqlen] = feeds["k"][:, 0], feeds["v"][:, 0]   # this step's row, then read
    expected = _reference(feeds["q"], keys, values, heads, dim, slice(seqlen - window + 1, seqlen + 1))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    whole = _reference(feeds["q"], keys, values, heads, dim, slice(0, seqlen + 1))
    assert np.abs(out - whole).max() > 1e-3   # the window changed the answer: rows before it were left out
    np.testing.assert_array_equal(case.kv[0][:, 0, seqlen], feeds["k"][:, 0])   # written in place
    np.testing.assert_array_equal(case.kv[1][:, 0, :seqlen], values[:, 0, :seqlen])


def test_the_script_prints_one_row_per_case(capsys):
    assert gqa_window.main(["--lanes", "1", "--dim", "16", "--window", "8", "--ring", "12", "--buffer", "20",
                            "--threads", "1", "--rounds", "2", "--calls", "2"]) == 0
    out = capsys.readouterr().out
    assert "causal W (seqlens_k 7" in out and "causal R (seqlens_k 11" in out and "mirror (seqlens_k 19, window 8)" in out
    assert out.count("x |") == 3
