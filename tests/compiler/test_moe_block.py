"""compiler/moe.py's block alone, every formulation against a numpy reference of the routed experts,
with and without renormalised top-k weights."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from calculet.compiler import moe
from calculet.compiler.builder import GraphBuilder
from calculet.compiler.quantize import QuantFormat, store_weights
from calculet.compiler.weights import WEIGHTS_FILE, WeightStore
from calculet.models.base import ModelSpec, MoeSpec, RopeSpec

H, I, E, K, N = 64, 32, 8, 2, 5


def _spec(norm: bool) -> ModelSpec:
    return ModelSpec(family="qwen3_moe", model_type="qwen3_moe", vocab_size=16, hidden_size=H, intermediate_size=I,
                     num_layers=1, num_heads=1, num_kv_heads=1, head_dim=16, rms_norm_eps=1e-6, layer_types=("full",),
                     rope_full=RopeSpec(1e6), rope_sliding=None, sliding_window=None, attn_scale=1.0,
                     tie_word_embeddings=False, moe=MoeSpec(E, K, I, (0,), norm_topk_prob=norm))


def _weights(rng):
    router, fc1, fc2 = moe.weight_names(0)
    return [(router, (rng.standard_normal((H, E)) * 0.3).astype(np.float32)),
            (fc1, (rng.standard_normal((E, 2 * I, H)) * 0.1).astype(np.float32)),
            (fc2, (rng.standard_normal((E, H, I)) * 0.1).astype(np.float32))]


def reference(x, router, fc1, fc2, norm: bool) -> np.ndarray:
    """Routed SwiGLU experts in numpy: softmax over all experts, top k, optionally renormalised."""
    logits = x @ router
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(len(x)):
        top = np.argsort(-p[t])[:K]
        w = p[t, top] / (p[t, top].sum() if norm else 1.0)
        for j, e in enumerate(top):
            both = fc1[e] @ x[t]
            gate, up = both[0::2], both[1::2]                       # interleaved rows
            out[t] += w[j] * (fc2[e] @ (gate / (1 + np.exp(-gate)) * up))
    return out


def _run(tmp_path, spec, arrays, target, rows, table=None) -> tuple[np.ndarray, set[str]]:
    store = WeightStore()
    family = type("Fixed", (), {"prepare_weights": staticmethod(lambda _s, _t: iter(arrays))})
    store_weights(spec, family, {}, table or {}, store)
    store.write(tmp_path / WEIGHTS_FILE)
    g = GraphBuilder("block", store, target)
    g.input("x", np.float32, [N, H])
    g.output(moe.sparse_mlp(g, spec, 0, "x", rows, "/moe"), "y", np.float32, [N, H])
    model = g.build()
    onnx.save_model(model, str(tmp_path / "block.onnx"))
    session = ort.InferenceSession(str(tmp_path / "block.onnx"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((N, H)).astype(np.float32)
    return session.run(None, {"x": x})[0], {n.op_type for n in model.graph.node}


def _dequantized(store_arrays, table):
    """The expert stacks as the quantized codes decode (what QMoE multiplies with)."""
    from calculet.compiler.quantize import quantize

    out = []
    for name, w in store_arrays:
        fmt = table.get("experts") if ".experts." in name else None
        if fmt is None:
            out.append(w)
            continue
        e, n, k = w.shape
        out.append(quantize(w.reshape(e * n, k), fmt).dequantize(fmt.bits).reshape(e, n, k))
    return out


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("target, rows, op", [("cpu", N, "MoE"), ("portable", 1, "Gather"),
                                               ("portable", 1 << 20, "ScatterElements")])
def test_fp32_formulations_equal_numpy(tmp_path, norm, target, rows, op):
    arrays = _weights(np.random.default_rng(0))
    got, ops = _run(tmp_path, _spec(norm), arrays, target, rows)
    assert op in ops
    x = np.random.default_rng(1).standard_normal((N, H)).astype(np.float32)
    np.testing.assert_allclose(got, reference(x, *[a for _, a in arrays], norm), atol=1e-5)


@pytest.mark.parametrize("norm", [True, False])
def test_qmoe_honours_norm_topk_prob(tmp_path, norm):
    """Guards a bug: without its router_weights input ONNX Runtime's CPU QMoE renormalises the top-k
    weights even with normalize_routing_weights=0, so Qwen2-MoE (norm_topk_prob false) was 0.26 off;
    with int4 codes and fp32 activations it must equal the reference on the decoded weights."""
    table = {"experts": QuantFormat("int4", 32, "fp32")}
    arrays = _weights(np.random.default_rng(0))
    got, ops = _run(tmp_path, _spec(norm), arrays, "cpu", N, table)
    assert "QMoE" in ops
    x = np.random.default_rng(1).standard_normal((N, H)).astype(np.float32)
    np.testing.assert_allclose(got, reference(x, *_dequantized(arrays, table), norm), atol=1e-5)
