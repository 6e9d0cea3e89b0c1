"""Two Ray Serve replicas of a small random Llama behind one endpoint, on a local Ray cluster started
here (2 CPUs, a small object store, no dashboard): the official `openai` client gets the single-process
server's greedy answers; concurrent requests reach both replicas; a session key sticks to one; killing
one replica's process ends only its in-flight requests, with a 503 / an SSE error then [DONE], and
the service keeps answering. Skipped when Ray is not installed (the `ray` extra)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from serving import Server, free_port  # noqa: E402

from calculet.ray.affinity import rank  # noqa: E402
from calculet.ray.deployment import REPLICA_HEADER, build_app  # noqa: E402
from calculet.ray.options import ReplicaOptions  # noqa: E402
from calculet.server.config import ServerConfig  # noqa: E402

pytestmark = pytest.mark.slow   # a Ray cluster and two model loads: about a minute on two busy cores

PROMPTS = ["The quick brown fox", "Paris is the capital of", "def main():"]
HEADER = REPLICA_HEADER.decode()


@pytest.fixture(scope="module")
def calbin(tmp_path_factory):
    """8 layers, hidden 512 (~15 ms a step here): a 600-token stream holds its lane for seconds, long
    enough to kill its replica mid-way. 2 lanes, context 1024."""
    import tiny_models
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions

    folder = tiny_models.make_tiny_model("llama", tmp_path_factory.mktemp("hf-ray"), hidden_size=512,
                                         intermediate_size=2048, num_hidden_layers=8, num_attention_heads=8, head_dim=64)
    out = tmp_path_factory.mktemp("calbin-ray") / "model.calbin"
    return compile_calbin(str(folder), out, CompileOptions(lanes=2, context=1024, prefill_chunks=(16, 128), golden=False),
                          log=lambda _m: None)


def _greedy(client, prompt: str, max_tokens: int = 12):
    return client.completions.create(model="model", prompt=prompt, max_tokens=max_tokens, temperature=0)


@pytest.fixture(scope="module")
def reference(calbin, tmp_path_factory):
    """The single-process server's greedy answers (the server is stopped before Ray starts)."""
    server = Server(calbin, tmp_path_factory.mktemp("ref") / "server.log", "--threads", "1").wait_ready(90)
    try:
        client = server.client()
        texts = [_greedy(client, p).choices[0].text for p in PROMPTS]
        chat = client.chat.completions.create(model="model", messages=[{"role": "user", "content": "Hello there"}],
                                              max_tokens=10, temperature=0).choices[0].message.content
    finally:
        server.stop()
    return texts, chat


@pytest.fixture(scope="module")
def service(calbin, reference):
    port = free_port()
    ray.init(num_cpus=2, object_store_memory=80 * 1024 * 1024, include_dashboard=False, logging_level="WARNING")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_app(ServerConfig(model=str(calbin)), ReplicaOptions(replicas=2, num_cpus=1, affinity="session",
                                                                        graceful_shutdown_s=5))
        serve.run(app, name="calculet", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def _client(url):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_openai_client_gets_the_single_process_answers(service, reference):
    texts, chat = reference
    client = _client(service)
    assert [_greedy(client, p).choices[0].text for p in PROMPTS] == texts
    got = client.chat.completions.create(model="model", messages=[{"role": "user", "content": "Hello there"}],
                                         max_tokens=10, temperature=0).choices[0].message.content
    assert got == chat
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="model", prompt=PROMPTS[0], max_tokens=12, temperature=0, stream=True) if c.choices)
    assert streamed == texts[0]
    # the server's own errors come through unchanged
    bad = httpx.post(service + "/v1/completions", json={"model": "model", "prompt": "x", "max_tokens": 0}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    missing = httpx.post(service + "/v1/completions", json={"model": "nope", "prompt": "x"}, timeout=60)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    admin = httpx.get(service + "/admin/models", timeout=60)   # replicas must not drift apart one by one
    assert admin.status_code == 404 and "redeploy" in admin.json()["error"]["message"]
    huge = httpx.post(service + "/v1/completions", content=b"x" * ((1 << 20) + 1), timeout=60)   # 1 MiB: context 1024's limit
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "body_too_large"


def _replica_of(url: str, body: dict, headers: dict | None = None) -> str:
    r = httpx.post(url + "/v1/completions", json=body, headers=headers or {}, timeout=120)
    assert r.status_code == 200, r.text
    return r.headers[HEADER]


def test_concurrent_requests_reach_both_replicas_and_a_session_sticks(service):
    body = {"model": "model", "prompt": "Static graphs", "max_tokens": 48, "min_tokens": 48, "temperature": 0}
    with ThreadPoolExecutor(8) as pool:
        seen = set(pool.map(lambda _i: _replica_of(service, body), range(8)))
    assert len(seen) == 2, seen
    short = {**body, "max_tokens": 2, "min_tokens": 0}
    assert len({_replica_of(service, short, {"x-calculet-session": "chat-42"}) for _ in range(4)}) == 1
    assert len({_replica_of(service, {**short, "user": "alice"}) for _ in range(4)}) == 1


def _stream(url: str, body: dict, headers: dict, out: dict, started: threading.Event) -> None:
    """Read one SSE stream into out: replica, data lines, or the status and body of an error answer."""
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=headers, timeout=120) as r:
        out["status"], out["replica"], out["lines"] = r.status_code, r.headers.get(HEADER), []
        for line in r.iter_lines():
            if line.startswith("data: "):
                out["lines"].append(line[6:])
                started.set()
    started.set()


