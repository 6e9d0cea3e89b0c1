"""`SamplingParams`: what a caller asks of one generation, with vLLM's names, and its one mapping onto
the engine's `GenerationRequest`.

    SamplingParams (public: calculet.SamplingParams, the server's request bodies)
        └── to_request(prompt_ids, context) ──▶ GenerationRequest(params=SamplerConfig, max_tokens, stop, ...)

Every entry point (`calculet.LLM`, `calculet run`, `calculet serve`) builds its requests here, so the
same options mean the same request everywhere. Ranges are checked on construction and say what is
allowed; the prompt and context limits are checked when the request is made (they need the prompt).
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.engine.requests import GenerationRequest, check_output_options
from calculet.engine.sampler import SamplerConfig


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    max_tokens: int | None = 16           # None: whatever fits in the context after the prompt
    min_tokens: int = 0                   # EOS and stop_token_ids cannot end the output before this
    temperature: float = 1.0              # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0                        # 0 = off
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()            # a str or a sequence of str; never included in the text
    stop_token_ids: tuple[int, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None           # None: off; k: the chosen token's logprob plus the top k
    ignore_eos: bool = False

    def __post_init__(self):
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        check_output_options(self.max_tokens, self.min_tokens, self.n, self.logprobs, stop)
        self.sampler()  # checks the sampling ranges

    def sampler(self) -> SamplerConfig:
        return SamplerConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                             seed=self.seed, presence_penalty=self.presence_penalty,
                             frequency_penalty=self.frequency_penalty, repetition_penalty=self.repetition_penalty)

    def to_request(self, prompt_ids, context: int, timeout_s: float | None = None) -> GenerationRequest:
        """The engine request for `prompt_ids`. max_tokens=None becomes whatever fits in `context`
        (at least 1: the engine rejects a prompt that leaves no room, saying so)."""
        prompt_ids = tuple(prompt_ids)
        max_tokens = self.max_tokens if self.max_tokens is not None else max(context - len(prompt_ids), 1)
        return GenerationRequest(prompt_ids=prompt_ids, params=self.sampler(), max_tokens=max_tokens,
                                 min_tokens=self.min_tokens, n=self.n, stop=self.stop, stop_token_ids=self.stop_token_ids,
                                 ignore_eos=self.ignore_eos, logprobs=self.logprobs, timeout_s=timeout_s)
