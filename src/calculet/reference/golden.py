"""Golden outputs: reference top-k logits and greedy tokens for fixed prompts, and the check.

    make_golden (torch, at compile time) ──▶ golden/golden.json ──▶ read_golden + check_against_golden
                                                                     (numpy only, at validate/serve time)

Only `make_golden` needs torch/transformers, and it imports them lazily; reading and checking a
golden file work in a runtime that has neither.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from calculet.errors import ModelError
from calculet.reference.metrics import cosine, greedy_agreement, topk_of
from calculet.reference.prompts import GoldenPrompt, golden_prompt_ids  # noqa: F401  (re-exported)
from calculet.sources.base import SourceModel

GOLDEN_SCHEMA = "calculet.golden/1"
GOLDEN_DIR = "golden"          # inside a calbin
GOLDEN_FILE = "golden.json"    # inside GOLDEN_DIR

RunFn = Callable[[list[int], int], "tuple[np.ndarray, list[int]]"]
# Teacher forcing: given the prompt and the reference's greedy tokens, the runtime feeds those tokens
# (not its own) and returns its argmax after the prompt and after each fed token.
ForcedFn = Callable[[list[int], list[int]], list[int]]


@dataclass(frozen=True)
class Thresholds:
    """What a runtime must reach on every golden prompt. Defaults are for fp32 graphs."""

    greedy_agreement: float = 1.0       # min fraction of greedy tokens equal before the first divergence
    topk_overlap: float = 1.0           # min |ours ∩ reference top-k| / k
    logits_cosine: float = 0.9999       # min cosine of our logits vs the reference on the reference top-k ids
    max_abs_logit_error: float = 1e-3   # max |ours - reference| on the reference top-k ids
    topk_tie_margin: float = 1e-3       # a reference id within this of the (k+1)-th logit may drop out of our top-k
    forced_agreement: float = 1.0       # min fraction, over the whole golden set, of teacher-forced argmax equal to the reference

    def __post_init__(self) -> None:
        for name in ("greedy_agreement", "topk_overlap", "forced_agreement"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"threshold {name} must be in [0, 1], got {getattr(self, name)}")
        if not -1.0 <= self.logits_cosine <= 1.0:
            raise ValueError(f"threshold logits_cosine must be in [-1, 1], got {self.logits_cosine}")
        for name in ("max_abs_logit_error", "topk_tie_margin"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"threshold {name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class GoldenEntry:
    """Reference outputs for one prompt."""

    name: str
    input_ids: list[int]
    topk_ids: list[int]            # largest logit first
    topk_logits: list[float]       # float32 values of those ids
    next_logit: float | None       # the (k+1)-th largest logit (None when vocab == k): the top-k boundary
    greedy_tokens: list[int]       # n_tokens argmax tokens, EOS not special

    def __post_init__(self) -> None:
        if not self.input_ids:
            raise ValueError(f"golden entry {self.name!r} has no input_ids")
        if not self.topk_ids or len(self.topk_ids) != len(self.topk_logits):
            raise ValueError(f"golden entry {self.name!r}: {len(self.topk_ids)} top-k ids but {len(self.topk_logits)} logits")


@dataclass(frozen=True)
class SkippedPrompt:
    name: str
    reason: str


@dataclass(frozen=True)
class GoldenSource:
    kind: str                # "hf" | "gguf"
    model_type: str
    vocab_size: int
    source_sha256: str
    producer: dict[str, str] = field(default_factory=dict)  # torch / transformers versions


@dataclass(frozen=True)
class Golden:
    source: GoldenSource
    n_tokens: int
    topk: int
    thresholds: Thresholds
    prompts: list[GoldenEntry]
    skipped: list[SkippedPrompt] = field(default_factory=list)

    def __post_init__(self) -> None:
        for p in self.prompts:
            if len(p.topk_ids) != self.topk or len(p.greedy_tokens) != self.n_tokens:
                raise ValueError(
                    f"golden entry {p.name!r} has {len(p.topk_ids)} top-k ids and {len(p.greedy_tokens)} greedy tokens; "
                    f"the golden set says topk={self.topk}, n_tokens={self.n_tokens}"
                )


def _f32(x: float) -> float:
    """The shortest decimal that reads back as the same float32 (keeps golden.json small and exact)."""
    return float(str(np.float32(x)))


def make_golden(
    source: SourceModel,
    prompts: list[GoldenPrompt],
    n_tokens: int = 32,
    topk: int = 10,
    thresholds: Thresholds = Thresholds(),
    progress=None,
) -> Golden:
    """Run the Hugging Face reference (fp32) on every prompt that is not skipped.

    `progress`, when given, gets `.update(1)` per prompt (a tqdm bar, for example).
    """
    from calculet.reference import hf  # torch lives behind this import

    runnable = [p for p in prompts if not p.skipped]
    if not runnable:
        raise ModelError("golden_no_prompts", "no golden prompt fits the context; skipped: " + "; ".join(f"{p.name}: {p.skipped}" for p in prompts))
    model = hf.build_reference_model(source)
    vocab = int(model.config.vocab_size)
    if not 1 <= topk <= vocab:
        raise ValueError(f"topk must be in [1, {vocab}], got {topk}")
    entries = []
    for p in prompts:
        if progress is not None:
            progress.update(1)
        if p.skipped:
            continue
        logits = hf.reference_last_logits(model, p.input_ids)
        ids, values = topk_of(logits, min(topk + 1, vocab))
        entries.append(GoldenEntry(
            name=p.name,
            input_ids=list(p.input_ids),
            topk_ids=ids[:topk],
            topk_logits=[_f32(v) for v in values[:topk]],
            next_logit=_f32(values[topk]) if len(ids) > topk else None,
            greedy_tokens=hf.reference_greedy(model, p.input_ids, n_tokens),
        ))
    origin = GoldenSource(
        kind=source.kind,
        model_type=str(model.config.model_type),
        vocab_size=vocab,
        source_sha256=source.source_sha256,
        producer=hf.producer_versions(),
    )
    skipped = [SkippedPrompt(p.name, p.skipped) for p in prompts if p.skipped]
    return Golden(origin, n_tokens, topk, thresholds, entries, skipped)


# ---------------------------------------------------------------------------------------------- I/O


def write_golden(golden: Golden, folder: str | Path) -> Path:
    """Write `<folder>/golden.json` (folder is the calbin's `golden/`); number lists stay on one line."""
    path = Path(folder) / GOLDEN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"schema": GOLDEN_SCHEMA, **asdict(golden)}, indent=2, ensure_ascii=False)
    # "[\n" never occurs inside a JSON string, so only multi-line number arrays are touched
    text = re.sub(r"\[\n\s*([-0-9.eE+,\s]*?)\s*\]", lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text)
    path.write_text(text + "\n")
    return path


