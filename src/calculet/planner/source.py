"""The model a plan is for: a source's config (through `sources/`) parsed by its family (`models/`).

Plan reads no weights: a Hugging Face folder's config.json, a config.json file, or a GGUF header.
A family that `models/` describes but the compiler cannot build yet (e.g. mixtral) is still planned,
with a note that the plan is a capacity estimate only.
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.compiler import decoder
from calculet.errors import ModelError
from calculet.models import parse_config
from calculet.models.base import ModelSpec
from calculet.sources.resolve import load_config


@dataclass(frozen=True)
class PlannedModel:
    spec: ModelSpec
    source_kind: str           # "hf" | "config" | "gguf"
    buildable: bool            # compile can build this family today
    note: str = ""             # why not, when it cannot


def load_model(path: str | None) -> PlannedModel:
    src = load_config(path)
    return model_from_config(src.config, src.kind)


def model_from_config(config: dict, source_kind: str = "config") -> PlannedModel:
    spec = parse_config(config)
    try:
        decoder.require_buildable(spec)
    except ModelError:
        return PlannedModel(spec, source_kind, False,
                            f"the compiler cannot build {spec.model_type} yet; this is a capacity estimate only "
                            f"(compile builds: {', '.join(sorted(decoder.DECODERS))} families)")
    return PlannedModel(spec, source_kind, True)
