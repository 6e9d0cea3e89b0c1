"""Tiny random-weight Hugging Face models, built in the tests (nothing is downloaded).

`make_tiny_model(arch, folder)` writes config.json + model.safetensors + tokenizer.json +
tokenizer_config.json + generation_config.json exactly as `save_pretrained` does, with a small
byte-level BPE tokenizer trained here on a fixed text. Needs the `reference` extra (torch, transformers).
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 320
ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "qwen3_moe", "mixtral", "qwen2_moe")

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Paris is the capital of France. "
    "Static graphs run on accelerators; the runtime owns the KV cache and the lanes. "
    "def main():\n    return 42\n"
    "El rápido zorro marrón salta sobre el perro perezoso. 東京は日本の首都です。 😀🚀"
) * 4


def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<pad>", "<eos>", "<bos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS], trainer=trainer)
    assert tok.get_vocab_size() <= VOCAB
    return tok.to_str()


def tiny_config(arch: str, **overrides):
    from transformers import (Gemma3TextConfig, LlamaConfig, MixtralConfig, Qwen2Config, Qwen2MoeConfig, Qwen3Config,
                              Qwen3MoeConfig)

    common = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        pad_token_id=0, eos_token_id=1, bos_token_id=2, rms_norm_eps=1e-6,
    )
    if arch == "llama":
        cfg = LlamaConfig(**{**common, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})
    elif arch == "qwen2":
        cfg = Qwen2Config(**{**common, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}})
    elif arch == "qwen3":
        cfg = Qwen3Config(**{**common, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}})
    elif arch == "gemma3":
        cfg = Gemma3TextConfig(
            **common, sliding_window=8, query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        )
    elif arch == "qwen3_moe":
        # 8 experts, top 2, expert FFN 32; layer 0 stays dense (mlp_only_layers), layers 1 and 2 are sparse
        cfg = Qwen3MoeConfig(**{**common, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
                             num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=[0],
                             norm_topk_prob=True)
    elif arch == "mixtral":  # 8 experts of FFN 32, top 2, every layer sparse
        cfg = MixtralConfig(**{**common, "intermediate_size": 32,
                               "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
                            num_local_experts=8, num_experts_per_tok=2)
    elif arch == "qwen2_moe":  # 8 experts of FFN 32, top 2, a shared expert of 64; layer 0 dense
        cfg = Qwen2MoeConfig(**{**common, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
                             num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=64, mlp_only_layers=[0])
    else:
        raise ValueError(f"unknown tiny arch {arch!r}; have {ARCHS}")
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def make_tiny_model(arch: str, folder: str | Path, seed: int = 0, **overrides) -> Path:
    """Build a random tiny model of `arch` and save it as a Hugging Face folder."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cfg = tiny_config(arch, **overrides)
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    with torch.no_grad():  # random init is small; widen it so logits are not all ties
        for name, p in model.named_parameters():
            if "norm" in name:  # Gemma norms multiply by (1 + w)
                p.copy_((0.0 if arch == "gemma3" else 1.0) + 0.1 * torch.randn_like(p))
            elif "embed" in name and arch == "gemma3":
                p.normal_(0.0, 0.01)  # Gemma scales embeddings by sqrt(hidden): keep the stream from collapsing
            else:
                p.normal_(0.0, 0.08)
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "tokenizer.json").write_text(_tokenizer_json())
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
        "add_bos_token": True, "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
    }))
    return folder


if __name__ == "__main__":  # python tests/tiny_models.py DIR [ARCH ...]: HF folders DIR/<arch>, for environments without torch
    import sys

    out = Path(sys.argv[1])
    for name in sys.argv[2:] or ARCHS:
        print(make_tiny_model(name, out / name))
