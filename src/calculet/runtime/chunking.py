"""Split a prompt into prefill chunks the compiled graphs can run.

A chunk of n tokens runs on the smallest prefill graph of S >= n tokens whose padded write
(start + S) still fits the context; when none fits, single tokens run on the decode graph.
The plan minimises tokens computed plus a fixed per-call overhead.
"""

from __future__ import annotations

# Measured on the default model (served calbin, 2 cores, medians of 7): prefill_16 ~31 ms, prefill_64 ~86 ms,
# prefill_128 ~159 ms -> ~1.14 ms per token plus ~13 ms per call, about 12 tokens.
CALL_OVERHEAD_TOKENS = 12


def graph_for(n: int, start: int, chunk_sizes: tuple[int, ...], context: int) -> int | None:
    """Tokens of the prefill graph that runs n tokens at `start`, or None (use decode for n == 1)."""
    for s in sorted(chunk_sizes):
        if s >= n and start + s <= context:
            return s
    return None


def plan_chunks(n_tokens: int, start: int, chunk_sizes: tuple[int, ...], context: int) -> list[int]:
    """Sizes of consecutive pieces that cover n_tokens starting at position `start`."""
    if n_tokens <= 0:
        return []
    if start + n_tokens > context:
        raise ValueError(f"{n_tokens} tokens at position {start} exceed the context {context}")
    sizes = sorted(chunk_sizes)
    # cost[d] / step[d]: cheapest way to cover tokens d..n-1, filled from the end backwards.
    cost = [0] * (n_tokens + 1)
    step = [0] * (n_tokens + 1)
    for done in range(n_tokens - 1, -1, -1):
        left, pos = n_tokens - done, start + done
        best_cost, best_piece = None, 1
        for s in sizes:
            if pos + s > context:
                continue
            piece = min(s, left)
            c = cost[done + piece] + s + CALL_OVERHEAD_TOKENS
            if best_cost is None or c < best_cost:
                best_cost, best_piece = c, piece
        if best_cost is None:  # near the end of the context: one token at a time on the decode graph
            best_cost, best_piece = cost[done + 1] + 1 + CALL_OVERHEAD_TOKENS, 1
        cost[done], step[done] = best_cost, best_piece
    pieces, done = [], 0
    while done < n_tokens:
        pieces.append(step[done])
        done += step[done]
    return pieces
