"""Test helpers for decoding on a Device:

- `generate_one`: one request alone through the engine's generation loop (the reference that
  batched runs are compared with), with the raw logits row after the prompt;
- `greedy_together`: the runtime alone, no engine: several prompts prefilled, then advanced in the
  same decode jobs, one lane each (checks the device's batching, below the engine);
- `greedy_through_engine`: several prompts submitted at once to a started engine, their tokens collected.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass

import numpy as np

from calculet.engine.local import LocalEngine
from calculet.engine.requests import GenerationRequest, RequestDone, SequenceDelta
from calculet.engine.sampler import SamplerConfig
from calculet.runtime.chunking import plan_chunks
from calculet.runtime.jobs import DecodeJob, PrefillJob

GREEDY = SamplerConfig(temperature=0.0)


@dataclass(frozen=True)
class Generated:
    tokens: list[int]
    text: str
    finish_reason: str
    prompt_logits: np.ndarray       # float32 [vocab]: the row the first token was sampled from


def generate_one(device, tokenizer, prompt_ids, params: SamplerConfig = GREEDY, max_tokens: int = 16,
                 ignore_eos: bool = False) -> Generated:
    """`prompt_ids` alone through an engine on `device` (max_tokens cut to what fits the context)."""
    max_tokens = max(1, min(max_tokens, device.lanes.context - len(prompt_ids)))
    request = GenerationRequest(tuple(prompt_ids), params, max_tokens, ignore_eos=ignore_eos, prompt_logits=True)
    with LocalEngine(device, tokenizer) as local:
        stream = local.submit(request)
        first = [d.prompt_logits for d in stream if d.prompt_logits is not None][0]
    out = stream.output.outputs[0]
    return Generated(list(out.token_ids), out.text, out.finish_reason, first)


def prefill(device, lane: int, prompt_ids: list[int]) -> np.ndarray:
    """Run the ids through prefill chunks after what the lane holds; the last chunk's logits row [vocab]."""
    pos, result = 0, None
    pieces = plan_chunks(len(prompt_ids), device.lanes.length(lane), device.program.chunk_sizes, device.lanes.context)
    for i, n in enumerate(pieces):
        result = device.run(PrefillJob(lane, tuple(prompt_ids[pos:pos + n]), want_logits=i == len(pieces) - 1), 30)
        pos += n
    return result.logits[0]


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


def greedy_through_engine(engine, prompts: list[list[int]], tokens: int, timeout: float = 120) -> list[list[int]]:
    """`tokens` greedy tokens per prompt (EOS ignored) through a started engine, every prompt submitted at once."""
    inboxes = []
    for ids in prompts:
        inboxes.append(queue.Queue())
        engine.submit(GenerationRequest(tuple(ids), GREEDY, tokens, ignore_eos=True), inboxes[-1].put)
    results = [[] for _ in prompts]
    for i, q in enumerate(inboxes):
        while not isinstance(event := q.get(timeout=timeout), RequestDone):
            assert isinstance(event, SequenceDelta), event
            results[i] += event.token_ids
    return results


def generate_on_calbin(calbin, prompt_ids, max_tokens: int = 16) -> Generated:
    """`prompt_ids` greedily (EOS ignored, prompt logits kept) on a fresh device loaded with `calbin`."""
    from calculet.engine.tokenizer import TextTokenizer
    from calculet.runtime.device import Device

    d = Device()
    d.configure(d.load(calbin))
    try:
        return generate_one(d, TextTokenizer.from_program(d.program), prompt_ids, GREEDY, max_tokens, ignore_eos=True)
    finally:
        d.close()
