"""The runtime side of a golden check: free-running greedy and teacher-forced runs on one lane."""

from __future__ import annotations

import numpy as np

from calculet.engine.generate import prefill
from calculet.runtime.jobs import DecodeJob

TIMEOUT_S = 600.0


def golden_fns(device):
    """(run_fn, forced_fn) for `check_against_golden`, both on a fresh lane of `device`."""

    def walk(input_ids: list[int], n_tokens: int, feed: list[int] | None):
        lane = device.lanes.allocate()
        try:
            logits = prefill(device, lane, list(input_ids))
            first = logits.copy()
            out = [int(np.argmax(logits))]
            for i in range(n_tokens - 1):
                token = feed[i] if feed is not None else out[-1]
                logits = device.run(DecodeJob((lane,), (token,)), TIMEOUT_S).logits[0]
                out.append(int(np.argmax(logits)))
        finally:
            device.lanes.free(lane)
        return first, out

    def run_fn(input_ids, n_tokens):
        return walk(input_ids, n_tokens, None)

    def forced_fn(input_ids, reference_tokens):
        return walk(input_ids, len(reference_tokens), reference_tokens)[1]

    return run_fn, forced_fn
