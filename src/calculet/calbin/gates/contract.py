"""Gate C, contract (shapes half): lanes, context, KV layout, hidden width and dtypes agree everywhere.

    manifest (profile, kv, hyperparameters)  ==  graphs[] as declared  ==  each .onnx's inputs and outputs

Each KV tensor is [lanes, kv_heads, length, head_dim] (length = context, or a sliding-window layer's
ring); its dimensions are split over C.lanes,
C.context and C.kv_shape so that one wrong number fails one check. A graph's type must agree with
its shapes: prefill runs one lane with many tokens (or a last_index input), decode one token per
lane, a head turns `hidden` rows into logits. The vocabulary half is contract_vocab.py, the
mixture-of-experts part contract_moe.py.
"""

from __future__ import annotations

from calculet.calbin.gates import contract_moe, contract_vocab
from calculet.calbin.gates.context import GateContext
from calculet.calbin.gates.layout import Layout, expected_layout
from calculet.calbin.graphspec import BODY_KINDS, DECODE, HEAD, NEW_KV, PREFILL, GraphSpec, TensorSpec, is_kv
from calculet.calbin.validate_report import Check, Rule, Severity

GRAPH_IO = Rule("C.graph_io", "each .onnx declares exactly the inputs and outputs the manifest lists (names, static shapes, dtypes)")
LANES = Rule("C.lanes", "lanes agree: profile, KV layout, each graph's entry point (prefill 1, decode_<n> n) and every tensor's rows")
CONTEXT = Rule("C.context", "context agrees: profile, KV layout and every KV tensor; a layer's buffer holds the context, "
                            "or (sliding-window layers) a ring of at least window + largest prefill chunk - 1 rows")
CONTEXT_TRAINED = Rule("C.context_trained", "the context does not exceed the model's max_position_embeddings", Severity.WARNING)
PREFILL_CHUNKS = Rule("C.prefill_chunks", "prefill graphs cover exactly the profile's chunk sizes, prefill_<S> taking S tokens")
GRAPH_TYPE = Rule("C.graph_type", "each graph's type agrees with its shapes; prefill and decode graphs present")
KV_SHAPE = Rule("C.kv_shape", "KV layout agrees with the model: layers, kv heads, head_dim; past_* per layer, and present_* "
                               "per layer (in place) or new_keys/new_values")
HIDDEN = Rule("C.hidden", "bodies emit hidden [rows, hidden_size], and a head graph takes each body's rows")
DTYPE = Rule("C.dtype", "dtypes agree: KV tensors use the KV dtype; ids int64, seqlens int32, hidden/logits float32")
RULES = (GRAPH_IO, LANES, CONTEXT, CONTEXT_TRAINED, PREFILL_CHUNKS, GRAPH_TYPE, KV_SHAPE, HIDDEN, DTYPE) + contract_vocab.RULES + contract_moe.RULES

FIXED_DTYPES = {"input_ids": "int64", "seqlens_k": "int32", "total_seq_len": "int32", "last_index": "int64",
                "hidden": "float32", "logits": "float32", "topk_values": "float32", "topk_ids": "int64",
                "logits_scale": "float32"}
MAX_LAYERS = 4096  # above this a manifest is not describing a real model; stop before building huge name sets


def run(ctx: GateContext) -> list[Check]:
    m = ctx.manifest
    graphs = list(m.graphs)
    layout = expected_layout(m.profile.lanes, m.profile.prefill_chunks, m.profile.decode_lanes)
    return [
        GRAPH_IO.check([p for g in graphs for p in _io_problems(ctx, g)], f"{len(graphs)} graphs declare what the manifest lists"),
        LANES.check(_lanes_problems(m, graphs, layout), f"lanes {m.profile.lanes}; decode {sorted(layout.decode.values())}"),
        CONTEXT.check(_context_problems(m, graphs), f"context {m.profile.context}"),
        _context_trained(ctx),
        PREFILL_CHUNKS.check(_chunk_problems(m, graphs), f"prefill chunks {list(m.profile.prefill_chunks)}"),
        GRAPH_TYPE.check(_type_problems(graphs), "graph types agree with their shapes"),
        KV_SHAPE.check(_kv_problems(ctx, graphs), f"KV {m.kv.layout} [lanes, {m.kv.kv_heads}, length, {m.kv.head_dim}] "
                                                   f"x {m.kv.num_layers} layers"),
        HIDDEN.check(_hidden_problems(ctx, graphs, layout),
                     f"hidden width {m.spec.hidden_size}; heads for rows {sorted(layout.head.values())}"),
        DTYPE.check(_dtype_problems(m, graphs), f"KV {m.kv.dtype}; fixed I/O dtypes"),
    ] + contract_vocab.run(ctx) + contract_moe.run(ctx)


