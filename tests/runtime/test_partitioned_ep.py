"""2-chip expert-parallel calbins (`--partition ep`) of the tiny MoE families give the 1-chip calbin's
greedy tokens in fp32, alone and batched; stay within the quantized policy's bound; place the experts
as the manifest says; and count one all-reduce per sparse block per step."""

from __future__ import annotations

import numpy as np
import pytest

from calculet.calbin.manifest import read_manifest
from calculet.runtime.chips import chip_configs, open_device
from calculet.runtime.jobs import DecodeJob
from decoding import greedy_together, prefill

MOE = ["qwen3_moe", "mixtral", "qwen2_moe"]
PROMPTS = [(1, 5), (2, 17), (3, 1), (4, 30)]   # (seed, length): straddle the 4/16 chunks
STEPS = 12


def _prompts():
    return [np.random.default_rng(s).integers(3, 300, size=n).tolist() for s, n in PROMPTS]


@pytest.mark.parametrize("arch", MOE)
def test_two_chip_ep_equals_one_chip_alone_and_batched(tiny_calbin, arch):
    one = open_device(tiny_calbin(arch))
    reference = [greedy_together(one, [p], STEPS)[0] for p in _prompts()]
    one.close()
    device = open_device(tiny_calbin(arch, chips=2, partition="ep"), chip_configs(2))
    try:
        alone = [greedy_together(device, [p], STEPS)[0] for p in _prompts()]
        batched = greedy_together(device, _prompts(), STEPS)
    finally:
        device.close()
    assert len({t for seq in reference for t in seq}) > 3, "reference output is degenerate; the test would be weak"
    assert alone == reference, f"{arch} ep: 2-chip tokens differ from 1-chip"
    assert batched == reference, f"{arch} ep: batched 2-chip tokens differ from alone"


@pytest.mark.parametrize("arch, weights", [("mixtral", "default"), ("qwen2_moe", "int4")])
def test_quantized_ep_stays_within_the_policy_bound(tiny_calbin, arch, weights):
    """Quantized experts run as QMoE over each chip's experts: held to the quantized policy's bound
    against the 1-chip calbin of the same policy, teacher-forced agreement >= QUANT_FORCED_AGREEMENT."""
    from calculet.compiler.compile import QUANT_FORCED_AGREEMENT

    prompts = _prompts()
    one = open_device(tiny_calbin(arch, weights=weights))
    reference = greedy_together(one, prompts, STEPS)
    one.close()
    device = open_device(tiny_calbin(arch, weights=weights, chips=2, partition="ep"), chip_configs(2))
    try:
        agree = total = 0
        for prompt, ref in zip(prompts, reference):    # teacher-forced: feed the 1-chip tokens, compare picks
            lane = device.lanes.allocate()
            pick = int(np.argmax(prefill(device, lane, prompt)))
            for t in ref:
                agree, total = agree + (pick == t), total + 1
                pick = int(np.argmax(device.run(DecodeJob((lane,), (t,)), 30).logits[0]))
            device.lanes.free(lane)
    finally:
        device.close()
    assert agree / total >= QUANT_FORCED_AGREEMENT, f"{arch} ep {weights}: {agree}/{total} tokens agree"


