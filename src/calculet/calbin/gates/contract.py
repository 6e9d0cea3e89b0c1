"""Gate C, contract (shapes half): lanes, context, KV layout, hidden width and dtypes agree everywhere.

    manifest (profile, kv, hyperparameters)  ==  graphs[] as declared  ==  each .onnx's inputs and outputs

Each KV tensor is [lanes, kv_heads, context, head_dim]; its dimensions are split over C.lanes,
C.context and C.kv_shape so that one wrong number fails one check. A graph's type must agree with
its shapes: prefill runs one lane with many tokens (or a last_index input), decode one token per
lane, a head turns `hidden` rows into logits. The vocabulary half is contract_vocab.py, the
mixture-of-experts part contract_moe.py.
"""

from __future__ import annotations

from calculet.calbin.gates import contract_moe, contract_vocab
from calculet.calbin.gates.context import GateContext
from calculet.calbin.gates.layout import BODY_TYPES, DECODE, HEAD, PREFILL, Layout, expected_layout
from calculet.calbin.validate_report import Check, Rule, Severity

GRAPH_IO = Rule("C.graph_io", "each .onnx declares exactly the inputs and outputs the manifest lists (names, static shapes, dtypes)")
LANES = Rule("C.lanes", "lanes agree: profile, KV layout, each graph's entry point (prefill 1, decode_<n> n) and every tensor's rows")
CONTEXT = Rule("C.context", "context agrees: profile, KV layout and every KV tensor")
CONTEXT_TRAINED = Rule("C.context_trained", "the context does not exceed the model's max_position_embeddings", Severity.WARNING)
PREFILL_CHUNKS = Rule("C.prefill_chunks", "prefill graphs cover exactly the profile's chunk sizes, prefill_<S> taking S tokens")
GRAPH_TYPE = Rule("C.graph_type", "each graph's type agrees with its shapes; prefill and decode graphs present")
KV_SHAPE = Rule("C.kv_shape", "KV layout agrees with the model: layers, kv heads, head_dim; past_* per layer, and present_* "
                               "per layer (in place) or new_keys/new_values")
HIDDEN = Rule("C.hidden", "split layout: bodies emit hidden [rows, hidden_size], and a head graph takes each body's rows")
DTYPE = Rule("C.dtype", "dtypes agree: KV tensors use the KV dtype; ids int64, seqlens int32, hidden/logits float32")
RULES = (GRAPH_IO, LANES, CONTEXT, CONTEXT_TRAINED, PREFILL_CHUNKS, GRAPH_TYPE, KV_SHAPE, HIDDEN, DTYPE) + contract_vocab.RULES + contract_moe.RULES

FIXED_DTYPES = {"input_ids": "int64", "seqlens_k": "int32", "total_seq_len": "int32", "last_index": "int64",
                "hidden": "float32", "logits": "float32", "topk_values": "float32", "topk_ids": "int64"}
KV_PREFIXES = ("past_key.", "past_value.", "present_key.", "present_value.")
NEW_KV = ("new_keys", "new_values")  # when kv.in_place is false: this step's K/V, written by the runtime
MAX_LAYERS = 4096  # above this a manifest is not describing a real model; stop before building huge name sets


def run(ctx: GateContext) -> list[Check]:
    m = ctx.manifest
    graphs = ctx.graphs()
    layout = expected_layout(ctx.section("profile"))
    return [
        GRAPH_IO.check([p for g in graphs for p in _io_problems(ctx, g)], f"{len(graphs)} graphs declare what the manifest lists"),
        LANES.check(_lanes_problems(m, graphs, layout), f"lanes {m.profile.lanes}; decode {sorted(layout.decode.values())}"),
        CONTEXT.check(_context_problems(m, graphs), f"context {m.profile.context}"),
        _context_trained(ctx),
        PREFILL_CHUNKS.check(_chunk_problems(m, graphs), f"prefill chunks {list(m.profile.prefill_chunks)}"),
        GRAPH_TYPE.check(_type_problems(graphs, layout), "graph types agree with their shapes"),
        KV_SHAPE.check(_kv_problems(ctx, graphs), f"KV {m.kv.layout} [lanes, {m.kv.kv_heads}, context, {m.kv.head_dim}] "
                                                   f"x {m.kv.num_layers} layers"),
        HIDDEN.check(_hidden_problems(ctx, graphs, layout),
                     f"hidden width {ctx.hparams().get('hidden_size')}; heads for rows {sorted(layout.head.values())}"
                     if layout.split else "single layout: prefill and decode emit logits themselves"),
        DTYPE.check(_dtype_problems(m, graphs), f"KV {m.kv.dtype}; fixed I/O dtypes"),
    ] + contract_vocab.run(ctx) + contract_moe.run(ctx)


