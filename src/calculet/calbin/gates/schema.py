"""Gate B, manifest: the manifest is a well-formed `calculet.calbin/3` document.

This gate reads the raw JSON (the one reader besides `Manifest.from_json`), so that a broken
manifest is judged field by field; gates C–E then read the typed `Manifest` it parsed.


Known schema version; required fields present with the right JSON types; graph types from the
allowed set; graph names unique and equal, exactly, to the entry points the profile implies
(see layout.py: `prefill_<S>`, `decode_<n>`, `head_<n>`): "decode_v2" does not stand in for "decode";
every size in bytes, said so in its name or by the memory plan's `unit`.
"""

from __future__ import annotations

import re

from calculet.calbin.graphspec import DTYPE_BYTES, GRAPH_KINDS, KV_DTYPES
from calculet.calbin.manifest import TARGETS, Manifest, Profile, schema_problem
from calculet.calbin.memory_plan import UNIT as PLAN_UNIT
from calculet.calbin.validate_report import Check, Rule, Severity
from calculet.calbin.gates.context import GateContext
from calculet.calbin.gates.layout import expected_layout
from calculet.errors import ModelError

SCHEMA_VERSION = Rule("B.schema_version", "the schema version is one this reader supports")
REQUIRED_FIELD = Rule("B.required_field", "every required field is present with the right JSON type")
PARSE = Rule("B.parse", "the manifest parses into the typed Manifest (no unknown or malformed sections)")
TARGET = Rule("B.target", "the target is a known one")
PROFILE = Rule("B.profile", "the shape profile is sane: lanes 1..256, context >= 2, distinct chunk sizes in 1..context")
DTYPE_KNOWN = Rule("B.dtype_known", "every dtype (KV, graph tensors, weight tensors) is a known numpy dtype name")
GRAPH_TYPE = Rule("B.graph_type", "every graph's type is from the allowed set")
GRAPH_NAME_UNIQUE = Rule("B.graph_name_unique", "graph names are unique")
GRAPH_NAME_EXACT = Rule("B.graph_name_exact", "graph names equal the profile's entry points exactly (never a substring match)")
GRAPH_FILE = Rule("B.graph_file", "each graph's file is graphs/<name>.onnx")
SIZE_UNIT = Rule("B.size_unit", "every size is a whole number of bytes, and says so (a *_bytes name or the plan's unit)")
TOOLCHAIN = Rule("B.toolchain", "the calbin was produced by the onnx / onnxruntime versions installed here", Severity.WARNING)
RULES = (SCHEMA_VERSION, REQUIRED_FIELD, PARSE, TARGET, PROFILE, DTYPE_KNOWN, GRAPH_TYPE, GRAPH_NAME_UNIQUE,
         GRAPH_NAME_EXACT, GRAPH_FILE, SIZE_UNIT, TOOLCHAIN)
# When one of these fails, gates C-F cannot read the manifest safely and are skipped.
BLOCKING = {SCHEMA_VERSION.id, REQUIRED_FIELD.id, PARSE.id, DTYPE_KNOWN.id, SIZE_UNIT.id}

DTYPES = tuple(DTYPE_BYTES)
OTHER_UNITS = ("_b", "_kb", "_mb", "_gb", "_tb", "_kib", "_mib", "_gib", "_tib", "_bits", "_words")

