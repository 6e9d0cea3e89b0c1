"""The Python API: `LLM` opens a calbin (or compiles a source into the cache once, as `calculet run`
does) and generates through the same continuous-batching engine that `calculet serve` runs.

    from calculet import LLM, SamplingParams

    with LLM("model.calbin") as llm:                       # or an HF folder, a .gguf, None = default model
        outs = llm.generate(["Paris is", "def main():"], SamplingParams(max_tokens=32, temperature=0))
        print(outs[0].outputs[0].text, outs[0].usage.completion_tokens)
        for delta in llm.stream("Paris is", SamplingParams(max_tokens=32)):
            print(delta.text, end="", flush=True)

`generate` submits every prompt at once, so they share decode steps; each output is the one that
prompt gets alone (greedy, or with its seed). This module composes the compile cache, the runtime
and the engine; `calculet run` (run.py) is built on it.
"""

from __future__ import annotations

import gc
import logging
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from calculet.engine.engine import EngineConfig
from calculet.engine.local import UNBOUNDED_QUEUE, LocalEngine, RequestStream
from calculet.engine.outputs import RequestOutput
from calculet.engine.params import SamplingParams
from calculet.engine.step_policy import DEFAULT_BURST_PREFILL_TOKENS, DEFAULT_STEP_TOKEN_BUDGET, DEFAULT_TTFT_TARGET_S
from calculet.errors import RequestError

log = logging.getLogger("calculet.llm")

Prompt = str | Sequence[int]           # text (encoded with the model's BOS rule) or token ids


@dataclass(frozen=True)
class LLMOptions:
    """`LLM(model, **options)`. The compile options apply only when `model` is a source."""
    threads: int = 0                           # ONNX Runtime intra-op threads (0 = all cores)
    provider: str = "cpu"                      # ONNX Runtime execution provider (runtime.providers.PROVIDERS)
    provider_options: tuple[tuple[str, str], ...] = ()   # (key, value) pairs for the provider
    full_hash: bool = False                    # verify every file's SHA-256 before loading
    hugepages: str = "collapse"                # the loaded weights onto 2 MiB pages, or "off" (runtime.hugepages)
    lanes: int | None = None                   # compile: lanes (default 8)
    context: int | None = None                 # compile: context (default: the trained context within the memory budget)
    prefill_chunks: tuple[int, ...] | None = None   # compile: chunk sizes (default 16, 64, 128)
    weights: str | None = None                 # compile: weight policy (default "auto": by the CPU's ISA)
    chips: int | None = None                   # compile: split over this many chips (needs partition)
    partition: str | None = None               # compile: "pp", "tp" or "ep" (calbin/partition.py)
    kv_dtype: str | None = None                # compile: KV cache dtype, "fp32" (default) or "fp16"
    max_prefill_tokens: int = 512              # engine: prompt tokens prefilled per step
    step_token_budget: int = DEFAULT_STEP_TOKEN_BUDGET   # engine: decode rows + prompt tokens per step while decoding; 0: none
    burst_prefill_tokens: int = DEFAULT_BURST_PREFILL_TOKENS   # engine: a burst is prefilled before it decodes (0: off)
    ttft_target_s: float | None = DEFAULT_TTFT_TARGET_S   # engine: the step slice grows for a prompt that would miss it
    in_flight: int = 2                         # engine: device jobs in flight, 1 (immediate wait) or 2 (ping/pong)
    max_queue: int | None = None               # engine: waiting sequences; None = no limit
    request_timeout_s: float | None = None     # engine: per-request time limit; None = none
    prefix_cache: bool = True                  # engine: resume prompts from finished sequences' KV
    settle_heap: bool = False                  # after the load collect once and freeze the survivors out of the
                                               # collector's full passes (server/heap.py); close() unfreezes.
                                               # Off: in process no full pass ran in 8-stream waves either way
                                               # (benchmarks/llm_heap.py); for an app that allocates as a server does

    def __post_init__(self):
        if self.prefill_chunks is not None:
            object.__setattr__(self, "prefill_chunks", tuple(int(c) for c in self.prefill_chunks))
        object.__setattr__(self, "provider_options", tuple(tuple(kv) for kv in self.provider_options))

    def compile_options(self):
        """A source is compiled for the provider (openvino: a portable target), then as asked."""
        from calculet.compiler.options import CompileOptions
        from calculet.runtime.providers import SOURCE_COMPILE

        given = {"lanes": self.lanes, "context": self.context, "weights": self.weights,
                 "prefill_chunks": self.prefill_chunks, "chips": self.chips, "partition": self.partition,
                 "kv_dtype": self.kv_dtype}
        return CompileOptions(**{**SOURCE_COMPILE[self.provider], **{k: v for k, v in given.items() if v is not None}})

    def device_config(self):
        from calculet.runtime.program import DeviceConfig

        return DeviceConfig(self.provider, threads=self.threads, provider_options=self.provider_options,
                            hugepages=self.hugepages)

    def engine_config(self) -> EngineConfig:
        return EngineConfig(max_queue=UNBOUNDED_QUEUE if self.max_queue is None else self.max_queue,
                            max_prefill_tokens=self.max_prefill_tokens, step_token_budget=self.step_token_budget,
                            burst_prefill_tokens=self.burst_prefill_tokens, ttft_target_s=self.ttft_target_s,
                            in_flight=self.in_flight, request_timeout_s=self.request_timeout_s,
                            prefix_cache=self.prefix_cache)


