"""Gate F, numerics: run the golden prompts through the runtime and compare with the reference.

    golden/golden.json ── read_golden ──▶ check_against_golden(golden, run_fn) ──▶ F.greedy / F.topk / F.cosine / F.max_abs_error
    run_fn(ids, n): Device(cpu) ─ prefill(ids) ─ argmax ─ n-1 decode steps ─▶ (last prompt logits, n greedy tokens)

Thresholds come from golden.json; the manifest's `golden.thresholds`, when present, overrides them
(a quantized policy may state looser ones). Skipped in fast mode and when the calbin has no golden/.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from calculet.calbin.gates.context import GateContext
from calculet.calbin.validate_report import Check, Rule

GOLDEN = Rule("F.golden", "golden/golden.json is present and readable")
GOLDEN_SOURCE = Rule("F.golden_source", "the golden outputs come from this calbin's source (same SHA-256 and vocab)")
RUN = Rule("F.run", "the runtime runs every golden prompt")
GREEDY = Rule("F.greedy", "greedy continuations agree with the reference (threshold: greedy_agreement)")
TOPK = Rule("F.topk", "the reference top-k ids are in our top-k (threshold: topk_overlap)")
COSINE = Rule("F.cosine", "logits cosine on the reference top-k ids (threshold: logits_cosine)")
MAX_ABS = Rule("F.max_abs_error", "max |ours - reference| on the reference top-k ids (threshold: max_abs_logit_error)")
RULES = (GOLDEN, GOLDEN_SOURCE, RUN, GREEDY, TOPK, COSINE, MAX_ABS)
METRICS = ((GREEDY, "greedy_agreement", ">="), (TOPK, "topk_overlap", ">="), (COSINE, "logits_cosine", ">="),
           (MAX_ABS, "max_abs_logit_error", "<="))
WAIT_S = 600.0


def run(ctx: GateContext) -> list[Check]:
    from calculet.errors import CalculetError
    from calculet.reference.golden import GOLDEN_FILE, Thresholds, check_against_golden, read_golden

    if not ctx.options.numerics:
        return [r.skip("not run in fast mode") for r in RULES]
    declared = ctx.manifest.golden
    if declared is None and not (ctx.folder / GOLDEN_FILE).exists():
        return [r.skip("this calbin has no golden/ (compile with the reference extra installed); numerics not checked")
                for r in RULES]
    try:
        golden = read_golden(ctx.folder)
        thresholds = golden.thresholds
        if isinstance(declared, dict) and isinstance(declared.get("thresholds"), dict):
            thresholds = Thresholds(**declared["thresholds"])
    except CalculetError as exc:
        return [GOLDEN.check([exc.message], "")] + [r.skip("no readable golden outputs") for r in RULES[1:]]
    except (TypeError, ValueError) as exc:
        return [GOLDEN.check([f"manifest golden.thresholds: {exc}"], "")] + [r.skip("no usable thresholds") for r in RULES[1:]]
    checks = [GOLDEN.check([], f"{len(golden.prompts)} prompts x {golden.n_tokens} tokens, top-{golden.topk}",
                           {"thresholds": asdict(thresholds), "skipped_prompts": [s.name for s in golden.skipped]}),
              GOLDEN_SOURCE.check(_source_problems(ctx, golden), "golden made from this source")]
    try:
        report = _run_golden(ctx, golden, thresholds, check_against_golden)
    except CalculetError as exc:
        return checks + [RUN.check([f"{exc.code}: {exc.message}"], "")] + [r.skip("the runtime did not finish") for r, _, _ in METRICS]
    checks.append(RUN.check([], f"{len(report.prompts)} prompts ran"))
    for rule, key, op in METRICS:
        limit = getattr(thresholds, key)
        values = {p.name: getattr(p, key) for p in report.prompts}
        bad = [f"{name}: {key} {value:.6g} (needs {op} {limit:g})" for name, value in values.items()
               if not (value >= limit if op == ">=" else value <= limit)]
        worst = _worst(list(values.values()), op)
        checks.append(rule.check(bad, f"worst {key} {worst:.6g} {op} {limit:g}",
                                 {"threshold": limit, "per_prompt": {k: (float(v) if np.isfinite(v) else None) for k, v in values.items()}}))
    return checks


def _worst(values: list[float], op: str) -> float:
    if not values or any(np.isnan(v) for v in values):
        return float("nan")
    return min(values) if op == ">=" else max(values)


def _source_problems(ctx: GateContext, golden) -> list[str]:
    problems = []
    source = ctx.section("model").get("source") or {}
    vocab = ctx.hparams().get("vocab_size")
    if golden.source.vocab_size != vocab:
        problems.append(f"golden vocab_size {golden.source.vocab_size} != model vocab_size {vocab}")
    if source.get("sha256") and golden.source.source_sha256 != source.get("sha256"):
        problems.append(f"golden was made from source {golden.source.source_sha256[:12]}…, this calbin from {str(source.get('sha256'))[:12]}…")
    return problems


def _run_golden(ctx: GateContext, golden, thresholds, check_against_golden):
    from calculet.engine.generate import prefill
    from calculet.runtime.device import Device
    from calculet.runtime.jobs import DecodeJob
    from calculet.runtime.program import DeviceConfig

    device = Device(DeviceConfig("cpu"))
    try:
        device.configure(device.load(ctx.folder))

        def run_fn(ids: list[int], n_tokens: int):
            lane = device.lanes.allocate()
            try:
                logits = prefill(device, lane, ids)
                last = logits.copy()
                tokens = []
                for i in range(n_tokens):
                    tokens.append(int(np.argmax(logits)))
                    if i + 1 < n_tokens:
                        logits = device.run(DecodeJob((lane,), (tokens[-1],)), WAIT_S).logits[0]
                return last, tokens
            finally:
                device.lanes.free(lane)

        return check_against_golden(golden, run_fn, thresholds)
    finally:
        device.close()
