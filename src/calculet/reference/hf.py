"""Hugging Face reference runs: rebuild the source model in transformers and run it in fp32.

This is the only module that imports torch and transformers (lazily, so `import calculet.reference`
works without them). The model is built from `SourceModel.config` and loaded with exactly
`SourceModel.tensors`, so every source (HF folder, GGUF) is checked against the numbers the
compiler actually read, not against a second copy of the checkpoint.

    source.config ──▶ transformers config ──▶ CausalLM.from_config (fp32, eager attention)
    source.tensors ─────────────────────────▶ strict copy (missing / unexpected / shape checked)
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

import numpy as np

from calculet.errors import ModelError, RequestError
from calculet.reference.experts import stacked_view
from calculet.reference.metrics import topk_of
from calculet.sources.base import SourceModel

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "qwen3_moe", "mixtral", "qwen2_moe")
_LEGACY_ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_local_base_freq")
# Keys of config.json that describe the checkpoint file, not the model; passing them on would make
# transformers quantize, run remote code or pick a dtype for us.
_DROPPED_KEYS = ("architectures", "auto_map", "quantization_config", "torch_dtype", "dtype", "transformers_version")


def _require_torch():
    """Import torch and transformers, or say how to install them."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ModelError(
            "reference_not_installed",
            f"reference runs need torch and transformers ({exc}); "
            "install the reference extra: pip install -e '.[reference]'",
        ) from None
    return torch, transformers


def producer_versions() -> dict[str, str]:
    """Versions of the libraries that produce reference numbers (recorded in golden files)."""
    torch, transformers = _require_torch()
    return {"torch": torch.__version__, "transformers": transformers.__version__}


def reference_config_dict(config: dict) -> dict:
    """Normalise a source config to keyword arguments for the transformers config class.

    Accepts transformers-5 `rope_parameters` or the older `rope_theta` / `rope_scaling` /
    `rope_local_base_freq` keys (transformers converts those itself; when both are present
    `rope_parameters` wins). A multimodal `gemma3` config is reduced to its `text_config`.
    """
    if "model_type" not in config:
        raise ModelError("reference_config", "source config has no 'model_type'; cannot pick a transformers model class")
    cfg = dict(config)
    if cfg["model_type"] == "gemma3":
        cfg = {**cfg.get("text_config", cfg), "model_type": "gemma3_text"}
    model_type = cfg["model_type"]
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelError(
            "reference_unsupported",
            f"model_type {model_type!r} has no reference builder (supported: {', '.join(SUPPORTED_MODEL_TYPES)})",
        )
    for key in _DROPPED_KEYS + ("text_config", "vision_config"):
        cfg.pop(key, None)
    if cfg.get("rope_parameters") is not None:
        for key in _LEGACY_ROPE_KEYS:
            cfg.pop(key, None)
    return cfg


def _tie_groups(state: dict) -> list[list[str]]:
    """Names in the model's state dict that share storage (e.g. lm_head tied to embed_tokens)."""
    by_ptr: dict[tuple[int, tuple[int, ...]], list[str]] = {}
    for name, t in state.items():
        by_ptr.setdefault((t.data_ptr(), tuple(t.shape)), []).append(name)
    return list(by_ptr.values())


