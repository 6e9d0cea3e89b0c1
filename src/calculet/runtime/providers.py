"""Execution providers: which ONNX Runtime provider runs a calbin's graphs, and with which options.

    choice = choose_provider(config, manifest.target, graphs)   # once, before any session
    InferenceSession(path, so, providers=choice.providers, provider_options=choice.options)
    check_active(session, choice, graph name)                    # after each session

A calbin's target decides which providers can run it:
    cpu       ONNX Runtime contrib ops (GroupQueryAttention, MatMulNBits, ...): the CPU provider only
              (CUDA's GroupQueryAttention kernel is registered for float16/bfloat16 only, and these
              graphs attend in float32 over a float32 KV: every attention node would fall back to
              the CPU, with the whole KV copied across each step)
    portable  standard ONNX ops only: the CPU provider, OpenVINO (`device_type` CPU, GPU, NPU) or CUDA
              (onnxruntime-gpu; `device_id`; the KV stays on the GPU: runtime/kv_store.py)

ONNX Runtime does not fail when a provider cannot be created (an unknown option, a missing
plugin): it prints a warning and runs on the CPU provider. `check_active` turns that into an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from calculet.errors import DeviceError, ModelError

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "openvino": "OpenVINOExecutionProvider"}
TARGET_PROVIDERS = {"cpu": ("cpu",), "portable": ("cpu", "openvino", "cuda")}
INSTALL_HINTS = {
    "openvino": " (install onnxruntime-openvino in an environment of its own: it replaces the onnxruntime package)",
    "cuda": " (install onnxruntime-gpu, e.g. `pip install onnxruntime-gpu[cuda,cudnn]`, in an environment without the "
            "onnxruntime package: both install the module onnxruntime)",
}
# OpenVINO's CPU plugin quantizes the activations of a matmul with int8 weights to int8 on the fly
# (groups of 32), which moved the tiny int8 model's hidden states by up to 0.07; off by default, so
# every policy gives the CPU provider's numbers. `--provider-option load_config=...` replaces it.
OPENVINO_CPU_LOAD_CONFIG = {"CPU": {"DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}}
# CompileOptions overrides when `run`/`serve` compile a source for a provider (the cpu target's
# default policy is not standard ONNX; int8 is the portable policy closest to it in size).
# CUDA: fp16, the GPU's native matmul precision (memory is not what a GPU is short of at these sizes).
SOURCE_COMPILE = {"cpu": {}, "openvino": {"target": "portable", "weights": "int8"},
                  "cuda": {"target": "portable", "weights": "fp16"}}


@dataclass(frozen=True)
class ProviderChoice:
    name: str                         # "cpu" | "openvino" | "cuda"
    providers: tuple[str, ...]        # for InferenceSession(providers=...)
    options: tuple[dict, ...]         # one dict per provider


def add_provider_arguments(p) -> None:
    """--provider and --provider-option on an argparse parser, shared by `run` and `serve`."""
    p.add_argument("--provider", choices=sorted(PROVIDERS), default="cpu",
                   help="ONNX Runtime execution provider (default cpu); openvino needs the onnxruntime-openvino "
                        "package, cuda the onnxruntime-gpu package and a visible GPU, both a --target portable "
                        "calbin (a source is compiled that way: int8 weights for openvino, fp16 for cuda)")
    p.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a provider option, repeatable (openvino: device_type=CPU|GPU|NPU, cache_dir=DIR, "
                        "precision=..., load_config=JSON; cuda: device_id=N, gpu_mem_limit=BYTES, ...)")


def parse_provider_options(pairs: list[str] | tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """["K=V", ...] from the command line -> ((K, V), ...); a later K replaces an earlier one."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ModelError("bad_option", f"--provider-option takes KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return tuple(out.items())


def choose_provider(provider: str, options: tuple[tuple[str, str], ...], target: str, body_inputs: set[str]) -> ProviderChoice:
    """Check that `provider` is installed and can run a calbin of `target`; its options with defaults.

    body_inputs: every input name the calbin's body graphs declare (to refuse portable calbins built
    before issue 17's fix, whose unused total_seq_len input OpenVINO binds wrongly)."""
    import onnxruntime as ort

    if provider not in PROVIDERS:
        raise ModelError("unsupported_provider", f"provider {provider!r} is not supported; supported: {', '.join(PROVIDERS)}")
    allowed = TARGET_PROVIDERS.get(target)
    if allowed is None:
        raise ModelError("unsupported_target", f"calbin target {target!r} is unknown; known: {', '.join(TARGET_PROVIDERS)}")
    if provider not in allowed:
        why = {"cuda": " (CUDA's GroupQueryAttention takes float16/bfloat16 only; these graphs attend in float32)"}
        raise ModelError("provider_target_mismatch",
                         f"a calbin compiled for target {target!r} uses ONNX Runtime contrib ops (com.microsoft) that the "
                         f"{provider} provider cannot run{why.get(provider, '')}; use --provider {' or '.join(allowed)}, "
                         f"or recompile with --target portable")
    name = PROVIDERS[provider]
    available = ort.get_available_providers()
    if name not in available:
        raise ModelError("provider_unavailable", f"{name} is not in this ONNX Runtime build (available: "
                                                 f"{', '.join(available)}){INSTALL_HINTS.get(provider, '')}")
    user = dict(options)
    if provider == "cpu":
        if user:
            raise ModelError("bad_option", f"the cpu provider takes no --provider-option, got {sorted(user)}")
        return ProviderChoice(provider, (name,), ({},))
    if provider == "cuda":
        return ProviderChoice(provider, (name,), ({**user, "device_id": str(cuda_device(user))},))
    if "total_seq_len" in body_inputs:
        raise ModelError("calbin_too_old", "this portable calbin's body graphs declare an input they never read "
                                           "(total_seq_len), which the OpenVINO provider binds shifted by one (NaN "
                                           "outputs); recompile it with this version of calculet")
    merged = {"device_type": "CPU", **user}
    if merged["device_type"].upper() == "CPU" and "load_config" not in user:
        merged["load_config"] = json.dumps(OPENVINO_CPU_LOAD_CONFIG)
    return ProviderChoice(provider, (name,), (merged,))


def check_active(session, choice: ProviderChoice, graph: str) -> None:
    """The session must run on the chosen provider, not on ONNX Runtime's silent CPU fallback."""
    active = session.get_providers()
    if not active or active[0] != choice.providers[0]:
        raise DeviceError("provider_not_active",
                          f"graph {graph!r}: ONNX Runtime could not create {choice.providers[0]} with options "
                          f"{choice.options[0]} and fell back to {active}; its warning above says why "
                          "(an unknown option or a missing device)")


def cuda_device(options: dict) -> int:
    """The `device_id` option, checked against the GPUs this process sees (none: a clear error, where
    ONNX Runtime would print a warning and run everything on the CPU)."""
    from calculet.runtime.cudart import CudaRuntime

    raw = options.get("device_id", "0")
    try:
        device_id = int(raw)
    except ValueError:
        raise ModelError("bad_option", f"--provider-option device_id takes a GPU index (0, 1, ...), got {raw!r}") from None
    count, why = CudaRuntime().device_count()
    if count == 0:
        raise DeviceError("no_gpu", f"the CUDA provider is installed but no GPU is visible to this process ({why}); "
                                    "check nvidia-smi and CUDA_VISIBLE_DEVICES")
    if not 0 <= device_id < count:
        raise ModelError("bad_option", f"--provider-option device_id={device_id} is out of range: {count} GPU(s) visible, "
                                       f"allowed 0..{count - 1}")
    return device_id
