"""What flows through the engine: a validated request, its sequences, and the events it emits.

    GenerationRequest (frozen, validated)  --submit-->  RequestState (one per request, engine-owned)
                                                          └── Sequence x n (one lane each while running)
    events back to the caller, in order:  SequenceDelta ... then RequestDone | RequestFailed

A `Sequence` keeps everything needed to rebuild its KV from scratch (prompt + output so far), so
after a device reset the engine can re-prefill it and continue where it stopped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

from calculet.engine.detokenizer import IncrementalDetokenizer
from calculet.engine.sampler import SamplerConfig, SequenceSampler
from calculet.engine.stop import StopChecker
from calculet.errors import CalculetError, RequestError

MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 16


def _bad(field_name: str, value, allowed: str):
    raise RequestError("invalid_parameter", f"{field_name}={value!r} is out of range; allowed: {allowed}")


def check_output_options(max_tokens: int | None, min_tokens: int, n: int, logprobs: int | None,
                         stop: tuple[str, ...]) -> None:
    """The ranges of the output options, shared by `GenerationRequest` and the public
    `SamplingParams` (where max_tokens may still be None: whatever fits in the context)."""
    if max_tokens is not None and max_tokens < 1:
        _bad("max_tokens", max_tokens, "max_tokens >= 1")
    if min_tokens < 0 or (max_tokens is not None and min_tokens > max_tokens):
        _bad("min_tokens", min_tokens, "0 <= min_tokens <= max_tokens" + (f" ({max_tokens})" if max_tokens is not None else ""))
    if n < 1:
        _bad("n", n, "n >= 1")
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        _bad("logprobs", logprobs, f"0 <= logprobs <= {MAX_LOGPROBS}")
    if len(stop) > MAX_STOP_STRINGS:
        _bad("stop", f"{len(stop)} strings", f"at most {MAX_STOP_STRINGS} stop strings")
    if any(not isinstance(s, str) or not s for s in stop):
        _bad("stop", next(s for s in stop if not isinstance(s, str) or not s), "non-empty strings")


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    params: SamplerConfig
    max_tokens: int
    min_tokens: int = 0
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None          # None: off; k: the sampled token's logprob plus the top k
    timeout_s: float | None = None       # None: no limit
    # Teacher forcing (the golden check): output token i is forced_ids[i] whatever the sampler
    # picks; each delta's `sampled_ids` still says what the sampler picked.
    forced_ids: tuple[int, ...] = ()
    # Deliver the raw logits row [vocab] the first token is sampled from (after the prompt) in the
    # first delta's `prompt_logits`; that prefill fetches the full row.
    prompt_logits: bool = False

    def __post_init__(self):
        object.__setattr__(self, "prompt_ids", tuple(int(t) for t in self.prompt_ids))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "forced_ids", tuple(int(t) for t in self.forced_ids))
        check_output_options(self.max_tokens, self.min_tokens, self.n, self.logprobs, self.stop)
        if len(self.forced_ids) > self.max_tokens:
            _bad("forced_ids", f"{len(self.forced_ids)} tokens", f"at most max_tokens ({self.max_tokens}) forced tokens")
        if self.timeout_s is not None and not self.timeout_s > 0:
            _bad("timeout", self.timeout_s, "timeout > 0 seconds")


# --- events sent back to the caller ---------------------------------------------------------
@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()   # (token id, logprob), most likely first


@dataclass(frozen=True)
class SequenceDelta:
    """New output of one sequence after one step. `text` may be empty while text is held back."""
    index: int
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: str | None = None          # "stop" | "length" on the sequence's last delta
    sampled_ids: tuple[int, ...] = ()         # what the sampler picked: token_ids unless forced_ids
    prompt_logits: object = None              # float32 [vocab] on the first delta, if the request asked


@dataclass(frozen=True)
class RequestTimings:
    """The server's own clock for one request, in seconds (`arrived_unix` is wall-clock time)."""
    arrived_unix: float
    queue_s: float      # arrival -> first lane allocated
    prefill_s: float    # first lane allocated -> first token sampled
    decode_s: float     # first token -> last token
    ttft_s: float       # arrival -> first token
    total_s: float      # arrival -> finished

    def to_json(self) -> dict:
        return {"arrived_unix": round(self.arrived_unix, 6), "queue_s": round(self.queue_s, 6),
                "prefill_s": round(self.prefill_s, 6), "decode_s": round(self.decode_s, 6),
                "ttft_s": round(self.ttft_s, 6), "total_s": round(self.total_s, 6)}


@dataclass(frozen=True)
class RequestDone:
    prompt_tokens: int
    completion_tokens: int
    timings: RequestTimings
    cached_tokens: int = 0     # prompt tokens whose KV the prefix cache held (not prefilled again)


@dataclass(frozen=True)
class RequestFailed:
    error: CalculetError


Event = SequenceDelta | RequestDone | RequestFailed


# --- engine-side state ----------------------------------------------------------------------
@dataclass(eq=False)
class RequestState:
    id: int
    request: GenerationRequest
    sink: Callable[[Event], None]
    arrived: float = field(default_factory=time.perf_counter)
    arrived_unix: float = field(default_factory=time.time)
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished: bool = False
    sequences: list["Sequence"] = field(default_factory=list)

    @property
    def deadline(self) -> float | None:
        t = self.request.timeout_s
        return None if t is None else self.arrived + t

    def emit(self, event: Event) -> None:
        try:
            self.sink(event)
        except Exception:  # a caller that went away must never break the engine loop
            pass

    def timings(self, now: float) -> RequestTimings:
        admitted = self.admitted_at if self.admitted_at is not None else now
        first = self.first_token_at if self.first_token_at is not None else now
        last = self.last_token_at if self.last_token_at is not None else first
        return RequestTimings(self.arrived_unix, admitted - self.arrived, max(first - admitted, 0.0),
                              max(last - first, 0.0), first - self.arrived, now - self.arrived)

    def completion_tokens(self) -> int:
        return sum(len(s.output_ids) for s in self.sequences)

    def cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache (the best of the n sequences' admissions)."""
        return max((s.cached_tokens for s in self.sequences), default=0)


@dataclass(eq=False)
class Sequence:
    """One generated continuation. Holds a lane from admission until it finishes."""
    state: RequestState
    index: int
    sampler: SequenceSampler
    detok: IncrementalDetokenizer
    stop: StopChecker
    output_ids: list[int] = field(default_factory=list)
    lane: int | None = None
    prefilled: int = 0                                # tokens of kv_tokens() already in the lane
    cached_tokens: int = 0                            # prompt tokens the prefix cache had at admission
    last_token_at: float | None = None
    finish_reason: str | None = None

    @staticmethod
    def create(state: RequestState, index: int, tokenizer) -> "Sequence":
        req = state.request
        params = req.params
        if params.seed is not None and index:  # n > 1: distinct but reproducible streams
            params = replace(params, seed=params.seed + index)
        return Sequence(state, index, SequenceSampler(params, req.prompt_ids), IncrementalDetokenizer(tokenizer),
                        StopChecker(req.stop))

    def kv_tokens(self) -> tuple[int, ...]:
        """Tokens whose KV must be in the lane before the next decode step (the last sampled token
        is fed by that step)."""
        return self.state.request.prompt_ids + tuple(self.output_ids[:-1])

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
