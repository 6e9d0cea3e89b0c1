"""`calculet serve` takes a mixture-of-experts calbin like any other: the runtime, engine and server
need no MoE knowledge (tiny Qwen3-MoE, 8 lanes, default weight policy)."""

from __future__ import annotations

import asyncio

import pytest


PROMPTS = ["The quick brown fox", "Paris is the capital of", "def main():", "El rápido zorro marrón",
           "Static graphs run on", "the lazy dog", "東京は日本の首都です。", "return 42"]


@pytest.fixture(scope="module")
def moe_calbin(tiny_calbin):
    return tiny_calbin("qwen3_moe", lanes=8, context=128, chunks=(4, 16), weights="default")


@pytest.fixture(scope="module")
def server(moe_calbin, start_server):
    return start_server(moe_calbin)


def test_eight_concurrent_requests_share_decode_steps_and_equal_each_alone(server):
    client = server.client()
    body = {"ignore_eos": True, "return_token_ids": True}
    alone = [client.completions.create(model="model", prompt=p, max_tokens=16, temperature=0,
                                       extra_body=body).choices[0].model_extra["token_ids"] for p in PROMPTS]
    before = server.metrics()

    async def together():
        aclient = server.async_client()
        return await asyncio.gather(*(aclient.completions.create(model="model", prompt=p, max_tokens=16, temperature=0,
                                                                 extra_body=body) for p in PROMPTS))

    assert [r.choices[0].model_extra["token_ids"] for r in asyncio.run(together())] == alone
    after = server.metrics()
    rows = after['calculet_device_useful_tokens_total{kind="decode"}'] - before['calculet_device_useful_tokens_total{kind="decode"}']
    jobs = (after['calculet_device_phase_seconds_count{kind="decode",phase="infer"}']
            - before['calculet_device_phase_seconds_count{kind="decode",phase="infer"}'])
    assert rows / jobs > 2, "the requests did not share decode steps"


def test_chat_stream_equals_non_stream(server):
    client = server.client()
    messages = [{"role": "user", "content": "Paris is"}]
    full = client.chat.completions.create(model="model", messages=messages, max_tokens=12, temperature=0)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="model", messages=messages, max_tokens=12, temperature=0, stream=True) if c.choices)
    assert streamed == full.choices[0].message.content
