"""Prefix cache: finished sequences leave their lane warm, and a new sequence whose tokens start the
same way resumes from that KV instead of prefilling it again.

    finish (stop | length) ──release(lane, tokens)──▶ warm lane: free, KV kept, its tokens recorded
    admission ──allocate(tokens)──▶ the warm lane with the longest common prefix m (prefill from m),
                                    else the lowest cold free lane, else the least recently used warm lane

No KV is copied and none is added: a warm lane is a free lane (`Lanes.free(keep=True)`) that keeps
its length and buffers until it is taken again, so the cache is bounded by the lanes themselves and
a request that needs a lane never waits for the cache. Exact: positions 0..m-1 of the lane hold the
KV of the same tokens at the same positions, and at least one token is always prefilled (the new
sequence needs logits). A warm lane is handed to one sequence only (it leaves the table when taken).

Only a sequence that finished normally is kept; a cancelled, timed-out or failed one frees its lane
cold. A device reset (or a fence, which renews the buffers) wipes every warm lane: `clear()` forgets
them, and `Lanes.epoch` guards a table that was not cleared. `max_rewind` (from `Program.max_rewind`)
bounds how far back from a warm lane's end its KV may be resumed (window-sized ring buffers keep only
the last positions of sliding layers) once its rings wrapped: a lane whose content never covered more
than `ring` positions (`Lanes.reach`) still holds every position, so any prefix of it resumes (two
chats sharing a system prompt); None: any prefix.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from calculet.runtime.lanes import Lanes

# A match shorter than this saves less than one small prefill call; while a cold lane is free, the
# new sequence takes it and the warm lane stays for a longer match.
MIN_HIT_TOKENS = 16


@dataclass(frozen=True)
class LaneGrant:
    lane: int
    cached: int                # leading tokens whose KV the lane already holds: prefill starts here


@dataclass(frozen=True)
class WarmLane:
    tokens: tuple[int, ...]    # the tokens whose KV positions 0..len-1 hold
    epoch: int                 # Lanes.epoch when it was kept


@dataclass(frozen=True)
class PrefixCacheStats:
    lookups: int = 0           # admissions that looked for a warm lane
    hits: int = 0              # ... that resumed from one
    tokens_saved: int = 0      # prompt tokens not prefilled thanks to a hit
    warm: int = 0              # warm lanes now


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    """The engine's way to get and give back lanes; with `enabled=False` it only allocates and frees."""

    def __init__(self, lanes: Lanes, enabled: bool = True, max_rewind: int | None = None, ring: int | None = None):
        if max_rewind is not None and max_rewind < 0:
            raise ValueError(f"max_rewind must be >= 0 or None, got {max_rewind}")
        self.lanes = lanes
        self.enabled = enabled
        self.max_rewind = max_rewind
        self.ring = ring                 # the rings' rows (None: no rings): lanes that never wrapped resume anywhere
        self._warm: OrderedDict[int, WarmLane] = OrderedDict()   # lane -> entry, least recently used first
        self._lookups = self._hits = self._saved = 0

    def can_allocate(self) -> bool:
        return self.lanes.can_allocate()

    def allocate(self, tokens: tuple[int, ...]) -> LaneGrant:
        """A lane for a sequence whose KV must come to hold `tokens`; `cached` of them are there already."""
        self._drop_stale()
        if not self.enabled:
            return LaneGrant(self.lanes.allocate(), 0)
        self._lookups += 1
        lane, m = self._best_match(tokens)
        cold = next((x for x in range(self.lanes.count) if not self.lanes.in_use(x) and x not in self._warm), None)
        if lane is not None and (m >= MIN_HIT_TOKENS or cold is None):
            del self._warm[lane]
            self.lanes.take(lane, m)
            self._hits += 1
            self._saved += m
            return LaneGrant(lane, m)
        if cold is None:   # every free lane is warm: evict the least recently used
            cold = next(iter(self._warm))
            del self._warm[cold]
        self.lanes.take(cold, 0)
        return LaneGrant(cold, 0)

    def _best_match(self, tokens: tuple[int, ...]) -> tuple[int | None, int]:
        """The warm lane with the longest usable common prefix (the most recent on ties), and its length."""
        best, best_m = None, 0
        for lane, entry in self._warm.items():
            m = min(common_prefix(entry.tokens, tokens), len(tokens) - 1)   # prefill at least one token
            if self.max_rewind is not None and len(entry.tokens) - m > self.max_rewind and not self._unwrapped(lane):
                continue
            if m > 0 and m >= best_m:
                best, best_m = lane, m
        return best, best_m

    def _unwrapped(self, lane: int) -> bool:
        return self.ring is not None and self.lanes.reach(lane) <= self.ring

    def release(self, lane: int, tokens: tuple[int, ...] | None) -> None:
        """Give the lane back. `tokens`: what its KV holds, known valid (None: nothing reusable)."""
        keep = (self.enabled and tokens is not None and 0 < len(tokens) == self.lanes.length(lane)
                and len(tokens) < self.lanes.context)   # a full lane's last position gets decode padding writes
        self.lanes.free(lane, keep=keep)
        if keep:
            self._warm.pop(lane, None)
            self._warm[lane] = WarmLane(tuple(tokens), self.lanes.epoch)

    def clear(self) -> None:
        """Forget every warm lane (their KV is gone: device reset or fence). The lanes stay free."""
        self._warm.clear()

    def _drop_stale(self) -> None:
        for lane, entry in list(self._warm.items()):
            if (entry.epoch != self.lanes.epoch or self.lanes.in_use(lane)
                    or self.lanes.length(lane) != len(entry.tokens)):
                del self._warm[lane]

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(self._lookups, self._hits, self._saved, len(self._warm))
