"""The OpenVINO execution provider (device CPU) on portable calbins: greedy parity with the CPU provider.

`onnxruntime-openvino` installs as the module `onnxruntime`, so these tests run in an environment of
their own and skip wherever `OpenVINOExecutionProvider` is missing (the main environment). That
environment has no torch to build tiny models; build their folders beforehand with torch and point
CALCULET_TINY_MODELS at them (`python tests/tiny_models.py DIR llama qwen3 gemma3`). The calbins
are compiled here, without golden/.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from calculet.compiler.compile import compile_calbin
from calculet.compiler.options import CompileOptions
from calculet.engine.sampler import SamplerConfig
from calculet.engine.tokenizer import TextTokenizer
from calculet.errors import DeviceError, ModelError
from calculet.runtime.device import Device
from calculet.runtime.program import DeviceConfig
from calculet.runtime.providers import choose_provider
from decoding import generate_one, greedy_together

pytestmark = pytest.mark.skipif("OpenVINOExecutionProvider" not in ort.get_available_providers(),
                                reason="this ONNX Runtime build has no OpenVINOExecutionProvider (pip install onnxruntime-openvino "
                                       "in an environment of its own)")

PROMPT_LENGTHS = (1, 17, 30)  # 30 runs past gemma3's sliding window of 8 and over two prefill chunks


@pytest.fixture(scope="module")
def hf_dir(request):
    """arch -> a tiny HF folder: from CALCULET_TINY_MODELS, else built here (needs torch)."""
    folder = os.environ.get("CALCULET_TINY_MODELS")

    def get(arch: str) -> Path:
        if folder:
            path = Path(folder) / arch
            if not (path / "config.json").is_file():
                pytest.fail(f"CALCULET_TINY_MODELS={folder} has no {arch}/config.json")
            return path
        pytest.importorskip("torch", reason="set CALCULET_TINY_MODELS: this environment cannot build tiny models")
        return request.getfixturevalue("tiny_model_dir")(arch)

    return get


@pytest.fixture(scope="module")
def portable(hf_dir, tmp_path_factory):
    made = {}

    def get(arch: str, weights: str = "fp32") -> Path:
        if (arch, weights) not in made:
            out = tmp_path_factory.mktemp(f"ov-{arch}-{weights}") / "model.calbin"
            options = CompileOptions(lanes=3, context=64, prefill_chunks=(4, 16), golden=False, weights=weights,
                                     target="portable")
            made[arch, weights] = compile_calbin(str(hf_dir(arch)), out, options, log=lambda _m: None)
        return made[arch, weights]

    return get


def _greedy(path: Path, config: DeviceConfig) -> tuple[list, list, list]:
    d = Device(config)
    d.configure(d.load(path))
    try:
        tok = TextTokenizer.from_program(d.program)
        prompts = [np.random.default_rng(n).integers(3, 300, size=n).tolist() for n in PROMPT_LENGTHS]
        gens = [generate_one(d, tok, p, SamplerConfig(temperature=0.0), 16, ignore_eos=True) for p in prompts]
        together = greedy_together(d, prompts, 10)
        return [g.tokens for g in gens], [g.prompt_logits for g in gens], together
    finally:
        d.close()


@pytest.mark.parametrize("arch,weights", [("llama", "fp32"), ("qwen3", "fp32"), ("gemma3", "fp32"),
                                          ("gemma3", "fp16"), ("gemma3", "int8"), ("llama", "int8")])
def test_greedy_parity_with_cpu_provider(arch, weights, portable):
    """Regression (issue 17): every OpenVINO output was NaN (the unused total_seq_len input shifted the
    provider's input binding). Same greedy tokens, alone and batched, and prompt logits within 1e-4."""
    path = portable(arch, weights)
    cpu_tokens, cpu_logits, cpu_together = _greedy(path, DeviceConfig("cpu"))
    ov_tokens, ov_logits, ov_together = _greedy(path, DeviceConfig("openvino"))
    assert ov_tokens == cpu_tokens
    assert ov_together == cpu_together
    for a, b in zip(cpu_logits, ov_logits):
        assert np.isfinite(b).all()
        assert np.abs(a - b).max() < 1e-4


def test_cache_dir_holds_compiled_blobs(portable, tmp_path):
    cache = tmp_path / "ov-cache"
    path = portable("llama")
    for _ in range(2):  # the second start reads the blobs the first one wrote
        d = Device(DeviceConfig("openvino", provider_options=(("cache_dir", str(cache)),)))
        d.configure(d.load(path))
        d.close()
    assert any(cache.rglob("*.blob"))


def test_unknown_option_is_refused_not_run_on_cpu(portable):
    d = Device(DeviceConfig("openvino", provider_options=(("no_such_option", "1"),)))
    with pytest.raises(DeviceError) as e:
        d.configure(d.load(portable("llama")))
    d.close()
    assert e.value.code == "provider_not_active"


def test_portable_calbin_from_before_the_fix_is_refused():
    with pytest.raises(ModelError) as e:
        choose_provider("openvino", (), "portable", {"input_ids", "seqlens_k", "total_seq_len"})
    assert e.value.code == "calbin_too_old" and "recompile" in str(e.value)


def test_placement_every_node_runs_on_openvino(portable, capsys):
    """`calculet inspect --provider openvino`: ONNX Runtime hands each portable graph to OpenVINO whole
    (one compiled subgraph per graph) and nothing falls back to the CPU provider."""
    from calculet.cli import main
    from calculet.runtime.node_placement import measure_placement

    for arch, weights in (("llama", "int8"), ("gemma3", "fp16")):
        p = measure_placement(portable(arch, weights), DeviceConfig("openvino"))
        assert p.fallback_ops() == {}
        for g in p.graphs:
            assert set(g.providers()) == {"OpenVINOExecutionProvider"}, g
            assert all("-EP-subgraph" in op for op in g.on("OpenVINOExecutionProvider")), g
    assert main(["inspect", str(portable("llama", "int8")), "--provider", "openvino", "--provider", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "placement on openvino" in out and "falls back to the CPU: nothing" in out and "placement on cpu" in out


def test_default_model_portable_int8_parity_with_cpu_provider(tmp_path):
    """Issue 17's acceptance on the embedded default model (Gemma 3 270M, the portable int8 build
    OpenVINO serves): the same greedy tokens as the CPU provider on the same calbin, alone and for
    three prompts decoded together, prompt logits within 1e-3 (measured 5e-5)."""
    pytest.importorskip("calculet.sources.gguf")
    out = tmp_path / "default-portable-int8.calbin"
    path = compile_calbin(None, out, CompileOptions(lanes=3, context=128, prefill_chunks=(16,), golden=False,
                                                    weights="int8", target="portable"), log=lambda _m: None)

    def run(provider: str):
        d = Device(DeviceConfig(provider))
        d.configure(d.load(path))
        try:
            tok = TextTokenizer.from_program(d.program)
            prompts = [tok.encode(t) for t in ("The capital of France is", "def fibonacci(n):", "Once upon a time")]
            gens = [generate_one(d, tok, p, SamplerConfig(temperature=0.0), 8, ignore_eos=True) for p in prompts]
            return [g.tokens for g in gens], [g.prompt_logits for g in gens], greedy_together(d, prompts, 8)
        finally:
            d.close()

    cpu_tokens, cpu_logits, cpu_together = run("cpu")
    ov_tokens, ov_logits, ov_together = run("openvino")
    assert ov_tokens == cpu_tokens and ov_together == cpu_together
    for a, b in zip(cpu_logits, ov_logits):
        assert np.isfinite(b).all() and np.abs(a - b).max() < 1e-3
