"""`--kv-dtype` (issue 13 part 2): fp16 KV buffers on both targets give fp32 KV's greedy tokens on tiny
models, the manifest, graphs and runtime arrays agree on the dtype, gate C and F check it, and the
dtypes no execution provider here can run are refused at compile time with the reason.

Measured before these tests were written (tiny Llama, Qwen3, Gemma 3 with a KV ring; fp32 weights;
lanes 4, context 128, chunks 4 and 16; prompts of 5, 20 and 37 tokens decoded together for 24 tokens):
identical greedy tokens, except Qwen3 on the cpu target (attention in float16 there), whose 37-token
prompt forks at step 23 of 24; prompt logits within 1.8e-3 of fp32 KV's on the cpu target (Qwen3;
Llama 8.9e-4, Gemma 3 2.0e-4) and 6.1e-4 on the portable one (attention in float32 after the cast).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from calculet.calbin.graphspec import NEW_KV, is_kv
from calculet.calbin.manifest import read_manifest
from calculet.compiler.compile import KV_DTYPE_BOUNDS, golden_thresholds
from calculet.compiler.options import CompileOptions
from calculet.errors import RequestError
from calculet.runtime.device import Device
from decoding import greedy_together, prefill

CONTEXT, TOKENS = 128, 24
PROMPTS = [np.random.default_rng(0).integers(3, 300, size=n).tolist() for n in (5, 20, 37)]
LOGIT_BOUND = 4e-3   # measured worst 1.8e-3 (Qwen3, cpu target)
FORKS = {("qwen3", "cpu"): 1}   # at most this many sequences fork (after step 16), as measured; others are equal


@pytest.mark.parametrize("kv_dtype, target, says", [
    ("bf16", "cpu", "CPU GroupQueryAttention takes float/float16 only"),
    ("bf16", "portable", "ortvalue_from_numpy refuses it"),
    ("int8", "cpu", "k_scale/v_scale"),
    ("int8", "portable", "per-(head, position) scales"),
    ("fp64", "cpu", "allowed: fp32, fp16, bf16, int8"),
])
def test_kv_dtypes_no_target_runs_are_refused_with_the_reason(kv_dtype, target, says):
    with pytest.raises(RequestError) as exc:
        CompileOptions(kv_dtype=kv_dtype, target=target)
    assert exc.value.code == "bad_option" and says in exc.value.message and "--kv-dtype" in exc.value.message


def test_fp16_kv_is_one_chip_only():
    with pytest.raises(RequestError, match="one chip"):
        CompileOptions(kv_dtype="fp16", chips=2, partition="pp")
    assert CompileOptions(kv_dtype="fp16", target="portable").kv_numpy_dtype == "float16"


def _greedy(path) -> tuple[np.ndarray, list[list[int]], set[str]]:
    device = Device()
    device.configure(device.load(path))
    try:
        lane = device.lanes.allocate()
        first = prefill(device, lane, PROMPTS[2])
        device.lanes.free(lane)
        kv_dtypes = {a.dtype.name for a in device.lanes.buffers}
        return first, greedy_together(device, PROMPTS, TOKENS), kv_dtypes
    finally:
        device.close()


@pytest.mark.parametrize("target", ["cpu", "portable"])
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_fp16_kv_gives_fp32_kvs_greedy_tokens(arch, target, tiny_calbin):
    half = tiny_calbin(arch, context=CONTEXT, target=target, kv_dtype="fp16")
    m = read_manifest(half)
    assert m.kv.dtype == m.memory_plan.kv.dtype == "float16"
    if arch == "gemma3":
        assert m.kv.ring is not None   # the ring layers' cast-on-write/read path is covered
    for g in m.graphs:
        kv = [t for t in (*g.inputs, *g.outputs) if is_kv(t.name) or t.name in NEW_KV]
        assert all(t.dtype == "float16" for t in kv), g.name
        assert bool(kv) == g.is_body
    first16, tokens16, arrays = _greedy(half)
    assert arrays == {"float16"}
    first32, tokens32, _ = _greedy(tiny_calbin(arch, context=CONTEXT, target=target))
    forked = [next(i for i, (a, b) in enumerate(zip(s16, s32)) if a != b) for s16, s32 in zip(tokens16, tokens32)
              if s16 != s32]
    assert len(forked) <= FORKS.get((arch, target), 0) and all(i >= 16 for i in forked), forked
    assert float(np.abs(first16 - first32).max()) <= LOGIT_BOUND


def _gates(path, numerics=False):
    from calculet.validation import ValidationOptions, validate_calbin

    return validate_calbin(path, ValidationOptions(full_hash=False, numerics=numerics))


def test_validate_checks_the_kv_dtype_of_every_kv_tensor_against_the_manifest(tiny_calbin, tmp_path):
    half = tiny_calbin("gemma3", context=CONTEXT, kv_dtype="fp16")
    report = _gates(half)
    assert not report.failed(), [(c.id, c.message) for c in report.failed()]
    assert "float16" in report.check("D.kv").message
    bad = tmp_path / "bad.calbin"
    shutil.copytree(half, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["kv"]["dtype"] = "float32"       # the graphs still declare float16 buffers
    (bad / "manifest.json").write_text(json.dumps(manifest))
    failed = {c.id for c in _gates(bad).failed()}
    assert "C.dtype" in failed


def test_fp16_kv_bounds_are_looser_only_where_measured():
    fp32 = golden_thresholds("fp32")
    half = golden_thresholds("fp32", kv_dtype="fp16")
    assert (half.greedy_agreement, half.forced_agreement) == (0.0, KV_DTYPE_BOUNDS["fp16"]["forced_agreement"]) == (0.0, 0.98)
    assert half.max_abs_logit_error == 4e-3 > 1.02e-3                       # 4x the measured worst
    assert (half.logits_cosine, half.topk_overlap) == (fp32.logits_cosine, fp32.topk_overlap)   # measured 1.0 holds
    for policy in ("int8", "int4"):   # never tighter than the weight policy's own
        q, q16 = golden_thresholds(policy), golden_thresholds(policy, kv_dtype="fp16")
        assert q16.forced_agreement == q.forced_agreement and q16.max_abs_logit_error == q.max_abs_logit_error


def test_default_model_bounds_hold_fp16_kvs_measured_numerics():
    """The default model with fp16 KV measured forced agreement 0.9688, worst cosine 0.999899, worst max
    |logit error| 0.439 on the golden set: its own bounds cover them, and fp16 KV does not tighten them."""
    default = golden_thresholds("default", default_model=True)
    half = golden_thresholds("default", default_model=True, kv_dtype="fp16")
    assert half == default
    assert 0.9688 >= half.forced_agreement and 0.999899 >= half.logits_cosine and 0.439 <= half.max_abs_logit_error


def test_gate_f_passes_fp16_kv_within_its_bounds(tiny_calbin):
    """Gemma 3 loses 1 of 192 forced tokens with fp16 KV (measured 0.9948): the fp32 bound of 1.0 would
    fail it, the fp16 bound passes it, and golden.json states that bound."""
    pytest.importorskip("torch")
    path = tiny_calbin("gemma3", context=CONTEXT, golden=True, kv_dtype="fp16")
    report = _gates(path, numerics=True)
    assert not report.failed(), [(c.id, c.message) for c in report.failed()]
    assert report.check("F.forced").evidence["threshold"] == 0.98
    assert report.check("F.max_abs_error").evidence["threshold"] == 4e-3


def test_llm_options_pass_kv_dtype_to_the_compile_of_a_source():
    from calculet.llm import LLMOptions

    assert LLMOptions(kv_dtype="fp16").compile_options().kv_dtype == "fp16"
    assert LLMOptions().compile_options().kv_dtype == "fp32"
    assert LLMOptions(provider="openvino", kv_dtype="fp16").compile_options().target == "portable"
