"""KV lanes: the static KV buffers and which batch rows (lanes) are in use.

Per layer a K and a V buffer of shape [lanes, kv_heads, context, head_dim] (float32) live for the
whole life of the device; graphs read and write them in place. A lane is one batch row of the
decode graph and owns `length` positions of those buffers.
"""

from __future__ import annotations

import threading

import numpy as np

from calculet.calbin.manifest import KVLayout
from calculet.errors import RequestError


class Lanes:
    def __init__(self, kv: KVLayout):
        self.layout = kv
        # One array per K and V: [layers, B, Nkv, C, D]; per-layer views [B, Nkv, C, D] for the graphs.
        self.renew_buffers()
        self._in_use = [False] * kv.lanes
        self._length = [0] * kv.lanes
        self._lock = threading.Lock()

    def renew_buffers(self) -> None:
        """Fresh, zeroed KV buffers (after a fence: a stuck graph may still write into the old ones)."""
        kv = self.layout
        self.all_keys = np.zeros((kv.num_layers, *kv.shape), np.float32)
        self.all_values = np.zeros((kv.num_layers, *kv.shape), np.float32)
        self.keys = list(self.all_keys)
        self.values = list(self.all_values)

    @property
    def count(self) -> int:
        return self.layout.lanes

    @property
    def context(self) -> int:
        return self.layout.context

    def can_allocate(self) -> bool:
        with self._lock:
            return not all(self._in_use)

    def allocate(self) -> int:
        """The lowest free lane (so active lanes stay packed at low rows), emptied."""
        with self._lock:
            for lane, used in enumerate(self._in_use):
                if not used:
                    self._in_use[lane] = True
                    self._length[lane] = 0
                    return lane
        raise RequestError("no_free_lane", f"all {self.count} lanes are in use; free one or wait (can_allocate() says when)")

    def free(self, lane: int) -> None:
        with self._lock:
            self._check(lane)
            self._in_use[lane] = False
            self._length[lane] = 0

    def clear(self, lane: int) -> None:
        """Forget the lane's tokens (and zero its KV rows) but keep it allocated."""
        with self._lock:
            self._check(lane)
            self._length[lane] = 0
        self.all_keys[:, lane].fill(0.0)
        self.all_values[:, lane].fill(0.0)

    def length(self, lane: int) -> int:
        return self._length[lane]

    def in_use(self, lane: int) -> bool:
        return self._in_use[lane]

    def free_count(self) -> int:
        return self._in_use.count(False)

    def write_new(self, rows: list[int], starts: list[int], counts: list[int], new_keys: np.ndarray,
                  new_values: np.ndarray) -> None:
        """Store a step's K/V ([layers, rows, Nkv, S, D], from a graph that cannot write in place):
        row r's first counts[r] tokens go to positions starts[r].. of lane rows[r], all layers at once."""
        for r, (lane, start, n) in enumerate(zip(rows, starts, counts)):
            self.all_keys[:, lane, :, start:start + n] = new_keys[:, r, :, :n]
            self.all_values[:, lane, :, start:start + n] = new_values[:, r, :, :n]

    def advance(self, lane: int, n: int) -> None:
        self._length[lane] += n

    def reset_all(self) -> None:
        with self._lock:
            self._in_use = [False] * self.count
            self._length = [0] * self.count

    def _check(self, lane: int) -> None:
        if not 0 <= lane < self.count:
            raise RequestError("bad_lane", f"lane {lane} is out of range 0..{self.count - 1}")
        if not self._in_use[lane]:
            raise RequestError("lane_not_allocated", f"lane {lane} is not allocated")
