"""/metrics totals against the usage the clients were told, and stop strings that straddle a token
boundary in n=2 streams (issue 15, point 6)."""

from __future__ import annotations

import pytest

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def server(tiny_calbin, start_server):
    return start_server(tiny_calbin("llama", lanes=8, context=128, chunks=(4, 16)))


def test_metrics_totals_equal_the_sums_of_usage(server):
    client = server.client()
    before = server.wait_idle()
    prompt_sum = completion_sum = 0
    for i in range(3):
        r = client.completions.create(model="model", prompt=f"{PROMPT} {i}", max_tokens=5 + i, temperature=0)
        prompt_sum += r.usage.prompt_tokens
        completion_sum += r.usage.completion_tokens
    r = client.completions.create(model="model", prompt=PROMPT, max_tokens=6, n=2, temperature=1.0, seed=3,
                                  extra_body={"ignore_eos": True})
    prompt_sum += r.usage.prompt_tokens
    completion_sum += r.usage.completion_tokens
    chat = client.chat.completions.create(model="model", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    prompt_sum += chat.usage.prompt_tokens
    completion_sum += chat.usage.completion_tokens
    chunks = list(client.completions.create(model="model", prompt=PROMPT, max_tokens=7, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    prompt_sum += chunks[-1].usage.prompt_tokens
    completion_sum += chunks[-1].usage.completion_tokens
    after = server.wait_idle()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert delta["calculet_generation_tokens_total"] == completion_sum
    assert delta["calculet_prompt_tokens_total"] == prompt_sum
    finished = sum(v for k, v in delta.items() if k.startswith("calculet_requests_total{"))
    assert finished == 6


def test_n2_stream_stop_string_straddling_a_token_boundary(server):
    """The stop string is the last character of one token's text and the first of the next: neither
    token alone contains it, the detokenizer must hold text back across the boundary, for each of two
    choices streamed at once."""
    client = server.client()
    full = client.completions.create(model="model", prompt=PROMPT, max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True, "return_token_ids": True}).choices[0]
    ids = full.model_extra["token_ids"]
    text = full.text
    bounds = [len(server.post("/detokenize", {"tokens": ids[:i]}).json()["prompt"]) for i in range(1, len(ids))]
    stop = next((text[b - 1:b + 1] for b in bounds if 0 < b < len(text) and text.index(text[b - 1:b + 1]) == b - 1
                 and text[b - 1:b + 1].strip()), None)
    assert stop is not None, (text, bounds)
    expected = text[:text.index(stop)]
    chunks = list(client.completions.create(model="model", prompt=PROMPT, max_tokens=24, temperature=0, n=2, stop=[stop],
                                            stream=True, extra_body={"ignore_eos": True}))
    streamed = {0: "", 1: ""}
    finish = {}
    for c in chunks:
        for choice in c.choices:
            streamed[choice.index] += choice.text
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert streamed == {0: expected, 1: expected} and finish == {0: "stop", 1: "stop"}
    assert server.wait_idle()["calculet_lanes_in_use"] == 0
