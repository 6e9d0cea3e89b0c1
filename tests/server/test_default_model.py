"""`calculet serve` on the default model (Gemma 3 270M, 8 lanes, a real 262k tokenizer).

Kept short: this model decodes some tokens per second on a shared CPU, so max_tokens stays small.
Skipped while the GGUF reader is missing.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "The three primary colors are",
           "Water boils at", "My favourite fruit is", "In 1969, the first", "The quick brown fox"]


@pytest.fixture(scope="module")
def server(served_default_calbin, start_server):
    return start_server(served_default_calbin, "--served-model-name", "model", timeout=300)


def token_ids(response) -> list[int]:
    return response.choices[0].model_extra["token_ids"]


def test_eight_concurrent_equal_alone(server):
    """8 greedy requests decoded together give exactly the tokens each gives alone."""
    client = server.client()
    body = {"model": "model", "max_tokens": 6, "temperature": 0, "extra_body": {"ignore_eos": True, "return_token_ids": True}}
    alone = [token_ids(client.completions.create(prompt=p, **body)) for p in PROMPTS]

    async def together():
        aclient = server.async_client()
        return await asyncio.gather(*(aclient.completions.create(prompt=p, **body) for p in PROMPTS))

    assert [token_ids(r) for r in asyncio.run(together())] == alone


def test_cjk_and_emoji_stream_equals_non_stream(server):
    """A real tokenizer splits rare CJK characters into byte pieces (here every output character is
    4 byte tokens): the stream must never send half a character, and its deltas must add up to the
    non-streamed text."""
    client = server.client()
    body = {"model": "model", "prompt": "東京 🗼 𠀀𠀁𠀂𠀃𠀄𠀅𠀆", "max_tokens": 16, "temperature": 0}
    whole = client.completions.create(**body).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **body))
    deltas = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert "".join(deltas) == whole
    assert whole and "\ufffd" not in whole and all("\ufffd" not in d for d in deltas)
    assert any(ord(ch) > 0xFFFF for ch in whole)                  # 4-byte characters were generated
    assert len(deltas) < chunks[-1].usage.completion_tokens      # so some tokens carried no whole character


def test_chat_works_out_of_the_box_with_gemmas_template(server):
    """Guards issue 12: the default GGUF has no chat template, and an OpenAI chat client's first request
    got a 400. The built-in Gemma template now applies, and the model's end-of-turn token ends the answer."""
    client = server.client()
    messages = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model="model", messages=messages, max_tokens=24, temperature=0)
    tokens = server.post("/tokenize", {"model": "model", "messages": messages}).json()["tokens"]
    assert tokens[:2] == [2, 105] and tokens[-3:] == [105, 4368, 107]   # <bos><start_of_turn> ... <start_of_turn>model\n
    assert r.usage.prompt_tokens == len(tokens)
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.content.strip()
    assert "<end_of_turn>" not in r.choices[0].message.content
    assert client.completions.create(model="model", prompt="Hi", max_tokens=1).usage.completion_tokens == 1
