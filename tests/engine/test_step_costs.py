"""The step costs the TTFT target plans with, measured from finished jobs."""

from __future__ import annotations

import pytest

from calculet.engine.step_costs import StepCosts


def test_step_costs_weigh_prefill_chunks_by_their_tokens():
    c = StepCosts()
    assert not c.known
    c.prefilled(0.015, 8)          # a small chunk's fixed cost dominates: 1.9 ms per token
    c.decoded(0.040)
    assert c.known and c.decode_step_s == pytest.approx(0.040)
    for _ in range(30):
        c.prefilled(0.060, 128)    # 0.47 ms per token
        c.decoded(0.030)
    assert c.prefill_token_s == pytest.approx(0.060 / 128, rel=1e-3)
    assert c.decode_step_s == pytest.approx(0.030, rel=1e-3)
    c.prefilled(0.015, 8)          # one small chunk moves the per-token cost only by its share of tokens
    assert c.prefill_token_s < 0.6e-3
