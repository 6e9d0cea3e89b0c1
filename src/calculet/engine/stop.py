"""Stop strings on a text stream: emit only text that can no longer turn into a stop string.

    checker = StopChecker(("\\n\\n", "END"))
    safe, stopped = checker.push("Hello EN")    # -> ("Hello ", False): "EN" is held back
    safe, stopped = checker.push("D of it")     # -> ("", True): the stream stops before "END"

Text that ends with a prefix of a stop string is held back until the next delta says whether the
stop string completes. Any stop occurrence starts inside the held-back text or the new delta (text
already emitted never ends with a stop prefix), so searching there is enough. The stop string itself
is never emitted (OpenAI semantics).
"""

from __future__ import annotations


class StopChecker:
    def __init__(self, stops: tuple[str, ...] = ()):
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def push(self, delta: str) -> tuple[str, bool]:
        """Feed new text; returns (text safe to emit now, whether a stop string was hit)."""
        if self.stopped:
            return "", True
        if not self.stops:
            return delta, False
        text = self._held + delta
        cut = self._first_stop(text)
        if cut is not None:
            self._held, self.stopped = "", True
            return text[:cut], True
        keep = self._stop_prefix_len(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep], False

    def flush(self) -> str:
        """At the end of the stream (no stop hit): the held-back tail is ordinary text after all."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _first_stop(self, text: str) -> int | None:
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return min(found) if found else None

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest tail of `text` that is a proper prefix of some stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best