def _build(cls, data, where: str):
    """Construct dataclass `cls` from a dict, turning a wrong or missing field into a clear error."""
    if not isinstance(data, dict):
        raise ModelError("golden_schema", f"{where}: expected an object, got {type(data).__name__}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ModelError("golden_schema", f"{where}: {exc}") from None
    except ValueError as exc:
        raise ModelError("golden_schema", f"{where}: {exc}") from None


def read_golden(folder: str | Path) -> Golden:
    """Read the golden file from a calbin folder (`<calbin>/golden/golden.json`) or from its `golden/` folder."""
    folder = Path(folder)
    path = folder / GOLDEN_FILE
    if not path.exists() and (folder / GOLDEN_DIR / GOLDEN_FILE).exists():
        path = folder / GOLDEN_DIR / GOLDEN_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelError("golden_missing", f"{path}: no golden file (compile with golden outputs to enable this check)") from None
    except json.JSONDecodeError as exc:
        raise ModelError("golden_bad_json", f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != GOLDEN_SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise ModelError("golden_schema", f"{path}: schema is {found!r}, this reader understands {GOLDEN_SCHEMA!r}")
    try:
        prompts = [_build(GoldenEntry, e, f"{path}: prompts[{i}]") for i, e in enumerate(doc["prompts"])]
        skipped = [_build(SkippedPrompt, s, f"{path}: skipped[{i}]") for i, s in enumerate(doc.get("skipped", []))]
        fields = dict(
            source=_build(GoldenSource, doc["source"], f"{path}: source"),
            n_tokens=doc["n_tokens"],
            topk=doc["topk"],
            thresholds=_build(Thresholds, doc["thresholds"], f"{path}: thresholds"),
            prompts=prompts,
            skipped=skipped,
        )
    except KeyError as exc:
        raise ModelError("golden_schema", f"{path}: missing field {exc}") from None
    except TypeError as exc:
        raise ModelError("golden_schema", f"{path}: {exc}") from None
    return _build(Golden, fields, str(path))


# -------------------------------------------------------------------------------------------- check


@dataclass(frozen=True)
class PromptCheck:
    name: str
    prompt_length: int
    greedy_agreement: float         # fraction equal before the first divergence
    greedy_matches: int             # positions equal overall, out of n_tokens
    first_divergence: int | None
    topk_overlap: float
    logits_cosine: float
    max_abs_logit_error: float
    failures: list[str]             # one line per threshold missed, with the numbers
    forced_matches: int | None = None  # teacher-forced argmax equal to the reference, out of n_tokens

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class GoldenReport:
    thresholds: Thresholds
    n_tokens: int
    prompts: list[PromptCheck]

    @property
    def forced_agreement(self) -> float | None:
        """Teacher-forced argmax agreement over the whole set (None when not measured)."""
        counted = [p.forced_matches for p in self.prompts if p.forced_matches is not None]
        if not counted or len(counted) != len(self.prompts):
            return None
        return sum(counted) / (self.n_tokens * len(counted))

    @property
    def set_failures(self) -> list[str]:
        forced = self.forced_agreement
        if forced is not None and not forced >= self.thresholds.forced_agreement:
            return [f"teacher-forced greedy agreement {forced:.3f} < {self.thresholds.forced_agreement} over the golden set"]
        return []

    @property
    def passed(self) -> bool:
        return all(p.passed for p in self.prompts) and not self.set_failures

    def to_dict(self) -> dict:
        """JSON-ready: NaN/inf metrics (a runtime that produced NaN logits) become None."""
        doc = {"passed": self.passed, "forced_agreement": self.forced_agreement, "set_failures": self.set_failures,
               **asdict(self)}
        for p, check in zip(doc["prompts"], self.prompts):
            p["passed"] = check.passed
            for key in ("logits_cosine", "max_abs_logit_error"):
                if not math.isfinite(p[key]):
                    p[key] = None
        return doc

    def summary(self) -> str:
        lines = [f"golden check: {'PASS' if self.passed else 'FAIL'} ({len(self.prompts)} prompts)"]
        for p in self.prompts:
            lines.append(
                f"  {p.name} [{p.prompt_length} ids]: greedy {p.greedy_agreement:.3f} ({p.greedy_matches}/{self.n_tokens}), "
                f"top-k overlap {p.topk_overlap:.2f}, cosine {p.logits_cosine:.6f}, max abs {p.max_abs_logit_error:.3g}"
            )
            if p.forced_matches is not None:
                lines[-1] += f", teacher-forced {p.forced_matches}/{self.n_tokens}"
            lines.extend(f"    FAIL {f}" for f in p.failures)
        if self.forced_agreement is not None:
            lines.append(f"  set: teacher-forced agreement {self.forced_agreement:.3f}")
        lines.extend(f"  FAIL {f}" for f in self.set_failures)
        return "\n".join(lines)


def _check_logits(ref: GoldenEntry, logits: np.ndarray, vocab: int, th: Thresholds, failures: list[str]):
    """Top-k overlap, cosine and max abs error of our logits on the reference top-k ids."""
    if logits.ndim != 1 or logits.size != vocab:
        failures.append(f"logits have shape {list(logits.shape)}, expected [{vocab}]")
        return 0.0, float("nan"), float("inf")
    k = len(ref.topk_ids)
    ref_vals = np.asarray(ref.topk_logits, dtype=np.float32)
    ours_on_ref = logits[ref.topk_ids]
    errors = np.abs(ours_on_ref.astype(np.float64) - ref_vals)
    max_abs = float(np.max(errors)) if np.all(np.isfinite(errors)) else float("inf")
    cos = cosine(ours_on_ref, ref_vals)
    our_ids, _ = topk_of(logits, k)
    missing = [i for i in ref.topk_ids if i not in set(our_ids)]
    boundary = ref.next_logit if ref.next_logit is not None else -math.inf
    excused = [i for i in missing if ref_vals[ref.topk_ids.index(i)] - boundary <= th.topk_tie_margin]
    overlap = (k - len(missing) + len(excused)) / k
    if not overlap >= th.topk_overlap:
        failures.append(f"top-k overlap {overlap:.3f} < {th.topk_overlap} (reference ids missing from ours: {missing[:10]})")
    if not cos >= th.logits_cosine:
        failures.append(f"logits cosine on reference top-{k} {cos:.6f} < {th.logits_cosine}")
    if not max_abs <= th.max_abs_logit_error:
        worst = int(np.argmax(np.nan_to_num(errors, nan=np.inf)))
        failures.append(
            f"max abs logit error {max_abs:.4g} > {th.max_abs_logit_error} "
            f"(token {ref.topk_ids[worst]}: ours {float(ours_on_ref[worst]):.6g}, reference {float(ref_vals[worst]):.6g})"
        )
    return overlap, cos, max_abs


def check_against_golden(golden: Golden, run_fn: RunFn, thresholds: Thresholds | None = None,
                         forced_fn: ForcedFn | None = None) -> GoldenReport:
    """Run `run_fn(input_ids, n_tokens) -> (last_logits [vocab], greedy_tokens)` on every golden prompt.

    With `forced_fn`, also measure teacher-forced agreement: the share of positions where our argmax,
    given the reference's own tokens so far, equals the reference's next token. Free-running greedy
    agreement stops meaning much after the first near-tie flips; teacher forcing scores every position.

    `thresholds` overrides the ones stored in the golden file (e.g. for a quantized policy).
    Exceptions from `run_fn` propagate: a runtime that crashes has not produced numbers to judge.
    """
    th = thresholds or golden.thresholds
    checks = []
    for ref in golden.prompts:
        logits, tokens = run_fn(list(ref.input_ids), golden.n_tokens)
        logits = np.asarray(logits, dtype=np.float32)
        tokens = [int(t) for t in tokens]
        failures: list[str] = []
        overlap, cos, max_abs = _check_logits(ref, logits, golden.source.vocab_size, th, failures)
        agree = greedy_agreement(tokens, ref.greedy_tokens)
        if len(tokens) != golden.n_tokens:
            failures.append(f"runtime returned {len(tokens)} greedy tokens, expected {golden.n_tokens}")
        if not agree.prefix_fraction >= th.greedy_agreement:
            at = agree.first_divergence
            got = tokens[at] if at is not None and at < len(tokens) else "(missing)"
            failures.append(
                f"greedy agreement {agree.prefix_fraction:.3f} < {th.greedy_agreement} (first divergence at token {at}: "
                f"ours {got}, reference {ref.greedy_tokens[at]}; {agree.matches}/{golden.n_tokens} tokens match)"
            )
        forced_matches = None
        if forced_fn is not None:
            forced = [int(t) for t in forced_fn(list(ref.input_ids), list(ref.greedy_tokens))]
            forced_matches = sum(1 for a, b in zip(forced, ref.greedy_tokens) if a == b)
        checks.append(PromptCheck(
            forced_matches=forced_matches,
            name=ref.name,
            prompt_length=len(ref.input_ids),
            greedy_agreement=agree.prefix_fraction,
            greedy_matches=agree.matches,
            first_divergence=agree.first_divergence,
            topk_overlap=overlap,
            logits_cosine=cos,
            max_abs_logit_error=max_abs,
            failures=failures,
        ))
    return GoldenReport(th, golden.n_tokens, checks)
