"""The OpenAI API of `calculet serve` on a tiny model (8 lanes): one server per execution provider.

Nothing here depends on the provider, so every test runs on each one present: the CPU provider (a
cpu-target calbin) and, where onnxruntime-openvino is installed (.ci/run-openvino), OpenVINO (the same
model compiled --target portable, served with --provider openvino).
"""

from __future__ import annotations

import asyncio
import random

import onnxruntime as ort
import openai
import pytest

PROMPTS = ["The quick brown fox", "Paris is the capital of", "def main():", "El rápido zorro marrón",
           "Static graphs run on", "the lazy dog", "東京は日本の首都です。", "return 42"]


PROVIDERS = ["cpu"] + (["openvino"] if "OpenVINOExecutionProvider" in ort.get_available_providers() else [])


@pytest.fixture(scope="module", params=PROVIDERS)
def server(request, tiny_calbin, start_server):
    if request.param == "cpu":
        return start_server(tiny_calbin("llama", lanes=8, context=128, chunks=(4, 16)))
    calbin = tiny_calbin("llama", lanes=8, context=128, chunks=(4, 16), target="portable")
    return start_server(calbin, "--provider", request.param, timeout=180)


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def greedy(client, prompt, max_tokens=16, **kw):
    return client.completions.create(model="model", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                     extra_body={"return_token_ids": True, **kw.pop("extra_body", {})}, **kw)


def test_models_health_openapi(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == ["model"]
    health = server.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    paths = server.get("/openapi.json").json()["paths"]
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/tokenize",
            "/detokenize"} <= set(paths)


def test_completion_stream_equals_non_stream(client):
    whole = greedy(client, "The quick brown fox", max_tokens=24, extra_body={"ignore_eos": True})
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 24
    assert whole.usage.prompt_tokens > 0 and "server_timings" in whole.usage.model_extra
    chunks = list(client.completions.create(model="model", prompt="The quick brown fox", max_tokens=24, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == 24
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]


def test_chat_stream_and_non_stream(client):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Paris is"}]
    whole = client.chat.completions.create(model="model", messages=messages, max_tokens=12, temperature=0)
    assert whole.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model="model", messages=messages, max_tokens=12, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_timings_header(server):
    r = server.post("/v1/completions", {"prompt": "hello", "max_tokens": 4, "temperature": 0})
    t = r.json()["usage"]["server_timings"]
    assert r.headers["x-calculet-timings"] and "queue;dur=" in r.headers["server-timing"]
    assert t["total_s"] >= t["queue_s"] >= 0 and t["arrived_unix"] > 1e9


def test_stop_strings_cut_and_are_not_emitted(client):
    """The reply stops right before the first stop string, streamed or not, and never shows it."""
    full = greedy(client, "The quick brown fox", max_tokens=32, extra_body={"ignore_eos": True}).choices[0].text
    assert len(full) > 6
    stop = full[3:5]               # certainly occurs; the output must end before its first occurrence
    expected = full[:full.index(stop)]
    cut = greedy(client, "The quick brown fox", max_tokens=32, stop=[stop], extra_body={"ignore_eos": True})
    assert cut.choices[0].text == expected and cut.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="model", prompt="The quick brown fox", max_tokens=32, temperature=0, stop=stop, stream=True,
        extra_body={"ignore_eos": True}))
    assert streamed == expected


def test_stop_token_ids_and_min_tokens(client):
    first = greedy(client, "def main():", max_tokens=8, extra_body={"ignore_eos": True})
    token_ids = first.choices[0].model_extra["token_ids"]
    stopped = greedy(client, "def main():", max_tokens=8, extra_body={"stop_token_ids": [token_ids[2]], "ignore_eos": True})
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].model_extra["token_ids"] == token_ids[:token_ids.index(token_ids[2]) + 1]
    held = greedy(client, "def main():", max_tokens=8, extra_body={"stop_token_ids": [token_ids[0]], "min_tokens": 8})
    assert held.usage.completion_tokens == 8 and held.choices[0].finish_reason == "length"


def test_logprobs_completion_and_chat(client):
    r = greedy(client, "Paris is", max_tokens=5, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 3 and chosen <= 0 and abs(max(top.values()) - chosen) < 1e-5   # greedy: the top one
    chat = client.chat.completions.create(model="model", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                          temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 2 for c in content)


def test_seed_reproducible_and_n_choices(client):
    def sample(seed):
        return client.completions.create(model="model", prompt="The quick", max_tokens=16, temperature=1.0,
                                         seed=seed, n=3, extra_body={"ignore_eos": True, "top_k": 50})
    a, b, c = sample(7), sample(7), sample(8)
    texts = lambda r: [ch.text for ch in sorted(r.choices, key=lambda ch: ch.index)]  # noqa: E731
    assert texts(a) == texts(b)
    assert texts(a) != texts(c)
    assert len(set(texts(a))) > 1          # the n choices differ
    assert a.usage.completion_tokens == 48


def test_echo_and_token_prompt(server, client):
    ids = server.post("/tokenize", {"prompt": "the lazy dog"}).json()["tokens"]
    assert server.post("/detokenize", {"tokens": ids}).json()["prompt"] == "the lazy dog"
    by_text = greedy(client, "the lazy dog", max_tokens=6)
    by_ids = greedy(client, ids, max_tokens=6)
    assert by_ids.choices[0].text == by_text.choices[0].text
    echoed = greedy(client, "the lazy dog", max_tokens=6, echo=True)
    assert echoed.choices[0].text == "the lazy dog" + by_text.choices[0].text


def test_eight_concurrent_equal_alone(server, client):
    """Continuous batching must not change greedy tokens: 8 at once equal each one alone."""
    alone = [greedy(client, p, max_tokens=20, extra_body={"ignore_eos": True}).choices[0].model_extra["token_ids"]
             for p in PROMPTS]
    before = server.metrics()

    async def together():
        aclient = server.async_client()
        return await asyncio.gather(*(aclient.completions.create(
            model="model", prompt=p, max_tokens=20, temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True})
            for p in PROMPTS))

    batched = [r.choices[0].model_extra["token_ids"] for r in asyncio.run(together())]
    assert batched == alone
    after = server.metrics()
    rows = after['calculet_device_useful_tokens_total{kind="decode"}'] - before['calculet_device_useful_tokens_total{kind="decode"}']
    jobs = (after['calculet_device_phase_seconds_count{kind="decode",phase="infer"}']
            - before['calculet_device_phase_seconds_count{kind="decode",phase="infer"}'])
    assert rows / jobs > 2, "the requests did not share decode steps"


