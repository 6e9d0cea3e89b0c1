"""The served models, by name: loaded at start in the background (the HTTP server answers /health
with 503 meanwhile), then loaded, unloaded and reloaded while serving.

Routing. A request names its model; `lease(name)` finds it and holds it until the request is in its
engine's queue. A single-model server also takes a request that names no model; with several, one
that names none goes to the first. Leases are what make unload and reload lose nothing:

    unload  name ─▶ new requests for it: 503 model_unloading + Retry-After (the others go on)
                 ─▶ wait for its leases, stop admitting, let its requests finish (--drain-timeout)
                 ─▶ stop its engine and device, free its chip's memory; the name is gone (404)
    reload  name ─▶ load the new version beside the old (warm-up included; both must fit the chip)
                 ─▶ switch: new requests go to the new version
                 ─▶ the old one drains as in unload, so no request fails

Admin operations run one at a time (each on a thread of its own, never on the event loop).
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from calculet.errors import CalculetError, DeviceError, ModelError, RequestError
from calculet.server import heap
from calculet.server.model import LoadedModel, load_model
from calculet.server.placement import Placement

log = logging.getLogger("calculet.server")


@dataclass
class _Served:
    model: LoadedModel
    spec: object                       # the ModelSpec it was loaded from
    state: str = "ready"               # ready | draining
    leases: int = 0
    idle: threading.Condition = field(default_factory=threading.Condition)


class ModelHost:
    def __init__(self, config, metrics):
        self.config = config
        self.metrics = metrics
        self.specs = config.model_specs()
        self.placement = Placement(config.chip_configs())   # the chips, built once from the flags
        self.state = "loading"               # loading | ready | failed
        self.error: CalculetError | None = None
        self.failures: dict[str, CalculetError] = {}   # startup models that could not be loaded
        self._served: dict[str, _Served] = {}
        self._lock = threading.Lock()        # guards _served
        self._admin = threading.Lock()       # one load / unload / reload at a time
        self.loaded = threading.Event()      # set when the start-up models are ready or failed
        self.draining = threading.Event()    # set on SIGTERM (server/drain.py): no new requests

    # --- start-up ------------------------------------------------------------------------
    def load(self) -> None:
        """Load every start-up model; one that fails is logged and left out, the others serve. The heap
        is settled once, after the last of them (server/heap.py), before the host reports ready."""
        try:
            for spec in self.specs:
                try:
                    self.add(spec, settle=False)
                except CalculetError as exc:
                    self._failed(spec, exc)
                except Exception as exc:  # a broken calbin or runtime: report it, never hang in "loading"
                    self._failed(spec, ModelError("load_failed", f"{type(exc).__name__}: {exc}"))
            heap.settle()
            self.state = "ready" if self._served else "failed"
        finally:
            self.loaded.set()

    def _failed(self, spec, exc: CalculetError) -> None:
        label = spec.name or spec.source or "the default model"
        self.failures[label] = exc
        self.error = self.error or exc
        if len(self.specs) > 1:
            log.error("model %s not served: %s", label, exc.one_line())

    # --- routing -------------------------------------------------------------------------
    @property
    def model(self) -> LoadedModel | None:
        """The default model: the first one served."""
        models = self.models()
        return models[0] if models else None

    def models(self) -> list[LoadedModel]:
        with self._lock:
            return [s.model for s in self._served.values() if s.state == "ready"]

    def serving(self) -> list[LoadedModel]:
        """The models served now, or the error that says why there are none (loading, failed, shutting down)."""
        if self.draining.is_set():
            self._route(None)   # raises shutting_down
        models = self.models()
        if not models:
            self._not_ready()
        return models

    @contextmanager
    def lease(self, name: str | None):
        """The model a request names, held until the request is queued in its engine."""
        served = self._route(name)
        try:
            yield served.model
        finally:
            with served.idle:
                served.leases -= 1
                served.idle.notify_all()

    def _route(self, name: str | None) -> _Served:
        if self.draining.is_set():
            raise DeviceError("shutting_down", "the server is shutting down and admits no new requests; retry on "
                              "another instance")
        with self._lock:
            if not self._served:
                self._not_ready()
            if name is None:
                served = next(iter(self._served.values()))
            else:
                served = self._served.get(name)
                if served is None:
                    names = ", ".join(repr(n) for n in self._served)
                    raise RequestError("model_not_found", f"model {name!r} does not exist here; this server serves "
                                       f"{names} (GET /v1/models)")
            if served.state != "ready":
                raise DeviceError("model_unloading", f"model {served.model.name!r} is being unloaded and admits no new "
                                  "requests; the other models are served (GET /v1/models)")
            with served.idle:
                served.leases += 1
            return served

    def _not_ready(self):
        if self.state == "failed":
            raise DeviceError("model_unavailable", f"the model failed to load: {self.error}")
        if self.state == "loading":
            raise DeviceError("model_loading", "the model is still loading; retry in a few seconds (GET /health says when)")
        raise DeviceError("model_unavailable", "no model is loaded; load one (POST /admin/models)")

    # --- lifecycle -----------------------------------------------------------------------
    def add(self, spec, settle: bool = True) -> LoadedModel:
        """Load `spec` and serve it under its name (model_exists if that name is taken). `settle`: settle
        the heap after it (start-up passes False and settles once after all its models)."""
        with self._admin:
            if spec.name is not None:
                self._check_free(spec.name)
            model = load_model(spec, self.config, self.placement, self.metrics)
            try:
                self._check_free(model.name)
            except CalculetError:
                self._close(model)
                raise
            with self._lock:
                self._served[model.name] = _Served(model, replace(spec, name=model.name))
            self._watch(model)
            if settle:
                heap.settle()
            return model

    def remove(self, name: str, hurry: threading.Event | None = None) -> float:
        """Unload with drain; returns the seconds the drain took."""
        with self._admin:
            with self._lock:
                served = self._served.get(name)
                if served is None:
                    raise RequestError("model_not_found", f"model {name!r} is not served here; served: "
                                       f"{', '.join(repr(n) for n in self._served) or 'none'}")
                served.state = "draining"
            seconds = self._drain(served, hurry)
            with self._lock:
                self._served.pop(name, None)
            self.metrics.unwatch(name)
            del served
            heap.settle()
            return seconds

    def reload(self, name: str, source: str | None = None) -> LoadedModel:
        """Load the new version (`source`, else the same path again), switch traffic to it, drain the old."""
        with self._admin:
            with self._lock:
                old = self._served.get(name)
            if old is None or old.state != "ready":
                raise RequestError("model_not_found", f"model {name!r} is not served here; load it first (POST /admin/models)")
            spec = replace(old.spec, source=source or old.spec.source)
            new = load_model(spec, self.config, self.placement, self.metrics)   # warmed up by Device.configure
            with self._lock:
                self._served[name] = _Served(new, spec)
            self._watch(new)
            log.info("model %s: now %s; draining %s", name, new.root, old.model.root)
            old.state = "draining"
            self._drain(old, None)
            del old
            heap.settle()
            return new

    def _check_free(self, name: str) -> None:
        with self._lock:
            if name in self._served:
                raise RequestError("model_exists", f"a model named {name!r} is already served; unload it first or "
                                   "reload it (POST /admin/models/{name}/reload)")

    def _watch(self, model: LoadedModel) -> None:
        engine, device = model.engine, model.device

        def collectives():   # the partitioned program's counters (runtime/collectives.py), None on one chip
            coll = device.collectives
            return None if coll is None else coll.total

        self.metrics.watch(model.name, engine.snapshot, lambda: engine.healthy, collectives)

    def _drain(self, served: _Served, hurry: threading.Event | None) -> float:
        from calculet.server.drain import drain_engine

        with served.idle:   # every request that was routed here is in the engine's queue now
            served.idle.wait_for(lambda: served.leases == 0)
        seconds = drain_engine(served.model.engine, self.config.drain_timeout_s, hurry, what=f"model {served.model.name}")
        self._close(served.model)
        return seconds

    def _close(self, model: LoadedModel) -> None:
        model.close()
        self.placement.release(model.reservation)

    # --- health and end ------------------------------------------------------------------
    def health(self) -> tuple[bool, dict]:
        with self._lock:
            served = list(self._served.values())
        if not served or not self.loaded.is_set():   # ready once every start-up model is loaded or refused
            return False, {"status": "draining" if self.draining.is_set() else self.state}
        entries = [self._health_of(s) for s in served]
        first = entries[0]
        ok = all(e["status"] in ("ok", "unloading") for e in entries)
        status = first["status"] if len(entries) == 1 else ("ok" if ok else "degraded")
        if self.draining.is_set():
            ok, status = False, "draining"
        body = {"status": status, **{k: v for k, v in first.items() if k != "status"}}
        if len(self.specs) > 1 or len(entries) > 1:
            body["models"] = entries
            body["not_loaded"] = {k: v.one_line() for k, v in self.failures.items()}
        return ok, body

    @staticmethod
    def _health_of(s: _Served) -> dict:
        engine = s.model.engine
        snap = engine.snapshot()
        if s.state != "ready":
            status = "unloading"
        elif engine.healthy:
            status = "ok"
        else:
            status = "recovering" if snap.state in ("ready", "recovering") else snap.state
        return {"status": status, "model": s.model.name, "chips": list(s.model.chips), "lanes_in_use": snap.lanes_in_use,
                "lanes_free": snap.lanes_free, "requests_running": snap.running, "requests_waiting": snap.waiting}

    def engines(self) -> list:
        with self._lock:
            return [s.model.engine for s in self._served.values()]

    def close(self) -> None:
        with self._lock:
            served = list(self._served.values())
        for s in served:
            s.model.close()

    def admin_list(self) -> list[dict]:
        with self._lock:
            served = list(self._served.values())
        return [{**s.model.card(), "state": s.state, "chips": list(s.model.chips), "lanes": s.model.lanes,
                 "memory_bytes": s.model.memory_bytes, "source": s.spec.source} for s in served]