def _pid(replica: str) -> int:
    actor = ray.get_actor(replica, namespace="serve")
    return ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()), timeout=30)


def _key_for(unique_id: str, ids: list[str]) -> str:
    return next(k for k in (f"session-{i}" for i in range(1000)) if rank(k, ids)[0] == unique_id)


def test_killed_replica_fails_only_its_requests_and_the_service_goes_on(service):
    short = {"model": "model", "prompt": "hi", "max_tokens": 2, "temperature": 0}
    with ThreadPoolExecutor(8) as pool:
        replicas = set(pool.map(lambda _i: _replica_of(service, {**short, "max_tokens": 24, "min_tokens": 24}), range(8)))
    assert len(replicas) == 2
    victim, survivor = sorted(replicas)
    ids = [r.rsplit("#", 1)[1] for r in (victim, survivor)]
    doomed_key, safe_key = _key_for(ids[0], ids), _key_for(ids[1], ids)

    long = {"model": "model", "prompt": "The quick brown fox", "max_tokens": 600, "min_tokens": 600, "temperature": 0,
            "stream": True}
    doomed, safe = {}, {}
    doomed_started, safe_started = threading.Event(), threading.Event()
    threads = [threading.Thread(target=_stream, args=(service, long, {"x-calculet-session": doomed_key}, doomed, doomed_started)),
               threading.Thread(target=_stream, args=(service, {**long, "max_tokens": 150, "min_tokens": 150},
                                                      {"x-calculet-session": safe_key}, safe, safe_started))]
    for t in threads:
        t.start()
    assert doomed_started.wait(60) and safe_started.wait(60)
    assert doomed["replica"] == victim and safe["replica"] == survivor
    blocking = {}

    def non_stream():   # a non-streaming request in flight on the victim too
        r = httpx.post(service + "/v1/completions", json={**long, "stream": False}, headers={"x-calculet-session": doomed_key},
                       timeout=120)
        blocking["status"], blocking["body"] = r.status_code, r.json()

    waiter = threading.Thread(target=non_stream)
    waiter.start()
    time.sleep(0.5)   # let it reach the replica (its lanes: 2, this is the second)
    os.kill(_pid(victim), signal.SIGKILL)
    for t in (*threads, waiter):
        t.join(90)
        assert not t.is_alive(), "a request hung after its replica was killed"

    assert doomed["lines"][-1] == "[DONE]"
    error = json.loads(doomed["lines"][-2])["error"]
    assert error["code"] == "replica_unavailable" and error["type"] == "server_error"
    assert len(doomed["lines"]) < 600   # it was cut, not finished
    assert blocking["status"] == 503 and blocking["body"]["error"]["code"] == "replica_unavailable"
    assert safe["lines"][-1] == "[DONE]" and "error" not in safe["lines"][-2]
    assert json.loads(safe["lines"][-2])["choices"][0]["finish_reason"] == "length"

    deadline = time.monotonic() + 120   # new requests are answered (by the survivor, then the replacement too)
    answered = 0
    while answered < 4 and time.monotonic() < deadline:
        r = httpx.post(service + "/v1/completions", json=short, timeout=60)
        answered = answered + 1 if r.status_code == 200 else 0
    assert answered == 4


def test_rolling_update_fails_no_request(service, calbin):
    """Redeploying with a changed config replaces both replicas while requests (plain and streamed) keep coming;
    none fails. Runs after the kill test, so it also shows the service whole again."""
    failures, answered, stop = [], [], threading.Event()

    def load(streamed: bool):
        body = {"model": "model", "prompt": "Paris is", "max_tokens": 8, "temperature": 0, "stream": streamed}
        with httpx.Client(timeout=120) as c:
            while not stop.is_set():
                r = c.post(service + "/v1/completions", json=body)
                lines = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
                good = r.status_code == 200 and (not streamed or (lines[-1] == "[DONE]" and "error" not in r.text))
                (answered if good else failures).append((r.status_code, r.headers.get(HEADER), r.text[-300:]))

    before = {_replica_of(service, {"model": "model", "prompt": "hi", "max_tokens": 2}) for _ in range(4)}
    threads = [threading.Thread(target=load, args=(s,)) for s in (False, False, True)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        app = build_app(ServerConfig(model=str(calbin), max_queue=8),   # a new version: a changed server option
                        ReplicaOptions(replicas=2, num_cpus=1, affinity="session", graceful_shutdown_s=5))
        serve.run(app, name="calculet", route_prefix="/")
        time.sleep(2.0)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert not failures, failures[:3]
    after = {r[1] for r in answered[-6:]}
    assert answered and after and after.isdisjoint(before), (before, after)


def test_overload_gets_the_servers_429(service):
    """After the rolling update --max-queue is 8: 32 requests at once exceed what the replicas (2 x 4 ongoing) and
    the router's queue (8) hold; the rest get 429 queue_full with Retry-After (as from `calculet serve`), never a
    500 or a hang."""
    body = {"model": "model", "prompt": "The quick brown fox", "max_tokens": 64, "min_tokens": 64, "temperature": 0}
    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda _i: httpx.post(service + "/v1/completions", json=body, timeout=120), range(32)))
    statuses = sorted(r.status_code for r in answers)
    assert set(statuses) == {200, 429}, statuses
    refused = next(r for r in answers if r.status_code == 429)
    assert refused.json()["error"]["code"] == "queue_full" and refused.headers["retry-after"] == "1"
