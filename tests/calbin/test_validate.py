"""validate: good calbins pass for every architecture, the report and its ids are stable, the CLI's
exit codes and outputs, and bad input never becomes a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from calculet.calbin.validate import render_table
from calculet.validation import ValidationOptions, all_rules, validate_calbin
from calculet.calbin.validate_report import GATES, Overall, Status
from calculet.cli import main
from calculet.errors import ModelError

ARCHS = ("llama", "qwen2", "qwen3", "gemma3")


def _copy(folder: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy.calbin"
    shutil.copytree(folder, out)
    return out


def _edit(folder: Path, fn) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    fn(m)
    (folder / "manifest.json").write_text(json.dumps(m))


@pytest.fixture(scope="module")
def llama(tiny_calbin) -> Path:
    return tiny_calbin("llama")


# ---- good calbins ------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_fresh_tiny_calbin_passes(tiny_calbin, arch):
    report = validate_calbin(tiny_calbin(arch), ValidationOptions(full_hash=True, numerics=False))
    assert report.status is Overall.PASS, [(c.id, c.message) for c in report.failed() + report.warnings()]
    assert report.exit_code(strict=True) == 0


def test_gemma3_golden_calbin_passes_gate_f(tiny_calbin):
    """Sliding-window layers through the runtime against the reference, with the thresholds in golden.json."""
    pytest.importorskip("torch")
    from calculet.reference.golden import read_golden

    folder = tiny_calbin("gemma3", golden=True)
    report = validate_calbin(folder)
    assert report.status is Overall.PASS, [(c.id, c.message) for c in report.failed() + report.warnings()]
    assert report.check("F.run").status is Status.PASS
    assert report.check("F.greedy").evidence["threshold"] == read_golden(folder).thresholds.greedy_agreement


def test_portable_target_calbin_passes_with_standard_ops_only(tiny_model_dir, tmp_path):
    """The portable target's graphs must hold standard ONNX ops only, and the checker must see all of them."""
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions

    options = CompileOptions(lanes=2, context=32, prefill_chunks=(4,), target="portable", weights="int8", golden=False)
    folder = compile_calbin(str(tiny_model_dir("llama")), tmp_path / "portable.calbin", options, log=lambda _m: None)
    report = validate_calbin(folder, ValidationOptions(full_hash=True, numerics=False))
    assert report.status is Overall.PASS, [(c.id, c.message) for c in report.failed() + report.warnings()]
    assert report.check("E.portable_ops").evidence["nonstandard_ops"] == []


def test_fast_mode_skips_gate_f_and_the_hash(llama):
    report = validate_calbin(llama, ValidationOptions.fast())
    assert report.check("A.sha256").status is Status.SKIP
    assert all(c.status is Status.SKIP for c in report.checks if c.gate == "F")
    assert report.status is Overall.PASS


def test_no_golden_skips_gate_f_with_a_reason(llama):
    report = validate_calbin(llama)
    f = [c for c in report.checks if c.gate == "F"]
    assert f and all(c.status is Status.SKIP and "no golden" in c.message for c in f)


# ---- report shape and ids ----------------------------------------------------------------------

def test_check_ids_are_declared_unique_and_in_gate_order(llama):
    declared = [r.id for r in all_rules()]
    assert len(declared) == len(set(declared))
    report = validate_calbin(llama, ValidationOptions(full_hash=True))
    assert [c.id for c in report.checks] == declared
    order = list(GATES)   # A..E, P (partition, structural), then F (numerics, composed above calbin/)
    assert [c.gate for c in report.checks] == sorted((c.gate for c in report.checks), key=order.index)
    assert {c.gate for c in report.checks} == set(GATES)


