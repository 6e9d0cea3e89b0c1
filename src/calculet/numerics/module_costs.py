"""`calculet eval module-costs`: what each module's quantization costs, one module at a time.

For a policy (e.g. `default`), compile the source in fp32 with `--quant` moving a single module
class (attention, MLP, lm_head, embedding) to the policy's format, and score each build against a
reference set; the fp32 build and the full policy are the first and last rows. The agreement lost
and the logprob error of each row are that module's share of the policy's error. A tied embedding
and lm_head share one set of codes, so for tied models the embedding row quantizes both.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from calculet.compiler.options import CompileOptions
from calculet.compiler.quant_spec import Override
from calculet.compiler.quantize import policy_table

MODULE_ORDER = ("attention", "mlp", "lm_head", "embedding")


@dataclass(frozen=True)
class ModuleCost:
    row: str              # "fp32", a module class, or "all (<policy>)"
    format: str
    summary: dict         # CompareReport.summary()


def plan_rows(policy: str, block_size: int, tied: bool) -> list[tuple[str, str, tuple[Override, ...]]]:
    """(row name, format label, --quant overrides on an fp32 build) per row."""
    table = policy_table(policy, block_size)
    rows = [("fp32", "fp32", ())]
    for cls in MODULE_ORDER:
        fmt = table.get(cls)
        if fmt is None or fmt.kind == "fp32":
            continue
        overrides = (Override(cls, None, fmt),)
        if cls == "embedding" and tied:
            overrides += (Override("lm_head", None, table.get("lm_head", fmt)),)
        label = fmt.kind if fmt.kind == "fp16" else f"{fmt.kind} b{fmt.block} ({fmt.compute} compute)"
        rows.append((cls + (" + lm_head (tied)" if len(overrides) > 1 else ""), label, overrides))
    rows.append((f"all ({policy})", policy, None))
    return rows


def module_costs(source_path: str | None, refset, policy: str, base: CompileOptions, progress=None,
                 log=lambda _m: None) -> list[ModuleCost]:
    """Compile and compare every row of `plan_rows`; builds go to a temporary folder."""
    from calculet.compiler.compile import compile_calbin
    from calculet.models import family_for
    from calculet.numerics.compare import compare_calbin
    from calculet.sources.resolve import load_source

    source = load_source(source_path)
    spec = family_for(source.config).parse_config(source.config)
    out = []
    with tempfile.TemporaryDirectory(prefix="calculet-module-costs-") as tmp:
        for i, (row, label, overrides) in enumerate(plan_rows(policy, base.block_size, spec.tie_word_embeddings)):
            options = (replace(base, weights=policy, quant=()) if overrides is None
                       else replace(base, weights="fp32", quant=overrides))
            calbin = compile_calbin(source_path, Path(tmp) / f"row{i}.calbin", options, log=log)
            out.append(ModuleCost(row, label, compare_calbin(calbin, refset).summary()))
            if progress is not None:
                progress.update(1)
    return out


def render(costs: list[ModuleCost]) -> str:
    base = costs[0].summary["agreement"]
    lines = [f"  {'quantized':34} {'format':26} {'agreement':>9} {'lost':>7} {'overlap':>8} {'logprob err max':>15} {'mean':>8}"]
    for c in costs:
        s = c.summary
        lines.append(f"  {c.row:34} {c.format:26} {s['agreement']:>9.4f} {base - s['agreement']:>7.4f} "
                     f"{s['topk_overlap']:>8.4f} {s['logprob_error_max']:>15.4g} {s['logprob_error_mean']:>8.4g}")
    return "\n".join(lines)
