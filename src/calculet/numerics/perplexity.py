"""`calculet eval perplexity`: sliding-window perplexity of a calbin and of the transformers reference.

Windows of `window` tokens start every `stride` tokens; each token is scored once, in the first
window that ends after it, so it sees at least window - stride tokens of context (except near the
start of the text):

    text   t0 t1 t2 ............................................. tN
    win 0  [t0 ............. t(W-1)]            scores t1 .. t(W-1)
    win 1       [tS ............. t(S+W-1)]     scores t(W) .. t(S+W-1), context from tS
    ...

How the calbin is scored, and what it costs: prefill graphs return only the last token's hidden
state, so per-position logits come from decode steps — one step per scored token, each returning
one full logits row. Each window's unscored overlap (window - stride tokens) runs through the
prefill chunks first. Cost: N decode steps + about N (window - stride) / stride prefill tokens for an
N-token text (the default model: ~10-20 ms per step on a laptop-class CPU, so 4,096 tokens take one
to two minutes). A debug graph with per-position logits would be faster but would score a graph
the server never runs; decode steps score exactly what `logprobs` returns. With a coarse head
(`coarse-head` pass), values outside the head's candidates are the coarse int4/int8 estimates, as
in the rows the server hands out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from calculet.errors import RequestError

DEFAULT_MAX_TOKENS = 4096


@dataclass(frozen=True)
class Window:
    begin: int        # first token of the window's context
    score_from: int   # first token scored in this window (> begin)
    end: int          # one past the last token scored


def plan_windows(n_tokens: int, window: int, stride: int) -> list[Window]:
    if n_tokens < 2:
        raise RequestError("bad_option", f"perplexity needs a text of at least 2 tokens, got {n_tokens}")
    if window < 2:
        raise RequestError("bad_option", f"--window must be >= 2, got {window}")
    if not 1 <= stride <= window - 1:
        raise RequestError("bad_option", f"--stride must be in 1..window - 1 ({window - 1}), got {stride}")
    out, prev_end = [], 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + window, n_tokens)
        score_from = max(prev_end, begin + 1)
        if score_from < end:
            out.append(Window(begin, score_from, end))
        prev_end = end
        if end == n_tokens:
            break
    return out


def plan_windows_last_stride(n_tokens: int, window: int, stride: int) -> list[Window]:
    """llama.cpp's strided protocol (`llama-perplexity --ppl-stride S -c W`): whole windows of `window`
    tokens starting every `stride` tokens, each scoring only its last `stride` tokens, so every scored
    token sees at least window - stride tokens of context and the text's first window - stride tokens
    are never scored. Scoring the same ids both ways makes the two tools' perplexities comparable."""
    if window < 2:
        raise RequestError("bad_option", f"--window must be >= 2, got {window}")
    if not 1 <= stride <= window - 1:
        raise RequestError("bad_option", f"--stride must be in 1..window - 1 ({window - 1}), got {stride}")
    if n_tokens < 2 * window:
        raise RequestError("bad_option", f"--windows last-stride needs a text of at least 2 x window = {2 * window} "
                                         f"tokens (as llama-perplexity does), got {n_tokens}")
    count = (n_tokens - window + stride - 1) // stride
    return [Window(i * stride, i * stride + window - stride, i * stride + window) for i in range(count)]


WINDOW_PROTOCOLS = {"every-token": plan_windows, "last-stride": plan_windows_last_stride}


@dataclass(frozen=True)
class Perplexity:
    model: str                 # what was scored
    tokens_scored: int
    nll_sum: float             # natural log, summed over scored tokens
    window: int
    stride: int

    @property
    def nll(self) -> float:
        return self.nll_sum / self.tokens_scored

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll)

    def to_dict(self) -> dict:
        return {"model": self.model, "perplexity": self.perplexity, "nll_per_token": self.nll,
                "bits_per_token": self.nll / math.log(2), "tokens_scored": self.tokens_scored,
                "window": self.window, "stride": self.stride}


def _log_softmax_at(row: np.ndarray, token: int) -> float:
    row = np.asarray(row, np.float64)
    top = float(row.max())
    return float(row[token] - top - math.log(float(np.exp(row - top).sum())))


def calbin_logprobs(device, ids: list[int], windows: list[Window], progress=None) -> np.ndarray:
    """log p(ids[p] | window context) for every scored position, in order, from `device`."""
    from calculet.numerics.walk import TIMEOUT_S, prefill_row
    from calculet.runtime.jobs import DecodeJob

    context = device.lanes.context
    longest = max(w.end - 1 - w.begin for w in windows)
    if longest > context:
        raise RequestError("bad_option", f"a window feeds {longest} tokens but the calbin's context is {context}; "
                           f"use --window <= {context + 1}")
    out = []
    lane = device.lanes.allocate()
    try:
        for w in windows:
            device.lanes.clear(lane)
            row = prefill_row(device, lane, ids[w.begin:w.score_from])
            for p in range(w.score_from, w.end):
                out.append(_log_softmax_at(row, ids[p]))
                if p + 1 < w.end:
                    row = device.run(DecodeJob((lane,), (ids[p],)), TIMEOUT_S).logits[0]
            if progress is not None:
                progress.update(w.end - w.score_from)
    finally:
        device.lanes.free(lane)
    return np.asarray(out, np.float64)


def reference_logprobs(model, ids: list[int], windows: list[Window], progress=None) -> np.ndarray:
    """The same positions from the transformers model: one forward pass per window."""
    from calculet.reference.hf import reference_position_logprobs

    out = []
    for w in windows:
        lps = reference_position_logprobs(model, ids[w.begin:w.end])   # positions begin+1 .. end-1
        out.append(lps[w.score_from - w.begin - 1:])
        if progress is not None:
            progress.update(w.end - w.score_from)
    return np.concatenate(out)


def result(model: str, logprobs: np.ndarray, window: int, stride: int) -> Perplexity:
    return Perplexity(model, int(logprobs.size), float(-logprobs.sum()), window, stride)


def text_ids(tokenizer_json: str, text: str, bos_id: int | None, max_tokens: int) -> list[int]:
    """The text's ids (BOS first when the model adds one), cut to `max_tokens` (0: all)."""
    from tokenizers import Tokenizer

    if max_tokens < 0:
        raise RequestError("bad_option", f"--max-tokens must be >= 0 (0: the whole text), got {max_tokens}")
    tok = Tokenizer.from_str(tokenizer_json)
    if max_tokens:  # a token holds at least one character: no need to encode the rest of a long text
        text = text[: 16 * max_tokens]
    ids = ([bos_id] if bos_id is not None else []) + tok.encode(text, add_special_tokens=False).ids
    return ids[:max_tokens] if max_tokens else ids
