"""Several models in one server (server/host.py, server/placement.py) and their lifecycle while serving
(server/admin.py), on real server processes with tiny random Llamas of different seeds.

Solo answers come from `calculet.LLM` on the same calbin, alone in its own process-local engine.
Synchronization: a stream runs once its first event is read; an unload has begun once /health lists
the model as "unloading". No sleep decides an outcome."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import tiny_models
from calculet import LLM, SamplingParams

KEY = "admin-secret"
PROMPTS = ["The quick brown fox", "hello world", "a b c d", "Paris is", "def main():", "once upon"]
MAX_TOKENS = 8


def _compile(tmp_path_factory, seed: int):
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions

    folder = tiny_models.make_tiny_model("llama", tmp_path_factory.mktemp(f"hf-seed{seed}"), seed=seed)
    out = tmp_path_factory.mktemp(f"calbin-seed{seed}") / "model.calbin"
    return compile_calbin(str(folder), out, CompileOptions(lanes=4, context=64, prefill_chunks=(4, 16), golden=False),
                          log=lambda _m: None)


@pytest.fixture(scope="module")
def calbins(tmp_path_factory):
    """Three tiny Llamas that differ only in their random weights: a, b, and a's next version."""
    return {name: _compile(tmp_path_factory, seed) for name, seed in (("a", 1), ("b", 2), ("a2", 3))}


@pytest.fixture(scope="module")
def solo(calbins):
    """{calbin name: [greedy token ids per prompt]} from each model alone."""
    answers = {}
    for name, path in calbins.items():
        with LLM(str(path)) as llm:
            outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))
            answers[name] = [list(o.outputs[0].token_ids) for o in outs]
    return answers


@pytest.fixture(scope="module")
def server(calbins, slow_calbin, start_server):
    """a on chip 0, b and slow on chip 1."""
    models = tmp_models_toml(calbins, slow_calbin)
    return start_server([], "--models", str(models), "--chips", "2", "--admin-key", KEY, "--drain-timeout", "120")


def tmp_models_toml(calbins, slow_calbin):
    path = calbins["a"].parent.parent / "models.toml"
    path.write_text(f'''
[[model]]
name = "a"
calbin = "{calbins['a']}"
chips = [0]

[[model]]
name = "b"
calbin = "{calbins['b']}"
chips = [1]
max_queue = 16
chat_template = "chatml"

[[model]]
name = "slow"
calbin = "{slow_calbin}"
chips = [1]
''')
    return path


def wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def admin_headers() -> dict:
    return {"Authorization": f"Bearer {KEY}"}


def complete(server, model: str | None, prompt: str) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    if model is not None:
        body["model"] = model
    return server.post("/v1/completions", body)


def token_ids(r: httpx.Response) -> list[int]:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def test_models_lists_every_model_and_unknown_names_get_404_with_the_served_names(server):
    data = server.get("/v1/models").json()["data"]
    assert [m["id"] for m in data] == ["a", "b", "slow"]
    assert [m["max_model_len"] for m in data] == [64, 64, 1024]
    r = complete(server, "gpt-4", "hi")
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and err["type"] == "invalid_request_error"
    assert "'a'" in err["message"] and "'b'" in err["message"] and "'slow'" in err["message"]
    assert server.get("/v1/models/b").json()["id"] == "b"


def test_two_models_under_concurrent_load_give_their_solo_answers(server, solo):
    jobs = [(model, i) for _ in range(3) for i in range(len(PROMPTS)) for model in ("a", "b")]
    with ThreadPoolExecutor(12) as pool:
        got = list(pool.map(lambda job: token_ids(complete(server, job[0], PROMPTS[job[1]])), jobs))
    for (model, i), ids in zip(jobs, got):
        assert ids == solo[model][i], (model, PROMPTS[i])
    assert solo["a"] != solo["b"]   # the seeds differ, so routing to the wrong model would show
    # a request that names no model goes to the first one
    assert token_ids(complete(server, None, PROMPTS[0])) == solo["a"][0]


def test_each_model_has_its_own_chat_template(server):
    messages = [{"role": "user", "content": "hi"}]
    texts = {}
    for model in ("a", "b"):
        ids = server.post("/tokenize", {"model": model, "messages": messages}).json()["tokens"]
        texts[model] = server.post("/detokenize", {"model": model, "tokens": ids}).json()["prompt"]
    assert "<user>hi" in texts["a"] and "im_start" not in texts["a"]     # the tiny model's own template
    assert "im_start" in texts["b"] and "user" in texts["b"]  # chat_template = "chatml" in models.toml


