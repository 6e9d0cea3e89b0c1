"""The embedded default model (Gemma 3 270M from the GGUF package) end to end."""

from __future__ import annotations

import numpy as np
import pytest

from calculet.engine.sampler import SamplerConfig
from calculet.engine.tokenizer import TextTokenizer
from calculet.runtime.device import Device
from decoding import generate_one

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def device(default_calbin_fp32):
    d = Device()
    d.configure(d.load(default_calbin_fp32))
    yield d
    d.close()


@pytest.fixture(scope="module")
def reference(default_reference):
    return default_reference


def test_greedy_32_tokens_equal_transformers(device, reference):
    from calculet.reference.hf import reference_greedy, reference_last_logits

    tokenizer = TextTokenizer.from_program(device.program)
    ids = tokenizer.encode(PROMPT)
    assert ids[0] == 2  # Gemma prepends <bos>
    gen = generate_one(device, tokenizer, ids, SamplerConfig(temperature=0.0), 32, ignore_eos=True)
    ref_tokens = reference_greedy(reference, ids, 32)
    assert gen.tokens == ref_tokens, (tokenizer.decode(gen.tokens), tokenizer.decode(ref_tokens))
    ref_logits = reference_last_logits(reference, ids)
    err = float(np.abs(gen.prompt_logits - ref_logits).max())
    assert err < 1e-3, f"last-token logits differ by {err}"
    print(f"default model: 32 greedy tokens equal; last-token logits max abs error {err:.2e}")


def test_manifest_describes_default_model(default_calbin):
    """The serving build: int8 weights on the default policy, decode graphs for 1 and 8 lanes, head graphs."""
    from calculet.calbin.manifest import read_manifest

    m = read_manifest(default_calbin)
    hp = m.spec
    assert m.model.model_type == "gemma3_text" and m.model.source.kind == "gguf"
    assert (hp.num_layers, hp.hidden_size, hp.vocab_size, hp.sliding_window) == (18, 640, 262144, 512)
    assert hp.layer_types.count("full") == 3
    assert m.tokenizer.vocab_size == 262144 and m.tokenizer.bos_token_id == 2 and 1 in m.tokenizer.eos_token_ids
    assert [g.name for g in m.graphs] == ["prefill_16", "prefill_64", "prefill_128", "decode_1", "decode_8", "head_1", "head_8"]
    assert m.quantization.policy == "default" and "sampling-head" in m.passes
    assert m.golden is not None and m.golden.prompts >= 6
