"""Request bodies -> prompt token ids and a validated GenerationRequest for the engine.

A body becomes the public `SamplingParams` (fields left out keep its defaults), and
`SamplingParams.to_request` is the one mapping onto the engine's request, shared with `calculet.LLM`
and `calculet run`.
"""

from __future__ import annotations

from calculet.engine.params import SamplingParams
from calculet.engine.requests import MAX_LOGPROBS, GenerationRequest
from calculet.errors import RequestError
from calculet.server.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, _Sampling

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "n", "min_tokens", "stop_token_ids")


def check_model(requested: str | None, served: str) -> None:
    if requested is not None and requested != served:
        raise RequestError("model_not_found", f"model {requested!r} does not exist here; this server serves {served!r} "
                           f"(GET /v1/models)")


def sampling_params(body: _Sampling, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    """max_tokens None: whatever fits in the context."""
    given = {k: getattr(body, k) for k in SAMPLING_FIELDS if getattr(body, k) is not None}
    return SamplingParams(max_tokens=max_tokens, logprobs=logprobs, stop=body.stop or (), ignore_eos=body.ignore_eos,
                          **given)


def completion_prompt(body: CompletionRequest, tokenizer) -> list[int]:
    if isinstance(body.prompt, str):
        return tokenizer.encode_prompt(body.prompt)
    if not body.prompt:
        raise RequestError("empty_prompt", "prompt is an empty list of token ids; give at least one token")
    return list(body.prompt)


def chat_messages(messages: list[ChatMessage]) -> list[dict]:
    """OpenAI messages -> plain dicts for the template; content parts must be text."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise RequestError("unsupported_content", f"messages.{i}.content: part type {part.type!r} is not "
                                       f"supported; allowed: text parts")
                texts.append(part.text)
            content = "".join(texts)
        msg = {"role": m.role, "content": content if content is not None else ""}
        if m.name is not None:
            msg["name"] = m.name
        out.append(msg)
    return out


def chat_chars(messages: list[ChatMessage]) -> int:
    """Characters of text in the messages (what the template will put into the prompt, less its markup)."""
    total = 0
    for m in messages:
        if isinstance(m.content, list):
            total += sum(len(part.text or "") for part in m.content)
        else:
            total += len(m.content or "")
        total += len(m.name or "")
    return total


def chat_prompt(messages: list[ChatMessage], model) -> list[int]:
    if model.chat is None:
        raise RequestError("no_chat_template", f"chat completions need a chat template: {model.chat_problem}")
    return model.chat.encode(chat_messages(messages))


def generation_request(body: _Sampling, prompt_ids: list[int], max_tokens: int | None, logprobs: int | None,
                       context: int, timeout_s: float | None) -> GenerationRequest:
    return sampling_params(body, max_tokens, logprobs).to_request(prompt_ids, context, timeout_s)


def completion_request(body: CompletionRequest, prompt_ids: list[int], context: int, timeout_s) -> GenerationRequest:
    if body.echo and body.logprobs is not None:
        raise RequestError("unsupported_parameter", "echo with logprobs needs the prompt's logprobs, which the compiled "
                           "prefill graphs do not produce; use echo or logprobs, not both")
    return generation_request(body, prompt_ids, body.max_tokens, body.logprobs, context, timeout_s)


def chat_request(body: ChatCompletionRequest, prompt_ids: list[int], context: int, timeout_s,
                 turn_end_ids: tuple[int, ...] = ()) -> GenerationRequest:
    """`turn_end_ids`: the chat template's end-of-turn tokens, which end the answer like EOS does
    (unless `ignore_eos`)."""
    if body.top_logprobs is not None and not body.logprobs:
        raise RequestError("invalid_parameter", f"top_logprobs={body.top_logprobs} needs logprobs=true")
    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= MAX_LOGPROBS:
        raise RequestError("invalid_parameter", f"top_logprobs={body.top_logprobs} is out of range; allowed: "
                           f"0 <= top_logprobs <= {MAX_LOGPROBS}")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    max_tokens = body.max_tokens
    if body.max_completion_tokens is not None:
        if body.max_completion_tokens < 1:
            raise RequestError("invalid_parameter", f"max_completion_tokens={body.max_completion_tokens} is out of range; "
                               f"allowed: max_completion_tokens >= 1")
        max_tokens = body.max_completion_tokens
    request = generation_request(body, prompt_ids, max_tokens, logprobs, context, timeout_s)
    extra = tuple(t for t in turn_end_ids if t not in request.stop_token_ids)
    if extra and not body.ignore_eos:
        from dataclasses import replace
        request = replace(request, stop_token_ids=request.stop_token_ids + extra)
    return request