_INT, _STR, _BOOL, _LIST, _DICT = "integer", "string", "boolean", "list", "object"
_SIZE = "size"  # a byte count: presence checked here, type and unit by B.size_unit
_SHA256 = "SHA-256 (64 lowercase hex digits)"
# (path, JSON type). "[]" walks a list, "*" the values of an object; "?" after a type allows null.
REQUIRED: tuple[tuple[str, str], ...] = (
    ("schema_version", _STR), ("target", _STR),
    ("model", _DICT), ("model.family", _STR), ("model.model_type", _STR), ("model.source", _DICT),
    ("model.hyperparameters", _DICT),
    *((f"model.hyperparameters.{k}", _INT) for k in ("vocab_size", "hidden_size", "num_layers", "num_heads",
                                                      "num_kv_heads", "head_dim")),
    ("tokenizer", _DICT), ("tokenizer.file", _STR), ("tokenizer.vocab_size", _INT),
    ("tokenizer.bos_token_id", _INT + "?"), ("tokenizer.eos_token_ids", _LIST), ("tokenizer.pad_token_id", _INT + "?"),
    ("tokenizer.add_bos_token", _BOOL), ("tokenizer.chat_template", _STR + "?"),
    ("profile", _DICT), ("profile.lanes", _INT), ("profile.context", _INT), ("profile.prefill_chunks", _LIST),
    ("profile.decode_lanes", _LIST),
    ("graphs", _LIST), ("graphs[].name", _STR), ("graphs[].type", _STR), ("graphs[].file", _STR),
    ("graphs[].lanes", _INT), ("graphs[].tokens", _INT), ("graphs[].inputs", _LIST), ("graphs[].outputs", _LIST),
    *((f"graphs[].{io}[].{k}", t) for io in ("inputs", "outputs") for k, t in (("name", _STR), ("shape", _LIST), ("dtype", _STR))),
    ("kv", _DICT), ("kv.layout", _STR), ("kv.dtype", _STR), ("kv.in_place", _BOOL),
    *((f"kv.{k}", _INT) for k in ("num_layers", "lanes", "kv_heads", "context", "head_dim")), ("kv.layer_lengths", _LIST),
    ("weights", _DICT), ("weights.file", _STR), ("weights.bytes", _SIZE), ("weights.tensors", _LIST),
    ("weights.tensors[].name", _STR), ("weights.tensors[].dtype", _STR), ("weights.tensors[].shape", _LIST),
    ("weights.tensors[].offset", _SIZE), ("weights.tensors[].nbytes", _SIZE),
    ("quantization", _DICT), ("quantization.policy", _STR),
    ("quantization.table", _DICT), ("quantization.tensors", _DICT),
    ("memory_plan", _DICT), ("memory_plan.unit", _STR), ("memory_plan.weights_bytes", _SIZE),
    ("memory_plan.kv", _DICT), ("memory_plan.kv.dtype", _STR), ("memory_plan.kv.groups", _LIST),
    ("memory_plan.kv.groups[].layers", _LIST), ("memory_plan.kv.groups[].buffer_shape", _LIST),
    ("memory_plan.kv.groups[].buffers", _INT), ("memory_plan.kv.groups[].buffer_bytes", _SIZE),
    ("memory_plan.kv.groups[].total_bytes", _SIZE), ("memory_plan.kv.bytes_per_lane", _SIZE),
    ("memory_plan.kv.total_bytes", _SIZE),
    ("memory_plan.staging", _LIST), ("memory_plan.staging[].graph", _STR), ("memory_plan.staging[].bindings", _INT),
    ("memory_plan.staging[].binding_bytes", _SIZE), ("memory_plan.staging[].total_bytes", _SIZE),
    ("memory_plan.total_bytes", _SIZE), ("memory_plan.workspace_estimate_bytes", _SIZE),
    ("toolchain", _DICT), *((f"toolchain.{k}", _STR) for k in ("calculet", "onnx", "onnxruntime", "numpy", "python")),
    ("files", _DICT), ("files.*.bytes", _SIZE), ("files.*.sha256", _SHA256),
)
# Byte counts outside the memory plan's top level (there, every number is in memory_plan.unit).
SIZE_FIELDS = ("files.*.bytes", "weights.bytes", "weights.tensors[].offset", "weights.tensors[].nbytes",
               "memory_plan.kv.groups[].buffer_bytes", "memory_plan.kv.groups[].total_bytes",
               "memory_plan.kv.bytes_per_lane", "memory_plan.kv.total_bytes", "memory_plan.staging[].binding_bytes",
               "memory_plan.staging[].total_bytes")


def run(ctx: GateContext) -> list[Check]:
    raw = ctx.raw
    version = raw.get("schema_version")
    problem = schema_problem(version, ctx.folder)
    checks = [SCHEMA_VERSION.check([problem] if problem else [], f"schema {version}")]
    checks.append(REQUIRED_FIELD.check(_required_problems(raw), f"{len(REQUIRED)} required fields present"))
    checks.append(_parse(ctx))
    target = raw.get("target")
    checks.append(TARGET.check([] if target in TARGETS else [f"target {target!r} is not one of {', '.join(TARGETS)}"],
                               f"target {target}"))
    checks.append(PROFILE.check(_profile_problems(ctx.section("profile")), "profile is sane", {"profile": ctx.section("profile")}))
    checks.append(DTYPE_KNOWN.check(_dtype_problems(ctx), "all dtypes known"))
    checks += _graph_checks(ctx)
    checks.append(SIZE_UNIT.check(_size_problems(raw), f"sizes are whole bytes; memory plan unit {PLAN_UNIT!r}"))
    checks.append(_toolchain(ctx.section("toolchain")))
    return checks


# ---- fields ------------------------------------------------------------------------------------

def _list(value) -> list:
    return value if isinstance(value, list) else []


class _NotAnObject:
    """What `_walk` yields for a list item that should be an object and is not."""

    def __init__(self, value):
        self.value = value


