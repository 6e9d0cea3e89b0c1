"""Human-readable table for a `PlanReport` (JSON comes from `PlanReport.to_json`).

Every size is printed as exact bytes plus a binary human form: `2,013,265,920 B (1.875 GiB)`.
"""

from __future__ import annotations

from calculet.planner.plan import KV_DTYPES, PlanReport
from calculet.units import show_bytes


def _count(n: int) -> str:
    return f"{n:,} ({n / 1e9:.2f} B)" if n >= 1e9 else f"{n:,} ({n / 1e6:.1f} M)"


def render_text(rep: PlanReport) -> str:
    hp, r, p, kv, b, fit = rep.model, rep.request, rep.params, rep.kv, rep.budget, rep.fit
    lines = [f"capacity plan: {hp.model_type}" + (f"  ({rep.source})" if rep.source else "")]
    if not rep.buildable:
        lines.append(f"NOTE: the compiler cannot build {hp.model_type} yet; this is a capacity estimate only")
    lines.append(f"model      hidden {hp.hidden_size:,} · {hp.num_layers} layers · "
                 f"{hp.num_heads} heads, {hp.num_kv_heads} KV head(s) · head_dim "
                 f"{hp.head_dim} · vocab {hp.vocab_size:,}"
                 + (" · tied embeddings" if hp.tie_word_embeddings else ""))
    if hp.moe:
        lines.append(f"           MoE: {hp.moe.num_experts} experts, {hp.moe.experts_per_token} per "
                     f"token, expert FFN {hp.moe.expert_intermediate_size:,}, "
                     f"{len(hp.moe.sparse_layers)} routed layers")
    lines.append(f"           parameters {_count(p.total_params)} total, "
                 f"{_count(p.active_params_per_token)} active per token")
    lines.append(f"request    {r.lanes:,} lane(s) × context {r.context:,} · {r.chips} chip(s) · "
                 f"weights {r.weights} · KV {r.kv_dtype} · {show_bytes(r.device_memory_bytes)} "
                 f"per chip")
    lines.append("")
    lines.append(f"{'weights per chip':<16}{'params':>16}   {'bytes':<34}formats")
    for row in p.rows:
        lines.append(f"  {row.module:<14}{row.params:>16,}   {show_bytes(row.bytes_per_chip):<34}{row.formats}")
    lines.append(f"  {'weights':<14}{p.total_params:>16,}   {show_bytes(b.weights_bytes)}")
    if r.chips == 1:
        lines.append(f"      graphs/weights.bin as compile writes it (64-byte aligned): "
                     f"{show_bytes(p.weights_file_bytes)}")
    lines.append(f"  {'KV cache':<42}{'':>16}   {show_bytes(b.kv_bytes)}")
    rows = (f"({kv.layers - kv.ring_layers} layers × {kv.context:,} context + {kv.ring_layers} sliding-window "
            f"layers × {kv.ring:,} ring)" if kv.ring else f"{kv.layers} layers × {kv.context:,} context")
    lines.append(f"      = {rows} × {kv.kv_heads_per_chip} KV head(s) × 2 × {kv.head_dim} × "
                 f"{kv.lanes:,} lanes × {KV_DTYPES[kv.dtype]} B ({kv.dtype}) = {show_bytes(kv.bytes_per_lane_per_chip)} "
                 f"per lane; whole cache, each KV head once: {show_bytes(kv.bytes_total)}")
    lines.append(f"  {'workspace':<42}{'':>16}   {show_bytes(b.workspace_bytes)}")
    lines.append(f"      decode step {show_bytes(rep.workspace.decode_bytes)}, prefill chunk "
                 f"{show_bytes(rep.workspace.prefill_bytes)}")
    lines.append(f"  {'step I/O':<42}{'':>16}   {show_bytes(b.io_bytes)}")
    for name, io in (("decode step", rep.decode), (f"prefill chunk ({rep.prefill.tokens} tokens)",
                                                   rep.prefill)):
        lines.append(f"      {name}: inputs {show_bytes(io.inputs_bytes)}, outputs "
                     f"{show_bytes(io.outputs_bytes)}, of which logits {show_bytes(io.logits_bytes)}")
    lines.append(f"  {'required':<42}{'':>16}   {show_bytes(b.required_bytes)}")
    lines.append(f"  {'device memory':<42}{'':>16}   {show_bytes(b.device_memory_bytes)}")
    lines.append(f"  {f'guard ({r.guard_fraction:.0%})':<42}{'':>16}   {show_bytes(b.guard_bytes)}")
    lines.append(f"  {'usable':<42}{'':>16}   {show_bytes(b.usable_bytes)}")
    lines.append("")
    if fit.fits:
        lines.append(f"FITS: needs {show_bytes(b.required_bytes)} per chip of "
                     f"{show_bytes(b.usable_bytes)} usable; headroom {show_bytes(b.headroom_bytes)}")
    else:
        lines.append(f"DOES NOT FIT: needs {show_bytes(b.required_bytes)} per chip but only "
                     f"{show_bytes(b.usable_bytes)} is usable; short by {show_bytes(-b.headroom_bytes)}")
    lines.append(f"largest lanes at context {r.context:,}: {fit.max_lanes_at_context:,}"
                 + (" (not even one lane fits)" if not fit.max_lanes_at_context else ""))
    lines.append(f"largest context at {r.lanes:,} lane(s): {fit.max_context_at_lanes:,}"
                 + (f" (limited by {fit.context_limited_by})" if fit.max_context_at_lanes
                    else " (no context fits)"))
    lines.append("")
    lines.append("assumptions:")
    lines += [f"  - {note}" for note in rep.assumptions]
    if rep.warnings:
        lines.append("warnings:")
        lines += [f"  ! {note}" for note in rep.warnings]
    if rep.partition is not None:
        from calculet.planner.partition import render
        lines += [""] + render(rep.partition)
    return "\n".join(lines)