# ---- helpers -----------------------------------------------------------------------------------

def _tensors(g: GraphSpec, io: str) -> dict[str, TensorSpec]:
    return {t.name: t for t in getattr(g, io)}


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


def _kv_tensors(g: GraphSpec) -> list[tuple[str, TensorSpec]]:
    return [(io, t) for io in ("inputs", "outputs") for t in getattr(g, io) if is_kv(t.name)]


def _dim(t: TensorSpec, i: int):
    return t.shape[i] if len(t.shape) > i else None


# ---- checks ------------------------------------------------------------------------------------

def _io_problems(ctx: GateContext, g: GraphSpec) -> list[str]:
    name = g.name
    model = ctx.onnx_model(g.file)
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
            elif shape != list(declared[t].shape):
                problems.append(f"graph {name!r}: {io[:-1]} {t!r} is {shape} in the .onnx, {list(declared[t].shape)} in the manifest")
            if dtype != declared[t].dtype:
                problems.append(f"graph {name!r}: {io[:-1]} {t!r} is {dtype} in the .onnx, {declared[t].dtype} in the manifest")
    return problems


def _lanes_problems(m, graphs: list[GraphSpec], layout: Layout) -> list[str]:
    problems = []
    if m.kv.lanes != m.profile.lanes:
        problems.append(f"kv.lanes {m.kv.lanes} != profile.lanes {m.profile.lanes}")
    decode_lanes = []
    for g in graphs:
        name, kind, lanes = g.name, g.type, g.lanes
        want = {PREFILL: {name: 1}, DECODE: layout.decode, HEAD: layout.head}.get(kind, {}).get(name)
        if want is not None and lanes != want:
            problems.append(f"graph {name!r} ({kind}) has lanes {lanes}; that entry point serves {want}")
        if kind == DECODE:
            decode_lanes.append(lanes)
        ins, outs = _tensors(g, "inputs"), _tensors(g, "outputs")
        rows = [(ins.get(t), t) for t in ("input_ids", "seqlens_k", "hidden")] + [(outs.get(t), t) for t in ("hidden", "logits")]
        for t, what in rows:
            if t is not None and _dim(t, 0) != lanes:
                problems.append(f"graph {name!r}: {what} {list(t.shape)} has {_dim(t, 0)} rows, the graph has {lanes} lanes")
        for _, t in _kv_tensors(g):
            if _dim(t, 0) != lanes:
                problems.append(f"graph {name!r}: {t.name} {list(t.shape)} has {_dim(t, 0)} lanes, the graph has {lanes}")
    if decode_lanes and max(decode_lanes) != m.profile.lanes:
        problems.append(f"the widest decode graph has {max(decode_lanes)} lanes; profile.lanes is {m.profile.lanes}")
    return problems


def _context_problems(m, graphs: list[GraphSpec]) -> list[str]:
    problems = []
    context, kv, spec = m.profile.context, m.kv, m.spec
    if kv.context != context:
        problems.append(f"kv.context {kv.context} != profile.context {context}")
    lengths = kv.layer_lengths
    if len(lengths) != kv.num_layers or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths):
        return problems + [f"kv.layer_lengths {list(lengths)[:8]} is not one whole number > 0 per layer "
                           f"({kv.num_layers} layers)"]
    # A chunk of S tokens writes S ring rows while its first query still reads the window-1 rows
    # before it: the ring needs window + S - 1 rows so that no write lands on a row still read.
    need = (spec.sliding_window or 0) + max(m.profile.prefill_chunks) - 1
    for i, n in enumerate(lengths):
        sliding = i < len(spec.layer_types) and spec.layer_types[i] == "sliding"
        if n == context:
            continue
        if not sliding:
            problems.append(f"layer {i} ({spec.layer_types[i] if i < len(spec.layer_types) else '?'} attention) holds {n} "
                            f"positions; only sliding-window layers may hold fewer than the context {context}")
        elif not need <= n < context:
            problems.append(f"layer {i}: a ring of {n} rows; a sliding window of {spec.sliding_window} with prefill chunks up "
                            f"to {max(m.profile.prefill_chunks)} needs {need}..{context - 1} rows (or the context {context})")
    for g in graphs:
        for _, t in _kv_tensors(g):
            layer = t.name.rsplit(".", 1)[-1]
            want = lengths[int(layer)] if layer.isdigit() and int(layer) < len(lengths) else context
            if _dim(t, 2) != want:
                problems.append(f"graph {g.name!r}: {t.name} {list(t.shape)} holds {_dim(t, 2)} positions, "
                                f"the KV layout says {want} for that layer (context {context})")
    return problems


