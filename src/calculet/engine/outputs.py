"""What an in-process caller gets back: vLLM-shaped outputs, assembled from one request's events.

    SequenceDelta ... ──OutputBuilder.add──▶ RequestDone ──OutputBuilder.build──▶ RequestOutput
                                                                                   └── CompletionOutput x n
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.engine.requests import RequestDone, RequestTimings, SequenceDelta, TokenLogprob


@dataclass(frozen=True)
class CompletionOutput:
    """One generated continuation (one of n)."""
    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str                                 # "stop" | "length"
    logprobs: tuple[TokenLogprob, ...] | None = None   # one per token, when the request asked for them


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int                             # over all n outputs
    cached_tokens: int = 0                             # prompt tokens the prefix cache held (not prefilled)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class RequestOutput:
    prompt: str | None                                 # the text, when the prompt was given as text
    prompt_token_ids: tuple[int, ...]
    outputs: tuple[CompletionOutput, ...]
    usage: Usage
    timings: RequestTimings                            # the engine's clock: queue, prefill, decode, TTFT


class OutputBuilder:
    """Collects the deltas of one request with `n` outputs."""

    def __init__(self, n: int, logprobs: bool):
        self._logprobs = logprobs
        self._text = [[] for _ in range(n)]
        self._tokens = [[] for _ in range(n)]
        self._lps = [[] for _ in range(n)]
        self._finish: list[str | None] = [None] * n

    def add(self, d: SequenceDelta) -> None:
        self._text[d.index].append(d.text)
        self._tokens[d.index].extend(d.token_ids)
        self._lps[d.index].extend(d.logprobs)
        self._finish[d.index] = d.finish_reason or self._finish[d.index]

    def build(self, prompt: str | None, prompt_ids: tuple[int, ...], done: RequestDone) -> RequestOutput:
        outputs = tuple(CompletionOutput(i, "".join(self._text[i]), tuple(self._tokens[i]), self._finish[i],
                                         tuple(self._lps[i]) if self._logprobs else None)
                        for i in range(len(self._text)))
        return RequestOutput(prompt, tuple(prompt_ids), outputs, Usage(done.prompt_tokens, done.completion_tokens, done.cached_tokens), done.timings)
