"""The prefix cache in the engine on a real Device (tiny llama, 4 lanes, context 2304, chunks 16/128):
the same tokens with the cache on and off, hits on shared prefixes and multi-turn histories, batched
equals alone, and no lane lost or kept warm after cancels and device faults."""

from __future__ import annotations

import queue
import random

import numpy as np

import pytest

from calculet.compiler.compile import compile_calbin
from calculet.compiler.options import CompileOptions
from calculet.engine.engine import Engine, EngineConfig
from calculet.engine.requests import GenerationRequest, RequestDone, RequestFailed, SequenceDelta
from calculet.engine.sampler import SamplerConfig
from calculet.engine.tokenizer import TextTokenizer
from calculet.runtime.device import Device
from calculet.runtime.chunking import plan_chunks
from calculet.runtime.faults import FaultPlan
from tiny_models import VOCAB, make_tiny_model

GREEDY = SamplerConfig(temperature=0.0)
rng = random.Random(13)
SHARED = tuple(rng.randrange(3, VOCAB) for _ in range(2000))
SUFFIXES = [tuple(rng.randrange(3, VOCAB) for _ in range(n)) for n in (7, 19, 30)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_model("llama", tmp_path_factory.mktemp("hf-llama-long"), max_position_embeddings=4096)


def _compile(folder, out, **kw):
    return compile_calbin(str(folder), out, CompileOptions(lanes=4, context=2304, prefill_chunks=(16, 128), **kw),
                          log=lambda _m: None)


@pytest.fixture(scope="module")
def calbin(folder, tmp_path_factory):
    return _compile(folder, tmp_path_factory.mktemp("calbin-llama-long") / "model.calbin")


@pytest.fixture(scope="module")
def calbin_blocks(folder, tmp_path_factory):
    """The same model with every matmul on the block kernels (no prefill-int8 pass): prefill and decode
    then compute a token's K/V alike, so a hit on a previous turn's answer is bit-identical to prefilling
    it. With the pass (on a VNNI CPU) a prompt's tokens are prefilled with per-token int8 GEMMs and an
    answer's tokens were decoded with the block kernels: a hit on them differs by that rounding."""
    return _compile(folder, tmp_path_factory.mktemp("calbin-llama-long-blocks") / "model.calbin", prefill_int8_outliers=0)


@pytest.fixture
def make_engine(calbin, calbin_blocks):
    made = []

    def make(prefix_cache=True, fault=None, job_timeout_s=600.0, blocks=False):
        device = Device(faults=FaultPlan.parse(fault))
        device.configure(device.load(calbin_blocks if blocks else calbin))
        config = EngineConfig(prefix_cache=prefix_cache, job_timeout_s=job_timeout_s)
        engine = Engine(device, TextTokenizer.from_program(device.program), config)
        engine.start()
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.stop()
        engine.device.close()


class Call:
    def __init__(self, engine, prompt, max_tokens=12, prompt_logits=False):
        self.events = queue.Queue()
        self.tokens: list[int] = []
        request = GenerationRequest(tuple(prompt), GREEDY, max_tokens, ignore_eos=True, prompt_logits=prompt_logits)
        self.id = engine.submit(request, self.events.put)

    def next(self):
        event = self.events.get(timeout=120)
        if isinstance(event, SequenceDelta):
            self.tokens += event.token_ids
        return event

    def result(self):
        while isinstance(event := self.next(), SequenceDelta):
            pass
        return self.tokens, event


def idle_snapshot(engine):
    """The engine's snapshot once it is idle (it is published after the step that ended a request)."""
    assert engine.wait_idle(30)
    return engine.snapshot()


def run_one(engine, prompt, max_tokens=12):
    tokens, end = Call(engine, prompt, max_tokens).result()
    assert isinstance(end, RequestDone), end
    return tokens, end


def test_shared_prefix_gives_the_same_tokens_with_the_cache_on_and_off(make_engine):
    """2,000 shared prompt tokens, three different suffixes, one after another."""
    results = {}
    for on in (False, True):
        engine = make_engine(prefix_cache=on)
        results[on] = [run_one(engine, SHARED + s) for s in SUFFIXES]
        assert engine.lanes.free_count() == 4
        stats = idle_snapshot(engine).prefix_cache
        if on:
            assert (stats.lookups, stats.hits) == (3, 2) and stats.tokens_saved >= 2 * 2000
        else:
            assert stats.lookups == stats.hits == stats.tokens_saved == stats.warm == 0
    assert [t for t, _ in results[True]] == [t for t, _ in results[False]]
    assert [d.cached_tokens for _, d in results[False]] == [0, 0, 0]
    cached = [d.cached_tokens for _, d in results[True]]
    assert cached[0] == 0 and all(c >= 2000 for c in cached[1:])


def test_multi_turn_history_hits_the_previous_turn(make_engine):
    """Turn k+1 resends turn k's prompt + answer + new text: it resumes after (almost) all of it (on the
    block-kernel build, where a hit on the decoded answer is bit-identical: see calbin_blocks)."""
    engine, plain = make_engine(prefix_cache=True, blocks=True), make_engine(prefix_cache=False, blocks=True)
    prompt = SHARED[:300]
    for turn in range(4):
        tokens, done = run_one(engine, prompt, 10)
        ref, ref_done = run_one(plain, prompt, 10)
        assert tokens == ref and ref_done.cached_tokens == 0
        if turn:
            # the previous turn's lane holds its prompt and all but its last output token
            assert done.cached_tokens >= len(prompt) - 40 - 1
        prompt = prompt + tuple(tokens) + SUFFIXES[turn % 3]
    assert idle_snapshot(engine).prefix_cache.hits == 3


def test_a_request_that_ends_at_its_first_token_leaves_its_lane_warm(make_engine):
    """max_tokens=1 ends on the token its prefill samples, while the sequence is held as a burst of
    one (nothing decodes): it still ended normally, so its lane stays warm for the next request."""
    engine = make_engine(prefix_cache=True)
    prompt = SHARED[:300]
    run_one(engine, prompt, 1)
    assert idle_snapshot(engine).prefix_cache.warm == 1
    _, done = run_one(engine, prompt + SUFFIXES[0], 4)
    assert done.cached_tokens == len(prompt)


def test_batched_equals_alone_with_the_cache_on(make_engine):
    """Prompts sharing a prefix with a warm lane, and with each other, run together: each gets the
    tokens it gets alone on an engine without the cache."""
    plain = make_engine(prefix_cache=False)
    prompts = [SHARED[:500] + s for s in SUFFIXES] + [SHARED[:200], SUFFIXES[1] + SHARED[:100]]
    alone = [run_one(plain, p, 16)[0] for p in prompts]
    engine = make_engine(prefix_cache=True)
    run_one(engine, SHARED[:520], 4)                       # leaves a warm lane holding the prefix
    calls = [Call(engine, p, 16) for p in prompts]          # 5 requests on 4 lanes: one waits
    got = [call.result() for call in calls]
    assert [t for t, _ in got] == alone
    assert all(isinstance(end, RequestDone) for _, end in got)
    assert sum(end.cached_tokens > 0 for _, end in got) >= 1
    assert engine.lanes.free_count() == 4


def test_cancelled_lanes_are_freed_cold(make_engine):
    """A cancelled request (while prefilling or decoding) frees its lane and leaves no warm KV."""
    engine = make_engine(prefix_cache=True)
    decoding = Call(engine, SHARED[:100], 200)
    assert isinstance(decoding.next(), SequenceDelta)
    prefilling = Call(engine, SHARED, 5)
    engine.cancel(decoding.id)
    engine.cancel(prefilling.id)
    for call in (decoding, prefilling):
        assert isinstance(call.result()[1], RequestFailed)
    snap = idle_snapshot(engine)
    assert engine.lanes.free_count() == 4 and snap.lanes_free == 4 and snap.prefix_cache.warm == 0
    _, done = run_one(engine, SHARED[:100] + SUFFIXES[0])
    assert done.cached_tokens == 0


def test_device_fault_forgets_warm_lanes(make_engine):
    """A failed decode job resets the device: no warm lane survives, none is lost, and the next
    request prefills in full and gets the same tokens."""
    engine = make_engine(prefix_cache=True, fault="decode:13")
    first, _ = run_one(engine, SHARED[:200])                # decode jobs 1..11: warm afterwards
    assert idle_snapshot(engine).prefix_cache.warm == 1
    tokens, end = Call(engine, SHARED[:200] + SUFFIXES[0]).result()   # its 2nd decode job fails
    assert isinstance(end, RequestFailed)
    snap = idle_snapshot(engine)
    assert snap.prefix_cache.warm == 0 and engine.lanes.free_count() == 4
    again, done = run_one(engine, SHARED[:200])
    assert again == first and done.cached_tokens == 0


@pytest.mark.parametrize("action", ["fail", "hang"])
def test_fault_in_a_resumed_prefill_loses_no_lane(make_engine, action):
    """The prefill that resumes from a warm lane fails (or hangs past the job timeout, so the worker
    is fenced and the KV buffers renewed): that request fails, the device resets, no lane is lost or
    left warm, and the same prompt then prefills in full and gets the tokens it got before."""
    first_jobs = len(plan_chunks(200, 0, (16, 128), 2304))
    engine = make_engine(prefix_cache=True, fault=f"{action}@prefill:{first_jobs + 1}", job_timeout_s=3.0)
    first, _ = run_one(engine, SHARED[:200])
    assert idle_snapshot(engine).prefix_cache.warm == 1
    _, end = Call(engine, SHARED[:200] + SUFFIXES[0]).result()    # resumes at 200: prefill job first_jobs + 1
    assert isinstance(end, RequestFailed)
    snap = idle_snapshot(engine)
    assert snap.prefix_cache.hits == 1 and snap.prefix_cache.warm == 0
    assert engine.lanes.free_count() == 4 and engine.healthy
    again, done = run_one(engine, SHARED[:200])
    assert again == first and done.cached_tokens == 0
    if action == "hang":
        assert engine.device.fences == 1



def first_logits(engine, prompt):
    """The logits row the first token is sampled from, and the request's end event."""
    call = Call(engine, prompt, 2, prompt_logits=True)
    row = call.next().prompt_logits
    return row, call.result()[1]


def test_warm_lane_survives_other_lanes_decode_steps(make_engine):
    """Regression: a decode graph also writes the rows of lanes outside its job, and a free lane's
    write went to position 0, so a warm lane's first KV position was overwritten by every decode step
    of a busier lane with a higher row. Its writes now land just past what the warm lane keeps."""
    plain = make_engine(prefix_cache=False)
    prompt = SHARED[:24] + SUFFIXES[1]
    alone, _ = first_logits(plain, prompt)
    engine = make_engine(prefix_cache=True)
    busy = Call(engine, SUFFIXES[2] + SHARED[:40], 30)       # lane 0, decoding
    assert isinstance(busy.next(), SequenceDelta)
    run_one(engine, SHARED[:24], 2)                          # lane 1: finishes, warm
    more = Call(engine, SUFFIXES[0] + SHARED[:40], 30)        # lane 2: decode graphs cover rows 0..2
    for call in (busy, more):
        assert isinstance(call.result()[1], RequestDone)
    got, done = first_logits(engine, prompt)
    assert done.cached_tokens == 24
    np.testing.assert_allclose(got, alone, rtol=0, atol=1e-4)


def test_sliding_window_model_resumes_exactly(tmp_path):
    """Gemma 3's sliding layers (window 8 here, KV in rings): a resumed prompt, 300 shared tokens in,
    gets the logits and tokens it gets alone; a match further back than `Program.max_rewind` is not
    reused."""
    folder = make_tiny_model("gemma3", tmp_path / "hf", max_position_embeddings=4096)
    calbin = compile_calbin(str(folder), tmp_path / "model.calbin",
                            CompileOptions(lanes=2, context=512, prefill_chunks=(16, 128)), log=lambda _m: None)
    engines = []
    try:
        for on in (False, True):
            device = Device()
            device.configure(device.load(calbin))
            engine = Engine(device, TextTokenizer.from_program(device.program), EngineConfig(prefix_cache=on))
            engine.start()
            engines.append(engine)
        plain, cached = engines
        for engine in engines:
            run_one(engine, SHARED[:300] + SUFFIXES[2])
        prompt = SHARED[:300] + SUFFIXES[0]
        (want, _), (got, done) = first_logits(plain, prompt), first_logits(cached, prompt)
        assert done.cached_tokens == 300
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
        assert run_one(cached, prompt, 20)[0] == run_one(plain, prompt, 20)[0]
        # window-sized rings (window 8 + chunk 128 rows): a lane of ~340 tokens cannot go back to 150
        rewind = cached.device.program.max_rewind
        assert rewind is not None and rewind < 340 - 150
        far = SHARED[:150] + SUFFIXES[1]
        tokens, done = run_one(cached, far)
        assert done.cached_tokens == 0 and tokens == run_one(plain, far)[0]
    finally:
        for engine in engines:
            engine.stop()
            engine.device.close()
