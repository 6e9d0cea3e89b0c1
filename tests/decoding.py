"""Test helper: greedy decoding of several prompts together, one lane each, in one decode batch."""

from __future__ import annotations

import numpy as np

from calculet.engine.generate import prefill
from calculet.runtime.jobs import DecodeJob


def greedy_together(device, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    """`tokens` greedy tokens per prompt, all lanes advancing in the same decode jobs; lanes freed after."""
    lanes = [device.lanes.allocate() for _ in prompts]
    try:
        last = [int(np.argmax(prefill(device, lane, p))) for lane, p in zip(lanes, prompts)]
        together = [[t] for t in last]
        for _ in range(tokens - 1):
            logits = device.run(DecodeJob(tuple(lanes), tuple(last)), 30).logits
            last = [int(np.argmax(row)) for row in logits]
            for seq, t in zip(together, last):
                seq.append(t)
    finally:
        for lane in lanes:
            device.lanes.free(lane)
    return together
