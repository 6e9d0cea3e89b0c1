"""The entry points a profile implies, by exact name: what gates B and C hold the graphs to.

Two layouts exist under schema calculet.calbin/1; the profile says which:

    single (no profile.decode_lanes):   prefill_<S> per chunk, decode            -> logits [rows, V]
    split  (profile.decode_lanes):      prefill_<S> per chunk, decode_<n> per     -> hidden [rows, H]
                                        decode size (decode_lanes ∪ {lanes}),
                                        head_<n> per row count (decode sizes ∪ {1})  hidden -> logits

Names are compared exactly, never by prefix or substring.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFILL, DECODE, HEAD = "prefill", "decode", "head"
GRAPH_TYPES = (PREFILL, DECODE, HEAD)
BODY_TYPES = (PREFILL, DECODE)


@dataclass(frozen=True)
class Layout:
    split: bool                   # bodies output `hidden`; head_<n> graphs turn it into logits
    prefill: dict[str, int]       # name -> tokens
    decode: dict[str, int]        # name -> lanes
    head: dict[str, int]          # name -> rows

    @property
    def names(self) -> list[str]:
        return [*self.prefill, *self.decode, *self.head]

    def kind_of(self, name: str) -> str | None:
        for kind, names in ((PREFILL, self.prefill), (DECODE, self.decode), (HEAD, self.head)):
            if name in names:
                return kind
        return None


def _ints(value) -> list[int]:
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool)] if isinstance(value, list) else []


def expected_layout(profile: dict) -> Layout:
    lanes = profile.get("lanes") if isinstance(profile.get("lanes"), int) else 0
    prefill = {f"prefill_{s}": s for s in _ints(profile.get("prefill_chunks"))}
    if "decode_lanes" not in profile:
        return Layout(False, prefill, {"decode": lanes}, {})
    sizes = sorted(set(_ints(profile.get("decode_lanes"))) | {lanes})
    return Layout(True, prefill, {f"decode_{n}": n for n in sizes}, {f"head_{n}": n for n in sorted(set(sizes) | {1})})
