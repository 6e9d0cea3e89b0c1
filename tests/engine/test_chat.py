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


def test_builtin_gemma_template_folds_the_system_text_into_the_first_user_turn(tokenizer):
    chat = ChatTemplate.choose(with_template(tokenizer, None), "gemma", "llama")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    assert chat.render(messages) == ("<bos><start_of_turn>user\nbe brief\n\nhi<end_of_turn>\n"
                                     "<start_of_turn>model\nhello<end_of_turn>\n"
                                     "<start_of_turn>user\nagain<end_of_turn>\n<start_of_turn>model\n")
    assert chat.stop_token_ids == ()   # the tiny vocabulary has no <end_of_turn> token


def test_builtin_chatml_and_llama3_render_their_turn_formats(tokenizer):
    plain = with_template(tokenizer, None)
    messages = [{"role": "user", "content": "hi"}]
    assert ChatTemplate.choose(plain, "chatml", "llama").render(messages) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert ChatTemplate.choose(plain, "llama3", "llama").render(messages) == \
        "<bos><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"


def test_choose_prefers_the_option_then_the_models_own_then_the_familys_builtin(tokenizer, tmp_path):
    own = ChatTemplate.choose(tokenizer, None, "gemma3_text")
    assert own.name == "tokenizer" and own.render([{"role": "user", "content": "x"}]) == "<user>x\n<assistant>"
    assert ChatTemplate.choose(tokenizer, "chatml", "gemma3_text").name == "chatml"
    assert ChatTemplate.choose(with_template(tokenizer, None), None, "gemma3_text").name == "gemma"
    assert ChatTemplate.choose(with_template(tokenizer, None), None, "qwen3").name == "qwen"
    assert ChatTemplate.choose(with_template(tokenizer, None), None, "mistral") is None
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    assert ChatTemplate.choose(tokenizer, str(f), "llama").render([{"role": "user", "content": "q"}]) == "[q]"
    with pytest.raises(RequestError, match="built-ins: gemma, chatml, qwen, llama3"):
        ChatTemplate.choose(tokenizer, "nope", "llama")


def test_turn_end_token_becomes_a_stop_token_for_chat_requests():
    from calculet.server.params import chat_request
    from calculet.server.schemas import ChatCompletionRequest

    body = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=4, stop_token_ids=[7])
    assert chat_request(body, [1, 2], 64, None, (106,)).stop_token_ids == (7, 106)
    body = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=4, ignore_eos=True)
    assert chat_request(body, [1, 2], 64, None, (106,)).stop_token_ids == ()
