"""Log-probabilities of a sampled token and its top alternatives, from the model's raw logits
(before penalties, temperature or truncation), as OpenAI-compatible servers commonly report them."""

from __future__ import annotations

import numpy as np

from calculet.engine.requests import TokenLogprob
from calculet.engine.sampler import log_softmax


def token_logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """logits: float32 [vocab]; top: how many alternatives (0 = only the sampled token)."""
    lp = log_softmax(logits)
    alternatives: tuple[tuple[int, float], ...] = ()
    if top > 0:
        top = min(top, lp.size)
        ids = np.argpartition(-lp, top - 1)[:top]
        ids = ids[np.argsort(-lp[ids], kind="stable")]
        alternatives = tuple((int(i), float(lp[i])) for i in ids)
    return TokenLogprob(int(token), float(lp[token]), alternatives)
