"""benchmarks/llm_heap.py: one measurement on a tiny model, settled and not: the frozen count says
which, and the waves produce tokens, gaps and a rate."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import llm_heap  # noqa: E402


@pytest.mark.parametrize("settle", [True, False])
def test_one_measurement_on_a_tiny_model(tiny_calbin, settle):
    gc.unfreeze()
    try:
        m = llm_heap.child(settle, waves=1, prompt_tokens=12, output_tokens=6, model=str(tiny_calbin("llama")))
    finally:
        gc.unfreeze()
    assert m["settle"] is settle and (m["frozen"] > 0) is settle
    assert m["tok_s"] > 0 and m["itl_p99_ms"] > 0 and m["gen2_passes"] >= 0
