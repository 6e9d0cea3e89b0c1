"""The continuous-batching engine over a real Device on a tiny model (4 lanes, context 64)."""

from __future__ import annotations

import queue
import time

import pytest

from calculet.engine.engine import Engine, EngineConfig
from calculet.engine.observer import EngineObserver
from calculet.engine.requests import GenerationRequest, RequestDone, RequestFailed, SequenceDelta
from calculet.engine.sampler import SamplerConfig
from calculet.engine.tokenizer import TextTokenizer
from calculet.errors import RequestError
from calculet.runtime.device import Device
from calculet.runtime.faults import FaultPlan
from decoding import generate_one

GREEDY = SamplerConfig(temperature=0.0)


class Jobs(EngineObserver):
    def __init__(self):
        self.kinds: list[str] = []
        self.tokens: list[int] = []
        self.requeued_total = 0

    def job(self, kind, timings, useful_tokens):
        self.kinds.append(kind)
        self.tokens.append(useful_tokens)

    def requeued(self, sequences):
        self.requeued_total += sequences


@pytest.fixture(scope="module")
def calbin(tiny_calbin):
    return tiny_calbin("llama")          # 4 lanes, context 64, chunks (4, 16)


def open_device(calbin, fault: str | None = None) -> Device:
    device = Device(faults=FaultPlan.parse(fault))
    device.configure(device.load(calbin))
    return device


@pytest.fixture
def make_engine(calbin):
    made = []

    def make(config=None, fault=None, observer=None):
        device = open_device(calbin, fault)
        engine = Engine(device, TextTokenizer.from_program(device.program), config or EngineConfig(), observer)
        engine.start()
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.stop()
        engine.device.close()


class Call:
    """A submitted request and the events it has received so far."""

    def __init__(self, engine, request):
        self.events: queue.Queue = queue.Queue()
        self.tokens: list[int] = []
        self.text = ""
        self.id = engine.submit(request, self.events.put)

    def next(self):
        event = self.events.get(timeout=30)
        if isinstance(event, SequenceDelta):
            self.tokens += event.token_ids
            self.text += event.text
        return event

    def deltas(self, n: int) -> None:
        for _ in range(n):
            assert isinstance(self.next(), SequenceDelta)

    def result(self):
        while isinstance(event := self.next(), SequenceDelta):
            pass
        return self.tokens, self.text, event


def request(tokenizer, prompt, max_tokens=20, **kw):
    ids = prompt if isinstance(prompt, list) else tokenizer.encode_prompt(prompt)
    return GenerationRequest(ids, kw.pop("params", GREEDY), max_tokens, ignore_eos=kw.pop("ignore_eos", True), **kw)


def test_batched_equals_alone(calbin, make_engine):
    engine = make_engine()
    tok = engine.tokenizer
    prompts = ["The quick brown fox", "Paris is the capital of France.", "def main():", "東京は日本の首都です。 😀🚀",
               "lazy dog", "Static graphs run on accelerators; the runtime owns the KV cache"]
    device = open_device(calbin)
    try:
        alone = [generate_one(device, tok, tok.encode_prompt(p), GREEDY, 24, ignore_eos=True) for p in prompts]
    finally:
        device.close()
    calls = [Call(engine, request(tok, p, 24)) for p in prompts]      # 6 requests, 4 lanes: 2 wait
    for ref, call in zip(alone, calls):
        tokens, text, end = call.result()
        assert isinstance(end, RequestDone) and tokens == ref.tokens and text == ref.text
    assert engine.lanes.free_count() == 4


def _runs(jobs: "Jobs") -> list[tuple[str, list[int]]]:
    """Consecutive jobs of one kind, with their useful tokens: [("prefill", [16, 16]), ("decode", [1]), ...]."""
    runs = []
    for kind, tokens in zip(jobs.kinds, jobs.tokens):
        if runs and runs[-1][0] == kind:
            runs[-1][1].append(tokens)
        else:
            runs.append((kind, [tokens]))
    return runs


def _long_prompt_while_decoding(engine):
    tok = engine.tokenizer
    first = Call(engine, request(tok, "hi", 40))
    first.deltas(1)
    long_ids = tok.encode_prompt("The quick brown fox jumps over the lazy dog. " * 3)[:50]   # 16+16+16+2
    second = Call(engine, request(tok, long_ids, 4))
    return [call.result() for call in (first, second)], long_ids


def test_prefill_budget_of_one_chunk_interleaves_with_decode(make_engine):
    """With a budget of one chunk, a long prompt is prefilled one chunk per step while another
    sequence keeps decoding."""
    jobs = Jobs()
    engine = make_engine(EngineConfig(max_prefill_tokens=16), observer=jobs)
    results, _ = _long_prompt_while_decoding(engine)
    assert all(isinstance(end, RequestDone) for _, _, end in results)
    assert jobs.kinds.count("prefill") >= 5
    assert ("prefill", "prefill") not in set(zip(jobs.kinds, jobs.kinds[1:]))


def test_prefill_budget_runs_several_chunks_per_step(calbin, make_engine):
    """A budget of 32 tokens takes the long prompt's chunks (4 + 16 + 16 + 14) two per step, never
    more than the budget, and the output is the same as the request alone."""
    jobs = Jobs()
    engine = make_engine(EngineConfig(max_prefill_tokens=32), observer=jobs)
    results, long_ids = _long_prompt_while_decoding(engine)
    long_runs = [tokens for kind, tokens in _runs(jobs) if kind == "prefill"][1:]   # after "hi"'s own
    assert [sum(run) for run in long_runs] == [20, 30] and [len(run) for run in long_runs] == [2, 2]
    device = open_device(calbin)
    try:
        alone = generate_one(device, engine.tokenizer, long_ids, GREEDY, 4, ignore_eos=True)
    finally:
        device.close()
    assert results[1][0] == alone.tokens