def test_calbin_layer_runs_the_structural_gates_and_gate_f_is_composed_above(llama):
    """calbin/ must not import the runtime: its validator runs gates A-E and P alone, and `calculet
    validate` (calculet.validation) adds gate F with the same ids as before the split."""
    from calculet.calbin import validate as structural

    report = structural.validate_calbin(llama, ValidationOptions.fast())
    assert {c.gate for c in report.checks} == set("ABCDEP")
    full = [r.id for r in all_rules()]
    assert [r.id for r in structural.all_rules()] == [i for i in full if not i.startswith("F.")]
    assert [i for i in full if i.startswith("F.")] == ["F.golden", "F.golden_source", "F.run", "F.greedy", "F.topk",
                                                       "F.cosine", "F.max_abs_error", "F.forced"]


def test_report_json_round_trips(llama, tmp_path):
    report = validate_calbin(llama, ValidationOptions.fast())
    doc = json.loads(report.to_json_text())
    assert doc["status"] == "pass"
    assert [c["id"] for c in doc["checks"]] == [c.id for c in report.checks]
    for c in doc["checks"]:
        assert set(c) == {"id", "gate", "gate_name", "status", "severity", "message", "evidence"}
    assert doc["counts"]["fail"] == 0 and doc["options"] == {"full_hash": False, "numerics": False}
    assert "E.op_inventory" in render_table(report)


def test_warning_gives_pass_with_warnings_and_strict_exit_1(llama, tmp_path):
    folder = _copy(llama, tmp_path)
    _edit(folder, lambda m: m["toolchain"].update(onnxruntime="0.9.0"))
    report = validate_calbin(folder, ValidationOptions.fast())
    assert report.status is Overall.PASS_WITH_WARNINGS
    assert [c.id for c in report.warnings()] == ["B.toolchain"]
    assert (report.exit_code(), report.exit_code(strict=True)) == (0, 1)
    assert main(["validate", str(folder), "--fast"]) == 0
    assert main(["validate", str(folder), "--fast", "--strict"]) == 1


# ---- CLI ---------------------------------------------------------------------------------------

def test_cli_pass_prints_a_table_and_exits_0(llama, capsys):
    assert main(["validate", str(llama)]) == 0
    out = capsys.readouterr().out
    assert "-- gate A: files" in out and "D.kv" in out and "overall: pass" in out


def test_cli_fail_exits_2(llama, tmp_path, capsys):
    folder = _copy(llama, tmp_path)
    (folder / "stray.bin").write_bytes(b"x")
    assert main(["validate", str(folder), "--fast"]) == 2
    out = capsys.readouterr().out
    assert "A.unlisted" in out and "stray.bin" in out and "overall: fail" in out


