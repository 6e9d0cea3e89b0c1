"""KV lanes: the static KV buffers and which batch rows (lanes) are in use.

Per layer a K and a V buffer of shape [lanes, kv_heads, length, head_dim] (float32) live for the
whole life of the device; graphs read and write them in place. length is the context, or for a
sliding-window layer compiled with a ring the ring length (position p lives in row p mod ring).
A lane is one batch row of the decode graph and owns `length` positions of those buffers.

A lane freed with `keep=True` stays free but keeps its length and KV (a warm lane, for the engine's
prefix cache) until `take` hands it out again with a prefix of that KV, or `allocate` empties it.
`epoch` changes whenever buffers or lengths are wiped wholesale (`renew_buffers`, `reset_all`), so
a holder of a warm lane can tell its KV is gone.
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
        self.epoch = 0
        self.renew_buffers()
        self._in_use = [False] * kv.lanes
        self._length = [0] * kv.lanes
        self._lock = threading.Lock()

    def renew_buffers(self) -> None:
        """Fresh, zeroed KV buffers (after a fence: a stuck graph may still write into the old ones).
        One K and one V array per buffer length, [layers of that length, B, Nkv, length, D]; `keys[i]`
        and `values[i]` are layer i's views [B, Nkv, length, D] for the graphs."""
        kv = self.layout
        self.epoch += 1
        self.groups: list[tuple[tuple[int, ...], np.ndarray, np.ndarray]] = []
        self.keys: list[np.ndarray] = [None] * kv.num_layers
        self.values: list[np.ndarray] = [None] * kv.num_layers
        for length in sorted(set(kv.layer_lengths), reverse=True):
            layers = tuple(i for i, n in enumerate(kv.layer_lengths) if n == length)
            shape = (len(layers), *kv.layer_shape(layers[0]))
            keys, values = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
            self.groups.append((layers, keys, values))
            for j, layer in enumerate(layers):
                self.keys[layer], self.values[layer] = keys[j], values[j]

    @property
    def buffers(self) -> tuple[np.ndarray, ...]:
        """Every KV array the lanes own (to keep a fenced worker's buffers alive)."""
        return tuple(a for _, k, v in self.groups for a in (k, v))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.buffers)

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

    def take(self, lane: int, keep: int) -> None:
        """Allocate this free lane, keeping its first `keep` positions (a warm lane's prefix)."""
        with self._lock:
            if not 0 <= lane < self.count or self._in_use[lane]:
                raise RequestError("lane_not_free", f"lane {lane} is not a free lane of 0..{self.count - 1}")
            if not 0 <= keep <= self._length[lane]:
                raise RequestError("bad_keep", f"lane {lane} holds {self._length[lane]} positions; allowed: 0 <= keep <= "
                                   f"{self._length[lane]}, got {keep}")
            self._in_use[lane] = True
            self._length[lane] = keep

    def free(self, lane: int, keep: bool = False) -> None:
        """Give the lane back; with `keep` its length and KV stay until it is taken or allocated."""
        with self._lock:
            self._check(lane)
            self._in_use[lane] = False
            if not keep:
                self._length[lane] = 0

    def clear(self, lane: int) -> None:
        """Forget the lane's tokens (and zero its KV rows) but keep it allocated."""
        with self._lock:
            self._check(lane)
            self._length[lane] = 0
        for array in self.buffers:
            array[:, lane].fill(0.0)

    def rewind(self, lane: int, length: int) -> None:
        """Keep only the lane's first `length` tokens; the next job continues at that position. Its KV
        there is still valid only within `Program.max_rewind` positions of the lane's end."""
        with self._lock:
            self._check(lane)
            if not 0 <= length <= self._length[lane]:
                raise RequestError("bad_rewind", f"lane {lane} holds {self._length[lane]} tokens; it can be cut back "
                                   f"to 0..{self._length[lane]}, got {length}")
            self._length[lane] = length

    def length(self, lane: int) -> int:
        return self._length[lane]

    def in_use(self, lane: int) -> bool:
        return self._in_use[lane]

    def free_count(self) -> int:
        return self._in_use.count(False)

    def write_new(self, rows: list[int], starts: list[int], counts: list[int], new_keys: np.ndarray,
                  new_values: np.ndarray) -> None:
        """Store a step's K/V ([layers, rows, Nkv, S, D], from a graph that cannot write in place):
        row r's first counts[r] tokens are positions starts[r].. of lane rows[r], all layers at once
        (a ring layer's position p goes to row p mod ring)."""
        for layers, keys, values in self.groups:
            length, which = keys.shape[3], np.array(layers)
            ring = length != self.layout.context
            for r, (lane, start, n) in enumerate(zip(rows, starts, counts)):
                slots = np.arange(start, start + n) % length if ring else slice(start, start + n)
                keys[:, lane][:, :, slots] = new_keys[:, r, :, :n][which]      # [layers, Nkv, n, D]
                values[:, lane][:, :, slots] = new_values[:, r, :, :n][which]

    def advance(self, lane: int, n: int) -> None:
        self._length[lane] += n

    def reset_all(self) -> None:
        with self._lock:
            self.epoch += 1
            self._in_use = [False] * self.count
            self._length = [0] * self.count

    def _check(self, lane: int) -> None:
        if not 0 <= lane < self.count:
            raise RequestError("bad_lane", f"lane {lane} is out of range 0..{self.count - 1}")
        if not self._in_use[lane]:
            raise RequestError("lane_not_allocated", f"lane {lane} is not allocated")
