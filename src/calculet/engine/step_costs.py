"""What an engine step costs on this device, measured as it runs: the estimates the TTFT target of
the step policy (engine/step_policy.py) plans with.

    decode_step_s      seconds one decode job takes (whatever its rows: the calbin's decode graph)
    prefill_token_s    seconds per prompt token of the prefill chunks, their fixed cost included

Both are exponentially weighted means over recent jobs (a new job weighs `WEIGHT`). The prefill cost
is the ratio of the weighted seconds to the weighted tokens, so a 128-token chunk counts for more than
an 8-token one, as it does in a prompt's time. Nothing is known until a job of each kind has run.
"""

from __future__ import annotations

from dataclasses import dataclass

WEIGHT = 0.2


@dataclass
class StepCosts:
    decode_step_s: float = 0.0
    _prefill_s: float = 0.0          # weighted seconds of recent prefill chunks
    _prefill_tokens: float = 0.0     # and their weighted tokens
    _decodes: int = 0

    @property
    def known(self) -> bool:
        return self._decodes > 0 and self._prefill_tokens > 0

    @property
    def prefill_token_s(self) -> float:
        return self._prefill_s / self._prefill_tokens if self._prefill_tokens else 0.0

    def decoded(self, seconds: float) -> None:
        self.decode_step_s = seconds if not self._decodes else \
            (1 - WEIGHT) * self.decode_step_s + WEIGHT * seconds
        self._decodes += 1

    def prefilled(self, seconds: float, tokens: int) -> None:
        if tokens <= 0:
            return
        if not self._prefill_tokens:
            self._prefill_s, self._prefill_tokens = seconds, float(tokens)
            return
        self._prefill_s = (1 - WEIGHT) * self._prefill_s + WEIGHT * seconds
        self._prefill_tokens = (1 - WEIGHT) * self._prefill_tokens + WEIGHT * tokens