def test_each_model_has_its_own_metrics_series(server):
    before = server.all_metrics()
    for _ in range(2):
        token_ids(complete(server, "a", "hi"))
    token_ids(complete(server, "b", "hi"))
    after = server.wait_idle(model="b")
    m = server.all_metrics()

    def grew(key):
        return m.get(key, 0) - before.get(key, 0)

    assert grew('calculet_requests_total{model="a",outcome="length"}') == 2
    assert grew('calculet_requests_total{model="b",outcome="length"}') == 1
    assert grew('calculet_generation_tokens_total{model="a"}') == 2 * MAX_TOKENS
    assert m['calculet_lanes_total{model="a"}'] == 4 and m['calculet_lanes_total{model="slow"}'] == 2
    assert m['calculet_healthy{model="b"}'] == 1 and after["calculet_lanes_in_use"] == 0


def test_admin_cli_lists_and_refuses_without_the_key(server, capsys):
    from calculet.cli import main

    assert main(["admin", "list", "--url", server.url, "--key", KEY]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["id"] for m in listed["data"]] == ["a", "b", "slow"]
    assert main(["admin", "unload", "a", "--url", server.url, "--key", "wrong"]) == 2
    assert "unauthorized" in capsys.readouterr().err
    assert main(["admin", "unload", "nope", "--url", server.url, "--key", KEY]) == 2
    assert "model_not_found" in capsys.readouterr().err


def test_admin_endpoints_need_the_key(server, calbins):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        for method, path in (("GET", "/admin/models"), ("DELETE", "/admin/models/a"), ("POST", "/admin/models/a/reload"),
                             ("POST", "/admin/models")):
            r = httpx.request(method, server.url + path, headers=headers, json={"source": str(calbins["a2"])}, timeout=30)
            assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", (method, path, r.text)
    assert [m["id"] for m in server.get("/v1/models").json()["data"]] == ["a", "b", "slow"]   # nothing happened
    listed = httpx.get(server.url + "/admin/models", headers=admin_headers(), timeout=30).json()
    assert {m["id"]: m["chips"] for m in listed["data"]} == {"a": [0], "b": [1], "slow": [1]}
    assert [c["index"] for c in listed["chips"]] == [0, 1]
    assert listed["chips"][1]["memory_used"] == sum(m["memory_bytes"] for m in listed["data"] if m["chips"] == [1])


def test_reload_under_load_fails_no_request_and_then_answers_from_the_new_version(server, calbins, solo):
    stop = threading.Event()
    results: list[tuple[float, int, list[int] | str]] = []   # (sent at, prompt index, token ids or the error)

    def hammer(i: int):
        while not stop.is_set():
            sent = time.monotonic()
            r = complete(server, "a", PROMPTS[i % len(PROMPTS)])
            results.append((sent, i % len(PROMPTS), r.json()["choices"][0]["token_ids"] if r.status_code == 200 else r.text))

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: len(results) >= 8)     # load is flowing before the reload starts
    r = httpx.post(server.url + "/admin/models/a/reload", json={"source": str(calbins["a2"])}, headers=admin_headers(),
                   timeout=120)
    switched = time.monotonic()
    seen_during = len(results)
    wait_for(lambda: len(results) >= seen_during + 8)   # and goes on after it
    stop.set()
    for t in threads:
        t.join(60)
    assert r.status_code == 200, r.text
    assert r.json()["root"] == str(calbins["a2"])
    failed = [res for _, _, res in results if isinstance(res, str)]
    assert not failed, failed[:3]
    for _, i, ids in results:   # every answer is one version's solo answer, and those sent after the switch the new one's
        assert ids in (solo["a"][i], solo["a2"][i])
    after = [(i, ids) for sent, i, ids in results if sent > switched]
    assert after and all(ids == solo["a2"][i] for i, ids in after)
    assert any(ids == solo["a"][i] and ids != solo["a2"][i] for _, i, ids in results)   # the old version served first
    assert token_ids(complete(server, "a", PROMPTS[1])) == solo["a2"][1]
    assert server.get("/v1/models/a").json()["root"] == str(calbins["a2"])


def test_a_reload_that_cannot_load_keeps_the_old_version_serving(server, tmp_path, solo):
    root = server.get("/v1/models/b").json()["root"]
    r = httpx.post(server.url + "/admin/models/b/reload", json={"source": str(tmp_path / "missing.calbin")},
                   headers=admin_headers(), timeout=60)
    assert r.status_code >= 400 and "missing.calbin" in r.json()["error"]["message"], r.text
    assert server.get("/v1/models/b").json()["root"] == root
    assert token_ids(complete(server, "b", PROMPTS[3])) == solo["b"][3]


