"""Reference sets: many prompts with the reference model's greedy tokens and top-k logits per step.

    plan_prompts (token ids of exact lengths, cut from texts.PASSAGES and the pydoc text)
        └─▶ make_reference_set (transformers, fp32) ─▶ write_reference_set (.npz) ─▶ read_reference_set

One file holds the whole set (numpy's npz, compressed, no pickles):

    meta            uint8 [*]        JSON: schema, source identity, tokens, topk, prompt names/groups, skipped
    input_ids       int32 [sum n]    every prompt's ids, concatenated
    offsets         int64 [P + 1]    prompt p is input_ids[offsets[p]:offsets[p + 1]]
    greedy          int32 [P, T]     the reference's greedy tokens (EOS is an ordinary token)
    topk_ids        int32 [P, T, k]  largest first, at every step, teacher-forced along `greedy`
    topk_logits     float32 [P, T, k]
    logsumexp       float32 [P, T]   of each full logits row: log-softmax(id) = logit - logsumexp

Logits stay float32: float16 would round a logit of 20 to steps of 0.016, coarser than the fp32
parity bound (1e-3) the set is meant to check. 100 prompts x 32 steps x top-10 is about 300 KB.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from calculet.errors import ModelError, RequestError
from calculet.reference import texts

SET_SCHEMA = "calculet.refset/1"
# Around a 16-token prefill chunk, and around 256 (a common large chunk and window size).
BOUNDARY_LENGTHS = (1, 2, 15, 16, 17, 255, 256, 257)
# Filler lengths that spread the rest of the set over short and medium prompts.
FILL_LENGTHS = (3, 5, 8, 31, 32, 33, 48, 64, 100, 127, 128, 129, 200)
LONG_LENGTHS = (4095, 4096, 4097)
DEFAULT_PROMPTS = 100
DEFAULT_TOKENS = 32
DEFAULT_TOPK = 10


@dataclass(frozen=True)
class PlannedPrompt:
    name: str            # "<group>.len<n>"
    group: str           # the passage it starts with (texts.PASSAGES name)
    input_ids: tuple[int, ...]


@dataclass(frozen=True)
class RefPrompt:
    name: str
    group: str
    input_ids: np.ndarray     # int32 [n]
    greedy: np.ndarray        # int32 [T]
    topk_ids: np.ndarray      # int32 [T, k]
    topk_logits: np.ndarray   # float32 [T, k]
    logsumexp: np.ndarray     # float32 [T]

    def __post_init__(self) -> None:
        t, k = self.topk_ids.shape
        if self.input_ids.ndim != 1 or self.input_ids.size == 0:
            raise ValueError(f"reference prompt {self.name!r}: input_ids must be a non-empty 1-D array")
        if self.greedy.shape != (t,) or self.topk_logits.shape != (t, k) or self.logsumexp.shape != (t,):
            raise ValueError(f"reference prompt {self.name!r}: greedy {self.greedy.shape}, topk_logits "
                             f"{self.topk_logits.shape} and logsumexp {self.logsumexp.shape} disagree with topk_ids {(t, k)}")

    def ref_logprobs(self) -> np.ndarray:
        """float32 [T, k]: the reference's log-softmax of its top-k ids at every step."""
        return self.topk_logits - self.logsumexp[:, None]


@dataclass(frozen=True)
class ReferenceSet:
    source: dict                     # kind, path, model_type, vocab_size, source_sha256, producer versions
    tokens: int                      # T: greedy steps per prompt
    topk: int                        # k
    prompts: tuple[RefPrompt, ...]
    skipped: tuple[dict, ...] = field(default_factory=tuple)  # {"length": n, "reason": ...}

    def __post_init__(self) -> None:
        for p in self.prompts:
            if p.topk_ids.shape != (self.tokens, self.topk):
                raise ValueError(f"reference prompt {p.name!r} has top-k shape {p.topk_ids.shape}; "
                                 f"the set says tokens={self.tokens}, topk={self.topk}")


# ------------------------------------------------------------------------------------------ prompts


def _tokenizer(tokenizer_json: str):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(tokenizer_json)
    except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
        raise ModelError("refset_tokenizer", f"cannot load tokenizer.json: {exc}") from None