# ---- helpers -----------------------------------------------------------------------------------

def _tensors(g: dict, io: str) -> dict[str, dict]:
    return {t["name"]: t for t in g.get(io, []) if isinstance(t, dict) and "name" in t}


def _onnx_tensors(values) -> dict[str, tuple[list, str]]:
    """name -> (shape with None for a symbolic or unknown dim, numpy dtype name)."""
    from onnx import helper

    out = {}
    for v in values:
        tt = v.type.tensor_type
        try:
            dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type).name
        except (KeyError, ValueError):
            dtype = f"onnx-type-{tt.elem_type}"
        if not tt.HasField("shape"):
            shape = None
        else:
            shape = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        out[v.name] = (shape, dtype)
    return out


def _kv_tensors(g: dict) -> list[tuple[str, dict]]:
    return [(io, t) for io in ("inputs", "outputs") for t in g.get(io, [])
            if isinstance(t, dict) and str(t.get("name", "")).startswith(KV_PREFIXES)]


def _dim(t: dict, i: int):
    shape = t.get("shape") or []
    return shape[i] if len(shape) > i else None


# ---- checks ------------------------------------------------------------------------------------

def _io_problems(ctx: GateContext, g: dict) -> list[str]:
    name = g.get("name")
    model = ctx.onnx_model(str(g.get("file")))
    if model is None:
        return []  # E.load reports why
    problems = []
    if model.graph.name != name:
        problems.append(f"graph {name!r}: the .onnx graph is named {model.graph.name!r}")
    initializers = {t.name for t in model.graph.initializer}
    for io, values in (("inputs", [v for v in model.graph.input if v.name not in initializers]), ("outputs", model.graph.output)):
        declared, actual = _tensors(g, io), _onnx_tensors(values)
        for t in sorted(set(declared) - set(actual)):
            problems.append(f"graph {name!r}: {io[:-1]} {t!r} is in the manifest but not in the .onnx")
        for t in sorted(set(actual) - set(declared)):
            problems.append(f"graph {name!r}: {io[:-1]} {t!r} is in the .onnx but not in the manifest")
        for t in sorted(set(declared) & set(actual)):
            shape, dtype = actual[t]
            if shape is None or any(d is None or d < 1 for d in shape):
                problems.append(f"graph {name!r}: {io[:-1]} {t!r} has a shape that is not static: {shape}")
            elif shape != list(declared[t].get("shape", [])):
                problems.append(f"graph {name!r}: {io[:-1]} {t!r} is {shape} in the .onnx, {declared[t].get('shape')} in the manifest")
            if dtype != declared[t].get("dtype"):
                problems.append(f"graph {name!r}: {io[:-1]} {t!r} is {dtype} in the .onnx, {declared[t].get('dtype')} in the manifest")
    return problems


def _lanes_problems(m, graphs: list[dict], layout: Layout) -> list[str]:
    problems = []
    if m.kv.lanes != m.profile.lanes:
        problems.append(f"kv.lanes {m.kv.lanes} != profile.lanes {m.profile.lanes}")
    decode_lanes = []
    for g in graphs:
        name, kind, lanes = g.get("name"), g.get("type"), g.get("lanes")
        want = {PREFILL: {name: 1}, DECODE: layout.decode, HEAD: layout.head}.get(kind, {}).get(name)
        if want is not None and lanes != want:
            problems.append(f"graph {name!r} ({kind}) has lanes {lanes}; that entry point serves {want}")
        if kind == DECODE:
            decode_lanes.append(lanes)
        ins, outs = _tensors(g, "inputs"), _tensors(g, "outputs")
        rows = [(ins.get(t), t) for t in ("input_ids", "seqlens_k", "hidden")] + [(outs.get(t), t) for t in ("hidden", "logits")]
        for t, what in rows:
            if t is not None and _dim(t, 0) != lanes:
                problems.append(f"graph {name!r}: {what} {t.get('shape')} has {_dim(t, 0)} rows, the graph has {lanes} lanes")
        for _, t in _kv_tensors(g):
            if _dim(t, 0) != lanes:
                problems.append(f"graph {name!r}: {t['name']} {t.get('shape')} has {_dim(t, 0)} lanes, the graph has {lanes}")
    if decode_lanes and max(decode_lanes) != m.profile.lanes:
        problems.append(f"the widest decode graph has {max(decode_lanes)} lanes; profile.lanes is {m.profile.lanes}")
    return problems


