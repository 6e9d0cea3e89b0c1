"""The portable target: standard ONNX ops only, and the same tokens as the reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from calculet.calbin.manifest import read_manifest
from calculet.compiler.compile import compile_calbin
from calculet.compiler.options import CompileOptions
from calculet.golden_gate import check_calbin
from calculet.engine.sampler import SamplerConfig
from calculet.engine.tokenizer import TextTokenizer
from calculet.errors import RequestError
from calculet.reference.golden import read_golden
from calculet.runtime.device import Device
from decoding import generate_one, greedy_together

STANDARD_DOMAINS = {"", "ai.onnx"}


def _portable(model_dir, tmp_path, weights="fp32", lanes=3, golden=False):
    out = tmp_path / f"portable-{weights}.calbin"
    options = CompileOptions(lanes=lanes, context=64, prefill_chunks=(4, 16), golden=golden, weights=weights,
                             target="portable")
    return compile_calbin(str(model_dir), out, options, log=lambda _m: None)


@pytest.mark.parametrize("arch", ["gemma3", "qwen3"])
def test_portable_graphs_use_standard_ops_and_match_reference(arch, tiny_model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    path = _portable(tiny_model_dir(arch), tmp_path)
    m = read_manifest(path)
    assert m.target == "portable" and m.kv.in_place is False
    for g in m.graphs:
        model = onnx.load(str(path / g.file), load_external_data=False)
        domains = {n.domain for n in model.graph.node}
        assert domains <= STANDARD_DOMAINS, f"{g.name} uses {domains - STANDARD_DOMAINS}"
        assert {o.domain for o in model.opset_import} <= STANDARD_DOMAINS
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir(arch), dtype=torch.float32, attn_implementation="eager").eval()
    d = Device()
    d.configure(d.load(path))
    try:
        tok = TextTokenizer.from_program(d.program)
        for n in (1, 17, 30):  # 30 runs past gemma3's window of 8
            prompt = np.random.default_rng(n).integers(3, 300, size=n).tolist()
            gen = generate_one(d, tok, prompt, SamplerConfig(temperature=0.0), 16, ignore_eos=True)
            with torch.no_grad():
                ref = hf.generate(torch.tensor([prompt]), max_new_tokens=16, min_new_tokens=16, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)[0, n:].tolist()
                ref_logits = hf(torch.tensor([prompt])).logits[0, -1].numpy()
            assert gen.tokens == ref
            assert np.abs(gen.prompt_logits - ref_logits).max() < 1e-3
    finally:
        d.close()


def test_portable_batched_decode_writes_each_lane(tiny_model_dir, tmp_path):
    """The runtime stores each lane's new K/V at that lane's own position: batched equals alone."""
    path = _portable(tiny_model_dir("llama"), tmp_path)
    d = Device()
    d.configure(d.load(path))
    try:
        tok = TextTokenizer.from_program(d.program)
        prompts = [np.random.default_rng(s).integers(3, 300, size=n).tolist() for s, n in ((1, 3), (2, 11), (3, 7))]
        alone = [generate_one(d, tok, p, SamplerConfig(temperature=0.0), 10, ignore_eos=True).tokens for p in prompts]
        together = greedy_together(d, prompts, 10)
        assert together == alone
    finally:
        d.close()


def test_portable_int8_weights_via_dequantize_linear(tiny_model_dir, tmp_path):
    path = _portable(tiny_model_dir("llama"), tmp_path, weights="int8")
    ops = set()
    for g in read_manifest(path).graphs:
        ops |= {n.op_type for n in onnx.load(str(path / g.file), load_external_data=False).graph.node}
    assert "DequantizeLinear" in ops and "MatMulNBits" not in ops
    d = Device()
    d.configure(d.load(path))
    try:
        gen = generate_one(d, TextTokenizer.from_program(d.program), [5, 6, 7, 8], SamplerConfig(temperature=0.0), 8)
        assert len(gen.tokens) >= 1
    finally:
        d.close()


def test_portable_rejects_contrib_only_policies(tiny_model_dir, tmp_path):
    with pytest.raises(RequestError) as e:
        CompileOptions(target="portable", weights="w8a8")
    assert "supports --weights fp32 or fp16 or int8" in str(e.value)


def test_portable_fp16_weights_standard_ops_and_reference_tokens(tiny_model_dir, tmp_path):
    """fp16 weights on the portable target: standard ops only (MatMul/Gemm in half precision between
    Casts), and the greedy tokens of the tiny model equal the fp32 reference's."""
    path = _portable(tiny_model_dir("gemma3"), tmp_path, weights="fp16", golden=True)
    domains, ops = set(), set()
    for g in read_manifest(path).graphs:
        for n in onnx.load(str(path / g.file), load_external_data=False).graph.node:
            domains.add(n.domain)
            ops.add(n.op_type)
    assert domains <= STANDARD_DOMAINS and "Cast" in ops
    tensors = read_manifest(path).quantization.tensors
    assert tensors["model.embed_tokens.weight"].kind == "fp16"
    report = check_calbin(path, read_golden(path))
    assert report.passed, report.summary()


def test_portable_graphs_read_every_input(tiny_model_dir, tmp_path):
    """Regression (issue 17): portable bodies declared total_seq_len but no node read it, and
    ONNX Runtime's OpenVINO provider then bound every later input (the KV buffers) shifted by one,
    so all outputs were NaN. Portable bodies no longer declare it, and every graph reads every input."""
    path = _portable(tiny_model_dir("llama"), tmp_path)
    for g in read_manifest(path).graphs:
        model = onnx.load(str(path / g.file), load_external_data=False)
        read = {i for n in model.graph.node for i in n.input}
        declared = [i.name for i in model.graph.input]
        assert "total_seq_len" not in declared
        assert [name for name in declared if name not in read] == [], g.name
