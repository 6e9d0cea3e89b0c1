"""The served model: loaded in the background (the HTTP server answers /health with 503 meanwhile),
then an engine over one Device with its tokenizer and chat template."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from calculet.errors import CalculetError, DeviceError, ModelError
from calculet.server.limits import max_prompt_chars, max_token_chars

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    name: str
    engine: object             # calculet.engine.engine.Engine
    tokenizer: object          # calculet.engine.tokenizer.TextTokenizer
    chat: object | None        # calculet.engine.chat.ChatTemplate, None when the model has none
    chat_problem: str | None   # why there is no chat template
    context: int
    lanes: int
    created: int               # unix time the model became ready
    max_prompt_chars: int      # longer prompt text cannot fit the context (server/limits.py)


class ModelHost:
    def __init__(self, config, metrics):
        self.config = config
        self.metrics = metrics
        self.state = "loading"               # loading | ready | failed
        self.error: CalculetError | None = None
        self.model: LoadedModel | None = None
        self._device = None
        self.loaded = threading.Event()      # set when ready or failed
        self.draining = threading.Event()    # set on SIGTERM (server/drain.py): no new requests

    def load(self) -> None:
        """Compile (once, cached) if needed, load and configure the device, start the engine."""
        try:
            self.model = self._load()
            self.state = "ready"
        except CalculetError as exc:
            self.error, self.state = exc, "failed"
        except Exception as exc:  # a broken calbin or runtime: report it, never hang in "loading"
            self.error, self.state = ModelError("load_failed", f"{type(exc).__name__}: {exc}"), "failed"
        finally:
            self.loaded.set()

    def _load(self) -> LoadedModel:
        from calculet.cache import ensure_calbin
        from calculet.compiler.options import CompileOptions
        from calculet.engine.chat import ChatTemplate
        from calculet.engine.engine import Engine
        from calculet.engine.tokenizer import TextTokenizer
        from calculet.runtime.device import Device
        from calculet.runtime.providers import SOURCE_COMPILE

        cfg = self.config
        calbin = ensure_calbin(cfg.model, CompileOptions(**SOURCE_COMPILE[cfg.provider]), log=log.info)
        device = Device(cfg.device_config())
        self._device = device
        program = device.load(calbin)
        # Tokenizer first: parsing a large tokenizer.json needs a few hundred MB for a moment, and
        # doing it before the sessions exist keeps that out of the server's peak memory.
        tokenizer = TextTokenizer.from_program(program)
        device.configure(program)
        chat, problem = None, None
        model_type = device.program.manifest.model.model_type
        try:
            chat = ChatTemplate.choose(tokenizer, cfg.chat_template, model_type)
            if chat is None:
                problem = ("this model has no chat template and no built-in fits its family; start the server with "
                           "--chat-template NAME|FILE, or use /v1/completions")
        except CalculetError as exc:
            if cfg.chat_template:
                raise
            problem = exc.message
        engine = Engine(device, tokenizer, cfg.engine_config(), observer=self.metrics)
        self.metrics.watch(engine.snapshot, lambda: engine.healthy)
        engine.start()
        source = device.program.manifest.model.source.path
        context = device.lanes.context
        return LoadedModel(cfg.model_name(calbin, source), engine, tokenizer, chat, problem, context, device.lanes.count,
                           int(time.time()), max_prompt_chars(context, max_token_chars(tokenizer)))

    def require(self) -> LoadedModel:
        if self.draining.is_set():
            raise DeviceError("shutting_down", "the server is shutting down and admits no new requests; retry on "
                              "another instance")
        if self.model is None:
            if self.state == "failed":
                raise DeviceError("model_unavailable", f"the model failed to load: {self.error}")
            raise DeviceError("model_loading", "the model is still loading; retry in a few seconds (GET /health says when)")
        return self.model

    def health(self) -> tuple[bool, dict]:
        if self.model is None:
            return False, {"status": "draining" if self.draining.is_set() else self.state}
        engine = self.model.engine
        snap = engine.snapshot()
        ok = engine.healthy
        status = "ok" if ok else ("recovering" if snap.state in ("ready", "recovering") else snap.state)
        if self.draining.is_set():
            ok, status = False, "draining"
        return ok, {"status": status, "model": self.model.name, "lanes_in_use": snap.lanes_in_use,
                    "lanes_free": snap.lanes_free, "requests_running": snap.running, "requests_waiting": snap.waiting}

    def close(self) -> None:
        if self.model is not None:
            self.model.engine.stop()
        if self._device is not None:
            self._device.close()
