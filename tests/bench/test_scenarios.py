"""`calculet bench scenario long-prompt | multi-turn` and `ttft-plot`, smoke-tested against real
`calculet serve` processes on a tiny model (prefix cache on and off). Nothing is timed."""

from __future__ import annotations

import json

import pytest

from calculet.bench.scenarios import ScenarioConfig, long_prompt_buckets, plot_ttft, read_series, run_scenario, ttft_table
from calculet.errors import RequestError
from serving import Server


@pytest.fixture(scope="module")
def servers(tiny_calbin, tmp_path_factory):
    calbin = tiny_calbin("llama", lanes=4, context=256, chunks=(4, 16))
    started = {on: Server(calbin, tmp_path_factory.mktemp("serve") / "server.log", *(() if on else ("--no-prefix-cache",)))
               for on in (True, False)}
    try:
        yield {on: s.wait_ready(60) for on, s in started.items()}
    finally:
        for s in started.values():
            s.stop()


def test_buckets_stay_below_the_context():
    assert long_prompt_buckets(1024, 48, None) == [128, 256, 512, 968]
    assert long_prompt_buckets(1024, 48, (100, 2000)) == [100]
    assert long_prompt_buckets(None, 48, (300, 100)) == [100, 300]
    with pytest.raises(RequestError, match="--max-context"):
        long_prompt_buckets(None, 48, None)
    with pytest.raises(RequestError, match="allowed: long-prompt, multi-turn"):
        ScenarioConfig("chat", "http://x", "m", None)


def test_multi_turn_resends_history_and_sees_cache_hits(servers, tmp_path):
    runs = []
    for on, server in servers.items():
        out = tmp_path / ("on" if on else "off")
        config = ScenarioConfig("multi-turn", server.url + "/v1", "model", out, label=f"cache {'on' if on else 'off'}",
                                output_tokens=6, turns=3, words=8, conversations=2)
        rows = [json.loads(line) for line in run_scenario(config, log=lambda _m: None).read_text().splitlines()]
        assert [(r["conversation"], r["x"]) for r in rows] == [(c, t) for c in (0, 1) for t in (1, 2, 3)]
        assert all(r["status"] == "ok" and r["ttft_ms"] is not None for r in rows)
        prompts = [r["prompt_tokens"] for r in rows]
        assert prompts[0] < prompts[1] < prompts[2]          # each turn resends the history
        later = [r["cached_tokens"] for r in rows if r["x"] > 1]
        assert all(c > 0 for c in later) if on else all(c == 0 for c in later)
        runs.append(out)
    png = plot_ttft(runs, tmp_path / "turns.png")
    assert png.stat().st_size > 1000
    table = ttft_table([read_series(r) for r in runs])
    assert "| turn | cache on | cache off |" in table and table.count("\n") == 4


def test_long_prompt_buckets_against_our_server(servers, tmp_path):
    server = servers[True]
    config = ScenarioConfig("long-prompt", server.url, "model", tmp_path / "long", output_tokens=4, buckets=(16, 64),
                            repeats=2)
    rows = [json.loads(line) for line in run_scenario(config, log=lambda _m: None).read_text().splitlines()]
    assert [r["x"] for r in rows] == [16, 16, 64, 64] and all(r["status"] == "ok" for r in rows)
    # exact lengths by the server's /tokenize (+ the BOS the server adds)
    assert {r["prompt_tokens"] - r["x"] for r in rows} <= {0, 1}
    assert plot_ttft([tmp_path / "long"], tmp_path / "long.png").exists()
