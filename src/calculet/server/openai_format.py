"""OpenAI response shapes for completions and chat completions, whole and as stream chunks.

One formatter object per request: it remembers per-choice state (the text offset of completion
logprobs, whether a chat choice has sent its role yet).
"""

from __future__ import annotations

import json
import time
import uuid

from calculet.engine.requests import RequestDone, RequestTimings, TokenLogprob


def usage(done: RequestDone) -> dict:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens}, "server_timings": done.timings.to_json()}


def timing_headers(t: RequestTimings) -> dict[str, str]:
    """`x-calculet-timings` (JSON, seconds) and the standard `server-timing` (milliseconds)."""
    server_timing = ", ".join(f"{name};dur={value * 1000:.3f}" for name, value in
                              (("queue", t.queue_s), ("prefill", t.prefill_s), ("decode", t.decode_s), ("total", t.total_s)))
    return {"x-calculet-timings": json.dumps(t.to_json(), separators=(",", ":")), "server-timing": server_timing}


class _Format:
    object = ""
    chunk_object = ""
    id_prefix = ""

    def __init__(self, model: str, tokenizer, return_token_ids: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.return_token_ids = return_token_ids
        self.id = self.id_prefix + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _token_text(self, token_id: int) -> str:
        """The token's text; a piece of a multi-byte character (no text alone) shows as its raw
        vocabulary entry, so distinct tokens keep distinct keys in `top_logprobs`."""
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        if "\ufffd" in text:
            text = self.tokenizer.id_to_token(token_id) or text
        return text

    def envelope(self, choices: list[dict], chunk: bool) -> dict:
        return {"id": self.id, "object": self.chunk_object if chunk else self.object, "created": self.created,
                "model": self.model, "choices": choices}

    def first_chunks(self, n: int) -> list[dict]:
        return []

    def _with_token_ids(self, choice: dict, token_ids) -> dict:
        if self.return_token_ids and token_ids is not None:
            choice["token_ids"] = list(token_ids)
        return choice


class CompletionFormat(_Format):
    object = chunk_object = "text_completion"
    id_prefix = "cmpl-"

    def __init__(self, model, tokenizer, return_token_ids=False, echo_text: str = ""):
        super().__init__(model, tokenizer, return_token_ids)
        self.echo_text = echo_text
        self._offset: dict[int, int] = {}

    def logprobs(self, index: int, entries: list[TokenLogprob]) -> dict | None:
        if not entries:
            return None
        offset = self._offset.get(index, len(self.echo_text))
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in entries:
            text = self._token_text(e.token_id)
            out["tokens"].append(text)
            out["token_logprobs"].append(e.logprob)
            out["top_logprobs"].append({self._token_text(t): lp for t, lp in e.top})
            out["text_offset"].append(offset)
            offset += len(text)
        self._offset[index] = offset
        return out

    def choice(self, index: int, text: str, entries, finish: str | None, token_ids=None, chunk: bool = False) -> dict:
        c = {"index": index, "text": text, "logprobs": self.logprobs(index, entries) if entries is not None else None,
             "finish_reason": finish}
        return self._with_token_ids(c, token_ids)

    def first_chunks(self, n: int) -> list[dict]:
        if not self.echo_text:
            return []
        return [self.envelope([self.choice(i, self.echo_text, None, None)], chunk=True) for i in range(n)]


class ChatFormat(_Format):
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def _entry(self, token_id: int, logprob: float) -> dict:
        text = self._token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def logprobs(self, entries: list[TokenLogprob]) -> dict:
        content = []
        for e in entries:
            item = self._entry(e.token_id, e.logprob)
            item["top_logprobs"] = [self._entry(t, lp) for t, lp in e.top]
            content.append(item)
        return {"content": content, "refusal": None}

    def choice(self, index: int, text: str, entries, finish: str | None, token_ids=None, chunk: bool = False) -> dict:
        lps = self.logprobs(entries) if entries else None
        if chunk:
            c = {"index": index, "delta": {"content": text} if text else {}, "logprobs": lps, "finish_reason": finish}
        else:
            c = {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": lps, "finish_reason": finish}
        return self._with_token_ids(c, token_ids)

    def first_chunks(self, n: int) -> list[dict]:
        return [self.envelope([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}], chunk=True) for i in range(n)]
