"""The entry points a profile implies, by exact name: what gates B and C hold the graphs to.

    prefill_<S> per chunk size                     one lane, S tokens   -> hidden [1, H]
    decode_<n>  per decode size (decode_lanes ∪ {lanes})                 -> hidden [n, H]
    head_<n>    per row count (decode sizes ∪ {1})  hidden [n, H]        -> logits [n, V]

This is the only layout the runtime runs (runtime/program.py needs a head for every body's rows).
Names are compared exactly, never by prefix or substring.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    prefill: dict[str, int]       # name -> tokens
    decode: dict[str, int]        # name -> lanes
    head: dict[str, int]          # name -> rows

    @property
    def names(self) -> list[str]:
        return [*self.prefill, *self.decode, *self.head]


def _ints(value) -> list[int]:
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool)] if isinstance(value, (list, tuple)) else []


def expected_layout(lanes, prefill_chunks, decode_lanes) -> Layout:
    """From a profile's fields (raw JSON values in gate B, typed ones in gate C)."""
    lanes = lanes if isinstance(lanes, int) else 0
    prefill = {f"prefill_{s}": s for s in _ints(prefill_chunks)}
    sizes = sorted(set(_ints(decode_lanes)) | {lanes})
    return Layout(prefill, {f"decode_{n}": n for n in sizes}, {f"head_{n}": n for n in sorted(set(sizes) | {1})})