def _options(given: dict) -> LLMOptions:
    known = LLMOptions.__dataclass_fields__
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise RequestError("bad_option", f"LLM() got unknown option(s) {', '.join(unknown)}; allowed: {', '.join(known)}")
    return LLMOptions(**given)


class LLM:
    """A loaded model and its engine thread; `generate` and `stream` submit to that engine."""

    def __init__(self, model: str | Path | None = None, *, log_fn: Callable[[str], None] | None = None, **options):
        from calculet.cache import ensure_calbin
        from calculet.engine.tokenizer import TextTokenizer
        from calculet.runtime.device import Device

        self.options = _options(options)
        engine_config = self.options.engine_config()   # checked before anything is compiled or loaded
        device_config = self.options.device_config()
        self.calbin = ensure_calbin(None if model is None else str(model), self.options.compile_options(),
                                    log=log_fn or log.info)
        self._device = Device(device_config)
        try:
            program = self._device.load(self.calbin, full_hash=self.options.full_hash)
            self.tokenizer = TextTokenizer.from_program(program)  # before the sessions: keeps its parse out of the peak
            self._device.configure(program)
            self._local = LocalEngine(self._device, self.tokenizer, engine_config)
        except BaseException:
            self._device.close()
            raise
        self._closed = False
        if self.options.settle_heap:   # the load's ~100,000 objects: no full collection walks them mid-stream
            from calculet.server import heap

            heap.settle()

    @property
    def context(self) -> int:
        return self._local.context

    @property
    def lanes(self) -> int:
        return self._device.lanes.count

    @property
    def has_expert_stats(self) -> bool:
        """True for a mixture-of-experts calbin compiled with --expert-stats."""
        return any(t.name == "expert_mask" for g in self._device.program.decode_graphs for t in g.outputs)

    @property
    def expert_load(self):
        """Tokens routed to each expert since the model was loaded, int64 [sparse layers, experts]
        (None unless `has_expert_stats`)."""
        return self._device.expert_load

    def encode(self, prompt: Prompt) -> tuple[int, ...]:
        if isinstance(prompt, str):
            return tuple(self.tokenizer.encode_prompt(prompt))
        return tuple(int(t) for t in prompt)

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """One `RequestOutput` per prompt, in order. All prompts are queued at once and batched by
        the engine; `sampling_params` is one for all or one per prompt (default: `SamplingParams()`)."""
        prompts = [prompts] if _is_single(prompts) else list(prompts)
        params = sampling_params
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        params = list(params)
        if len(params) != len(prompts):
            raise RequestError("invalid_parameter", f"got {len(params)} SamplingParams for {len(prompts)} prompts; "
                               f"allowed: one for all, or one per prompt")
        requests = [p.to_request(self.encode(prompt), self.context) for prompt, p in zip(prompts, params)]
        texts = [prompt if isinstance(prompt, str) else None for prompt in prompts]
        streams = self._engine().submit_all(requests, texts)
        return [stream.result() for stream in streams]

    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None) -> RequestStream:
        """Iterate for `SequenceDelta`s (text, token_ids, logprobs, finish_reason) as they are made;
        afterwards `.output` is the whole `RequestOutput`. Breaking off cancels the request."""
        params = sampling_params or SamplingParams()
        return self._engine().submit(params.to_request(self.encode(prompt), self.context),
                                     prompt if isinstance(prompt, str) else None)

    def _engine(self) -> LocalEngine:
        if self._closed:
            raise RequestError("closed", "this LLM is closed; create a new one")
        return self._local

    def close(self) -> None:
        """Stop the engine thread and release the device (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._local.close()
        finally:
            self._device.close()
        if self.options.settle_heap:   # back to the collector: once unreachable, the model's cycles are freed
            gc.unfreeze()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_single(prompts) -> bool:
    """A str, or a flat sequence of token ids, is one prompt."""
    if isinstance(prompts, str):
        return True
    return isinstance(prompts, Sequence) and len(prompts) > 0 and all(isinstance(t, numbers.Integral) for t in prompts)