def _listing(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(sorted(names)[:limit])
    return f"{len(names)} ({shown}{', ...' if len(names) > limit else ''})"


def _plan_load(state: dict, source: SourceModel) -> list[str]:
    """Check that `source.tensors` names exactly the model's parameters; return the names to copy.

    Tied parameters (lm_head sharing embed_tokens) need one of their names; when the source gives
    both, both copies must be equal and only the first is copied.
    """
    given = set(source.tensors)
    groups = _tie_groups(state)
    unexpected = sorted(given - set(state))
    missing = [g[0] for g in groups if not given.intersection(g)]
    problems = []
    if missing:
        problems.append(f"missing tensors: {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {_listing(unexpected)}")
    if problems:
        raise ModelError(
            "reference_weights_mismatch",
            f"{source.path}: weights do not match the {source.config.get('model_type')} model built from its config; "
            + "; ".join(problems),
        )
    shape_of = getattr(source.tensors, "shape", None)
    wrong = []
    for name in sorted(given):
        shape = tuple(shape_of(name)) if shape_of else tuple(source.tensors[name].shape)
        if shape != tuple(state[name].shape):
            wrong.append(f"{name} has {list(shape)}, model wants {list(state[name].shape)}")
    if wrong:
        raise ModelError("reference_weights_shape", f"{source.path}: tensor shapes differ from the config: " + "; ".join(wrong[:8]))
    to_copy = []
    for group in groups:
        present = [n for n in group if n in given]
        first = source.tensors[present[0]] if len(present) > 1 else None
        for other in present[1:]:
            diff = float(np.max(np.abs(first - source.tensors[other])))
            if diff != 0.0:
                raise ModelError(
                    "reference_weights_tied",
                    f"{source.path}: {present[0]} and {other} are tied in the model but differ in the source "
                    f"(max abs difference {diff:.3g}); the config should say tie_word_embeddings: false",
                )
        to_copy.append(present[0])
    return to_copy


def _copy_tensors(torch, state: dict, source: SourceModel, names: list[str]) -> None:
    """Copy one tensor at a time (the source is lazy, so peak memory stays near one model)."""
    with torch.no_grad():
        for name in names:
            arr = np.array(source.tensors[name], dtype=np.float32, order="C", copy=True)
            state[name].copy_(torch.from_numpy(arr))


def build_reference_model(source: SourceModel):
    """A transformers CausalLM in fp32 eval mode holding exactly `source.tensors`."""
    torch, transformers = _require_torch()
    kwargs = reference_config_dict(source.config)
    model_type = kwargs.pop("model_type")
    try:
        config = transformers.AutoConfig.for_model(model_type, **kwargs)
    except (TypeError, ValueError, KeyError) as exc:
        raise ModelError("reference_config", f"{source.path}: transformers rejects the {model_type} config: {exc}") from None
    if getattr(config, "rope_parameters", None) is None:
        raise ModelError("reference_config", f"{source.path}: config has neither rope_parameters nor rope_theta")
    model = _uninitialized_model(transformers, config, torch.float32)
    state = model.state_dict()
    view = stacked_view(source.tensors, set(state))   # per-expert tensors -> transformers' stacked experts
    if view is not None:
        source = replace(source, tensors=view)
    _copy_tensors(torch, state, source, _plan_load(state, source))
    model.eval()
    model.requires_grad_(False)
    return model


def _uninitialized_model(transformers, config, dtype):
    """from_config without the random initialization of every parameter (about 7 s of the default
    model's 11 s build), since each one is overwritten from the source next (_plan_load refuses a
    missing one); buffers computed in the modules' __init__ (rotary frequencies, embedding scales) are
    kept, and the embeddings are tied as post-init ties them."""
    try:
        from transformers.initialization import no_init_weights      # transformers 5
    except ImportError:
        from transformers.modeling_utils import no_init_weights      # transformers 4
    with no_init_weights():
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=dtype)
    model.tie_weights()
    return model


def _check_ids(model, input_ids: list[int]) -> None:
    vocab = model.config.vocab_size
    if len(input_ids) == 0:
        raise RequestError("reference_empty_prompt", "input_ids is empty; a reference run needs at least one token")
    bad = [t for t in input_ids if not (0 <= int(t) < vocab)]
    if bad:
        raise RequestError("reference_bad_token", f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})")


