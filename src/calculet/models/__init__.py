"""Architecture families. Each module here declares MODEL_TYPES and is found automatically,
so adding an architecture means adding one file."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from calculet.errors import ModelError

_SKIP = {"base"}


def _families() -> dict[str, ModuleType]:
    table: dict[str, ModuleType] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name in _SKIP:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for model_type in getattr(module, "MODEL_TYPES", ()):
            table[model_type] = module
    return table


def family_for(config: dict) -> ModuleType:
    model_type = config.get("model_type")
    families = _families()
    if model_type not in families:
        raise ModelError(
            "unsupported_architecture",
            f"model_type {model_type!r} is not supported; supported: {', '.join(sorted(families))}",
        )
    return families[model_type]


def parse_config(config: dict):
    return family_for(config).parse_config(config)