def test_prefill_budget_is_checked():
    with pytest.raises(RequestError, match="--max-prefill-tokens must be >= 1"):
        EngineConfig(max_prefill_tokens=0)


def test_cancel_frees_the_lane(make_engine):
    engine = make_engine()
    call = Call(engine, request(engine.tokenizer, "hi", 60))
    call.deltas(1)
    engine.cancel(call.id)
    _, _, end = call.result()
    assert isinstance(end, RequestFailed) and end.error.code == "cancelled"
    assert engine.lanes.free_count() == 4


def test_queue_full_and_checks(make_engine):
    engine = make_engine(EngineConfig(max_queue=1))
    tok = engine.tokenizer
    calls = [Call(engine, request(tok, "hi", 60)) for _ in range(5)]          # 4 lanes + 1 waiting
    with pytest.raises(RequestError) as exc:
        engine.submit(request(tok, "hi", 60), lambda e: None)
    assert exc.value.code == "queue_full"
    with pytest.raises(RequestError, match="n=5 is out of range; allowed: 1 <= n <= 4"):
        engine.submit(request(tok, "hi", 4, n=5), lambda e: None)
    with pytest.raises(RequestError, match="exceed the context of 64"):
        engine.check(request(tok, "hi", 63))
    for call in calls:
        engine.cancel(call.id)
        assert isinstance(call.result()[2], RequestFailed)


def test_request_timeout(make_engine):
    engine = make_engine()
    call = Call(engine, request(engine.tokenizer, "hi", 60, timeout_s=0.001))
    _, _, end = call.result()
    assert isinstance(end, RequestFailed) and end.error.code == "request_timeout"
    assert engine.lanes.free_count() == 4


def test_prefill_fault_fails_that_request_and_resumes_the_decoding_one(calbin, make_engine):
    """The sequence being prefilled when the device fails gets the error; the decoding one loses its
    lane in the reset, is re-prefilled with prompt + output so far, and ends with the same tokens."""
    jobs = Jobs()
    engine = make_engine(fault="prefill:2", observer=jobs)
    tok = engine.tokenizer
    device = open_device(calbin)
    try:
        reference = generate_one(device, tok, [2, 40, 41, 42], GREEDY, 58, ignore_eos=True).tokens
    finally:
        device.close()
    decoding = Call(engine, request(tok, [2, 40, 41, 42], 58))     # one prefill chunk: job 1
    decoding.deltas(5)
    prefilling = Call(engine, request(tok, "The quick brown fox", 8))  # its first chunk is job 2: fails
    _, _, end = prefilling.result()
    assert isinstance(end, RequestFailed) and end.error.code == "injected_fault"
    tokens, _, end = decoding.result()
    assert isinstance(end, RequestDone) and tokens == reference
    assert jobs.requeued_total == 1
    deadline = time.monotonic() + 5
    while not engine.healthy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.healthy and engine.lanes.free_count() == 4
    again = Call(engine, request(tok, "The quick brown fox", 8))
    assert isinstance(again.result()[2], RequestDone)


def test_decode_fault_fails_the_request_then_serves(make_engine):
    engine = make_engine(fault="decode:3")
    tok = engine.tokenizer
    _, _, end = Call(engine, request(tok, "hi", 30)).result()
    assert isinstance(end, RequestFailed) and end.error.code == "injected_fault" and end.error.kind == "device"
    assert isinstance(Call(engine, request(tok, "hi", 5)).result()[2], RequestDone)
    assert engine.lanes.free_count() == 4 and engine.healthy


def test_stop_strings_and_min_tokens(make_engine):
    engine = make_engine()
    tok = engine.tokenizer
    _, full, _ = Call(engine, request(tok, "Paris is", 30)).result()
    stop = full[4:6]
    _, cut, end = Call(engine, request(tok, "Paris is", 30, stop=(stop,))).result()
    assert cut == full[:full.index(stop)] and isinstance(end, RequestDone)
    plain, _, _ = Call(engine, request(tok, "hi", 6)).result()
    held, _, end = Call(engine, request(tok, "hi", 6, ignore_eos=False, min_tokens=3, stop_token_ids=(plain[0],))).result()
    assert held[0] != plain[0]                  # a stop token may not be sampled before min_tokens
    assert len(held) >= 3 and isinstance(end, RequestDone)


def test_min_tokens_bans_from_the_candidates_like_from_the_full_row(make_engine):
    """Before min_tokens, stop ids are banned. Greedy requests take that ban on the sampling head's
    candidates (no vocabulary row fetched); with logprobs the same ban runs on the full row. Both
    give the same tokens, and the banned id never appears before min_tokens."""
    engine = make_engine()
    tok = engine.tokenizer
    ids = tok.encode_prompt("The quick brown fox")
    free = Call(engine, request(tok, ids, 6)).result()[0]
    banned = free[0]                                     # the token greedy would pick first
    kw = dict(stop_token_ids=(banned,), min_tokens=6, ignore_eos=False)
    asked = []
    submit = engine.device.submit
    engine.device.submit = lambda job: (asked.append(job.full_logits), submit(job))[1]
    cheap = Call(engine, request(tok, ids, 6, **kw)).result()
    assert asked and not any(asked)                      # every job of the greedy request: candidates only
    asked.clear()
    full = Call(engine, request(tok, ids, 6, logprobs=0, **kw)).result()
    assert asked and all(asked)
    assert isinstance(cheap[2], RequestDone) and isinstance(full[2], RequestDone)
    assert cheap[0] == full[0] and banned not in cheap[0] and cheap[0] != free
