"""ModelHost in process, on tiny calbins: two models on two chips get their own device, sessions,
worker and engine thread with the chip's thread share; routing by name; unload frees the chip; a
lease holds a model's drain until the request is queued."""

from __future__ import annotations

import threading

import pytest

from calculet.errors import CalculetError
from calculet.server.config import ServerConfig
from calculet.server.host import ModelHost
from calculet.server.metrics import ServerMetrics
from calculet.server.model_spec import ModelSpec


@pytest.fixture()
def host(tiny_calbin, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    calbin = str(tiny_calbin("llama"))
    config = ServerConfig(chips=2, models=(ModelSpec(calbin, "a", chips=(0,)), ModelSpec(calbin, "b", chips=(1,))),
                          drain_timeout_s=10)
    h = ModelHost(config, ServerMetrics())
    h.load()
    yield h
    h.close()


def test_two_models_on_two_chips_share_no_session_worker_or_thread(host):
    assert host.state == "ready" and [m.name for m in host.models()] == ["a", "b"]
    a, b = host.models()
    assert a.device is not b.device and a.engine is not b.engine
    assert not set(map(id, a.device.program.sessions.values())) & set(map(id, b.device.program.sessions.values()))
    assert a.device._worker.thread is not b.device._worker.thread and a.engine._thread is not b.engine._thread
    assert a.device.config.threads == b.device.config.threads == 2     # 4 cores / 2 chips
    # the chips are the runtime's, built once by the host and passed down to each model's Device
    assert a.device.chips == (host.placement.chips[0],) and b.device.chips == (host.placement.chips[1],)
    assert a.device.chips[0] is host.placement.chips[0] and b.device.chips[0].index == 1
    for model in (a, b):
        for session in model.device.program.sessions.values():
            assert session.get_session_options().intra_op_num_threads == 2
    assert a.chips == (0,) and b.chips == (1,)
    assert host.placement.used(0) == a.memory_bytes > 0 and host.placement.used(1) == b.memory_bytes


def test_routing_by_name_and_the_default_for_no_name(host):
    with host.lease("b") as m:
        assert m.name == "b"
    with host.lease(None) as m:
        assert m.name == "a"
    with pytest.raises(CalculetError) as exc:
        with host.lease("c"):
            pass
    assert exc.value.code == "model_not_found" and "'a', 'b'" in exc.value.message


def test_unload_waits_for_a_lease_then_frees_the_chip(host):
    """Guards the gap between routing a request and queueing it: the drain must not stop the engine
    while a handler holds the model it routed to (that request would fail)."""
    held = host.lease("b")
    model = held.__enter__()
    finished = threading.Event()
    unloader = threading.Thread(target=lambda: (host.remove("b"), finished.set()))
    unloader.start()
    assert not finished.wait(0.3)                        # held by the lease
    with pytest.raises(CalculetError) as exc:
        with host.lease("b"):
            pass
    assert exc.value.code == "model_unloading"
    assert model.engine._thread.is_alive()               # the routed request could still be queued
    held.__exit__(None, None, None)
    unloader.join(30)
    assert finished.is_set() and [m.name for m in host.models()] == ["a"]
    assert host.placement.used(1) == 0 and not model.engine._thread.is_alive()
    with pytest.raises(CalculetError) as exc:
        with host.lease("b"):
            pass
    assert exc.value.code == "model_not_found"


def test_a_partitioned_model_runs_on_its_chips_beside_a_one_chip_model(tiny_calbin, monkeypatch):
    """tp on chips 0 and 1 (each chip's sub-calbin on its own ChipConfig), a on chip 1: no session or
    worker thread in common, and each chip's budget holds that chip's share of tp."""
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    tp, one = str(tiny_calbin("llama", chips=2, partition="tp")), str(tiny_calbin("llama"))
    config = ServerConfig(chips=2, models=(ModelSpec(tp, "tp"), ModelSpec(one, "a", chips=(1,))), drain_timeout_s=10)
    h = ModelHost(config, ServerMetrics())
    h.load()
    try:
        assert h.state == "ready", h.failures
        tp_model, a = h.models()
        assert tp_model.chips == (0, 1) and a.chips == (1,)
        assert tp_model.device.chips == h.placement.chips and a.device.chips == (h.placement.chips[1],)
        program = tp_model.device.program
        chip_sessions = [set(map(id, part.sessions.values())) for part in program.parts]
        a_sessions = set(map(id, a.device.program.sessions.values()))
        assert not chip_sessions[0] & chip_sessions[1] and not (chip_sessions[0] | chip_sessions[1]) & a_sessions
        for part in program.parts:
            for session in part.sessions.values():
                assert session.get_session_options().intra_op_num_threads == 2
        assert tp_model.device._worker.thread is not a.device._worker.thread
        plans = program.chip_plans()
        from calculet.server.placement import plan_bytes
        assert h.placement.used(0) == plan_bytes(plans[0])["total"]
        assert h.placement.used(1) == plan_bytes(plans[1])["total"] + a.memory_bytes
        assert tp_model.memory_bytes == sum(plan_bytes(p)["total"] for p in plans)
        h.remove("tp")
        assert h.placement.used(0) == 0 and h.placement.used(1) == a.memory_bytes
    finally:
        h.close()
