"""Top-k over a vocabulary-wide row, in two levels where the row is wide enough.

ONNX Runtime's TopK over [R, 262144] costs ~1.6 ms at 8 rows and ~0.3 ms at 1 row on this project's
2-core EPYC: most of a sampling head's time after its matmul. Two levels read the row once and sort
only small lists:

    groups  = x reshaped [R, V/G, G]                      G = GROUP consecutive ids per group
    best    = the k groups with the largest maxima         TopK over [R, V/G]
    cand    = those groups' values, groups in id order     [R, k*G]
    values, ids = TopK(cand, k), mapped back to row ids

It is exact, ties included: the k largest values of a row lie in at most k groups, and each of those
groups' maximum is at least the k-th value, so they are among the k groups with the largest maxima.
Where maxima tie at the k-th group, TopK keeps the lower group index, and the candidates keep id
order, so tied values resolve to the lower id, as one TopK over the row does
(tests/compiler/test_topk.py checks both on rows full of ties). Measured against one TopK (k = 64,
V = 262,144, 2 threads): 8 rows 1.71 -> 0.67 ms, 1 row 0.23 -> 0.08 ms.
"""

from __future__ import annotations

from calculet.compiler.builder import GraphBuilder

GROUP = 64            # ids per group: V/G groups to rank, k*G candidates to sort (4,096 each for 262,144 and 64)
MIN_GROUPS_PER_K = 4  # below V/G = 4k the two levels save little over one TopK


def two_level(width: int, k: int) -> bool:
    """Whether a row of `width` values takes the two-level form for top-`k`."""
    return width % GROUP == 0 and width // GROUP >= MIN_GROUPS_PER_K * k


def top_k(g: GraphBuilder, x: str, rows: int, width: int, k: int, scope: str) -> tuple[str, str]:
    """(values [R, k] float32 sorted descending, ids [R, k] int64) of x [R, width], as TopK(largest,
    sorted) gives them."""
    if not two_level(width, k):
        values, ids = g.op("TopK", [x, g.const([k])], name=f"{scope}/TopK", n_out=2, axis=-1, largest=1, sorted=1)
        return values, ids
    groups = g.op("Reshape", [x, g.const([rows, width // GROUP, GROUP])], name=f"{scope}/Groups")      # [R, V/G, G]
    peaks = g.op("ReduceMax", [groups, g.const([-1])], name=f"{scope}/GroupMax", keepdims=0)           # [R, V/G]
    _, best = g.op("TopK", [peaks, g.const([k])], name=f"{scope}/BestGroups", n_out=2, axis=-1, largest=1,
                   sorted=0)                                                                          # [R, k]
    best, _ = g.op("TopK", [best, g.const([k])], name=f"{scope}/GroupsInOrder", n_out=2, axis=-1, largest=0,
                   sorted=1)                                                                          # [R, k] ascending
    picked = g.op("GatherND", [groups, g.op("Unsqueeze", [best, g.const([-1])], name=f"{scope}/GroupIndex")],
                  name=f"{scope}/Candidates", batch_dims=1)                                           # [R, k, G]
    flat = g.op("Reshape", [picked, g.const([rows, k * GROUP])], name=f"{scope}/CandidateRow")          # [R, k*G]
    values, at = g.op("TopK", [flat, g.const([k])], name=f"{scope}/TopK", n_out=2, axis=-1, largest=1, sorted=1)
    group = g.op("GatherElements", [best, g.op("Div", [at, g.const(GROUP)], name=f"{scope}/Slot")],
                 name=f"{scope}/GroupOf", axis=1)                                                     # [R, k]
    ids = g.op("Add", [g.op("Mul", [group, g.const(GROUP)], name=f"{scope}/GroupStart"),
                       g.op("Mod", [at, g.const(GROUP)], name=f"{scope}/InGroup")], name=f"{scope}/Ids")
    return values, ids
