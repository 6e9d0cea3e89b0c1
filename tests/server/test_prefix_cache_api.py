"""The prefix cache seen from the API: `usage.prompt_tokens_details.cached_tokens` in chat and
completions (whole and streamed), the calculet_prefix_cache_* metrics, and `--no-prefix-cache`."""

from __future__ import annotations

import pytest

LONG = "The quick brown fox jumps over the lazy dog while the static graphs run on accelerators. " * 3


@pytest.fixture(scope="module")
def servers(tiny_calbin, start_server):
    calbin = tiny_calbin("llama", lanes=4, context=256, chunks=(4, 16))
    return {True: start_server(calbin), False: start_server(calbin, "--no-prefix-cache")}


def cached(usage) -> int:
    return usage.prompt_tokens_details.cached_tokens


def test_completions_report_cached_tokens_and_give_the_same_text(servers):
    texts = {}
    for on, server in servers.items():
        client = server.client()
        before = server.wait_idle()
        first = client.completions.create(model="model", prompt=LONG, max_tokens=6, temperature=0)
        second = client.completions.create(model="model", prompt=LONG + " And then", max_tokens=6, temperature=0)
        chunks = list(client.completions.create(model="model", prompt=LONG + " And so", max_tokens=6, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        streamed = chunks[-1].usage
        texts[on] = (first.choices[0].text, second.choices[0].text, "".join(c.choices[0].text for c in chunks if c.choices))
        m = server.wait_idle()
        delta = {k: m.get(k, 0) - before.get(k, 0) for k in m}
        assert cached(first.usage) == 0
        if on:
            assert 0 < cached(second.usage) < second.usage.prompt_tokens
            assert 0 < cached(streamed) < streamed.prompt_tokens
            assert delta["calculet_prefix_cache_hits_total"] == 2 and delta["calculet_prefix_cache_lookups_total"] == 3
            assert delta["calculet_prefix_cache_tokens_saved_total"] == cached(second.usage) + cached(streamed)
            assert m["calculet_lanes_warm"] >= 1 and m["calculet_lanes_free"] == 4
        else:
            assert cached(second.usage) == cached(streamed) == 0
            assert delta["calculet_prefix_cache_lookups_total"] == 0 and m["calculet_lanes_warm"] == 0
    assert texts[True] == texts[False]


def test_second_chat_turn_hits_the_first(servers):
    server = servers[True]
    client = server.client()
    history = [{"role": "user", "content": LONG}]
    first = client.chat.completions.create(model="model", messages=history, max_tokens=8, temperature=0)
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "Say it again."}]
    chunks = list(client.chat.completions.create(model="model", messages=history, max_tokens=8, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert cached(usage) >= first.usage.prompt_tokens - 1
    plain = servers[False].client().chat.completions.create(model="model", messages=history, max_tokens=8, temperature=0)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain.choices[0].message.content
    assert cached(plain.usage) == 0