class _TextIds:
    """Token ids of each passage followed by the others and then the pydoc text, encoded once per
    passage and extended only when a prompt asks for more tokens than that text holds."""

    def __init__(self, tokenizer, vocab_size: int):
        self.tokenizer, self.vocab = tokenizer, vocab_size
        self._cache: dict[int, list[int]] = {}

    def ids(self, passage: int, n: int) -> list[int]:
        have = self._cache.get(passage)
        if have is None or len(have) < n:
            rotated = texts.PASSAGES[passage:] + texts.PASSAGES[:passage]
            text = "\n\n".join(body for _, body in rotated)
            have = self._encode(text)
            if len(have) < n:  # long prompts continue into the pydoc text (a token is > 1 character)
                have = self._encode(text + "\n\n" + texts.english_docs_text()[: 8 * n])
            self._cache[passage] = have
        if len(have) < n:
            raise ModelError("refset_text", f"the reference texts give only {len(have)} tokens; a prompt needs {n}")
        return have[:n]

    def _encode(self, text: str) -> list[int]:
        return [t for t in self.tokenizer.encode(text, add_special_tokens=False).ids if t < self.vocab]


def plan_lengths(long: bool = False, context: int | None = None, tokens: int = DEFAULT_TOKENS) -> tuple[int, ...]:
    """Boundary lengths first, then fillers; `long` adds 4095-4097, `context` the two longest
    prompts that still leave room for `tokens` steps (prompt + tokens - 1 fed tokens <= context)."""
    lengths = list(BOUNDARY_LENGTHS)
    if long:
        lengths += LONG_LENGTHS
    if context is not None:
        top = context - tokens + 1
        if top < 1:
            raise RequestError("bad_option", f"--context {context} leaves no room for {tokens} tokens (needs > {tokens - 1})")
        lengths += [n for n in (top - 1, top) if n >= 1]
    lengths += FILL_LENGTHS
    return tuple(dict.fromkeys(lengths))


def plan_prompts(tokenizer_json: str, bos_id: int | None, vocab_size: int, n_prompts: int,
                 lengths: tuple[int, ...], max_length: int | None = None) -> tuple[list[PlannedPrompt], list[dict]]:
    """`n_prompts` distinct prompts, lengths taken round-robin so a small set still covers the
    boundary lengths; passage p starts the prompts of round r at length index j with p = (r + j) mod P.

    Lengths above `max_length` are skipped (listed with the reason). Identical id sequences (every
    1-token prompt with a BOS is just the BOS) are kept once."""
    if n_prompts < 1:
        raise RequestError("bad_option", f"--prompts must be >= 1, got {n_prompts}")
    if not lengths or min(lengths) < 1:
        raise RequestError("bad_option", f"prompt lengths must be >= 1, got {list(lengths)}")
    skipped = [{"length": n, "reason": f"longer than {max_length} (context - tokens + 1)"}
               for n in lengths if max_length is not None and n > max_length]
    usable = [n for n in lengths if max_length is None or n <= max_length]
    if not usable:
        raise RequestError("bad_option", f"no prompt length fits: lengths {list(lengths)}, longest allowed {max_length}")
    text = _TextIds(_tokenizer(tokenizer_json), vocab_size)
    prefix = [bos_id] if bos_id is not None else []
    names = texts.passage_names()
    planned, seen = [], set()
    for r in range(len(names)):
        for j, n in enumerate(usable):
            p = (r + j) % len(names)
            ids = tuple(prefix + text.ids(p, n - len(prefix))) if n > len(prefix) else tuple(prefix[:n])
            if ids in seen:
                continue
            seen.add(ids)
            planned.append(PlannedPrompt(f"{names[p]}.len{n}", names[p], ids))
            if len(planned) == n_prompts:
                return planned, skipped
    raise RequestError("bad_option", f"only {len(planned)} distinct prompts can be made from these lengths "
                       f"({list(usable)}); ask for --prompts <= {len(planned)}")


# ------------------------------------------------------------------------------------------- making


