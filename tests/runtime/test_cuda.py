"""The CUDA execution provider: its error paths everywhere, greedy parity with the CPU provider and a
GPU-resident KV where onnxruntime-gpu and a GPU are present (benchmarks/cuda_check.sh runs these there).

Like the OpenVINO suite, the GPU tests need tiny HF folders built with torch beforehand when the
environment has none: CALCULET_TINY_MODELS=DIR (`python tests/tiny_models.py DIR llama qwen3 gemma3`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from calculet.calbin.manifest import KVLayout
from calculet.errors import CalculetError, ModelError
from calculet.runtime.kv_store import HostKV
from calculet.runtime.providers import choose_provider, cuda_device

HAS_CUDA_EP = "CUDAExecutionProvider" in ort.get_available_providers()


def _gpu_visible() -> bool:
    if not HAS_CUDA_EP:
        return False
    try:
        cuda_device({})
        return True
    except CalculetError:
        return False


needs_gpu = pytest.mark.skipif(not _gpu_visible(), reason="no onnxruntime-gpu with a visible GPU here "
                                                           "(benchmarks/cuda_check.sh runs these on a GPU machine)")


def test_cpu_target_is_refused_with_the_reason():
    """The cpu target's float32 GroupQueryAttention has no CUDA kernel (float16/bfloat16 only)."""
    with pytest.raises(ModelError) as e:
        choose_provider("cuda", (), "cpu", set())
    assert e.value.code == "provider_target_mismatch"
    assert "float16/bfloat16" in str(e.value) and "--target portable" in str(e.value)


@pytest.mark.skipif(HAS_CUDA_EP, reason="this ONNX Runtime build has the CUDA provider")
def test_missing_onnxruntime_gpu_says_how_to_install_it():
    with pytest.raises(ModelError) as e:
        choose_provider("cuda", (), "portable", set())
    assert e.value.code == "provider_unavailable" and "onnxruntime-gpu" in str(e.value)


@pytest.mark.skipif(_gpu_visible(), reason="a GPU is visible here")
def test_no_gpu_is_an_error_not_a_silent_cpu_run(monkeypatch):
    """Where the CUDA provider is built in but no GPU (or no CUDA runtime) is visible, ONNX Runtime
    would warn and run on the CPU; choosing the provider fails first and says why."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(CalculetError) as e:
        choose_provider("cuda", (), "portable", set())
    assert e.value.code in ("no_gpu", "cuda_runtime_missing"), e.value
    assert "GPU" in str(e.value) or "libcudart" in str(e.value)


def test_device_id_must_be_an_index(monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(ModelError, match="device_id takes a GPU index"):
        choose_provider("cuda", (("device_id", "first"),), "portable", set())


def test_host_store_writes_new_rows_to_their_lanes():
    """write_new maps a graph's output row to a lane (prefill: row 0 -> the job's lane), and a ring
    layer's position p to row p mod ring."""
    layout = KVLayout("BNSH", "float32", num_layers=2, lanes=3, kv_heads=2, context=8, head_dim=4, in_place=False,
                      layer_lengths=(8, 4))
    store = HostKV(layout)
    new_k = np.arange(2 * 1 * 2 * 4 * 4, dtype=np.float32).reshape(2, 1, 2, 4, 4) + 1
    store.write_new([0], [2], [3], [2], new_k, -new_k)          # positions 3, 4 of lane 2
    assert np.array_equal(store.keys[0][2, :, 3:5], new_k[0, 0, :, :2])
    assert np.array_equal(store.values[0][2, :, 3:5], -new_k[0, 0, :, :2])
    assert np.array_equal(store.keys[1][2, :, 3], new_k[1, 0, :, 0])   # ring of 4: position 3 -> row 3
    assert np.array_equal(store.keys[1][2, :, 0], new_k[1, 0, :, 1])   # position 4 -> row 0
    assert not store.keys[0][:2].any() and not store.keys[0][2, :, :3].any()
    assert store.nbytes == layout.total_bytes
    store.clear(2)
    assert not any(a.any() for a in store.buffers)


