"""Find a model's hyperparameters without its weights: a `config.json`, a folder holding one, or the
metadata of a GGUF file (read with `gguf.GGUFReader`; no tensor is dequantized or even read).

GGUF metadata keys (`{arch}.embedding_length`, ...) are mapped onto the Hugging Face key names, so
both kinds of source go through the one `hparams_from_config`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from calculet.calbin.plan_hparams import ModelHParams, hparams_from_config
from calculet.errors import RequestError

GGUF_MAGIC = b"GGUF"

# GGUF general.architecture -> Hugging Face model_type. llama.cpp stores Mistral as llama and
# Mixtral as llama with experts (mapped to mixtral below).
GGUF_ARCHITECTURES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3moe": "qwen3_moe",
    "gemma3": "gemma3_text",
}

# Hugging Face key <- GGUF key suffix (after "{arch}.").
_GGUF_KEYS = {
    "hidden_size": "embedding_length",
    "num_hidden_layers": "block_count",
    "intermediate_size": "feed_forward_length",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "max_position_embeddings": "context_length",
    "vocab_size": "vocab_size",
    "sliding_window": "attention.sliding_window",
    "num_experts": "expert_count",
    "num_experts_per_tok": "expert_used_count",
    "moe_intermediate_size": "expert_feed_forward_length",
}


def load_hparams(path: str | Path) -> ModelHParams:
    """Hyperparameters from a config.json, a folder with one, or a GGUF file."""
    p = Path(path)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise RequestError("source_not_model", f"{p} is a folder without a config.json; give a "
                               f"config.json, a folder holding one, or a .gguf file")
        p = p / "config.json"
    if not p.is_file():
        raise RequestError("source_not_found", f"{p} does not exist; give a config.json, a folder "
                           f"holding one, or a .gguf file")
    with p.open("rb") as f:
        head = f.read(4)
    if head == GGUF_MAGIC:
        return hparams_from_config(gguf_config(p), source=f"GGUF {p}")
    if p.suffix.lower() == ".gguf":
        raise RequestError("source_not_model", f"{p} is not a GGUF file (its first bytes are "
                           f"{head!r}, not {GGUF_MAGIC!r})")
    if p.suffix.lower() != ".json":
        raise RequestError("source_not_model", f"{p} is neither a config.json nor a GGUF file")
    try:
        config = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError("config_not_json", f"{p} is not valid JSON: {exc}") from None
    return hparams_from_config(config, source=str(p))


def gguf_config(path: Path) -> dict[str, Any]:
    """A Hugging Face-style config dict built from a GGUF file's metadata and tensor list.

    GGUFReader parses every metadata array (a 262k-entry vocabulary takes seconds), so the result
    is cached per (path, size, mtime)."""
    stat = path.stat()
    return dict(_gguf_config(str(path.resolve()), stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _gguf_config(path_text: str, size: int, mtime_ns: int) -> dict[str, Any]:
    from gguf import GGUFReader  # heavy: keep it out of `calculet --help`

    path = Path(path_text)
    try:
        reader = GGUFReader(path, "r")
    except (ValueError, KeyError, IndexError, OSError) as exc:
        raise RequestError("source_not_model", f"cannot read GGUF metadata of {path}: {exc}") from None
    meta = reader.fields
    if "general.architecture" not in meta:
        raise RequestError("config_missing_key", f"GGUF {path} has no 'general.architecture'")
    gguf_arch = str(meta["general.architecture"].contents())
    model_type = GGUF_ARCHITECTURES.get(gguf_arch)
    if model_type is None:
        raise RequestError("unsupported_architecture", f"GGUF {path}: architecture {gguf_arch!r} is "
                           f"not supported; supported: {', '.join(sorted(GGUF_ARCHITECTURES))}")
    config: dict[str, Any] = {"model_type": model_type}
    for hf_key, suffix in _GGUF_KEYS.items():
        field = meta.get(f"{gguf_arch}.{suffix}")
        if field is not None:
            config[hf_key] = _scalar(field.contents(), f"{gguf_arch}.{suffix}", path)
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in meta:
        config["vocab_size"] = len(meta["tokenizer.ggml.tokens"].data)
    tensor_names = {t.name for t in reader.tensors}
    config["tie_word_embeddings"] = "output.weight" not in tensor_names
    if model_type == "llama" and config.get("num_experts"):  # llama.cpp stores Mixtral as llama
        config.update(model_type="mixtral", num_local_experts=config.pop("num_experts"))
    if model_type in ("qwen2", "qwen3", "qwen3_moe") and "sliding_window" in config:
        config["use_sliding_window"] = True
    if model_type in ("llama", "qwen3", "qwen3_moe", "gemma3_text"):
        config["attention_bias"] = "blk.0.attn_output.bias" in tensor_names
    return config


def _scalar(value: Any, key: str, path: Path) -> Any:
    """GGUF stores some per-layer values as arrays; the planner needs one value for all layers."""
    if isinstance(value, list):
        if not value or any(v != value[0] for v in value):
            raise RequestError("unsupported_architecture", f"GGUF {path}: {key!r} varies per layer "
                               f"({value[:8]}...); the planner needs one value for all layers")
        value = value[0]
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
