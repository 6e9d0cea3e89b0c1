"""The tokenizer a GGUF file describes in its metadata -> Hugging Face tokenizer.json text.

A GGUF carries no tokenizer.json; llama.cpp stores the vocabulary under `tokenizer.ggml.*`.
`tokenizer.ggml.model` says which kind it is; we support the two our architectures use:

- "llama": SentencePiece BPE (Gemma, Llama 2). Pieces spell a space as "▁", `<0xNN>` tokens give
  byte fallback, and each piece has a score. The file holds no merges, so they are derived: every
  split of a piece into two pieces is a merge, ranked by the merged piece (see `derive_merges`).
- "gpt2": byte-level BPE (Llama 3, Qwen). Tokens are spelled in GPT-2's byte alphabet, merges are
  listed, and `tokenizer.ggml.pre` names the regex that splits text before BPE.

In both, CONTROL tokens (and the unknown token) become special added tokens and USER_DEFINED tokens
plain added tokens, so they are matched whole. The result matches what transformers builds from the
same file. Only `tokenizers`, numpy and gguf's token-type enum are used: no torch, no transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from gguf import TokenType
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

from calculet.errors import ModelError

SPACE = "\u2581"  # "▁", SentencePiece's spelling of a space

# tokenizer.ggml.pre -> split regex. None means GPT-2's own regex (ByteLevel(use_regex=True)).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZER_SPLITS: dict[str, str | None] = {
    "default": None, "gpt-2": None, "gpt2": None,
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT, "falcon3": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
}
SUPPORTED_MODELS = ("llama", "gpt2")


@dataclass(frozen=True)
class ConvertedTokenizer:
    tokenizer_json: str       # Hugging Face tokenizers serialization
    tokenizer_config: dict    # token strings and ids, add_bos/eos_token, chat_template
    generation_config: dict   # bos/eos/pad ids the file names


@dataclass(frozen=True)
class GgufVocab:
    """The `tokenizer.*` metadata of one file, checked."""

    where: str                       # the file, for messages
    architecture: str
    model: str                       # tokenizer.ggml.model
    pre: str | None                  # tokenizer.ggml.pre
    tokens: list[str]
    scores: list[float] | None
    types: list[int] | None          # gguf.TokenType values
    merges: list[str] | None
    special_ids: dict[str, int | None]  # bos / eos / unk / pad
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    chat_template: str | None
    end_of_generation_ids: tuple[int, ...]  # eot / eom ids beyond eos, if the file names them

    @classmethod
    def from_metadata(cls, md: Mapping[str, object], where: str) -> "GgufVocab":
        model = md.get("tokenizer.ggml.model")
        if model not in SUPPORTED_MODELS:
            raise ModelError("gguf_unsupported_tokenizer", f"{where}: tokenizer.ggml.model is {model!r}; "
                                                           f"supported: {', '.join(SUPPORTED_MODELS)}")
        tokens = md.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
            raise ModelError("gguf_missing_key", f"{where}: tokenizer.ggml.tokens is missing or not a "
                                                 f"list of strings; a tokenizer needs its vocabulary")
        n = len(tokens)

        def per_token(key: str) -> list | None:
            value = md.get(key)
            if value is None:
                return None
            if len(value) != n:
                raise ModelError("gguf_bad_value", f"{where}: {key} has {len(value)} entries for {n} tokens")
            return np.asarray(value).tolist()

        def token_id(key: str) -> int | None:
            value = md.get(key)
            if value is not None and not (isinstance(value, int) and 0 <= value < n):
                raise ModelError("gguf_bad_value", f"{where}: {key} is {value!r}; ids run from 0 to {n - 1}")
            return value

        merges = md.get("tokenizer.ggml.merges")
        if model == "gpt2" and not isinstance(merges, list):
            raise ModelError("gguf_missing_key", f"{where}: a byte-level (gpt2) vocabulary needs "
                                                 f"tokenizer.ggml.merges, which is missing")
        extra_end = tuple(i for key in ("eot", "eom") if (i := token_id(f"tokenizer.ggml.{key}_token_id"))
                          is not None)
        return cls(
            where=where, architecture=str(md.get("general.architecture")), model=model,
            pre=md.get("tokenizer.ggml.pre"), tokens=tokens, scores=per_token("tokenizer.ggml.scores"),
            types=per_token("tokenizer.ggml.token_type"), merges=merges,
            special_ids={name: token_id(f"tokenizer.ggml.{key}_token_id") for name, key in
                         (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding"))},
            add_bos=bool(md.get("tokenizer.ggml.add_bos_token", model == "llama")),
            add_eos=bool(md.get("tokenizer.ggml.add_eos_token", False)),
            add_space_prefix=bool(md.get("tokenizer.ggml.add_space_prefix", True)),
            chat_template=md.get("tokenizer.chat_template"),
            end_of_generation_ids=extra_end,
        )

    def token(self, name: str) -> str | None:
        i = self.special_ids[name]
        return None if i is None else self.tokens[i]


def convert_tokenizer(metadata: Mapping[str, object], where: str) -> ConvertedTokenizer:
    """tokenizer.json text, tokenizer config and generation config for a GGUF file's metadata."""
    vocab = GgufVocab.from_metadata(metadata, where)
    try:
        tokenizer = sentencepiece_bpe(vocab) if vocab.model == "llama" else byte_level_bpe(vocab)
    except Exception as e:  # tokenizers reports bad vocabularies/merges as plain Exceptions
        if isinstance(e, ModelError):
            raise
        raise ModelError("gguf_bad_tokenizer", f"{where}: the {vocab.model} vocabulary in the file does "
                                               f"not form a valid BPE tokenizer: {e}") from None
    _add_post_processor(tokenizer, vocab)
    ids = vocab.special_ids
    config = {f"{name}_token": vocab.token(name) for name in ("bos", "eos", "unk", "pad")}
    config |= {f"{name}_token_id": ids[name] for name in ("bos", "eos", "unk", "pad")}
    config |= {"add_bos_token": vocab.add_bos, "add_eos_token": vocab.add_eos,
               "chat_template": vocab.chat_template}
    generation = {f"{name}_token_id": ids[name] for name in ("bos", "eos", "pad") if ids[name] is not None}
    ends = tuple(dict.fromkeys(([ids["eos"]] if ids["eos"] is not None else []) + list(vocab.end_of_generation_ids)))
    if len(ends) > 1:
        generation["eos_token_id"] = list(ends)
    return ConvertedTokenizer(tokenizer.to_str(), config, generation)


