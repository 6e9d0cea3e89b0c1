"""Host-side sampling: penalties, temperature, top-k / top-p / min-p, seeded per request.

Order: repetition penalty (prompt + output, multiplicative) -> presence/frequency penalties
(output only, additive, OpenAI semantics) -> greedy if temperature == 0, else temperature ->
top-k -> top-p -> min-p -> draw from the request's own generator.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from calculet.errors import RequestError


@dataclass(frozen=True)
class SamplerConfig:
    temperature: float = 1.0
    top_k: int = 0              # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self):
        def bad(field: str, value, allowed: str):
            raise RequestError("invalid_parameter", f"{field}={value!r} is out of range; allowed: {allowed}")
        if not 0.0 <= self.temperature <= 100.0:
            bad("temperature", self.temperature, "0 <= temperature <= 100")
        if self.top_k < 0:
            bad("top_k", self.top_k, "top_k >= 0 (0 disables it)")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", self.top_p, "0 < top_p <= 1")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", self.min_p, "0 <= min_p <= 1")
        if not -2.0 <= self.presence_penalty <= 2.0:
            bad("presence_penalty", self.presence_penalty, "-2 <= presence_penalty <= 2")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            bad("frequency_penalty", self.frequency_penalty, "-2 <= frequency_penalty <= 2")
        if not 0.0 < self.repetition_penalty <= 10.0:
            bad("repetition_penalty", self.repetition_penalty, "0 < repetition_penalty <= 10")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            bad("seed", self.seed, "0 <= seed <= 2^63-1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class SequenceSampler:
    """Sampling state of one sequence: its generator and the tokens it has seen."""

    def __init__(self, params: SamplerConfig, prompt_ids=()):
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self._prompt = set(int(t) for t in prompt_ids)
        self._output = Counter()

    def _penalized(self, logits: np.ndarray) -> np.ndarray:
        p = self.params
        if p.repetition_penalty == 1.0 and not p.presence_penalty and not p.frequency_penalty:
            return logits
        logits = logits.astype(np.float32, copy=True)
        if p.repetition_penalty != 1.0:
            seen = np.fromiter(self._prompt | set(self._output), dtype=np.int64)
            if seen.size:
                vals = logits[seen]
                logits[seen] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if self._output and (p.presence_penalty or p.frequency_penalty):
            ids = np.fromiter(self._output.keys(), dtype=np.int64)
            counts = np.fromiter(self._output.values(), dtype=np.float32)
            logits[ids] -= p.frequency_penalty * counts + p.presence_penalty
        return logits

    def uses_candidates(self, k: int) -> bool:
        """Whether K sorted candidates from the sampling head give exactly the full-vocabulary result:
        greedy, or top-k sampling with top_k <= K; penalties need the whole row."""
        p = self.params
        if p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty:
            return False
        return p.greedy or 0 < p.top_k <= k

    def sample(self, logits: np.ndarray, candidates: tuple[np.ndarray, np.ndarray] | None = None) -> int:
        """logits: float32 [vocab] -> the next token id. `candidates` = (ids, values) of the row's
        top K, best first (the on-graph sampling head), used when they are enough. The token is not
        remembered for the penalties until `record` is called with what the sequence keeps."""
        p = self.params
        if candidates is not None and self.uses_candidates(len(candidates[0])):
            ids, values = candidates
            token = int(ids[0]) if p.greedy else int(ids[self._draw(values[: p.top_k])])
        else:
            logits = self._penalized(logits)
            token = int(np.argmax(logits)) if p.greedy else self._draw(logits)
        return token

    def record(self, token: int) -> None:
        """The sequence continues with `token` (the sampled one, or a forced one): count it for the
        presence, frequency and repetition penalties."""
        self._output[token] += 1

    def _draw(self, logits: np.ndarray) -> int:
        p = self.params
        x = logits.astype(np.float64)
        with np.errstate(over="ignore"):      # shift first: a tiny temperature then gives -inf, never inf - inf
            scaled = (x - x.max()) / p.temperature
        if p.top_k and p.top_k < scaled.size:
            candidates = np.argpartition(-scaled, p.top_k - 1)[: p.top_k]
        else:
            candidates = np.arange(scaled.size)
        vals = scaled[candidates]
        order = np.argsort(-vals, kind="stable")
        candidates, vals = candidates[order], vals[order]
        probs = np.exp(vals - vals[0])
        probs /= probs.sum()
        keep = probs.size
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
        if p.min_p > 0.0:
            keep = min(keep, int(np.count_nonzero(probs >= p.min_p * probs[0])))
        keep = max(keep, 1)
        probs = probs[:keep] / probs[:keep].sum()
        return int(candidates[self.rng.choice(keep, p=probs)])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max()
    return (x - m - np.log(np.exp(x - m).sum())).astype(np.float32)
