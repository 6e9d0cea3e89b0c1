"""The device API: lanes, batched decode parity, typed errors, fault injection and recovery."""

from __future__ import annotations

import numpy as np
import pytest

from calculet.engine.sampler import SamplerConfig
from calculet.engine.tokenizer import TextTokenizer
from calculet.errors import DeviceError, ErrorKind, ModelError, RequestError
from calculet.runtime.device import Device
from calculet.runtime.faults import FaultPlan
from calculet.runtime.jobs import DecodeJob, PrefillJob
from decoding import generate_one, greedy_together

GREEDY = SamplerConfig(temperature=0.0)


@pytest.fixture(scope="module")
def device(tiny_calbin):
    d = Device()
    d.configure(d.load(tiny_calbin("qwen3", lanes=4)))
    yield d
    d.close()


def _prompts():
    rng = np.random.default_rng(7)
    return [rng.integers(3, 300, size=n).tolist() for n in (5, 17, 11)]


def test_batched_decode_equals_each_alone(device):
    """Three prompts decoded together in one batch give exactly the tokens each gives alone."""
    tokenizer = TextTokenizer.from_program(device.program)
    alone = [generate_one(device, tokenizer, p, GREEDY, 20, ignore_eos=True).tokens for p in _prompts()]
    together = greedy_together(device, _prompts(), 20)
    assert together == alone


def test_lane_lifecycle(device):
    lanes = device.lanes
    got = [lanes.allocate() for _ in range(lanes.count)]
    assert sorted(got) == list(range(lanes.count))
    assert not lanes.can_allocate()
    with pytest.raises(RequestError) as e:
        lanes.allocate()
    assert e.value.code == "no_free_lane" and f"all {lanes.count} lanes" in str(e.value)
    lanes.free(got[1])
    assert lanes.can_allocate() and lanes.allocate() == got[1]
    device.run(PrefillJob(got[0], (5, 6, 7)), 10)
    assert lanes.length(got[0]) == 3
    lanes.clear(got[0])
    assert lanes.length(got[0]) == 0 and lanes.in_use(got[0])
    assert not lanes.keys[0][got[0]].any()
    for lane in got:
        lanes.free(lane)
    assert lanes.free_count() == lanes.count
    with pytest.raises(RequestError) as e:
        lanes.free(got[0])
    assert e.value.code == "lane_not_allocated"


def test_request_errors_are_typed(device):
    lane = device.lanes.allocate()
    try:
        with pytest.raises(RequestError) as e:
            device.submit(PrefillJob(lane, ()))
        assert e.value.code == "empty_prompt" and e.value.kind is ErrorKind.REQUEST
        with pytest.raises(RequestError) as e:
            device.submit(PrefillJob(lane, (10**6,)))
        assert e.value.code == "bad_token" and "0..319" in str(e.value)
        with pytest.raises(RequestError) as e:
            device.submit(DecodeJob((3,), (5,)) if lane != 3 else DecodeJob((2,), (5,)))
        assert e.value.code == "lane_not_allocated"
        with pytest.raises(RequestError) as e:
            device.run(PrefillJob(lane, tuple([5] * 65)), 10)
        assert e.value.code == "context_overflow" and "context of 64" in str(e.value)
        assert device.lanes.length(lane) == 0  # a rejected job leaves the lane untouched
    finally:
        device.lanes.free(lane)


def test_prompt_near_end_of_context_uses_decode_graph(device):
    """The last positions of a lane are reachable: chunks that would overflow the buffer fall back to decode."""
    tokenizer = TextTokenizer.from_program(device.program)
    prompt = np.random.default_rng(3).integers(3, 300, size=60).tolist()
    gen = generate_one(device, tokenizer, prompt, GREEDY, 100, ignore_eos=True)
    assert len(gen.tokens) == 4 and gen.finish_reason == "length"  # clamped to the context of 64


def test_wait_timeout_is_a_device_error(device):
    lane = device.lanes.allocate()
    try:
        handle = device.submit(PrefillJob(lane, tuple(range(3, 19))))
        try:
            device.wait(handle, timeout=0.0)
        except DeviceError as e:
            assert e.code == "wait_timeout"
        device.wait(handle, timeout=30)  # the job still completes
        assert device.lanes.length(lane) == 16
    finally:
        device.lanes.free(lane)