def _cache_kwarg(model) -> str:
    """transformers 5.x renamed `past_key_values` to `cache` in forward(); use whichever exists."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _forward_last(torch, model, ids: list[int], cache: Any = None) -> Any:
    kwargs = {"use_cache": cache is not None, "logits_to_keep": 1}
    if cache is not None:
        kwargs[_cache_kwarg(model)] = cache
    out = model(torch.tensor([ids], dtype=torch.long), **kwargs)
    return out.logits[0, -1]  # [vocab]


def reference_last_logits(model, input_ids: list[int]) -> np.ndarray:
    """float32 [vocab]: the logits after the last prompt token."""
    torch, _ = _require_torch()
    _check_ids(model, input_ids)
    with torch.inference_mode():
        return _forward_last(torch, model, list(input_ids)).float().numpy().copy()


def _prefill_last(torch, model, ids: list[int], cache: Any, chunk: int | None) -> Any:
    """The last position's logits after feeding `ids` into `cache`, `chunk` tokens per forward.

    Chunks keep the eager attention matrix at chunk x context instead of context x context
    (a 32,768-token prompt in one forward would need 4 heads x 32k x 32k fp32 = 16 GiB per layer);
    the cache carries the earlier chunks exactly as it carries decode steps."""
    if chunk is None or len(ids) <= chunk:
        return _forward_last(torch, model, ids, cache)
    logits = None
    for start in range(0, len(ids), chunk):
        logits = _forward_last(torch, model, ids[start:start + chunk], cache)
    return logits


def reference_greedy(model, input_ids: list[int], steps: int, prefill_chunk: int | None = None) -> list[int]:
    """Exactly `steps` argmax tokens, decoding one token at a time through the model's KV cache.

    EOS is an ordinary token here (generation never stops early), so a runtime is compared on the
    same number of steps whatever the model emits. `prefill_chunk` feeds a long prompt that many
    tokens per forward (same result, bounded memory); None feeds it in one forward.
    """
    torch, transformers = _require_torch()
    _check_ids(model, input_ids)
    if steps < 0:
        raise RequestError("reference_bad_steps", f"steps must be >= 0, got {steps}")
    if prefill_chunk is not None and prefill_chunk < 1:
        raise RequestError("reference_bad_chunk", f"prefill_chunk must be >= 1 or None, got {prefill_chunk}")
    tokens: list[int] = []
    with torch.inference_mode():
        cache = transformers.DynamicCache(config=model.config)
        logits = _prefill_last(torch, model, list(input_ids), cache, prefill_chunk)
        for _ in range(steps):
            tokens.append(int(torch.argmax(logits)))
            if len(tokens) < steps:
                logits = _forward_last(torch, model, tokens[-1:], cache)
    return tokens


def reference_topk(model, input_ids: list[int], k: int) -> tuple[list[int], np.ndarray]:
    """Top-k ids (largest first) and float32 values of the last-position logits."""
    vocab = model.config.vocab_size
    if not 1 <= k <= vocab:
        raise RequestError("reference_bad_k", f"k must be in [1, {vocab}] (the vocabulary size), got {k}")
    return topk_of(reference_last_logits(model, input_ids), k)


def reference_greedy_steps(model, input_ids: list[int], steps: int, k: int) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray]:
    """`steps` greedy tokens and, at every step, the top-k of the logits that chose it.

    Returns (tokens, topk_ids int32 [steps, k], topk_logits float32 [steps, k], logsumexp float32
    [steps]); the log-sum-exp of each full row lets a reader recover the reference's log-softmax of
    any stored id. Step t's logits follow the prompt and tokens[:t], i.e. teacher forcing along the
    reference's own greedy path, so a runtime fed the same tokens is scored at every step.
    """
    torch, transformers = _require_torch()
    _check_ids(model, input_ids)
    vocab = model.config.vocab_size
    if steps < 1:
        raise RequestError("reference_bad_steps", f"steps must be >= 1, got {steps}")
    if not 1 <= k <= vocab:
        raise RequestError("reference_bad_k", f"k must be in [1, {vocab}] (the vocabulary size), got {k}")
    tokens: list[int] = []
    ids = np.zeros((steps, k), np.int32)
    values = np.zeros((steps, k), np.float32)
    lse = np.zeros(steps, np.float32)
    with torch.inference_mode():
        cache = transformers.DynamicCache(config=model.config)
        logits = _forward_last(torch, model, list(input_ids), cache)
        for t in range(steps):
            row = logits.float()
            lse[t] = float(torch.logsumexp(row.double(), dim=0))
            top_ids, top_values = topk_of(row.numpy(), k)
            ids[t], values[t] = top_ids, top_values
            tokens.append(top_ids[0])
            if t + 1 < steps:
                logits = _forward_last(torch, model, tokens[-1:], cache)
    return tokens, ids, values, lse


def reference_position_logprobs(model, input_ids: list[int], chunk: int = 128) -> np.ndarray:
    """float64 [n - 1]: log p(input_ids[i] | input_ids[:i]) for i = 1..n-1, one forward pass.

    The lm_head runs on `chunk` positions at a time, so a large vocabulary never needs a whole
    [n, vocab] logits tensor (262,144 x 1,024 fp32 would be 1 GiB)."""
    torch, _ = _require_torch()
    _check_ids(model, input_ids)
    if len(input_ids) < 2:
        raise RequestError("reference_short_text", "scoring needs at least 2 tokens")
    softcap = getattr(model.config, "final_logit_softcapping", None)
    ids = torch.tensor([list(input_ids)], dtype=torch.long)
    out = np.zeros(len(input_ids) - 1, np.float64)
    with torch.inference_mode():
        hidden = model.model(ids).last_hidden_state[0]                  # [n, H]
        for start in range(0, len(input_ids) - 1, chunk):
            stop = min(start + chunk, len(input_ids) - 1)
            logits = model.lm_head(hidden[start:stop]).double()         # [c, V]
            if softcap:
                logits = torch.tanh(logits / softcap) * softcap
            logp = torch.log_softmax(logits, dim=-1)
            target = ids[0, start + 1:stop + 1]
            out[start:stop] = logp.gather(1, target[:, None])[:, 0].numpy()
    return out


def reference_module_outputs(model, input_ids: list[int], modules: list[str]) -> dict[str, np.ndarray]:
    """float32 [n, width] per named module: its forward output over the prompt, captured by hooks.

    Names are the model's own (`model.layers.3.mlp`); `<module>:input` is the module's first input
    instead (`model.layers.3.self_attn.o_proj:input`: the attention's context). A module returning a
    tuple (attention returns (output, weights)) contributes its first element; per-head outputs
    [1, n, heads, D] or [1, heads, n, D] are flattened to [n, heads * D] (when heads == n the first
    layout is assumed)."""
    torch, _ = _require_torch()
    _check_ids(model, input_ids)
    captured: dict[str, np.ndarray] = {}
    handles = []
    n = len(input_ids)

    def keep(name, out):
        if out.dim() == 4 and out.shape[2] == n and out.shape[1] != n:  # [1, heads, n, D] (Gemma 3's q/k norms)
            out = out.transpose(1, 2)
        captured[name] = out.detach().float().reshape(out.shape[0] * out.shape[1], -1).numpy().copy()

    def hook(name):
        def save(_module, _args, output):
            keep(name, output[0] if isinstance(output, tuple) else output)
        return save

    def input_hook(name):
        def save(_module, args):
            keep(name, args[0])
        return save

    try:
        for name in modules:
            path, _, what = name.partition(":")
            try:
                module = model.get_submodule(path)
            except AttributeError:
                raise ModelError("reference_no_module", f"the reference model has no module {path!r}") from None
            if what == "input":
                handles.append(module.register_forward_pre_hook(input_hook(name)))
            elif what:
                raise ModelError("reference_no_module", f"{name!r}: only `<module>:input` names a module's input")
            else:
                handles.append(module.register_forward_hook(hook(name)))
        with torch.inference_mode():
            model(torch.tensor([list(input_ids)], dtype=torch.long), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return captured
