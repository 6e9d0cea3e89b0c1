"""One served model: compiled (once, cached) if given as a source, placed on its chips (the runtime's
ChipConfigs; several for a partitioned calbin), loaded onto its own Device, with its own engine (lanes,
queue, limits), tokenizer and chat template. `server/host.py` holds the served models and routes requests to them."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from calculet.errors import CalculetError, ModelError, RequestError
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
    root: str = ""             # the calbin it runs (a reload changes it)
    chips: tuple[int, ...] = (0,)
    memory_bytes: int = 0      # what its chips' budgets count for it, all chips together (server/placement.py)
    device: object = None      # calculet.runtime.device.Device, its own
    reservation: object = None  # server.placement.Reservation, released on unload

    def card(self) -> dict:
        """Its entry in /v1/models."""
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "calculet",
                "max_model_len": self.context, "root": self.root}

    def close(self) -> None:
        self.engine.stop()
        self.device.close()


def load_model(spec, config, placement, metrics) -> LoadedModel:
    """spec: ModelSpec; config: ServerConfig (provider); placement: Placement; metrics: ServerMetrics.
    Refuses a model that does not fit its chip before any session is opened. Every failure is a
    CalculetError (an unexpected one becomes load_failed with its type and message)."""
    try:
        return _load(spec, config, placement, metrics)
    except CalculetError:
        raise
    except Exception as exc:  # a broken calbin or runtime: say what, never a bare 500
        raise ModelError("load_failed", f"{spec.source or 'the default model'}: {type(exc).__name__}: {exc}") from exc


def _load(spec, config, placement, metrics) -> LoadedModel:
    from calculet.cache import ensure_calbin
    from calculet.compiler.options import CompileOptions
    from calculet.engine.engine import Engine
    from calculet.engine.tokenizer import TextTokenizer
    from calculet.runtime.device import Device
    from calculet.runtime.partitioned import load_program
    from calculet.runtime.providers import SOURCE_COMPILE

    if spec.source is not None and not Path(spec.source).exists():
        raise RequestError("source_not_found", f"{spec.source}: no such file or folder; give a calbin, a Hugging Face "
                           "folder or a .gguf file")
    compile_options = dict(SOURCE_COMPILE[config.provider])
    if spec.lanes is not None:
        compile_options["lanes"] = spec.lanes
    if spec.partition:
        compile_options.update(chips=config.compile_chips(spec), partition=spec.partition)
    compile_options["kv_dtype"] = config.kv_dtype
    calbin = ensure_calbin(spec.source, CompileOptions(**compile_options), log=log.info)
    program = load_program(calbin)
    manifest = program.manifest
    name = spec.name_for(calbin, manifest.model.source.path)
    if spec.lanes is not None and manifest.kv.lanes != spec.lanes:
        raise RequestError("bad_option", f"model {name!r}: lanes = {spec.lanes}, but the calbin {calbin} was compiled with "
                           f"{manifest.kv.lanes} lanes; drop lanes or recompile with --lanes {spec.lanes}")
    compiled = manifest.partition.scheme if manifest.partition is not None else ""
    if spec.partition and compiled != spec.partition:
        raise RequestError("bad_option", f"model {name!r}: partition = {spec.partition}, but the calbin {calbin} is "
                           f"{'partitioned ' + compiled if compiled else 'a one-chip calbin'}; drop partition or "
                           f"recompile with --partition {spec.partition}")
    chips = placement.place(name, spec.chips, program.chip_count)     # the runtime's ChipConfigs, the server's own
    reservation = placement.reserve(name, chips, program.chip_plans())
    device = Device(chips=chips)
    try:
        # Tokenizer first: parsing a large tokenizer.json needs a few hundred MB for a moment, and
        # doing it before the sessions exist keeps that out of the server's peak memory.
        tokenizer = TextTokenizer.from_program(program)
        device.configure(program)
        chat, problem = _chat_template(tokenizer, spec.chat_template, manifest.model.model_type)
        observer = metrics.for_model(name)
        engine = Engine(device, tokenizer, spec.engine_config(), observer=observer)
        engine.start()
    except BaseException:
        placement.release(reservation)
        device.close()
        raise
    context = device.lanes.context
    return LoadedModel(name, engine, tokenizer, chat, problem, context, device.lanes.count, int(time.time()),
                       max_prompt_chars(context, max_token_chars(tokenizer)), root=str(calbin),
                       chips=tuple(c.index for c in chips),
                       memory_bytes=reservation.bytes, device=device, reservation=reservation)


def _chat_template(tokenizer, chosen: str | None, model_type: str):
    """(template, None), or (None, why there is none) when the model has none and none was chosen."""
    from calculet.engine.chat import ChatTemplate

    try:
        chat = ChatTemplate.choose(tokenizer, chosen, model_type)
    except CalculetError as exc:
        if chosen:
            raise
        return None, exc.message
    if chat is None:
        return None, ("this model has no chat template and no built-in fits its family; start the server with "
                      "--chat-template NAME|FILE, or use /v1/completions")
    return chat, None