@pytest.mark.parametrize("body, field", [
    ({"temperature": 500}, "temperature"), ({"temperature": "hot"}, "temperature"), ({"top_p": 0}, "top_p"),
    ({"top_k": -1}, "top_k"), ({"min_p": 2}, "min_p"), ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"), ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 1.5}, "max_tokens"), ({"n": 0}, "n"), ({"n": 9}, "n"),
    ({"logprobs": 21}, "logprobs"), ({"seed": -1}, "seed"), ({"stop": 3}, "stop"), ({"min_tokens": 50, "max_tokens": 4}, "min_tokens"),
    ({"stream": "yes"}, "stream"), ({"prompt": [1, "a"]}, "prompt"),
])
def test_bad_parameters_400_then_normal(server, client, body, field):
    r = server.post("/v1/completions", {"prompt": "hi", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == field and field in err["message"]
    assert greedy(client, "hi", max_tokens=2).choices[0].text is not None


def test_overlong_prompt_and_context_400(server, client):
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 40
    r = server.post("/v1/completions", {"prompt": long_prompt, "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["code"] == "prompt_too_long"
    n_prompt = len(server.post("/tokenize", {"prompt": "hello"}).json()["tokens"])
    r = server.post("/v1/completions", {"prompt": "hello", "max_tokens": 200})
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded"
    assert f"{n_prompt} tokens" in err["message"] and "max_tokens is 200" in err["message"] and "128" in err["message"]
    omitted = server.post("/v1/completions", {"prompt": "hello", "temperature": 0, "ignore_eos": True}).json()
    assert omitted["usage"]["completion_tokens"] == 128 - n_prompt      # clamped to what fits
    assert greedy(client, "hi", max_tokens=2).choices[0].text is not None


def test_unknown_model_404_unknown_fields_ignored(server, client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    r = server.post("/v1/completions", {"prompt": "hi", "max_tokens": 2, "frobnicate": {"x": 1}, "user": "u1"})
    assert r.status_code == 200


def test_fifty_streams_cut_early_free_their_lanes(server):
    """Closing streams early must give every lane back (regression guard for leaked lanes)."""
    rng = random.Random(0)

    async def one(aclient, i):
        stream = await aclient.completions.create(model="model", prompt=PROMPTS[i % 8], max_tokens=100, temperature=0,
                                                  stream=True, extra_body={"ignore_eos": True})
        keep = rng.randint(0, 30)
        seen = 0
        async for _chunk in stream:
            seen += 1
            if seen >= keep:
                break
        await stream.close()

    async def run():
        aclient = server.async_client()
        await asyncio.gather(*(one(aclient, i) for i in range(50)))

    asyncio.run(run())
    m = server.wait_idle(timeout=5)
    assert m["calculet_lanes_in_use"] == 0 and m["calculet_lanes_free"] == 8
    assert m["calculet_requests_running"] == 0 and m["calculet_requests_waiting"] == 0
    assert m.get('calculet_requests_total{outcome="cancelled"}', 0) > 0


def test_metrics_exposition(server):
    text = server.get("/metrics").text
    for name in ("calculet_requests_running", "calculet_requests_waiting", "calculet_lanes_in_use", "calculet_lanes_free",
                 "calculet_prompt_tokens_total", "calculet_generation_tokens_total", "calculet_request_queue_seconds_bucket",
                 "calculet_time_to_first_token_seconds_bucket", "calculet_inter_token_latency_seconds_bucket",
                 "calculet_e2e_request_latency_seconds_bucket", "calculet_device_phase_seconds_bucket",
                 "calculet_sampling_seconds_bucket", "calculet_device_padding_efficiency"):
        assert f"\n{name}" in text, name
    m = server.metrics()
    assert 0 < m['calculet_device_padding_efficiency{kind="prefill"}'] <= 1
    assert m['calculet_device_phase_seconds_bucket{kind="decode",le="+Inf",phase="infer"}'] > 0


@pytest.mark.parametrize("body, field", [
    ({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 30}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages.0.content"),
    ({"messages": [{"role": "user"}], "max_completion_tokens": 0}, "max_completion_tokens"), ({"messages": "hi"}, "messages"),
])
def test_chat_bad_parameters_400(server, body, field):
    r = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field, r.text