def test_ep_places_experts_and_counts_one_all_reduce_per_sparse_block(tiny_calbin):
    """qwen2_moe: layer 0 dense (rides with layer 1), layers 1 and 2 sparse: two blocks, so per step one
    broadcast (embedding), one all_reduce and one reduce (the last block's partials to chip 0)."""
    path = tiny_calbin("qwen2_moe", chips=2, partition="ep")
    top = read_manifest(path)
    part = top.partition
    assert part.scheme == "ep" and [c.experts for c in part.chips] == [(0, 4), (4, 8)]
    assert "model.layers.1.mlp.experts.gate_up_proj.weight" in part.sharded
    assert "model.layers.1.mlp.gate.weight" in part.replicated          # the router, on every chip
    chip1 = {t.name: t for t in read_manifest(path / part.chips[1].folder).weights.tensors}
    assert chip1["model.layers.2.mlp.experts.down_proj.weight"].shape[0] == 4
    assert not any("shared_expert" in n for n in chip1), "the shared expert lives on chip 0 only"
    assert [r for r in part.schedule("decode_4").segments[1].runs] == [(0, "decode_4.layers.0-1"), (1, "decode_4.layers.0-1")]
    device = open_device(path, chip_configs(2))
    try:
        lane = device.lanes.allocate()
        prefill(device, lane, list(range(3, 8)))
        device.run(DecodeJob((lane,), (5,)), 30)
        rows = device.program.decode_graph_for(1).lanes * top.spec.hidden_size * 4
        assert device.collectives.last_step.by_kind == {"broadcast": (1, rows), "all_reduce": (1, 2 * rows),
                                                        "reduce": (1, rows)}
    finally:
        device.close()


def test_ep_on_a_dense_model_is_refused_at_compile(tiny_model_dir, tmp_path):
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions
    from calculet.errors import RequestError

    with pytest.raises(RequestError, match="--partition ep distributes the routed experts.*llama has none"):
        compile_calbin(str(tiny_model_dir("llama")), tmp_path / "m.calbin",
                       CompileOptions(lanes=4, context=64, prefill_chunks=(4, 16), weights="fp32", chips=2,
                                      partition="ep"), log=lambda _m: None)
    with pytest.raises(RequestError, match="8 experts do not split evenly over 3 chips; allowed --chips: 2, 4, 8"):
        compile_calbin(str(tiny_model_dir("mixtral")), tmp_path / "m.calbin",
                       CompileOptions(lanes=4, context=64, prefill_chunks=(4, 16), weights="fp32", chips=3,
                                      partition="ep"), log=lambda _m: None)


def test_dense_layers_after_the_last_sparse_one_run_in_chip_0s_final(tmp_path):
    """qwen3_moe with layer 2 dense (mlp_only_layers=[0, 2]): the trailing dense layer runs, with its KV,
    in chip 0's final graph only (plan = compile for that placement); the tokens are still the 1-chip
    calbin's. Guards the first cut, where chip 1 was planned (and would have kept KV for) layer 2."""
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions
    from tiny_models import make_tiny_model

    source = make_tiny_model("qwen3_moe", tmp_path / "hf", mlp_only_layers=[0, 2])
    paths = {}
    for chips, partition in ((1, ""), (2, "ep")):
        paths[chips] = compile_calbin(str(source), tmp_path / f"{chips}.calbin",
                                      CompileOptions(lanes=4, context=64, prefill_chunks=(4, 16), weights="fp32",
                                                     chips=chips, partition=partition), log=lambda _m: None)
    final = read_manifest(paths[2] / "chips/0").graph("decode_4.final")
    assert {t.name for t in final.inputs} >= {"past_key.2", "past_value.2", "branch_in", "residual_in"}
    top = read_manifest(paths[2])
    assert [c.layers for c in top.partition.chips] == [(0, 1, 2), (0, 1)]      # chip 1 holds no weights or KV of layer 2
    from calculet.compiler.options import FUSIONS
    from calculet.planner.partition import Link, plan_partition
    plan = plan_partition(top.spec, "ep", 2, 4, 64, 16, "fp32", 32, frozenset(FUSIONS), Link(0.0))
    for chip, part in zip(plan.chips, top.partition.chips):
        m = read_manifest(paths[2] / part.folder)
        assert (chip.weights_bytes, chip.kv_bytes) == (m.weights.bytes, m.kv.total_bytes)
    one = open_device(paths[1])
    reference = greedy_together(one, _prompts(), STEPS)
    one.close()
    device = open_device(paths[2], chip_configs(2))
    try:
        assert greedy_together(device, _prompts(), STEPS) == reference
    finally:
        device.close()
