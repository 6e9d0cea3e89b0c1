"""Text rendering of an `InspectReport`: summary, graphs, op inventory, memory plan, quantization."""

from __future__ import annotations

from calculet.calbin import inspect_moe
from calculet.calbin.inspect import GraphSummary, InspectReport

TOP_FAMILIES = 12  # shape families shown per graph in text (JSON has them all)


def show_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _table(rows: list[tuple], header: tuple, right: set[int] = frozenset()) -> list[str]:
    rows = [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h)) for i, h in enumerate(header)]

    def line(cells) -> str:
        return "  ".join(f"{c:>{w}}" if i in right else f"{c:<{w}}" for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(header)] + [line(r) for r in rows]


def render_text(report: InspectReport) -> str:
    s = report.summary
    model, profile, kv, tok, weights = s["model"], s["profile"], s["kv"], s["tokenizer"], s["weights"]
    out = [
        f"calbin {report.path}",
        f"  schema {s['schema_version']}, target {s['target']}",
        f"  model {model['family']} ({model['model_type']}): {model['num_layers']} layers, hidden {model['hidden_size']}, "
        f"heads {model['num_heads']} / kv {model['num_kv_heads']} x {model['head_dim']}, vocab {model['vocab_size']}"
        + (f", sliding window {model['sliding_window']}" if model.get("sliding_window") else ""),
        f"  source {model['source'].get('kind')} {model['source'].get('path')} (sha256 {str(model['source'].get('sha256'))[:12]}…)",
        f"  profile: lanes {profile['lanes']}, context {profile['context']}, prefill chunks {profile['prefill_chunks']}"
        + (f", decode batch sizes {profile['decode_lanes']}" if profile.get("decode_lanes") else ""),
        f"  kv: {kv['layout']} {kv['dtype']} {kv['lanes']} lanes x context {kv['context']} x {kv['layers']} layers x (K, V)"
        + (f", layers {kv['ring_layers']} in rings of {kv['ring']} rows" if kv["ring"] else "")
        + f" = {show_bytes(kv['bytes_per_lane'])} per lane, {show_bytes(kv['total_bytes'])} in all"
        + (", updated in place" if kv["in_place"] else ""),
        f"  tokenizer: vocab {tok['vocab_size']}, bos {tok['bos_token_id']}, eos {tok['eos_token_ids']}, pad {tok['pad_token_id']}, "
        f"add_bos {tok['add_bos_token']}, chat template {'yes' if tok['chat_template'] else 'no'}",
        f"  weights: {weights['file']} {show_bytes(weights['bytes'])} in {weights['tensors']} tensors; "
        f"{s['files']['count']} files, {show_bytes(s['files']['bytes'])}",
        f"  golden: {s['golden'] if s['golden'] else 'none'}",
        f"  passes: {', '.join(s['passes']) or 'none'}",
        "  toolchain: " + ", ".join(f"{k} {v}" for k, v in s["toolchain"].items()),
        _isa(s.get("isa")),
        *inspect_moe.render(s.get("moe")),
        *_partition(s.get("partition")),
    ]
    for g in report.graphs:
        out += [""] + _graph(g)
    out += [""] + _memory(report) + [""] + _quant(report)
    return "\n".join(out)


def _isa(isa: dict | None) -> str:
    if not isa:
        return "  isa: not recorded (compiled before CPU features were recorded)"
    choice, cpu = isa["choice"], isa["compile_cpu"]
    how = "auto" if choice["requested"] == "auto" else "named"
    return (f"  isa: weights {choice['chosen']} ({how}: {choice['reason']}); compiled on "
            f"{' '.join(cpu['flags']) or 'none of the tracked features'} ({cpu['source']})")


