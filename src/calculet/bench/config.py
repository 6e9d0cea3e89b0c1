"""The benchmark's configuration: one frozen dataclass of sub-configs, validated when built.

A scenario file (JSON, or TOML by extension) uses the same names as the command-line flags, with
dashes or underscores, e.g.

    {"url": "http://127.0.0.1:8080", "model": "gemma", "load": "closed", "concurrency": [1, 8],
     "prompt_tokens": [256], "output_tokens": 128, "requests": 32, "warmup": 2}

Flags given on the command line override the file.
"""

from __future__ import annotations

import json
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calculet.bench.slo import Slo, parse_slo
from calculet.errors import RequestError

LOAD_MODES = ("closed", "poisson", "gamma", "constant")
APIS = ("completions", "chat")
DEFAULT_REQUESTS = 64        # requests per phase when neither --requests nor a prompts file says
# Prompt-length buckets in tokens; `auto` takes these up to the model's context.
AUTO_BUCKETS = (1, 16, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


@dataclass(frozen=True)
class Target:
    """The server under test."""

    url: str                 # base URL, with or without a trailing /v1
    model: str
    api_key: str | None = None
    api: str = APIS[0]
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise RequestError("bad_url", f"--url must start with http:// or https://, got {self.url!r}")
        if not self.model:
            raise RequestError("missing_model", "--model is required: the model name the server serves")
        if self.api not in APIS:
            raise RequestError("bad_api", f"--api must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.timeout_s <= 0:
            raise RequestError("bad_timeout", f"--timeout must be > 0 seconds, got {self.timeout_s}")

    @property
    def base_url(self) -> str:
        """The server root, without /v1."""
        url = self.url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url

    @property
    def endpoint(self) -> str:
        path = "/v1/chat/completions" if self.api == "chat" else "/v1/completions"
        return self.base_url + path


@dataclass(frozen=True)
class Load:
    """One load level: a closed loop of `concurrency` clients, or an open-loop arrival process."""

    mode: str
    concurrency: int | None = None   # closed: number of clients; open: optional cap on in-flight
    rate: float | None = None        # open: arrivals per second
    burstiness: float = 1.0          # gamma shape; 1 = Poisson, < 1 burstier, > 1 smoother

    def __post_init__(self) -> None:
        if self.mode not in LOAD_MODES:
            raise RequestError("bad_load", f"--load must be one of {', '.join(LOAD_MODES)}, got {self.mode!r}")
        if self.mode == "closed":
            if not self.concurrency or self.concurrency < 1:
                raise RequestError("bad_concurrency", f"closed loop needs --concurrency ≥ 1, got {self.concurrency}")
        else:
            if self.rate is None or self.rate <= 0:
                raise RequestError("bad_rate", f"{self.mode} arrivals need --rate > 0 requests/s, got {self.rate}")
            if self.concurrency is not None and self.concurrency < 1:
                raise RequestError("bad_concurrency", f"--max-concurrency must be ≥ 1, got {self.concurrency}")
        if self.burstiness <= 0:
            raise RequestError("bad_burstiness", f"--burstiness must be > 0, got {self.burstiness}")

    @property
    def label(self) -> str:
        if self.mode == "closed":
            return f"closed-c{self.concurrency}"
        cap = f"-cap{self.concurrency}" if self.concurrency else ""
        shape = f"-b{self.burstiness:g}" if self.mode == "gamma" else ""
        return f"{self.mode}-r{self.rate:g}{shape}{cap}"


@dataclass(frozen=True)
class Workload:
    """What each request asks for."""

    prompt_tokens: tuple[int, ...] = (256,)   # buckets; ignored when prompts_file is given
    output_tokens: int = 128
    fixed_output: bool = True                 # send ignore_eos + min_tokens
    prompts_file: Path | None = None          # JSONL of real prompts
    tokenizer: Path | None = None             # tokenizer.json; else the server's /tokenize
    max_context: int | None = None            # else asked from the server when it says

    def __post_init__(self) -> None:
        if self.output_tokens < 1:
            raise RequestError("bad_output_tokens", f"--output-tokens must be ≥ 1, got {self.output_tokens}")
        if self.prompts_file is None:
            if not self.prompt_tokens:
                raise RequestError("bad_prompt_tokens", "--prompt-tokens needs at least one length")
            bad = [n for n in self.prompt_tokens if n < 1]
            if bad:
                raise RequestError("bad_prompt_tokens", f"prompt lengths must be ≥ 1 token, got {bad}")
        elif not self.prompts_file.is_file():
            raise RequestError("missing_prompts", f"--prompts file {self.prompts_file} does not exist")
        if self.tokenizer is not None and not self.tokenizer.is_file():
            raise RequestError("missing_tokenizer", f"--tokenizer file {self.tokenizer} does not exist")
        if self.max_context is not None and self.max_context < 2:
            raise RequestError("bad_max_context", f"--max-context must be ≥ 2 tokens, got {self.max_context}")


@dataclass(frozen=True)
class Limits:
    """Bounds per phase (one load level × one prompt bucket); warm-up is once per run."""

    requests: int | None = None       # per phase; None: DEFAULT_REQUESTS, or every line of the prompts file
    duration_s: float | None = None   # per phase: stop sending after this long
    warmup: int = 2

    def __post_init__(self) -> None:
        if self.requests is not None and self.requests < 1:
            raise RequestError("bad_requests", f"--requests must be ≥ 1, got {self.requests}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise RequestError("bad_duration", f"--duration must be > 0 seconds, got {self.duration_s}")
        if self.warmup < 0:
            raise RequestError("bad_warmup", f"--warmup must be ≥ 0, got {self.warmup}")


@dataclass(frozen=True)
class BenchConfig:
    target: Target
    loads: tuple[Load, ...]
    workload: Workload = field(default_factory=Workload)
    limits: Limits = field(default_factory=Limits)
    slo: Slo = field(default_factory=Slo)
    seed: int = 0
    out_dir: Path = Path("calculet-bench") / "run"
    progress: bool = True
    label: str = ""                  # a name for this server in reports ("llama.cpp", "calculet")

    def __post_init__(self) -> None:
        if not self.loads:
            raise RequestError("bad_load", "at least one load level is needed (e.g. --concurrency 1)")


# --- building a config from a scenario file and flags ------------------------------------------

def read_scenario_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise RequestError("missing_scenario", f"scenario file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RequestError("bad_scenario", f"scenario file {path} is not valid {path.suffix[1:] or 'JSON'}: {exc}")
    if not isinstance(data, dict):
        raise RequestError("bad_scenario", f"scenario file {path} must hold one object of settings")
    return {key.replace("-", "_"): value for key, value in data.items()}


# Every setting a scenario file or a `bench run` flag may give (flags use dashes).
SETTINGS = (
    "url", "model", "api_key", "api", "timeout", "load", "concurrency", "rate", "burstiness",
    "max_concurrency", "prompt_tokens", "output_tokens", "fixed_output", "prompts", "tokenizer",
    "max_context", "requests", "duration", "warmup", "seed", "slo", "out", "progress", "label",
)


def _as_list(value: Any, kind: type, name: str) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    elif not isinstance(value, (list, tuple)):
        value = [value]
    try:
        return [kind(v) for v in value]
    except (TypeError, ValueError):
        raise RequestError("bad_value", f"{name} must be a list of {kind.__name__}s, got {value!r}") from None


def _prompt_buckets(value: Any) -> tuple[int, ...] | str:
    if value == "auto" or value == ["auto"]:
        return "auto"
    return tuple(_as_list(value, int, "prompt_tokens")) or Workload.prompt_tokens


def build_config(settings: dict[str, Any]) -> BenchConfig:
    """Build a config from merged settings (scenario file values overridden by flags)."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise RequestError("bad_scenario", f"unknown settings {unknown}; known: {sorted(SETTINGS)}")
    get = settings.get
    target = Target(
        url=str(get("url") or ""), model=str(get("model") or ""), api_key=get("api_key"),
        api=get("api") or Target.api, timeout_s=float(get("timeout") or Target.timeout_s),
    )
    mode = get("load") or ("closed" if get("rate") is None else "poisson")
    if mode == "closed":
        if get("rate") is not None:
            raise RequestError("bad_load", "--rate is for open loops; give --load poisson, gamma or constant")
        levels = _as_list(get("concurrency"), int, "concurrency") or [1]
        loads = tuple(Load("closed", concurrency=c) for c in levels)
    else:
        rates = _as_list(get("rate"), float, "rate")
        if not rates:
            raise RequestError("bad_rate", f"--load {mode} needs --rate (requests/s; a list sweeps)")
        cap = get("max_concurrency")
        burst = float(get("burstiness") if get("burstiness") is not None else Load.burstiness)
        if mode != "gamma" and burst != 1.0:
            raise RequestError("bad_burstiness", "--burstiness applies to --load gamma only")
        loads = tuple(Load(mode, concurrency=int(cap) if cap else None, rate=r, burstiness=burst) for r in rates)
    buckets = _prompt_buckets(get("prompt_tokens"))
    prompts = get("prompts")
    workload = Workload(
        prompt_tokens=AUTO_BUCKETS if buckets == "auto" else buckets,
        output_tokens=int(get("output_tokens") or Workload.output_tokens),
        fixed_output=bool(get("fixed_output", True)),
        prompts_file=Path(prompts) if prompts else None,
        tokenizer=Path(get("tokenizer")) if get("tokenizer") else None,
        max_context=int(get("max_context")) if get("max_context") else None,
    )
    limits = Limits(
        requests=int(get("requests")) if get("requests") is not None else None,
        duration_s=float(get("duration")) if get("duration") is not None else None,
        warmup=int(get("warmup")) if get("warmup") is not None else Limits.warmup,
    )
    out = get("out") or Path("calculet-bench") / time.strftime("%Y%m%d-%H%M%S")
    return BenchConfig(
        target=target, loads=loads, workload=workload, limits=limits, slo=parse_slo(get("slo")),
        seed=int(get("seed") or 0), out_dir=Path(out), progress=bool(get("progress", True)),
        label=str(get("label") or ""),
    )