def _walk(value, parts: list[str], where: str):
    """Yield (concrete path, value, KeyError when missing, or _NotAnObject) for every place `parts` reaches."""
    if not parts:
        yield where, value
        return
    head, rest = parts[0], parts[1:]
    key, is_list = (head[:-2], True) if head.endswith("[]") else (head, False)
    if key == "*":
        if isinstance(value, dict):
            for k, v in value.items():
                if rest and not isinstance(v, dict):
                    yield f"{where}.{k}" if where else k, _NotAnObject(v)
                    continue
                yield from _walk(v, rest, f"{where}.{k}" if where else k)
        return
    here = f"{where}.{key}" if where else key
    if not isinstance(value, dict):
        return  # the parent's type is reported at the parent
    if key not in value:
        yield here, KeyError(key)
        return
    child = value[key]
    if is_list:
        if isinstance(child, list):
            for i, item in enumerate(child):
                if rest and not isinstance(item, dict):
                    yield f"{here}[{i}]", _NotAnObject(item)
                    continue
                yield from _walk(item, rest, f"{here}[{i}]")
        return
    yield from _walk(child, rest, here)


def _type_ok(value, kind: str) -> bool:
    if kind.endswith("?"):
        if value is None:
            return True
        kind = kind[:-1]
    if kind == _SIZE:
        return True
    if kind == _SHA256:
        return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) is not None
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, {_STR: str, _BOOL: bool, _LIST: list, _DICT: dict}[kind])


def _required_problems(raw: dict) -> list[str]:
    problems = []
    for path, kind in REQUIRED:
        for where, value in _walk(raw, path.split("."), ""):
            if isinstance(value, KeyError):
                problems.append(f"{where}: missing")
            elif isinstance(value, _NotAnObject):
                problems.append(f"{where}: expected object, got {type(value.value).__name__} {str(value.value)[:40]!r}")
            elif not _type_ok(value, kind):
                want = kind.rstrip("?") + (" or null" if kind.endswith("?") else "")
                problems.append(f"{where}: expected {want}, got {type(value).__name__} {str(value)[:40]!r}")
    for path in ("graphs[].inputs[].shape", "graphs[].outputs[].shape", "weights.tensors[].shape"):
        for where, value in _walk(raw, path.split("."), ""):
            if isinstance(value, list) and not all(_is_size(d) for d in value):
                problems.append(f"{where}: {value} must list whole-number dimensions")
    quant = raw.get("quantization")
    per_tensor = quant.get("tensors") if isinstance(quant, dict) else None
    if isinstance(per_tensor, dict) and not all(isinstance(v, dict) and isinstance(v.get("kind"), str) for v in per_tensor.values()):
        problems.append("quantization.tensors: every entry must be an object with a `kind` string")
    golden = raw.get("golden")
    if golden is not None and not (isinstance(golden, dict) and isinstance(golden.get("file"), str)):
        problems.append("golden: expected null or an object with a `file` string")
    return problems


def _parse(ctx: GateContext) -> Check:
    try:
        ctx.manifest = Manifest.from_json(ctx.raw)
    except ModelError as exc:
        return PARSE.check([exc.message], "")
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        return PARSE.check([f"a section is malformed: {type(exc).__name__}: {exc}"], "")
    return PARSE.check([], "parses as a typed Manifest")


def _profile_problems(profile: dict) -> list[str]:
    lanes, context, chunks = profile.get("lanes"), profile.get("context"), profile.get("prefill_chunks")
    if not (isinstance(lanes, int) and isinstance(context, int) and isinstance(chunks, list)
            and all(isinstance(c, int) for c in chunks)):
        return [f"profile is incomplete or not integers: {profile}"]
    problems = []
    try:
        Profile(lanes, context, tuple(chunks), ())
    except ModelError as exc:
        problems.append(exc.message)
    if len(set(chunks)) != len(chunks):
        problems.append(f"prefill_chunks {chunks} has duplicates")
    if "decode_lanes" in profile:
        sizes = profile["decode_lanes"]
        if not isinstance(sizes, list) or not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= lanes for n in sizes):
            problems.append(f"decode_lanes {sizes!r} must list batch sizes in 1..lanes ({lanes})")
    return problems