def test_injected_decode_fault_then_reset(tiny_calbin):
    d = Device(faults=FaultPlan.parse("decode:2"))
    d.configure(d.load(tiny_calbin("llama", lanes=2)))
    try:
        lane = d.lanes.allocate()
        d.run(PrefillJob(lane, (5, 6, 7)), 10)
        d.run(DecodeJob((lane,), (8,)), 10)
        with pytest.raises(DeviceError) as e:
            d.run(DecodeJob((lane,), (9,)), 10)
        assert e.value.code == "injected_fault" and e.value.kind is ErrorKind.DEVICE
        assert not d.healthy
        d.reset()
        assert d.healthy and d.lanes.free_count() == 2
        lane = d.lanes.allocate()
        assert d.run(PrefillJob(lane, (5, 6, 7)), 10).logits.shape == (1, 320)
    finally:
        d.close()


def test_fault_spec_is_validated():
    with pytest.raises(RequestError) as e:
        FaultPlan.parse("sideways:2")
    assert e.value.code == "bad_fault_spec" and "PHASE:N" in str(e.value)


def test_decode_uses_smallest_graph_covering_the_lanes(device):
    """Lane 0 alone runs the 1-lane decode graph; a job touching lane 2 needs the 4-lane one."""
    lanes = [device.lanes.allocate() for _ in range(3)]
    try:
        for lane in lanes:
            device.run(PrefillJob(lane, (5, 6, 7)), 10)
        assert device.run(DecodeJob((0,), (8,)), 10).timings.graph == "decode_1"
        r = device.run(DecodeJob((0, 2), (8, 9)), 10)
        assert r.timings.graph == "decode_4" and r.timings.computed_tokens == 4
        assert device.lanes.length(1) == 3  # lane 1 was not in the job: untouched
    finally:
        for lane in lanes:
            device.lanes.free(lane)


def test_a_lone_high_lane_decodes_on_the_1_lane_graph(device):
    """Regression: a request alone on lane 2 (lanes 0-1 busy or kept warm by the prefix cache) ran the
    4-lane graph over lanes 0-3; served at context 32k that made 1-stream decode 2.6x slower. Now the
    1-lane graph runs on lane 2's rows, and gives lane 0's logits for the same tokens, bit for bit."""
    lanes = [device.lanes.allocate() for _ in range(3)]
    try:
        for lane in (0, 2):
            device.run(PrefillJob(lane, (5, 6, 7)), 10)
        device.run(PrefillJob(1, (9, 9, 9, 9)), 10)
        on_0 = device.run(DecodeJob((0,), (8,)), 10)
        on_2 = device.run(DecodeJob((2,), (8,)), 10)
        assert on_0.timings.graph == on_2.timings.graph == "decode_1" and on_2.timings.computed_tokens == 1
        assert np.array_equal(on_0.logits, on_2.logits)
        assert [device.lanes.length(x) for x in lanes] == [4, 4, 4]   # lane 1 untouched, 0 and 2 advanced
        r = device.run(DecodeJob((1, 2), (3, 4)), 10)                  # lanes 1-2: a window of the 4-lane graph
        assert r.timings.graph == "decode_4" and [device.lanes.length(x) for x in lanes] == [4, 5, 5]
    finally:
        for lane in lanes:
            device.lanes.free(lane)


def test_sampling_head_returns_the_top_k_of_the_logits(device):
    lane = device.lanes.allocate()
    try:
        r = device.run(PrefillJob(lane, (5, 6, 7, 8)), 10)
    finally:
        device.lanes.free(lane)
    k = r.topk_ids.shape[1]
    assert k == 64
    order = np.argsort(-r.logits[0], kind="stable")[:k]
    assert set(r.topk_ids[0].tolist()) == set(order.tolist())
    assert np.allclose(r.topk_values[0], r.logits[0][r.topk_ids[0]])
    assert r.topk_ids[0, 0] == int(np.argmax(r.logits[0]))


