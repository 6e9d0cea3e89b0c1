"""`calculet compare`: a calbin against a reference set, step by step, with thresholds for CI.

For each prompt the runtime is fed the reference's own greedy tokens (teacher forcing) and every
step's full logits row is scored against the reference's stored top-k:

    agreement       our argmax == the reference's greedy token (over all steps of all prompts)
    first divergence the first step where they differ; up to that step a free-running greedy run
                     feeds exactly the tokens the reference fed, so this *is* the free-running
                     first-divergence step, measured in the same single pass
    top-k overlap    |our top-k ∩ reference top-k| / k
    cosine, max-abs  of our logits against the reference's on the reference's top-k ids
    logprob error    |our log-softmax - the reference's| on those ids (the values `logprobs` and
                     `top_logprobs` report); rows of a coarse head hold approximate values outside
                     its candidates, and this says how approximate the log-sum-exp becomes

The reference stores only top-k values, so cosine and max-abs are over those k ids per step.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from calculet.errors import RequestError
from calculet.reference.metrics import cosine
from calculet.reference.sets import ReferenceSet, RefPrompt


@dataclass(frozen=True)
class StepScores:
    """Per-step scores of one prompt (all lists have one entry per step)."""
    match: list[bool]
    topk_overlap: list[float]
    cosine: list[float]
    max_abs: list[float]
    logprob_error: list[float]


@dataclass(frozen=True)
class PromptResult:
    name: str
    group: str
    prompt_length: int
    steps: int
    forced_matches: int
    first_divergence: int | None     # None: every step agreed
    topk_overlap: float              # mean over steps
    min_cosine: float
    max_abs: float
    max_logprob_error: float
    per_step: StepScores

    @property
    def agreement(self) -> float:
        return self.forced_matches / self.steps


@dataclass(frozen=True)
class Thresholds:
    """CI gates; None means not checked."""
    min_agreement: float | None = None
    min_topk_overlap: float | None = None

    def __post_init__(self) -> None:
        for name in ("min_agreement", "min_topk_overlap"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= 1.0:
                raise RequestError("bad_option", f"--{name.replace('_', '-')} must be in [0, 1], got {v}")


@dataclass(frozen=True)
class CompareReport:
    calbin: str
    policy: str
    reference: dict                  # source identity of the reference set + tokens/topk
    prompts: tuple[PromptResult, ...]
    skipped: tuple[dict, ...] = field(default_factory=tuple)   # {"name", "reason"}
    same_source: bool = True         # the calbin's source SHA-256 equals the reference set's

    @property
    def steps(self) -> int:
        return sum(p.steps for p in self.prompts)

    @property
    def agreement(self) -> float:
        return sum(p.forced_matches for p in self.prompts) / self.steps if self.steps else float("nan")

    @property
    def topk_overlap(self) -> float:
        scores = [s for p in self.prompts for s in p.per_step.topk_overlap]
        return float(np.mean(scores)) if scores else float("nan")

    @property
    def all_equal(self) -> int:
        """Prompts whose every step agreed (= free-running greedy equal to the reference's)."""
        return sum(1 for p in self.prompts if p.first_divergence is None)

    def worst(self, n: int = 10) -> list[PromptResult]:
        def key(p: PromptResult):
            div = p.first_divergence if p.first_divergence is not None else math.inf
            return (p.agreement, div, _nan_low(p.min_cosine), -_nan_high(p.max_abs))
        return sorted(self.prompts, key=key)[:n]

    def failures(self, th: Thresholds) -> list[str]:
        out = []
        if not self.prompts:
            out.append("no prompt of the reference set fits this calbin's context")
            return out
        if th.min_agreement is not None and not self.agreement >= th.min_agreement:
            out.append(f"teacher-forced agreement {self.agreement:.4f} < --min-agreement {th.min_agreement}")
        if th.min_topk_overlap is not None and not self.topk_overlap >= th.min_topk_overlap:
            out.append(f"top-k overlap {self.topk_overlap:.4f} < --min-topk-overlap {th.min_topk_overlap}")
        return out

    def summary(self) -> dict:
        cos = [c for p in self.prompts for c in p.per_step.cosine]
        err = [e for p in self.prompts for e in p.per_step.max_abs]
        lp = [e for p in self.prompts for e in p.per_step.logprob_error]
        return {
            "prompts": len(self.prompts), "steps": self.steps, "skipped": len(self.skipped),
            "agreement": self.agreement, "all_steps_equal": self.all_equal, "topk_overlap": self.topk_overlap,
            "cosine_min": _min(cos), "cosine_mean": _mean(cos), "max_abs_max": _max(err), "max_abs_mean": _mean(err),
            "logprob_error_max": _max(lp), "logprob_error_mean": _mean(lp),
        }

    def to_dict(self, th: Thresholds | None = None) -> dict:
        doc = {"calbin": self.calbin, "policy": self.policy, "reference": self.reference, "same_source": self.same_source,
               "summary": self.summary(),
               "worst": [p.name for p in self.worst()], "prompts": [_finite(asdict(p)) for p in self.prompts],
               "skipped": list(self.skipped)}
        if th is not None:
            doc["thresholds"] = asdict(th)
            doc["failures"] = self.failures(th)
            doc["passed"] = not doc["failures"]
        return _finite(doc)


def _min(xs):
    xs = [x for x in xs if not math.isnan(x)]
    return min(xs) if xs else float("nan")


def _max(xs):
    return max(xs) if xs else float("nan")


def _mean(xs):
    return float(np.mean(xs)) if xs else float("nan")


def _nan_low(x: float) -> float:
    return -math.inf if math.isnan(x) else x


def _nan_high(x: float) -> float:
    return math.inf if math.isnan(x) else x


def _finite(obj):
    """JSON has no NaN/inf: they become None (a runtime that produced NaN logits)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


# --------------------------------------------------------------------------------------- scoring


def score_step(row: np.ndarray, ref: RefPrompt, t: int) -> tuple[bool, float, float, float, float]:
    """(match, top-k overlap, cosine, max abs, logprob error) of our row [V] at step t."""
    row = np.asarray(row, np.float32)
    ids, values = ref.topk_ids[t], ref.topk_logits[t]
    k = ids.size
    ours = row[ids].astype(np.float64)
    errors = np.abs(ours - values)
    max_abs = float(errors.max()) if np.all(np.isfinite(errors)) else math.inf
    ours_top = np.argpartition(-row, k - 1)[:k] if k < row.size else np.arange(row.size)
    overlap = len(set(ours_top.tolist()) & set(ids.tolist())) / k
    wide = row.astype(np.float64)
    top = float(wide.max())
    our_lse = top + math.log(float(np.exp(wide - top).sum())) if math.isfinite(top) else math.nan
    lp_err = np.abs((ours - our_lse) - (values.astype(np.float64) - float(ref.logsumexp[t])))
    lp = float(lp_err.max()) if np.all(np.isfinite(lp_err)) else math.inf
    return int(np.argmax(row)) == int(ref.greedy[t]), overlap, cosine(ours, values), max_abs, lp


def prompt_result(ref: RefPrompt, scores: list[tuple[bool, float, float, float, float]]) -> PromptResult:
    match, overlap, cos, err, lp = (list(c) for c in zip(*scores))
    first = next((t for t, m in enumerate(match) if not m), None)
    return PromptResult(
        name=ref.name, group=ref.group, prompt_length=int(ref.input_ids.size), steps=len(match),
        forced_matches=sum(match), first_divergence=first, topk_overlap=float(np.mean(overlap)),
        min_cosine=_min(cos), max_abs=max(err), max_logprob_error=max(lp),
        per_step=StepScores([bool(m) for m in match], overlap, cos, err, lp))


def compare_device(device, refset: ReferenceSet, batch: int = 1, progress=None) -> tuple[list[PromptResult], list[dict]]:
    """Score every prompt of `refset` that fits the device's context; (results, skipped)."""
    from calculet.numerics.walk import check_fits, forced_rows

    if batch < 1:
        raise RequestError("bad_option", f"--batch must be >= 1, got {batch}")
    batch = min(batch, device.lanes.count)
    fed = refset.tokens - 1  # the last greedy token is never fed
    runnable, skipped = [], []
    vocab = device.program.vocab_size
    if vocab != int(refset.source["vocab_size"]):
        raise RequestError("refset_mismatch", f"the reference set's vocabulary is {refset.source['vocab_size']} "
                           f"but the calbin's is {vocab}: made from another model")
    for p in refset.prompts:
        why = check_fits(p.input_ids.size, fed, device.lanes.context)
        (skipped.append({"name": p.name, "reason": why}) if why else runnable.append(p))
    results = []
    for i in range(0, len(runnable), batch):
        group = runnable[i:i + batch]
        scores = [[] for _ in group]
        for t, rows in forced_rows(device, [p.input_ids.tolist() for p in group], [p.greedy[:fed].tolist() for p in group]):
            for j, p in enumerate(group):
                scores[j].append(score_step(rows[j], p, t))
        results += [prompt_result(p, s) for p, s in zip(group, scores)]
        if progress is not None:
            progress.update(len(group))
    return results, skipped


def compare_calbin(path, refset: ReferenceSet, batch: int = 1, threads: int = 0, progress=None) -> CompareReport:
    """Open `path` on a CPU device, score it against `refset`, close the device."""
    from calculet.runtime.device import Device
    from calculet.runtime.program import DeviceConfig

    device = Device(DeviceConfig(threads=threads))
    try:
        device.configure(device.load(path))
        results, skipped = compare_device(device, refset, batch, progress)
        manifest = device.program.manifest
        policy = manifest.quantization.policy
        same = manifest.model.source.sha256 == refset.source.get("source_sha256")
    finally:
        device.close()
    reference = {**refset.source, "tokens": refset.tokens, "topk": refset.topk, "prompts": len(refset.prompts)}
    return CompareReport(str(path), policy, reference, tuple(results), tuple(skipped), same)
