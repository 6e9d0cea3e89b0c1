"""Mixed steps and two jobs in flight give each request the tokens it gets alone, under concurrency
(requests arriving while others decode, more requests than lanes), on a tiny model."""

from __future__ import annotations

import pytest

from calculet.engine.engine import Engine, EngineConfig
from calculet.engine.observer import EngineObserver
from calculet.engine.pipeline import JobPipeline, StepJob
from calculet.engine.requests import GenerationRequest, RequestDone, SequenceDelta
from calculet.engine.sampler import SamplerConfig
from calculet.engine.tokenizer import TextTokenizer
from calculet.errors import RequestError
from calculet.runtime.device import Device
from calculet.runtime.jobs import DecodeJob, PrefillJob
from decoding import greedy_through_engine, greedy_together, prefill

GREEDY = SamplerConfig(temperature=0.0)
TOKENS = 8
PROMPT_LENGTHS = (3, 37, 9, 50, 21, 6)   # 6 requests through 4 lanes; chunks (4, 16)


class Steps(EngineObserver):
    def __init__(self):
        self.steps: list[tuple[int, int]] = []    # (prefill tokens, decode rows)
        self.held: list[int] = []                 # sequences a burst held at each step (once `engine` is set)
        self.raised = 0                           # steps the TTFT target raised past the budget
        self.engine = None

    def slice_raised(self):
        self.raised += 1

    def step(self, prefill_tokens, decode_rows):
        self.steps.append((prefill_tokens, decode_rows))
        if self.engine is not None:
            self.held.append(len(self.engine.scheduler.held))


@pytest.fixture(scope="module")
def calbin(tiny_calbin):
    return tiny_calbin("llama")          # 4 lanes, context 64, chunks (4, 16)


@pytest.fixture(scope="module")
def device(calbin):
    d = Device()
    d.configure(d.load(calbin))
    yield d
    d.close()


