"""Built-in chat templates, for models whose tokenizer ships none (the default Gemma 3 270M GGUF is
a base model with no template) or when the user picks one with `--chat-template NAME|FILE`.

Each is a Jinja template in the Hugging Face convention (`messages`, `add_generation_prompt`,
`bos_token`) written here from the published turn formats, plus the token that ends a turn, which
becomes a stop token so a chat answer ends where the model closes its turn:

    gemma    <start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n     (system text joins the first user turn)
    chatml   <|im_start|>{role}\n{text}<|im_end|>\n ... <|im_start|>assistant\n   (Qwen 2/2.5/3 use this format)
    llama3   <|start_header_id|>{role}<|end_header_id|>\n\n{text}<|eot_id|> ... <|start_header_id|>assistant<|end_header_id|>\n\n
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from calculet.errors import RequestError


@dataclass(frozen=True)
class BuiltinTemplate:
    name: str
    source: str          # Jinja
    end_of_turn: str     # token text that closes a turn (a stop token when the vocabulary has it)


_GEMMA = (
    "{{ bos_token }}"
    "{% set ns = namespace(system='') %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.system = ns.system + m['content'] + '\n\n' %}"
    "{% else %}"
    "{% set role = 'model' if m['role'] == 'assistant' else 'user' %}"
    "<start_of_turn>{{ role }}\n"
    "{% if role == 'user' and ns.system %}{{ ns.system }}{% set ns.system = '' %}{% endif %}"
    "{{ m['content'] | trim }}<end_of_turn>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

_CHATML = (
    "{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_LLAMA3 = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

BUILTIN: dict[str, BuiltinTemplate] = {
    t.name: t for t in (
        BuiltinTemplate("gemma", _GEMMA, "<end_of_turn>"),
        BuiltinTemplate("chatml", _CHATML, "<|im_end|>"),
        BuiltinTemplate("qwen", _CHATML, "<|im_end|>"),
        BuiltinTemplate("llama3", _LLAMA3, "<|eot_id|>"),
    )
}

# model_type -> the built-in used when the tokenizer has no template of its own
DEFAULT_FOR_MODEL_TYPE = {"gemma3_text": "gemma", "gemma3": "gemma", "qwen2": "qwen", "qwen3": "qwen",
                          "qwen3_moe": "qwen", "llama": "llama3"}


def resolve(choice: str) -> BuiltinTemplate:
    """`--chat-template NAME|FILE`: a built-in by name, or a Jinja file (no end-of-turn stop token)."""
    if choice in BUILTIN:
        return BUILTIN[choice]
    path = Path(choice)
    if path.is_file():
        try:
            return BuiltinTemplate(path.name, path.read_text(), "")
        except (OSError, UnicodeDecodeError) as exc:
            raise RequestError("bad_option", f"--chat-template {choice}: cannot read the file ({exc})") from None
    raise RequestError("bad_option", f"--chat-template {choice!r} is neither a built-in template nor a file; "
                       f"built-ins: {', '.join(BUILTIN)}")
