"""Each fusion pass changes the graph as documented and, switched off, gives the same greedy tokens."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

from calculet.compiler.compile import compile_calbin
from calculet.compiler.options import FUSIONS, CompileOptions
from decoding import generate_on_calbin

# What each pass adds to (or removes from) the decode body's op counts.
SIGNATURE = {
    "skip-norm": "SkipSimplifiedLayerNormalization",
    "qkv": "Split",
    "gate-up": "Split",
}


def _ops(path, graph):
    model = onnx.load(str(path / "graphs" / f"{graph}.onnx"), load_external_data=False)
    return Counter(n.op_type for n in model.graph.node)


def _compile(model_dir, tmp_path, fusions, weights="fp32"):
    name = "-".join(sorted(fusions)) or "none"
    out = tmp_path / f"{name}-{weights}.calbin"
    # prefill-int8 runs the packed projections only, so builds with and without packing would differ by
    # its numerics as well: it is off here (tests/compiler/test_prefill_int8.py checks it)
    options = CompileOptions(lanes=2, context=64, prefill_chunks=(4, 16), golden=False, weights=weights,
                             fusions=frozenset(fusions), prefill_int8_outliers=0)
    return compile_calbin(str(model_dir), out, options, log=lambda _m: None)


def _greedy(path, prompt):
    gen = generate_on_calbin(path, prompt)
    return gen.tokens, gen.prompt_logits


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_each_fusion_off_gives_the_same_tokens(arch, tiny_model_dir, tmp_path):
    prompt = np.random.default_rng(5).integers(3, 300, size=21).tolist()
    full = _compile(tiny_model_dir(arch), tmp_path, FUSIONS)
    tokens, logits = _greedy(full, prompt)
    for fusion in FUSIONS:
        without = _compile(tiny_model_dir(arch), tmp_path, set(FUSIONS) - {fusion})
        other_tokens, other_logits = _greedy(without, prompt)
        assert other_tokens == tokens, f"{arch}: switching off {fusion} changed the greedy tokens"
        assert np.abs(other_logits - logits).max() < 1e-4
        if fusion in SIGNATURE:
            on, off = _ops(full, "decode_2"), _ops(without, "decode_2")
            assert on[SIGNATURE[fusion]] > off[SIGNATURE[fusion]], f"{fusion} left no trace in the graph"
        elif fusion == "sampling-head":
            assert _ops(full, "head_1")["TopK"] == 1 and _ops(without, "head_1")["TopK"] == 0
        else:  # coarse-head needs an int8 lm_head: nothing to do on fp32 weights
            assert _ops(full, "head_1") == _ops(without, "head_1")


def test_packing_keeps_quantized_codes_identical(tiny_model_dir, tmp_path):
    """Row-wise block quantization: packed q/k/v and gate/up codes equal the separately quantized ones."""
    packed = _compile(tiny_model_dir("llama"), tmp_path, set(FUSIONS) - {"coarse-head"}, weights="w8a8")
    plain = _compile(tiny_model_dir("llama"), tmp_path, {"sampling-head"}, weights="w8a8")
    prompt = np.random.default_rng(6).integers(3, 300, size=9).tolist()
    a_tokens, a_logits = _greedy(packed, prompt)
    b_tokens, b_logits = _greedy(plain, prompt)
    assert a_tokens == b_tokens and np.abs(a_logits - b_logits).max() < 1e-3


def test_coarse_head_rescoring_equals_the_int8_head(tiny_model_dir, tmp_path):
    """int4 candidates rescored from the int8 rows give the int8 head's tokens and top-K values (the
    graph leaves coarse logits; the runtime writes the exact candidates into the rows it hands out)."""
    on = _compile(tiny_model_dir("qwen3"), tmp_path, FUSIONS, weights="int8")
    off = _compile(tiny_model_dir("qwen3"), tmp_path, set(FUSIONS) - {"coarse-head"}, weights="int8")
    ops = _ops(on, "head_1")
    assert ops["GatherBlockQuantized"] == 1 and ops["MatMulNBits"] == 1 and "ScatterElements" not in ops
    prompt = np.random.default_rng(8).integers(3, 300, size=13).tolist()
    a_tokens, a_logits = _greedy(on, prompt)
    b_tokens, b_logits = _greedy(off, prompt)
    assert a_tokens == b_tokens
    top = np.argsort(-b_logits)[:10]
    assert np.abs(a_logits[top] - b_logits[top]).max() < 1e-4  # exact where it matters


def test_several_row_coarse_head_leaves_rows_unscaled_with_their_scales(tiny_model_dir, tmp_path):
    """The several-row coarse head skips rescaling [R, V] every step: it outputs the unscaled int8
    product and each row's scale (`logits_scale` [R, 1]). Scaled, a row is the int8 head's logits up to
    the coarse copy's rounding; unscaled it is not (the scale is the row's max |hidden| / 127)."""
    import onnxruntime as ort

    on = _compile(tiny_model_dir("qwen3"), tmp_path, FUSIONS, weights="int8")
    off = _compile(tiny_model_dir("qwen3"), tmp_path, set(FUSIONS) - {"coarse-head"}, weights="int8")
    ops = _ops(on, "head_2")
    assert "Mul" not in ops and ops["MatMulIntegerToFloat"] == 1
    assert "logits_scale" not in [o.name for o in onnx.load(str(on / "graphs" / "head_1.onnx")).graph.output]
    coarse = ort.InferenceSession(str(on / "graphs" / "head_2.onnx"), providers=["CPUExecutionProvider"])
    exact = ort.InferenceSession(str(off / "graphs" / "head_2.onnx"), providers=["CPUExecutionProvider"])
    hidden = np.random.default_rng(11).standard_normal((2, coarse.get_inputs()[0].shape[1])).astype(np.float32) * 3
    logits, scale = coarse.run(["logits", "logits_scale"], {"hidden": hidden})
    want = exact.run(["logits"], {"hidden": hidden})[0]
    assert scale.shape == (2, 1) and np.allclose(scale[:, 0], np.abs(hidden).max(axis=1) / 127)
    spread = np.abs(want).max()
    assert np.abs(logits * scale - want).max() < 0.05 * spread
    assert np.abs(logits - want).max() > 0.5 * spread


def test_several_row_coarse_head_picks_each_rows_candidates_alone(tiny_model_dir, tmp_path):
    """Guards a batched != alone bug: the several-row coarse head quantized all rows with one scale,
    so one lane's outlier activations coarsened its neighbours' candidates (on the default model an
    8-lane step then missed the token the 1-lane step found). Each row is now quantized on its own:
    a row's candidates and exact values do not depend on what the other rows hold."""
    import onnxruntime as ort

    on = _compile(tiny_model_dir("qwen3"), tmp_path, FUSIONS, weights="int8")
    ops = _ops(on, "head_2")
    assert ops["MatMulIntegerToFloat"] == 1 and "DynamicQuantizeMatMul" not in ops
    session = ort.InferenceSession(str(on / "graphs" / "head_2.onnx"), providers=["CPUExecutionProvider"])
    width = session.get_inputs()[0].shape[1]
    row = np.random.default_rng(9).standard_normal(width).astype(np.float32)
    calm = np.stack([np.full(width, 0.1, np.float32), row])
    loud = calm.copy()
    loud[0, 3] = 500.0   # an outlier channel in the other row, as Gemma's hidden states have
    a_ids, a_values = session.run(["topk_ids", "topk_values"], {"hidden": calm})
    b_ids, b_values = session.run(["topk_ids", "topk_values"], {"hidden": loud})
    assert a_ids[1].tolist() == b_ids[1].tolist()
    assert np.array_equal(a_values[1], b_values[1])
