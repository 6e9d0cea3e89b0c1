"""The golden check through the engine's loop: teacher forcing (`forced_ids`), the prompt's logits
row (`prompt_logits`), and a golden calbin that passes."""

from __future__ import annotations

import numpy as np
import pytest

from calculet.engine.golden_runner import golden_fns
from calculet.golden_gate import check_calbin
from calculet.engine.local import LocalEngine
from calculet.engine.requests import GenerationRequest
from calculet.engine.sampler import SamplerConfig
from calculet.engine.tokenizer import TextTokenizer
from calculet.errors import RequestError
from calculet.reference.golden import read_golden
from calculet.runtime.device import Device

GREEDY = SamplerConfig(temperature=0.0)
PROMPT = (2, 40, 41, 42, 43)


@pytest.fixture(scope="module")
def local(tiny_calbin):
    device = Device()
    program = device.load(tiny_calbin("qwen3"))
    tokenizer = TextTokenizer.from_program(program)
    device.configure(program)
    with LocalEngine(device, tokenizer) as local:
        yield local
    device.close()


def _greedy(local, prompt, n):
    return local.run(GenerationRequest(tuple(prompt), GREEDY, n, ignore_eos=True)).outputs[0].token_ids


def test_forced_tokens_feed_the_sequence_and_report_the_models_pick(local):
    """Each step continues with the forced token; sampled_ids[i] is the greedy pick after prompt +
    forced[:i], the same as that prefix run alone; logprobs score the forced token."""
    forced = (7, 300, 12, 12, 90, 5)
    deltas = list(local.submit(GenerationRequest(PROMPT, GREEDY, len(forced), ignore_eos=True, forced_ids=forced,
                                                 logprobs=1)))
    assert tuple(t for d in deltas for t in d.token_ids) == forced
    picks = [t for d in deltas for t in d.sampled_ids]
    assert picks == [_greedy(local, PROMPT + forced[:i], 1)[0] for i in range(len(forced))]
    assert picks != list(forced), "the model picked the forced tokens itself: weak test"
    assert [d.logprobs[0].token_id for d in deltas] == list(forced)
    assert [d.logprobs[0].top[0][0] for d in deltas] == picks


def test_free_run_gives_the_prompt_logits_and_the_engines_greedy_tokens(local):
    run_fn, forced_fn = golden_fns(local)
    first, tokens = run_fn(list(PROMPT), 12)
    assert first.shape == (local.engine.vocab_size,) and int(np.argmax(first)) == tokens[0]
    assert tuple(tokens) == _greedy(local, PROMPT, 12)
    assert forced_fn(list(PROMPT), tokens) == tokens     # forcing its own greedy tokens changes nothing


def test_forced_ids_are_checked(local):
    with pytest.raises(RequestError, match="at most max_tokens \\(2\\) forced tokens"):
        GenerationRequest(PROMPT, GREEDY, 2, forced_ids=(1, 2, 3))
    with pytest.raises(RequestError, match="forced_ids has token id 9999; allowed: 0 <= id <= 319"):
        local.submit(GenerationRequest(PROMPT, GREEDY, 2, forced_ids=(9999,)))


def test_golden_calbin_passes_through_the_engine(tiny_calbin):
    path = tiny_calbin("qwen3", golden=True)
    report = check_calbin(path, read_golden(path))
    assert report.passed, report.summary()
    assert report.forced_agreement == 1.0 and all(p.greedy_agreement == 1.0 for p in report.prompts)
