"""Chat templates: rendered in a sandbox with the generation prompt, BOS added once."""

from __future__ import annotations

from dataclasses import replace

import pytest

from calculet.engine.chat import ChatTemplate
from calculet.engine.tokenizer import TextTokenizer
from calculet.errors import ModelError, RequestError
from calculet.runtime.program import Program


@pytest.fixture(scope="module")
def tokenizer(tiny_calbin):
    return TextTokenizer.from_program(Program(tiny_calbin("llama")))


def with_template(tokenizer, source):
    tok = TextTokenizer.__new__(TextTokenizer)
    tok.__dict__.update(tokenizer.__dict__)
    tok.info = replace(tokenizer.info, chat_template=source)
    return tok


def test_tiny_template_renders_generation_prompt(tokenizer):
    chat = ChatTemplate.from_tokenizer(tokenizer)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert chat.render(messages) == "<system>be brief\n<user>hi\n<assistant>"
    ids = chat.encode(messages)
    assert ids[0] == tokenizer.info.bos_token_id and ids.count(tokenizer.info.bos_token_id) == 1
    assert tokenizer.decode(ids) == "<system>be brief\n<user>hi\n<assistant>"


def test_template_that_writes_bos_gets_no_second_one(tokenizer):
    chat = ChatTemplate.from_tokenizer(with_template(tokenizer, "{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}"))
    ids = chat.encode([{"role": "user", "content": "hi"}])
    assert ids.count(tokenizer.info.bos_token_id) == 1 and ids[0] == tokenizer.info.bos_token_id
    assert ids[-1] in tokenizer.eos_ids


def test_no_template_is_none_and_bad_ones_are_clear(tokenizer):
    assert ChatTemplate.from_tokenizer(with_template(tokenizer, None)) is None
    with pytest.raises(ModelError, match="does not parse"):
        ChatTemplate.from_tokenizer(with_template(tokenizer, "{% for %}"))
    strict = ChatTemplate.from_tokenizer(with_template(tokenizer, "{{ raise_exception('roles must alternate') }}"))
    with pytest.raises(RequestError, match="roles must alternate"):
        strict.render([{"role": "user", "content": "x"}])


def test_sandbox_blocks_attribute_escapes(tokenizer):
    evil = ChatTemplate.from_tokenizer(with_template(tokenizer, "{{ messages.__class__.__mro__[1].__subclasses__() }}"))
    with pytest.raises(RequestError):
        evil.render([{"role": "user", "content": "x"}])
