"""KV lanes: the static KV buffers and which batch rows (lanes) are in use.

Per layer a K and a V buffer of shape [lanes, kv_heads, length, head_dim] (in the manifest's KV dtype:
float32, or float16) live for the whole life of the device; graphs read and write them in place. length is the context, or for a
sliding-window layer compiled with a ring the ring length (position p lives in row p mod ring).
A lane is one batch row of the decode graph and owns `length` positions of those buffers. The
buffers are a `kv_store` store: on the host by default, on the GPU for the CUDA provider.

A lane freed with `keep=True` stays free but keeps its length and KV (a warm lane, for the engine's
prefix cache) until `take` hands it out again with a prefix of that KV, or `allocate` empties it.
`reach(lane)` is the most positions the lane's current content has covered (one more than its
longest length, for the write a batched decode step makes at a sitting-out lane's next position),
since it was last emptied: while it is no more than a ring's rows, that ring never wrapped, so the
lane can be cut back to any length (`Program.max_rewind` bounds only lanes whose rings wrapped).
`epoch` changes whenever buffers or lengths are wiped wholesale (`renew_buffers`, `reset_all`), so
a holder of a warm lane can tell its KV is gone.
"""

from __future__ import annotations

import threading

from calculet.calbin.manifest import KVLayout
from calculet.errors import RequestError
from calculet.runtime.kv_store import HostKV


class Lanes:
    def __init__(self, kv: KVLayout, make_store=HostKV):
        self.layout = kv
        self.epoch = 0
        self._make_store = make_store   # KVLayout -> HostKV | CudaKV
        self.renew_buffers()
        self._in_use = [False] * kv.lanes
        self._length = [0] * kv.lanes
        self._reach = [0] * kv.lanes
        self._lock = threading.Lock()

    def renew_buffers(self) -> None:
        """Fresh, zeroed KV buffers (after a fence: a stuck graph may still write into the old ones)."""
        self.epoch += 1
        self.store = self._make_store(self.layout)

    # The host store's arrays (HostKV): layer i's views keys[i] / values[i] [B, Nkv, length, D].
    @property
    def keys(self):
        return self.store.keys

    @property
    def values(self):
        return self.store.values

    @property
    def buffers(self) -> tuple:
        """Every KV buffer the lanes own (to keep a fenced worker's buffers alive)."""
        return self.store.buffers

    @property
    def nbytes(self) -> int:
        return self.store.nbytes

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
                    self._length[lane] = self._reach[lane] = 0
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
            if keep == 0:
                self._reach[lane] = 0

    def free(self, lane: int, keep: bool = False) -> None:
        """Give the lane back; with `keep` its length and KV stay until it is taken or allocated."""
        with self._lock:
            self._check(lane)
            self._in_use[lane] = False
            if not keep:
                self._length[lane] = self._reach[lane] = 0

    def clear(self, lane: int) -> None:
        """Forget the lane's tokens (and zero its KV rows) but keep it allocated."""
        with self._lock:
            self._check(lane)
            self._length[lane] = self._reach[lane] = 0
        self.store.clear(lane)

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

    def reach(self, lane: int) -> int:
        """Positions the lane's current content has covered since it was emptied (see the module doc)."""
        return self._reach[lane]

    def in_use(self, lane: int) -> bool:
        return self._in_use[lane]

    def free_count(self) -> int:
        return self._in_use.count(False)

    def write_new(self, src_rows: list[int], lanes: list[int], starts: list[int], counts: list[int], new_keys,
                  new_values) -> None:
        """Store a step's K/V ([layers, R, Nkv, S, D], from a graph that cannot write in place): row
        src_rows[i]'s first counts[i] tokens are positions starts[i].. of lane lanes[i], all layers at
        once (a ring layer's position p goes to row p mod ring)."""
        self.store.write_new(src_rows, lanes, starts, counts, new_keys, new_values)

    def advance(self, lane: int, n: int) -> None:
        self._length[lane] += n
        self._reach[lane] = max(self._reach[lane], self._length[lane] + 1)

    def reset_all(self) -> None:
        with self._lock:
            self.epoch += 1
            self._in_use = [False] * self.count
            self._length = [0] * self.count
            self._reach = [0] * self.count

    def _check(self, lane: int) -> None:
        if not 0 <= lane < self.count:
            raise RequestError("bad_lane", f"lane {lane} is out of range 0..{self.count - 1}")
        if not self._in_use[lane]:
            raise RequestError("lane_not_allocated", f"lane {lane} is not allocated")