def _health_says(server, model: str, status: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = httpx.get(server.url + "/health", timeout=5).json()
        if any(m["model"] == model and m["status"] == status for m in body.get("models", [])):
            return
        time.sleep(0.01)
    raise AssertionError(f"/health never listed {model} as {status}: {body}")


def test_unload_drains_the_model_while_the_others_serve(server, solo):
    client = httpx.Client(timeout=120)
    cm = client.stream("POST", server.url + "/v1/completions",
                       json={"model": "slow", "prompt": "The quick brown fox", "stream": True, "max_tokens": 300,
                             "temperature": 0, "ignore_eos": True})
    response = cm.__enter__()
    assert response.status_code == 200
    lines = response.iter_lines()
    assert next(line for line in lines if line).startswith("data: {")   # the stream holds a lane now
    done = {}
    unloader = threading.Thread(target=lambda: done.setdefault(
        "r", httpx.delete(server.url + "/admin/models/slow", headers=admin_headers(), timeout=120)))
    unloader.start()
    _health_says(server, "slow", "unloading")
    refused = complete(server, "slow", "hi")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_unloading"
    assert refused.headers["retry-after"]
    assert token_ids(complete(server, "b", PROMPTS[2])) == solo["b"][2]   # chip 1's other model is unaffected
    frames = [line.removeprefix("data: ") for line in lines if line]
    cm.__exit__(None, None, None)
    client.close()
    unloader.join(120)
    assert frames[-1] == "[DONE]"
    last = json.loads(frames[-2])
    assert "error" not in last and last["choices"][0]["finish_reason"] == "length"
    assert done["r"].status_code == 200 and done["r"].json()["deleted"] is True
    assert [m["id"] for m in server.get("/v1/models").json()["data"]] == ["a", "b"]
    assert complete(server, "slow", "hi").status_code == 404
    listed = httpx.get(server.url + "/admin/models", headers=admin_headers(), timeout=30).json()
    assert listed["chips"][1]["memory_used"] == next(m["memory_bytes"] for m in listed["data"] if m["id"] == "b")
    assert 'calculet_lanes_total{model="slow"}' not in server.all_metrics()


def test_a_model_over_the_chip_budget_is_refused_with_the_numbers_and_the_others_serve(calbins, slow_calbin, solo,
                                                                                    start_server):
    from calculet.calbin.manifest import read_manifest
    from calculet.server.placement import plan_bytes

    small = plan_bytes(read_manifest(calbins["a"]).memory_plan)["total"]
    big = plan_bytes(read_manifest(slow_calbin).memory_plan)
    budget = small + (big["total"] - small) // 2 if big["total"] > 2 * small else 2 * small
    assert small <= budget < big["total"]
    server = start_server([f"a={calbins['a']}", f"big={slow_calbin}"], "--chip-memory", str(budget),
                          "--admin-key", KEY)
    assert [m["id"] for m in server.get("/v1/models").json()["data"]] == ["a"]
    assert token_ids(complete(server, "a", PROMPTS[0])) == solo["a"][0]
    refused = httpx.get(server.url + "/health", timeout=5).json()["not_loaded"]["big"]
    assert "model_does_not_fit" in refused and str(big["total"]) in refused and str(budget) in refused
    r = httpx.post(server.url + "/admin/models", json={"name": "big", "calbin": str(slow_calbin)}, headers=admin_headers(),
                   timeout=60)
    assert r.status_code == 507
    message = r.json()["error"]["message"]
    for number in (big["weights"], big["kv"], big["total"], budget, small):
        assert f"({number} bytes)" in message, message
    assert "chip 0" in message and "--chip-memory" in message
    assert token_ids(complete(server, "a", PROMPTS[1])) == solo["a"][1]
    # a second small one still fits beside a, on the same chip, with its own engine
    r = httpx.post(server.url + "/admin/models", json={"name": "b", "calbin": str(calbins["b"])}, headers=admin_headers(),
                   timeout=60)
    if 2 * small <= budget:
        assert r.status_code == 200, r.text
        assert token_ids(complete(server, "b", PROMPTS[1])) == solo["b"][1]
    else:
        assert r.status_code == 507


@pytest.mark.slow
def test_default_model_and_a_tiny_one_on_separate_chips_give_their_solo_answers(served_default_calbin, calbins, solo,
                                                                                start_server):
    prompts = PROMPTS[:3]
    with LLM(str(served_default_calbin)) as llm:
        outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))
        default_solo = [list(o.outputs[0].token_ids) for o in outs]
    server = start_server([f"default={served_default_calbin}", f"tiny={calbins['a']}"], "--chips", "2", timeout=300)
    jobs = [(model, i) for _ in range(2) for i in range(len(prompts)) for model in ("default", "tiny")]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda job: token_ids(complete(server, job[0], prompts[job[1]])), jobs))
    for (model, i), ids in zip(jobs, got):
        assert ids == (default_solo[i] if model == "default" else solo["a"][i]), (model, prompts[i])
    chat = server.post("/v1/chat/completions", {"model": "default", "messages": [{"role": "user", "content": "Hi"}],
                                                "max_tokens": 4})
    assert chat.status_code == 200, chat.text   # the default model chats out of the box (Gemma's template)
