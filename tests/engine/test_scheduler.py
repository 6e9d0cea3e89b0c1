"""The scheduler's step plans (engine/scheduler.py) over real `Lanes`, no device, on a clock the test
sets: how far the TTFT target raises a step's prefill slice beside decoding streams."""

from __future__ import annotations

from calculet.calbin.manifest import KVLayout
from calculet.engine.requests import GenerationRequest, RequestState, Sequence
from calculet.engine.sampler import SamplerConfig
from calculet.engine.scheduler import Scheduler
from calculet.engine.step_costs import StepCosts
from calculet.engine.step_policy import StepBudget
from calculet.runtime.lanes import Lanes

CHUNKS = (16, 64, 128)
BUDGET = 72   # one decoding stream: a slice of 71 prompt tokens


def request(rid: int, tokens: int, arrived: float) -> RequestState:
    req = GenerationRequest(tuple(range(1, tokens + 1)), SamplerConfig(temperature=0.0), 8)
    state = RequestState(rid, req, lambda event: None, arrived=arrived)
    state.sequences = [Sequence.create(state, 0, tokenizer=None)]
    return state


def scheduler(ttft_target_s: float | None) -> Scheduler:
    """One stream decoding, and measured costs of 50 ms per decode step and 1 ms per prompt token."""
    lanes = Lanes(KVLayout("BNSH", "float32", 1, 4, 1, 1024, 2, True, (1024,)))
    costs = StepCosts()
    costs.decoded(0.050)
    costs.prefilled(0.100, 100)
    sched = Scheduler(lanes, CHUNKS, StepBudget(512, BUDGET, burst_prefill_tokens=0, ttft_target_s=ttft_target_s),
                      costs=costs)
    sched.add(request(1, 10, arrived=0.0))
    for work in sched.schedule(now=0.0).prefill:
        sched.prefill_done(work)
    sched.schedule(now=0.0)   # the finished prompt leaves the (burst) hold and decodes
    assert len(sched.decoding) == 1
    return sched


def planned(sched: Scheduler, now: float) -> int:
    return sum(len(w.tokens) for w in sched.schedule(now).prefill)


def test_a_prompt_at_risk_gets_a_raised_slice():
    """A 200-token prompt 0.7 s old has 0.1 s left after its 0.2 s of prefill: two decode steps, so
    ~100 tokens a step, past the budget's 71."""
    sched = scheduler(1.0)
    sched.add(request(2, 200, arrived=0.0))
    got = planned(sched, now=0.7)
    assert sched.raised and BUDGET - 1 < got <= 100, got


def test_a_fresh_prompt_keeps_the_budget():
    sched = scheduler(1.0)
    sched.add(request(2, 200, arrived=0.0))
    got = planned(sched, now=0.0)
    assert not sched.raised and got <= BUDGET - 1, got


def test_a_late_prompt_keeps_the_budget():
    """0.95 s old: no number of steps makes the target any more, so it asks for nothing."""
    sched = scheduler(1.0)
    sched.add(request(2, 200, arrived=0.0))
    got = planned(sched, now=0.95)
    assert not sched.raised and got <= BUDGET - 1, got


def test_without_a_target_the_budget_alone_decides():
    sched = scheduler(None)
    sched.add(request(2, 200, arrived=0.0))
    got = planned(sched, now=0.7)
    assert not sched.raised and got <= BUDGET - 1, got
