"""Incremental, UTF-8 exact detokenizing for streams.

Text is re-decoded from the generated ids and only the new suffix is emitted; while the decode ends
in U+FFFD (a multi-byte character split across tokens, e.g. byte-fallback pieces of an emoji) the
suffix is held back. So the concatenated deltas equal the final decode, and no half character is
ever sent.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._emitted = 0  # characters of the full decode already returned

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        text = self._tokenizer.decode(self._ids)
        if text.endswith(REPLACEMENT):
            return ""
        return self._take(text)

    def flush(self) -> str:
        """At the end of the stream: whatever is left, replacement characters included."""
        return self._take(self._tokenizer.decode(self._ids))

    def _take(self, text: str) -> str:
        if len(text) < self._emitted:  # the decoder rewrote earlier text; never re-send it
            return ""
        delta = text[self._emitted:]
        self._emitted = len(text)
        return delta

    @property
    def text(self) -> str:
        return self._tokenizer.decode(self._ids)
