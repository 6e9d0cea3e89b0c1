"""The fault matrix (runtime/faults.py) through a real server: for each injected fault, what a
streaming client sees (an SSE error event with the fault's code, then `data: [DONE]`), that the
request sharing the engine with it still gives its solo answer, that no lane leaks, that metrics count
it, and that the server then serves normally.

Two streams run together on a server with `--max-prefill-tokens 1 --burst-prefill-tokens 0` (one
prefill chunk per step, each stream decoding as soon as it is prefilled,
first come first served; see test_faults.py): when the first decode step runs, only one of them is
decoding, so a decode fault hits exactly one; a prefill fault hits whichever was prefilled first.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 3


def stream(server, prompt, refusal_ok: bool = False) -> tuple[str, list]:
    """(text, frames) of one greedy stream; frames are the decoded `data:` payloads, [DONE] included.
    `refusal_ok`: a request refused before it streams gives ("", [its error body, "REFUSED"])."""
    frames = []
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                      json={"prompt": prompt, "stream": True, "max_tokens": 10, "temperature": 0, "ignore_eos": True}) as r:
        if refusal_ok and r.status_code == 503:
            return "", [json.loads(r.read()), "REFUSED"]
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line:
                assert line.startswith("data: "), line
                payload = line.removeprefix("data: ")
                frames.append(payload if payload == "[DONE]" else json.loads(payload))
    text = "".join(f["choices"][0]["text"] for f in frames[:-1] if f.get("choices"))
    return text, frames


def run_pair(server, refusal_ok: bool = False) -> dict:
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(("short", "long"), pool.map(lambda p: stream(server, p, refusal_ok), ("Paris is", LONG_PROMPT))))


CASES = [
    # spec, extra server options, the failed stream's error code
    ("fail@decode:1", (), "injected_fault"),
    ("hang@decode:1", ("--job-timeout", "1"), "job_timeout"),
    ("delay=3@decode:1", ("--job-timeout", "0.5"), "job_timeout"),
    ("nan@decode:1", (), "bad_output"),
    ("inf@decode:1", (), "bad_output"),
    ("alloc@prefill:1", (), "device_run_failed"),
]


@pytest.mark.parametrize("spec,options,code", CASES, ids=[c[0] for c in CASES])
def test_fault_fails_one_stream_cleanly_and_the_server_recovers(tiny_calbin, start_server, spec, options, code):
    server = start_server(tiny_calbin("llama", lanes=4, context=128, chunks=(4, 16)), "--max-prefill-tokens", "1", "--burst-prefill-tokens", "0",
                          *options, env={"CALCULET_FAULT": spec})
    outcomes = run_pair(server)
    failed = [name for name, (_text, frames) in outcomes.items() if "error" in frames[-2]]
    assert len(failed) == 1, outcomes
    frames = outcomes[failed[0]][1]
    assert frames[-1] == "[DONE]" and frames[-2]["error"]["code"] == code, frames[-2:]
    m = server.wait_idle(timeout=10)
    assert m["calculet_lanes_in_use"] == 0 and m["calculet_healthy"] == 1
    assert m[f'calculet_device_errors_total{{code="{code}"}}'] == 1
    assert m['calculet_device_resets_total{result="ok"}'] == 1
    # after recovery: both prompts give their solo answers, the survivor the same text it streamed
    for name, prompt in (("short", "Paris is"), ("long", LONG_PROMPT)):
        solo, again = stream(server, prompt)
        assert again[-1] == "[DONE]" and "error" not in again[-2]
        if name not in failed:
            assert outcomes[name][0] == solo
    assert server.get("/health").json()["status"] == "ok"


def test_slow_jobs_within_the_deadline_change_nothing(tiny_calbin, start_server):
    calbin = tiny_calbin("llama", lanes=4, context=128, chunks=(4, 16))
    server = start_server(calbin, "--max-prefill-tokens", "1", "--burst-prefill-tokens", "0", "--job-timeout", "30",
                          env={"CALCULET_FAULT": "delay=0.2@decode:1:3,delay=0.2@prefill:2"})
    outcomes = run_pair(server)
    for name, prompt in (("short", "Paris is"), ("long", LONG_PROMPT)):
        assert "error" not in outcomes[name][1][-2]
        assert outcomes[name][0] == stream(server, prompt)[0]
    m = server.wait_idle()
    assert m["calculet_lanes_in_use"] == 0 and not any(k.startswith("calculet_device_errors_total{") for k in m)


def test_failed_reset_fails_everyone_then_retries(tiny_calbin, start_server):
    """The decode fault's reset fails (fail@load:2): every request fails (one that arrives after the
    failure is refused with 503 at once), /health says 503 until the engine's retry succeeds (load 3),
    then the server serves normally."""
    server = start_server(tiny_calbin("llama", lanes=4, context=128, chunks=(4, 16)), "--max-prefill-tokens", "1", "--burst-prefill-tokens", "0",
                          env={"CALCULET_FAULT": "fail@decode:1,fail@load:2"})
    outcomes = run_pair(server, refusal_ok=True)
    codes = sorted(frames[-2]["error"]["code"] for _text, frames in outcomes.values())
    assert codes == ["device_unavailable", "injected_fault"], codes
    m = server.wait_idle(timeout=30)
    assert m['calculet_device_resets_total{result="failed"}'] == 1 and m["calculet_lanes_in_use"] == 0
    server.wait_ready(30)                               # the retry (after engine.RESET_RETRY_S) succeeds
    assert stream(server, "Paris is")[1][-1] == "[DONE]"


def test_broken_device_at_start_exits_2(tiny_calbin, tmp_path):
    from serving import Server

    server = Server(tiny_calbin("llama", lanes=4, context=128, chunks=(4, 16)), tmp_path / "log.txt",
                    env={"CALCULET_FAULT": "fail@load:1"})
    try:
        assert server.proc.wait(60) == 2
        assert "session_create_failed" in server.log()
    finally:
        server.stop()


def test_health_and_requests_while_loading(tiny_calbin, tmp_path):
    """While the model loads (a slow load: delay=5@load:1), /health answers 503 "loading" and requests
    get 503 model_loading with Retry-After; then the server becomes ready by itself."""
    import time

    from serving import Server

    server = Server(tiny_calbin("llama", lanes=4, context=128, chunks=(4, 16)), tmp_path / "log.txt",
                    env={"CALCULET_FAULT": "delay=5@load:1"})
    try:
        deadline = time.monotonic() + 60
        while True:                                        # the first answer, once the port is bound
            try:
                first = httpx.get(server.url + "/health", timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and server.proc.poll() is None, server.log()
                time.sleep(0.02)
        assert first.status_code == 503 and first.json()["status"] == "loading"
        early = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=5)
        assert early.status_code == 503 and early.json()["error"]["code"] == "model_loading"
        assert early.headers["retry-after"]
        server.wait_ready(60)
        assert stream(server, "Paris is")[1][-1] == "[DONE]"
    finally:
        server.stop()
