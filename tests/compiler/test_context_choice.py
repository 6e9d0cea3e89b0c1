"""compiler/context_choice.py: the default context is what the model was trained for, cut to the KV
budget; an explicit --context over --kv-memory is refused with the numbers (issue 13)."""

from __future__ import annotations

import pytest

from calculet.compiler.context_choice import AUTO_MARGIN_BYTES, Budget, choose_context, kv_budget
from calculet.compiler.kv_layout import kv_layout
from calculet.errors import RequestError
from calculet.models import family_for
from calculet.sources.resolve import load_config

GiB = 1024**3
CHUNKS = (16, 128)


@pytest.fixture(scope="module")
def gemma():
    config = load_config(None).config
    return family_for(config).parse_config(config)


def test_the_default_model_gets_its_trained_32768_in_8_lanes_within_2_gib(gemma):
    choice = choose_context(gemma, 8, CHUNKS, Budget(2 * GiB, "test"))
    assert choice.context == gemma.max_position_embeddings == 32768
    assert choice.kv_bytes == 8 * (3 * 32768 + 15 * 640) * 2 * 256 * 4 < 2 * GiB   # 1.65 GiB
    assert "trained" in choice.reason


def test_a_smaller_budget_cuts_the_context_to_the_largest_fitting_multiple_of_128(gemma):
    budget = Budget(1 * GiB, "test")
    choice = choose_context(gemma, 8, CHUNKS, budget)
    assert choice.context % 128 == 0 and choice.context < 32768
    assert kv_layout(gemma, 8, choice.context, CHUNKS, True).total_bytes <= budget.bytes
    assert kv_layout(gemma, 8, choice.context + 128, CHUNKS, True).total_bytes > budget.bytes
    assert "fits" in choice.reason and f"{choice.context:,}" in choice.reason


def test_without_rings_the_same_budget_holds_less_context(gemma):
    ring = choose_context(gemma, 8, CHUNKS, Budget(2 * GiB, "test"))
    full = choose_context(gemma, 8, CHUNKS, Budget(2 * GiB, "test"), rings=False)
    assert full.context < ring.context and full.context <= 2 * GiB // (8 * 18 * 2048)


def test_an_explicit_context_over_the_budget_is_refused_with_the_plan_numbers(gemma):
    with pytest.raises(RequestError) as exc:
        choose_context(gemma, 8, CHUNKS, Budget(256 * 1024**2, "--kv-memory 256 MiB"), asked=32768)
    message = exc.value.message
    assert exc.value.code == "context_does_not_fit"
    assert "--context 32,768 with 8 lanes needs" in message and "--kv-memory 256 MiB" in message
    assert "the largest context that fits 8 lanes is" in message


def test_auto_budget_is_available_memory_less_weights_and_margin():
    b = kv_budget(None, 300 * 1024**2, available=8 * GiB)
    assert b.bytes == 8 * GiB - 300 * 1024**2 - AUTO_MARGIN_BYTES and "auto" in b.why
    assert kv_budget(4 * GiB, 1).bytes == 4 * GiB


def test_compile_without_context_picks_and_says_it(tiny_model_dir, tmp_path):
    """The tiny llama was trained for 256 positions: with room for them, compile takes all 256."""
    from calculet.calbin.manifest import read_manifest
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions

    lines = []
    options = CompileOptions(lanes=2, prefill_chunks=(4, 16), golden=False, weights="fp32", kv_memory=64 * 1024**2)
    path = compile_calbin(str(tiny_model_dir("llama")), tmp_path / "m.calbin", options, log=lines.append)
    assert read_manifest(path).profile.context == 256
    assert any("context 256, what the model was trained for" in line for line in lines)
    with pytest.raises(RequestError, match="over the budget"):
        compile_calbin(str(tiny_model_dir("llama")), tmp_path / "n.calbin",
                       CompileOptions(lanes=2, context=256, prefill_chunks=(4, 16), golden=False, kv_memory=1024),
                       log=lines.append)


def test_fp16_kv_fits_twice_the_positions_in_the_same_budget(gemma):
    """--kv-dtype fp16: the context choice prices 2 bytes per value, as the buffers hold."""
    budget = Budget(1 * GiB, "test")
    fp32 = choose_context(gemma, 8, CHUNKS, budget)
    fp16 = choose_context(gemma, 8, CHUNKS, budget, dtype="float16")
    assert fp16.context > fp32.context
    assert fp16.kv_bytes == kv_layout(gemma, 8, fp16.context, CHUNKS, True, dtype="float16").total_bytes <= budget.bytes
    assert fp16.kv_bytes == 8 * (3 * fp16.context + 15 * 640) * 2 * 256 * 2
