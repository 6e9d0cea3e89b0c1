"""How many prompt tokens one engine step may prefill beside its decode rows (mixed steps).

A step runs one decode job over every decoding sequence and a slice of the waiting prompts' prefill
chunks. The slice is what decides the inter-token latency of every stream already decoding: they all
wait for it. Two limits bound it:

    max_prefill_tokens  P   prompt tokens per step, whatever else runs (the burst limit)
    step_token_budget   B   decode rows + prompt tokens per step while any sequence decodes
                            (0 or None: off, only P applies: the behaviour before mixed steps)

    prefill slice = P                       when nothing decodes (no stream waits: prefill at full speed)
                  = min(P, B - decode rows) when sequences decode

A TTFT target raises the slice for a prompt that would otherwise miss it:

    ttft_target_s       T   seconds from a request's arrival to its first token that the policy aims at
                            (0 or None: off, the budget alone decides)

    for the prefilling prompts in arrival order, with a_i the age of prompt i and R_i the prompt tokens
    left to prefill up to and including it (chunks run first come first served), and the step costs
    measured so far (d seconds per decode step, c seconds per prompt token):

        steps it can still afford   n_i = floor((T - a_i - R_i * c) / d)
        slice it needs              s_i = ceil(R_i / n_i)          (n_i < 1: it is late, asks for nothing)

    prefill slice = min(P, max(B - decode rows, max_i s_i))

so streams that decode pay the longer steps only while a prompt is at risk, and the budget keeps
inter-token latency steady the rest of the time. A prompt that can no longer make the target (it waited
for a lane, or the step costs rose) goes on at the budget's pace: a slice raised for it would stall every
stream and still miss (measured on the AVX2 kernels, open loop: raising such prompts to
max_prefill_tokens doubled the ITL P99, 0.34 s against 0.16 s, for one more request of 120 within the
SLO). Its tokens still count ahead of the prompts behind it.

Why a target at all: on the AVX2 kernels a prompt token costs ~3x what it does with AMX, and a fixed
72-token budget left 200-token prompts that arrived beside 4-8 decoding streams at 1.0-1.5 s TTFT.
Why it is off by default: in the open-loop benchmark nearly every miss had waited for a lane, and no
figure moved by more than the rounds' noise (benchmarks/RESULTS.md, 2026-12-06).

A burst (prompts that arrive while nothing decodes, as when a batch of clients all finished
together) is prefilled at full speed before any of it decodes, as llama.cpp prefills a batch:

    burst_prefill_tokens  H  a sequence that finishes its prefill while nothing decodes sends its first
                             token and waits while at most H prompt tokens are still to prefill, then
                             the burst decodes together (0: off, it decodes from the next step)

Each such stream gets one long gap after its first token instead of one slow budgeted step per
prompt of the burst, and the burst's streams stay in step, so they finish together and the next
burst again arrives while nothing decodes (with it off, they drift apart by the slices between their
prefills, and every later arrival slows the others' steps).

With a budget the chunks are planned from the compiled sizes that fit the slice (a 128-token graph
is not used for a 56-token slice), re-planned every step from where the prompt stands, so a prompt
that started alone in big chunks continues in small ones once streams decode beside it. The first
chunk of a step always runs (progress): when the slice is smaller than the smallest compiled chunk,
one smallest chunk runs and the step exceeds its budget by the difference.

Why chunked prefill and not one graph holding both: measured on the default model (2 shared cores,
one run, medians of 6 interleaved calls): decode_8 47-92 ms, prefill_16 48-87 ms, prefill_128
413-580 ms. Prefill costs about the same per token at any chunk size, so one fused "decode rows +
chunk" graph could save at most about one decode call's fixed cost per step (about 20% of a
decode_8 + prefill_16 step, 5% with prefill_128), while the stall itself (up to 512 prompt tokens
before a decode) is removed by bounding the slice, with no new graph kind in the calbin.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from calculet.engine.step_costs import StepCosts

DEFAULT_STEP_TOKEN_BUDGET = 72   # 8 decode rows + 64 prompt tokens (one 64-token chunk on the default calbin)
DEFAULT_BURST_PREFILL_TOKENS = 2048   # 8 lanes x 256-token prompts; about 1.5 s of prefill on 2 cores
DEFAULT_TTFT_TARGET_S: float | None = None   # off: measured, it moved no open-loop figure (benchmarks/RESULTS.md)


@dataclass(frozen=True)
class StepBudget:
    max_prefill_tokens: int = 512
    step_token_budget: int | None = DEFAULT_STEP_TOKEN_BUDGET   # None (or 0): no per-step budget
    burst_prefill_tokens: int = DEFAULT_BURST_PREFILL_TOKENS     # 0: a burst's streams decode at once
    ttft_target_s: float | None = DEFAULT_TTFT_TARGET_S           # None (or 0): the budget alone decides

    def __post_init__(self):
        if self.ttft_target_s == 0:
            object.__setattr__(self, "ttft_target_s", None)
        if self.ttft_target_s is not None and not self.ttft_target_s > 0:
            raise ValueError(f"--ttft-target must be > 0 seconds, or 0 for none, got {self.ttft_target_s}")
        if self.max_prefill_tokens < 1:
            raise ValueError(f"--max-prefill-tokens must be >= 1, got {self.max_prefill_tokens}")
        if self.step_token_budget == 0:
            object.__setattr__(self, "step_token_budget", None)
        if self.step_token_budget is not None and self.step_token_budget < 1:
            raise ValueError(f"--step-token-budget must be >= 1 token, or 0 for none, got {self.step_token_budget}")
        if self.burst_prefill_tokens < 0:
            raise ValueError(f"--burst-prefill-tokens must be >= 0 (0: off), got {self.burst_prefill_tokens}")

    def holds(self, prefill_left: int) -> bool:
        """Whether a burst's streams that finished prefilling keep waiting while `prefill_left` prompt
        tokens of the burst are still to prefill."""
        return 0 < prefill_left <= self.burst_prefill_tokens

    def prefill_slice(self, decode_rows: int, needed: int = 0) -> int:
        """Prompt tokens this step may prefill beside `decode_rows` decoding sequences, at least `needed`
        (what the TTFT target asks for, `needed_slice`) up to max_prefill_tokens; at least one chunk runs
        even when this is 0."""
        if self.step_token_budget is None or decode_rows == 0:
            return self.max_prefill_tokens
        return max(0, min(self.max_prefill_tokens, max(self.step_token_budget - decode_rows, needed)))

    def chunk_sizes(self, compiled: tuple[int, ...], decode_rows: int, needed: int = 0) -> tuple[int, ...]:
        """The compiled chunk sizes this step plans with: all of them without a budget (or when nothing
        decodes), else those that fit the slice (the smallest one when none does)."""
        if self.step_token_budget is None or decode_rows == 0:
            return tuple(compiled)
        limit = self.prefill_slice(decode_rows, needed)
        fitting = tuple(s for s in compiled if s <= limit)
        return fitting or (min(compiled),)

    def needed_slice(self, prompts: Iterable[tuple[float, int]], costs: StepCosts) -> int:
        """The prefill slice the TTFT target asks of this step (0: none beyond the budget).

        `prompts`: (seconds since arrival, prompt tokens left to prefill) of each prefilling prompt, in
        the order their chunks run. A prompt that cannot make the target in any number of steps asks for
        nothing (the budget's pace), though its tokens delay those behind it."""
        if self.ttft_target_s is None or self.step_token_budget is None or not costs.known:
            return 0
        need, ahead = 0, 0
        for age, left in prompts:
            ahead += left
            if left <= 0:
                continue
            spare = self.ttft_target_s - age - ahead * costs.prefill_token_s
            steps = math.floor(spare / costs.decode_step_s + 1e-9) if spare > 0 else 0
            if steps < 1:
                continue
            need = max(need, math.ceil(ahead / steps))
        return min(need, self.max_prefill_tokens)
