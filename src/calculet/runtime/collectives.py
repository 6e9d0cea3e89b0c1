"""Collectives: the one way bytes move between chips, counted per step.

    coll = Collectives(chips=2)
    coll.send(src_array, dst_array, src=0, dst=1)
    coll.all_reduce([partial_0, partial_1], [branch_0, branch_1])
    step = coll.end_step()          # CollectiveStats of everything since the last end_step()

Today the chips are execution slots of one host, so a collective is a numpy copy or sum in host
memory; a vendor link would replace these bodies and keep the counting. Bytes are what a link
would carry (calbin/partition.py states the formula per kind, and `calculet plan` predicts them
with the same one):

    send        nbytes                  broadcast, reduce   (P - 1) x nbytes
    all_reduce  2 (P - 1) x nbytes      all_gather  (P - 1) x sum of the parts
    all_to_all  sum of the blocks that change chips

Counting is under a lock: chips' workers may call collectives concurrently.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from calculet.calbin.partition import collective_bytes
from calculet.errors import ModelError


@dataclass(frozen=True)
class CollectiveStats:
    """Collectives over some span (one step, or the device's life): calls, link bytes and host seconds, per kind."""
    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0
    by_kind: dict = field(default_factory=dict)   # kind -> (calls, bytes)

    def plus(self, kind: str, nbytes: int, seconds: float) -> "CollectiveStats":
        calls, b = self.by_kind.get(kind, (0, 0))
        return CollectiveStats(self.calls + 1, self.bytes + nbytes, self.seconds + seconds,
                               {**self.by_kind, kind: (calls + 1, b + nbytes)})


class Collectives:
    def __init__(self, chips: int):
        if chips < 1:
            raise ModelError("bad_option", f"collectives need at least one chip, got {chips}")
        self.chips = chips
        self._lock = threading.Lock()
        self._step = CollectiveStats()
        self.total = CollectiveStats()
        self.last_step = CollectiveStats()

    # --- the operations --------------------------------------------------------------------
    def send(self, src: np.ndarray, dst: np.ndarray, src_chip: int, dst_chip: int) -> None:
        """Copy chip `src_chip`'s array into chip `dst_chip`'s."""
        self._check_chip(src_chip)
        self._check_chip(dst_chip)
        t0 = time.perf_counter()
        np.copyto(dst, src.reshape(dst.shape))
        self._count("send", collective_bytes("send", self.chips, src.nbytes), t0)

    def broadcast(self, src: np.ndarray, dsts: list[np.ndarray]) -> None:
        """One chip's array into every other chip's (dsts: the other chips' arrays)."""
        t0 = time.perf_counter()
        for d in dsts:
            np.copyto(d, src.reshape(d.shape))
        self._count("broadcast", collective_bytes("broadcast", self.chips, src.nbytes), t0)

    def all_reduce(self, parts: list[np.ndarray], outs: list[np.ndarray]) -> None:
        """Sum of every chip's part, written into every chip's out (same shapes). Summed in chip order,
        so the result does not depend on timing."""
        if len(parts) != self.chips or len(outs) != self.chips:
            raise ModelError("bad_collective", f"all_reduce needs one part and one output per chip ({self.chips}), "
                                               f"got {len(parts)} and {len(outs)}")
        t0 = time.perf_counter()
        total = parts[0].copy()
        for p in parts[1:]:
            total += p
        for o in outs:
            np.copyto(o, total.reshape(o.shape))
        self._count("all_reduce", collective_bytes("all_reduce", self.chips, parts[0].nbytes), t0)

    def reduce(self, parts: list[np.ndarray], out: np.ndarray) -> None:
        """Sum of every chip's part (in chip order) into one chip's array."""
        t0 = time.perf_counter()
        total = parts[0].copy()
        for p in parts[1:]:
            total += p
        np.copyto(out, total.reshape(out.shape))
        self._count("reduce", collective_bytes("reduce", self.chips, parts[0].nbytes), t0)

    def all_gather(self, parts: list[np.ndarray], axis: int = -1) -> np.ndarray:
        """Every chip's part concatenated along `axis` (every chip receives the others' parts)."""
        t0 = time.perf_counter()
        out = np.concatenate(parts, axis=axis)
        self._count("all_gather", (self.chips - 1) * sum(p.nbytes for p in parts), t0)
        return out

    def all_to_all(self, blocks: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        """blocks[i][j]: what chip i sends chip j; returns received[j][i]. Blocks staying on their chip are free."""
        t0 = time.perf_counter()
        n = len(blocks)
        received = [[blocks[i][j] for i in range(n)] for j in range(n)]
        moved = sum(blocks[i][j].nbytes for i in range(n) for j in range(n) if i != j)
        self._count("all_to_all", moved, t0)
        return received

    # --- counting ------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything counted (the device calls it after its warm-up)."""
        with self._lock:
            self._step = self.total = self.last_step = CollectiveStats()

    def end_step(self) -> CollectiveStats:
        """The collectives since the last end_step(), and start counting a new step."""
        with self._lock:
            self.last_step, self._step = self._step, CollectiveStats()
            return self.last_step

    def _count(self, kind: str, nbytes: int, t0: float) -> None:
        dt = time.perf_counter() - t0
        with self._lock:
            self._step = self._step.plus(kind, nbytes, dt)
            self.total = self.total.plus(kind, nbytes, dt)

    def _check_chip(self, chip: int) -> None:
        if not 0 <= chip < self.chips:
            raise ModelError("bad_collective", f"chip {chip} is out of range 0..{self.chips - 1}")
