"""Weight policies: encoders are exact where the grid allows, and every policy passes its numerics
thresholds against the reference on a tiny model."""

from __future__ import annotations

import numpy as np
import pytest

from calculet.calbin.manifest import read_manifest
from calculet.compiler.compile import golden_thresholds
from calculet.compiler.quantize import QuantFormat, policy_table, quantize, quantize_best_block
from calculet.golden_gate import check_calbin
from calculet.errors import RequestError
from calculet.reference.golden import read_golden


def test_int8_is_exact_on_gguf_style_grids():
    """Q8_0- and Q5_0-style blocks (d * small integers) re-encode to int8 with zero error.

    As llama.cpp quantizes, each block's largest magnitude sits at the end of the code range
    (+-127 for Q8_0, -16 for Q5_0): that is what makes the block's grid recoverable."""
    rng = np.random.default_rng(0)
    d = rng.uniform(0.001, 0.01, size=(64, 4, 1)).astype(np.float32)
    codes8 = rng.integers(-127, 128, size=(64, 4, 32))
    codes8[..., 0] = 127
    codes5 = rng.integers(-16, 16, size=(64, 4, 32))
    codes5[..., 3] = -16
    q8 = (d * codes8).reshape(64, 128).astype(np.float32)
    q5 = (d * codes5).reshape(64, 128).astype(np.float32)
    for w in (q8, q5):
        q = quantize(w, QuantFormat("int8", 32, "int8"))
        assert q.exact_fraction == 1.0 and q.max_abs_error < 1e-7
        assert np.abs(q.dequantize(8) - w).max() < 1e-7


def test_q6k_style_tensor_chooses_block_16():
    rng = np.random.default_rng(1)
    d = rng.uniform(0.001, 0.01, size=(32, 8, 1)).astype(np.float32)
    codes = rng.integers(-32, 32, size=(32, 8, 16))
    codes[..., 5] = -32
    w = (d * codes).reshape(32, 128).astype(np.float32)
    fmt, q = quantize_best_block(w, QuantFormat("int8", 32, "int8"))
    assert fmt.block == 16 and q.exact_fraction == 1.0


def test_int4_error_bounded_by_half_a_step():
    w = np.random.default_rng(2).standard_normal((16, 256)).astype(np.float32)
    q = quantize(w, QuantFormat("int4", 32, "fp32"))
    step = np.abs(w.reshape(16, 8, 32)).max(-1) / 7
    err = np.abs(q.dequantize(4) - w).reshape(16, 8, 32).max(-1)
    assert (err <= step / 2 + 1e-6).all()


def test_bad_policy_and_block_are_rejected():
    with pytest.raises(RequestError) as e:
        policy_table("int3")
    assert "supported: default, fp32, fp16, int8, w8a8, int4, w4a8" in str(e.value)
    with pytest.raises(RequestError) as e:
        policy_table("int4", block=24)
    assert "allowed: 16, 32, 64, 128, 256" in str(e.value)


@pytest.mark.parametrize("policy", ["fp32", "fp16", "int8", "w8a8", "int4", "w4a8", "default"])
def test_policy_passes_numerics_on_tiny_model(policy, tiny_calbin):
    path = tiny_calbin("llama", golden=True, weights=policy)
    manifest = read_manifest(path)
    tensors = manifest.quantization.tensors
    kinds = {v.kind for name, v in tensors.items() if name != "lm_head.coarse"}
    if policy not in ("fp32", "fp16", "w4a8"):  # an int8 lm_head gets an int4 candidate copy (the coarse-head pass)
        assert tensors["lm_head.coarse"].kind == "int4"
    expected = {"fp32": {"fp32"}, "fp16": {"fp32", "fp16"}, "int4": {"fp32", "int4", "int8"},
                "w4a8": {"fp32", "int4"}}.get(policy, {"fp32", "int8"})
    assert kinds == expected
    assert manifest.golden.thresholds == golden_thresholds(policy).__dict__
    report = check_calbin(path, read_golden(path))
    assert report.passed, report.summary()
    assert report.forced_agreement >= (0.7 if policy in ("int4", "w4a8") else 0.9)
