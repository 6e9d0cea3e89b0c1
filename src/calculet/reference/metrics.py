"""Pure-numpy comparisons between a runtime's outputs and the reference (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def topk_of(logits: np.ndarray, k: int) -> tuple[list[int], np.ndarray]:
    """Top-k ids (largest first; equal values keep the lower id first) and their float32 values."""
    logits = np.asarray(logits, dtype=np.float32).reshape(-1)
    if not 1 <= k <= logits.size:
        raise ValueError(f"k must be in [1, {logits.size}] (the number of logits), got {k}")
    order = np.argsort(-logits, kind="stable")[:k]
    return [int(i) for i in order], logits[order].copy()


@dataclass(frozen=True)
class GreedyAgreement:
    prefix_fraction: float        # tokens equal before the first divergence / reference length
    matches: int                  # positions equal anywhere (after a divergence this is informational)
    first_divergence: int | None  # index of the first differing token, None when all agree


def greedy_agreement(ours: list[int], ref: list[int]) -> GreedyAgreement:
    """Compare two greedy continuations; a missing token counts as a divergence."""
    n = len(ref)
    if n == 0:
        return GreedyAgreement(1.0, 0, None)
    matches = sum(1 for a, b in zip(ours, ref) if int(a) == int(b))
    first = next((i for i in range(n) if i >= len(ours) or int(ours[i]) != int(ref[i])), None)
    prefix = n if first is None else first
    return GreedyAgreement(prefix / n, matches, first)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity in float64; NaN when either vector is all zeros or holds NaN/inf."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    if denom == 0.0 or not np.isfinite(denom):
        return float("nan")
    return float(np.dot(a, b) / denom)
