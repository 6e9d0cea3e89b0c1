"""Which work runs in the next engine step: prefill chunks up to a token budget, plus one decode
step over every sequence that is decoding.

    waiting ──admit (a lane is free)──▶ prefilling ──last chunk──▶ decoding ──finish──▶ (lane freed)
       ▲                                     │                         │
       └────────── requeue (device reset: every lane forgotten) ───────┘

Prefill is chunked, first come first served: each step takes the waiting prompts' next chunks until
`prefill_budget` prompt tokens are planned (always at least one chunk), so a long prompt stalls the
streams that are already decoding by at most about one budget's worth of prefill. A larger budget
gets a burst of new requests into the decode batch in fewer steps (fewer part-full decode steps,
higher throughput, lower TTFT); a smaller one keeps inter-token latency steadier. It is vLLM's
max_num_batched_tokens trade-off, applied to prompt tokens. A sequence keeps its lane until it
finishes; `finish` is the only way a lane is given back.

Lanes are got and given back through the prefix cache (engine/prefix_cache.py): admission may get a
warm lane that already holds the sequence's first tokens (prefill starts after them), and a sequence
that finished normally leaves its lane warm.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from calculet.engine.prefix_cache import PrefixCache
from calculet.engine.requests import RequestState, Sequence
from calculet.runtime.chunking import plan_chunks
from calculet.runtime.lanes import Lanes


@dataclass(frozen=True)
class PrefillWork:
    seq: Sequence
    tokens: tuple[int, ...]
    last: bool                 # this chunk completes the sequence's KV


@dataclass(frozen=True)
class StepPlan:
    prefill: tuple[PrefillWork, ...]   # run in this order (a sequence's chunks are consecutive)
    decode: tuple[Sequence, ...]
    admitted: tuple[RequestState, ...] = ()     # requests that got their first lane this step

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode


class Scheduler:
    def __init__(self, lanes: Lanes, chunk_sizes: tuple[int, ...], prefill_budget: int,
                 cache: PrefixCache | None = None):
        if prefill_budget < 1:
            raise ValueError(f"prefill_budget must be >= 1 token, got {prefill_budget}")
        self.lanes = lanes
        self.cache = cache if cache is not None else PrefixCache(lanes, enabled=False)
        self.chunk_sizes = tuple(chunk_sizes)
        self.prefill_budget = prefill_budget
        self.waiting: deque[Sequence] = deque()
        self.prefilling: deque[Sequence] = deque()
        self.decoding: list[Sequence] = []

    # --- queue ---------------------------------------------------------------------------
    def add(self, state: RequestState) -> None:
        self.waiting.extend(state.sequences)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

    def waiting_requests(self) -> int:
        return len({s.state.id for s in self.waiting})

    def running_requests(self) -> int:
        return len({s.state.id for s in self.holding_lanes()})

    def holding_lanes(self) -> list[Sequence]:
        return list(self.prefilling) + self.decoding

    # --- one step ------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan:
        admitted = self._admit(now)
        return StepPlan(self._prefill_work(), tuple(self.decoding), admitted)

    def _prefill_work(self) -> tuple[PrefillWork, ...]:
        """The next chunks in arrival order while they fit the budget; the first always runs."""
        work, planned = [], 0
        for seq in self.prefilling:
            done = seq.prefilled
            for i, n in enumerate(seq.pieces):
                if work and planned + n > self.prefill_budget:
                    return tuple(work)
                tokens = seq.kv_tokens()[done:done + n]
                work.append(PrefillWork(seq, tokens, last=i == len(seq.pieces) - 1))
                planned += n
                done += n
        return tuple(work)

    def _admit(self, now: float) -> tuple[RequestState, ...]:
        admitted = []
        while self.waiting and self.cache.can_allocate():
            seq = self.waiting.popleft()
            tokens = seq.kv_tokens()
            grant = self.cache.allocate(tokens)
            seq.lane, seq.prefilled = grant.lane, grant.cached
            seq.cached_tokens = min(grant.cached, len(seq.state.request.prompt_ids))
            seq.pieces = plan_chunks(len(tokens) - grant.cached, grant.cached, self.chunk_sizes, self.lanes.context)
            if seq.state.admitted_at is None:
                seq.state.admitted_at = now
                admitted.append(seq.state)
            self.prefilling.append(seq)
        return tuple(admitted)

    def prefill_done(self, work: PrefillWork) -> None:
        """The chunk ran: advance the sequence; after its last chunk it decodes from the next step."""
        seq = work.seq
        seq.pieces.pop(0)
        seq.prefilled += len(work.tokens)
        if work.last:
            self.prefilling.remove(seq)
            self.decoding.append(seq)

    # --- leaving -------------------------------------------------------------------------
    def finish(self, seq: Sequence) -> None:
        """Remove the sequence wherever it is and give its lane back: warm (its KV reusable) when it
        decoded to a normal end, cold when it was cancelled, timed out or failed."""
        decoded = seq in self.decoding
        for queue in (self.waiting, self.prefilling, self.decoding):
            if seq in queue:
                queue.remove(seq)
        if seq.lane is not None:
            valid = decoded and seq.finish_reason in ("stop", "length")
            self.cache.release(seq.lane, seq.kv_tokens() if valid else None)
            seq.lane = None

    def requeue(self, seqs: list[Sequence]) -> None:
        """After a device reset forgot every lane: send these back to the front of the queue; they
        re-prefill prompt + output so far and carry on."""
        for seq in seqs:
            for queue in (self.prefilling, self.decoding):
                if seq in queue:
                    queue.remove(seq)
            seq.lane, seq.pieces, seq.prefilled = None, [], 0
        self.waiting.extendleft(reversed(seqs))
