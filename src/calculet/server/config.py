"""Server configuration: built once from the command line, validated, passed down unchanged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from calculet.engine.step_policy import DEFAULT_BURST_PREFILL_TOKENS, DEFAULT_STEP_TOKEN_BUDGET, DEFAULT_TTFT_TARGET_S
from calculet.errors import RequestError

if TYPE_CHECKING:  # the engine is imported when used, so `calculet serve --help` reads these defaults fast
    from calculet.engine.engine import EngineConfig


@dataclass(frozen=True)
class ServerConfig:
    model: str | None = None               # a calbin, a source to compile, or None for the default model
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_queue: int = 128
    max_prefill_tokens: int = 512          # prompt tokens prefilled per engine step
    step_token_budget: int = DEFAULT_STEP_TOKEN_BUDGET   # decode rows + prompt tokens per step while sequences decode; 0: none
    burst_prefill_tokens: int = DEFAULT_BURST_PREFILL_TOKENS   # a burst is prefilled before it decodes while at most this much is left; 0: off
    ttft_target_s: float | None = DEFAULT_TTFT_TARGET_S   # the step slice grows for a prompt that would miss it; None: off
    in_flight: int = 2                     # device jobs in flight: 1 (immediate wait) or 2 (ping/pong)
    request_timeout_s: float | None = None
    served_model_name: str | None = None
    threads: int = 0
    spinning: str = "run"                  # --ort-spinning: runtime.program.SPINNING
    hugepages: str = "collapse"            # --hugepages: runtime.hugepages.MODES
    chat_template: str | None = None       # a built-in name (gemma, chatml, qwen, llama3) or a Jinja file
    provider: str = "cpu"                  # runtime.providers.PROVIDERS key
    provider_options: tuple[tuple[str, str], ...] = ()
    max_body_bytes: int | None = None      # None: derived from the context (server/limits.py)
    drain_timeout_s: float = 30.0          # on SIGTERM, how long running requests may take to finish
    job_timeout_s: float = 600.0           # a device job running longer counts as hung (device error);
                                           # = runtime.device.JOB_TIMEOUT_S, not imported so `serve --help` stays light
    models: tuple = ()                     # ModelSpec per served model; () = one, from `model` and the flags above
    chips: int = 1                         # chips the server places models on (server/placement.py)
    chip_memory: int | None = None         # bytes each chip may hold; None: unlimited
    partition: str = ""                    # --partition tp|pp|ep: compile a source for --chips chips; "": one chip
    admin_key: str | None = None           # key of /admin/*; None: the API key; neither: admin is off
    prefix_cache: bool = True              # --no-prefix-cache turns it off
    kv_dtype: str = "fp32"                 # --kv-dtype for a source compiled at start (a calbin keeps its own)

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise RequestError("bad_option", f"--port must be in 0..65535, got {self.port}")
        self.engine_config()  # the engine checks its own options
        if self.max_body_bytes is not None and self.max_body_bytes < 1024:
            raise RequestError("bad_option", f"--max-body-bytes must be >= 1024, got {self.max_body_bytes}")
        if not 0 <= self.drain_timeout_s <= 3600:
            raise RequestError("bad_option", f"--drain-timeout must be in 0..3600 seconds, got {self.drain_timeout_s}")
        if self.threads < 0:
            raise RequestError("bad_option", f"--threads must be >= 0 (0 = all cores), got {self.threads}")
        self.device_config()  # the runtime checks the provider name and options' form
        if self.api_key is not None and not self.api_key.strip():
            raise RequestError("bad_option", "--api-key must not be empty")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise RequestError("bad_option", "--served-model-name must not be empty")
        if self.chat_template is not None:
            from calculet.engine.chat_templates import resolve
            resolve(self.chat_template)  # a bad name or unreadable file fails at start, not at the first chat
        from calculet.calbin.graphspec import KV_DTYPE_OPTIONS
        if self.kv_dtype not in KV_DTYPE_OPTIONS:
            raise RequestError("bad_option", f"--kv-dtype {self.kv_dtype!r} is not known; allowed: "
                                             f"{', '.join(KV_DTYPE_OPTIONS)}")
        if not 1 <= self.chips <= 64:
            raise RequestError("bad_option", f"--chips must be in 1..64, got {self.chips}")
        if self.chip_memory is not None and self.chip_memory <= 0:
            raise RequestError("bad_option", f"--chip-memory must be > 0 bytes, got {self.chip_memory}")
        if self.admin_key is not None and not self.admin_key.strip():
            raise RequestError("bad_option", "--admin-key must not be empty")
        from calculet.server.model_spec import check_unique
        specs = self.model_specs()
        check_unique(specs)
        for spec in specs:
            bad = [c for c in spec.chips or () if c >= self.chips]
            if bad:
                raise RequestError("bad_option", f"model {spec.name or spec.source}: chip {bad[0]} does not exist; this "
                                   f"server has {self.chips} chip(s): 0..{self.chips - 1} (--chips)")
            if spec.partition and self.compile_chips(spec) < 2:
                raise RequestError("bad_option", f"model {spec.name or spec.source or '(default)'}: --partition "
                                   f"{spec.partition} splits a model over 2 or more chips; give --chips 2 (or chips = "
                                   "[0, 1] in --models)")

    def __repr__(self) -> str:  # never print the key
        key = "set" if self.api_key else None
        return (f"ServerConfig(model={self.model!r}, host={self.host!r}, port={self.port}, api_key={key}, "
                f"max_queue={self.max_queue}, max_prefill_tokens={self.max_prefill_tokens}, "
                f"step_token_budget={self.step_token_budget}, burst_prefill_tokens={self.burst_prefill_tokens}, ttft_target_s={self.ttft_target_s}, in_flight={self.in_flight}, request_timeout_s={self.request_timeout_s}, "
                f"served_model_name={self.served_model_name!r}, threads={self.threads}, chat_template={self.chat_template!r}, "
                f"provider={self.provider!r}, provider_options={self.provider_options!r}, hugepages={self.hugepages!r}, "
                f"max_body_bytes={self.max_body_bytes}, drain_timeout_s={self.drain_timeout_s}, job_timeout_s={self.job_timeout_s}, "
                f"models={self.models!r}, chips={self.chips}, chip_memory={self.chip_memory}, partition={self.partition!r}, "
                f"admin_key={'set' if self.admin_key else None}, "
                f"prefix_cache={self.prefix_cache}, kv_dtype={self.kv_dtype!r})")

    def device_config(self):
        """The runtime's share: provider, its options, threads, spinning and huge pages (validated by DeviceConfig)."""
        from calculet.runtime.program import DeviceConfig

        return DeviceConfig(self.provider, threads=self.threads, provider_options=self.provider_options,
                            spinning=self.spinning, hugepages=self.hugepages)

    def chip_configs(self) -> tuple:
        """The server's chips (runtime.chips.ChipConfig), built from the flags: --chips, --threads,
        --chip-memory, --provider and its options (server/placement.py)."""
        from calculet.server.placement import server_chips

        return server_chips(self.chips, self.threads, self.chip_memory, self.provider, self.provider_options,
                            self.spinning, self.hugepages)

    def compile_chips(self, spec) -> int:
        """How many chips a source is compiled for: 1, or with a partition the chips the model names
        (all of the server's when it names none)."""
        if not spec.partition:
            return 1
        return len(spec.chips) if spec.chips is not None else self.chips

    def engine_config(self) -> EngineConfig:
        """The engine's share of the options (validated by EngineConfig itself)."""
        from calculet.engine.engine import EngineConfig

        return EngineConfig.of(self)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def model_spec(self, source: str | None = None, name: str | None = None):
        """A model with the server's flags as its options (queue, limits, chat template, partition; chips
        0..N-1 for an N-chip calbin)."""
        from calculet.server.model_spec import ModelSpec

        return ModelSpec(source=source, name=name, chat_template=self.chat_template, max_queue=self.max_queue,
                         max_prefill_tokens=self.max_prefill_tokens, step_token_budget=self.step_token_budget,
                         burst_prefill_tokens=self.burst_prefill_tokens, ttft_target_s=self.ttft_target_s,
                         in_flight=self.in_flight, request_timeout_s=self.request_timeout_s,
                         job_timeout_s=self.job_timeout_s, partition=self.partition,
                         prefix_cache=self.prefix_cache)

    def model_specs(self) -> tuple:
        """The models to serve at start: `models`, else the one given as `model` (or the default model)."""
        if self.models:
            return tuple(self.models)
        return (self.model_spec(self.model, self.served_model_name),)

    @property
    def admin_secret(self) -> str | None:
        return self.admin_key or self.api_key
