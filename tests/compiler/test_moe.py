"""Mixture-of-experts (Qwen3-MoE) calbins equal the transformers reference on a tiny random model.

The tiny model (tests/tiny_models.py): 3 layers, 8 experts, top 2, layer 0 dense (mlp_only_layers),
hidden 64, head_dim 16, expert FFN 32, norm_topk_prob. Chunks (4, 16): prompt lengths 1, 2, 15, 16,
17 straddle them and 17 is one past the largest; 30 needs two chunks.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest

from calculet.calbin.manifest import read_manifest
from calculet.compiler.compile import compile_calbin, golden_thresholds
from calculet.compiler.options import CompileOptions
from decoding import generate_one as generate
from calculet.golden_gate import check_calbin
from calculet.calbin.graphspec import TensorSpec
from calculet.engine.sampler import SamplerConfig
from calculet.engine.tokenizer import TextTokenizer
from calculet.reference.golden import read_golden
from calculet.runtime.device import Device
from decoding import greedy_together

PROMPT_LENGTHS = [1, 2, 15, 16, 17, 30]
STEPS = 32
STANDARD_DOMAINS = {"", "ai.onnx"}


@pytest.fixture(scope="module")
def moe_calbin(tiny_model_dir, tmp_path_factory):
    """moe_calbin(target="cpu", weights="fp32", lanes=4, golden=False, arch="qwen3_moe") -> calbin path, cached."""
    made = {}

    def get(target: str = "cpu", weights: str = "fp32", lanes: int = 4, golden: bool = False, arch: str = "qwen3_moe"):
        key = (target, weights, lanes, golden, arch)
        if key not in made:
            out = tmp_path_factory.mktemp(f"{arch}-{target}-{weights}") / "model.calbin"
            options = CompileOptions(lanes=lanes, context=64, prefill_chunks=(4, 16), golden=golden, weights=weights,
                                     target=target)
            made[key] = compile_calbin(str(tiny_model_dir(arch)), out, options, log=lambda _m: None)
        return made[key]

    return get


def _hf(folder):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def hf_moe(tiny_model_dir):
    return _hf(tiny_model_dir("qwen3_moe"))


def _ops(path) -> tuple[collections.Counter, set[str]]:
    ops, domains = collections.Counter(), set()
    for g in read_manifest(path).graphs:
        for n in onnx.load(str(path / g.file), load_external_data=False).graph.node:
            ops[n.op_type] += 1
            domains.add(n.domain)
    return ops, domains


def _prompt(n: int) -> list[int]:
    return np.random.default_rng(n).integers(3, 300, size=n).tolist()


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "qwen2_moe"])
@pytest.mark.parametrize("target", ["cpu", "portable"])
def test_fp32_greedy_tokens_and_logits_equal_transformers(target, arch, moe_calbin, hf_moe, tiny_model_dir):
    """Mixtral (every layer sparse, experts named block_sparse_moe.experts.{e}.w1/w3/w2, top-k always
    renormalised) and Qwen2-MoE (q/k/v bias, top-k not renormalised, a sigmoid-gated shared expert)
    run through the same block as Qwen3-MoE."""
    import torch

    hf = hf_moe if arch == "qwen3_moe" else _hf(tiny_model_dir(arch))
    d = Device()
    d.configure(d.load(moe_calbin(target, arch=arch)))
    varied = 0
    try:
        tok = TextTokenizer.from_program(d.program)
        for n in PROMPT_LENGTHS:
            prompt = _prompt(n)
            gen = generate(d, tok, prompt, SamplerConfig(temperature=0.0), STEPS, ignore_eos=True)
            with torch.no_grad():
                ids = torch.tensor([prompt])
                ref_logits = hf(ids).logits[0, -1].numpy()
                ref = hf.generate(ids, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False,
                                      eos_token_id=None, pad_token_id=0)[0, n:].tolist()
            assert np.abs(gen.prompt_logits - ref_logits).max() < 1e-3, f"{target} len {n}"
            assert gen.tokens == ref, f"{target} len {n}: greedy tokens differ"
            varied += len(set(ref)) > 1
    finally:
        d.close()
    assert varied >= len(PROMPT_LENGTHS) // 2, "mostly degenerate references: the test would be weak"


def test_default_target_runs_the_contrib_kernels(moe_calbin):
    """fp32 experts run as com.microsoft.MoE, quantized ones as QMoE: one node per sparse layer per body."""
    bodies = sum(1 for g in read_manifest(moe_calbin()).graphs if g.type != "head")
    assert _ops(moe_calbin())[0]["MoE"] == 2 * bodies
    ops, _ = _ops(moe_calbin(weights="default"))
    assert ops["QMoE"] == 2 * bodies and ops["MoE"] == 0


def test_portable_uses_standard_ops_gather_for_decode_dense_for_prefill(moe_calbin):
    path = moe_calbin("portable")
    assert _ops(path)[1] <= STANDARD_DOMAINS
    by_graph = {}
    for g in read_manifest(path).graphs:
        nodes = onnx.load(str(path / g.file), load_external_data=False).graph.node
        by_graph[g.name] = {n.name.split("/experts/")[1].split("/")[0] for n in nodes if "/moe/experts/" in n.name}
    # decode_1: 2 * 1 * top-2 <= 8 experts -> gather; 4 and 16 tokens -> dense (the routing matrix)
    assert "fc1" in by_graph["decode_1"] and "route" not in by_graph["decode_1"]
    assert "route" in by_graph["decode_4"] and "route" in by_graph["prefill_16"]


@pytest.mark.parametrize("arch, target, policy", [("qwen3_moe", "cpu", p) for p in ("default", "fp16", "int8", "w8a8")]
                         + [("qwen3_moe", "portable", "fp16"), ("qwen3_moe", "portable", "int8"), ("mixtral", "cpu", "default"),
                            ("qwen2_moe", "cpu", "default"), ("qwen2_moe", "portable", "int8")])
def test_policy_within_golden_bounds(arch, target, policy, moe_calbin):
    path = moe_calbin(target, policy, golden=True, arch=arch)
    sparse = 3 if arch == "mixtral" else 2
    m = read_manifest(path)
    assert m.golden.thresholds == golden_thresholds(policy).__dict__
    tensors = m.quantization.tensors
    routers = [r for name, r in tensors.items() if name.endswith(".mlp.gate.weight")]
    assert all(r.module == "router" for r in routers)
    experts = [r for r in tensors.values() if r.module == "experts"]
    assert len(routers) == sparse and all(r.kind == "fp32" for r in routers), "the router stays float32"
    assert len(experts) == 2 * sparse and {r.kind for r in experts} == {m.quantization.table["mlp"].kind}
    report = check_calbin(path, read_golden(path))
    assert report.passed, report.summary()


@pytest.mark.parametrize("policy", ["int4", "w4a8"])
def test_int4_policies_within_per_prompt_bounds(policy, moe_calbin):
    """int4 MoE calbins meet every per-prompt bound (top-k overlap, cosine, max logit error).

    Their teacher-forced agreement over the set is about 0.6, under int4's 0.7: the tiny random
    qwen3 family sits there without experts too (a dense tiny qwen3 measured 0.57 at int4), while
    the MoE model with only its experts in int4 measured 0.89, so the bound is the tiny model's
    near-tied logits, not the QMoE kernel."""
    path = moe_calbin("cpu", policy, golden=True)
    report = check_calbin(path, read_golden(path))
    assert all(p.passed for p in report.prompts), report.summary()
    assert report.forced_agreement >= 0.5, report.summary()
    assert {r.kind for r in read_manifest(path).quantization.tensors.values()
            if r.module == "experts"} == {"int4"}


@pytest.mark.parametrize("target", ["cpu", "portable"])
def test_eight_concurrent_sequences_equal_each_alone(target, moe_calbin):
    """Tokens routed together in one decode step go to their own experts: batched equals alone."""
    d = Device()
    d.configure(d.load(moe_calbin(target, lanes=8)))
    try:
        tok = TextTokenizer.from_program(d.program)
        prompts = [_prompt(n) for n in (1, 2, 3, 7, 15, 16, 17, 30)]
        alone = [generate(d, tok, p, SamplerConfig(temperature=0.0), 12, ignore_eos=True).tokens for p in prompts]
        assert greedy_together(d, prompts, 12) == alone
    finally:
        d.close()


@pytest.mark.parametrize("target", ["cpu", "portable"])
def test_expert_stats_count_the_reference_routing(target, tiny_model_dir, hf_moe, tmp_path):
    """--expert-stats: bodies output each row's routing mask and the device sums the job's real rows
    (padding of a prefill chunk and idle decode lanes are not counted); the counts equal the top-k
    of transformers' own router logits over the same tokens."""
    import torch

    out = compile_calbin(str(tiny_model_dir("qwen3_moe")), tmp_path / "stats.calbin",
                         CompileOptions(lanes=4, context=64, prefill_chunks=(4, 16), golden=False, weights="fp32",
                                        target=target, expert_stats=True), log=lambda _m: None)
    decode = next(g for g in read_manifest(out).graphs if g.name == "decode_4")
    assert TensorSpec("expert_mask", (2, 4, 8), "uint8") in decode.outputs
    d = Device()
    d.configure(d.load(out))
    try:
        assert d.expert_load is None
        prompt = _prompt(17)                      # one 16-token chunk, then a padded 4-token chunk
        gen = generate(d, TextTokenizer.from_program(d.program), prompt, SamplerConfig(temperature=0.0), 6,
                       ignore_eos=True)
        load = d.expert_load
    finally:
        d.close()
    seen = prompt + gen.tokens[:-1]               # the last token is sampled, never run
    with torch.no_grad():
        router = hf_moe(torch.tensor([seen]), output_router_logits=True).router_logits   # sparse layers 1, 2
    want = np.stack([np.bincount(torch.topk(r, 2, dim=-1).indices.flatten().numpy(), minlength=8) for r in router])
    assert load.shape == (2, 8) and load.sum() == 2 * 2 * len(seen)
    np.testing.assert_array_equal(load, want)
