"""What the engine reports as it runs, for metrics. The engine calls these on its own thread;
the default observer ignores everything. The server's metrics implement it."""

from __future__ import annotations

from calculet.runtime.jobs import PhaseTimings


class EngineObserver:
    def job(self, kind: str, timings: PhaseTimings, useful_tokens: int) -> None:
        """A device job finished: its phases, and how many of its computed tokens were real."""

    def step(self, prefill_tokens: int, decode_rows: int) -> None:
        """An engine step was planned: prompt tokens it prefills beside how many decode rows."""

    def slice_raised(self) -> None:
        """The step's prefill slice was raised above the budget for a prompt at risk of missing the TTFT target."""

    def sampled(self, seconds: float, tokens: int) -> None:
        """Host sampling of one device job's rows took `seconds` for `tokens` sequences."""

    def admitted(self, queue_s: float, prompt_tokens: int) -> None:
        """A request got its first lane after waiting `queue_s`."""

    def first_token(self, ttft_s: float) -> None:
        pass

    def inter_token(self, gaps_s: list[float]) -> None:
        pass

    def finished(self, outcome: str, e2e_s: float) -> None:
        """outcome: stop | length | error | cancelled | timeout."""

    def device_error(self, code: str) -> None:
        pass

    def requeued(self, sequences: int) -> None:
        """After a device reset: sequences that lost their lane and will be re-prefilled."""

    def device_reset(self, seconds: float, ok: bool) -> None:
        pass
