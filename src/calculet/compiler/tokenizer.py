"""Tokenizer facts for the manifest: vocab size, special ids, whether to prepend BOS, chat template."""

from __future__ import annotations

import json

from calculet.calbin.manifest import TokenizerInfo
from calculet.errors import ModelError
from calculet.models.base import ModelSpec
from calculet.sources.base import SourceModel


def _token_id(tok, value) -> int | None:
    if value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, dict):  # {"content": "<bos>", ...} in older tokenizer_config files
        value = value.get("content")
    return tok.token_to_id(value)


def _post_processor_adds_bos(tokenizer_json: dict, bos: str | None) -> bool:
    post = tokenizer_json.get("post_processor") or {}
    procs = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
    for p in procs:
        if p.get("type") == "TemplateProcessing":
            first = (p.get("single") or [{}])[0]
            if "SpecialToken" in first and first["SpecialToken"].get("id") == bos:
                return True
    return False


def tokenizer_info(source: SourceModel, spec: ModelSpec) -> TokenizerInfo:
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_str(source.tokenizer_json)
    except Exception as exc:  # tokenizers raises its own exception type
        raise ModelError("bad_tokenizer", f"tokenizer.json of {source.path} cannot be loaded: {exc}") from None
    cfg = source.tokenizer_config
    vocab = tok.get_vocab_size(with_added_tokens=True)
    bos = _token_id(tok, cfg.get("bos_token"))
    if bos is None:
        bos = spec.bos_token_id
    eos = set(spec.eos_token_ids)
    gen_eos = source.generation_config.get("eos_token_id")
    eos.update(gen_eos if isinstance(gen_eos, list) else ([gen_eos] if gen_eos is not None else []))
    cfg_eos = _token_id(tok, cfg.get("eos_token"))
    if cfg_eos is not None:
        eos.add(cfg_eos)
    pad = _token_id(tok, cfg.get("pad_token"))
    if pad is None:
        pad = spec.pad_token_id
    if "add_bos_token" in cfg:
        add_bos = bool(cfg["add_bos_token"])
    else:
        bos_str = tok.id_to_token(bos) if bos is not None else None
        add_bos = _post_processor_adds_bos(json.loads(source.tokenizer_json), bos_str)
    for name, value in (("bos", bos), ("pad", pad), *(("eos", e) for e in eos)):
        if value is not None and not 0 <= value < spec.vocab_size:
            raise ModelError("bad_tokenizer", f"{name} token id {value} is outside the model vocabulary 0..{spec.vocab_size - 1}")
    if vocab > spec.vocab_size:
        raise ModelError("bad_tokenizer", f"tokenizer has {vocab} tokens but the model's vocab_size is {spec.vocab_size}")
    return TokenizerInfo(
        file="tokenizer.json",
        vocab_size=vocab,
        bos_token_id=bos,
        eos_token_ids=tuple(sorted(eos)),
        pad_token_id=pad,
        add_bos_token=add_bos,
        chat_template=cfg.get("chat_template"),
    )
