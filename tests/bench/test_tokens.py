"""Exact-length prompts with a local tokenizer.json and with a server's /tokenize."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from calculet.bench.tokens import LocalTokenizer, RemoteTokenizer, exact_prompt
from calculet.errors import RequestError


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real BPE tokenizer trained on a little text, saved as tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]"])
    text = ["the people of the world go to school", "a garden of stone and a river of light"] * 20
    tokenizer.train_from_iterator(text, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


@pytest.mark.parametrize("n", [1, 2, 16, 100, 333])
def test_local_exact_counts(tokenizer_json: Path, n: int):
    counter = LocalTokenizer(tokenizer_json)
    rng = random.Random(n)
    prompts = [exact_prompt(counter, n, rng) for _ in range(3)]
    assert [counter.count(p) for p in prompts] == [n] * 3
    assert len(set(prompts)) == 3


@pytest.mark.parametrize("n", [1, 7, 64, 257])
def test_remote_exact_counts(scripted_url: str, n: int):
    counter = RemoteTokenizer(scripted_url, "scripted")
    try:
        prompt = exact_prompt(counter, n, random.Random(0))
        assert counter.count(prompt) == n
    finally:
        counter.close()


def test_bad_tokenizer_file(tmp_path: Path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(RequestError, match="is not a tokenizer.json"):
        LocalTokenizer(bad)
