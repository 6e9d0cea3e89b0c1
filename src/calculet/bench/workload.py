"""The prompts a run sends, grouped into phases (one load level × one prompt bucket).

A prompts file is JSONL, one object per line with `prompt` (text) or `messages` (chat), and
optionally `max_tokens`, `prompt_tokens` and `bucket`. `RUN/prompts.jsonl` written by a run has this
form, so a second server can be sent exactly the same prompts (`--prompts RUN/prompts.jsonl`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calculet.bench.config import AUTO_BUCKETS, DEFAULT_REQUESTS, BenchConfig, Load
from calculet.bench.tokens import TokenCounter, exact_prompt
from calculet.errors import RequestError


@dataclass(frozen=True)
class Prompt:
    text: str | None                         # completion prompt, or the user message for chat
    messages: tuple[dict[str, Any], ...] | None
    max_tokens: int
    bucket: int | None = None
    target_tokens: int | None = None         # counted by the target's tokenizer, when known

    def __post_init__(self) -> None:
        if (self.text is None) == (self.messages is None):
            raise ValueError("a prompt has either text or messages")

    def body(self, api: str) -> dict[str, Any]:
        """The prompt part of the request body."""
        if api == "chat":
            messages = self.messages or ({"role": "user", "content": self.text},)
            return {"messages": list(messages)}
        if self.text is None:
            raise RequestError("bad_prompts", "a prompt given as chat `messages` needs --api chat")
        return {"prompt": self.text}

    def to_json(self) -> str:
        data: dict[str, Any] = {"max_tokens": self.max_tokens}
        if self.text is not None:
            data["prompt"] = self.text
        else:
            data["messages"] = list(self.messages or ())
        if self.bucket is not None:
            data["bucket"] = self.bucket
        if self.target_tokens is not None:
            data["prompt_tokens"] = self.target_tokens
        return json.dumps(data, ensure_ascii=False)


@dataclass(frozen=True)
class Phase:
    scenario: str
    load: Load
    prompts: tuple[Prompt, ...]


def read_prompts_file(path: Path, default_max_tokens: int) -> list[Prompt]:
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            text, messages = data.get("prompt"), data.get("messages")
            if messages is not None:
                messages = tuple(messages)
            prompts.append(Prompt(
                text=text, messages=messages,
                max_tokens=int(data.get("max_tokens", default_max_tokens)),
                bucket=data.get("bucket"), target_tokens=data.get("prompt_tokens"),
            ))
        except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
            raise RequestError("bad_prompts", f"{path}:{number}: need an object with `prompt` or "
                               f"`messages` (and optional max_tokens): {exc}") from None
    if not prompts:
        raise RequestError("bad_prompts", f"{path} holds no prompts")
    return prompts


def bucket_prompts(counter: TokenCounter, bucket: int, n: int, max_tokens: int, seed: int) -> list[Prompt]:
    rng = random.Random(f"{seed}/{bucket}")
    return [Prompt(text=exact_prompt(counter, bucket, rng), messages=None, max_tokens=max_tokens,
                   bucket=bucket, target_tokens=bucket) for _ in range(n)]


def plan_phases(config: BenchConfig, counter: TokenCounter | None,
                context: int | None) -> tuple[list[Prompt], list[Phase], list[str]]:
    """Warm-up prompts, the phases in order, and notes for the report (dropped buckets, …)."""
    workload, limits, notes = config.workload, config.limits, []
    out = workload.output_tokens
    if workload.prompts_file is not None:
        return _phases_from_file(config, read_prompts_file(workload.prompts_file, out))

    if context is None and workload.prompt_tokens == AUTO_BUCKETS:
        raise RequestError("unknown_context", "--prompt-tokens auto needs the model's context length: the "
                           "server does not report it, so give --max-context N")
    if counter is None:
        raise RequestError("no_tokenizer", "prompt-length buckets need a tokenizer (--tokenizer or /tokenize)")
    buckets = list(workload.prompt_tokens)
    if context is not None:
        fits = [b for b in buckets if b + out <= context]
        dropped = [b for b in buckets if b + out > context]
        if dropped:
            notes.append(f"prompt buckets {dropped} dropped: with {out} output tokens they exceed the "
                         f"context of {context} tokens")
        buckets = fits
        if not buckets:
            raise RequestError("prompt_too_long", f"no prompt bucket fits the context of {context} tokens "
                               f"with {out} output tokens")
    n = limits.requests or DEFAULT_REQUESTS
    by_bucket = {b: bucket_prompts(counter, b, n * len(config.loads), out, config.seed) for b in buckets}
    phases = []
    for i, load in enumerate(config.loads):
        for b in buckets:
            prompts = tuple(by_bucket[b][i * n:(i + 1) * n])
            phases.append(Phase(f"{load.label}/p{b}/o{out}", load, prompts))
    warmup = bucket_prompts(counter, buckets[0], limits.warmup, out, config.seed + 1) if limits.warmup else []
    return warmup, phases, notes


def _phases_from_file(config: BenchConfig, pool: list[Prompt]) -> tuple[list[Prompt], list[Phase], list[str]]:
    """Prompts are taken in file order: per bucket (when every prompt names one), phase after phase,
    then the warm-up. A run's own prompts.jsonl (written in that order) thus gives a second run the
    same prompts in the same phases under the same scenario names."""
    limits, notes = config.limits, []
    groups: dict[int | None, list[Prompt]] = {}
    named = all(p.bucket is not None for p in pool)
    for p in pool:
        groups.setdefault(p.bucket if named else None, []).append(p)
    loads = config.loads
    n = limits.requests or max(1, min(len(g) for g in groups.values()) // len(loads))
    reused = False

    def take(group: list[Prompt], start: int, count: int) -> list[Prompt]:
        nonlocal reused
        reused |= start + count > len(group)
        return [group[(start + k) % len(group)] for k in range(count)]

    phases = []
    for i, load in enumerate(loads):
        for bucket, group in groups.items():
            # A prompt's own max_tokens (as a run's prompts.jsonl holds) names the scenario.
            name = f"{load.label}/p{bucket}/o{group[0].max_tokens}" if bucket is not None else load.label
            phases.append(Phase(name, load, tuple(take(group, i * n, n))))
    first = next(iter(groups.values()))
    warmup = take(first, len(loads) * n, limits.warmup) if limits.warmup else []
    if reused:
        notes.append("the prompts file holds too few prompts for every phase and the warm-up: some were "
                     "sent more than once, and a server with a prompt cache may answer those faster")
    return warmup, phases, notes


def prompts_in_file_order(phases: list[Phase], warmup: list[Prompt]) -> list[Prompt]:
    """The order `_phases_from_file` reads back: every phase's prompts, then the warm-up."""
    return [p for phase in phases for p in phase.prompts] + list(warmup)
