"""Partitioned compiles of weights that already sit on a block-16 grid (as GGUF Q6_K tensors do).

Regression: `calculet compile --chips 2 --partition tp` of the default model under the default policy
failed with "planned_chip_weights disagrees with the tensors its graphs read": the encoder keeps block
16 for a tensor whose values are exact on that grid (quantize.quantize_best_block), and the per-chip
plan assumed the policy's block 32. Tiny random models never hit it; this one has such a tensor.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from calculet.calbin.manifest import read_manifest  # noqa: E402
from calculet.compiler.compile import compile_calbin  # noqa: E402
from calculet.compiler.options import CompileOptions  # noqa: E402

GRID = "model.layers.0.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def grid_model(tmp_path_factory):
    from safetensors.numpy import load_file, save_file
    from tiny_models import make_tiny_model

    folder = make_tiny_model("llama", tmp_path_factory.mktemp("grid") / "llama")
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    w = tensors[GRID]                                   # [hidden, intermediate]: K = intermediate
    rng = np.random.default_rng(0)
    rows, k = w.shape
    scales = rng.uniform(0.002, 0.02, size=(rows, k // 16, 1)).astype(np.float32)   # a scale per 16 along K
    codes = rng.integers(-31, 32, size=(rows, k // 16, 16)).astype(np.float32)      # 6-bit codes, like Q6_K
    codes[:, :, 0] = 31                                  # each block spans the grid (amax = 31 steps)
    tensors[GRID] = (codes * scales).reshape(rows, k).astype(np.float32)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("partition", ["tp", "pp"])
def test_a_block16_grid_tensor_compiles_on_two_chips(grid_model, tmp_path, partition):
    one = compile_calbin(str(grid_model), tmp_path / "one.calbin",
                         CompileOptions(lanes=2, context=64, prefill_chunks=(16,), weights="default", golden=False), log=lambda _m: None)
    assert read_manifest(one).quantization.tensors[GRID].block == 16   # the encoder kept the exact grid
    two = compile_calbin(str(grid_model), tmp_path / "two.calbin",
                         CompileOptions(lanes=2, context=64, prefill_chunks=(16,), weights="default", golden=False,
                                        chips=2, partition=partition),
                         log=lambda _m: None)
    parts = read_manifest(two).partition.chips
    assert len(parts) == 2 and sum(p.weights_bytes for p in parts) > 0
