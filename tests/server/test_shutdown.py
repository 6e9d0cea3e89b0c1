"""Graceful shutdown (server/drain.py) on a real server process. Issue 15: SIGTERM during a stream cut
it mid-token (no final chunk, no [DONE], curl exit 18) and uvicorn cancelled the task.

Synchronization: a stream is known to run once its first event has been read; the drain is known to
have begun once /health says "draining". No sleeps decide an outcome."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx


def open_stream(server, max_tokens: int):
    """A greedy stream that ignores EOS, with its first data line already read (so it holds a lane)."""
    client = httpx.Client(timeout=120)
    cm = client.stream("POST", server.url + "/v1/completions",
                       json={"prompt": "The quick brown fox", "stream": True, "max_tokens": max_tokens, "temperature": 0,
                             "ignore_eos": True})
    response = cm.__enter__()
    assert response.status_code == 200
    lines = response.iter_lines()
    first = next(line for line in lines if line)
    assert first.startswith("data: {")
    return client, cm, lines


def rest_of_stream(lines) -> list:
    """The remaining frames, each a complete `data: ...` line, decoded ([DONE] kept as the string)."""
    frames = []
    for line in lines:
        if not line:
            continue
        assert line.startswith("data: "), line
        payload = line.removeprefix("data: ")
        frames.append(payload if payload == "[DONE]" else json.loads(payload))
    return frames


def wait_draining(server, timeout: float = 10.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = httpx.get(server.url + "/health", timeout=5)
        if r.json().get("status") == "draining":
            return r
        time.sleep(0.01)
    raise AssertionError(f"/health never said draining: {r.text}")


def test_sigterm_lets_a_running_stream_finish_then_exits_0(slow_calbin, start_server):
    server = start_server(slow_calbin, "--drain-timeout", "120")
    client, cm, lines = open_stream(server, max_tokens=300)
    server.proc.send_signal(signal.SIGTERM)
    health = wait_draining(server)
    assert health.status_code == 503
    refused = server.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
    assert refused.headers["retry-after"]
    frames = rest_of_stream(lines)
    cm.__exit__(None, None, None)
    client.close()
    assert frames[-1] == "[DONE]"
    finish = [f["choices"][0]["finish_reason"] for f in frames[:-1] if f.get("choices")]
    assert finish[-1] == "length" and "error" not in frames[-2]
    assert server.proc.wait(30) == 0
    assert "Cancel" not in server.log() and "Traceback" not in server.log()


def test_drain_timeout_ends_streams_with_error_then_done(slow_calbin, start_server):
    server = start_server(slow_calbin, "--drain-timeout", "0.5")
    client, cm, lines = open_stream(server, max_tokens=1000)        # ~15 s of work: outlives the drain
    outcome = {}

    def non_stream():
        outcome["r"] = server.post("/v1/completions", {"prompt": "Paris is", "max_tokens": 1000, "ignore_eos": True})

    waiter = threading.Thread(target=non_stream)
    waiter.start()
    deadline = time.monotonic() + 10
    while server.metrics()["calculet_lanes_in_use"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    server.proc.send_signal(signal.SIGTERM)
    frames = rest_of_stream(lines)
    cm.__exit__(None, None, None)
    client.close()
    waiter.join(30)
    assert frames[-1] == "[DONE]"
    assert frames[-2]["error"]["code"] == "shutting_down" and "drain timeout" in frames[-2]["error"]["message"]
    assert outcome["r"].status_code == 503 and outcome["r"].json()["error"]["code"] == "shutting_down"
    assert server.proc.wait(30) == 0
    assert "Cancel" not in server.log()