def _partition(part: dict | None) -> list[str]:
    if not part:
        return []
    out = [f"  partition {part['scheme']} over {len(part['chips'])} chips (head on chip {part['head_chip']}; "
           f"{part['replicated']} tensors replicated, {part['sharded']} sharded): {part['note']}"]
    rows = [(c["index"], _span(c["layers"]), f"{c['heads'][0]}..{c['heads'][1] - 1}", f"{c['kv_heads'][0]}..{c['kv_heads'][1] - 1}",
             f"{c['ffn'][0]}..{c['ffn'][1] - 1}", ("embed " if c["embedding"] else "") + ("head" if c["head"] else ""),
             show_bytes(c["weights_bytes"]), show_bytes(c["memory_bytes"])) for c in part["chips"]]
    head = ("chip", "layers", "heads", "kv heads", "ffn", "also", "weights", "memory")
    if any("experts" in c for c in part["chips"]):   # ep
        rows = [r[:5] + (f"{c['experts'][0]}..{c['experts'][1] - 1}",) + r[5:] for r, c in zip(rows, part["chips"])]
        head = head[:5] + ("experts",) + head[5:]
    out += ["    " + line for line in _table(rows, head, {len(head) - 2, len(head) - 1})]
    out += [f"    {graph}: {c['count']} collectives ({', '.join(c['kinds'])}), {show_bytes(c['link_bytes'])} between chips per call"
            for graph, c in part["collectives"].items()]
    return out


def _graph(summary: GraphSummary) -> list[str]:
    g = summary.graph
    out = [f"graph {g.name} ({g.type}, {g.lanes} lanes x {g.tokens} tokens) {g.file}"]
    kv_in = [t for t in g.inputs if t.name.startswith("past_")]
    kv_out = [t for t in g.outputs if t.name.startswith("present_")]
    rows = [("in", t.name, list(t.shape), t.dtype) for t in g.inputs if t not in kv_in]
    rows += [("out", t.name, list(t.shape), t.dtype) for t in g.outputs if t not in kv_out]
    if kv_in:
        rows.append(("in", f"past_key/value.0..{len(kv_in) // 2 - 1}", list(kv_in[0].shape), kv_in[0].dtype))
    if kv_out:
        rows.append(("out", f"present_key/value.0..{len(kv_out) // 2 - 1}", list(kv_out[0].shape), kv_out[0].dtype))
    out += ["  " + line for line in _table(rows, ("io", "name", "shape", "dtype"))]
    if summary.ops is None:
        out.append(f"  ops: unavailable: {summary.error}")
        return out
    inv = summary.ops
    domains = ", ".join(f"{d} {n}" for d, n in inv.nodes_by_domain.items())
    out.append(f"  ops: {inv.nodes} nodes ({inv.standard_nodes} standard ONNX, {inv.nodes - inv.standard_nodes} ONNX Runtime-only); "
               f"by domain: {domains}")
    out += ["    " + line for line in _table([(o.domain, o.op_type, o.count, "standard" if o.standard else "ONNX Runtime")
                                               for o in inv.ops], ("domain", "op", "count", "kind"), right={2})]
    out.append(f"  shape families ({len(inv.shape_families)}; top {min(TOP_FAMILIES, len(inv.shape_families))}):")
    for f in inv.shape_families[:TOP_FAMILIES]:
        out.append(f"    {f.count:>4} x {f.op}({', '.join(f.inputs)})")
    return out


def _span(layers: tuple[int, ...]) -> str:
    return ",".join(map(str, layers)) if len(layers) <= 6 else f"{','.join(map(str, layers[:5]))},... ({len(layers)})"


def _memory(report: InspectReport) -> list[str]:
    mem = report.memory
    out = [f"memory plan ({mem.unit}): the runtime holds {mem.total_bytes} ({show_bytes(mem.total_bytes)}); "
           f"ONNX Runtime workspace about {show_bytes(mem.workspace_estimate_bytes)} more (an estimate)"]
    rows = [("weights", "mapped once", mem.weights_bytes, show_bytes(mem.weights_bytes))]
    rows += [(f"kv layers {_span(g.layers)}", f"{g.buffers} x {list(g.buffer_shape)} {mem.kv.dtype}", g.total_bytes,
              show_bytes(g.total_bytes)) for g in mem.kv.groups]
    rows += [(f"staging {s.graph}", f"{s.bindings} x {s.binding_bytes}", s.total_bytes, show_bytes(s.total_bytes))
             for s in mem.staging]
    out += ["  " + line for line in _table(rows, ("buffer", "made of", "bytes", ""), right={2, 3})]
    return out


def _quant(report: InspectReport) -> list[str]:
    q = report.quantization
    table = ", ".join(f"{k} {v}" for k, v in q.table.items()) or "every weight as stored"
    out = [f"quantization policy {q.policy}: {table}; {len(q.tensors)} weights"]
    rows = [(g.pattern, g.module, g.format, g.tensors, show_bytes(g.bytes)) for g in q.groups]
    out += ["  " + line for line in _table(rows, ("weight", "module", "format", "count", "bytes"), right={3, 4})]
    return out
