"""compiler/moe.local_experts, the `--partition ep` block: the chips' partial outputs, each over its own
experts with its columns of the global routing, sum to the whole block's numpy reference (so no chip
renormalises over its local experts); and ep's clear errors."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from calculet.compiler import expert_parallel, moe
from calculet.compiler.builder import GraphBuilder
from calculet.compiler.quantize import QuantFormat, store_weights
from calculet.compiler.weights import WEIGHTS_FILE, WeightStore
from calculet.errors import RequestError
from compiler.test_moe_block import E, H, K, N, _dequantized, _spec, _weights, reference


def _chip_output(tmp_path, spec, store: WeightStore, chips: int, c: int, rows: int) -> tuple[np.ndarray, set[str]]:
    experts = expert_parallel.chip_experts(spec, chips, c)
    local = store.slice_rows({n: experts for n in expert_parallel.stack_names(spec)})
    folder = tmp_path / f"chip{c}"
    folder.mkdir()
    local.write(folder / WEIGHTS_FILE)
    g = GraphBuilder("block", local, "cpu")
    g.input("x", np.float32, [N, H])
    g.output(moe.local_experts(g, spec, 0, "x", rows, "/moe", experts, c == 0), "y", np.float32, [N, H])
    model = g.build()
    onnx.save_model(model, str(folder / "block.onnx"))
    session = ort.InferenceSession(str(folder / "block.onnx"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((N, H)).astype(np.float32)
    return session.run(None, {"x": x})[0], {n.op_type for n in model.graph.node}


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("chips", [2, 4, 8])
@pytest.mark.parametrize("experts, rows, op", [("fp32", 1, "Gather"), ("fp32", 1 << 20, "MatMul"),
                                                ("int4", N, "QMoE"), ("int8", N, "QMoE")])
def test_chip_partials_sum_to_the_whole_block(tmp_path, norm, chips, experts, rows, op):
    spec = _spec(norm)
    arrays = _weights(np.random.default_rng(0))
    table = {} if experts == "fp32" else {"experts": QuantFormat(experts, 32, "fp32")}
    store = WeightStore()
    family = type("Fixed", (), {"prepare_weights": staticmethod(lambda _s, _t: iter(arrays))})
    store_weights(spec, family, {}, table, store)
    parts = []
    for c in range(chips):
        y, ops = _chip_output(tmp_path, spec, store, chips, c, rows)
        assert "MoE" not in ops      # com.microsoft.MoE would softmax the local weights again
        assert op in ops or chips > 2                # more chips: fewer local experts, so dense wins the choice
        parts.append(y)
    x = np.random.default_rng(1).standard_normal((N, H)).astype(np.float32)
    decoded = _dequantized(arrays, table) if table else [a for _, a in arrays]
    want = reference(x, *decoded, norm)
    if experts == "int8":     # 8-bit blocks run with int8 activations in QMoE: the bound of that, not 1e-5
        np.testing.assert_allclose(sum(parts), want, atol=0.05 * np.abs(want).max())
    else:
        np.testing.assert_allclose(sum(parts), want, atol=1e-5)
    assert sum(np.abs(p).max() > 0 for p in parts) >= 2, "one chip did all the work: the test would be weak"


def test_ep_on_a_dense_model_or_uneven_experts_is_a_clear_error():
    from dataclasses import replace

    spec = _spec(True)
    with pytest.raises(RequestError, match=r"--partition ep .*mixture-of-experts.*qwen3_moe.*use --partition tp or pp"):
        expert_parallel.check_ep(replace(spec, moe=None, family="llama", model_type="llama"), 2)
    with pytest.raises(RequestError, match=r"--chips 3: 8 experts do not split evenly .* allowed --chips: 2, 4, 8"):
        expert_parallel.check_ep(spec, 3)
    assert E % 2 == 0 and K <= E


def test_blocks_end_at_sparse_layers():
    from dataclasses import replace

    spec = _spec(True)
    spec = replace(spec, num_layers=5, layer_types=("full",) * 5, moe=replace(spec.moe, sparse_layers=(1, 2)))
    assert expert_parallel.blocks(spec) == ([(0, 1), (2,)], (3, 4))
    assert expert_parallel.ep_schedule(spec, 2, "decode_4", 4, 1).collectives[-1].kind == "reduce"
