"""Gate C, contract (vocabulary half): the model, the graphs' logits and the tokenizer agree on the vocab.

    hyperparameters.vocab_size == logits [rows, V] of every head graph (and any graph that emits logits)
                               >= manifest tokenizer.vocab_size == ids in tokenizer.json
    BOS / EOS / PAD ids are tokens of tokenizer.json and inside the vocab

tokenizer.json is read as JSON (ids of model.vocab plus added_tokens), not through the tokenizers
library: the check needs the ids only, and a 262k-entry tokenizer loads several times faster this way.
"""

from __future__ import annotations

from calculet.calbin.gates.context import GateContext
from calculet.calbin.graphspec import HEAD, GraphSpec
from calculet.calbin.validate_report import Check, Rule

VOCAB = Rule("C.vocab", "vocab agrees: model, every graph's logits (and top-k), the manifest's tokenizer entry and tokenizer.json")
TOKENIZER = Rule("C.tokenizer", "tokenizer.json is readable and holds a vocabulary")
SPECIAL_TOKENS = Rule("C.special_tokens", "BOS, EOS and PAD ids are tokens of the tokenizer and inside the model vocab")
RULES = (VOCAB, TOKENIZER, SPECIAL_TOKENS)


def run(ctx: GateContext) -> list[Check]:
    m = ctx.manifest
    vocab_ids, problem = tokenizer_ids(ctx)
    return [
        VOCAB.check(_vocab_problems(ctx, vocab_ids), f"vocab {m.spec.vocab_size}",
                    {"model": m.spec.vocab_size, "tokenizer_manifest": m.tokenizer.vocab_size,
                     "tokenizer_json": max(vocab_ids) + 1 if vocab_ids else None}),
        TOKENIZER.check([problem] if problem else [], "tokenizer.json readable"),
        SPECIAL_TOKENS.check(_special_problems(ctx, vocab_ids), "special token ids in range",
                             {"bos": m.tokenizer.bos_token_id, "eos": list(m.tokenizer.eos_token_ids), "pad": m.tokenizer.pad_token_id}),
    ]


def tokenizer_ids(ctx: GateContext) -> tuple[set[int] | None, str | None]:
    """The token ids tokenizer.json defines, or None and why it could not tell."""
    tok = ctx.tokenizer_json()
    if isinstance(tok, str):
        return None, tok
    model = tok.get("model") if isinstance(tok.get("model"), dict) else {}
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        ids = {v for v in vocab.values() if isinstance(v, int)}
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...], ids are positions
        ids = set(range(len(vocab)))
    else:
        return None, "tokenizer.json has no model.vocab"
    added = tok.get("added_tokens") if isinstance(tok.get("added_tokens"), list) else []
    ids |= {a["id"] for a in added if isinstance(a, dict) and isinstance(a.get("id"), int)}
    return ids, None


def _shape(g: GraphSpec, name: str) -> list | None:
    t = g.output(name)
    return None if t is None else list(t.shape)


def _vocab_problems(ctx: GateContext, vocab_ids: set[int] | None) -> list[str]:
    vocab = ctx.manifest.spec.vocab_size
    declared = ctx.manifest.tokenizer.vocab_size
    problems = []
    for g in ctx.manifest.graphs:
        name, logits = g.name, _shape(g, "logits")
        if logits is None:
            if g.type == HEAD:
                problems.append(f"graph {name!r} ({g.type}) has no logits output")
            continue
        if logits[-1:] != [vocab]:
            problems.append(f"graph {name!r}: logits {logits} cover {logits[-1] if logits else None} ids, the model vocab is {vocab}")
        for topk in ("topk_values", "topk_ids"):
            shape = _shape(g, topk)
            if shape is not None and not (len(shape) == 2 and 1 <= shape[1] <= vocab):
                problems.append(f"graph {name!r}: {topk} {shape} must be [rows, K] with K in 1..{vocab}")
        scale = _shape(g, "logits_scale")   # a head's per-row factor for its unscaled logits
        if scale is not None and (g.type != HEAD or scale != [logits[0], 1]):
            problems.append(f"graph {name!r}: logits_scale {scale} must be a head's [rows, 1] = [{logits[0]}, 1]")
    if declared > vocab:
        problems.append(f"the manifest's tokenizer has {declared} tokens, more than the model's vocab_size {vocab}")
    if vocab_ids is not None:
        count = max(vocab_ids) + 1 if vocab_ids else 0
        if count != declared:
            problems.append(f"tokenizer.json holds {count} token ids, the manifest's tokenizer.vocab_size says {declared}")
        if count > vocab:
            problems.append(f"tokenizer.json holds ids up to {count - 1}, outside the model vocab 0..{vocab - 1}")
    return problems


def _special_problems(ctx: GateContext, vocab_ids: set[int] | None) -> list[str]:
    tok, vocab = ctx.manifest.tokenizer, ctx.manifest.spec.vocab_size
    limit = min(vocab, tok.vocab_size)
    problems = []
    named = [("bos", tok.bos_token_id), ("pad", tok.pad_token_id)] + [("eos", e) for e in tok.eos_token_ids]
    for name, value in named:
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < limit:
            problems.append(f"{name} token id {value!r} is outside the vocabulary 0..{limit - 1}")
        elif vocab_ids is not None and value not in vocab_ids:
            problems.append(f"{name} token id {value} is not a token of tokenizer.json")
    if tok.bos_token_id is None and tok.add_bos_token:
        problems.append("add_bos_token is true but there is no bos_token_id")
    return problems
