"""The sampler takes the on-graph sampling head's candidates exactly when they give the same answer."""

import numpy as np

from calculet.engine.sampler import SamplerConfig, SequenceSampler


def _row(seed=0, vocab=1000, k=64):
    logits = np.random.default_rng(seed).standard_normal(vocab).astype(np.float32) * 3
    ids = np.argsort(-logits, kind="stable")[:k]
    return logits, (ids, logits[ids])


def test_greedy_and_top_k_use_candidates_with_identical_results():
    logits, cand = _row()
    assert SequenceSampler(SamplerConfig(temperature=0.0)).sample(logits, cand) == int(np.argmax(logits))
    p = SamplerConfig(temperature=0.8, top_k=20, seed=3)
    full = [SequenceSampler(p).sample(logits) for _ in range(1)]
    head = [SequenceSampler(p).sample(logits, cand) for _ in range(1)]
    assert full == head
    many_full, many_head = SequenceSampler(p), SequenceSampler(p)
    assert [many_full.sample(logits) for _ in range(50)] == [many_head.sample(logits, cand) for _ in range(50)]


def test_full_row_needed_for_penalties_full_vocab_or_large_k():
    assert not SequenceSampler(SamplerConfig(temperature=0.0, repetition_penalty=1.2)).uses_candidates(64)
    assert not SequenceSampler(SamplerConfig(temperature=1.0, top_k=0)).uses_candidates(64)
    assert not SequenceSampler(SamplerConfig(temperature=1.0, top_k=65)).uses_candidates(64)
    assert SequenceSampler(SamplerConfig(temperature=1.0, top_k=64)).uses_candidates(64)
