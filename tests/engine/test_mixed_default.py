"""Mixed steps with two jobs in flight on the default model (Gemma 3 270M, the serving build): under
concurrency every request gets the greedy tokens it gets alone on the runtime."""

from __future__ import annotations

import queue

import pytest

from calculet.engine.engine import Engine, EngineConfig
from calculet.engine.requests import GenerationRequest, RequestDone, SequenceDelta
from calculet.engine.sampler import SamplerConfig
from calculet.engine.tokenizer import TextTokenizer
from calculet.runtime.device import Device
from decoding import greedy_through_engine, greedy_together

pytestmark = pytest.mark.slow
TOKENS = 12
TEXTS = ("The capital of France is", "Write a short poem about the sea. " * 6,
         "def fibonacci(n):\n    " * 5, "In 1492, Columbus sailed", "Photosynthesis converts light " * 10)


@pytest.fixture(scope="module")
def device(default_calbin):
    """The session's serving build (KV rings on the local layers: their products are bitwise
    batch-invariant, tests/compiler/test_kv_ring.py)."""
    d = Device()
    d.configure(d.load(default_calbin))
    yield d
    d.close()


@pytest.mark.parametrize("budget, in_flight", [(64, 2), (24, 1)])
def test_default_model_greedy_equal_alone_under_concurrency(device, budget, in_flight):
    tokenizer = TextTokenizer.from_program(device.program)
    prompts = [tokenizer.encode(t) for t in TEXTS]
    alone = [greedy_together(device, [p], TOKENS)[0] for p in prompts]
    engine = Engine(device, tokenizer, EngineConfig(step_token_budget=budget, in_flight=in_flight))
    engine.start()
    try:
        inboxes, got = [], [[] for _ in prompts]
        for i, ids in enumerate(prompts):
            q = queue.Queue()
            engine.submit(GenerationRequest(tuple(ids), SamplerConfig(temperature=0.0), TOKENS, ignore_eos=True), q.put)
            inboxes.append(q)
            if i == 0:               # the others arrive while the first decodes
                first = q.get(timeout=120)
                assert isinstance(first, SequenceDelta)
                got[0] += first.token_ids
        for i, q in enumerate(inboxes):
            while not isinstance(event := q.get(timeout=300), RequestDone):
                assert isinstance(event, SequenceDelta), event
                got[i] += event.token_ids
    finally:
        engine.stop()
    assert got == alone


def _engine_greedy(device, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    """Greedy tokens per prompt through a fresh engine (no prefix cache), every prompt submitted at once."""
    engine = Engine(device, TextTokenizer.from_program(device.program), EngineConfig(prefix_cache=False))
    engine.start()
    try:
        return greedy_through_engine(engine, prompts, tokens, timeout=300)
    finally:
        engine.stop()


def test_non_latin_passages_continue_alike_alone_and_batched(device):
    """Guards a batched != alone bug of the coarse lm_head: one lane decoding alone picked its candidates
    from int4 blocks of 128, which on Russian, Chinese and Japanese text dropped the top token out of them
    while the several-row head kept it, so a passage continued differently alone than beside the others
    (on this build the Russian one from step 17; on the served build Russian, Chinese and Japanese)."""
    from calculet.reference.texts import NON_LATIN, PASSAGES

    tokenizer = TextTokenizer.from_program(device.program)
    prompts = [tokenizer.encode(text) for name, text in PASSAGES if name in NON_LATIN]
    alone = [_engine_greedy(device, [p], 24)[0] for p in prompts]
    assert _engine_greedy(device, prompts, 24) == alone
