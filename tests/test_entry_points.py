"""`calculet run`, `calculet serve` and `calculet.LLM` give the same text for the same request: they
share one generation loop (the engine) and one request mapping (`SamplingParams.to_request`).

Regression guard: `calculet run` had its own decode loop that ignored min_tokens and stop strings,
so `run` and `serve` answered the same request differently.
"""

from __future__ import annotations

import pytest

from calculet import LLM, SamplingParams
from calculet.cli import main
from serving import Server

PROMPT = "The quick brown fox"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def calbin(tiny_calbin):
    return tiny_calbin("llama")


@pytest.fixture(scope="module")
def server(calbin, tmp_path_factory):
    server = Server(calbin, tmp_path_factory.mktemp("server") / "server.log")
    try:
        yield server.wait_ready(60)
    finally:
        server.stop()


def _request(calbin):
    """A greedy request whose min_tokens and stop string both change the text: the first greedy token
    is a stop token id that min_tokens holds off, and the stop string comes from the held output."""
    with LLM(calbin) as llm:
        free = llm.generate(PROMPT, SamplingParams(max_tokens=MAX_TOKENS, temperature=0))[0].outputs[0]
        stop_id = free.token_ids[0]
        held_params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, min_tokens=8, stop_token_ids=(stop_id,))
        held = llm.generate(PROMPT, held_params)[0].outputs[0].text
    assert len(held) >= 8, f"held output {held!r} is too short to cut"
    stop = held[len(held) // 2:len(held) // 2 + 2]
    expected = held[:held.index(stop)]
    assert expected and expected != free.text[:len(expected)], "min_tokens or the stop string changed nothing: weak test"
    return dict(min_tokens=8, stop_id=stop_id, stop=stop), expected


def test_run_serve_and_llm_give_the_same_text(calbin, server, capsys):
    req, expected = _request(calbin)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, min_tokens=req["min_tokens"],
                            stop_token_ids=(req["stop_id"],), stop=req["stop"])
    with LLM(calbin) as llm:
        by_llm = llm.generate(PROMPT, params)[0].outputs[0]
    assert by_llm.text == expected and by_llm.finish_reason == "stop"

    served = server.client().completions.create(
        model="model", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, stop=[req["stop"]],
        extra_body={"min_tokens": req["min_tokens"], "stop_token_ids": [req["stop_id"]], "return_token_ids": True})
    assert served.choices[0].text == expected and served.choices[0].finish_reason == "stop"
    assert tuple(served.choices[0].model_extra["token_ids"]) == by_llm.token_ids

    capsys.readouterr()
    assert main(["run", str(calbin), PROMPT, "--max-tokens", str(MAX_TOKENS), "--min-tokens", str(req["min_tokens"]),
                 "--stop-token-ids", str(req["stop_id"]), "--stop", req["stop"]]) == 0
    out, err = capsys.readouterr()
    assert out == expected + "\n"
    assert f"generated {len(by_llm.token_ids)} (stop)" in err