def _context_trained(ctx: GateContext) -> Check:
    trained = ctx.manifest.spec.max_position_embeddings
    context = ctx.manifest.profile.context
    problems = []
    if isinstance(trained, int) and context > trained:
        problems.append(f"context {context} exceeds max_position_embeddings {trained}: positions past it were never trained")
    return CONTEXT_TRAINED.check(problems, f"context {context} <= max_position_embeddings {trained}")


def _chunk_problems(m, graphs: list[GraphSpec]) -> list[str]:
    problems = []
    tokens = sorted(g.tokens for g in graphs if g.type == PREFILL)
    if tokens != sorted(m.profile.prefill_chunks):
        problems.append(f"prefill graphs take {tokens} tokens; profile.prefill_chunks is {list(m.profile.prefill_chunks)}")
    for g in graphs:
        name, n = g.name, g.tokens
        if g.type == PREFILL and name.startswith("prefill_") and name != f"prefill_{n}":
            problems.append(f"graph {name!r} takes {n} tokens; its name says {name.removeprefix('prefill_')}")
        ids = _tensors(g, "inputs").get("input_ids")
        if ids is not None and _dim(ids, 1) != n:
            problems.append(f"graph {name!r}: input_ids {list(ids.shape)} holds {_dim(ids, 1)} tokens per lane, the graph says {n}")
    return problems


def _type_problems(graphs: list[GraphSpec]) -> list[str]:
    problems = []
    for g in graphs:
        name, kind, lanes, tokens = g.name, g.type, g.lanes, g.tokens
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
            if tokens <= 1 and not has_last:
                problems.append(f"graph {name!r} is labelled prefill but takes {tokens} token and has no last_index input")
        elif kind == HEAD:
            if set(ins) != {"hidden"} or _kv_tensors(g):
                problems.append(f"graph {name!r} is labelled head but takes {sorted(ins)} (a head takes only hidden)")
        if kind in BODY_KINDS and "input_ids" not in ins:
            problems.append(f"graph {name!r} is labelled {kind} but has no input_ids input")
    decode = [g.lanes for g in graphs if g.type == DECODE]
    if len(set(decode)) != len(decode):
        problems.append(f"decode graphs have lanes {decode}; each decode batch size once")
    if not decode:
        problems.append("no graph is labelled decode; the runtime needs at least one")
    if not any(g.type == PREFILL for g in graphs):
        problems.append("no graph is labelled prefill; the runtime needs at least one")
    if not any(g.type == HEAD for g in graphs):
        problems.append("no graph is labelled head; bodies emit hidden states that need one")
    return problems


