"""Readable tables for `calculet compare` (one column per calbin) and its worst prompts."""

from __future__ import annotations

import math

from calculet.numerics.compare import CompareReport, Thresholds

_ROWS = (
    ("teacher-forced agreement", "agreement", "{:.4f}"),
    ("prompts equal at every step", "all_steps_equal", "{}"),
    ("top-k overlap (mean)", "topk_overlap", "{:.4f}"),
    ("logits cosine on ref top-k (min)", "cosine_min", "{:.6f}"),
    ("logits cosine on ref top-k (mean)", "cosine_mean", "{:.6f}"),
    ("max abs logit error (max)", "max_abs_max", "{:.4g}"),
    ("max abs logit error (mean)", "max_abs_mean", "{:.4g}"),
    ("logprob error on ref top-k (max)", "logprob_error_max", "{:.4g}"),
    ("logprob error on ref top-k (mean)", "logprob_error_mean", "{:.4g}"),
)


def _fmt(fmt: str, v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "nan" if v is None or math.isnan(v) else str(v)
    return fmt.format(v)


def render(reports: list[CompareReport], th: Thresholds, worst: int = 10) -> str:
    ref = reports[0].reference
    lines = [f"reference: {ref.get('model_type')} from {ref.get('path')} — {ref.get('prompts')} prompts x "
             f"{ref.get('tokens')} tokens, top-{ref.get('topk')}"]
    names = [f"{r.calbin} ({r.policy})" for r in reports]
    width = max(34, *(len(n) for n in names))
    lines.append(f"{'':36}" + "".join(f"{n:>{width}}  " for n in names))
    summaries = [r.summary() for r in reports]
    counts = [f"{s['prompts']} prompts, {s['steps']} steps" + (f", {s['skipped']} skipped" if s["skipped"] else "")
              for s in summaries]
    lines.append(f"{'scored':36}" + "".join(f"{c:>{width}}  " for c in counts))
    for label, key, fmt in _ROWS:
        lines.append(f"{label:36}" + "".join(f"{_fmt(fmt, s[key]):>{width}}  " for s in summaries))
    for r in reports:
        lines.append("")
        if not r.same_source:
            lines.append(f"note: {r.calbin} was compiled from other source files than the reference set "
                         "(SHA-256 differs): a GGUF and its HF original, or another model")
        lines.append(f"worst prompts of {r.calbin}:")
        lines.append(f"  {'prompt':28} {'len':>5} {'agree':>7} {'1st div':>7} {'overlap':>7} {'min cos':>9} {'max abs':>9}")
        for p in r.worst(worst):
            div = "-" if p.first_divergence is None else str(p.first_divergence)
            lines.append(f"  {p.name:28} {p.prompt_length:>5} {p.agreement:>7.3f} {div:>7} {p.topk_overlap:>7.3f} "
                         f"{_fmt('{:.5f}', p.min_cosine):>9} {_fmt('{:.3g}', p.max_abs):>9}")
        for s in r.skipped[:5]:
            lines.append(f"  skipped {s['name']}: {s['reason']}")
        if len(r.skipped) > 5:
            lines.append(f"  ... and {len(r.skipped) - 5} more skipped")
        failures = r.failures(th)
        if th.min_agreement is not None or th.min_topk_overlap is not None:
            lines.append(f"  gate: {'FAIL' if failures else 'PASS'}")
            lines.extend(f"    FAIL {f}" for f in failures)
    return "\n".join(lines)
