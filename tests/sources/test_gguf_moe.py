"""A tiny Qwen3-MoE GGUF, written here with `gguf.GGUFWriter` in llama.cpp's `qwen3moe` conventions
(router `ffn_gate_inp`, stacked `ffn_{gate,up,down}_exps`, `qwen3moe.expert_*` metadata), compiles
and gives the tokens of the transformers model it was written from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter, TokenType
from gguf.quants import quantize

from calculet.compiler.compile import compile_calbin
from calculet.compiler.options import CompileOptions
from decoding import generate_one as generate
from calculet.golden_gate import check_calbin
from calculet.engine.sampler import SamplerConfig
from calculet.engine.tokenizer import TextTokenizer
from calculet.errors import ModelError
from calculet.reference.golden import read_golden
from calculet.runtime.device import Device
from calculet.sources.gguf import load_gguf

import tiny_models
from test_gguf import llama_cpp_permute

LAYERS, EXPERTS, TOP_K, EXPERT_FFN = 2, 8, 2, 32


def _hf_tensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    return {k: v.astype(np.float32) for k, v in load_file(str(folder / "model.safetensors")).items()}


def write_qwen3moe_gguf(path: Path, folder: Path, expert_qtype=QT.F32, drop: str | None = None,
                        arch: str = "qwen3moe") -> None:
    """The HF folder's model as llama.cpp's converter lays it out (every block sparse). arch "llama":
    a Mixtral folder, as llama.cpp writes Mixtral (llama q/k rows permuted, no q/k norms)."""
    cfg = json.loads((folder / "config.json").read_text())
    tok = json.loads((folder / "tokenizer.json").read_text())
    t = _hf_tensors(folder)
    mixtral = arch == "llama"
    w = GGUFWriter(str(path), arch)
    w.add_context_length(256)
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    if not mixtral:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(TOP_K)
    if not mixtral:
        w.add_expert_feed_forward_length(EXPERT_FFN)
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {a["content"] for a in tok["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([s for s, _ in vocab])
    w.add_token_types([TokenType.CONTROL if s in special else TokenType.NORMAL for s, _ in vocab])
    w.add_token_merges([" ".join(m) for m in tok["model"]["merges"]])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_tensor("token_embd.weight", t["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", t["model.norm.weight"])
    w.add_tensor("output.weight", t["lm_head.weight"])
    names = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
             "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.gate"}
    experts = (("ffn_gate_exps", "mlp.experts.{e}.gate_proj"), ("ffn_up_exps", "mlp.experts.{e}.up_proj"),
               ("ffn_down_exps", "mlp.experts.{e}.down_proj"))
    if mixtral:
        del names["attn_q_norm"], names["attn_k_norm"]
        names["ffn_gate_inp"] = "block_sparse_moe.gate"
        experts = (("ffn_gate_exps", "block_sparse_moe.experts.{e}.w1"), ("ffn_up_exps", "block_sparse_moe.experts.{e}.w3"),
                   ("ffn_down_exps", "block_sparse_moe.experts.{e}.w2"))
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]} if mixtral else {}
    for i in range(cfg["num_hidden_layers"]):
        for gguf_name, hf in names.items():
            value = t[f"model.layers.{i}.{hf}.weight"]
            if gguf_name in heads:  # llama.cpp's interleaved-pair rows for llama q/k
                value = llama_cpp_permute(value, heads[gguf_name])
            w.add_tensor(f"blk.{i}.{gguf_name}.weight", value)
        for gguf_name, hf in experts:
            if drop == gguf_name:
                continue
            stack = np.stack([t[f"model.layers.{i}.{hf.format(e=e)}.weight"] for e in range(EXPERTS)])
            w.add_tensor(f"blk.{i}.{gguf_name}.weight", stack if expert_qtype == QT.F32 else quantize(stack, expert_qtype),
                         raw_dtype=expert_qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def moe_hf(tmp_path_factory):
    """A tiny HF Qwen3-MoE with every layer sparse (llama.cpp's qwen3moe has no dense blocks)."""
    return tiny_models.make_tiny_model("qwen3_moe", tmp_path_factory.mktemp("hf-moe-all-sparse"), seed=3,
                                       num_hidden_layers=LAYERS, mlp_only_layers=[])


def test_qwen3moe_gguf_config_and_stacked_tensors(moe_hf, tmp_path):
    path = tmp_path / "moe.gguf"
    write_qwen3moe_gguf(path, moe_hf)
    source = load_gguf(str(path))
    c = source.config
    assert (c["model_type"], c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]) == \
        ("qwen3_moe", EXPERTS, TOP_K, EXPERT_FFN)
    assert c["mlp_only_layers"] == [] and c["norm_topk_prob"] is True
    hf = _hf_tensors(moe_hf)
    gate_up = source.tensors["model.layers.1.mlp.experts.gate_up_proj"]
    assert gate_up.shape == (EXPERTS, 2 * EXPERT_FFN, 64)
    np.testing.assert_array_equal(gate_up[5, :EXPERT_FFN], hf["model.layers.1.mlp.experts.5.gate_proj.weight"])
    np.testing.assert_array_equal(gate_up[5, EXPERT_FFN:], hf["model.layers.1.mlp.experts.5.up_proj.weight"])
    np.testing.assert_array_equal(source.tensors["model.layers.0.mlp.gate.weight"], hf["model.layers.0.mlp.gate.weight"])