def test_host_store_allocates_the_layouts_kv_dtype():
    """--kv-dtype fp16: the buffers and a portable graph's new-K/V outputs are float16, half the bytes."""
    layout = KVLayout("BNSH", "float16", num_layers=2, lanes=3, kv_heads=2, context=8, head_dim=4, in_place=False,
                      layer_lengths=(8, 4))
    store = HostKV(layout)
    assert {a.dtype for a in store.buffers} == {np.dtype(np.float16)} and store.nbytes == layout.total_bytes
    new_k = store.new_buffer((2, 1, 2, 4, 4))
    assert new_k.dtype == np.float16
    new_k[...] = 1.5
    store.write_new([0], [1], [6], [2], new_k, new_k)                 # positions 6, 7 of lane 1
    assert store.keys[0][1, :, 6:8].tolist() == [[[1.5] * 4] * 2] * 2
    assert store.values[1][1, :, 2:4].tolist() == [[[1.5] * 4] * 2] * 2  # ring of 4: positions 6, 7 -> rows 2, 3


# --- on a GPU ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def portable(request, tmp_path_factory):
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions

    made = {}

    def get(arch: str, weights: str, kv_dtype: str = "fp32") -> Path:
        if (arch, weights, kv_dtype) not in made:
            folder = os.environ.get("CALCULET_TINY_MODELS")
            if folder:
                hf = Path(folder) / arch
            else:
                pytest.importorskip("torch", reason="set CALCULET_TINY_MODELS: this environment cannot build tiny models")
                hf = request.getfixturevalue("tiny_model_dir")(arch)
            out = tmp_path_factory.mktemp(f"cuda-{arch}-{weights}-{kv_dtype}") / "model.calbin"
            options = CompileOptions(lanes=3, context=64, prefill_chunks=(4, 16), golden=False, weights=weights,
                                     target="portable", kv_dtype=kv_dtype)
            made[arch, weights, kv_dtype] = compile_calbin(str(hf), out, options, log=lambda _m: None)
        return made[arch, weights, kv_dtype]

    return get


def _greedy(path: Path, provider: str):
    from calculet.engine.sampler import SamplerConfig
    from calculet.engine.tokenizer import TextTokenizer
    from calculet.runtime.device import Device
    from calculet.runtime.program import DeviceConfig
    from decoding import generate_one, greedy_together

    d = Device(DeviceConfig(provider))
    d.configure(d.load(path))
    try:
        store = d.lanes.store.device
        tok = TextTokenizer.from_program(d.program)
        prompts = [np.random.default_rng(n).integers(3, 300, size=n).tolist() for n in (1, 17, 30)]
        gens = [generate_one(d, tok, p, SamplerConfig(temperature=0.0), 16, ignore_eos=True) for p in prompts]
        return store, [g.tokens for g in gens], [g.prompt_logits for g in gens], greedy_together(d, prompts, 10)
    finally:
        d.close()


@needs_gpu
@pytest.mark.parametrize("arch,weights,kv_dtype", [("llama", "fp32", "fp32"), ("qwen3", "fp32", "fp32"),
                                                   ("gemma3", "fp32", "fp32"), ("gemma3", "fp16", "fp32"),
                                                   ("llama", "int8", "fp32"), ("gemma3", "fp16", "fp16")])
def test_greedy_parity_with_cpu_provider(arch, weights, kv_dtype, portable):
    """The KV lives on the GPU (CudaKV) and the tokens equal the CPU provider's, alone and batched
    (with --kv-dtype fp16 the GPU buffers and the 2-D copies of new rows are in half precision)."""
    path = portable(arch, weights, kv_dtype)
    _, cpu_tokens, cpu_logits, cpu_together = _greedy(path, "cpu")
    store, gpu_tokens, gpu_logits, gpu_together = _greedy(path, "cuda")
    assert store == "cuda"
    assert gpu_tokens == cpu_tokens
    assert gpu_together == cpu_together
    bound = 1e-2 if weights == "fp16" else 1e-3   # GPU matmuls (TF32 off by default, fp16 accumulates differently)
    for a, b in zip(cpu_logits, gpu_logits):
        assert np.isfinite(b).all() and np.abs(a - b).max() < bound


@needs_gpu
def test_kv_buffers_are_on_the_gpu(portable):
    from calculet.runtime.device import Device
    from calculet.runtime.program import DeviceConfig

    d = Device(DeviceConfig("cuda"))
    d.configure(d.load(portable("llama", "fp32")))
    try:
        assert all(b.device_name().lower() == "cuda" for b in d.lanes.buffers)
        assert d.lanes.store.nbytes == d.program.manifest.kv.total_bytes
    finally:
        d.close()
