"""The runtime side of a golden check: free-running greedy and teacher-forced runs on one lane."""

from __future__ import annotations

import numpy as np

from calculet.engine.generate import prefill
from calculet.runtime.device import JOB_TIMEOUT_S
from calculet.runtime.jobs import DecodeJob


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
                logits = device.run(DecodeJob((lane,), (token,)), JOB_TIMEOUT_S).logits[0]
                out.append(int(np.argmax(logits)))
        finally:
            device.lanes.free(lane)
        return first, out

    def run_fn(input_ids, n_tokens):
        return walk(input_ids, n_tokens, None)

    def forced_fn(input_ids, reference_tokens):
        return walk(input_ids, len(reference_tokens), reference_tokens)[1]

    return run_fn, forced_fn


def check_calbin(path, golden, thresholds=None):
    """Open the calbin at `path` on a CPU device and check it against `golden`, free-running and
    teacher-forced (`reference.golden.check_against_golden`); the device is closed afterwards."""
    from calculet.reference.golden import check_against_golden
    from calculet.runtime.device import Device

    device = Device()
    try:
        device.configure(device.load(path))
        run_fn, forced_fn = golden_fns(device)
        return check_against_golden(golden, run_fn, thresholds, forced_fn=forced_fn)
    finally:
        device.close()
