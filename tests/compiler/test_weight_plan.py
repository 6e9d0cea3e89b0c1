"""compiler/weight_plan.py: the tensor list `compile` checks its store against (and `plan` sums)."""

from __future__ import annotations

import numpy as np
import pytest

from calculet.compiler.options import CompileOptions
from calculet.compiler.weight_plan import check_stored, weight_plan
from calculet.compiler.weights import WeightStore
from calculet.models import parse_config

TINY = dict(model_type="qwen3", vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=1e6, tie_word_embeddings=True)


def _fill(plan, store, skip=()):
    for t in plan.tensors:
        for name, nbytes in t.stored():
            if name not in skip:
                store.add(name, np.zeros(nbytes, np.uint8))


def test_check_stored_accepts_the_planned_arrays_and_names_a_missing_one():
    """Guards plan == compile: a tensor the compiler stores but the plan does not list (or the
    reverse) stops the compile instead of letting `calculet plan` drift."""
    spec = parse_config(TINY)
    plan = weight_plan(spec, CompileOptions(lanes=1, context=32, prefill_chunks=(4,), weights="default"))
    store = WeightStore()
    _fill(plan, store)
    check_stored(plan, store, {})
    assert plan.file_bytes == store.nbytes
    short = WeightStore()
    _fill(plan, short, skip={"model.norm.weight"})
    with pytest.raises(AssertionError, match="model.norm.weight"):
        check_stored(plan, short, {})


def test_tied_int8_embedding_is_stored_once_and_the_head_gets_coarse_copies():
    spec = parse_config(TINY)
    names = {t.name: t for t in weight_plan(spec, CompileOptions(lanes=1, context=32, prefill_chunks=(4,),
                                                              weights="default")).tensors}
    assert "lm_head.weight" not in names and names["model.embed_tokens.weight"].fmt.kind == "int8"
    assert names["lm_head.coarse"].fmt.kind == "int4" and names["lm_head.coarse"].role == "copy"
    fp32 = {t.name for t in weight_plan(spec, CompileOptions(lanes=1, context=32, prefill_chunks=(4,),
                                                             weights="fp32")).tensors}
    assert not any(n.startswith("lm_head") for n in fp32)
