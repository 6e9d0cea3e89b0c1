"""One streaming request to an OpenAI-compatible server, timed on the client's monotonic clock.

`stream_request` sends the body, reads the server-sent events line by line as they arrive and
returns a `StreamResult`: when it was sent, when each chunk that carried text arrived, when it ended,
what the server said about token counts (`usage`) and its own timings. It never raises for a failed
request: the failure is the result (status `error`, with a type and message).
"""

from __future__ import annotations

import json
from typing import Any, Callable

import httpx

from calculet.bench.records import StreamResult

_ERROR_CHARS = 500


def request_body(model: str, prompt_body: dict[str, Any], max_tokens: int, fixed_output: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        **prompt_body,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if fixed_output:
        # Honoured by vLLM (both) and llama.cpp (ignore_eos); others ignore them, which the report shows.
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    return body


def _chunk_text(choice: dict[str, Any]) -> str:
    if "text" in choice:                      # /v1/completions
        return choice.get("text") or ""
    delta = choice.get("delta") or {}         # /v1/chat/completions
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")


class _Stream:
    """Accumulates the facts of one event stream into a StreamResult."""

    def __init__(self, result: StreamResult, on_chunk: Callable[[dict[str, Any]], None] | None = None):
        self.result = result
        self.on_chunk = on_chunk
        self.done_marker = False
        self.text_chunks = 0
        self.usage_tokens: int | None = None

    def event(self, data: str, now_ns: int) -> None:
        r = self.result
        if data.strip() == "[DONE]":
            self.done_marker = True
            return
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            raise ValueError(f"chunk is not an object: {data[:80]}")
        if "error" in chunk and not chunk.get("choices"):
            raise _ServerStreamError(str(chunk["error"])[:_ERROR_CHARS])
        if self.on_chunk is not None:
            self.on_chunk(chunk)
        for choice in chunk.get("choices") or []:
            text = _chunk_text(choice)
            if text:
                if r.t_first_token_ns is None:
                    r.t_first_token_ns = now_ns
                r.t_chunks_ns.append(now_ns)
                r.output_chars += len(text)
                self.text_chunks += 1
            if choice.get("finish_reason"):
                r.finish_reason = choice["finish_reason"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("prompt_tokens"), int):
                r.prompt_tokens = usage["prompt_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                self.usage_tokens = usage["completion_tokens"]
        timings = {k: v for k, v in chunk.items() if "timing" in k.lower() and v}
        if timings:
            r.server_timings = {**(r.server_timings or {}), **timings}

    def finish(self) -> None:
        r = self.result
        if self.usage_tokens is not None:
            r.output_tokens, r.output_tokens_source = self.usage_tokens, "usage"
        else:
            r.output_tokens, r.output_tokens_source = self.text_chunks, "chunks"


class _ServerStreamError(Exception):
    pass


# A server may close an idle keep-alive connection just as the client reuses it (llama.cpp's HTTP
# library closes them after 5 s). Such a request got no byte back and is sent again at once.
MAX_ATTEMPTS = 3


async def stream_request(http: httpx.AsyncClient, url: str, body: dict[str, Any],
                         clock: Callable[[], int], on_chunk: Callable[[dict[str, Any]], None] | None = None) -> StreamResult:
    """Send one streaming request; `clock()` gives nanoseconds on the run's monotonic clock;
    `on_chunk(chunk)` sees every parsed chunk (the text and usage a caller wants to keep).

    A request the server closed without any response ("disconnected") is retried on a new
    connection, up to MAX_ATTEMPTS in all; the record then holds the last attempt's times and
    `attempts` says how many were made."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        result = StreamResult(t_sent_ns=clock(), attempts=attempt)
        stream = _Stream(result, on_chunk)
        failure = await _read_stream(http, url, body, clock, stream)
        if failure is None or failure[0] != "disconnected" or attempt == MAX_ATTEMPTS:
            break
    result.t_done_ns = clock()
    stream.finish()  # partial counts are kept for failed requests too
    if failure is None and result.finish_reason is None and not stream.done_marker:
        failure = ("stream_incomplete", "the stream ended without a finish_reason or [DONE]")
    if failure is None:
        result.status = "ok"
    else:
        result.status, result.error_type, result.error = "error", failure[0], failure[1][:_ERROR_CHARS]
    return result


async def _read_stream(http: httpx.AsyncClient, url: str, body: dict[str, Any],
                       clock: Callable[[], int], stream: _Stream) -> tuple[str, str] | None:
    """Read the response into `stream`; return (error type, message) on failure, else None."""
    result, started = stream.result, False
    try:
        async with http.stream("POST", url, json=body) as response:
            result.http_status = response.status_code
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                return f"http_{response.status_code}", text or response.reason_phrase
            started = True
            header_timing = response.headers.get("server-timing")
            if header_timing:
                result.server_timings = {"server-timing": header_timing}
            async for line in response.aiter_lines():
                now = clock()
                if line.startswith("data:"):
                    stream.event(line[5:].strip(), now)
    except _ServerStreamError as exc:
        return "stream_error", str(exc)
    except (json.JSONDecodeError, ValueError, AttributeError, TypeError) as exc:
        return "bad_response", f"unreadable chunk: {exc}"
    except httpx.TimeoutException as exc:
        return "timeout", f"{type(exc).__name__}: {exc}"
    except httpx.ConnectError as exc:
        return "connect", f"{type(exc).__name__}: {exc}"
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
        return ("stream_dropped" if started else "disconnected"), f"{type(exc).__name__}: {exc}"
    except httpx.HTTPError as exc:
        return "http_error", f"{type(exc).__name__}: {exc}"
    return None
