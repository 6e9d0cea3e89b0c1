"""validate and inspect on the default model's calbin (Gemma 3 270M, 8 lanes, context 1024, KV rings)."""

from __future__ import annotations

import json
import time

import pytest

from calculet.validation import ValidationOptions, validate_calbin
from calculet.calbin.validate_report import Overall, Status
from calculet.cli import main
from calculet.calbin.manifest import read_manifest

pytestmark = pytest.mark.slow
# Fast mode takes ~2 s on a quiet 2-core machine and 6.6 s while other jobs share the CPU; the bound
# only catches fast mode doing slow work (a full hash, gate F). Speed itself is not a unit-test matter.
FAST_BUDGET_S = 30.0


@pytest.fixture(scope="module")
def calbin(default_calbin):
    pytest.importorskip("calculet.sources.gguf")
    return default_calbin


def test_fast_mode_passes_within_budget(calbin, capsys):
    t0 = time.perf_counter()
    report = validate_calbin(calbin, ValidationOptions.fast())
    api_s = time.perf_counter() - t0
    assert report.status is Overall.PASS, [(c.id, c.message) for c in report.failed() + report.warnings()]
    t0 = time.perf_counter()
    assert main(["validate", str(calbin), "--fast"]) == 0
    cli_s = time.perf_counter() - t0
    print(f"\nfast validate, default model: API {api_s:.2f} s, CLI {cli_s:.2f} s; per gate "
          + ", ".join(f"{g} {s:.2f}" for g, s in report.gate_seconds.items()), file=__import__("sys").stderr)
    assert report.gate_seconds.get("F", 0.0) < 0.5   # fast mode runs no numerics
    assert api_s < FAST_BUDGET_S and cli_s < FAST_BUDGET_S


def test_full_validation_with_numerics_passes(calbin):
    report = validate_calbin(calbin, ValidationOptions(full_hash=True))
    assert report.status is Overall.PASS, [(c.id, c.message) for c in report.failed() + report.warnings()]
    assert report.check("A.sha256").status is Status.PASS
    if (calbin / "golden").is_dir():
        assert report.check("F.run").status is Status.PASS
        assert report.check("F.greedy").status is Status.PASS


def test_inspect_json_parses_back(calbin, capsys):
    assert main(["inspect", str(calbin), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["model"]["vocab_size"] == 262144
    decode = max((g for g in doc["graphs"] if g["type"] == "decode"), key=lambda g: g["lanes"])
    ops = {(o["domain"], o["op_type"]): o["count"] for o in decode["ops"]["ops"]}
    # Gemma 3 270M: 3 full-attention layers run GroupQueryAttention over the whole context; the 15
    # sliding-window layers keep a 640-row ring. In a decode graph each ring layer writes its ring
    # with GroupQueryAttention too (compiler/attention_ring.py), and an If takes its output while no
    # lane has wrapped, or the products over the whole ring (one Softmax); the inventory counts the
    # ops inside the branches.
    kv = read_manifest(calbin).kv
    rings = sum(1 for n in kv.layer_lengths if n != kv.context)
    assert (rings, kv.ring) == (15, 640)
    assert ops[("com.microsoft", "GroupQueryAttention")] == kv.num_layers == 18
    assert ops[("ai.onnx", "If")] == rings and ops[("ai.onnx", "Softmax")] == rings
