"""Compiled graphs equal the Hugging Face reference on tiny random models of every architecture."""

from __future__ import annotations

import numpy as np
import pytest

from calculet.engine.sampler import SamplerConfig
from calculet.engine.tokenizer import TextTokenizer
from calculet.runtime.device import Device
from decoding import generate_one

ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]
# 1, 2 and 15/16/17 straddle the 4- and 16-token chunks; 13 and 30 run past gemma3's window of 8.
PROMPT_LENGTHS = [1, 2, 15, 16, 17, 13, 30]
STEPS = 24
LOGITS_ATOL = 1e-3


def _prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 300, size=n).tolist()


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, tiny_model_dir, tiny_calbin):
    import torch
    from transformers import AutoModelForCausalLM

    arch = request.param
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir(arch), dtype=torch.float32, attn_implementation="eager").eval()
    device = Device()
    device.configure(device.load(tiny_calbin(arch)))
    yield arch, hf, device
    device.close()


def _reference(hf, prompt: list[int]):
    import torch

    with torch.no_grad():
        ids = torch.tensor([prompt])
        logits = hf(ids).logits[0, -1].numpy()
        out = hf.generate(ids, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False, eos_token_id=None, pad_token_id=0)
    return logits, out[0, len(prompt):].tolist()


@pytest.mark.parametrize("length", PROMPT_LENGTHS)
def test_greedy_tokens_and_logits_match_reference(pair, length):
    arch, hf, device = pair
    prompt = _prompt(length, seed=length)
    ref_logits, ref_tokens = _reference(hf, prompt)
    tokenizer = TextTokenizer.from_program(device.program)
    gen = generate_one(device, tokenizer, prompt, SamplerConfig(temperature=0.0), STEPS, ignore_eos=True)
    err = float(np.abs(gen.prompt_logits - ref_logits).max())
    assert err < LOGITS_ATOL, f"{arch} len {length}: last-token logits differ by {err}"
    assert gen.tokens == ref_tokens, f"{arch} len {length}: greedy tokens differ"
    assert len(set(ref_tokens)) > 1 or arch == "gemma3", "reference output is degenerate; the test would be weak"
