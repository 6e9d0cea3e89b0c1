"""The runtime side of a golden check, through the engine's one generation loop: free-running greedy
requests (with the raw logits row after the prompt) and teacher-forced ones (`forced_ids`: the
reference's tokens are fed, and each step's own greedy pick is read from `sampled_ids`)."""

from __future__ import annotations

from calculet.engine.local import LocalEngine
from calculet.engine.requests import GenerationRequest
from calculet.engine.sampler import SamplerConfig

GREEDY = SamplerConfig(temperature=0.0)


def golden_fns(local: LocalEngine):
    """(run_fn, forced_fn) for `check_against_golden`, each request run alone on `local`'s engine."""

    def run_fn(input_ids: list[int], n_tokens: int):
        request = GenerationRequest(tuple(input_ids), GREEDY, n_tokens, ignore_eos=True, prompt_logits=True)
        first, tokens = None, []
        for delta in local.submit(request):
            if delta.prompt_logits is not None:
                first = delta.prompt_logits
            tokens.extend(delta.token_ids)
        return first, tokens

    def forced_fn(input_ids: list[int], reference_tokens: list[int]) -> list[int]:
        request = GenerationRequest(tuple(input_ids), GREEDY, len(reference_tokens), ignore_eos=True,
                                    forced_ids=tuple(reference_tokens))
        return [t for delta in local.submit(request) for t in delta.sampled_ids]

    return run_fn, forced_fn
