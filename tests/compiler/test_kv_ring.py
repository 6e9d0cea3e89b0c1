"""Sliding-window layers on a KV ring (compiler/kv_layout.py, attention_ring.py, the portable ring mask)
equal the transformers reference and themselves batched, far past the window and the ring.

The tiny Gemma 3 here has a window of 16 and prefill chunks of 12 and 24 (one below, one above the
window), so its local layers keep a ring of 16 + 24 = 40 rows; prompts and generations run to
~200 and ~1,040 tokens, crossing the window a dozen to sixty times and the ring five to twenty-six.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from calculet.compiler.compile import compile_calbin
from calculet.compiler.options import CompileOptions
from calculet.engine.local import LocalEngine
from calculet.engine.requests import GenerationRequest
from calculet.engine.sampler import SamplerConfig
from calculet.engine.tokenizer import TextTokenizer
from calculet.runtime.device import Device
from decoding import generate_one

WINDOW, CHUNKS = 16, (12, 24)
RING = WINDOW + max(CHUNKS)
GREEDY = SamplerConfig(temperature=0.0)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    import tiny_models

    return tiny_models.make_tiny_model("gemma3", tmp_path_factory.mktemp("hf-gemma3-w16"), seed=3,
                                       sliding_window=WINDOW, max_position_embeddings=2048)


def _device(hf_dir, tmp_path_factory, **options) -> Device:
    opts = CompileOptions(prefill_chunks=CHUNKS, golden=False, weights="fp32", **options)
    path = compile_calbin(str(hf_dir), tmp_path_factory.mktemp("calbin") / "m.calbin", opts, log=lambda _m: None)
    device = Device()
    device.configure(device.load(path))
    return device


def _prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 300, size=n).tolist()


@pytest.fixture(scope="module", params=["cpu", "portable"])
def ring_device(request, hf_dir, tmp_path_factory):
    device = _device(hf_dir, tmp_path_factory, lanes=3, context=256, target=request.param)
    yield device
    device.close()


def test_local_layers_hold_a_ring_and_global_layers_the_context(ring_device):
    kv = ring_device.program.manifest.kv
    assert kv.ring == RING and kv.layer_lengths == (RING, 256, RING)  # sliding, full, sliding
    assert [k.shape[2] for k in ring_device.lanes.keys] == [RING, 256, RING]
    assert ring_device.program.max_rewind == RING - WINDOW


@pytest.mark.parametrize("length", [15, 16, 17, 23, 25, 41, 100, 150])
def test_ring_greedy_tokens_equal_the_reference(ring_device, hf_dir, length):
    """Prompts below, at and past the window and the ring, then 48 generated tokens (up to 198 in all)."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    prompt = _prompt(length, seed=length)
    with torch.no_grad():
        ids = torch.tensor([prompt])
        ref_logits = hf(ids).logits[0, -1].numpy()
        ref = hf.generate(ids, max_new_tokens=48, min_new_tokens=48, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, length:].tolist()
    tokenizer = TextTokenizer.from_program(ring_device.program)
    gen = generate_one(ring_device, tokenizer, prompt, GREEDY, 48, ignore_eos=True)
    assert float(np.abs(gen.prompt_logits - ref_logits).max()) < 1e-3
    assert gen.tokens == ref
    assert len(set(ref)) > 4, "degenerate reference; the test would be weak"


def test_prefill_chunks_below_the_ring_length_attend_in_place(hf_dir, tmp_path_factory):
    """While every position a prefill chunk writes is below the ring's R rows, ring row = position, so
    each ring layer's prefill runs GroupQueryAttention in place (with the window); past R, the ring's
    write and products. A prompt wholly below R writes the same K/V rows and gives the same logits as
    the full-context build (GroupQueryAttention throughout), to float32 rounding; one whose chunks
    fall on both sides of R follows the reference (test_ring_greedy_tokens_equal_the_reference)."""
    from decoding import prefill

    ring = _device(hf_dir, tmp_path_factory, lanes=2, context=256)
    full = _device(hf_dir, tmp_path_factory, lanes=2, context=256, kv_rings=False)
    try:
        ring_layers = [i for i, n in enumerate(ring.program.manifest.kv.layer_lengths) if n == RING]
        graph = onnx.load(str(ring.program.path / "graphs" / f"prefill_{max(CHUNKS)}.onnx"), load_external_data=False)
        branches = {n.name: n for n in graph.graph.node if n.op_type == "If" and n.name.endswith("/attn/InRows")}
        assert sorted(branches) == [f"/model/layers.{i}/attn/InRows" for i in ring_layers]
        for node in branches.values():
            then, other = (next(a.g for a in node.attribute if a.name == b) for b in ("then_branch", "else_branch"))
            gqa = [n for n in then.node if n.op_type == "GroupQueryAttention"]
            assert len(gqa) == 1 and {a.name: a.i for a in gqa[0].attribute}["local_window_size"] == WINDOW
            assert "ScatterND" in {n.op_type for n in other.node}
        prompt = _prompt(RING - 5, seed=11)   # 35 tokens: chunks 24 + 12, every position below R = 40
        lanes = ring.lanes.allocate(), full.lanes.allocate()
        np.testing.assert_allclose(prefill(ring, lanes[0], prompt), prefill(full, lanes[1], prompt), rtol=0, atol=1e-4)
        for i in ring_layers:
            for a, b in ((ring.lanes.keys[i], full.lanes.keys[i]), (ring.lanes.values[i], full.lanes.values[i])):
                np.testing.assert_allclose(a[lanes[0], :, :len(prompt)], b[lanes[1], :, :len(prompt)], rtol=0, atol=1e-5)
    finally:
        ring.close()
        full.close()


