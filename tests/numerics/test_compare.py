"""`calculet compare`: a calbin against a reference set, scores per step, exit codes at thresholds."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

pytest.importorskip("torch")

from calculet.cli import main  # noqa: E402
from calculet.numerics.compare import Thresholds, compare_calbin  # noqa: E402
from calculet.reference import sets  # noqa: E402

TOKENS = 6


@pytest.fixture(scope="module")
def refset_path(tiny_model_dir, tmp_path_factory):
    from calculet.sources.hf import load_hf_folder

    source = load_hf_folder(tiny_model_dir("llama"))
    # 60 + 5 fed tokens do not fit the tiny calbin's context of 64: that prompt is skipped
    refset = sets.make_reference_set(source, n_prompts=5, tokens=TOKENS, topk=5, lengths=(1, 2, 16, 17, 60))
    return sets.write_reference_set(refset, tmp_path_factory.mktemp("ref") / "ref.npz")


def _doctored(path, tmp_path, step: int):
    """The same set with prompt 1's greedy token at `step` replaced: a reference the calbin cannot match there.
    The last step's token is never fed, so changing it moves exactly one step."""
    refset = sets.read_reference_set(path)
    p = refset.prompts[1]
    greedy = p.greedy.copy()
    greedy[step] = (greedy[step] + 1) % 300
    prompts = list(refset.prompts)
    prompts[1] = dataclasses.replace(p, greedy=greedy)
    return sets.write_reference_set(dataclasses.replace(refset, prompts=tuple(prompts)), tmp_path / "doctored.npz")


def test_fp32_calbin_agrees_at_every_step(tiny_calbin, refset_path):
    report = compare_calbin(tiny_calbin("llama"), sets.read_reference_set(refset_path))
    assert [s["name"] for s in report.skipped] == [sets.read_reference_set(refset_path).prompts[4].name]
    assert "65 > context 64" in report.skipped[0]["reason"]
    assert len(report.prompts) == 4 and report.steps == 4 * TOKENS
    assert report.agreement == 1.0 and report.all_equal == 4 and report.topk_overlap == 1.0
    for p in report.prompts:
        assert p.first_divergence is None
        assert p.max_abs < 1e-3 and p.min_cosine > 0.99999 and p.max_logprob_error < 1e-3
        assert len(p.per_step.cosine) == TOKENS
    assert report.failures(Thresholds(1.0, 1.0)) == []
    assert report.same_source


def test_batched_lanes_give_the_same_scores(tiny_calbin, refset_path):
    refset = sets.read_reference_set(refset_path)
    one = compare_calbin(tiny_calbin("llama"), refset, batch=1)
    three = compare_calbin(tiny_calbin("llama"), refset, batch=3)
    assert [p.name for p in one.prompts] == [p.name for p in three.prompts]
    for a, b in zip(one.prompts, three.prompts):
        assert a.forced_matches == b.forced_matches
        assert np.allclose(a.per_step.max_abs, b.per_step.max_abs, atol=1e-4)


def test_a_divergence_is_found_at_its_step(tiny_calbin, refset_path, tmp_path):
    report = compare_calbin(tiny_calbin("llama"), sets.read_reference_set(_doctored(refset_path, tmp_path, TOKENS - 1)))
    bad = report.prompts[1]
    assert bad.first_divergence == TOKENS - 1 and bad.forced_matches == TOKENS - 1
    assert report.worst(1)[0].name == bad.name
    assert report.agreement == pytest.approx((4 * TOKENS - 1) / (4 * TOKENS))


def test_exit_codes_follow_the_thresholds(tiny_calbin, refset_path, tmp_path, capsys):
    calbin = str(tiny_calbin("llama"))
    doctored = str(_doctored(refset_path, tmp_path, TOKENS - 1))
    assert main(["compare", calbin, "--reference", str(refset_path), "--min-agreement", "1.0", "--min-topk-overlap", "1.0"]) == 0
    assert "gate: PASS" in capsys.readouterr().out
    # one of 24 steps differs: agreement 23/24 = 0.9583
    assert main(["compare", calbin, "--reference", doctored, "--min-agreement", "0.96"]) == 1
    out = capsys.readouterr().out
    assert "gate: FAIL" in out and "teacher-forced agreement 0.9583 < --min-agreement 0.96" in out
    assert main(["compare", calbin, "--reference", doctored, "--min-agreement", "0.95"]) == 0
    capsys.readouterr()
    assert main(["compare", calbin, "--reference", doctored, "--calbin2", calbin, "--json", "-",
                 "--min-topk-overlap", "1.01"]) == 2  # out of range: a clear error
    assert "--min-topk-overlap must be in [0, 1]" in capsys.readouterr().err


def test_json_report_lists_both_calbins_and_per_step_scores(tiny_calbin, refset_path, capsys):
    calbin = str(tiny_calbin("llama"))
    assert main(["compare", calbin, "--reference", str(refset_path), "--calbin2", calbin, "--json", "-",
                 "--min-agreement", "0.5"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] is True and len(doc["reports"]) == 2
    first = doc["reports"][0]
    assert first["summary"]["agreement"] == 1.0 and first["failures"] == []
    assert len(first["prompts"][0]["per_step"]["max_abs"]) == TOKENS
    assert first["reference"]["model_type"] == "llama"


def test_a_set_from_another_model_is_refused(tiny_calbin, refset_path, tmp_path, capsys):
    refset = sets.read_reference_set(refset_path)
    other = dataclasses.replace(refset, source={**refset.source, "vocab_size": 999})
    path = sets.write_reference_set(other, tmp_path / "other.npz")
    assert main(["compare", str(tiny_calbin("llama")), "--reference", str(path)]) == 2
    assert "vocabulary is 999 but the calbin's is 320" in capsys.readouterr().err
    assert main(["compare", str(tiny_calbin("llama"))]) == 2
    assert "needs --reference FILE" in capsys.readouterr().err


def test_module_costs_rows_show_each_modules_share(tiny_model_dir, refset_path, capsys):
    """fp32 first (no loss), then each module of the policy alone, then the whole policy."""
    assert main(["eval", "module-costs", str(tiny_model_dir("llama")), "--reference", str(refset_path),
                 "--weights", "int4", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["row"]: r for r in doc["rows"]}
    assert list(rows) == ["fp32", "attention", "mlp", "lm_head", "all (int4)"]
    assert rows["fp32"]["agreement"] == 1.0 and rows["fp32"]["logprob_error_max"] < 1e-3
    assert rows["attention"]["format"] == "int4 b32 (fp32 compute)" and rows["lm_head"]["format"].startswith("int8")
    for module in ("attention", "mlp", "lm_head"):
        assert 1e-3 < rows[module]["logprob_error_max"]
    assert rows["all (int4)"]["logprob_error_mean"] >= max(rows[m]["logprob_error_mean"] for m in ("attention", "mlp")) * 0.5