def _dtype_problems(ctx: GateContext) -> list[str]:
    problems = []
    kv_dtype = ctx.section("kv").get("dtype")
    if kv_dtype not in KV_DTYPES:
        problems.append(f"kv.dtype {kv_dtype!r} is not one of {', '.join(KV_DTYPES)}")
    for g in ctx.graphs():
        for io in ("inputs", "outputs"):
            for t in _list(g.get(io)):
                if isinstance(t, dict) and t.get("dtype") not in DTYPES:
                    problems.append(f"graph {g.get('name')!r} {io[:-1]} {t.get('name')!r}: dtype {t.get('dtype')!r} is unknown")
    for t in _list(ctx.section("weights").get("tensors")):
        if isinstance(t, dict) and t.get("dtype") not in DTYPES:
            problems.append(f"weight {t.get('name')!r}: dtype {t.get('dtype')!r} is unknown")
    return problems


# ---- graphs ------------------------------------------------------------------------------------

def _graph_checks(ctx: GateContext) -> list[Check]:
    graphs = ctx.graphs()
    names = [g.get("name") for g in graphs]
    bad_types = [f"graph {g.get('name')!r}: type {g.get('type')!r} is not one of {', '.join(GRAPH_KINDS)}"
                 for g in graphs if g.get("type") not in GRAPH_KINDS]
    dupes = sorted({str(n) for n in names if names.count(n) > 1})
    files = [f"graph {g.get('name')!r}: file {g.get('file')!r}, expected {'graphs/' + str(g.get('name')) + '.onnx'!r}"
             for g in graphs if g.get("file") != f"graphs/{g.get('name')}.onnx"]
    return [
        GRAPH_TYPE.check(bad_types, f"{len(graphs)} graphs of known types"),
        GRAPH_NAME_UNIQUE.check([f"graph name {n!r} is used more than once" for n in dupes], f"{len(graphs)} distinct names"),
        GRAPH_NAME_EXACT.check(_name_problems(ctx, names), "graph names match the profile's entry points exactly",
                               {"names": names, "expected": _expected_names(ctx)}),
        GRAPH_FILE.check(files, "graph files are graphs/<name>.onnx"),
    ]


def _expected_names(ctx: GateContext) -> list[str]:
    profile = ctx.section("profile")
    return expected_layout(profile.get("lanes"), profile.get("prefill_chunks"), profile.get("decode_lanes")).names


def _name_problems(ctx: GateContext, names: list) -> list[str]:
    expected = _expected_names(ctx)
    problems = []
    for want in expected:
        if want in names:
            continue
        near = [n for n in names if isinstance(n, str) and n != want and (want in n or n in want)]
        hint = f" ({', '.join(map(repr, near))} is not it: names are matched exactly, never by substring)" if near else ""
        problems.append(f"no graph named exactly {want!r}{hint}")
    for n in names:
        if n not in expected:
            problems.append(f"graph {n!r} is not an entry point of this profile (expected {', '.join(expected)})")
    return problems


# ---- sizes -------------------------------------------------------------------------------------

def _is_size(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _size_problems(raw: dict) -> list[str]:
    problems = []
    for path in SIZE_FIELDS:
        for where, value in _walk(raw, path.split("."), ""):
            if not isinstance(value, KeyError) and not _is_size(value):
                problems.append(f"{where}: {value!r} is not a whole number of bytes")
    plan = raw.get("memory_plan")
    if not isinstance(plan, dict):
        return problems
    unit = plan.get("unit")
    if unit is None:
        problems.append(f"memory_plan has no `unit`; its offsets and sizes must say they are in {PLAN_UNIT!r}")
    elif unit != PLAN_UNIT:
        problems.append(f"memory_plan.unit is {unit!r}; the schema's only unit is {PLAN_UNIT!r}")
    for key, value in plan.items():
        if key in ("unit", "kv", "staging"):
            continue
        low = key.lower()
        if low.endswith(OTHER_UNITS) and not low.endswith("_bytes"):
            problems.append(f"memory_plan.{key}: sizes are stored in bytes, not in {key.rsplit('_', 1)[-1]} (use {key.rsplit('_', 1)[0]}_bytes)")
        elif isinstance(value, (int, float, str)) and not isinstance(value, bool) and not low.endswith("_bytes"):
            problems.append(f"memory_plan.{key} = {value!r} carries no unit (name it {key}_bytes)")
        elif low.endswith("_bytes") and not _is_size(value):
            problems.append(f"memory_plan.{key}: {value!r} is not a whole number of bytes")
    return problems


def _toolchain(toolchain: dict) -> Check:
    import onnx
    import onnxruntime

    here = {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}
    problems = []
    for name, version in here.items():
        made = toolchain.get(name)
        if not isinstance(made, str) or made.split(".")[:2] != version.split(".")[:2]:
            problems.append(f"made with {name} {made}, this runtime has {version}")
    return TOOLCHAIN.check(problems, "produced by the installed onnx / onnxruntime", {"calbin": toolchain, "installed": here})
