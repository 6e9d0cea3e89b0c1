"""server/heap.py: after a load or unload the survivors are frozen out of the collector's full
passes, and an unloaded model is still collected (nothing frozen leaks)."""

from __future__ import annotations

import gc
import weakref

import pytest

from calculet.server import heap
from calculet.server.config import ServerConfig
from calculet.server.host import ModelHost
from calculet.server.metrics import ServerMetrics
from calculet.server.model_spec import ModelSpec
from serving import server_config_from_flags


@pytest.fixture(autouse=True)
def _unfrozen():
    yield
    gc.unfreeze()   # leave the test process's collector as it was


class _Node:
    def __init__(self):
        self.other = self


def test_settle_collects_cycles_and_freezes_the_survivors():
    kept = _Node()
    lost = weakref.ref(_Node())          # an unreachable cycle: only the collector frees it
    report = heap.settle()
    assert lost() is None and report.collected >= 1
    assert report.frozen == gc.get_freeze_count() > 0
    assert not any(o is kept for g in range(3) for o in gc.get_objects(generation=g))   # frozen: in no generation


def test_a_frozen_cycle_is_collected_by_the_next_settle():
    node = _Node()
    ref = weakref.ref(node)
    heap.settle()                        # node is frozen now
    del node
    gc.collect()
    assert ref() is not None             # a plain collection does not look at frozen objects
    heap.settle()                        # but settle unfreezes first
    assert ref() is None


def test_host_freezes_after_load_and_an_unloaded_model_is_freed(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("CALCULET_CACHE", str(tmp_path / "cache"))
    host = ModelHost(server_config_from_flags(str(tiny_model_dir("llama"))), ServerMetrics())
    gc.unfreeze()
    host.load()
    try:
        assert host.state == "ready"
        assert gc.get_freeze_count() > 0
        (model,) = host.models()
        engine, device = weakref.ref(model.engine), weakref.ref(model.device)
        name = model.name
        del model
        host.remove(name)
        assert engine() is None and device() is None, "the unloaded model's objects stayed alive"
    finally:
        host.close()


def test_start_up_settles_once_after_all_its_models(tiny_calbin, monkeypatch):
    calls = []
    real = heap.settle
    monkeypatch.setattr(heap, "settle", lambda: calls.append(len(host.models())) or real())
    calbin = str(tiny_calbin("llama"))
    config = ServerConfig(models=(ModelSpec(calbin, "a"), ModelSpec(calbin, "b"), ModelSpec("/no/such.calbin", "c")))
    host = ModelHost(config, ServerMetrics())
    host.load()
    try:
        assert host.state == "ready" and [m.name for m in host.models()] == ["a", "b"] and "c" in host.failures
        assert calls == [2], "start-up settles once, after every model (the failed one included)"
        assert gc.get_freeze_count() > 0
        host.remove("b")
        assert calls == [2, 1], "an unload settles on its own"
    finally:
        host.close()
