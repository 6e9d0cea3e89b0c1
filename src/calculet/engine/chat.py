"""Chat prompts: the calbin's chat template (Jinja, as Hugging Face tokenizers ship it) rendered in a
sandbox with `messages`, `add_generation_prompt=True`, `bos_token` and `eos_token`.

    template = ChatTemplate.from_tokenizer(tokenizer)     # None when the model has no template
    template = ChatTemplate.choose(tokenizer, "--chat-template value or None", model_type)
    prompt_ids = template.encode([{"role": "user", "content": "Hi"}])
    template.stop_token_ids                               # ids that end a turn (a built-in's end-of-turn token)
"""

from __future__ import annotations

import json
from datetime import datetime

from calculet.engine import chat_templates
from calculet.errors import ModelError, RequestError


def _raise(message: str):
    raise RequestError("chat_template_error", f"the chat template rejected the messages: {message}")


def _tojson(value, indent=None, ensure_ascii=False):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


class ChatTemplate:
    def __init__(self, source: str, tokenizer, end_of_turn: str = "", name: str = "tokenizer"):
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.tokenizer = tokenizer
        self.name = name
        eot = tokenizer.token_to_id(end_of_turn) if end_of_turn else None
        self.stop_token_ids: tuple[int, ...] = (eot,) if eot is not None else ()
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ModelError("bad_chat_template", f"the calbin's chat template does not parse: {exc}") from None
        info = tokenizer.info
        self.bos_token = self._token_text(info.bos_token_id)
        self.eos_token = self._token_text(info.eos_token_ids[0] if info.eos_token_ids else None)

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "ChatTemplate | None":
        source = tokenizer.info.chat_template
        return cls(source, tokenizer) if source else None

    @classmethod
    def choose(cls, tokenizer, choice: str | None, model_type: str) -> "ChatTemplate | None":
        """`choice` (a built-in name or a Jinja file) wins; else the tokenizer's own template; else the
        built-in for the model's family (Gemma's for the default model); else None."""
        if choice:
            builtin = chat_templates.resolve(choice)
            return cls(builtin.source, tokenizer, builtin.end_of_turn, builtin.name)
        own = cls.from_tokenizer(tokenizer)
        if own is not None:
            return own
        name = chat_templates.DEFAULT_FOR_MODEL_TYPE.get(model_type)
        if name is None:
            return None
        builtin = chat_templates.BUILTIN[name]
        return cls(builtin.source, tokenizer, builtin.end_of_turn, builtin.name)

    def _token_text(self, token_id: int | None) -> str:
        if token_id is None:
            return ""
        return self.tokenizer.id_to_token(token_id) or ""

    def render(self, messages: list[dict]) -> str:
        import jinja2

        try:
            return self._template.render(messages=messages, add_generation_prompt=True,
                                         bos_token=self.bos_token, eos_token=self.eos_token)
        except RequestError:
            raise
        except jinja2.TemplateError as exc:
            raise RequestError("chat_template_error", f"the chat template could not render these messages: {exc}") from None
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            raise RequestError("chat_template_error", f"the chat template could not render these messages: "
                               f"{type(exc).__name__}: {exc}") from None

    def encode(self, messages: list[dict]) -> list[int]:
        """Render and tokenize. BOS follows the tokenizer's policy unless the template wrote it."""
        text = self.render(messages)
        if not text:
            raise RequestError("empty_prompt", "the chat template rendered an empty prompt")
        has_bos = bool(self.bos_token) and text.startswith(self.bos_token)
        return self.tokenizer.encode(text, add_bos=False if has_bos else None)
