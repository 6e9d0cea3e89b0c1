"""The fixed golden prompt set: token-id prompts of exact lengths, cut from natural text.

Lengths 1, 2, 15, 16, 17 sit around a 16-token prefill chunk; one more prompt is longer than the
sliding window (window + 5, or 40 without a window) so windowed attention is exercised. Every prompt
must leave room for the golden continuation: length <= context - n_tokens - 1. Prompts that do not
fit are kept in the list with `skipped` saying why, so the golden file can record the gap.
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.errors import ModelError
from calculet.sources.base import SourceModel

CHUNK_LENGTHS = (1, 2, 15, 16, 17)
NO_WINDOW_LONG_LENGTH = 40

# Fixed text: prose, a list, code and a little non-English, so byte-level and sentencepiece
# tokenizers both see ordinary words, digits, punctuation, indentation and multi-byte characters.
_PASSAGES = (
    "The old lighthouse keeper climbed the stairs every evening at dusk, counting the steps as his "
    "father had taught him. There were one hundred and twelve of them, and the lamp at the top still "
    "burned oil.",
    "To make bread, mix 500 g of flour, 350 ml of warm water, 10 g of salt and 7 g of yeast. Knead for "
    "ten minutes, let it rise for two hours, then bake at 230 degrees for about 35 minutes.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    "print([fibonacci(i) for i in range(10)])",
    "Photosynthesis converts light energy into chemical energy. Plants take in carbon dioxide and water "
    "and, using sunlight, produce glucose and release oxygen into the atmosphere.",
    "Le petit prince regardait le coucher du soleil. Die Stadt liegt am Ufer des Flusses. "
    "El tren sale a las nueve de la mañana. 東京は日本の首都です。",
    "Question: What is the capital of Australia?\nAnswer: Canberra. It was chosen as a compromise "
    "between Sydney and Melbourne, the two largest cities, and became the capital in 1913.",
)


@dataclass(frozen=True)
class GoldenPrompt:
    name: str
    input_ids: list[int]  # exact token ids, BOS first when the model uses one; empty when skipped
    skipped: str = ""     # why this prompt is not in the golden set ("" when it is)

    def __post_init__(self) -> None:
        if bool(self.input_ids) == bool(self.skipped):
            raise ValueError(f"golden prompt {self.name!r}: give either input_ids or a skipped reason, not both or neither")


def _tokenizer(tokenizer_json: str):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(tokenizer_json)
    except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
        raise ModelError("golden_tokenizer", f"cannot load tokenizer.json for golden prompts: {exc}") from None


def _text_ids(tokenizer, first_passage: int, n: int, vocab_size: int) -> list[int]:
    """`n` ids of natural text, starting at passage `first_passage` (so prompts are not prefixes of each other)."""
    rotated = _PASSAGES[first_passage:] + _PASSAGES[:first_passage]
    text = "\n\n".join(rotated)
    ids = [t for t in tokenizer.encode(text, add_special_tokens=False).ids if t < vocab_size]
    if not ids:
        raise ModelError("golden_tokenizer", f"the tokenizer turns the golden text into no ids below vocab_size {vocab_size}")
    if len(ids) < n:  # longer prompts repeat the text; re-encode so the joins tokenize naturally
        repeats = n // len(ids) + 2
        ids = [t for t in tokenizer.encode("\n\n".join([text] * repeats), add_special_tokens=False).ids if t < vocab_size]
    return ids[:n]


def golden_prompt_ids(
    tokenizer_json: str,
    bos_id: int | None,
    vocab_size: int,
    sliding_window: int | None,
    context: int,
    n_tokens: int = 32,
) -> list[GoldenPrompt]:
    """The golden prompts for one model; those longer than `context - n_tokens - 1` are skipped."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if bos_id is not None and not 0 <= bos_id < vocab_size:
        raise ValueError(f"bos_id {bos_id} is outside the vocabulary [0, {vocab_size})")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 or None, got {sliding_window}")
    tokenizer = _tokenizer(tokenizer_json)
    budget = context - n_tokens - 1
    long_len = sliding_window + 5 if sliding_window else NO_WINDOW_LONG_LENGTH
    plan = [(f"len{n}", n) for n in CHUNK_LENGTHS] + [("beyond_window", long_len)]
    prompts = []
    for index, (name, length) in enumerate(plan):
        if length > budget:
            reason = f"length {length} > context {context} - {n_tokens} generated - 1 = {budget}"
            prompts.append(GoldenPrompt(name, [], skipped=reason))
            continue
        prefix = [bos_id] if bos_id is not None else []
        ids = prefix + _text_ids(tokenizer, index % len(_PASSAGES), length - len(prefix), vocab_size)
        assert len(ids) == length, (name, len(ids), length)
        prompts.append(GoldenPrompt(name, ids))
    return prompts


def bos_id_for(source: SourceModel) -> int | None:
    """The BOS id the model expects before a prompt, or None.

    `tokenizer_config.add_bos_token` decides when present; otherwise a tokenizer.json whose
    post-processor prepends a token (Gemma, Llama 3) says so itself.
    """
    tokenizer = _tokenizer(source.tokenizer_json)
    add = source.tokenizer_config.get("add_bos_token")
    if add is False:
        return None
    bos = source.tokenizer_config.get("bos_token")
    if isinstance(bos, dict):  # older configs store AddedToken dicts
        bos = bos.get("content")
    bos_id = tokenizer.token_to_id(bos) if isinstance(bos, str) else None
    if add and bos_id is not None:
        return bos_id
    with_special = tokenizer.encode("a", add_special_tokens=True).ids
    plain = tokenizer.encode("a", add_special_tokens=False).ids
    if len(with_special) > len(plain) and with_special[len(with_special) - len(plain):] == plain:
        return with_special[0]
    return None


def sliding_window_of(config: dict) -> int | None:
    """The attention window when any layer uses one (Qwen2 carries a window it does not use)."""
    config = config.get("text_config", config)
    window = config.get("sliding_window")
    if not window or config.get("use_sliding_window") is False:
        return None
    layer_types = config.get("layer_types")
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return int(window)


def prompts_for_source(source: SourceModel, context: int, n_tokens: int = 32) -> list[GoldenPrompt]:
    """`golden_prompt_ids` with BOS, vocabulary and window read from the source."""
    vocab = source.config.get("text_config", source.config).get("vocab_size")
    if not isinstance(vocab, int):
        raise ModelError("golden_config", f"{source.path}: config has no integer vocab_size")
    return golden_prompt_ids(source.tokenizer_json, bos_id_for(source), vocab, sliding_window_of(source.config), context, n_tokens)
