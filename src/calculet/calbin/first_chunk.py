"""Run one prefill graph of a calbin by itself, outside the runtime: one prompt as the first chunk of
a lane (position 0, zero KV buffers, right-padded), as the runtime runs it. For the callers that read
a probe build's module outputs without a Device: the compiler's prefill-int8 calibration (the
compiler may not import the runtime) and `calculet compare --probe`."""

from __future__ import annotations

import numpy as np

from calculet.calbin.graphspec import PROBE_PREFIX, GraphSpec


def first_chunk_feeds(graph: GraphSpec, ids: list[int]) -> dict[str, np.ndarray]:
    """Every input of `graph` for `ids` at position 0 of lane 0, on zero KV buffers."""
    if not 0 < len(ids) <= graph.tokens:
        raise ValueError(f"{len(ids)} prompt tokens do not fit graph {graph.name} (1..{graph.tokens})")
    feeds = {t.name: np.zeros(t.shape, t.dtype) for t in graph.inputs}
    feeds["input_ids"][0, :len(ids)] = ids
    feeds["seqlens_k"][0] = graph.tokens - 1       # a right-padded chunk: the padding rows sit after the prompt
    if "total_seq_len" in feeds:                    # portable bodies do not take it
        feeds["total_seq_len"][...] = graph.tokens
    feeds["last_index"][0] = len(ids) - 1
    return feeds


def probe_rows(graph: GraphSpec, names: list[str], values: list[np.ndarray], n: int) -> dict[str, np.ndarray]:
    """{module: float32 [n, width]} from the probe outputs `names` of one first-chunk run of `n` tokens
    (the final norm holds the last real token only: its one row is kept as it is)."""
    out = {}
    for name, v in zip(names, values):
        rows = v[0, :n] if v.shape[1] == graph.tokens else v[0]
        out[name.removeprefix(PROBE_PREFIX)] = np.asarray(rows, np.float32)
    return out
