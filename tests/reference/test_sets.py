"""Reference sets (calculet.reference.sets): the prompt plan, the transformers run, the .npz file."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tiny_models  # tests/ is on sys.path (tests/conftest.py)
from calculet.errors import CalculetError, ModelError
from calculet.reference import sets, texts


@pytest.fixture(scope="module")
def tokenizer_json() -> str:
    return tiny_models._tokenizer_json()


def test_default_plan_has_100_distinct_prompts_at_the_boundary_lengths(tokenizer_json):
    planned, skipped = sets.plan_prompts(tokenizer_json, 2, tiny_models.VOCAB, 100, sets.plan_lengths())
    assert len(planned) == 100 and not skipped
    assert len({p.input_ids for p in planned}) == 100
    lengths = {len(p.input_ids) for p in planned}
    assert set(sets.BOUNDARY_LENGTHS) <= lengths
    assert all(p.input_ids[0] == 2 for p in planned)  # BOS first
    groups = {p.group for p in planned}
    assert {"fr", "zh", "ru", "code_python", "code_c"} <= groups
    for p in planned:
        assert p.name == f"{p.group}.len{len(p.input_ids)}"


def test_small_plan_still_covers_the_boundary_lengths_first(tokenizer_json):
    planned, _ = sets.plan_prompts(tokenizer_json, None, tiny_models.VOCAB, len(sets.BOUNDARY_LENGTHS), sets.plan_lengths())
    assert [len(p.input_ids) for p in planned] == list(sets.BOUNDARY_LENGTHS)


def test_long_and_near_context_lengths_are_opt_in(tokenizer_json):
    assert not set(sets.LONG_LENGTHS) & set(sets.plan_lengths())
    assert set(sets.LONG_LENGTHS) <= set(sets.plan_lengths(long=True))
    # prompt + 32 - 1 fed tokens must fit 1024: the longest is 993
    assert {992, 993} <= set(sets.plan_lengths(context=1024, tokens=32))
    planned, _ = sets.plan_prompts(tokenizer_json, 2, tiny_models.VOCAB, 3, (4097,))
    assert len(planned[0].input_ids) == 4097  # long prompts continue into the pydoc text


def test_lengths_beyond_the_context_are_skipped_with_a_reason(tokenizer_json):
    planned, skipped = sets.plan_prompts(tokenizer_json, 2, tiny_models.VOCAB, 10, (1, 16, 255), max_length=57)
    assert {len(p.input_ids) for p in planned} == {1, 16}
    assert skipped == [{"length": 255, "reason": "longer than 57 (context - tokens + 1)"}]


def test_bad_requests_say_what_is_allowed(tokenizer_json):
    with pytest.raises(CalculetError, match="only .* distinct prompts"):
        sets.plan_prompts(tokenizer_json, 2, tiny_models.VOCAB, 10, (1,))  # every 1-token prompt is the BOS
    with pytest.raises(CalculetError, match="no prompt length fits"):
        sets.plan_prompts(tokenizer_json, 2, tiny_models.VOCAB, 10, (300,), max_length=40)
    with pytest.raises(CalculetError, match="leaves no room"):
        sets.plan_lengths(context=8, tokens=32)


def test_pydoc_text_is_english_and_stable():
    text = texts.english_docs_text()
    assert len(text) > 100_000 and "the" in text
    assert text == texts.english_docs_text()


# -------------------------------------------------------------------------------- transformers run

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def llama_set(tiny_model_dir):
    from calculet.sources.hf import load_hf_folder

    source = load_hf_folder(tiny_model_dir("llama"))
    return source, sets.make_reference_set(source, n_prompts=5, tokens=6, topk=4, lengths=(1, 2, 16, 17, 30, 40))


def test_reference_set_holds_greedy_tokens_and_per_step_topk(llama_set):
    from calculet.reference.hf import build_reference_model, reference_greedy, reference_last_logits

    source, refset = llama_set
    model = build_reference_model(source)
    assert len(refset.prompts) == 5 and refset.tokens == 6 and refset.topk == 4
    p = refset.prompts[3]
    ids = p.input_ids.tolist()
    assert p.greedy.tolist() == reference_greedy(model, ids, 6)
    for t in (0, 3, 5):  # step t follows the prompt and greedy[:t] (teacher forcing on the greedy path)
        logits = reference_last_logits(model, ids + p.greedy[:t].tolist())
        order = np.argsort(-logits, kind="stable")[:4]
        assert p.topk_ids[t].tolist() == order.tolist()
        np.testing.assert_allclose(p.topk_logits[t], logits[order], atol=1e-4)
        lse = float(torch.logsumexp(torch.from_numpy(logits).double(), 0))
        assert abs(float(p.logsumexp[t]) - lse) < 1e-4
    assert np.all(p.ref_logprobs() < 0)
    assert refset.source["model_type"] == "llama" and refset.source["vocab_size"] == tiny_models.VOCAB


def test_reference_set_round_trips_through_npz(llama_set, tmp_path):
    _, refset = llama_set
    path = sets.write_reference_set(refset, tmp_path / "ref.npz")
    back = sets.read_reference_set(path)
    assert (back.tokens, back.topk, back.source, back.skipped) == (refset.tokens, refset.topk, refset.source, refset.skipped)
    for a, b in zip(refset.prompts, back.prompts):
        assert (a.name, a.group) == (b.name, b.group)
        for field in ("input_ids", "greedy", "topk_ids", "topk_logits", "logsumexp"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), field
        assert b.topk_logits.dtype == np.float32


def test_reading_a_wrong_file_is_a_clear_error(tmp_path):
    with pytest.raises(ModelError, match="no such reference set"):
        sets.read_reference_set(tmp_path / "missing.npz")
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(ModelError, match="not a reference set"):
        sets.read_reference_set(tmp_path / "other.npz")
    arrays = {k: np.zeros(1) for k in ("input_ids", "offsets", "greedy", "topk_ids", "topk_logits", "logsumexp")}
    np.savez(tmp_path / "old.npz", meta=np.frombuffer(json.dumps({"schema": "calculet.refset/0"}).encode(), np.uint8), **arrays)
    with pytest.raises(ModelError, match="schema is 'calculet.refset/0'"):
        sets.read_reference_set(tmp_path / "old.npz")


def test_reference_make_cli_writes_a_set(tiny_model_dir, tmp_path):
    from calculet.cli import main

    out = tmp_path / "r.npz"
    assert main(["reference", "make", str(tiny_model_dir("qwen3")), "-o", str(out), "--prompts", "3", "--tokens", "2",
                 "--lengths", "2,16,17"]) == 0
    refset = sets.read_reference_set(out)
    assert [p.input_ids.size for p in refset.prompts] == [2, 16, 17] and refset.topk == 10
    assert main(["reference", "make", str(tiny_model_dir("qwen3")), "-o", str(tmp_path / "r.json")]) == 2
