"""The context a compile gets when none is asked for, and the check of one that is.

    context = what the model was trained for (max_position_embeddings; a GGUF's context_length),
              cut to the largest multiple of CONTEXT_STEP whose KV for all lanes fits the budget
    budget  = --kv-memory BYTES, or auto: the host's available memory (MemAvailable) less the
              weights compile will store and a margin of AUTO_MARGIN_BYTES (sessions, prepacked
              weights, workspace, the rest of the machine)

KV bytes come from the one KV layout rule (compiler/kv_layout.py: sliding-window layers on rings),
so a model like Gemma 3 270M (15 of 18 layers local) fits its trained 32,768 positions in 8 lanes
with 1.65 GiB of fp32 KV. An explicit --context that does not fit is refused with those numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from calculet.compiler.kv_layout import KV_DTYPE, kv_layout
from calculet.errors import RequestError
from calculet.models.base import ModelSpec
from calculet.units import human_bytes

AUTO_MARGIN_BYTES = 2 * 1024**3
CONTEXT_STEP = 128
MIN_CONTEXT = 16


@dataclass(frozen=True)
class Budget:
    bytes: int
    why: str            # where the number comes from, for the log line and errors


@dataclass(frozen=True)
class ContextChoice:
    context: int
    kv_bytes: int       # all lanes
    budget: Budget
    reason: str


def available_memory() -> int:
    """MemAvailable from /proc/meminfo (Linux), else the physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def kv_budget(kv_memory: int | None, weights_bytes: int, available: int | None = None) -> Budget:
    if kv_memory is not None:
        return Budget(kv_memory, f"--kv-memory {human_bytes(kv_memory)}")
    available = available_memory() if available is None else available
    budget = max(0, available - weights_bytes - AUTO_MARGIN_BYTES)
    return Budget(budget, f"auto: available memory {human_bytes(available)} less the weights "
                          f"{human_bytes(weights_bytes)} and a margin of {human_bytes(AUTO_MARGIN_BYTES)}")


def choose_context(spec: ModelSpec, lanes: int, chunks: tuple[int, ...], budget: Budget,
                   asked: int | None = None, rings: bool = True, dtype: str = KV_DTYPE) -> ContextChoice:
    """`asked`: an explicit --context, checked; None: the trained context, cut to the budget.
    `dtype`: the KV buffers' numpy dtype (fp16 KV fits twice the positions of fp32)."""
    kv = lambda c: kv_layout(spec, lanes, c, chunks, True, rings, dtype).total_bytes  # noqa: E731
    trained = spec.max_position_embeddings
    if asked is not None:
        need = kv(asked)
        if need > budget.bytes:
            fits = _largest(kv, budget.bytes, max(asked, max(chunks)), max(chunks))
            raise RequestError("context_does_not_fit", (
                f"--context {asked:,} with {lanes} lanes needs {human_bytes(need)} of KV "
                f"({human_bytes(need // lanes)} per lane), over the budget of {human_bytes(budget.bytes)} ({budget.why}); "
                + (f"the largest context that fits {lanes} lanes is {fits:,}" if fits else
                   f"not even context {max(chunks)} fits {lanes} lanes")
                + "; lower --context or --lanes, or raise --kv-memory"))
        return ContextChoice(asked, need, budget, f"--context {asked:,} as asked ({human_bytes(need)} of KV for "
                                                  f"{lanes} lanes, within {human_bytes(budget.bytes)}: {budget.why})")
    top = max(trained, max(chunks), MIN_CONTEXT)
    if kv(top) <= budget.bytes:
        return ContextChoice(top, kv(top), budget, f"context {top:,}, what the model was trained for "
                                                   f"(max_position_embeddings): {human_bytes(kv(top))} of KV for "
                                                   f"{lanes} lanes, within {human_bytes(budget.bytes)} ({budget.why})")
    fits = _largest(kv, budget.bytes, top, max(max(chunks), MIN_CONTEXT))
    if not fits:
        raise RequestError("context_does_not_fit", (
            f"no context fits {lanes} lanes: context {max(chunks)} needs {human_bytes(kv(max(chunks)))} of KV, over "
            f"the budget of {human_bytes(budget.bytes)} ({budget.why}); lower --lanes or raise --kv-memory"))
    return ContextChoice(fits, kv(fits), budget, (
        f"context {fits:,} of the {trained:,} the model was trained for: the largest multiple of {CONTEXT_STEP} whose KV "
        f"for {lanes} lanes ({human_bytes(kv(fits))}) fits {human_bytes(budget.bytes)} ({budget.why})"))


def _largest(kv, budget: int, top: int, bottom: int) -> int:
    """The largest multiple of CONTEXT_STEP in [bottom, top] (or bottom itself) whose KV fits; 0 if none."""
    best = 0
    c = (top // CONTEXT_STEP) * CONTEXT_STEP
    lo, hi = 1, c // CONTEXT_STEP                     # binary search over multiples (KV grows with context)
    while lo <= hi:
        mid = (lo + hi) // 2
        if mid * CONTEXT_STEP >= bottom and kv(mid * CONTEXT_STEP) <= budget:
            best, lo = mid * CONTEXT_STEP, mid + 1
        elif mid * CONTEXT_STEP < bottom:
            lo = mid + 1
        else:
            hi = mid - 1
    if not best and kv(bottom) <= budget:
        best = bottom
    return best


def resolve_context(spec: ModelSpec, options, log=print):
    """`options` with a concrete context: the chosen one when none is asked; an asked one as is,
    refused when it does not fit --kv-memory. Against the auto budget (a shared host's available
    memory changes from minute to minute) an asked context that does not fit only gets a warning."""
    from calculet.compiler.weight_plan import weight_plan

    trained = max(spec.max_position_embeddings, max(options.prefill_chunks))
    weights = weight_plan(spec, replace(options, context=options.context or trained)).file_bytes
    budget = kv_budget(options.kv_memory, weights)
    try:
        choice = choose_context(spec, options.lanes, tuple(options.prefill_chunks), budget, options.context,
                                options.kv_rings, options.kv_numpy_dtype)
    except RequestError as exc:
        if options.context is None or options.kv_memory is not None:
            raise
        log(f"warning: {exc.message}")
        return options
    if options.context is None or options.kv_memory is not None:
        log(choice.reason)
    return replace(options, context=choice.context)