def make_reference_set(source, n_prompts: int = DEFAULT_PROMPTS, tokens: int = DEFAULT_TOKENS, topk: int = DEFAULT_TOPK,
                       long: bool = False, context: int | None = None, lengths: tuple[int, ...] | None = None,
                       progress=None) -> ReferenceSet:
    """Run the transformers reference (fp32) over the planned prompts of `source` (a SourceModel)."""
    from calculet.reference import hf
    from calculet.reference.prompts import bos_id_for

    if tokens < 1:
        raise RequestError("bad_option", f"--tokens must be >= 1, got {tokens}")
    config = source.config.get("text_config", source.config)
    vocab = config.get("vocab_size")
    if not isinstance(vocab, int):
        raise ModelError("refset_config", f"{source.path}: config has no integer vocab_size")
    if not 1 <= topk <= vocab:
        raise RequestError("bad_option", f"--topk must be in 1..{vocab} (the vocabulary size), got {topk}")
    lengths = lengths or plan_lengths(long, context, tokens)
    max_length = context - tokens + 1 if context is not None else None
    planned, skipped = plan_prompts(source.tokenizer_json, bos_id_for(source), vocab, n_prompts, lengths, max_length)
    model = hf.build_reference_model(source)
    prompts = []
    for p in planned:
        greedy, ids, values, lse = hf.reference_greedy_steps(model, list(p.input_ids), tokens, topk)
        prompts.append(RefPrompt(p.name, p.group, np.asarray(p.input_ids, np.int32), np.asarray(greedy, np.int32),
                                 ids, values, lse))
        if progress is not None:
            progress.update(1)
    origin = {"kind": source.kind, "path": str(source.path), "model_type": str(model.config.model_type),
              "vocab_size": int(vocab), "source_sha256": source.source_sha256, "producer": hf.producer_versions()}
    return ReferenceSet(origin, tokens, topk, tuple(prompts), tuple(skipped))


# ---------------------------------------------------------------------------------------------- I/O


def check_output_path(path: str | Path) -> Path:
    path = Path(path)
    if path.suffix != ".npz":
        raise RequestError("bad_option", f"{path}: a reference set is an .npz file; name it e.g. reference.npz")
    return path


def write_reference_set(refset: ReferenceSet, path: str | Path) -> Path:
    path = check_output_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"schema": SET_SCHEMA, "source": refset.source, "tokens": refset.tokens, "topk": refset.topk,
            "names": [p.name for p in refset.prompts], "groups": [p.group for p in refset.prompts],
            "skipped": list(refset.skipped)}
    lengths = [p.input_ids.size for p in refset.prompts]
    np.savez_compressed(
        path,
        meta=np.frombuffer(json.dumps(meta, ensure_ascii=False).encode(), np.uint8),
        input_ids=np.concatenate([p.input_ids for p in refset.prompts]).astype(np.int32),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        greedy=np.stack([p.greedy for p in refset.prompts]).astype(np.int32),
        topk_ids=np.stack([p.topk_ids for p in refset.prompts]).astype(np.int32),
        topk_logits=np.stack([p.topk_logits for p in refset.prompts]).astype(np.float32),
        logsumexp=np.stack([p.logsumexp for p in refset.prompts]).astype(np.float32),
    )
    return path


_ARRAYS = ("meta", "input_ids", "offsets", "greedy", "topk_ids", "topk_logits", "logsumexp")


def read_reference_set(path: str | Path) -> ReferenceSet:
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in _ARRAYS if k not in f.files]
            if missing:
                raise ModelError("refset_schema", f"{path}: not a reference set (missing arrays {missing}); "
                                 "make one with `calculet reference make SOURCE -o FILE.npz`")
            a = {k: f[k] for k in _ARRAYS}
    except FileNotFoundError:
        raise ModelError("refset_missing", f"{path}: no such reference set; make one with `calculet reference make`") from None
    except (ValueError, OSError) as exc:
        raise ModelError("refset_bad_file", f"{path}: not a readable .npz reference set ({exc})") from None
    try:
        meta = json.loads(a["meta"].tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError("refset_schema", f"{path}: metadata is not JSON ({exc})") from None
    if meta.get("schema") != SET_SCHEMA:
        raise ModelError("refset_schema", f"{path}: schema is {meta.get('schema')!r}, this reader understands {SET_SCHEMA!r}")
    offsets = a["offsets"]
    n = len(meta["names"])
    if offsets.shape != (n + 1,) or a["greedy"].shape[0] != n or offsets[-1] != a["input_ids"].size:
        raise ModelError("refset_schema", f"{path}: {n} prompt names but offsets {offsets.shape}, greedy {a['greedy'].shape}")
    try:
        prompts = tuple(
            RefPrompt(meta["names"][i], meta["groups"][i], a["input_ids"][offsets[i]:offsets[i + 1]], a["greedy"][i],
                      a["topk_ids"][i], a["topk_logits"][i], a["logsumexp"][i])
            for i in range(n))
        return ReferenceSet(meta["source"], int(meta["tokens"]), int(meta["topk"]), prompts, tuple(meta.get("skipped", [])))
    except (KeyError, ValueError, IndexError) as exc:
        raise ModelError("refset_schema", f"{path}: malformed reference set ({exc})") from None
