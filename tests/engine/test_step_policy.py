"""The mixed-step budget: how many prompt tokens a step may prefill beside its decode rows."""

from __future__ import annotations

import pytest

from calculet.engine.step_costs import StepCosts
from calculet.engine.step_policy import DEFAULT_STEP_TOKEN_BUDGET, StepBudget


def test_without_a_budget_only_max_prefill_tokens_applies():
    """0 or None keeps the behaviour from before mixed steps: the whole burst, every compiled chunk."""
    for off in (0, None):
        b = StepBudget(512, off)
        assert b.step_token_budget is None
        assert b.prefill_slice(8) == 512 and b.chunk_sizes((16, 128), 8) == (16, 128)


def test_budget_bounds_the_slice_beside_decode_rows():
    b = StepBudget(512, 64)
    assert b.prefill_slice(0) == 512            # nothing decodes: no stream waits, prefill at full speed
    assert b.chunk_sizes((16, 128), 0) == (16, 128)
    assert b.prefill_slice(8) == 56             # 64 - 8 decode rows
    assert b.chunk_sizes((16, 128), 8) == (16,)
    assert StepBudget(40, 200).prefill_slice(8) == 40   # max_prefill_tokens still caps it
    assert StepBudget(512, 136).chunk_sizes((16, 128), 8) == (16, 128)


def test_a_slice_smaller_than_every_chunk_still_plans_the_smallest():
    """Progress: with more decode rows than budget, one smallest chunk still runs."""
    b = StepBudget(512, 8)
    assert b.prefill_slice(8) == 0 and b.chunk_sizes((16, 128), 8) == (16,)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_prefill_tokens": 0}, "--max-prefill-tokens must be >= 1"),
    ({"step_token_budget": -3}, "--step-token-budget must be >= 1 token, or 0 for none"),
])
def test_bad_budgets_say_the_allowed_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StepBudget(**kwargs)


def test_default_fits_a_full_decode_batch_of_the_default_model():
    """The default leaves room for one 64-token chunk beside the default calbin's 8 lanes."""
    assert StepBudget().chunk_sizes((16, 64, 128), 8) == (16, 64) and StepBudget().prefill_slice(8) == 64
    assert DEFAULT_STEP_TOKEN_BUDGET == 72


def test_a_burst_holds_while_its_prefill_left_is_within_the_limit():
    b = StepBudget(512, 64, 100)
    assert b.holds(1) and b.holds(100)
    assert not b.holds(0)        # nothing left: the burst decodes
    assert not b.holds(101)      # too much left: the prefilled streams decode beside it (budgeted)
    assert not StepBudget(512, 64, 0).holds(5)
    with pytest.raises(ValueError, match="--burst-prefill-tokens must be >= 0"):
        StepBudget(512, 64, -1)


def costs(decode_s: float, token_s: float) -> StepCosts:
    c = StepCosts()
    c.decoded(decode_s)
    c.prefilled(token_s * 100, 100)
    return c


def test_ttft_target_raises_the_slice_only_for_a_prompt_at_risk():
    """Decode steps of 50 ms, 1 ms per prompt token, target 1 s: a fresh 200-token prompt affords
    (1 - 0.2) / 0.05 = 16 steps, so the 64-token budget (4 steps) already makes it; one that has
    waited 0.9 s affords 0 steps: it is late and asks for nothing; one at 0.6 s affords 4: 50 tokens."""
    b = StepBudget(512, 72, ttft_target_s=1.0)
    c = costs(0.050, 0.001)
    assert b.needed_slice([(0.0, 200)], c) <= 64
    assert b.prefill_slice(8, b.needed_slice([(0.0, 200)], c)) == 64
    assert b.needed_slice([(0.9, 200)], c) == 0
    assert b.needed_slice([(0.6, 200)], c) == 50      # floor((1 - 0.6 - 0.2) / 0.05) = 4 steps
    assert b.needed_slice([(0.55, 200)], c) == 40     # 5 steps
    assert b.prefill_slice(8, 128) == 128 and b.chunk_sizes((16, 64, 128), 8, 128) == (16, 64, 128)


def test_ttft_target_counts_the_prompts_ahead_in_arrival_order():
    """The second prompt's first token waits for the first prompt's chunks too."""
    b = StepBudget(512, 72, ttft_target_s=1.0)
    c = costs(0.050, 0.001)
    alone = b.needed_slice([(0.3, 200)], c)              # floor(0.5 / 0.05) = 10 steps: 20 tokens
    behind = b.needed_slice([(0.0, 200), (0.3, 200)], c)  # 400 tokens in floor(0.3 / 0.05) = 6 steps
    assert (alone, behind) == (20, 67)
    # a late prompt ahead asks for nothing itself, but its 200 tokens still delay the one behind it
    assert b.needed_slice([(0.9, 200), (0.3, 200)], c) == 67


def test_ttft_target_is_idle_without_costs_budget_or_target():
    at_risk = [(0.6, 200)]   # asks for 50 tokens with a target and costs
    assert StepBudget(512, 72, ttft_target_s=1.0).needed_slice(at_risk, StepCosts()) == 0   # nothing measured yet
    assert StepBudget(512, 72, ttft_target_s=0).needed_slice(at_risk, costs(0.05, 0.001)) == 0
    assert StepBudget(512, 0, ttft_target_s=1.0).needed_slice(at_risk, costs(0.05, 0.001)) == 0   # no budget: full speed anyway
    assert StepBudget(40, 72, ttft_target_s=1.0).needed_slice([(0.6, 200)], costs(0.05, 0.001)) == 40  # max_prefill_tokens caps it
    with pytest.raises(ValueError, match="--ttft-target must be > 0 seconds, or 0 for none"):
        StepBudget(512, 72, ttft_target_s=-1)