# ── SentencePiece BPE ("llama") ─────────────────────────────────────────────────────────────────

def respell_spaces(token: str) -> str:
    """A piece made only of spaces is stored with real spaces (Gemma); the model sees "▁" instead."""
    return SPACE * len(token) if token and not token.strip(" ") else token


def derive_merges(tokens: Sequence[str], rank: Sequence[float]) -> list[tuple[str, str]]:
    """All ways to build each token from two tokens, best-ranked merged token first.

    For one merged token, the split with the longer left piece comes first; ties between tokens of
    equal rank keep file order. This is the order transformers derives, so ids agree exactly.
    """
    vocab = {t: i for i, t in enumerate(tokens)}
    keys, pairs = [], []
    for i, token in enumerate(tokens):
        if vocab[token] != i:
            continue  # a duplicate spelling: the last one owns the id
        for cut in range(len(token) - 1, 0, -1):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                keys.append((-rank[i], -cut, cut - len(token), len(keys)))
                pairs.append((left, right))
    return [pairs[k[3]] for k in sorted(keys)]


def sentencepiece_bpe(v: GgufVocab) -> Tokenizer:
    tokens = [respell_spaces(t) for t in v.tokens]
    if v.architecture.startswith("gemma"):
        # Gemma's scores are placeholders (-1000) for its control and user-defined pieces; its file
        # order is its merge order (transformers uses the same rule).
        rank = [-float(i) for i in range(len(tokens))]
    elif v.scores is not None:
        rank = v.scores
    else:
        raise ModelError("gguf_missing_key", f"{v.where}: a SentencePiece vocabulary needs "
                                             f"tokenizer.ggml.scores to rank its merges, which is missing")
    vocab = {t: i for i, t in enumerate(tokens)}
    byte_fallback = all(f"<0x{b:02X}>" in vocab for b in range(256))
    unk = v.token("unk")
    model = BPE(vocab=vocab, merges=derive_merges(tokens, rank), unk_token=unk, fuse_unk=True,
                byte_fallback=byte_fallback)
    tok = Tokenizer(model)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if v.add_space_prefix:
        # like HF's Llama tokenizer: one "▁" before the text, not after each special token
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first", split=False)
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    else:
        tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.decoder = decoders.Sequence(steps)
    _add_tokens(tok, v, spelled_as=tokens, in_alphabet=lambda t: True)
    return tok


