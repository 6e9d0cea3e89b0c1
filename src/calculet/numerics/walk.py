"""Full logits rows from a runtime `Device`, one step at a time, for numerics checks.

    prompt ─▶ prefill chunks (last chunk returns the row after the prompt)
    feed[0] ─▶ decode step ─▶ row 1     feed[1] ─▶ decode ─▶ row 2   ...   (teacher forcing)

Several prompts may share the decode steps (one lane each) when their feeds have the same length;
`batch=1` (the default of the callers) gives exactly the numbers one request alone would get, which
matters for policies whose activation quantization depends on the rows in the batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from calculet.errors import RequestError
from calculet.runtime.chunking import plan_chunks
from calculet.runtime.jobs import DecodeJob, PrefillJob

TIMEOUT_S = 600.0


def prefill_row(device, lane: int, ids: Sequence[int], want_logits: bool = True) -> np.ndarray | None:
    """Append `ids` to `lane` in prefill chunks; the full logits row [V] after the last id (a copy)."""
    pieces = plan_chunks(len(ids), device.lanes.length(lane), device.program.chunk_sizes, device.lanes.context)
    pos, result = 0, None
    for i, n in enumerate(pieces):
        last = i == len(pieces) - 1
        result = device.run(PrefillJob(lane, tuple(ids[pos:pos + n]), want_logits=last and want_logits), TIMEOUT_S)
        pos += n
    return result.logits[0].copy() if want_logits else None


def check_fits(prompt_len: int, fed: int, context: int) -> str:
    """'' when a prompt of `prompt_len` plus `fed` teacher-forced tokens fits the context, else why not."""
    need = prompt_len + fed
    return "" if need <= context else f"prompt {prompt_len} + {fed} fed tokens = {need} > context {context}"


def forced_rows(device, prompts: Sequence[Sequence[int]], feeds: Sequence[Sequence[int]]) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (step, rows [len(prompts), V]) for step 0..len(feed): row 0 follows the prompt, row t+1
    follows feed[t]. All prompts run at once on their own lanes; every feed must have one length."""
    if len(prompts) != len(feeds) or not prompts:
        raise RequestError("bad_job", f"{len(prompts)} prompts but {len(feeds)} feeds")
    steps = {len(f) for f in feeds}
    if len(steps) != 1:
        raise RequestError("bad_job", f"teacher-forced feeds must have one length, got {sorted(steps)}")
    if len(prompts) > device.lanes.count:
        raise RequestError("bad_option", f"batch {len(prompts)} exceeds the calbin's {device.lanes.count} lanes")
    for p in prompts:
        why = check_fits(len(p), len(feeds[0]), device.lanes.context)
        if why:
            raise RequestError("context_overflow", why)
    lanes = [device.lanes.allocate() for _ in prompts]
    try:
        yield 0, np.stack([prefill_row(device, lane, list(p)) for lane, p in zip(lanes, prompts)])
        for t in range(len(feeds[0])):
            result = device.run(DecodeJob(tuple(lanes), tuple(int(f[t]) for f in feeds)), TIMEOUT_S)
            yield t + 1, result.logits
    finally:
        for lane in lanes:
            device.lanes.free(lane)