def test_cli_json_out_file_and_stdout(llama, tmp_path, capsys):
    out_file = tmp_path / "report.json"
    assert main(["validate", str(llama), "--fast", "--json", str(out_file)]) == 0
    assert "overall: pass" in capsys.readouterr().out
    doc = json.loads(out_file.read_text())
    assert doc["status"] == "pass" and doc["path"] == str(llama)
    assert main(["validate", str(llama), "--fast", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "pass"


def _one_clear_line(capsys, code: str) -> None:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"error[{code}]:"), err
    assert "Traceback" not in err


def test_cli_path_that_is_not_a_calbin(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nowhere")]) == 2
    _one_clear_line(capsys, "not_a_calbin")
    assert main(["validate", str(tmp_path)]) == 2  # a folder without manifest.json
    _one_clear_line(capsys, "not_a_calbin")


def test_cli_manifest_that_is_not_json(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text("{ this is not json")
    assert main(["validate", str(tmp_path)]) == 2
    _one_clear_line(capsys, "manifest_not_json")
    (tmp_path / "manifest.json").write_text("[1, 2, 3]")
    assert main(["validate", str(tmp_path)]) == 2
    _one_clear_line(capsys, "manifest_not_json")


def test_cli_fast_and_full_hash_together_is_a_usage_error(llama, capsys):
    assert main(["validate", str(llama), "--fast", "--full-hash"]) == 2
    _one_clear_line(capsys, "bad_argument")


def test_api_raises_a_typed_error_for_a_non_calbin(tmp_path):
    with pytest.raises(ModelError) as exc:
        validate_calbin(tmp_path)
    assert exc.value.code == "not_a_calbin"


# ---- robustness --------------------------------------------------------------------------------

FIELDS = ("schema_version", "target", "model", "model.hyperparameters", "model.hyperparameters.vocab_size",
          "model.hyperparameters.num_layers", "tokenizer", "tokenizer.vocab_size", "tokenizer.eos_token_ids",
          "tokenizer.bos_token_id", "profile", "profile.lanes", "profile.prefill_chunks", "graphs", "kv", "kv.lanes",
          "kv.num_layers", "kv.dtype", "kv.in_place", "weights", "weights.tensors", "weights.bytes", "quantization",
          "memory_plan", "memory_plan.weights_bytes", "memory_plan.kv", "memory_plan.staging", "memory_plan.total_bytes",
          "memory_plan.workspace_estimate_bytes", "memory_plan.unit",
          "golden", "toolchain", "files", "graphs.0", "graphs.2.type", "graphs.2.file", "graphs.2.lanes", "graphs.0.inputs",
          "graphs.0.inputs.0", "graphs.0.inputs.0.shape", "graphs.1.outputs.0.dtype", "memory_plan.kv.dtype",
          "memory_plan.kv.groups.0.buffer_shape", "memory_plan.kv.groups.0.buffers", "memory_plan.kv.groups.0.buffer_bytes",
          "memory_plan.kv.bytes_per_lane", "kv.layer_lengths", "kv.layer_lengths.0", "memory_plan.staging.0",
          "memory_plan.staging.1.graph", "memory_plan.staging.1.bindings", "memory_plan.staging.1.binding_bytes",
          "profile.decode_lanes", "model.source", "toolchain.onnx",
          "weights.tensors.0", "weights.tensors.0.offset", "weights.tensors.0.shape")
FILE_FIELDS = (("files", "tokenizer.json"), ("files", "graphs/weights.bin", "bytes"), ("files", "tokenizer.json", "sha256"))
WRONG = (None, "x", -1, 10**12, [], {}, [1, "a"], {"name": 3})
VALID = ((("golden",), None), (("tokenizer", "eos_token_ids"), []))  # replacements that leave a valid manifest


@pytest.mark.parametrize("path", [tuple(f.split(".")) for f in FIELDS] + list(FILE_FIELDS), ids=".".join)
def test_wrong_typed_fields_fail_checks_never_raise(llama, tmp_path, path):
    """Guards the validator against tracebacks: every field replaced by values of the wrong type or
    absurd size gives a report (usually `fail`), never an exception, and no gate gives up unreadable."""
    folder = _copy(llama, tmp_path)
    original = (folder / "manifest.json").read_text()
    for value in WRONG:
        (folder / "manifest.json").write_text(original)

        def put(m, value=value):
            *parents, last = (int(k) if k.isdigit() else k for k in path)
            d = m
            for k in parents:
                d = d[k]
            d[last] = value
        _edit(folder, put)
        report = validate_calbin(folder, ValidationOptions.fast())
        unreadable = [c.message for c in report.checks if c.id.endswith(".unreadable")]
        assert not unreadable, (path, value, unreadable)
        if (path, value) not in VALID:
            assert report.status is not Overall.PASS, (path, value)


def test_a_ring_shorter_than_window_plus_chunk_fails_the_context_check(tiny_calbin, tmp_path):
    """Guards the ring rule (issue 13): a sliding-window layer's ring of fewer than window + largest
    chunk - 1 rows would let a chunk overwrite rows its own queries still read; gate C says so. The
    calbin as compiled (window 8, chunks 4 and 16: rings of 24) passes."""
    good = tiny_calbin("gemma3")
    assert validate_calbin(good, ValidationOptions.fast()).status is Overall.PASS
    folder = _copy(good, tmp_path)

    def shrink(m):
        for i, n in enumerate(m["kv"]["layer_lengths"]):
            if n == 24:
                m["kv"]["layer_lengths"][i] = 20
    _edit(folder, shrink)
    report = validate_calbin(folder, ValidationOptions.fast())
    context = report.check("C.context")
    assert context.status is Status.FAIL and "needs 23..63 rows" in context.message
