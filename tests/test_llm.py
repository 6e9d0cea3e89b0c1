"""`calculet.LLM`: generate batched through the engine equals each prompt alone; stream; close; errors."""

from __future__ import annotations

import pytest

import calculet
from calculet import LLM, SamplingParams
from calculet.errors import RequestError

PROMPTS = ["The quick brown fox", "Paris is the capital of", "def main():", "El rápido zorro marrón",
           "Static graphs run on", "the lazy dog", "東京は日本の首都です。", "return 42"]


@pytest.fixture(scope="module")
def llm(tiny_calbin):
    with LLM(tiny_calbin("llama")) as llm:          # 4 lanes, context 64: 8 prompts means 4 wait
        yield llm


def _alone(llm, prompts, params):
    return [llm.generate(p, q)[0] for p, q in zip(prompts, params)]


def test_generate_eight_prompts_equals_each_alone_greedy(llm):
    params = [SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)] * 8
    together = llm.generate(PROMPTS, params[0])
    alone = _alone(llm, PROMPTS, params)
    assert [o.outputs[0].token_ids for o in together] == [o.outputs[0].token_ids for o in alone]
    assert [o.outputs[0].text for o in together] == [o.outputs[0].text for o in alone]
    assert len({o.outputs[0].token_ids for o in together}) > 1, "all prompts gave the same tokens: the test would be weak"
    for prompt, out in zip(PROMPTS, together):
        assert out.prompt == prompt and out.prompt_token_ids == llm.encode(prompt)
        assert out.outputs[0].finish_reason == "length" and len(out.outputs[0].token_ids) == 20
        assert out.usage.prompt_tokens == len(out.prompt_token_ids) and out.usage.completion_tokens == 20
        assert out.usage.total_tokens == out.usage.prompt_tokens + 20
    assert llm._device.lanes.free_count() == llm.lanes


def test_generate_sampled_with_seeds_equals_each_alone(llm):
    """Seeded sampling (full-row draws with a penalty, and top-k draws from the head's candidates)
    gives each prompt the same tokens batched as alone, and different seeds differ."""
    params = [SamplingParams(max_tokens=16, temperature=1.0, seed=100 + i, ignore_eos=True,
                             **({"top_k": 20} if i % 2 else {"repetition_penalty": 1.2})) for i in range(8)]
    together = llm.generate(PROMPTS, params)
    alone = _alone(llm, PROMPTS, params)
    assert [o.outputs[0].token_ids for o in together] == [o.outputs[0].token_ids for o in alone]
    reseeded = llm.generate(PROMPTS[0], SamplingParams(max_tokens=16, temperature=1.0, seed=7, repetition_penalty=1.2,
                                                       ignore_eos=True))
    assert reseeded[0].outputs[0].token_ids != together[0].outputs[0].token_ids


def test_stream_yields_the_generate_text_and_ends_with_the_output(llm):
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=2)
    whole = llm.generate("Paris is", params)[0]
    stream = llm.stream("Paris is", params)
    deltas = list(stream)
    assert "".join(d.text for d in deltas) == whole.outputs[0].text
    assert tuple(t for d in deltas for t in d.token_ids) == whole.outputs[0].token_ids
    assert deltas[-1].finish_reason == "length" and stream.output.outputs == whole.outputs
    lps = whole.outputs[0].logprobs
    assert len(lps) == 24 and all(len(lp.top) == 2 and lp.top[0][0] == t for lp, t in zip(lps, whole.outputs[0].token_ids))


def test_stream_broken_off_frees_its_lane(llm):
    stream = llm.stream("hi", SamplingParams(max_tokens=50, temperature=0, ignore_eos=True))
    for i, _ in enumerate(stream):
        if i == 2:
            break
    out = llm.generate("hi", SamplingParams(max_tokens=2, temperature=0))   # runs after the cancel
    assert out[0].outputs[0].token_ids and llm._device.lanes.free_count() == llm.lanes
    with pytest.raises(RequestError, match="cancelled"):
        stream.result()


def test_token_id_prompts_and_n(llm):
    ids = list(llm.encode("The quick brown fox"))
    by_text = llm.generate("The quick brown fox", SamplingParams(max_tokens=6, temperature=0))[0]
    by_ids = llm.generate([ids], SamplingParams(max_tokens=6, temperature=0))[0]
    assert by_ids.prompt is None and by_ids.outputs[0].token_ids == by_text.outputs[0].token_ids
    assert llm.generate(ids, SamplingParams(max_tokens=6, temperature=0))[0].outputs == by_text.outputs  # one prompt
    two = llm.generate("hi", sampling_params=SamplingParams(n=2, max_tokens=5, temperature=1.0, seed=3, ignore_eos=True))[0]
    assert [o.index for o in two.outputs] == [0, 1] and two.usage.completion_tokens == 10


