"""`calculet run` on mixture-of-experts calbins, and its expert load report (--expert-stats)."""

from __future__ import annotations

import re

import pytest

from calculet.cli import main
from calculet.compiler.compile import compile_calbin
from calculet.compiler.options import CompileOptions


def test_run_streams_a_moe_calbin(tiny_calbin, capsys):
    assert main(["run", str(tiny_calbin("qwen3_moe")), "The quick brown fox", "--max-tokens", "12"]) == 0
    _, err = capsys.readouterr()
    assert re.search(r"\[prompt tokens \d+ \| generated \d+ \((stop|length)\)", err), err


@pytest.fixture(scope="module")
def stats_calbin(tiny_model_dir, tmp_path_factory):
    return compile_calbin(str(tiny_model_dir("qwen3_moe")), tmp_path_factory.mktemp("stats") / "m.calbin",
                          CompileOptions(lanes=2, context=64, prefill_chunks=(4, 16), golden=False, expert_stats=True),
                          log=lambda _m: None)


def test_expert_stats_print_tokens_per_expert(stats_calbin, capsys):
    assert main(["run", str(stats_calbin), "The quick brown fox", "--max-tokens", "10", "--expert-stats"]) == 0
    _, err = capsys.readouterr()
    prompt = int(re.search(r"prompt tokens (\d+) \| generated (\d+)", err).group(1))
    generated = int(re.search(r"generated (\d+)", err).group(1))
    lines = re.findall(r"\[experts, sparse layer #(\d): max/mean [\d.]+ \| ([\d ]+)\]", err)
    assert [n for n, _ in lines] == ["0", "1"]
    for _, counts in lines:  # top-2 of 8 experts for every token that ran: the prompt and all but the last
        assert len(counts.split()) == 8 and sum(map(int, counts.split())) == 2 * (prompt + generated - 1)


def test_expert_stats_on_a_calbin_without_them_is_one_clear_error(tiny_calbin, capsys):
    assert main(["run", str(tiny_calbin("qwen3_moe")), "Paris", "--expert-stats"]) != 0
    _, err = capsys.readouterr()
    assert "compile a mixture-of-experts model with `calculet compile ... --expert-stats`" in err
