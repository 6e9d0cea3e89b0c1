"""Gate P and inspect on calbins split over chips (--chips 2 --partition pp|tp|ep)."""

from __future__ import annotations

import json
import shutil

import pytest

from calculet.calbin.inspect import inspect_calbin
from calculet.calbin.inspect_render import render_text
from calculet.calbin.validate import validate_calbin
from calculet.calbin.validate_report import Status, ValidationOptions


def _status(report, check_id):
    return next(c for c in report.checks if c.id == check_id)


@pytest.mark.parametrize("arch, partition, weights", [("qwen3", "pp", "fp32"), ("qwen3", "tp", "fp32"),
                                                      ("qwen2_moe", "ep", "fp32"), ("mixtral", "pp", "fp32"),
                                                      ("mixtral", "ep", "default"), ("llama", "tp", "default"),
                                                      ("gemma3", "pp", "fp32"), ("gemma3", "tp", "default")])
def test_a_compiled_partition_passes_every_gate(tiny_calbin, arch, partition, weights):
    """MoE cases guard a bug: C.moe_experts read the top manifest's weight table, which a partitioned
    calbin leaves empty (its chips hold the weights), so every partitioned MoE calbin failed gate C.
    Default-policy cases guard another: P.placement looked for lm_head.coarse8 as itself or .qcodes,
    but it is stored as .weight and .scale, so every default-policy partitioned calbin failed gate P.
    Gemma 3 cases: its chips keep KV rings on the sliding-window layers (gate C's ring check on the
    top manifest, gate D's KV bytes on each chip's shorter buffers)."""
    path = tiny_calbin(arch, chips=2, partition=partition, weights=weights)
    report = validate_calbin(path, ValidationOptions.fast())
    failed = [(c.id, c.message) for c in report.checks if c.status is Status.FAIL]
    assert not failed
    if arch == "gemma3":
        from calculet.calbin.manifest import read_manifest
        assert read_manifest(path).kv.ring is not None and _status(report, "C.context").status is Status.PASS
    assert all(_status(report, f"P.{r}").status is Status.PASS for r in ("chips", "placement", "collectives", "memory"))


def test_one_chip_calbins_pass_gate_p_as_not_partitioned(tiny_calbin):
    report = validate_calbin(tiny_calbin("llama"), ValidationOptions.fast())
    assert _status(report, "P.collectives").message == "not partitioned"


def _tampered(tiny_calbin, tmp_path, partition, change):
    folder = tmp_path / "t.calbin"
    shutil.copytree(tiny_calbin("llama", chips=2, partition=partition), folder)
    path = folder / "manifest.json"
    d = json.loads(path.read_text())
    change(d["partition"])
    path.write_text(json.dumps(d))
    return validate_calbin(folder, ValidationOptions.fast())


def test_a_collective_whose_shape_disagrees_with_its_graphs_fails(tiny_calbin, tmp_path):
    def change(p):
        p["schedules"][0]["collectives"][0]["shape"] = [1, 4, 32]
    check = _status(_tampered(tiny_calbin, tmp_path, "tp", change), "P.collectives")
    assert check.status is Status.FAIL and "[1, 4, 32]" in check.message


def test_a_tensor_on_two_chips_must_be_declared(tiny_calbin, tmp_path):
    def change(p):
        p["replicated"] = []
    check = _status(_tampered(tiny_calbin, tmp_path, "pp", change), "P.placement")
    assert check.status is Status.FAIL and "rope" in check.message


def test_chip_memory_budget_fails_with_the_bytes(tiny_calbin):
    path = tiny_calbin("llama", chips=2, partition="pp")
    check = _status(validate_calbin(path, ValidationOptions(numerics=False, chip_memory_bytes=400_000)), "P.memory")
    assert check.status is Status.FAIL and "chip 0" in check.message and "400000" in check.message


def test_inspect_shows_each_chip(tiny_calbin):
    report = inspect_calbin(tiny_calbin("llama", chips=2, partition="tp"))
    part = report.summary["partition"]
    assert [c["heads"] for c in part["chips"]] == [[0, 2], [2, 4]]
    assert part["collectives"]["decode_1"]["kinds"] == ["all_reduce", "broadcast", "reduce"]
    assert any(g.graph.name == "chip1/decode_4.layers.2.mlp" and g.ops is not None for g in report.graphs)
    text = render_text(report)
    assert "partition tp over 2 chips" in text and "chip1/decode_1.layers.0.attn" in text


@pytest.mark.parametrize("partition", ["pp", "tp"])
def test_gate_f_runs_a_partitioned_calbin_against_the_reference(tiny_calbin, partition):
    """The golden prompts (recorded from transformers at compile) through the runtime on 2 chips:
    the fp32 thresholds (greedy tokens equal, logits within the tight bound) hold."""
    from calculet.validation import validate_calbin as full_validate

    report = full_validate(tiny_calbin("gemma3", golden=True, chips=2, partition=partition))
    f = [c for c in report.checks if c.gate == "F"]
    assert f and all(c.status in (Status.PASS, Status.WARN) for c in f), [(c.id, c.message) for c in f]
    assert _status(report, "F.greedy").status is Status.PASS


def test_ep_expert_ranges_must_tile_the_experts_and_match_the_stacks(tiny_calbin, tmp_path):
    """The manifest's per-chip expert ranges are checked against the experts and each chip's stacks."""
    folder = tmp_path / "ep.calbin"
    shutil.copytree(tiny_calbin("mixtral", chips=2, partition="ep"), folder)
    path = folder / "manifest.json"
    d = json.loads(path.read_text())
    assert [c["experts"] for c in d["partition"]["chips"]] == [[0, 4], [4, 8]]
    d["partition"]["chips"][1]["experts"] = [4, 7]
    path.write_text(json.dumps(d))
    check = _status(validate_calbin(folder, ValidationOptions.fast()), "P.placement")
    assert check.status is Status.FAIL and "end at 7, the model has 8" in check.message
    assert "holds 4 experts, its range [4, 7] says 3" in check.message


def test_inspect_shows_each_chips_experts(tiny_calbin):
    text = render_text(inspect_calbin(tiny_calbin("mixtral", chips=2, partition="ep")))
    assert "partition ep over 2 chips" in text and "experts" in text and "4..7" in text
