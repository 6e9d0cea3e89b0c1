"""SLO parsing and checking."""

from __future__ import annotations

import pytest

from calculet.bench.slo import Slo, parse_slo
from calculet.errors import RequestError


def test_parse_units():
    assert parse_slo("ttft=500ms,tpot=50ms") == Slo(ttft_s=0.5, tpot_s=0.05)
    assert parse_slo(" e2e = 2s ") == Slo(e2e_s=2.0)
    assert parse_slo("tpot=1500us") == Slo(tpot_s=0.0015)
    assert parse_slo(None).empty


@pytest.mark.parametrize("text", ["ttft=500", "latency=1s", "ttft=1ms,ttft=2ms", "ttft=-1ms"])
def test_bad_slo_is_a_request_error(text: str):
    with pytest.raises(RequestError) as caught:
        parse_slo(text)
    assert caught.value.code == "bad_slo"


def test_met():
    slo = Slo(ttft_s=0.5, tpot_s=0.05)
    assert slo.met(0.5, 0.05, 9.0)
    assert not slo.met(0.51, 0.01, 1.0)
    assert not slo.met(0.1, 0.06, 1.0)
    assert slo.met(0.1, None, 1.0)          # one-token answer: no TPOT to break
    assert not slo.met(None, None, 1.0)     # no first token: TTFT limit not met
