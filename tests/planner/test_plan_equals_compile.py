"""`calculet plan` on a source reports what `calculet compile` writes for it with the same options.

Tiny random models are compiled with several weight policies (untied llama, tied gemma3, qwen2 with
q/k/v biases); the plan of the same folder must give the same bytes per module class as the
calbin's manifest (its per-tensor quantization record and weights table), the same parameter count
as the source's tensors, and the exact size of graphs/weights.bin. The compiler has one chip, so
for two chips the test holds the split to its own arithmetic: summed over the chips, every module
is its replicated part on each chip plus its sharded part once.
"""

from __future__ import annotations

import json
import math

import pytest

from calculet.calbin.manifest import read_manifest
from calculet.cli import main
from calculet.sources.resolve import load_source

POLICIES = ("fp32", "default", "int4", "fp16")
CONTEXT, LANES = 64, 4   # the tiny_calbin fixture's profile


def _manifest_bytes_per_module(manifest) -> dict[str, int]:
    """Bytes per module class, read from the calbin alone: each recorded tensor's stored arrays
    (a quantized weight is <name>.qcodes + <name>.qscales; aliases share bytes and do not count)."""
    entries = {e.name: e.nbytes for e in manifest.weights.tensors}
    out: dict[str, int] = {}
    counted = set()
    for name, rec in manifest.quantization.tensors.items():
        if rec.kind in ("fp32", "fp16"):
            arrays = [name]
        elif name == "lm_head.coarse8" or name.endswith(".rows8"):   # int8 [in, out] + a scale per output
            arrays = [f"{name}.weight", f"{name}.scale"]
        else:
            arrays = [f"{name}.qcodes", f"{name}.qscales"]
        out[rec.module] = out.get(rec.module, 0) + sum(entries[a] for a in arrays)
        counted.update(arrays)
    rope = [n for n in entries if n.startswith("rope.")]
    out["rope"] = sum(entries[n] for n in rope)
    counted.update(rope)
    assert set(entries) - counted == {n for n in entries if n.endswith(".gather_codes")}, "every array counted once"
    return out


