"""Gate F, numerics: run the golden prompts through the runtime and compare with the reference.

It lives above calbin/ (which holds gates A–E and must not import the runtime, the engine or the
reference): `calculet.validation` composes it with calbin's gates into `calculet validate`.

    golden/golden.json ── read_golden ──▶ check_against_golden(golden, run_fn, forced_fn=...) ──▶ F.greedy / F.topk /
                                                                                             F.cosine / F.max_abs_error / F.forced
    run_fn, forced_fn = engine.golden_runner.golden_fns(LocalEngine): free-running and teacher-forced greedy
    requests through the engine's loop (check_calbin below opens the device and runs it all)

Thresholds are golden.json's (a quantized policy states looser ones when it is compiled); the
manifest may repeat them under `golden.thresholds`, and then the two must agree, so neither can be
loosened alone. Skipped in fast mode and when the calbin has no golden/.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from calculet.calbin.gates.context import GateContext
from calculet.calbin.validate_report import Check, Rule
from calculet.errors import CalculetError

GOLDEN = Rule("F.golden", "golden/golden.json is present and readable")
GOLDEN_SOURCE = Rule("F.golden_source", "the golden outputs come from this calbin's source (same SHA-256 and vocab)")
RUN = Rule("F.run", "the runtime runs every golden prompt")
GREEDY = Rule("F.greedy", "greedy continuations agree with the reference (threshold: greedy_agreement)")
TOPK = Rule("F.topk", "the reference top-k ids are in our top-k (threshold: topk_overlap)")
COSINE = Rule("F.cosine", "logits cosine on the reference top-k ids (threshold: logits_cosine)")
MAX_ABS = Rule("F.max_abs_error", "max |ours - reference| on the reference top-k ids (threshold: max_abs_logit_error)")
FORCED = Rule("F.forced", "teacher-forced argmax agreement over the golden set (threshold: forced_agreement)")
RULES = (GOLDEN, GOLDEN_SOURCE, RUN, GREEDY, TOPK, COSINE, MAX_ABS, FORCED)
METRICS = ((GREEDY, "greedy_agreement", ">="), (TOPK, "topk_overlap", ">="), (COSINE, "logits_cosine", ">="),
           (MAX_ABS, "max_abs_logit_error", "<="))


def run(ctx: GateContext) -> list[Check]:
    from calculet.reference.golden import GOLDEN_FILE, Thresholds, read_golden

    if not ctx.options.numerics:
        return [r.skip("not run in fast mode") for r in RULES]
    declared = ctx.manifest.golden
    if declared is None and not (ctx.folder / GOLDEN_FILE).exists():
        return [r.skip("this calbin has no golden/ (compile with the reference extra installed); numerics not checked")
                for r in RULES]
    try:
        golden = read_golden(ctx.folder)
    except CalculetError as exc:
        return [GOLDEN.check([exc.message], "")] + [r.skip("no readable golden outputs") for r in RULES[1:]]
    thresholds = golden.thresholds
    problems = _threshold_problems(declared, thresholds, Thresholds)
    checks = [GOLDEN.check(problems, f"{len(golden.prompts)} prompts x {golden.n_tokens} tokens, top-{golden.topk}",
                           {"thresholds": asdict(thresholds), "skipped_prompts": [s.name for s in golden.skipped]}),
              GOLDEN_SOURCE.check(_source_problems(ctx, golden), "golden made from this source")]
    if problems:
        return checks + [r.skip("the golden thresholds are in doubt (F.golden)") for r in RULES[2:]]
    try:
        report = check_calbin(ctx.folder, golden, thresholds)
    except CalculetError as exc:
        return checks + [RUN.check([f"{exc.code}: {exc.message}"], "")] + [r.skip("the runtime did not finish") for r in RULES[3:]]
    checks.append(RUN.check([], f"{len(report.prompts)} prompts ran"))
    for rule, key, op in METRICS:
        limit = getattr(thresholds, key)
        values = {p.name: getattr(p, key) for p in report.prompts}
        bad = [f"{name}: {key} {value:.6g} (needs {op} {limit:g})" for name, value in values.items()
               if not (value >= limit if op == ">=" else value <= limit)]
        worst = _worst(list(values.values()), op)
        checks.append(rule.check(bad, f"worst {key} {worst:.6g} {op} {limit:g}",
                                 {"threshold": limit, "per_prompt": {k: (float(v) if np.isfinite(v) else None) for k, v in values.items()}}))
    checks.append(_forced(report, thresholds))
    return checks


def _forced(report, thresholds) -> Check:
    limit = getattr(thresholds, "forced_agreement", None)
    value = getattr(report, "forced_agreement", None)
    if limit is None or value is None:
        return FORCED.skip("teacher-forced agreement not measured by this golden module")
    per_prompt = {p.name: p.forced_matches for p in report.prompts}
    bad = [] if value >= limit else [f"teacher-forced agreement {value:.4f} over the set (needs >= {limit:g}); "
                                     f"matches per prompt out of {report.n_tokens}: {per_prompt}"]
    return FORCED.check(bad, f"teacher-forced agreement {value:.4f} >= {limit:g}",
                        {"threshold": limit, "value": value, "matches_per_prompt": per_prompt, "n_tokens": report.n_tokens})


def _threshold_problems(declared, thresholds, thresholds_cls) -> list[str]:
    """The manifest's copy of the thresholds, when it has one, must equal golden.json's."""
    stated = declared.thresholds if declared is not None else None
    if stated is None:
        return []
    if not isinstance(stated, dict):
        return [f"manifest golden.thresholds is {type(stated).__name__}, not an object"]
    try:
        stated = thresholds_cls(**stated)
    except (TypeError, ValueError) as exc:
        return [f"manifest golden.thresholds: {exc}"]
    if stated != thresholds:
        diff = {k: (v, getattr(thresholds, k)) for k, v in asdict(stated).items() if v != getattr(thresholds, k)}
        return [f"manifest golden.thresholds differ from golden.json's (manifest, golden.json): {diff}"]
    return []


def _worst(values: list[float], op: str) -> float:
    if not values or any(np.isnan(v) for v in values):
        return float("nan")
    return min(values) if op == ">=" else max(values)


def _source_problems(ctx: GateContext, golden) -> list[str]:
    problems = []
    source, vocab = ctx.manifest.model.source, ctx.manifest.spec.vocab_size
    if golden.source.vocab_size != vocab:
        problems.append(f"golden vocab_size {golden.source.vocab_size} != model vocab_size {vocab}")
    if source.sha256 and golden.source.source_sha256 != source.sha256:
        problems.append(f"golden was made from source {golden.source.source_sha256[:12]}…, this calbin from {source.sha256[:12]}…")
    return problems


def check_calbin(path, golden, thresholds=None):
    """Open the calbin at `path` on a CPU device and check it against `golden`, free-running and
    teacher-forced (`reference.golden.check_against_golden`); the device is closed afterwards."""
    from calculet.engine.golden_runner import golden_fns
    from calculet.engine.local import LocalEngine
    from calculet.engine.tokenizer import TextTokenizer
    from calculet.reference.golden import check_against_golden
    from calculet.runtime.device import Device

    device = Device()
    try:
        program = device.load(path)
        tokenizer = TextTokenizer.from_program(program)
        device.configure(program)
        with LocalEngine(device, tokenizer) as local:
            run_fn, forced_fn = golden_fns(local)
            return check_against_golden(golden, run_fn, thresholds, forced_fn=forced_fn)
    finally:
        device.close()
