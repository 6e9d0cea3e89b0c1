"""Auth, the bounded queue and cancellation, on a 2-lane model with a 1-request queue and an API key.

The model is `slow_calbin` (conftest): big enough that a 1000-token request certainly holds its
lane while the test fills the queue or walks away.
"""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

KEY = "sk-calculet-test-0123456789"
LONG = {"max_tokens": 1000, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(slow_calbin, start_server):
    return start_server(slow_calbin, "--max-queue", "1", api_key=KEY)


def hold_stream(server, prompt: str):
    """Open a long stream and read its first event, so it certainly holds a lane."""
    client = httpx.Client(timeout=60)
    cm = client.stream("POST", server.url + "/v1/completions", headers=server.headers(),
                       json={"prompt": prompt, "stream": True, **LONG})
    response = cm.__enter__()
    assert response.status_code == 200
    lines = response.iter_lines()   # keep it alive: closing this generator closes the connection
    while not next(lines).startswith("data:"):
        pass
    return client, cm, lines


def test_wrong_or_missing_key_401_health_open(server):
    for path, body in (("/v1/models", None), ("/v1/completions", {"prompt": "hi"}), ("/metrics", None),
                       ("/tokenize", {"prompt": "hi"}), ("/v1/chat/completions", {"messages": []})):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = httpx.request("POST" if body is not None else "GET", server.url + path, json=body, headers=headers)
            assert r.status_code == 401, (path, headers, r.text)
            assert r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(server.url + "/health").status_code == 200
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="model", prompt="hi", max_tokens=2)
    ok = server.client().completions.create(model="model", prompt="hi", max_tokens=2)
    assert ok.usage.completion_tokens >= 1
    assert KEY not in server.log()


def test_queue_overflow_429_then_recovers(server):
    held = [hold_stream(server, "The quick brown fox"), hold_stream(server, "Paris is")]   # both lanes busy
    queued = {}

    def wait_in_queue():
        queued["response"] = server.post("/v1/completions", {"prompt": "hi", "max_tokens": 3})

    waiter = threading.Thread(target=wait_in_queue)
    waiter.start()
    deadline = time.monotonic() + 5
    while server.metrics()["calculet_requests_waiting"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.metrics()["calculet_requests_waiting"] == 1
    over = server.post("/v1/completions", {"prompt": "hi", "max_tokens": 3})
    assert over.status_code == 429, over.text
    assert over.json()["error"]["code"] == "queue_full" and over.headers["retry-after"]
    with pytest.raises(openai.RateLimitError):
        server.client().completions.create(model="model", prompt="hi", max_tokens=3)
    for client, cm, _lines in held:  # the client goes away: its lane is freed and the queued request runs
        cm.__exit__(None, None, None)
        client.close()
    waiter.join(30)
    assert queued["response"].status_code == 200
    assert server.client().completions.create(model="model", prompt="hi", max_tokens=3).usage.completion_tokens >= 1
    m = server.wait_idle()
    assert m["calculet_lanes_in_use"] == 0 and m['calculet_http_errors_total{status="429"}'] == 2


def test_closing_a_stream_frees_its_lane_quickly(server):
    before = server.metrics().get('calculet_requests_total{outcome="cancelled"}', 0)
    client, cm, _lines = hold_stream(server, "def main():")
    assert server.metrics()["calculet_lanes_in_use"] == 1
    t0 = time.monotonic()
    cm.__exit__(None, None, None)
    client.close()
    m = server.wait_idle(timeout=2)
    assert m["calculet_lanes_in_use"] == 0 and time.monotonic() - t0 < 2
    assert m['calculet_requests_total{outcome="cancelled"}'] == before + 1


def test_non_stream_client_disconnect_cancels(server):
    """A non-streaming client that times out must not keep its lane until max_tokens."""
    before = server.metrics().get('calculet_requests_total{outcome="cancelled"}', 0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", headers=server.headers(), json={"prompt": "hi", **LONG}, timeout=0.3)
    m = server.wait_idle(timeout=3)
    assert m["calculet_lanes_in_use"] == 0
    assert m['calculet_requests_total{outcome="cancelled"}'] == before + 1


def test_request_timeout_408(slow_calbin, start_server):
    timed = start_server(slow_calbin, "--request-timeout", "0.5")
    r = timed.post("/v1/completions", {"prompt": "hi", **LONG})
    assert r.status_code == 408 and r.json()["error"]["code"] == "request_timeout"
    assert "0.5 s" in r.json()["error"]["message"]
    assert timed.wait_idle()["calculet_lanes_in_use"] == 0
    assert timed.post("/v1/completions", {"prompt": "hi", "max_tokens": 2}).status_code == 200
