"""Jobs the device runs, their handles and results.

A `PrefillJob` runs one chunk of one lane's prompt through a prefill graph (or, near the end of the
context, through the decode graph); a `DecodeJob` advances several lanes by one token each.

Every job names a staging `slot` (0 or 1): the device keeps one set of IO-binding arrays per slot,
so two jobs in flight (ping/pong) never share input or output buffers. A caller reuses a slot only
after it has taken the result of the job that last used it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from calculet.calbin.memory_plan import STAGING_SLOTS
from calculet.errors import CalculetError

__all__ = ["STAGING_SLOTS", "PrefillJob", "DecodeJob", "Job", "PhaseTimings", "JobResult", "JobHandle"]


@dataclass(frozen=True)
class PrefillJob:
    lane: int
    tokens: tuple[int, ...]     # appended at the lane's current length
    want_logits: bool = True    # False for a prompt's inner chunks: only the KV matters, the head is skipped
    full_logits: bool = True    # False: only the sampling head's candidates come back (when the graph has them)
    slot: int = 0               # staging set (ping/pong): 0 .. STAGING_SLOTS - 1
    kind: str = "prefill"

    def __post_init__(self):
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))


@dataclass(frozen=True)
class DecodeJob:
    lanes: tuple[int, ...]      # distinct lanes, each gets one token
    tokens: tuple[int, ...]
    full_logits: bool = True    # False: only the sampling head's candidates come back (when the graph has them)
    slot: int = 0               # staging set (ping/pong): 0 .. STAGING_SLOTS - 1
    kind: str = "decode"

    def __post_init__(self):
        object.__setattr__(self, "lanes", tuple(int(x) for x in self.lanes))
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))


Job = PrefillJob | DecodeJob


@dataclass(frozen=True)
class PhaseTimings:
    """Seconds spent per phase of one job, measured on the worker thread."""
    queued: float = 0.0        # submit -> start
    input_prep: float = 0.0    # filling input staging buffers
    infer: float = 0.0         # graph execution
    output_fetch: float = 0.0  # copying logits out of the output staging buffer
    graph: str = ""            # graph that ran
    computed_tokens: int = 0   # lanes x tokens the graph computed (padding included)


@dataclass(frozen=True)
class JobResult:
    logits: np.ndarray | None  # [len(job lanes), vocab] float32, rows in the job's lane order (None: not asked for)
    timings: PhaseTimings
    topk_ids: np.ndarray | None = None     # [rows, K] int64 from the on-graph sampling head, best first
    topk_values: np.ndarray | None = None  # [rows, K] float32 logits of those ids


@dataclass
class JobHandle:
    job: Job
    id: int
    submitted_at: float
    _done: threading.Event = field(default_factory=threading.Event, repr=False)
    _result: JobResult | None = None
    _error: CalculetError | None = None

    def done(self) -> bool:
        return self._done.is_set()

    def _finish(self, result: JobResult | None = None, error: CalculetError | None = None) -> None:
        """The first outcome wins: a job failed by a fence stays failed if its worker returns later."""
        with _FINISH_LOCK:
            if self._done.is_set():
                return
            self._result, self._error = result, error
            self._done.set()


_FINISH_LOCK = threading.Lock()