def test_qwen3moe_gguf_missing_expert_stack_is_named(moe_hf, tmp_path):
    path = tmp_path / "broken.gguf"
    write_qwen3moe_gguf(path, moe_hf, drop="ffn_up_exps")
    with pytest.raises(ModelError) as e:
        load_gguf(str(path))
    assert "ffn_gate_exps and ffn_up_exps" in str(e.value)


@pytest.mark.parametrize("target", ["cpu", "portable"])
def test_qwen3moe_gguf_compiles_and_matches_transformers(target, moe_hf, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    path = tmp_path / "moe.gguf"
    write_qwen3moe_gguf(path, moe_hf)
    out = compile_calbin(str(path), tmp_path / "moe.calbin",
                         CompileOptions(lanes=2, context=64, prefill_chunks=(4, 16), weights="fp32", target=target),
                         log=lambda _m: None)
    report = check_calbin(out, read_golden(out))           # reference built from the GGUF's own tensors
    assert report.passed, report.summary()
    hf = AutoModelForCausalLM.from_pretrained(moe_hf, dtype=torch.float32, attn_implementation="eager").eval()
    d = Device()
    d.configure(d.load(out))
    try:
        tok = TextTokenizer.from_program(d.program)
        for n in (1, 17):
            prompt = np.random.default_rng(n).integers(3, 300, size=n).tolist()
            gen = generate(d, tok, prompt, SamplerConfig(temperature=0.0), 32, ignore_eos=True)
            with torch.no_grad():
                ref = hf.generate(torch.tensor([prompt]), max_new_tokens=32, min_new_tokens=32, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)[0, n:].tolist()
            assert gen.tokens == ref
    finally:
        d.close()


def test_qwen3moe_gguf_with_q8_0_experts_passes_its_golden(moe_hf, tmp_path):
    """Quantized 3-D expert stacks dequantize per expert row; the reference sees the same values."""
    path = tmp_path / "moe-q8.gguf"
    write_qwen3moe_gguf(path, moe_hf, expert_qtype=QT.Q8_0)
    out = compile_calbin(str(path), tmp_path / "moe-q8.calbin",
                         CompileOptions(lanes=2, context=64, prefill_chunks=(4, 16), weights="fp32"), log=lambda _m: None)
    report = check_calbin(out, read_golden(out))
    assert report.passed, report.summary()


def test_mixtral_as_llama_cpp_writes_it_compiles_and_passes_its_golden(tiny_model_dir, tmp_path):
    """llama.cpp stores Mixtral as `llama` with ffn_gate_inp and stacked ffn_*_exps (q/k rows permuted)."""
    path = tmp_path / "mixtral.gguf"
    write_qwen3moe_gguf(path, tiny_model_dir("mixtral"), arch="llama")
    source = load_gguf(str(path))
    assert (source.config["model_type"], source.config["num_local_experts"]) == ("mixtral", EXPERTS)
    hf = _hf_tensors(tiny_model_dir("mixtral"))
    for name in ("model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"):
        np.testing.assert_array_equal(source.tensors[name], hf[name])       # the permutation undone
    np.testing.assert_array_equal(source.tensors["model.layers.1.mlp.experts.gate_up_proj"][3, EXPERT_FFN:],
                                  hf["model.layers.1.block_sparse_moe.experts.3.w3.weight"])
    out = compile_calbin(str(path), tmp_path / "mixtral.calbin",
                         CompileOptions(lanes=2, context=64, prefill_chunks=(4, 16), weights="fp32"), log=lambda _m: None)
    report = check_calbin(out, read_golden(out))
    assert report.passed, report.summary()
