"""Placement: chips from the flags (thread share, budget) and the per-chip memory accounting that
refuses a model whose memory plan does not fit, naming the numbers."""

from __future__ import annotations

import pytest

from calculet.calbin.memory_plan import KVBuffers, KVGroup, MemoryPlan, Staging
from calculet.errors import ModelError, RequestError
from calculet.server.placement import Placement, parse_bytes, plan_bytes, server_chips

MIB = 1 << 20


def plan(weights_mib: int, kv_mib: int = 1) -> MemoryPlan:
    kv = KVBuffers("float32", (KVGroup((0,), (1, 1, 1, 1), 2, kv_mib * MIB // 2, kv_mib * MIB),), kv_mib * MIB, kv_mib * MIB)
    staging = (Staging("decode_1", 1, 1000, 1000),)
    total = weights_mib * MIB + kv_mib * MIB + 1000
    return MemoryPlan(weights_mib * MIB, kv, staging, total, workspace_estimate_bytes=24)


def test_chips_share_the_cores_unless_threads_is_given(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert [c.threads for c in server_chips(1, 0, None)] == [0]          # one chip: ONNX Runtime's default, as before
    assert [c.threads for c in server_chips(2, 0, None)] == [4, 4]
    assert [c.threads for c in server_chips(3, 0, None)] == [2, 2, 2]
    assert [c.threads for c in server_chips(2, 1, 5)] == [1, 1]
    assert server_chips(2, 1, 5)[1].memory_budget == 5


def test_models_on_one_chip_share_its_budget_and_release_gives_it_back():
    p = Placement(server_chips(2, 1, 10 * MIB))
    a = p.reserve("a", (0,), plan(4))
    assert a.bytes == plan_bytes(plan(4))["total"] == 5 * MIB + 1000 + 24
    p.reserve("b", (1,), plan(8))                 # chip 1 has its own budget
    with pytest.raises(ModelError) as exc:
        p.reserve("c", (0,), plan(4))             # 5 MiB used + 5 MiB > 10 MiB
    msg = exc.value.message
    assert exc.value.code == "model_does_not_fit"
    for number in (4 * MIB, 1 * MIB, 1000, 24, a.bytes, 10 * MIB, 10 * MIB - a.bytes):
        assert f"({number} bytes)" in msg, msg
    assert "chip 0" in msg and "a 5.0 MiB" in msg and "--chip-memory" in msg
    p.release(a)
    assert p.used(0) == 0
    p.reserve("c", (0,), plan(4))


def test_no_budget_means_no_limit_and_bad_chips_are_refused():
    p = Placement(server_chips(1, 0, None))
    p.reserve("huge", (0,), plan(100_000))
    with pytest.raises(RequestError, match="chip 3 does not exist; this server has 1 chip"):
        p.reserve("x", (3,), plan(1))
    with pytest.raises(RequestError, match="partitioned calbins are not served yet"):
        Placement(server_chips(2, 0, None)).reserve("x", (0, 1), plan(1))


@pytest.mark.parametrize("text, n", [("512M", 512 * MIB), ("2G", 2 << 30), ("1.5GiB", 3 << 29), ("4096", 4096), ("8k", 8192)])
def test_parse_bytes(text, n):
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text", ["lots", "-1G", "0"])
def test_parse_bytes_refuses_what_is_not_a_size(text):
    with pytest.raises(RequestError, match="--chip-memory"):
        parse_bytes(text)