# ── byte-level BPE ("gpt2") ─────────────────────────────────────────────────────────────────────

def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> character table: printable Latin-1 bytes stand for themselves, the other 68
    bytes take the characters from U+0100 upward, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in table):
        table[b] = chr(0x100 + n)
    return table


def byte_level_bpe(v: GgufVocab) -> Tokenizer:
    if v.pre not in PRE_TOKENIZER_SPLITS:
        raise ModelError("gguf_unsupported_tokenizer", f"{v.where}: tokenizer.ggml.pre is {v.pre!r}; "
                                                       f"supported: {', '.join(PRE_TOKENIZER_SPLITS)}")
    table = byte_alphabet()
    alphabet = set(table.values())
    spelled = [t if set(t) <= alphabet else "".join(table[b] for b in t.encode("utf-8")) for t in v.tokens]
    merges = []
    for m in v.merges:
        parts = m.split(" ")
        if len(parts) != 2:
            raise ModelError("gguf_bad_value", f"{v.where}: merge {m!r} is not two tokens joined by a space")
        merges.append((parts[0], parts[1]))
    tok = Tokenizer(BPE(vocab={t: i for i, t in enumerate(spelled)}, merges=merges, fuse_unk=False))
    split = PRE_TOKENIZER_SPLITS[v.pre]
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    # a control token spelled outside the byte alphabet is a llama.cpp mislabel; adding it would
    # grow the vocabulary past the embedding, so it stays a plain (unreachable) vocabulary entry
    _add_tokens(tok, v, spelled_as=spelled, in_alphabet=lambda t: set(t) <= alphabet)
    return tok


# ── shared ──────────────────────────────────────────────────────────────────────────────────────

def _add_tokens(tok: Tokenizer, v: GgufVocab, spelled_as: list[str], in_alphabet) -> None:
    """CONTROL/UNKNOWN tokens (and the named bos/eos/unk/pad) as special, USER_DEFINED as plain."""
    types = v.types or [TokenType.NORMAL] * len(v.tokens)
    named = {i for i in v.special_ids.values() if i is not None}
    special, plain = [], []
    for i, (token, kind) in enumerate(zip(v.tokens, types)):
        if spelled_as[i] != token or not in_alphabet(token):
            continue  # respelled: the model reaches it through BPE, not as an added token
        if kind in (TokenType.CONTROL, TokenType.UNKNOWN) or i in named:
            special.append(AddedToken(token, special=True, normalized=False))
        elif kind == TokenType.USER_DEFINED:
            plain.append(AddedToken(token, special=False, normalized=False))
    tok.add_special_tokens(special)
    tok.add_tokens(plain)


def _add_post_processor(tok: Tokenizer, v: GgufVocab) -> None:
    """Add BOS/EOS the way llama.cpp does when asked to add special tokens."""
    bos = v.token("bos") if v.add_bos else None
    eos = v.token("eos") if v.add_eos else None
    if bos is None and eos is None:
        return
    single = " ".join(p for p in (bos and f"{bos}:0", "$A:0", eos and f"{eos}:0") if p)
    pair = single + " " + " ".join(p for p in (bos and f"{bos}:1", "$B:1", eos and f"{eos}:1") if p)
    specials = [(t, v.special_ids[n]) for t, n in ((bos, "bos"), (eos, "eos")) if t is not None]
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