def _kv_problems(ctx: GateContext, graphs: list[GraphSpec]) -> list[str]:
    kv, spec = ctx.manifest.kv, ctx.manifest.spec
    problems = []
    if kv.layout != "BNSH":
        problems.append(f"kv.layout {kv.layout!r} is not BNSH ([lanes, kv_heads, context, head_dim]), the only layout")
    for field, key in (("num_layers", "num_layers"), ("kv_heads", "num_kv_heads"), ("head_dim", "head_dim")):
        if getattr(kv, field) != getattr(spec, key):
            problems.append(f"kv.{field} {getattr(kv, field)} != model {key} {getattr(spec, key)}")
    layers = spec.num_layers
    if not 1 <= layers <= MAX_LAYERS:
        return problems + [f"num_layers {layers} is outside 1..{MAX_LAYERS}; per-layer KV tensors not checked"]
    for g in graphs:
        if g.type not in BODY_KINDS:
            continue  # heads hold no KV (C.graph_type says so when one does)
        name = g.name
        ins, outs = _tensors(g, "inputs"), _tensors(g, "outputs")
        want_in = {f"past_{p}.{i}" for p in ("key", "value") for i in range(layers)}
        want_out = {f"present_{p}.{i}" for p in ("key", "value") for i in range(layers)} if kv.in_place else set()
        have_in = {n for n in ins if is_kv(n)}
        have_out = {n for n in outs if is_kv(n)}
        for missing in sorted(want_in - have_in) + sorted(want_out - have_out):
            problems.append(f"graph {name!r} lacks the KV tensor {missing!r}")
        for extra in sorted(have_in - want_in) + sorted(have_out - want_out):
            problems.append(f"graph {name!r} has an unexpected KV tensor {extra!r} ({layers} layers)")
        for _, t in _kv_tensors(g):
            shape = list(t.shape)
            if len(shape) != 4:
                problems.append(f"graph {name!r}: {t.name} has shape {shape}, expected rank 4 (BNSH)")
            elif (shape[1], shape[3]) != (kv.kv_heads, kv.head_dim):
                problems.append(f"graph {name!r}: {t.name} {shape} has {shape[1]} heads x {shape[3]} head_dim, "
                                f"the KV layout says {kv.kv_heads} x {kv.head_dim}")
        if not kv.in_place:
            problems += _new_kv_problems(g, outs, kv, layers)
        else:
            for out in sorted(have_out & want_out):
                past = ins.get(out.replace("present_", "past_", 1))
                if past is not None and (past.shape, past.dtype) != (outs[out].shape, outs[out].dtype):
                    problems.append(f"graph {name!r}: {out} cannot update its past buffer in place: "
                                    f"{list(outs[out].shape)} {outs[out].dtype} vs {list(past.shape)} {past.dtype}")
    return problems


def _new_kv_problems(g: GraphSpec, outs: dict, kv, layers: int) -> list[str]:
    """Not in place (portable): this step's K and V come back whole, [layers, lanes, kv_heads, tokens, head_dim]."""
    want = [layers, g.lanes, kv.kv_heads, g.tokens, kv.head_dim]
    problems = []
    for name in NEW_KV:
        t = outs.get(name)
        if t is None:
            problems.append(f"graph {g.name!r} lacks the {name!r} output (KV is not updated in place)")
        elif list(t.shape) != want:
            problems.append(f"graph {g.name!r}: {name} {list(t.shape)}, expected {want} (layers, lanes, kv_heads, tokens, head_dim)")
    return problems


def _hidden_problems(ctx: GateContext, graphs: list[GraphSpec], layout: Layout) -> list[str]:
    width = ctx.manifest.spec.hidden_size
    problems = []
    head_rows = {g.lanes for g in graphs if g.type == HEAD}
    for g in graphs:
        name, kind, lanes = g.name, g.type, g.lanes
        io = "outputs" if kind in BODY_KINDS else "inputs" if kind == HEAD else None
        if io is None:
            continue
        hidden = _tensors(g, io).get("hidden")
        if hidden is None:
            problems.append(f"graph {name!r} ({kind}) has no hidden {io[:-1]}")
        elif list(hidden.shape) != [lanes, width]:
            problems.append(f"graph {name!r}: hidden {list(hidden.shape)}, expected [{lanes}, {width}] (rows, hidden_size)")
        if kind in BODY_KINDS and lanes not in head_rows:
            problems.append(f"graph {name!r} emits {lanes} hidden rows but no head graph takes {lanes} rows")
    return problems


def _dtype_problems(m, graphs: list[GraphSpec]) -> list[str]:
    problems = []
    for g in graphs:
        for t in (*g.inputs, *g.outputs):
            want = m.kv.dtype if is_kv(t.name) or t.name in NEW_KV else FIXED_DTYPES.get(t.name)
            if want is not None and t.dtype != want:
                problems.append(f"graph {g.name!r}: {t.name} is {t.dtype}, expected {want}")
    return problems