def test_inner_prefill_chunk_skips_the_head(device):
    """A prompt's inner chunks only fill the KV: no logits, and the final logits are unchanged."""
    prompt = tuple(range(20, 40))
    a, b = device.lanes.allocate(), device.lanes.allocate()
    try:
        inner = device.run(PrefillJob(a, prompt[:16], want_logits=False), 10)
        assert inner.logits is None and device.lanes.length(a) == 16
        split = device.run(PrefillJob(a, prompt[16:]), 10).logits
        device.run(PrefillJob(b, prompt[:16]), 10)
        whole = device.run(PrefillJob(b, prompt[16:]), 10).logits
        assert np.array_equal(split, whole)
    finally:
        device.lanes.free(a)
        device.lanes.free(b)


def test_candidates_only_skips_the_row_copy(device):
    """full_logits=False hands back the sampling head's candidates and no vocabulary row; the
    candidates are the same either way."""
    lanes = [device.lanes.allocate() for _ in range(2)]
    try:
        for lane in lanes:
            device.run(PrefillJob(lane, (9, 10, 11), want_logits=False), 10)
        cheap = device.run(DecodeJob(tuple(lanes), (12, 13), full_logits=False), 10)
    finally:
        for lane in lanes:
            device.lanes.free(lane)
    lanes = [device.lanes.allocate() for _ in range(2)]
    try:
        for lane in lanes:
            device.run(PrefillJob(lane, (9, 10, 11), want_logits=False), 10)
        full = device.run(DecodeJob(tuple(lanes), (12, 13)), 10)
    finally:
        for lane in lanes:
            device.lanes.free(lane)
    assert cheap.logits is None and full.logits.shape == (2, device.program.vocab_size)
    assert np.array_equal(cheap.topk_ids, full.topk_ids) and np.array_equal(cheap.topk_values, full.topk_values)


def test_coarse_head_rows_carry_the_exact_candidates(tiny_calbin):
    """A coarse head's graph leaves coarse logits (a several-row head leaves them unscaled, with its
    row scales); the rows the runtime hands out hold the exact (int8-rescored) value at every
    candidate id and the scaled coarse values elsewhere, so the row's top tokens are the candidates'."""
    d = Device()
    d.configure(d.load(tiny_calbin("qwen3", weights="int8")))
    try:
        lanes = [d.lanes.allocate() for _ in range(3)]
        for i, lane in enumerate(lanes):
            d.run(PrefillJob(lane, tuple(range(20 + i, 29 + i)), want_logits=False), 10)
        r = d.run(DecodeJob(tuple(lanes), (7, 8, 9)), 10)
    finally:
        d.close()
    assert "lm_head.coarse" in d.program.manifest.quantization.tensors
    for row in range(3):
        ids, values = r.topk_ids[row], r.topk_values[row]
        assert np.array_equal(r.logits[row][ids], values)
        assert ids[0] == int(np.argmax(r.logits[row]))
        rest = np.delete(r.logits[row], ids)   # coarse, scaled: below the K-th exact value, not far below
        assert rest.max() <= values[-1] + 0.05 * np.abs(values).max() and rest.max() > values[-1] - np.abs(values).max()


def test_fault_specs_parse():
    plan = FaultPlan.parse("hang@decode:3, delay=0.5@prefill:1:4,nan@decode:7,fail@load:2,decode:9")
    assert [str(f) for f in plan.faults] == ["hang@decode:3:1", "delay=0.5@prefill:1:4", "nan@decode:7:1",
                                              "fail@load:2:1", "fail@decode:9:1"]
    assert [plan.take("prefill") is not None for _ in range(5)] == [True, True, True, True, False]
    for bad in ("hang@load:1", "nan@load:1", "melt@decode:1", "decode:0", "delay=x@decode:1"):
        with pytest.raises(RequestError):
            FaultPlan.parse(bad)


