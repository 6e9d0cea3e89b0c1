"""How many prompt tokens one engine step may prefill beside its decode rows (mixed steps).

A step runs one decode job over every decoding sequence and a slice of the waiting prompts' prefill
chunks. The slice is what decides the inter-token latency of every stream already decoding: they all
wait for it. Two limits bound it:

    max_prefill_tokens  P   prompt tokens per step, whatever else runs (the burst limit)
    step_token_budget   B   decode rows + prompt tokens per step while any sequence decodes
                            (0 or None: off, only P applies: the behaviour before mixed steps)

    prefill slice = P                       when nothing decodes (no stream waits: prefill at full speed)
                  = min(P, B - decode rows) when sequences decode

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

from dataclasses import dataclass

DEFAULT_STEP_TOKEN_BUDGET = 72   # 8 decode rows + 64 prompt tokens (one 64-token chunk on the default calbin)
DEFAULT_BURST_PREFILL_TOKENS = 2048   # 8 lanes x 256-token prompts; about 1.5 s of prefill on 2 cores


@dataclass(frozen=True)
class StepBudget:
    max_prefill_tokens: int = 512
    step_token_budget: int | None = DEFAULT_STEP_TOKEN_BUDGET   # None (or 0): no per-step budget
    burst_prefill_tokens: int = DEFAULT_BURST_PREFILL_TOKENS     # 0: a burst's streams decode at once

    def __post_init__(self):
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

    def prefill_slice(self, decode_rows: int) -> int:
        """Prompt tokens this step may prefill beside `decode_rows` decoding sequences (at least one
        chunk runs even when this is 0)."""
        if self.step_token_budget is None or decode_rows == 0:
            return self.max_prefill_tokens
        return max(0, min(self.max_prefill_tokens, self.step_token_budget - decode_rows))

    def chunk_sizes(self, compiled: tuple[int, ...], decode_rows: int) -> tuple[int, ...]:
        """The compiled chunk sizes this step plans with: all of them without a budget (or when nothing
        decodes), else those that fit the slice (the smallest one when none does)."""
        if self.step_token_budget is None or decode_rows == 0:
            return tuple(compiled)
        limit = self.prefill_slice(decode_rows)
        fitting = tuple(s for s in compiled if s <= limit)
        return fitting or (min(compiled),)
