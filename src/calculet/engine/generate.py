"""One sequence, start to finish: prefill in chunks, then decode until EOS, max_tokens or the context.

This is the simple path `calculet run` and the parity tests use; the server's engine interleaves
many sequences over the same device with the same pieces.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from calculet.engine.detokenizer import IncrementalDetokenizer
from calculet.engine.sampler import SamplingParams, SequenceSampler
from calculet.errors import RequestError
from calculet.runtime.chunking import plan_chunks
from calculet.runtime.device import JOB_TIMEOUT_S
from calculet.runtime.jobs import DecodeJob, PrefillJob


@dataclass(frozen=True)
class Generation:
    prompt_tokens: int
    tokens: list[int]
    text: str
    finish_reason: str          # "stop" | "length"
    ttft_s: float               # prompt submitted -> first token sampled
    decode_s: float             # first token -> last token
    prompt_logits: object       # float32 [vocab]: logits after the last prompt token

    @property
    def decode_tokens_per_s(self) -> float:
        n = len(self.tokens) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0


def check_prompt(n_prompt: int, context: int) -> None:
    if n_prompt == 0:
        raise RequestError("empty_prompt", "the prompt is empty; give at least one token of text")
    if n_prompt >= context:
        raise RequestError("prompt_too_long", f"the prompt has {n_prompt} tokens but the context is {context} "
                           f"(at most {context - 1} prompt tokens leave room to generate)")


def prefill(device, lane: int, prompt_ids: list[int], start: int = 0):
    """Run the prompt through prefill chunks; returns the last chunk's logits row [vocab]."""
    program = device.program
    pos, result = start, None
    pieces = plan_chunks(len(prompt_ids) - start, start, program.chunk_sizes, device.lanes.context)
    for i, n in enumerate(pieces):
        last = i == len(pieces) - 1
        result = device.run(PrefillJob(lane, tuple(prompt_ids[pos:pos + n]), want_logits=last), JOB_TIMEOUT_S)
        pos += n
    return result.logits[0]


def generate(device, tokenizer, prompt_ids: list[int], params: SamplingParams, max_tokens: int,
             on_text: Callable[[str], None] | None = None, ignore_eos: bool = False) -> Generation:
    context = device.lanes.context
    check_prompt(len(prompt_ids), context)
    if max_tokens < 1:
        raise RequestError("invalid_parameter", f"max_tokens={max_tokens} is out of range; allowed: >= 1")
    max_tokens = min(max_tokens, context - len(prompt_ids))
    sampler = SequenceSampler(params, prompt_ids)
    detok = IncrementalDetokenizer(tokenizer)
    lane = device.lanes.allocate()
    try:
        t0 = time.perf_counter()
        logits = prefill(device, lane, prompt_ids)
        prompt_logits = logits.copy()
        tokens, finish = [], "length"
        t_first = None
        candidates = None
        while True:
            token = sampler.sample(logits, candidates)
            tokens.append(token)
            if t_first is None:
                t_first = time.perf_counter()
            if not ignore_eos and token in tokenizer.eos_ids:
                finish = "stop"
                break
            if on_text is not None:
                delta = detok.push(token)
                if delta:
                    on_text(delta)
            if len(tokens) >= max_tokens:
                break
            result = device.run(DecodeJob((lane,), (token,)), JOB_TIMEOUT_S)
            logits = result.logits[0]
            candidates = (result.topk_ids[0], result.topk_values[0]) if result.topk_ids is not None else None
        if on_text is not None:
            rest = detok.flush()
            if rest:
                on_text(rest)
        t_end = time.perf_counter()
    finally:
        device.lanes.free(lane)
    text_ids = tokens[:-1] if finish == "stop" else tokens
    return Generation(len(prompt_ids), tokens, tokenizer.decode(text_ids), finish, t_first - t0, t_end - t_first, prompt_logits)
