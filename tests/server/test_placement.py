"""Placement: the runtime's chips (ChipConfig) from the flags (thread share, budget), which chips a
model runs on, and the per-chip memory accounting that refuses a model whose memory plan does not
fit, naming the numbers."""

from __future__ import annotations

import pytest

from calculet.calbin.memory_plan import KVBuffers, KVGroup, MemoryPlan, Staging
from calculet.errors import ModelError, RequestError
from calculet.runtime.chips import ChipConfig
from calculet.server.placement import Placement, parse_bytes, plan_bytes, server_chips

MIB = 1 << 20


def plan(weights_mib: int, kv_mib: int = 1) -> MemoryPlan:
    kv = KVBuffers("float32", (KVGroup((0,), (1, 1, 1, 1), 2, kv_mib * MIB // 2, kv_mib * MIB),), kv_mib * MIB, kv_mib * MIB)
    staging = (Staging("decode_1", 1, 1000, 1000),)
    total = weights_mib * MIB + kv_mib * MIB + 1000
    return MemoryPlan(weights_mib * MIB, kv, staging, total, workspace_estimate_bytes=24)


def test_chips_share_the_cores_unless_threads_is_given(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert [c.intra_op_threads for c in server_chips(1, 0, None)] == [0]   # one chip: ONNX Runtime's default, as before
    assert [c.intra_op_threads for c in server_chips(2, 0, None)] == [4, 4]
    assert [c.intra_op_threads for c in server_chips(3, 0, None)] == [2, 2, 2]
    assert [c.intra_op_threads for c in server_chips(2, 1, 5)] == [1, 1]
    chips = server_chips(2, 1, 5, "cpu", (("k", "v"),))
    assert all(isinstance(c, ChipConfig) for c in chips) and [c.index for c in chips] == [0, 1]
    assert chips[1].memory_budget_bytes == 5 and chips[1].provider_options == (("k", "v"),)
    assert server_chips(1, 0, None)[0].memory_budget_bytes == 0            # no budget


def test_models_on_one_chip_share_its_budget_and_release_gives_it_back():
    p = Placement(server_chips(2, 1, 10 * MIB))
    c0, c1 = p.chips
    a = p.reserve("a", (c0,), (plan(4),))
    assert a.bytes == plan_bytes(plan(4))["total"] == 5 * MIB + 1000 + 24
    p.reserve("b", (c1,), (plan(8),))                 # chip 1 has its own budget
    with pytest.raises(ModelError) as exc:
        p.reserve("c", (c0,), (plan(4),))             # 5 MiB used + 5 MiB > 10 MiB
    msg = exc.value.message
    assert exc.value.code == "model_does_not_fit"
    for number in (4 * MIB, 1 * MIB, 1000, 24, a.bytes, 10 * MIB, 10 * MIB - a.bytes):
        assert f"({number} bytes)" in msg, msg
    assert "chip 0" in msg and "a 5.0 MiB" in msg and "--chip-memory" in msg
    p.release(a)
    assert p.used(0) == 0
    p.reserve("c", (c0,), (plan(4),))


def test_no_budget_means_no_limit_and_bad_chips_are_refused():
    p = Placement(server_chips(1, 0, None))
    p.reserve("huge", p.chips, (plan(100_000),))
    with pytest.raises(RequestError, match="chip 3 does not exist; this server has 1 chip"):
        p.place("x", (3,), 1)


def test_a_model_runs_on_the_chips_it_names_or_on_as_many_as_its_calbin_was_compiled_for():
    p = Placement(server_chips(2, 1, None))
    assert p.place("x", None, 1) == (p.chips[0],)
    assert p.place("x", (1,), 1) == (p.chips[1],)
    assert p.place("x", None, 2) == p.chips
    assert p.place("x", (1, 0), 2) == (p.chips[1], p.chips[0])
    with pytest.raises(RequestError, match=r"compiled for 2 chip\(s\); name 2, e.g. chips = \[0, 1\]"):
        p.place("x", (0,), 2)
    with pytest.raises(RequestError, match=r"compiled for 1 chip\(s\).*recompile it with --chips 2 --partition tp\|pp"):
        p.place("x", (0, 1), 1)
    with pytest.raises(RequestError, match="compiled for 2 chips, but this server has 1; start it with --chips 2"):
        Placement(server_chips(1, 0, None)).place("x", None, 2)


def test_a_partitioned_model_holds_each_chips_share_and_is_refused_on_the_chip_it_does_not_fit():
    p = Placement(server_chips(2, 1, 10 * MIB))
    c0, c1 = p.chips
    r = p.reserve("tp", (c0, c1), (plan(4), plan(2)))
    assert p.used(0) == plan_bytes(plan(4))["total"] and p.used(1) == plan_bytes(plan(2))["total"]
    assert r.bytes == p.used(0) + p.used(1)
    p.reserve("small", (c1,), (plan(5),))            # chip 1: 3 MiB + 6 MiB fit 10 MiB
    with pytest.raises(ModelError) as exc:
        p.reserve("tp2", (c0, c1), (plan(1), plan(1)))   # fits chip 0, not chip 1
    msg = exc.value.message
    assert exc.value.code == "model_does_not_fit"
    assert "does not fit chip 1: its share on chip 1 of 2 chips" in msg and "tp 3.0 MiB" in msg and "small" in msg
    assert p.used(0) == plan_bytes(plan(4))["total"]   # nothing held by the refused one
    p.release(r)
    assert p.used(0) == 0 and p.used(1) == plan_bytes(plan(5))["total"]


@pytest.mark.parametrize("text, n", [("512M", 512 * MIB), ("2G", 2 << 30), ("1.5GiB", 3 << 29), ("4096", 4096), ("8k", 8192)])
def test_parse_bytes(text, n):
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text", ["lots", "-1G", "0"])
def test_parse_bytes_refuses_what_is_not_a_size(text):
    with pytest.raises(RequestError, match="--chip-memory"):
        parse_bytes(text)