def _run(device, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    tokenizer = TextTokenizer.from_program(device.program)
    with LocalEngine(device, tokenizer) as local:
        streams = [local.submit(GenerationRequest(tuple(p), GREEDY, m, ignore_eos=True)) for p, m in zip(prompts, max_tokens)]
        return [list(s.result().outputs[0].token_ids) for s in streams]


def test_a_thousand_tokens_batched_equal_the_same_run_alone(hf_dir, tmp_path_factory):
    """1,000 generated tokens (the window crossed ~60 times, the ring ~26) on lane 0 while three other
    requests of other lengths join, finish and leave the batch, against the same request alone, and
    against a build whose sliding layers keep the full context (GroupQueryAttention, no ring)."""
    ring = _device(hf_dir, tmp_path_factory, lanes=4, context=1200)
    full = _device(hf_dir, tmp_path_factory, lanes=4, context=1200, kv_rings=False)
    try:
        assert ring.program.manifest.kv.ring == RING and full.program.manifest.kv.ring is None
        main = _prompt(37, seed=7)
        others = [_prompt(n, seed=n) for n in (5, 29, 61)]
        alone = _run(ring, [main], [1000])[0]
        batched = _run(ring, [main, *others], [1000, 300, 700, 120])[0]
        assert len(alone) == 1000 and len(set(alone)) > 10
        assert batched == alone
        assert _run(full, [main], [1000])[0] == alone
    finally:
        ring.close()
        full.close()


def test_a_lanes_ring_logits_alone_and_batched(tmp_path_factory):
    """A decode step's ring layers take one of two formulations for the whole graph: GroupQueryAttention
    reading each lane's rows in place while no lane has wrapped or reached the window, the products
    over the whole ring otherwise. Within one formulation a lane's logits do not depend on the batch
    (bit-identical in the 1-lane and the 4-lane graph: the products run a KV head's query heads as rows
    of one matrix per lane). A short lane beside a wrapped one takes the products: its logits then
    differ from alone only by float32 rounding, and its greedy tokens are the same. Gemma 3 270M's
    attention shapes (4 query heads over 1 KV head of 256, window 512) on a tiny body; prompts past the
    window, decoding past the ring."""
    import tiny_models
    from decoding import prefill

    from calculet.runtime.jobs import DecodeJob

    folder = tiny_models.make_tiny_model("gemma3", tmp_path_factory.mktemp("hf-gemma3-d256"), seed=5, head_dim=256,
                                         num_key_value_heads=1, sliding_window=512, query_pre_attn_scalar=256,
                                         max_position_embeddings=2048)
    opts = CompileOptions(lanes=4, context=1024, prefill_chunks=(128,), decode_lanes=(1,), golden=False, weights="fp32")
    path = compile_calbin(str(folder), tmp_path_factory.mktemp("calbin") / "m.calbin", opts, log=lambda _m: None)
    device = Device()
    device.configure(device.load(path))
    try:
        assert [g.lanes for g in device.program.decode_graphs] == [1, 4] and device.program.manifest.kv.ring == 640
        prompts = {n: _prompt(n, seed=n) for n in (600, 530, 610, 250, 90)}
        decode_graph = onnx.load(str(path / "graphs" / "decode_4.onnx"), load_external_data=False)
        ring_layers = sum(n == 640 for n in device.program.manifest.kv.layer_lengths)
        assert ring_layers and sum(node.op_type == "If" for node in decode_graph.graph.node) == ring_layers

        def decode(lengths: dict[int, int], steps: int = 60) -> dict[int, list[np.ndarray]]:
            """Greedy steps of the lanes in `lengths` (lane: prompt length) together: each lane's logits."""
            for lane in range(4):
                if device.lanes.in_use(lane):
                    device.lanes.free(lane)
            for _ in range(4):
                device.lanes.allocate()
            lanes = sorted(lengths)
            last = {lane: int(np.argmax(prefill(device, lane, prompts[lengths[lane]]))) for lane in lanes}
            rows = {lane: [] for lane in lanes}
            for _ in range(steps):
                logits = device.run(DecodeJob(tuple(lanes), tuple(last[lane] for lane in lanes)), 30).logits
                for lane, row in zip(lanes, logits):
                    rows[lane].append(row.copy())
                last = {lane: int(np.argmax(row)) for lane, row in zip(lanes, logits)}
            return rows

        def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
            return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))

        # lanes past the window (600, 530, 610: and wrapping, 600 + 60 > 640 rows) take the whole-ring
        # products, alone or batched; a lane of 90 alone or beside a 250-token lane reads its rows in
        # place; beside the long lanes it takes the products
        batched = decode({0: 600, 1: 530, 2: 610, 3: 90})
        assert same(decode({0: 600})[0], batched[0])
        short = decode({3: 90})[3]
        assert same(short, decode({0: 250, 3: 90})[3])
        assert [int(np.argmax(r)) for r in short] == [int(np.argmax(r)) for r in batched[3]]
        worst = max(float(np.abs(a - b).max()) for a, b in zip(short, batched[3]))
        assert 0 < worst < 1e-5, worst   # different formulations, float32 rounding apart
    finally:
        device.close()