def test_bad_requests_say_what_is_allowed(llm):
    with pytest.raises(RequestError, match="temperature=-1 is out of range; allowed: 0 <= temperature <= 100"):
        SamplingParams(temperature=-1)
    with pytest.raises(RequestError, match=r"min_tokens=9 is out of range; allowed: 0 <= min_tokens <= max_tokens \(4\)"):
        SamplingParams(max_tokens=4, min_tokens=9)
    with pytest.raises(RequestError, match="got 2 SamplingParams for 3 prompts"):
        llm.generate(["a", "b", "c"], [SamplingParams(), SamplingParams()])
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 20
    before = llm.stream("hi", SamplingParams(max_tokens=1))
    with pytest.raises(RequestError) as exc:            # one bad prompt: none of the batch is queued
        llm.generate(["hi", long_prompt], SamplingParams(max_tokens=4))
    assert exc.value.code == "prompt_too_long"
    with pytest.raises(RequestError, match="exceed the context of 64"):
        llm.generate("hi", SamplingParams(max_tokens=64))
    after = llm.stream("hi", SamplingParams(max_tokens=1))
    assert after.id == before.id + 1                    # request ids count submissions
    before.result(), after.result()
    assert llm._device.lanes.free_count() == llm.lanes


def test_unknown_option_and_close(tiny_calbin):
    with pytest.raises(RequestError, match="unknown option.*lane.*allowed: threads"):
        LLM(tiny_calbin("llama"), lane=4)
    llm = LLM(tiny_calbin("llama"), max_queue=0)
    thread = llm._local.engine._thread
    assert thread.is_alive()
    llm.close()
    assert not thread.is_alive()
    with pytest.raises(RequestError, match="this LLM is closed"):
        llm.generate("hi")
    llm.close()                                     # idempotent


def test_import_calculet_stays_light():
    import subprocess
    import sys

    code = "import calculet, sys; print(any(m.startswith(('onnxruntime', 'numpy', 'calculet.engine')) for m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
    assert calculet.LLM is LLM and calculet.SamplingParams is SamplingParams


@pytest.mark.parametrize("partition", ["pp", "tp"])
def test_a_two_chip_calbin_generates_the_one_chip_text(llm, tiny_calbin, partition):
    """The engine on a partitioned calbin (a Device that takes the 2 chips the calbin asks for)."""
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    with LLM(tiny_calbin("llama", chips=2, partition=partition)) as two:
        assert len(two._device.chips) == 2 and two._device.collectives is not None
        got = [o.outputs[0].token_ids for o in two.generate(PROMPTS[:4], params)]
    assert got == [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:4], params)]


def test_prefix_cache_option_and_cached_tokens_in_usage(llm, tiny_calbin):
    """LLM(prefix_cache=False) turns the cache off; with it on (the default) a prompt that extends a
    finished one reports its reused tokens in `usage.cached_tokens` and gets the same tokens."""
    ids = list(llm.encode("The quick brown fox jumps over the lazy dog again and again"))
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    first = llm.generate(ids, params)[0]
    longer = ids + list(first.outputs[0].token_ids) + ids[1:5]
    hit = llm.generate(longer, params)[0]
    assert hit.usage.cached_tokens >= len(ids)
    with LLM(tiny_calbin("llama"), prefix_cache=False) as plain:
        plain.generate(ids, params)
        miss = plain.generate(longer, params)[0]
        assert miss.usage.cached_tokens == 0 and miss.outputs[0].token_ids == hit.outputs[0].token_ids
        assert plain._device.lanes.free_count() == plain.lanes


def test_a_two_chip_calbin_reuses_a_warm_lane_like_one_chip(llm, tiny_calbin):
    """Guards the prefix-cache x chips merge: a prompt extending a finished one resumes from the lane's
    KV, which on 2 chips lives in the chips' buffers; tokens equal the 1-chip run's."""
    ids = list(llm.encode("The quick brown fox jumps over the lazy dog again and again"))
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    first = llm.generate(ids, params)[0]
    longer = ids + list(first.outputs[0].token_ids) + ids[1:5]
    want = llm.generate(longer, params)[0].outputs[0].token_ids
    with LLM(tiny_calbin("llama", chips=2, partition="pp")) as two:
        assert two.generate(ids, params)[0].outputs[0].token_ids == first.outputs[0].token_ids
        hit = two.generate(longer, params)[0]
    assert hit.usage.cached_tokens >= len(ids) and hit.outputs[0].token_ids == want


def test_hugepages_option_reaches_the_device(tiny_calbin):
    """LLM(hugepages="off") keeps 4 KiB pages (no report); an unknown mode fails before anything loads."""
    from calculet.errors import ModelError

    with pytest.raises(ModelError, match="hugepages must be one of collapse, off"):
        LLM(tiny_calbin("llama"), hugepages="always")
    with LLM(tiny_calbin("llama"), hugepages="off") as off:
        assert off._device.hugepages is None
    with LLM(tiny_calbin("llama")) as default:
        assert default._device.hugepages is not None


@pytest.mark.parametrize("settle", [True, False])
def test_the_load_is_frozen_out_of_full_collections_until_close(tiny_calbin, settle):
    """settle_heap (default): after the load, the engine's objects sit in the permanent generation, so
    a full collection mid-stream does not walk them; close() hands them back. False leaves the
    collector as it was."""
    import gc

    gc.unfreeze()
    llm = LLM(tiny_calbin("llama"), settle_heap=settle)
    try:
        engine = llm._local.engine
        tracked = any(o is engine for g in range(3) for o in gc.get_objects(generation=g))
        assert (gc.get_freeze_count() > 0, tracked) == ((True, False) if settle else (False, True))
        assert llm.generate("hi", SamplingParams(max_tokens=2, temperature=0.0))[0].outputs[0].token_ids
    finally:
        llm.close()
    assert gc.get_freeze_count() == 0   # close() unfroze them
