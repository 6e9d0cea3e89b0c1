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
