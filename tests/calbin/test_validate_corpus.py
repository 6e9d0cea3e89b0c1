"""The broken-package corpus: one mutation of a good tiny calbin per rejection rule.

Each case copies a freshly compiled tiny Llama calbin into tmp_path, breaks one thing, and checks
that `validate` fails exactly the checks that rule owns (`expect`, all must fail) and nothing
outside `allow` (checks that necessarily fail with it, e.g. a truncated weights file also leaves a
tensor past its end). Cases that mutate a file on purpose but test a later gate re-stamp the
manifest's file table first, so gate A does not mask the rule under test.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import pytest

from calculet.calbin.manifest import sha256_file
from calculet.calbin.validate_report import Overall, Status
from calculet.validation import ValidationOptions, validate_calbin


# ---- mutation helpers --------------------------------------------------------------------------

def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def edit(folder: Path, fn: Callable[[dict], None]) -> None:
    m = manifest(folder)
    fn(m)
    (folder / "manifest.json").write_text(json.dumps(m, indent=1))


def restamp(folder: Path) -> None:
    """Record every listed file's current size and SHA-256, as a careful forger would."""
    def fn(m):
        for rel in m["files"]:
            p = folder / rel
            if p.is_file():
                m["files"][rel] = {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
    edit(folder, fn)


def staging(m: dict, name: str) -> dict:
    return next(s for s in m["memory_plan"]["staging"] if s["graph"] == name)


def graph(m: dict, name: str) -> dict:
    return next(g for g in m["graphs"] if g["name"] == name)


def main_decode(m: dict) -> str:
    """The widest decode graph, `decode_<lanes>`."""
    return next(g["name"] for g in m["graphs"] if g["type"] == "decode" and g["lanes"] == m["profile"]["lanes"])


def on_main_decode(fn: Callable[[dict, str], None]) -> Callable[[Path], None]:
    return lambda f: edit(f, lambda m: fn(m, main_decode(m)))


def edit_onnx(folder: Path, rel: str, fn: Callable[[onnx.ModelProto], None]) -> None:
    model = onnx.load(str(folder / rel), load_external_data=False)
    fn(model)
    onnx.save_model(model, str(folder / rel))
    restamp(folder)


# ---- the mutations -----------------------------------------------------------------------------

def truncate_weights(f: Path) -> None:
    p = f / "graphs/weights.bin"
    p.write_bytes(p.read_bytes()[:-64])


def flip_weight_byte(f: Path) -> None:
    p = f / "graphs/weights.bin"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


def rename_everywhere(f: Path, old: str, new: str) -> None:
    """Rename a graph consistently (entry, file, files table, .onnx graph name, staging entry):
    only the name itself is then wrong."""
    (f / f"graphs/{old}.onnx").rename(f / f"graphs/{new}.onnx")

    def fn(m):
        g = graph(m, old)
        g["name"], g["file"] = new, f"graphs/{new}.onnx"
        m["files"][f"graphs/{new}.onnx"] = m["files"].pop(f"graphs/{old}.onnx")
        staging(m, old)["graph"] = new
    edit(f, fn)

    def rename_graph(model):
        model.graph.name = new
    edit_onnx(f, f"graphs/{new}.onnx", rename_graph)


def extra_token(f: Path) -> None:
    p = f / "tokenizer.json"
    tok = json.loads(p.read_text())
    tok["added_tokens"].append({"id": 400, "content": "<extra>", "single_word": False, "lstrip": False, "rstrip": False,
                                "normalized": False, "special": True})
    p.write_text(json.dumps(tok))
    restamp(f)


def corrupt_onnx(f: Path) -> None:
    (f / graph(manifest(f), main_decode(manifest(f)))["file"]).write_bytes(b"\x08\x07garbage, not a protobuf" * 10)
    restamp(f)


def external_offset_past_end(f: Path) -> None:
    def fn(model):
        t = next(t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)
        for e in t.external_data:
            if e.key == "offset":
                e.value = str(10**9)
    edit_onnx(f, "graphs/prefill_4.onnx", fn)


def one_input_too_many(f: Path) -> None:
    """A standard node with more inputs than its ONNX schema allows (whatever fusions left in the graph)."""
    def fn(model):
        node = next(n for n in model.graph.node
                    if n.domain in ("", "ai.onnx") and onnx.defs.has(n.op_type) and onnx.defs.get_schema(n.op_type).max_input < 10)
        while len(node.input) <= onnx.defs.get_schema(node.op_type).max_input:
            node.input.append(node.input[0])
    edit_onnx(f, "graphs/prefill_4.onnx", fn)


def wrong_weight_dims(f: Path) -> None:
    def fn(model):
        t = next(t for t in model.graph.initializer if t.name == "model.embed_tokens.weight")  # [V, H] -> [V, H + 1]
        t.dims[1] += 1
    edit_onnx(f, "graphs/prefill_4.onnx", fn)


def corrupt_golden_numbers(f: Path) -> None:
    p = f / "golden/golden.json"
    golden = json.loads(p.read_text())
    for prompt in golden["prompts"]:
        prompt["topk_logits"] = [v + 5.0 for v in prompt["topk_logits"]]
    p.write_text(json.dumps(golden))
    restamp(f)


def perturb_weights(f: Path) -> None:
    """Flip the sign of the final norm's scale (fp32 under every policy): the logits turn around."""
    entry = next(t for t in manifest(f)["weights"]["tensors"] if t["name"] == "model.norm.weight")
    p = f / "graphs/weights.bin"
    data = bytearray(p.read_bytes())
    lo, hi = entry["offset"], entry["offset"] + entry["nbytes"]
    data[lo:hi] = (-np.frombuffer(bytes(data[lo:hi]), dtype=np.float32)).tobytes()
    p.write_bytes(bytes(data))
    restamp(f)


def golden_other_source(f: Path) -> None:
    p = f / "golden/golden.json"
    golden = json.loads(p.read_text())
    golden["source"]["source_sha256"] = "0" * 64
    p.write_text(json.dumps(golden))
    restamp(f)


def golden_not_json(f: Path) -> None:
    (f / "golden/golden.json").write_text("{ not json")
    restamp(f)


def _m(fn: Callable[[dict], None]) -> Callable[[Path], None]:
    return lambda f: edit(f, fn)


def _set(path: str, value) -> Callable[[dict], None]:
    def fn(m):
        *parents, last = path.split(".")
        d = m
        for k in parents:
            d = d[k]
        d[last] = value
    return fn


def _del(path: str) -> Callable[[dict], None]:
    def fn(m):
        *parents, last = path.split(".")
        d = m
        for k in parents:
            d = d[k]
        del d[last]
    return fn


def _rename_key(section: str, old: str, new: str) -> Callable[[dict], None]:
    def fn(m):
        m[section][new] = m[section].pop(old)
    return fn


def _kv_as_if_fp16(m):
    """A plan that halves the KV bytes (as for float16) while the KV layout stays float32."""
    kv = m["memory_plan"]["kv"]
    for group in kv["groups"]:
        group["buffer_bytes"] //= 2
        group["total_bytes"] //= 2
    kv["bytes_per_lane"] //= 2
    kv["total_bytes"] //= 2
    m["memory_plan"]["total_bytes"] -= kv["total_bytes"]


def _kv_other_context(m):
    m["memory_plan"]["kv"]["groups"][0]["buffer_shape"][2] = 128


def _ring_on_a_full_layer(m):
    """A full-attention layer (llama has no sliding ones) claims a ring: it would lose its context."""
    m["kv"]["layer_lengths"][0] = 24


def _staging_too_small(m, name):
    s = staging(m, name)
    s["binding_bytes"] -= 4
    s["total_bytes"] -= 4 * s["bindings"]
    m["memory_plan"]["total_bytes"] -= 4 * s["bindings"]


def _prefill_one_binding(m):
    """The runtime binds a prefill graph once per first lane; a plan that counts one under-reserves."""
    s = staging(m, "prefill_4")
    m["memory_plan"]["total_bytes"] -= s["total_bytes"] - s["binding_bytes"]
    s["bindings"], s["total_bytes"] = 1, s["binding_bytes"]


def _staging_dropped(m, name):
    s = staging(m, name)
    m["memory_plan"]["staging"].remove(s)
    m["memory_plan"]["total_bytes"] -= s["total_bytes"]


def _weights_bytes_off(m):
    m["memory_plan"]["weights_bytes"] += 64
    m["memory_plan"]["total_bytes"] += 64


def _total_not_sum(m):
    m["memory_plan"]["total_bytes"] += 4096


def _duplicate_decode(m, name):
    m["graphs"].append(dict(graph(m, name)))


def _unlisted_reference(m):
    del m["files"]["tokenizer.json"]


def _path_escape(m):
    m["files"]["../outside.bin"] = {"bytes": 1, "sha256": "0" * 64}


# ---- the corpus --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    name: str
    mutate: Callable[[Path], None]
    expect: frozenset           # all of these must fail
    allow: frozenset = field(default_factory=frozenset)  # these may fail too
    full_hash: bool = False


def case(name, mutate, expect, allow=(), full_hash=False) -> Case:
    return Case(name, mutate, frozenset(expect), frozenset(allow), full_hash)


CORPUS = [
    # A files
    case("truncated_file", truncate_weights, {"A.size", "E.external_data"}),
    case("extra_file", lambda f: (f / "notes.txt").write_text("not part of the package"), {"A.unlisted"}),
    case("wrong_hash", flip_weight_byte, {"A.sha256"}, full_hash=True),
    case("missing_file", lambda f: (f / "tokenizer.json").unlink(), {"A.exists", "C.tokenizer"}),
    case("path_escapes_folder", _m(_path_escape), {"A.path_safe"}),
    case("referenced_file_unlisted", _m(_unlisted_reference), {"A.unlisted", "A.references"}),
    # B manifest
    case("unknown_schema", _m(_set("schema_version", "calculet.calbin/99")), {"B.schema_version"}),
    case("missing_field", _m(_del("kv.head_dim")), {"B.required_field", "B.parse"}),
    case("unknown_target", _m(_set("target", "tpu")), {"B.target"}),
    case("unknown_graph_type", on_main_decode(lambda m, name: graph(m, name).update(type="decoder")),
         {"B.graph_type"}, allow={"C.graph_type", "C.lanes", "D.staging"}),
    case("duplicate_graph_name", on_main_decode(_duplicate_decode), {"B.graph_name_unique", "C.graph_type"}),
    case("name_by_substring_decode", lambda f: rename_everywhere(f, main_decode(manifest(f)), main_decode(manifest(f)) + "_v2"),
         {"B.graph_name_exact"}),
    case("name_by_substring_prefill", lambda f: rename_everywhere(f, "prefill_16", "prefill_160"),
         {"B.graph_name_exact", "C.prefill_chunks"}),
    case("old_schema", _m(_set("schema_version", "calculet.calbin/1")), {"B.schema_version"}),
    # (the memory plan is a typed section: a field it lacks also fails B.parse)
    case("size_without_unit", _m(_rename_key("memory_plan", "workspace_estimate_bytes", "workspace_estimate")),
         {"B.size_unit", "B.required_field", "B.parse"}),
    case("size_in_megabytes", _m(_rename_key("memory_plan", "workspace_estimate_bytes", "workspace_estimate_mb")),
         {"B.size_unit", "B.required_field", "B.parse"}),
    case("nested_size_as_text", _m(lambda m: m["memory_plan"]["kv"]["groups"][0].update(buffer_bytes="1 MiB")),
         {"B.size_unit"}, allow={"B.parse"}),
    case("plan_unit_missing", _m(_del("memory_plan.unit")), {"B.size_unit", "B.required_field", "B.parse"}),
    case("plan_unit_wrong", _m(_set("memory_plan.unit", "MB")), {"B.size_unit"}),
    case("size_as_text", _m(_set("weights.bytes", "612096 bytes")), {"B.size_unit"}),
    # C contract
    # (split layout: the widest decode graph's name carries the lanes, and a head must take each body's rows)
    case("lanes_manifest_vs_graph", _m(_set("profile.lanes", 8)), {"C.lanes"}, allow={"B.graph_name_exact"}),
    case("lanes_graph_entry", on_main_decode(lambda m, name: graph(m, name).update(lanes=2)), {"C.lanes"}, allow={"C.hidden"}),
    case("context_mismatch", _m(_set("profile.context", 128)), {"C.context"}),
    case("vocab_mismatch_manifest", _m(_set("tokenizer.vocab_size", 500)), {"C.vocab"}),
    case("vocab_mismatch_tokenizer_json", extra_token, {"C.vocab"}),
    case("special_token_out_of_range", _m(_set("tokenizer.eos_token_ids", [320])), {"C.special_tokens"}),
    case("bos_out_of_range", _m(_set("tokenizer.bos_token_id", -1)), {"C.special_tokens"}),
    case("prefill_labelled_decode", lambda f: edit(f, lambda m: graph(m, "prefill_16").update(type="decode")),
         {"C.graph_type"}, allow={"C.lanes", "C.prefill_chunks", "D.staging"}),
    # D memory (the plan must state what the runtime allocates)
    case("kv_bytes_not_the_layout", _m(_kv_as_if_fp16), {"D.kv"}),
    case("kv_dtype_not_the_layout", _m(_set("memory_plan.kv.dtype", "float16")), {"D.kv"}),
    case("kv_shape_not_the_layout", _m(_kv_other_context), {"D.kv"}),
    case("kv_buffers_not_per_layer", _m(lambda m: m["memory_plan"]["kv"]["groups"][0].update(buffers=1)), {"D.kv"}),
    case("kv_bytes_per_lane_wrong", _m(lambda m: m["memory_plan"]["kv"].update(bytes_per_lane=8)), {"D.kv"}),
    case("ring_on_a_full_layer", _m(_ring_on_a_full_layer), {"C.context"}, allow={"D.kv"}),
    case("graph_kv_not_a_view", on_main_decode(lambda m, name: graph(m, name)["inputs"][-1]["shape"].__setitem__(2, 128)),
         {"D.kv"}, allow={"C.context", "C.graph_io", "C.kv_shape"}),
    case("staging_too_small", on_main_decode(_staging_too_small), {"D.staging"}),
    case("staging_missing_graph", on_main_decode(_staging_dropped), {"D.staging"}),
    case("prefill_staging_one_binding", _m(_prefill_one_binding), {"D.staging"}),
    case("weights_bytes_not_the_file", _m(_weights_bytes_off), {"D.weights"}),
    case("total_not_sum", _m(_total_not_sum), {"D.total"}),
    case("absurd_workspace", _m(_set("memory_plan.workspace_estimate_bytes", 16777216 * 2**20)),
         {"D.workspace_plausible"}),
    case("no_workspace", _m(_set("memory_plan.workspace_estimate_bytes", 0)), {"D.workspace_plausible"}),
    # E graphs
    case("contrib_op_portable", _m(_set("target", "portable")), {"E.portable_ops"}),
    case("corrupt_onnx", corrupt_onnx, {"E.load"}),
    case("external_data_past_end", external_offset_past_end, {"E.external_data"}),
    case("checker_rejects_node", one_input_too_many, {"E.checker"}, allow={"E.shape_inference"}),
    case("shape_conflict", wrong_weight_dims, {"E.shape_inference", "E.external_data"}),
]

GOLDEN_CORPUS = [
    case("golden_numbers_corrupted", corrupt_golden_numbers, {"F.max_abs_error"}, allow={"F.cosine", "F.topk"}),
    case("weights_perturbed", perturb_weights, {"F.cosine"}, allow={"F.max_abs_error", "F.topk", "F.greedy", "F.forced"}),
    case("golden_other_source", golden_other_source, {"F.golden_source"}),
    case("golden_not_json", golden_not_json, {"F.golden"}),
]


def _broken(good: Path, tmp_path: Path, c: Case) -> Path:
    folder = tmp_path / "broken.calbin"
    shutil.copytree(good, folder)
    c.mutate(folder)
    return folder


def _assert_rejected(report, c: Case) -> None:
    failed = report.failed_ids()
    assert report.status is Overall.FAIL, f"{c.name}: expected a failure, got {report.status}"
    assert c.expect <= failed, f"{c.name}: expected {sorted(c.expect)} to fail; failed: {sorted(failed)}"
    assert failed <= c.expect | c.allow, f"{c.name}: unexpected failures {sorted(failed - c.expect - c.allow)}"
    assert report.exit_code() == 2
    for check_id in c.expect:
        assert report.check(check_id).message, f"{c.name}: {check_id} failed without saying why"


@pytest.fixture(scope="module")
def good(tiny_calbin) -> Path:
    return tiny_calbin("llama")


@pytest.fixture(scope="module")
def good_golden(tiny_calbin) -> Path:
    pytest.importorskip("torch")
    return tiny_calbin("llama", golden=True)


def test_the_good_calbin_passes_every_structural_gate(good):
    report = validate_calbin(good, ValidationOptions(full_hash=True, numerics=False))
    assert report.status is Overall.PASS, [(c.id, c.message) for c in report.failed() + report.warnings()]


@pytest.mark.parametrize("c", CORPUS, ids=lambda c: c.name)
def test_broken_calbin_is_rejected_by_its_rule(good, tmp_path, c):
    folder = _broken(good, tmp_path, c)
    report = validate_calbin(folder, ValidationOptions(full_hash=c.full_hash, numerics=False))
    _assert_rejected(report, c)


def test_the_good_golden_calbin_passes_gate_f(good_golden):
    report = validate_calbin(good_golden)
    assert report.status is Overall.PASS, [(c.id, c.message) for c in report.failed() + report.warnings()]
    assert {c.id for c in report.checks if c.gate == "F" and c.status is Status.PASS} == {
        "F.golden", "F.golden_source", "F.run", "F.greedy", "F.topk", "F.cosine", "F.max_abs_error", "F.forced"}


@pytest.mark.parametrize("c", GOLDEN_CORPUS, ids=lambda c: c.name)
def test_broken_numerics_are_rejected_by_gate_f(good_golden, tmp_path, c):
    folder = _broken(good_golden, tmp_path, c)
    report = validate_calbin(folder)
    _assert_rejected(report, c)


def test_substring_name_failure_says_matching_is_exact(good, tmp_path):
    """Guards against graph lookup by substring: 'decode_v2' must not stand in for 'decode'."""
    name = main_decode(manifest(good))
    folder = _broken(good, tmp_path, CORPUS[[c.name for c in CORPUS].index("name_by_substring_decode")])
    message = validate_calbin(folder, ValidationOptions.fast()).check("B.graph_name_exact").message
    assert f"{name!r}" in message and "exactly" in message and f"{name}_v2" in message