def _plan(capsys, source, *argv) -> dict:
    rc = main(["plan", str(source), "--context", str(CONTEXT), "--lanes", str(LANES),
               "--device-memory", "1GiB", "--json", *map(str, argv)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


@pytest.mark.parametrize("arch, policy", [*(("llama", p) for p in POLICIES), *(("gemma3", p) for p in POLICIES),
                                          ("qwen2", "default"),  # llama untied, gemma3 tied, qwen2 biases
                                          *(("qwen3_moe", p) for p in POLICIES),  # expert stacks, fp32 router
                                          ("mixtral", "default"), ("qwen2_moe", "default")])  # shared expert
def test_plan_bytes_per_module_equal_the_compiled_manifest(arch, policy, tiny_calbin, tiny_model_dir, capsys):
    manifest = read_manifest(tiny_calbin(arch, lanes=LANES, context=CONTEXT, weights=policy))
    plan = _plan(capsys, tiny_model_dir(arch), "--weights", policy)
    planned = {row["module"]: row["bytes"] for row in plan["params"]["rows"]}
    assert planned == _manifest_bytes_per_module(manifest)
    assert {row["module"]: row["bytes_per_chip"] for row in plan["params"]["rows"]} == planned  # one chip
    assert plan["params"]["weights_file_bytes"] == manifest.weights.bytes
    assert plan["budget"]["weights_bytes"] == sum(planned.values())
    source = load_source(str(tiny_model_dir(arch)))
    assert plan["params"]["total_params"] == sum(math.prod(source.tensors.shape(n)) for n in source.tensors)
    formats = {row["module"]: row["formats"] for row in plan["params"]["rows"]}
    assert formats["norm"] == "fp32"
    assert "fp32" in {f.label for f in manifest.quantization.tensors.values()}


def test_plan_without_coarse_head_matches_a_compile_without_it(tiny_model_dir, tmp_path, capsys):
    """--no-fuse coarse-head drops the lm_head's int4/int8 candidate copies in both."""
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import FUSIONS, CompileOptions

    fusions = frozenset(FUSIONS) - {"coarse-head"}
    options = CompileOptions(lanes=LANES, context=CONTEXT, prefill_chunks=(4, 16), golden=False, fusions=fusions,
                             weights="default")  # plan's default; compile's auto follows the CPU
    path = compile_calbin(str(tiny_model_dir("llama")), tmp_path / "m.calbin", options, log=lambda _m: None)
    manifest = read_manifest(path)
    plan = _plan(capsys, tiny_model_dir("llama"), "--no-fuse", "coarse-head")
    assert {row["module"]: row["bytes"] for row in plan["params"]["rows"]} == _manifest_bytes_per_module(manifest)
    assert "lm_head.coarse" not in manifest.quantization.tensors
    with_coarse = _plan(capsys, tiny_model_dir("llama"))
    head = lambda p: next(r["bytes"] for r in p["params"]["rows"] if r["module"] == "lm_head")  # noqa: E731
    assert head(with_coarse) > head(plan)


@pytest.mark.parametrize("policy", POLICIES)
def test_two_chips_hold_the_replicated_part_twice_and_the_sharded_part_once(policy, tiny_model_dir, capsys):
    # the prefill-int8 pass is one chip's (its int8 copies are not split): off in both for the comparison
    one = {r["module"]: r for r in _plan(capsys, tiny_model_dir("llama"), "--weights", policy,
                                         "--prefill-int8-outliers", 0)["params"]["rows"]}
    two = {r["module"]: r for r in _plan(capsys, tiny_model_dir("llama"), "--weights", policy,
                                         "--chips", 2, "--prefill-int8-outliers", 0)["params"]["rows"]}
    assert one.keys() == two.keys()
    for module, row in two.items():
        replicated = row["replicated_bytes_per_chip"]
        assert replicated == one[module]["replicated_bytes_per_chip"], module
        sharded_total = one[module]["bytes"] - replicated
        assert 2 * row["bytes_per_chip"] == 2 * replicated + sharded_total, module
        assert row["bytes"] == one[module]["bytes"], module  # the whole model does not change
    assert two["norm"]["bytes_per_chip"] == one["norm"]["bytes"]            # replicated
    assert 2 * two["attention"]["bytes_per_chip"] == one["attention"]["bytes"]  # split by heads


def test_plan_with_smoothing_matches_a_compile_with_it(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """--prefill-int8-smooth auto stores no float32 outlier rows: plan and compile drop the same bytes
    (on a CPU where the pass runs; CALCULET_CPU_FEATURES names one with VNNI)."""
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions
    from calculet.cpu_features import ENV

    monkeypatch.setenv(ENV, "avx2,fma,f16c,avx512f,avx512_vnni")
    options = CompileOptions(lanes=LANES, context=CONTEXT, prefill_chunks=(4, 16), golden=False, weights="default",
                             prefill_int8_smooth=None)
    manifest = read_manifest(compile_calbin(str(tiny_model_dir("llama")), tmp_path / "m.calbin", options,
                                            log=lambda _m: None))
    smoothed = _plan(capsys, tiny_model_dir("llama"), "--weights", "default", "--prefill-int8-smooth", "auto")
    assert {row["module"]: row["bytes"] for row in smoothed["params"]["rows"]} == _manifest_bytes_per_module(manifest)
    channels = _plan(capsys, tiny_model_dir("llama"), "--weights", "default")
    assert smoothed["params"]["weights_file_bytes"] < channels["params"]["weights_file_bytes"]
    rc = main(["plan", str(tiny_model_dir("llama")), "--device-memory", "1GiB", "--prefill-int8-smooth", "1.5"])
    assert rc != 0 and "prefill-int8-smooth must be in [0, 1)" in capsys.readouterr().err
