"""Configuration: flags and scenario files, validated with messages that say what to fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calculet.bench.config import AUTO_BUCKETS, build_config, read_scenario_file
from calculet.errors import RequestError

BASE = {"url": "http://127.0.0.1:1", "model": "m"}


def test_sweeps_and_labels():
    closed = build_config({**BASE, "concurrency": "1,8"})
    assert [l.label for l in closed.loads] == ["closed-c1", "closed-c8"]
    open_ = build_config({**BASE, "load": "gamma", "rate": [1, 2.5], "burstiness": 0.5, "max_concurrency": 4})
    assert [l.label for l in open_.loads] == ["gamma-r1-b0.5-cap4", "gamma-r2.5-b0.5-cap4"]
    assert build_config({**BASE, "rate": "3"}).loads[0].mode == "poisson"
    assert build_config({**BASE, "prompt_tokens": "auto"}).workload.prompt_tokens == AUTO_BUCKETS


def test_base_url_and_endpoint():
    config = build_config({**BASE, "url": "http://h:1/v1/", "api": "chat"})
    assert config.target.base_url == "http://h:1"
    assert config.target.endpoint == "http://h:1/v1/chat/completions"


@pytest.mark.parametrize("settings,code", [
    ({"url": "127.0.0.1:1", "model": "m"}, "bad_url"),
    ({"url": "http://h:1"}, "missing_model"),
    ({**BASE, "concurrency": "0"}, "bad_concurrency"),
    ({**BASE, "load": "poisson"}, "bad_rate"),
    ({**BASE, "load": "closed", "rate": "2"}, "bad_load"),
    ({**BASE, "rate": "2", "burstiness": 0.5}, "bad_burstiness"),
    ({**BASE, "prompt_tokens": "0"}, "bad_prompt_tokens"),
    ({**BASE, "output_tokens": -1}, "bad_output_tokens"),
    ({**BASE, "requests": 0}, "bad_requests"),
    ({**BASE, "prompts": "/nonexistent.jsonl"}, "missing_prompts"),
    ({**BASE, "colour": "red"}, "bad_scenario"),
    ({**BASE, "concurrency": "x"}, "bad_value"),
])
def test_bad_settings(settings: dict, code: str):
    with pytest.raises(RequestError) as caught:
        build_config(settings)
    assert caught.value.code == code


def test_scenario_file_json_and_toml(tmp_path: Path):
    (tmp_path / "s.json").write_text(json.dumps({"max-concurrency": 2, "rate": [1]}))
    assert read_scenario_file(tmp_path / "s.json") == {"max_concurrency": 2, "rate": [1]}
    (tmp_path / "s.toml").write_text('concurrency = [1, 8]\noutput_tokens = 64\n')
    assert read_scenario_file(tmp_path / "s.toml") == {"concurrency": [1, 8], "output_tokens": 64}
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(RequestError, match="not valid json"):
        read_scenario_file(tmp_path / "bad.json")


def test_auto_buckets_need_a_context():
    from calculet.bench.workload import plan_phases

    config = build_config({**BASE, "prompt_tokens": "auto", "output_tokens": 100})
    with pytest.raises(RequestError, match="give --max-context"):
        plan_phases(config, counter=None, context=None)


def test_buckets_beyond_the_context_are_dropped_with_a_note():
    from calculet.bench.workload import plan_phases

    class Words:
        source = "words"

        def count(self, text: str) -> int:
            return len(text.split())

    config = build_config({**BASE, "prompt_tokens": "auto", "output_tokens": 100, "requests": 1, "warmup": 0})
    _, phases, notes = plan_phases(config, Words(), context=1200)
    assert [p.scenario for p in phases] == ["closed-c1/p1/o100", "closed-c1/p16/o100", "closed-c1/p256/o100",
                                            "closed-c1/p1024/o100"]
    assert "2048" in notes[0] and "context of 1200 tokens" in notes[0]
    assert len(phases[-1].prompts[0].text.split()) == 1024
