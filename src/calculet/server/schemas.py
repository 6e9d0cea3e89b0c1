"""Request bodies of the HTTP API, as typed models (they also make the OpenAPI document).

Types are checked strictly (a string is not a number, `true` is not an integer); fields this server
does not know are ignored, as OpenAI does. Value ranges are checked where they are defined: the
sampling ranges in `SamplingParams`, the context and lane limits in the engine. Every string is
`Text`: valid Unicode, so a lone UTF-16 surrogate (`"\\ud800"` in the JSON, which Python's JSON
parser accepts) is a 400 naming the field instead of a failure inside the tokenizer.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def _valid_unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"holds a lone UTF-16 surrogate ({text[exc.start]!r} at character {exc.start}); "
                         f"text must be valid Unicode (surrogates only in pairs)") from None
    return text


Text = Annotated[str, AfterValidator(_valid_unicode)]
ROLES = ("system", "developer", "user", "assistant", "tool")


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    model: Text | None = Field(None, description="must name the served model when given")
    temperature: float | None = Field(None, description="0 = greedy; 0..100, default 1")
    top_p: float | None = Field(None, description="(0, 1], default 1")
    top_k: int | None = Field(None, description=">= 0, 0 = off")
    min_p: float | None = Field(None, description="[0, 1], default 0")
    seed: int | None = Field(None, description="0 .. 2^63-1; the same seed gives the same output")
    stop: Text | list[Text] | None = Field(None, description="up to 16 stop strings, never included in the output")
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = Field(None, description="[-2, 2]")
    frequency_penalty: float | None = Field(None, description="[-2, 2]")
    repetition_penalty: float | None = Field(None, description="(0, 10], 1 = off")
    n: int | None = Field(None, description="choices to generate, one lane each")
    ignore_eos: bool = Field(False, description="keep generating past EOS (benchmarking)")
    min_tokens: int | None = Field(None, description="EOS and stop_token_ids cannot end the output before this")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Text | None = None
    return_token_ids: bool = Field(False, description="extension: include the generated token ids per choice")


class CompletionRequest(_Sampling):
    prompt: Text | list[int] = Field(..., description="text, or token ids")
    max_tokens: int | None = Field(None, description="default: whatever fits in the context")
    logprobs: int | None = Field(None, description="0..20 alternatives per token")
    echo: bool = False


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Text
    text: Text | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal[ROLES]
    content: Text | list[ContentPart] | None = None
    name: Text | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = Field(None, description="takes precedence over max_tokens")
    logprobs: bool = False
    top_logprobs: int | None = Field(None, description="0..20, needs logprobs=true")


class TokenizeRequest(_Body):
    model: Text | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(_Body):
    model: Text | None = None
    tokens: list[int]
