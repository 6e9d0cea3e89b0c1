"""benchmarks/matmulnbits_kernels.py: the int8-row sessions it times compute the product they stand for
(signed and unsigned codes alike), and the two-level one is the finer of the two."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import matmulnbits_kernels  # noqa: E402


def _exact(n: int, k: int, a: np.ndarray, unsigned: bool) -> np.ndarray:
    store = matmulnbits_kernels._rows8_store(n, k, unsigned)
    codes = store.array("w.rows8.weight").astype(np.float32) - (128 if unsigned else 0)   # [k, n]
    return a @ (codes * store.array("w.rows8.scale")[None, :])


@pytest.mark.parametrize("unsigned", [False, True])
def test_rows8_and_two_level_sessions_compute_the_product(unsigned):
    n, k, rows = 48, 64, 3
    a = np.random.default_rng(1).standard_normal((rows, k)).astype(np.float32)
    exact = _exact(n, k, a, unsigned)
    one = matmulnbits_kernels.rows8_session(n, k, rows, 1, unsigned).run(None, {"A": a})[0]
    two = matmulnbits_kernels.two_level_session(n, k, rows, 1, unsigned).run(None, {"A": a[None]})[0][0]
    err_one, err_two = (float(np.abs(y - exact).max() / np.abs(exact).max()) for y in (one, two))
    assert err_one < 0.02            # one int8 level per row: ~1/254 of a row's peak per element
    assert err_two < err_one / 20    # the residue's level: ~254x finer