def prompts(vocab: int) -> list[list[int]]:
    return [[(7 * i + 13 * n) % (vocab - 3) + 3 for i in range(n)] for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def alone(device):
    """Each prompt alone on the runtime (no engine): the plain path's greedy tokens."""
    return [greedy_together(device, [p], TOKENS)[0] for p in prompts(device.program.vocab_size)]


def run_concurrently(device, config: EngineConfig, observer: EngineObserver) -> list[list[int]]:
    """Two requests start; once both decode, the other four arrive (one waits for a lane)."""
    import queue

    engine = Engine(device, TextTokenizer.from_program(device.program), config, observer)
    engine.start()
    try:
        inboxes = []

        def submit(ids):
            q = queue.Queue()
            engine.submit(GenerationRequest(tuple(ids), GREEDY, TOKENS, ignore_eos=True), q.put)
            inboxes.append(q)

        ps = prompts(device.program.vocab_size)
        for ids in ps[:2]:
            submit(ids)
        results = [[] for _ in ps]
        for i, q in enumerate(inboxes):   # both are decoding before the rest arrive
            event = q.get(timeout=60)
            assert isinstance(event, SequenceDelta)
            results[i] += event.token_ids
        for ids in ps[2:]:
            submit(ids)
        for i, q in enumerate(inboxes):
            while True:
                event = q.get(timeout=120)
                if isinstance(event, RequestDone):
                    break
                assert isinstance(event, SequenceDelta), event
                results[i] += event.token_ids
        return results
    finally:
        engine.stop()


@pytest.mark.parametrize("budget, in_flight", [(0, 1), (0, 2), (8, 1), (8, 2), (24, 2)])
def test_greedy_tokens_equal_alone_under_concurrency(device, alone, budget, in_flight):
    steps = Steps()
    got = run_concurrently(device, EngineConfig(step_token_budget=budget, in_flight=in_flight, ttft_target_s=None), steps)
    assert got == alone
    assert any(p and d for p, d in steps.steps), "no step mixed prefill and decode"
    if budget:   # while sequences decode, a step prefills at most budget - rows (or one smallest chunk)
        over = [(p, d) for p, d in steps.steps if d and p > max(budget - d, 4)]
        assert not over, over


@pytest.mark.parametrize("in_flight", [1, 2])
def test_a_ttft_target_no_prompt_can_make_leaves_the_budget_in_charge(device, alone, in_flight):
    """With a 1 ns target every prompt is already late when it is planned (a tiny model's step costs
    are a fraction of a millisecond, so a 1 ms target could still be made): none asks for a raised
    slice (that would stall the streams and still miss), so the 8-token budget holds, and the tokens
    are those each request gets alone. The raising itself: tests/engine/test_scheduler.py."""
    steps = Steps()
    got = run_concurrently(device, EngineConfig(step_token_budget=8, ttft_target_s=1e-9, in_flight=in_flight), steps)
    assert got == alone
    assert steps.raised == 0
    over = [(p, d) for p, d in steps.steps if d and p > max(8 - d, 4)]
    assert not over, over


def test_without_a_budget_a_step_prefills_a_whole_burst_beside_decode(device):
    """The behaviour the budget bounds: with none, one step takes up to max_prefill_tokens (512)
    of new prompts while streams decode."""
    steps = Steps()
    run_concurrently(device, EngineConfig(step_token_budget=0), steps)
    assert max(p for p, d in steps.steps if d) > 24


@pytest.mark.parametrize("in_flight, slots, outstanding", [(1, [0, 0, 0, 0], 0), (2, [0, 1, 0, 1], 1)])
def test_pipeline_keeps_in_flight_jobs_in_alternating_slots(device, in_flight, slots, outstanding):
    """Ping/pong: with 2 in flight the next job is queued before the previous one is handed back, and
    consecutive jobs own different staging slots; with 1 each job is waited for first."""
    seen, handed = [], []

    class Recording:
        healthy = True

        def submit(self, job):
            seen.append((job.slot, len(seen) - len(handed)))
            return device.submit(job)

        def wait(self, handle, timeout):
            return device.wait(handle, timeout)

    lanes = [device.lanes.allocate() for _ in range(4)]
    try:
        items = [StepJob("prefill", PrefillJob(lane, (5, 6, 7)), ()) for lane in lanes]
        for item, result in JobPipeline(Recording(), in_flight, 30).run(items):
            handed.append(item)
            assert result.logits.shape[0] == 1
    finally:
        for lane in lanes:
            device.lanes.free(lane)
    assert [s for s, _ in seen] == slots
    assert max(n for _, n in seen) == outstanding and handed == items


def test_two_jobs_in_flight_in_two_slots_do_not_cross(device):
    """Guards the ping/pong staging: a prefill in slot 0 and a decode in slot 1 queued together give
    the rows each gives when run alone, on other lanes."""
    vocab = device.program.vocab_size
    a_ids, b_ids = prompts(vocab)[1], prompts(vocab)[3]
    lanes = [device.lanes.allocate() for _ in range(4)]
    try:
        prefill(device, lanes[0], b_ids)
        prefill(device, lanes[2], b_ids)
        h1 = device.submit(PrefillJob(lanes[1], tuple(a_ids[:16]), slot=0))
        h2 = device.submit(DecodeJob((lanes[0],), (11,), slot=1))
        together = device.wait(h1, 30).logits[0], device.wait(h2, 30).logits[0]
        alone = (device.run(PrefillJob(lanes[3], tuple(a_ids[:16])), 30).logits[0],
                 device.run(DecodeJob((lanes[2],), (11,)), 30).logits[0])
    finally:
        for lane in lanes:
            device.lanes.free(lane)
    assert (together[0] == alone[0]).all() and (together[1] == alone[1]).all()
    assert not (together[0] == together[1]).all()


def test_a_slot_out_of_range_is_refused(device):
    lane = device.lanes.allocate()
    try:
        with pytest.raises(RequestError, match="staging slot 2 is out of range 0..1"):
            device.submit(PrefillJob(lane, (5,), slot=2))
    finally:
        device.lanes.free(lane)


def test_in_flight_is_checked():
    with pytest.raises(RequestError, match="--in-flight must be 1 or 2"):
        EngineConfig(in_flight=3)


def test_gemma3_sliding_window_model_mixed_and_in_flight_equal_alone(tiny_calbin):
    """The same under concurrency on a Gemma 3 (sliding-window layers, prompts longer than its window)."""
    d = Device()
    d.configure(d.load(tiny_calbin("gemma3")))
    try:
        alone = [greedy_together(d, [p], TOKENS)[0] for p in prompts(d.program.vocab_size)]
        steps = Steps()
        assert run_concurrently(d, EngineConfig(step_token_budget=8, in_flight=2), steps) == alone
        assert any(p and r for p, r in steps.steps)
    finally:
        d.close()


def run_burst(device, config: EngineConfig, observer: EngineObserver) -> list[list[int]]:
    """Four requests at once (one per lane), as a batch of clients that all finished together sends."""
    engine = Engine(device, TextTokenizer.from_program(device.program), config, observer)
    observer.engine = engine
    engine.start()
    try:
        return greedy_through_engine(engine, prompts(device.program.vocab_size)[:4], TOKENS)
    finally:
        engine.stop()


@pytest.mark.parametrize("in_flight", [1, 2])
def test_a_burst_is_prefilled_before_it_decodes_and_equals_alone(device, alone, in_flight):
    """burst_prefill_tokens: the burst's streams wait after their first token until the whole burst is
    prefilled (16 tokens a step here), then decode together; no step mixes, tokens equal alone."""
    steps = Steps()
    got = run_burst(device, EngineConfig(max_prefill_tokens=16, step_token_budget=8, in_flight=in_flight), steps)
    assert got == alone[:4]
    first_decode = next(i for i, (p, d) in enumerate(steps.steps) if d)
    assert all(p for p, d in steps.steps[:first_decode]) and not any(p for p, d in steps.steps[first_decode:])
    assert steps.steps[first_decode][1] == 4, "the burst does not decode together"
    assert max(steps.held[:first_decode]) >= 1 and steps.held[first_decode] == 0   # held, then all released


@pytest.mark.parametrize("burst", [0, 20])
def test_a_burst_decodes_at_once_when_off_or_past_the_limit(device, alone, burst):
    """Off (0), or with more prompt tokens left than the limit, a prefilled stream decodes from the next
    step beside the rest of the burst's prefill (budgeted mixed steps)."""
    steps = Steps()
    got = run_burst(device, EngineConfig(max_prefill_tokens=16, step_token_budget=8, burst_prefill_tokens=burst), steps)
    assert got == alone[:4]
    assert any(p and d for p, d in steps.steps), "no step mixed prefill and decode"


def test_burst_prefill_tokens_is_checked():
    with pytest.raises(RequestError, match="--burst-prefill-tokens must be >= 0"):
        EngineConfig(burst_prefill_tokens=-1)