def test_hung_job_is_fenced_and_its_late_result_dropped(tiny_calbin):
    """A job stuck in the worker (hang@decode:2): fence() fails it and everything queued behind it at
    once, a fresh worker serves new jobs on fresh KV buffers, and when the stuck job finally returns,
    nothing it computed reaches the lanes (issue 15: reset() did not fence, a late job could write
    into lanes already given to new requests)."""
    d = Device(faults=FaultPlan.parse("hang@decode:2"))
    d.configure(d.load(tiny_calbin("llama", lanes=2)))
    try:
        lane = d.lanes.allocate()
        d.run(PrefillJob(lane, (5, 6, 7)), 10)
        solo = d.run(DecodeJob((lane,), (8,)), 10).logits              # decode 1: fine
        stuck = d.submit(DecodeJob((lane,), (9,)))                    # decode 2: hangs
        behind = d.submit(PrefillJob(lane, (10,)))
        with pytest.raises(DeviceError) as e:
            d.wait(stuck, 0.2)
        assert e.value.code == "wait_timeout"
        stale = d._worker
        d.fence()
        for handle in (stuck, behind):
            with pytest.raises(DeviceError) as e:
                d.wait(handle, 1)
            assert e.value.code == "job_fenced"
        assert not d.healthy and d.fences == 1
        d.reset()
        assert d.healthy and d.lanes.free_count() == 2
        lane = d.lanes.allocate()                                     # the same lane, reallocated
        d.run(PrefillJob(lane, (5, 6, 7)), 10)
        d.faults.release.set()                                        # the stuck job returns now...
        stale.thread.join(10)
        assert not stale.thread.is_alive() and d._fenced == []
        assert d.lanes.length(lane) == 3                              # ...and wrote nothing
        again = d.run(DecodeJob((lane,), (8,)), 10).logits
        np.testing.assert_array_equal(again, solo)
    finally:
        d.close()


@pytest.mark.parametrize("spec,code", [("nan@decode:1", "bad_output"), ("inf@prefill:1", "bad_output"),
                                       ("alloc@prefill:1", "device_run_failed")])
def test_corrupt_output_and_allocation_failure_are_device_errors(tiny_calbin, spec, code):
    d = Device(faults=FaultPlan.parse(spec))
    d.configure(d.load(tiny_calbin("llama", lanes=2)))
    try:
        lane = d.lanes.allocate()
        with pytest.raises(DeviceError) as e:
            d.run(PrefillJob(lane, (5, 6, 7)), 10)
            d.run(DecodeJob((lane,), (8,)), 10)
        assert e.value.code == code and not d.healthy
        d.reset()
        lane = d.lanes.allocate()
        assert np.isfinite(d.run(PrefillJob(lane, (5, 6, 7)), 10).logits).all()
    finally:
        d.close()


def test_session_creation_failure_on_reset(tiny_calbin):
    d = Device(faults=FaultPlan.parse("fail@load:2"))
    d.configure(d.load(tiny_calbin("llama", lanes=2)))             # load 1
    try:
        with pytest.raises(DeviceError) as e:
            d.reset()                                                 # load 2 fails
        assert e.value.code == "session_create_failed" and not d.healthy
        d.reset()                                                     # load 3
        assert d.healthy and d.run(PrefillJob(d.lanes.allocate(), (5, 6)), 10).logits is not None
    finally:
        d.close()


def _config_entry(session, key: str) -> str | None:
    try:
        return session.get_session_options().get_session_config_entry(key)
    except RuntimeError:   # onnxruntime: no entry with that key
        return None


def test_spinning_policy_sets_the_session_options_and_keeps_the_tokens(tiny_calbin):
    """DeviceConfig.spinning reaches every session (spin within a run and stop at its end, or never
    spin), rejects an unknown value with the allowed ones, and does not change a token."""
    from calculet.runtime.program import DeviceConfig

    with pytest.raises(ModelError) as e:
        DeviceConfig(spinning="always")
    assert e.value.code == "bad_option" and "run, off" in str(e.value)
    path, tokens = tiny_calbin("qwen3", lanes=4), {}
    for spinning in ("off", "run"):
        d = Device(DeviceConfig(threads=2, spinning=spinning))
        d.configure(d.load(path))
        entries = {name: (_config_entry(s, "session.intra_op.allow_spinning"),
                          _config_entry(s, "session.force_spinning_stop"))
                   for name, s in d.program.sessions.items()}
        expected = ("1", "1") if spinning == "run" else ("0", None)
        assert set(entries.values()) == {expected}, entries
        tokens[spinning] = greedy_together(d, _prompts(), 12)
        d.close()
    assert tokens["run"] == tokens["off"]
