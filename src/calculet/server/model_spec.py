"""What to serve: one `ModelSpec` per served model, from `calculet serve A B …` (`NAME=PATH` or a path
whose name is derived), from `--models models.toml`, or from an admin load request.

    # models.toml
    [[model]]
    name = "gemma"                 # what clients send as `model` (default: derived from the path)
    source = "path/to/hf-or.gguf"  # or: calbin = "path/to/model.calbin"; neither: the embedded default model
    chips = [0]                    # the chip(s) it runs on (server/placement.py); default: 0..N-1 for an N-chip calbin
    partition = "tp"               # compile a source for len(chips) (else --chips) chips: tp, pp or ep (default: one chip)
    lanes = 8                      # KV lanes when a source is compiled (a calbin has its own)
    chat_template = "gemma"        # built-in name or Jinja file
    max_queue = 128                # its own waiting queue
    max_prefill_tokens = 512
    step_token_budget = 72         # decode rows + prompt tokens per step while decoding (0: none)
    burst_prefill_tokens = 2048    # a burst is prefilled before it decodes while at most this much is left (0: off)
    ttft_target = 1.0              # seconds; the step slice grows for a prompt that would miss it (default 0: off)
    in_flight = 2                  # device jobs in flight: 1 or 2 (ping/pong)
    request_timeout = 30.0         # seconds
    prefix_cache = true            # reuse finished prompts' KV (false: --no-prefix-cache for this model)

A spec is validated when it is built, so a bad file fails at start with the key and the allowed values.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from calculet.calbin.partition import PARTITIONS
from calculet.engine.step_policy import DEFAULT_BURST_PREFILL_TOKENS, DEFAULT_STEP_TOKEN_BUDGET, DEFAULT_TTFT_TARGET_S
from calculet.errors import RequestError

if TYPE_CHECKING:
    from calculet.engine.engine import EngineConfig

TOML_KEYS = ("name", "source", "calbin", "chips", "partition", "lanes", "chat_template", "max_queue", "max_prefill_tokens",
             "step_token_budget", "burst_prefill_tokens", "ttft_target", "in_flight", "request_timeout", "prefix_cache")


@dataclass(frozen=True)
class ModelSpec:
    source: str | None                 # a calbin, an HF folder or .gguf, or None for the embedded default model
    name: str | None = None            # None: derived from the path once loaded (name_for)
    chips: tuple[int, ...] | None = None   # None: chips 0..N-1 for a calbin compiled for N chips
    partition: str = ""                # a source compiled for several chips: tp or pp; "": one chip
    lanes: int | None = None           # compile option for a source; None: the compiler's default
    chat_template: str | None = None
    max_queue: int = 128
    max_prefill_tokens: int = 512
    step_token_budget: int = DEFAULT_STEP_TOKEN_BUDGET
    burst_prefill_tokens: int = DEFAULT_BURST_PREFILL_TOKENS
    ttft_target_s: float | None = DEFAULT_TTFT_TARGET_S
    in_flight: int = 2
    request_timeout_s: float | None = None
    job_timeout_s: float = 600.0
    prefix_cache: bool = True

    def __post_init__(self):
        where = f"model {self.name or self.source or '(default)'}"
        if self.name is not None and (not self.name.strip() or any(c in self.name for c in "/ \t\n")):
            raise RequestError("bad_option", f"{where}: name {self.name!r} must be non-empty, without '/' or spaces")
        if self.chips is not None and (not self.chips or any(not isinstance(c, int) or c < 0 for c in self.chips)
                                       or len(set(self.chips)) != len(self.chips)):
            raise RequestError("bad_option", f"{where}: chips {list(self.chips)!r} must be distinct chip indices >= 0, "
                               "e.g. [0]")
        if self.partition not in ("",) + PARTITIONS:
            raise RequestError("bad_option", f"{where}: partition must be one of {', '.join(PARTITIONS)} (or none), "
                               f"got {self.partition!r}")
        if self.lanes is not None and not 1 <= self.lanes <= 256:
            raise RequestError("bad_option", f"{where}: lanes must be in 1..256, got {self.lanes}")
        self.engine_config()  # the engine checks queue, prefill budget and timeouts (names the flag)
        if self.chat_template is not None:
            from calculet.engine.chat_templates import resolve
            resolve(self.chat_template)

    def engine_config(self) -> EngineConfig:
        from calculet.engine.engine import EngineConfig

        return EngineConfig.of(self)

    def name_for(self, calbin: Path, source_path: str | None) -> str:
        """The name clients use: the given one, else the name of what was given to serve."""
        if self.name:
            return self.name
        return derived_name(self.source or source_path or str(calbin))


def derived_name(path: str) -> str:
    name = Path(path).name
    for suffix in (".calbin", ".gguf"):
        name = name.removesuffix(suffix)
    return name or "calculet"


def from_argument(arg: str, base: ModelSpec) -> ModelSpec:
    """`NAME=PATH` or `PATH` on the serve command line; the other fields come from `base` (the flags)."""
    name, sep, path = arg.partition("=")
    if not sep or "/" in name or not name:   # a path may hold '=', a name may not hold '/'
        return replace(base, source=arg, name=None)
    return replace(base, source=path, name=name)


def read_models_toml(path: str, base: ModelSpec) -> tuple[ModelSpec, ...]:
    """The `[[model]]` tables of a models file; keys left out take the serve flags' values (`base`)."""
    try:
        doc = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise RequestError("bad_option", f"--models {path}: cannot read it ({exc.strerror})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise RequestError("bad_option", f"--models {path}: not valid TOML: {exc}") from exc
    tables = doc.get("model")
    if not isinstance(tables, list) or not tables:
        raise RequestError("bad_option", f"--models {path}: needs at least one [[model]] table")
    return tuple(from_mapping(t, base, f"--models {path}: [[model]] #{i + 1}") for i, t in enumerate(tables))


def from_mapping(d: dict, base: ModelSpec, where: str) -> ModelSpec:
    """One model as a mapping (a TOML table or an admin load body)."""
    if not isinstance(d, dict):
        raise RequestError("bad_option", f"{where}: must be a table/object of {', '.join(TOML_KEYS)}")
    unknown = sorted(set(d) - set(TOML_KEYS))
    if unknown:
        raise RequestError("bad_option", f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(TOML_KEYS)}")
    if "source" in d and "calbin" in d:
        raise RequestError("bad_option", f"{where}: give source or calbin, not both")
    types = {"name": str, "source": str, "calbin": str, "chat_template": str, "partition": str, "lanes": int, "max_queue": int,
             "max_prefill_tokens": int, "step_token_budget": int, "burst_prefill_tokens": int, "ttft_target": (int, float), "in_flight": int,
             "request_timeout": (int, float)}
    for key, kind in types.items():
        if key in d and (not isinstance(d[key], kind) or isinstance(d[key], bool)):
            raise RequestError("bad_option", f"{where}: {key} must be a {getattr(kind, '__name__', 'number')}, "
                               f"got {d[key]!r}")
    if "prefix_cache" in d and not isinstance(d["prefix_cache"], bool):
        raise RequestError("bad_option", f"{where}: prefix_cache must be true or false, got {d['prefix_cache']!r}")
    chips = d.get("chips", None if base.chips is None else list(base.chips))
    if isinstance(chips, int) and not isinstance(chips, bool):
        chips = [chips]
    if chips is not None and (not isinstance(chips, list)
                              or not all(isinstance(c, int) and not isinstance(c, bool) for c in chips)):
        raise RequestError("bad_option", f"{where}: chips must be a list of chip indices, e.g. [0]; got {chips!r}")
    timeout = d.get("request_timeout", base.request_timeout_s)
    return replace(base, name=d.get("name"), source=d.get("calbin", d.get("source")),
                   chips=None if chips is None else tuple(chips), partition=d.get("partition", base.partition),
                   lanes=d.get("lanes", base.lanes), chat_template=d.get("chat_template", base.chat_template),
                   max_queue=d.get("max_queue", base.max_queue),
                   max_prefill_tokens=d.get("max_prefill_tokens", base.max_prefill_tokens),
                   step_token_budget=d.get("step_token_budget", base.step_token_budget),
                   burst_prefill_tokens=d.get("burst_prefill_tokens", base.burst_prefill_tokens),
                   ttft_target_s=float(d.get("ttft_target", base.ttft_target_s or 0)) or None,
                   in_flight=d.get("in_flight", base.in_flight),
                   request_timeout_s=None if timeout is None else float(timeout),
                   prefix_cache=d.get("prefix_cache", base.prefix_cache))


def check_unique(specs: tuple[ModelSpec, ...]) -> None:
    seen: set[str] = set()
    for s in specs:
        name = s.name or (derived_name(s.source) if s.source else None)
        if name is None:
            continue
        if name in seen:
            raise RequestError("bad_option", f"two models are named {name!r}; give one of them another name "
                               "(NAME=PATH, or name = ... in --models)")
        seen.add(name)
