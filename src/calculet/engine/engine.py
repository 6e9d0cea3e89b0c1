"""The engine: continuous batching over one Device, on its own thread.

    engine = Engine(device, tokenizer, EngineConfig(max_queue=64))
    engine.start()
    rid = engine.submit(GenerationRequest(...), sink=events.put)   # thread-safe; raises at once on
    ...                                                            # a bad request or a full queue
    engine.cancel(rid)                                             # frees its lanes within one step

This is the one generation loop: the server, `calculet.LLM`, `calculet run` and the golden check all
submit requests here (in-process callers through `engine/local.py`). Every step reads:
schedule -> run -> sample -> emit, once per device job. Sequences join and leave the decode batch at
every step. A step is mixed: one decode job over every decoding sequence, then a bounded slice of
prompt chunks (engine/step_policy.py: `max_prefill_tokens`, and `step_token_budget` decode rows +
prompt tokens while sequences decode). Jobs run through engine/pipeline.py, `in_flight` deep: with
2, the host samples and streams one job's rows while the device runs the next.

Device errors: the requests whose job failed (the decode batch, or the sequence being prefilled)
fail with the device error; tokens of the step's earlier jobs were already sent, later results are
dropped. A job past `job_timeout_s` is a device error too (job_timeout): the
device fences its stuck worker off (`Device.fence`), so a late result never lands in a lane. `device.reset()` then forgets every lane, so every other sequence that
held a lane is sent back to the queue and re-prefills its prompt plus the output it already has,
then continues where it stopped (its sampler state is kept). Nothing the caller already received is
taken back. Health reads false from the failed job until the reset is done.

Lanes come and go through the prefix cache (engine/prefix_cache.py, `EngineConfig.prefix_cache`):
a finished sequence leaves its lane warm, and a new one whose tokens start the same way prefills only
the rest; a reset forgets every warm lane.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass, fields

import numpy as np

from calculet.engine.logprobs import token_logprob
from calculet.engine.observer import EngineObserver
from calculet.engine.prefix_cache import PrefixCache, PrefixCacheStats
from calculet.engine.requests import (Event, GenerationRequest, RequestDone, RequestFailed, RequestState, Sequence,
                                      SequenceDelta)
from calculet.engine.pipeline import IN_FLIGHT, JobPipeline, StepJob
from calculet.engine.scheduler import Scheduler, StepPlan
from calculet.engine.step_costs import StepCosts
from calculet.engine.step_policy import (DEFAULT_BURST_PREFILL_TOKENS, DEFAULT_STEP_TOKEN_BUDGET, DEFAULT_TTFT_TARGET_S,
                                         StepBudget)
from calculet.errors import CalculetError, DeviceError, RequestError
from calculet.runtime.device import JOB_TIMEOUT_S
from calculet.runtime.jobs import DecodeJob, JobResult, PrefillJob

log = logging.getLogger("calculet.engine")

RESET_RETRY_S = 5.0


def check_prompt(n_prompt: int, context: int) -> None:
    if n_prompt == 0:
        raise RequestError("empty_prompt", "the prompt is empty; give at least one token of text")
    if n_prompt >= context:
        raise RequestError("prompt_too_long", f"the prompt has {n_prompt} tokens but the context is {context} "
                           f"(at most {context - 1} prompt tokens leave room to generate)")


@dataclass(frozen=True)
class EngineConfig:
    max_queue: int = 128              # sequences that may wait for a lane; beyond, submit() says queue_full
    max_prefill_tokens: int = 512     # prompt tokens prefilled per step (at least one chunk runs)
    step_token_budget: int | None = DEFAULT_STEP_TOKEN_BUDGET   # decode rows + prompt tokens per step while
                                      # sequences decode (engine/step_policy.py); 0 or None: no such budget
    burst_prefill_tokens: int = DEFAULT_BURST_PREFILL_TOKENS   # a burst's prefilled streams wait while at
                                      # most this many of its prompt tokens are left (engine/step_policy.py); 0: off
    ttft_target_s: float | None = DEFAULT_TTFT_TARGET_S   # the step slice grows for a prompt that would miss
                                      # this first-token time (engine/step_policy.py); 0 or None: off
    in_flight: int = 2                # device jobs queued at once: 1 = immediate wait, 2 = ping/pong
    request_timeout_s: float | None = None
    job_timeout_s: float = JOB_TIMEOUT_S     # the longest one device job may take before it counts as failed
    prefix_cache: bool = True                # finished lanes stay warm; a prompt resumes from a matching prefix

    @classmethod
    def of(cls, options) -> EngineConfig:
        """The engine's share of a config that carries these options by the same names (the server's
        flags, one served model's spec); validated here."""
        return cls(**{f.name: getattr(options, f.name) for f in fields(cls)})

    def __post_init__(self):
        if self.max_queue < 0:
            raise RequestError("bad_option", f"--max-queue must be >= 0, got {self.max_queue}")
        if self.max_prefill_tokens < 1:
            raise RequestError("bad_option", f"--max-prefill-tokens must be >= 1, got {self.max_prefill_tokens}")
        if self.step_token_budget is not None and self.step_token_budget < 0:
            raise RequestError("bad_option", f"--step-token-budget must be >= 1 token, or 0 for none, got "
                               f"{self.step_token_budget}")
        if self.burst_prefill_tokens < 0:
            raise RequestError("bad_option", f"--burst-prefill-tokens must be >= 0 prompt tokens (0: off), got "
                               f"{self.burst_prefill_tokens}")
        if self.ttft_target_s is not None and self.ttft_target_s < 0:
            raise RequestError("bad_option", f"--ttft-target must be > 0 seconds, or 0 for none, got "
                               f"{self.ttft_target_s}")
        if self.in_flight not in IN_FLIGHT:
            raise RequestError("bad_option", f"--in-flight must be 1 or 2, got {self.in_flight}")
        if self.request_timeout_s is not None and not self.request_timeout_s > 0:
            raise RequestError("bad_option", f"--request-timeout must be > 0 seconds, got {self.request_timeout_s}")
        if not self.job_timeout_s > 0:
            raise RequestError("bad_option", f"--job-timeout must be > 0 seconds, got {self.job_timeout_s}")


