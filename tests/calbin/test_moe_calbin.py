"""validate and inspect on mixture-of-experts calbins: the C.moe_* checks pass on fresh tiny
Qwen3-MoE calbins and fail on tampered manifests; inspect shows the experts and the active share."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from calculet.calbin.inspect import inspect_calbin
from calculet.calbin.inspect_render import render_text
from calculet.calbin.validate import ValidationOptions, validate_calbin
from calculet.calbin.validate_report import Overall, Status

FAST = ValidationOptions(numerics=False)
H, E, K, I, INTER, V = 64, 8, 2, 32, 128, 320


def _status(report, check_id: str) -> Status:
    return next(c for c in report.checks if c.id == check_id).status


def _tampered(calbin: Path, tmp_path: Path, fn) -> Path:
    out = tmp_path / "copy.calbin"
    shutil.copytree(calbin, out)
    m = json.loads((out / "manifest.json").read_text())
    fn(m)
    (out / "manifest.json").write_text(json.dumps(m))
    return out


@pytest.fixture(scope="module", params=["fp32", "default"])
def moe(request, tiny_calbin):
    return tiny_calbin("qwen3_moe", weights=request.param)


def test_fresh_moe_calbin_passes_with_moe_checks(moe):
    report = validate_calbin(moe, FAST)
    assert report.status is Overall.PASS, [(c.id, c.message) for c in report.failed()]
    for check_id in ("C.moe_topk", "C.moe_experts", "C.moe_router"):
        assert _status(report, check_id) is Status.PASS


def test_dense_calbin_passes_moe_checks_with_nothing_to_check(tiny_calbin):
    report = validate_calbin(tiny_calbin("llama"), FAST)
    assert next(c for c in report.checks if c.id == "C.moe_topk").message == "not a mixture-of-experts model"


def _tensor(m: dict, name: str) -> dict:
    return next(t for t in m["weights"]["tensors"] if t["name"] == name)


@pytest.mark.parametrize("edit, check_id, words", [
    # routing that ModelSpec itself refuses: the typed manifest does not parse, and B.parse says why
    (lambda m: m["model"]["hyperparameters"]["moe"].update(experts_per_token=9), "B.parse", "between 1 and num_experts (8)"),
    (lambda m: m["model"]["hyperparameters"]["moe"].update(sparse_layers=[1, 7]), "B.parse", "must lie in 0..2"),
    (lambda m: m["model"]["hyperparameters"]["moe"].update(expert_intermediate_size=16), "C.moe_experts", "expected"),
    (lambda m: _tensor(m, "model.layers.2.mlp.gate.weight").update(dtype="float16"), "C.moe_router", "expected float32"),
])
def test_tampered_moe_manifest_fails_the_named_check(moe, tmp_path, edit, check_id, words):
    report = validate_calbin(_tampered(moe, tmp_path, edit), FAST)
    check = next(c for c in report.checks if c.id == check_id)
    assert check.status is Status.FAIL and words in check.message, check.message


def test_inspect_counts_parameters_and_the_active_share(moe):
    facts = inspect_calbin(moe).summary["moe"]
    experts = 2 * E * 3 * H * I                                 # two sparse layers
    attention = 3 * (H * 64 + 2 * H * 32 + 64 * H)
    norms = 3 * (2 * H + 2 * 16) + H
    total = 2 * V * H + attention + norms + 3 * H * INTER + 2 * H * E + experts
    assert (facts["num_experts"], facts["experts_per_token"], facts["sparse_layers"]) == (E, K, [1, 2])
    assert facts["expert_parameters"] == experts and facts["parameters"] == total
    assert facts["active_parameters_per_token"] == total - experts + experts * K // E
    text = render_text(inspect_calbin(moe))
    assert f"moe: {E} experts, top {K} (renormalised)" in text and ("QMoE" in text or " MoE " in text)
