"""Per-column int8 codes that ONNX Runtime's AVX2 u8 x s8 GEMM multiplies exactly.

Without an int8 dot product (x86 with AVX2 but neither VNNI nor AMX) ONNX Runtime's u8 x s8 kernel
multiplies bytes with vpmaddubsw: each product of a uint8 activation code a (0..255) and an int8 weight
code c is added to its neighbour along K in a signed 16-bit lane, which saturates past 32,767. Its
u8 x u8 kernel widens to 16 bits first and is exact, but is 1.7x slower (18 products [640 -> 4,096] at 8
rows through a Xeon's AVX2 view: 5.1 against 8.5 ms, benchmarks/RESULTS.md 2026-12-07 (5)).

The pair sum a1 c1 + a2 c2 stays within 255 (|c1| + |c2|), so codes whose two neighbours along K
(input rows 2j and 2j + 1, the pairs the kernel adds: checked through benchmarks/isa_view) sum to at
most PAIR_SUM_LIMIT = 128 in magnitude never saturate: 255 x 128 = 32,640. Per output column the scale is
then the larger of max|w| / 127 and max_j (|w[2j]| + |w[2j+1]|) / 128, so the largest code stays 127 where
its neighbour is small. On the default model's projections that scale is 1.36x the plain per-column
one at the median column (0.4 bits; 7-bit codes lose a whole bit), and the simulated output error of the
per-token int8 GEMM is 0.0093 / 0.0076 / 0.0096 (gate/up, qkv, o_proj; mean over layers) against 0.0079 /
0.0066 / 0.0083 with full-range codes and 0.0123 / 0.0100 / 0.0122 with 7-bit ones (docs/NUMERICS.md, which
also gives the measured agreement and speed).
"""

from __future__ import annotations

import numpy as np

PAIR_SUM_LIMIT = 128   # the largest |c[2j]| + |c[2j+1]| per output column: 255 x 128 = 32,640 <= 32,767
# pair_bounded_codes works on this many output columns at a time (each is independent): its float64
# temporaries for the default model's whole lm_head copy [262,144 x 640] had taken an AVX2 compile's peak
# RSS from 3.1 to 6.9 GB.
COLUMNS_AT_ONCE = 8192


def pair_sums(x: np.ndarray) -> np.ndarray:
    """x [out, in] (codes or values) -> |x[:, 2j]| + |x[:, 2j+1]| [out, ceil(in / 2)]; an odd last input
    row pairs with 0, as the kernel pads K."""
    a = np.abs(x.astype(np.int32) if x.dtype.kind in "iu" else x)
    if a.shape[1] % 2:
        a = np.concatenate([a, np.zeros((a.shape[0], 1), a.dtype)], axis=1)
    return a[:, 0::2] + a[:, 1::2]


def pair_bounded_codes(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w [out, in] -> (int8 codes [out, in], float32 scales [out]) with codes x scale ~ w and every
    output column's neighbouring pairs along `in` within PAIR_SUM_LIMIT (module docstring). Rounding is to
    nearest; where two neighbours both rounded up past the limit (their exact sum is within it, so by 1 at
    most), the one that rounded up further is taken one step towards zero."""
    if len(w) > COLUMNS_AT_ONCE:
        parts = [pair_bounded_codes(w[i:i + COLUMNS_AT_ONCE]) for i in range(0, len(w), COLUMNS_AT_ONCE)]
        return np.concatenate([c for c, _ in parts]), np.concatenate([s for _, s in parts])
    w = np.asarray(w, np.float64)
    peak = np.abs(w).max(axis=1, initial=0.0) / 127.0
    pair_peak = pair_sums(w).max(axis=1, initial=0.0) / PAIR_SUM_LIMIT
    scale = np.maximum(np.maximum(peak, pair_peak), 1e-30)                                   # [out]
    exact = w / scale[:, None]
    codes = np.clip(np.round(exact), -127, 127)
    n = codes.shape[1] - codes.shape[1] % 2
    even, odd = codes[:, 0:n:2], codes[:, 1:n:2]
    over = np.abs(even) + np.abs(odd) > PAIR_SUM_LIMIT
    if over.any():
        up_even = np.abs(even) - np.abs(exact[:, 0:n:2])       # how far each rounded away from zero
        up_odd = np.abs(odd) - np.abs(exact[:, 1:n:2])
        fix_even = over & (up_even >= up_odd)
        even -= np.sign(even) * fix_even
        odd -= np.sign(odd) * (over & ~fix_even)
        codes[:, 0:n:2], codes[:, 1:n:2] = even, odd
    codes = codes.astype(np.int8)
    assert int(pair_sums(codes).max(initial=0)) <= PAIR_SUM_LIMIT
    return codes, scale.astype(np.float32)


def column_codes(w: np.ndarray, pair_bounded: bool) -> tuple[np.ndarray, np.ndarray]:
    """w [out, in] float32 -> (int8 codes [out, in], float32 scales [out]) per output column: pair-bounded
    (pair_bounded_codes) for a CPU whose u8 x s8 GEMM adds pairs in 16 bits, else full range (|c| <= 127,
    scale max|w| / 127, rounded to nearest)."""
    if pair_bounded:
        return pair_bounded_codes(w)
    scale = np.maximum(np.abs(w).max(axis=1, initial=0.0), 1e-30) / 127.0                   # [out]
    return np.clip(np.round(w / scale[:, None]), -127, 127).astype(np.int8), scale.astype(np.float32)