@dataclass(frozen=True)
class EngineSnapshot:
    state: str                 # ready | recovering | failed | stopped
    running: int               # requests holding at least one lane
    waiting: int               # requests waiting for a lane
    waiting_sequences: int     # their sequences (one lane each)
    lanes_in_use: int
    lanes_free: int            # warm lanes included: any request may take them
    lanes_total: int
    prefix_cache: PrefixCacheStats = PrefixCacheStats()
    burst_held: int = 0        # sequences of a burst waiting, after their first token, for the rest of its prefill


@dataclass(frozen=True)
class Sample:
    seq: Sequence
    token: int                 # what the sequence continues with: the sampled token, or a forced one
    sampled: int               # what the sampler picked
    logprob: object            # TokenLogprob of `token` | None
    logits: object = None      # the raw row [vocab], when the request asked for its prompt logits


class Engine:
    def __init__(self, device, tokenizer, config: EngineConfig | None = None, observer: EngineObserver | None = None):
        self.device = device
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        self.observer = observer or EngineObserver()
        self.lanes = device.lanes
        self.context = device.lanes.context
        self.vocab_size = device.program.vocab_size
        self.candidates = device.program.candidates   # K of the on-graph sampling head, 0 without one
        self.budget = StepBudget(self.config.max_prefill_tokens, self.config.step_token_budget,
                                 self.config.burst_prefill_tokens, self.config.ttft_target_s)
        self.costs = StepCosts()      # measured per job; kept across device resets
        self.prefix_cache = PrefixCache(device.lanes, self.config.prefix_cache, device.program.max_rewind,
                                        device.program.manifest.kv.ring)
        self.scheduler = self._new_scheduler()
        self.pipeline = JobPipeline(device, self.config.in_flight, self.config.job_timeout_s)
        self.state = "ready"
        self._cond = threading.Condition()
        self._inbox: list[RequestState] = []
        self._cancels: set[int] = set()
        self._live: dict[int, RequestState] = {}      # engine thread only
        self._ids = itertools.count(1)
        self._stopping = False
        self._draining = False                        # set by begin_drain(): no new requests
        self._thread: threading.Thread | None = None
        self._snapshot = self._take_snapshot()

    def _new_scheduler(self) -> Scheduler:
        return Scheduler(self.lanes, self.device.program.chunk_sizes, self.budget, self.prefix_cache, self.costs)

    # --- caller side (any thread) --------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="calculet-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def begin_drain(self) -> None:
        """Admit no new request (submit says shutting_down); running and waiting ones go on."""
        with self._cond:
            self._draining = True

    def wait_idle(self, timeout: float, interrupt: threading.Event | None = None) -> bool:
        """Wait until no request is queued, waiting or running (True), or `timeout` seconds or
        `interrupt` come first (False). For shutdown: polls the published snapshot."""
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                snap, queued = self._snapshot, bool(self._inbox)
            if not queued and snap.running == 0 and snap.waiting == 0:
                return True
            left = deadline - time.monotonic()
            if left <= 0 or (interrupt is not None and interrupt.wait(min(left, 0.05))):
                return False
            if interrupt is None:
                time.sleep(min(left, 0.05))

    @property
    def healthy(self) -> bool:
        return self.state == "ready" and self.device.healthy

    def snapshot(self) -> EngineSnapshot:
        return self._snapshot

    def check(self, request: GenerationRequest) -> None:
        """Raise a RequestError if the request can never run on this device."""
        p, m, context = len(request.prompt_ids), request.max_tokens, self.context
        check_prompt(p, context)
        if p + m > context:
            raise RequestError("context_length_exceeded",
                               f"the prompt has {p} tokens and max_tokens is {m}: {p + m} tokens exceed the context of "
                               f"{context}; allowed: prompt tokens + max_tokens <= {context} (max_tokens <= {context - p} here)")
        if request.n > self.lanes.count:
            raise RequestError("invalid_parameter", f"n={request.n} is out of range; allowed: 1 <= n <= {self.lanes.count} "
                               f"(each choice needs its own lane)")
        vocab = self.vocab_size
        for name, ids in (("prompt", request.prompt_ids), ("stop_token_ids", request.stop_token_ids),
                          ("forced_ids", request.forced_ids)):
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise RequestError("invalid_parameter", f"{name} has token id {bad[0]}; allowed: 0 <= id <= {vocab - 1}")

    def submit(self, request: GenerationRequest, sink) -> int:
        """Queue a request; `sink(event)` is called from the engine thread with its events."""
        self.check(request)
        with self._cond:
            if self._stopping or self._draining:
                raise DeviceError("shutting_down", "the server is shutting down; retry on another instance")
            if self.state == "failed":
                raise DeviceError("device_unavailable", "the device failed and could not be reset yet; retry later")
            if not self._has_room(request.n):
                raise RequestError("queue_full", f"all {self.lanes.count} lanes are busy and the waiting queue is full "
                                   f"(--max-queue {self.config.max_queue}); retry shortly")
            state = RequestState(next(self._ids), request, sink)
            state.sequences = [Sequence.create(state, i, self.tokenizer) for i in range(request.n)]
            self._inbox.append(state)
            self._cond.notify()
        return state.id

    def cancel(self, request_id: int) -> None:
        """Drop the request wherever it is; its lanes are free after the current step."""
        with self._cond:
            self._cancels.add(request_id)
            self._cond.notify()

    def _has_room(self, n: int) -> bool:
        """Would at most max_queue sequences wait for a lane if this request joined? (Counted in
        sequences: a request with n=3 waits as 3.)"""
        snap = self._snapshot
        queued = snap.waiting_sequences + sum(s.request.n for s in self._inbox) + n
        return queued - snap.lanes_free <= self.config.max_queue

    # --- engine thread -------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._inbox and not self._cancels and not self.scheduler.has_work():
                    self._cond.wait(RESET_RETRY_S if self.state == "failed" else None)
                    if self.state == "failed":
                        break
                if self._stopping:
                    break
                inbox, self._inbox = self._inbox, []
                cancels, self._cancels = self._cancels, set()
                self._intake(inbox, cancels)     # under the lock, so admission counts stay exact
                self._snapshot = self._take_snapshot()
            try:
                self._expire()
                if self.state == "failed":
                    self._reset_device()
                if self.state == "ready":
                    self.step()
            except Exception as exc:  # a bug must not kill the server
                self._panic(exc)
            self._publish()
        self._fail_all(DeviceError("shutting_down", "the server is shutting down and ended this request before it "
                                   "finished (it ran past the drain timeout); retry on another instance"))
        self.state = "stopped"
        self._publish()

    def _intake(self, inbox: list[RequestState], cancels: set[int]) -> None:
        for state in inbox:
            self._live[state.id] = state
            self.scheduler.add(state)
        for rid in cancels:
            state = self._live.get(rid)
            if state is not None:
                self._end(state, "cancelled", RequestFailed(RequestError("cancelled", "the request was cancelled")))

    def _expire(self) -> None:
        now = time.perf_counter()
        for state in list(self._live.values()):
            if state.deadline is not None and now > state.deadline:
                err = RequestError("request_timeout", f"the request ran past its time limit of {state.request.timeout_s:g} s "
                                   f"(--request-timeout); lower max_tokens or raise the limit")
                self._end(state, "timeout", RequestFailed(err))

    def step(self) -> None:
        plan = self._schedule()
        if plan.empty:
            return
        failures, device_failure = [], None
        for item, outcome in self.pipeline.run(self._jobs(plan)):   # decode first, then prefill chunks
            if isinstance(outcome, CalculetError):
                failures.append((outcome, item.seqs))
                device_failure = device_failure or (outcome if isinstance(outcome, DeviceError) else None)
            elif device_failure is None:   # after a device error the lanes are forgotten: nothing is sampled
                self._observe(item, outcome)
                self._emit(self._sample(item, outcome))
        self._settle(failures, device_failure)

    def _schedule(self) -> StepPlan:
        now = time.perf_counter()
        plan = self.scheduler.schedule(now)
        for state in plan.admitted:
            self.observer.admitted(now - state.arrived, len(state.request.prompt_ids))
        self.observer.step(sum(len(w.tokens) for w in plan.prefill), len(plan.decode))
        if self.scheduler.raised:
            self.observer.slice_raised()
        return plan

    # --- run: one decode step, then the step's prefill chunks, on the device -------------------
    def _jobs(self, plan: StepPlan) -> list[StepJob]:
        """The step's device jobs in the order they run: decode first, so with two jobs in flight its
        rows are sampled and streamed while the device prefills. Only a prompt's last chunk needs
        logits: inner chunks skip the lm_head."""
        jobs = []
        if plan.decode:
            job = DecodeJob(tuple(s.lane for s in plan.decode), tuple(s.output_ids[-1] for s in plan.decode),
                            full_logits=not all(self._candidates_suffice(s, self._banned(s)) for s in plan.decode))
            jobs.append(StepJob("decode", job, tuple(plan.decode)))
        for work in plan.prefill:
            full = not self._candidates_suffice(work.seq, self._banned(work.seq))
            job = PrefillJob(work.seq.lane, work.tokens, want_logits=work.last, full_logits=full)
            jobs.append(StepJob("prefill", job, (work.seq,), work))
        return jobs

    def _observe(self, item: StepJob, result: JobResult) -> None:
        useful = len(item.work.tokens) if item.work is not None else len(item.seqs)
        self.observer.job(item.kind, result.timings, useful)
        t = result.timings
        seconds = t.input_prep + t.infer + t.output_fetch
        if item.kind == "decode":
            self.costs.decoded(seconds)
        else:
            self.costs.prefilled(seconds, useful)

    def _settle(self, failures: list, device_failure: CalculetError | None) -> None:
        """After the step's jobs: a device failure resets the device; request errors end their requests."""
        if device_failure is not None or not self.device.healthy:
            # jobs a fence failed before they ran (job_fenced) are not these requests' fault: they are requeued
            failed = [s.state for exc, seqs in failures for s in seqs if exc.code != "job_fenced"]
            self._recover(device_failure or DeviceError("device_unhealthy", "the device reported a failure"), failed)
            return
        for exc, seqs in failures:  # request errors: only these requests fail, the lanes are intact
            for seq in seqs:
                self._end(seq.state, "error", RequestFailed(exc))

    def _banned(self, seq: Sequence) -> tuple[int, ...]:
        """Token ids the sequence may not sample yet (end-of-sequence and stop ids before min_tokens)."""
        req = seq.state.request
        if len(seq.output_ids) >= req.min_tokens:
            return ()
        return tuple(t for t in (*self.tokenizer.eos_ids, *req.stop_token_ids) if 0 <= t < self.vocab_size)

    def _candidates_suffice(self, seq: Sequence, banned: tuple[int, ...]) -> bool:
        """Whether the sampling head's K candidates, less any banned ids among them, give exactly the
        token a full-row sample would: greedy or top-k <= what is left, no penalties, no logprobs,
        and not the first token of a request that asked for its prompt logits."""
        req = seq.state.request
        k = self.candidates - len(banned)
        if req.logprobs is not None or (req.prompt_logits and not seq.output_ids):
            return False
        return k >= 1 and seq.sampler.uses_candidates(k)

    # --- sample: one token per sequence that has logits -----------------------------------
    def _sample(self, item: StepJob, result: JobResult) -> list[Sample]:
        t0 = time.perf_counter()
        samples = []
        if item.work is not None:
            work = item.work
            if not work.seq.finished:
                self.scheduler.prefill_done(work)
                if work.last and not work.seq.output_ids:  # a resumed sequence already has its next token
                    samples.append(self._sample_one(work.seq, result, 0))
        else:
            samples = [self._sample_one(seq, result, r) for r, seq in enumerate(item.seqs) if not seq.finished]
        self.observer.sampled(time.perf_counter() - t0, len(samples))
        return samples

    def _sample_one(self, seq: Sequence, result: JobResult, row: int) -> Sample:
        req = seq.state.request
        logits = result.logits[row] if result.logits is not None else None   # None: the candidates suffice
        banned = self._banned(seq)
        candidates = None
        if result.topk_ids is not None and self._candidates_suffice(seq, banned):
            ids, values = result.topk_ids[row], result.topk_values[row]
            if banned:
                keep = ~np.isin(ids, banned)
                ids, values = ids[keep], values[keep]
            candidates = (ids, values)
        masked = logits
        if banned and candidates is None:  # the job fetched the full row for this sequence
            masked = logits.copy()
            masked[list(banned)] = -np.inf
        sampled = seq.sampler.sample(masked, candidates)
        at = len(seq.output_ids)
        token = req.forced_ids[at] if at < len(req.forced_ids) else sampled
        lp = token_logprob(logits, token, req.logprobs) if req.logprobs is not None else None
        prompt_row = logits.copy() if req.prompt_logits and not at else None
        return Sample(seq, token, sampled, lp, prompt_row)

    # --- emit: text deltas, finishes, lanes back ----------------------------------------
    def _emit(self, samples: list[Sample]) -> None:
        now = time.perf_counter()
        gaps = []
        for s in samples:
            seq, state, req = s.seq, s.seq.state, s.seq.state.request
            token = s.token
            seq.output_ids.append(token)
            seq.sampler.record(token)
            if seq.last_token_at is not None:
                gaps.append(now - seq.last_token_at)
            seq.last_token_at = state.last_token_at = now
            if state.first_token_at is None:
                state.first_token_at = now
                self.observer.first_token(now - state.arrived)
            ends_on_token = len(seq.output_ids) > req.min_tokens and (
                token in req.stop_token_ids or (not req.ignore_eos and token in self.tokenizer.eos_ids))
            reason = "stop" if ends_on_token else None
            if reason is None and (len(seq.output_ids) >= req.max_tokens or len(req.prompt_ids) + len(seq.output_ids) >= self.context):
                reason = "length"
            text = "" if ends_on_token else seq.detok.push(token)
            if reason is not None:
                text += seq.detok.flush()
            text, hit = seq.stop.push(text)
            if hit:
                reason = "stop"
            elif reason is not None:
                text += seq.stop.flush()
            lps = (s.logprob,) if s.logprob is not None else ()
            state.emit(SequenceDelta(seq.index, text, (token,), lps, reason, (s.sampled,), s.logits))
            if reason is not None:
                seq.finish_reason = reason
                self.scheduler.finish(seq)
                if all(x.finished for x in state.sequences):
                    self._end(state, reason, RequestDone(len(req.prompt_ids), state.completion_tokens(), state.timings(now),
                                                         state.cached_tokens()))
        if gaps:
            self.observer.inter_token(gaps)

    # --- endings and recovery --------------------------------------------------------------
    def _end(self, state: RequestState, outcome: str, event: Event) -> None:
        """Finish a request once: free its lanes, tell the caller, count it."""
        if state.finished:
            return
        state.finished = True
        for seq in state.sequences:
            if seq.finish_reason is None:
                seq.finish_reason = "abort"
            self.scheduler.finish(seq)
        self._live.pop(state.id, None)
        state.emit(event)
        self.observer.finished(outcome, time.perf_counter() - state.arrived)

    def _recover(self, error: CalculetError, failed: list[RequestState]) -> None:
        """Fail the requests of the failed batch, requeue every other lane holder, reset the device."""
        self.state = "recovering"
        self.observer.device_error(error.code)
        log.warning("device error (%s): %s; failing %d request(s), resetting the device", error.code, error.message, len(failed))
        for state in failed:
            self._end(state, "error", RequestFailed(DeviceError(error.code, f"the device failed while running this request: "
                                                               f"{error.message}; the device was reset, retry the request")))
        survivors = self.scheduler.holding_lanes()
        self.scheduler.requeue(survivors)
        self.observer.requeued(len(survivors))
        self._reset_device()

    def _reset_device(self) -> None:
        self.prefix_cache.clear()   # a reset (or the fence before it) leaves no warm KV
        t0 = time.perf_counter()
        try:
            self.device.reset()
        except CalculetError as exc:
            self.state = "failed"
            self.observer.device_reset(time.perf_counter() - t0, ok=False)
            log.error("device reset failed (%s): %s; retrying in %.0f s", exc.code, exc.message, RESET_RETRY_S)
            self._fail_all(DeviceError("device_unavailable", f"the device failed and could not be reset: {exc.message}"))
            return
        self.state = "ready"
        self.observer.device_reset(time.perf_counter() - t0, ok=True)
        log.warning("device reset done in %.2f s", time.perf_counter() - t0)

    def _panic(self, exc: Exception) -> None:
        """Last resort for an engine bug: fail every live request, start from an empty schedule."""
        log.exception("internal engine error; failing %d request(s) and resetting the device", len(self._live))
        error = DeviceError("engine_failure", f"internal engine error: {type(exc).__name__}: {exc}")
        for state in list(self._live.values()):
            state.finished = True
            state.emit(RequestFailed(error))
            self.observer.finished("error", time.perf_counter() - state.arrived)
        self._live.clear()
        self.scheduler = self._new_scheduler()
        self.state = "recovering"
        self._reset_device()

    def _fail_all(self, error: CalculetError) -> None:
        """End every request the engine accepted: running, waiting, and those still in the inbox (accepted
        while a reset ran, or as shutdown began), which would otherwise wait for a later retry or forever."""
        with self._cond:
            accepted, self._inbox = self._inbox, []
        for state in accepted:
            self._live[state.id] = state
        for state in list(self._live.values()):
            self._end(state, "error", RequestFailed(error))

    # --- snapshot for metrics and admission ------------------------------------------------
    def _take_snapshot(self) -> EngineSnapshot:
        free = self.lanes.free_count()
        return EngineSnapshot(self.state, self.scheduler.running_requests(), self.scheduler.waiting_requests(),
                              len(self.scheduler.waiting), self.lanes.count - free, free, self.lanes.count,
                              self.prefix_cache.stats(), len(self.scheduler.held))

    def _publish(self) -> None:
        snap = self._take_snapshot()
        with self._cond:
            self._snapshot = snap
