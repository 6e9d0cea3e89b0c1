"""Which work runs in the next engine step: one decode step over every sequence that is decoding,
plus a bounded slice of the waiting prompts' prefill chunks (a mixed step).

    waiting ──admit (a lane is free)──▶ prefilling ──last chunk──▶ decoding ──finish──▶ (lane freed)
       ▲                                     │                         │
       └────────── requeue (device reset: every lane forgotten) ───────┘

Prefill is chunked, first come first served: each step takes the prefilling prompts' next chunks
while they fit the step's prefill slice (always at least one chunk). The slice and the chunk sizes
come from the `StepBudget` policy (engine/step_policy.py): `max_prefill_tokens` per step, and with
a `step_token_budget` at most budget - decode rows while sequences decode, in chunks no larger than
that, so no decoding stream waits a whole burst of prefill. A larger slice gets new requests into
the decode batch in fewer steps (throughput, TTFT); a smaller one keeps inter-token latency steady:
vLLM's max_num_batched_tokens trade-off. Chunks are planned every step from where each prompt
stands. A sequence keeps its lane until it finishes; `finish` is the only way a lane is given back.

A burst (engine/step_policy.py, `burst_prefill_tokens`): a sequence that finishes prefilling while
nothing decodes is held (its first token is sent) until the rest of the burst is prefilled, then the
burst decodes together:

    prefilling ──last chunk, nothing decoding──▶ held ──burst prefilled (or too much left)──▶ decoding

Lanes are got and given back through the prefix cache (engine/prefix_cache.py): admission may get a
warm lane that already holds the sequence's first tokens (prefill starts after them), and a sequence
that finished normally leaves its lane warm.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import lru_cache

from calculet.engine.prefix_cache import PrefixCache
from calculet.engine.requests import RequestState, Sequence
from calculet.engine.step_costs import StepCosts
from calculet.engine.step_policy import StepBudget
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


@lru_cache(maxsize=4096)
def _plan(n_tokens: int, start: int, sizes: tuple[int, ...], context: int) -> tuple[int, ...]:
    """plan_chunks, remembered: every step re-plans each prefilling prompt from where it stands."""
    return tuple(plan_chunks(n_tokens, start, sizes, context))


class Scheduler:
    def __init__(self, lanes: Lanes, chunk_sizes: tuple[int, ...], budget: StepBudget,
                 cache: PrefixCache | None = None, costs: StepCosts | None = None):
        self.lanes = lanes
        self.costs = costs if costs is not None else StepCosts()   # measured by the engine: the TTFT target's estimates
        self.cache = cache if cache is not None else PrefixCache(lanes, enabled=False)
        self.chunk_sizes = tuple(chunk_sizes)
        self.budget = budget
        self.waiting: deque[Sequence] = deque()
        self.prefilling: deque[Sequence] = deque()
        self.decoding: list[Sequence] = []
        self.held: list[Sequence] = []          # a burst's prefilled sequences, waiting for the rest of it
        self.raised = False                     # the last plan's slice was raised by the TTFT target

    # --- queue ---------------------------------------------------------------------------
    def add(self, state: RequestState) -> None:
        self.waiting.extend(state.sequences)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding or self.held)

    def waiting_requests(self) -> int:
        return len({s.state.id for s in self.waiting})

    def running_requests(self) -> int:
        return len({s.state.id for s in self.holding_lanes()})

    def holding_lanes(self) -> list[Sequence]:
        return list(self.prefilling) + self.held + self.decoding

    # --- one step ------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan:
        admitted = self._admit(now)
        if self.held and not self.budget.holds(self.prefill_left()):
            self.decoding.extend(self.held)
            self.held.clear()
        return StepPlan(self._prefill_work(now), tuple(self.decoding), admitted)

    def prefill_left(self) -> int:
        """Prompt tokens the admitted sequences still have to prefill."""
        return sum(len(s.kv_tokens()) - s.prefilled for s in self.prefilling)

    def _prefill_work(self, now: float) -> tuple[PrefillWork, ...]:
        """The next chunks in arrival order while they fit the step's prefill slice (raised for a prompt
        at risk of missing the TTFT target); the first always runs."""
        rows = len(self.decoding)
        needed = self.budget.needed_slice(((now - s.state.arrived, len(s.kv_tokens()) - s.prefilled)
                                           for s in self.prefilling), self.costs) if rows else 0
        limit = self.budget.prefill_slice(rows, needed)
        self.raised = limit > self.budget.prefill_slice(rows)
        sizes = self.budget.chunk_sizes(self.chunk_sizes, rows, needed)
        work, planned = [], 0
        for seq in self.prefilling:
            tokens = seq.kv_tokens()
            done = seq.prefilled
            pieces = _plan(len(tokens) - done, done, sizes, self.lanes.context)
            for i, n in enumerate(pieces):
                if work and planned + n > limit:
                    return tuple(work)
                work.append(PrefillWork(seq, tokens[done:done + n], last=i == len(pieces) - 1))
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
            if seq.state.admitted_at is None:
                seq.state.admitted_at = now
                admitted.append(seq.state)
            self.prefilling.append(seq)
        return tuple(admitted)

    def prefill_done(self, work: PrefillWork) -> None:
        """The chunk ran: advance the sequence; after its last chunk it decodes from the next step, or
        is held with the burst when nothing decodes yet."""
        seq = work.seq
        seq.prefilled += len(work.tokens)
        if work.last:
            self.prefilling.remove(seq)
            (self.decoding if self.decoding else self.held).append(seq)

    # --- leaving -------------------------------------------------------------------------
    def finish(self, seq: Sequence) -> None:
        """Remove the sequence wherever it is and give its lane back: warm (its KV reusable) when it
        decoded to a normal end, cold when it was cancelled, timed out or failed."""
        decoded = seq in self.decoding or seq in self.held   # held: prefilled, its first token sent
        for queue in (self.waiting, self.prefilling, self.held, self.decoding):
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
            for queue in (self.prefilling, self.held, self.decoding):
                if seq in queue:
                    queue.remove(seq)
            seq.lane, seq.prefilled = None, 0
        self.waiting.extendleft(reversed(seqs))