def _context_problems(m, graphs: list[dict]) -> list[str]:
    problems = []
    context = m.profile.context
    if m.kv.context != context:
        problems.append(f"kv.context {m.kv.context} != profile.context {context}")
    for g in graphs:
        for _, t in _kv_tensors(g):
            if _dim(t, 2) != context:
                problems.append(f"graph {g.get('name')!r}: {t['name']} {t.get('shape')} holds {_dim(t, 2)} positions, "
                                f"the context is {context}")
    return problems


def _context_trained(ctx: GateContext) -> Check:
    trained = ctx.hparams().get("max_position_embeddings")
    context = ctx.manifest.profile.context
    problems = []
    if isinstance(trained, int) and context > trained:
        problems.append(f"context {context} exceeds max_position_embeddings {trained}: positions past it were never trained")
    return CONTEXT_TRAINED.check(problems, f"context {context} <= max_position_embeddings {trained}")


def _chunk_problems(m, graphs: list[dict]) -> list[str]:
    problems = []
    prefill = [g for g in graphs if g.get("type") == "prefill"]
    tokens = sorted(g.get("tokens") for g in prefill if isinstance(g.get("tokens"), int))
    if tokens != sorted(m.profile.prefill_chunks):
        problems.append(f"prefill graphs take {tokens} tokens; profile.prefill_chunks is {list(m.profile.prefill_chunks)}")
    for g in graphs:
        name, n = g.get("name"), g.get("tokens")
        if g.get("type") == "prefill" and isinstance(name, str) and name.startswith("prefill_") and name != f"prefill_{n}":
            problems.append(f"graph {name!r} takes {n} tokens; its name says {name.removeprefix('prefill_')}")
        ids = _tensors(g, "inputs").get("input_ids")
        if ids is not None and _dim(ids, 1) != n:
            problems.append(f"graph {name!r}: input_ids {ids.get('shape')} holds {_dim(ids, 1)} tokens per lane, the graph says {n}")
    return problems


def _type_problems(graphs: list[dict], layout: Layout) -> list[str]:
    problems = []
    for g in graphs:
        name, kind, lanes, tokens = g.get("name"), g.get("type"), g.get("lanes"), g.get("tokens")
        ins = _tensors(g, "inputs")
        has_last = "last_index" in ins
        if kind == DECODE:
            if tokens != 1:
                problems.append(f"graph {name!r} is labelled decode but takes {tokens} tokens per lane (decode takes 1)")
            if has_last:
                problems.append(f"graph {name!r} is labelled decode but has a last_index input (a prefill input)")
        elif kind == PREFILL:
            if lanes != 1:
                problems.append(f"graph {name!r} is labelled prefill but has {lanes} lanes (prefill runs one lane)")
            if not (isinstance(tokens, int) and tokens > 1) and not has_last:
                problems.append(f"graph {name!r} is labelled prefill but takes {tokens} token and has no last_index input")
        elif kind == HEAD:
            if set(ins) != {"hidden"} or _kv_tensors(g):
                problems.append(f"graph {name!r} is labelled head but takes {sorted(ins)} (a head takes only hidden)")
        if kind in BODY_TYPES and "input_ids" not in ins:
            problems.append(f"graph {name!r} is labelled {kind} but has no input_ids input")
    decode = [g.get("lanes") for g in graphs if g.get("type") == DECODE]
    if layout.split and len(set(decode)) != len(decode):
        problems.append(f"decode graphs have lanes {decode}; each decode batch size once")
    if not layout.split and len(decode) != 1:
        problems.append(f"{len(decode)} graphs are labelled decode; this layout needs exactly one")
    if not decode:
        problems.append("no graph is labelled decode; the runtime needs at least one")
    if not any(g.get("type") == PREFILL for g in graphs):
        problems.append("no graph is labelled prefill; the runtime needs at least one")
    if layout.split and not any(g.get("type") == HEAD for g in graphs):
        problems.append("no graph is labelled head; split-layout bodies emit hidden states that need one")
    return problems


