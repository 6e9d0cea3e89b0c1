"""The mixed-step budget: how many prompt tokens a step may prefill beside its decode rows."""

from __future__ import annotations

import pytest

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
