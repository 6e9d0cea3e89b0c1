"""Cancelling a request, or letting its time limit pass, in each state it can be in: queued, in the
middle of a multi-chunk prefill, decoding (issue 15, point 6). An injected hang (runtime/faults.py)
holds the engine in the state; the test waits for the hang (an event), cancels (or waits out the
request's deadline), releases it. The request ends cancelled (request_timeout), its lane comes
back, the requests sharing the engine give their solo answers, and the engine serves on."""

from __future__ import annotations

import queue
import time

import pytest

from calculet.engine.engine import Engine, EngineConfig
from calculet.engine.requests import GenerationRequest, RequestDone, RequestFailed, SequenceDelta
from calculet.engine.sampler import SamplerConfig
from calculet.engine.tokenizer import TextTokenizer
from calculet.runtime.device import Device
from calculet.runtime.faults import FaultPlan

GREEDY = SamplerConfig(temperature=0.0)
LONG = "The quick brown fox jumps over the lazy dog. " * 3


@pytest.fixture
def make_engine(tiny_calbin):
    made = []

    def make(fault: str, config: EngineConfig | None = None) -> Engine:
        device = Device(faults=FaultPlan.parse(fault))
        device.configure(device.load(tiny_calbin("llama")))        # 4 lanes, context 64, chunks (4, 16)
        engine = Engine(device, TextTokenizer.from_program(device.program), config or EngineConfig())
        engine.start()
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.device.faults.release.set()
        engine.stop()
        engine.device.close()


TIMEOUT_S = 2.0     # long enough to reach the hang first on a loaded machine
ENDINGS = {"cancel": "cancelled", "timeout": "request_timeout"}


class Call:
    def __init__(self, engine, ids, max_tokens, timeout_s: float | None = None):
        self.events: queue.Queue = queue.Queue()
        self.tokens: list[int] = []
        self.deadline = time.monotonic() + timeout_s if timeout_s else None
        request = GenerationRequest(tuple(ids), GREEDY, max_tokens, ignore_eos=True, timeout_s=timeout_s)
        self.id = engine.submit(request, self.events.put)

    def next(self):
        event = self.events.get(timeout=30)
        if isinstance(event, SequenceDelta):
            self.tokens += event.token_ids
        return event

    def result(self):
        while isinstance(event := self.next(), SequenceDelta):
            pass
        return self.tokens, event


def solo(engine, ids, max_tokens) -> list[int]:
    tokens, end = Call(engine, ids, max_tokens).result()
    assert isinstance(end, RequestDone)
    return tokens


def end_in_hang(engine, target: Call, how: str) -> None:
    """While the engine is held in the hang: cancel the target, or let its deadline pass."""
    faults = engine.device.faults
    assert faults.hanging.wait(30)
    if how == "cancel":
        engine.cancel(target.id)
    else:
        time.sleep(max(target.deadline - time.monotonic(), 0) + 0.01)   # the limit under test is a time
    faults.release.set()


def assert_ended(target: Call, how: str, max_tokens_seen: int) -> None:
    tokens, end = target.result()
    assert isinstance(end, RequestFailed) and end.error.code == ENDINGS[how], end
    assert len(tokens) <= max_tokens_seen


def target_timeout(how: str) -> float | None:
    return TIMEOUT_S if how == "timeout" else None


@pytest.mark.parametrize("how", ["cancel", "timeout"])
def test_end_while_queued(make_engine, how):
    """Four requests hold the four lanes and the first decode step hangs: the fifth is queued."""
    engine = make_engine("hang@decode:1")
    tok = engine.tokenizer
    prompts = [tok.encode_prompt(p) for p in ("hi", "Paris is", "def main():", "lazy dog")]
    holders = [Call(engine, ids, 20) for ids in prompts]
    target = Call(engine, tok.encode_prompt(LONG)[:40], 10, target_timeout(how))
    end_in_hang(engine, target, how)
    assert_ended(target, how, 0)                         # it never ran
    results = [call.result() for call in holders]
    assert all(isinstance(end, RequestDone) for _, end in results)
    assert engine.lanes.free_count() == 4
    assert [tokens for tokens, _ in results] == [solo(engine, ids, 20) for ids in prompts]


@pytest.mark.parametrize("how", ["cancel", "timeout"])
def test_end_in_the_middle_of_a_multi_chunk_prefill(make_engine, how):
    """One 16-token chunk per step; the target's 50-token prompt (16+16+16+2) hangs in its second chunk
    (prefill job 3: the companion's one chunk, then the target's first)."""
    engine = make_engine("hang@prefill:3", EngineConfig(max_prefill_tokens=16))
    tok = engine.tokenizer
    companion_ids = tok.encode_prompt("hi")
    companion = Call(engine, companion_ids, 30)
    assert isinstance(companion.next(), SequenceDelta)     # prefilled: prefill job 1 is done
    target_ids = tok.encode_prompt(LONG)[:50]
    assert len(target_ids) == 50
    target = Call(engine, target_ids, 5, target_timeout(how))
    end_in_hang(engine, target, how)
    assert_ended(target, how, 0)
    tokens, end = companion.result()
    assert isinstance(end, RequestDone) and tokens == solo(engine, companion_ids, 30)
    assert engine.lanes.free_count() == 4
    assert len(solo(engine, target_ids, 5)) == 5           # the engine serves on


@pytest.mark.parametrize("how", ["cancel", "timeout"])
def test_end_while_decoding(make_engine, how):
    engine = make_engine("hang@decode:3")
    tok = engine.tokenizer
    ids = tok.encode_prompt("Paris is")
    target = Call(engine, ids, 30, target_timeout(how))
    end_in_hang(engine, target, how)
    assert_ended(target, how, 4)                          # the prefill's token and decode steps 1-3 at most
    assert engine.lanes.free_count() == 4
    assert len(solo(engine, ids, 30)) == 30


def test_ending_everything_also_ends_requests_still_in_the_inbox(tiny_calbin):
    """A failed reset (or shutdown) ends every accepted request, also one the engine thread has not
    taken in yet: accepted while the reset ran, it used to wait for the next retry (a race the fault
    matrix's failed-reset test hit on a slow machine)."""
    from calculet.errors import DeviceError

    device = Device()
    device.configure(device.load(tiny_calbin("llama")))
    engine = Engine(device, TextTokenizer.from_program(device.program))   # not started: submit() only queues
    try:
        call = Call(engine, [5, 6, 7], 4)
        engine._fail_all(DeviceError("device_unavailable", "the device failed and could not be reset"))
        tokens, end = call.result()
        assert isinstance(end, RequestFailed) and end.error.code == "device_unavailable" and not tokens
        assert not engine._inbox and not engine._live
    finally:
        device.close()