def _kv_problems(ctx: GateContext, graphs: list[dict]) -> list[str]:
    kv, hp = ctx.manifest.kv, ctx.hparams()
    problems = []
    if kv.layout != "BNSH":
        problems.append(f"kv.layout {kv.layout!r} is not BNSH ([lanes, kv_heads, context, head_dim]), the only layout")
    for field, key in (("num_layers", "num_layers"), ("kv_heads", "num_kv_heads"), ("head_dim", "head_dim")):
        if getattr(kv, field) != hp.get(key):
            problems.append(f"kv.{field} {getattr(kv, field)} != model {key} {hp.get(key)}")
    layers = hp.get("num_layers") if isinstance(hp.get("num_layers"), int) else kv.num_layers
    if not 1 <= layers <= MAX_LAYERS:
        return problems + [f"num_layers {layers} is outside 1..{MAX_LAYERS}; per-layer KV tensors not checked"]
    for g in graphs:
        if g.get("type") not in BODY_TYPES:
            continue  # heads hold no KV (C.graph_type says so when one does)
        name = g.get("name")
        ins, outs = _tensors(g, "inputs"), _tensors(g, "outputs")
        want_in = {f"past_{p}.{i}" for p in ("key", "value") for i in range(layers)}
        want_out = {f"present_{p}.{i}" for p in ("key", "value") for i in range(layers)} if kv.in_place else set()
        have_in = {n for n in ins if n.startswith(KV_PREFIXES)}
        have_out = {n for n in outs if n.startswith(KV_PREFIXES)}
        for missing in sorted(want_in - have_in) + sorted(want_out - have_out):
            problems.append(f"graph {name!r} lacks the KV tensor {missing!r}")
        for extra in sorted(have_in - want_in) + sorted(have_out - want_out):
            problems.append(f"graph {name!r} has an unexpected KV tensor {extra!r} ({layers} layers)")
        for _, t in _kv_tensors(g):
            shape = t.get("shape") or []
            if len(shape) != 4:
                problems.append(f"graph {name!r}: {t['name']} has shape {shape}, expected rank 4 (BNSH)")
            elif (shape[1], shape[3]) != (kv.kv_heads, kv.head_dim):
                problems.append(f"graph {name!r}: {t['name']} {shape} has {shape[1]} heads x {shape[3]} head_dim, "
                                f"the KV layout says {kv.kv_heads} x {kv.head_dim}")
        if not kv.in_place:
            problems += _new_kv_problems(g, outs, kv, layers)
        else:
            for out in sorted(have_out & want_out):
                past = ins.get(out.replace("present_", "past_", 1))
                if past is not None and (past.get("shape"), past.get("dtype")) != (outs[out].get("shape"), outs[out].get("dtype")):
                    problems.append(f"graph {name!r}: {out} cannot update its past buffer in place: "
                                    f"{outs[out].get('shape')} {outs[out].get('dtype')} vs {past.get('shape')} {past.get('dtype')}")
    return problems


def _new_kv_problems(g: dict, outs: dict, kv, layers: int) -> list[str]:
    """Not in place (portable): this step's K and V come back whole, [layers, lanes, kv_heads, tokens, head_dim]."""
    want = [layers, g.get("lanes"), kv.kv_heads, g.get("tokens"), kv.head_dim]
    problems = []
    for name in NEW_KV:
        t = outs.get(name)
        if t is None:
            problems.append(f"graph {g.get('name')!r} lacks the {name!r} output (KV is not updated in place)")
        elif t.get("shape") != want:
            problems.append(f"graph {g.get('name')!r}: {name} {t.get('shape')}, expected {want} (layers, lanes, kv_heads, tokens, head_dim)")
    return problems


def _hidden_problems(ctx: GateContext, graphs: list[dict], layout: Layout) -> list[str]:
    if not layout.split:
        return []
    width = ctx.hparams().get("hidden_size")
    problems = []
    head_rows = {g.get("lanes") for g in graphs if g.get("type") == HEAD}
    for g in graphs:
        name, kind, lanes = g.get("name"), g.get("type"), g.get("lanes")
        io = "outputs" if kind in BODY_TYPES else "inputs" if kind == HEAD else None
        if io is None:
            continue
        hidden = _tensors(g, io).get("hidden")
        if hidden is None:
            problems.append(f"graph {name!r} ({kind}) has no hidden {io[:-1]}")
        elif hidden.get("shape") != [lanes, width]:
            problems.append(f"graph {name!r}: hidden {hidden.get('shape')}, expected [{lanes}, {width}] (rows, hidden_size)")
        if kind in BODY_TYPES and lanes not in head_rows:
            problems.append(f"graph {name!r} emits {lanes} hidden rows but no head graph takes {lanes} rows")
    return problems


def _dtype_problems(m, graphs: list[dict]) -> list[str]:
    problems = []
    for g in graphs:
        for io in ("inputs", "outputs"):
            for t in g.get(io, []):
                name = t.get("name", "")
                want = m.kv.dtype if name.startswith(KV_PREFIXES) or name in NEW_KV else FIXED_DTYPES.get(name)
                if want is not None and t.get("dtype") != want:
                    problems.append(f"graph {g.get('name')!r}: {name} is {t.get('dtype')}, expected {want}")
    return problems
