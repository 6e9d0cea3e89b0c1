"""Prompts of an exact token length, counted with the target's own tokenizer.

Two counters: the server's `/tokenize` endpoint (llama.cpp, vLLM and Calculet have one) or a local
`tokenizer.json`. Both count the text alone, without BOS or other special tokens; the server's
`usage.prompt_tokens` (recorded per request) may add those and a chat template.

Each prompt is a different seeded sequence of common words, so no two requests share a prefix and a
server's prompt cache cannot skip the prefill. A prompt is cut to the longest word prefix that fits,
then completed to the exact count with short words or single letters.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Protocol

import httpx

from calculet.errors import RequestError

_WORDS = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book eye "
    "job word business issue side kind head house service friend father power hour game line end "
    "member law car city community name president team minute idea kid body information back parent "
    "face others level office door health person art war history party result change morning reason "
    "research girl guy moment air teacher force education river garden music light paper window "
    "table stone field cloud bread horse market letter village bridge summer winter island forest"
).split()
_FILLERS = ("a", "I", "x", "o", "e", "s", "t", "n", "d", "y")


class TokenCounter(Protocol):
    source: str

    def count(self, text: str) -> int: ...


class LocalTokenizer:
    """Counts with a Hugging Face `tokenizer.json` (the `tokenizers` library)."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises a bare Exception on a bad file
            raise RequestError("bad_tokenizer", f"{path} is not a tokenizer.json: {exc}") from None
        self.source = f"tokenizer.json ({path})"

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


class RemoteTokenizer:
    """Counts with the server's `/tokenize` (tried at the root, then under /v1)."""

    def __init__(self, base_url: str, model: str, headers: dict[str, str] | None = None,
                 timeout_s: float = 30.0):
        self._client = httpx.Client(timeout=timeout_s, headers=headers or {})
        self._model = model
        self._url = self._find_endpoint(base_url.rstrip("/"))
        self.source = f"server {self._url}"

    def _post(self, url: str, text: str) -> httpx.Response:
        body = {"model": self._model, "content": text, "prompt": text,
                "add_special": False, "add_special_tokens": False}
        return self._client.post(url, json=body)

    def _find_endpoint(self, base: str) -> str:
        tried = []
        for url in (base + "/tokenize", base + "/v1/tokenize"):
            try:
                response = self._post(url, "hello")
            except httpx.HTTPError as exc:
                raise RequestError("server_unreachable", f"cannot reach {url}: {exc}") from None
            if response.status_code == 200:
                return url
            tried.append(f"{url} → HTTP {response.status_code}")
        raise RequestError(
            "no_tokenizer",
            f"the server has no usable tokenize endpoint ({'; '.join(tried)}); "
            "give --tokenizer PATH/tokenizer.json to count tokens locally",
        )

    def count(self, text: str) -> int:
        response = self._post(self._url, text)
        if response.status_code != 200:
            raise RequestError("tokenize_failed", f"{self._url} answered HTTP {response.status_code}: "
                               f"{response.text[:200]}")
        data = response.json()
        if isinstance(data.get("count"), int):
            return data["count"]
        if isinstance(data.get("tokens"), list):
            return len(data["tokens"])
        raise RequestError("tokenize_failed", f"{self._url} gave neither `count` nor `tokens`: {str(data)[:200]}")

    def close(self) -> None:
        self._client.close()


def exact_prompt(counter: TokenCounter, n_tokens: int, rng: random.Random) -> str:
    """A fresh random text of exactly `n_tokens` tokens by `counter`."""
    if n_tokens < 1:
        raise ValueError(f"a prompt needs at least one token, got {n_tokens}")
    words: list[str] = []

    def text(k: int) -> str:
        return " ".join(words[:k])

    # Grow a word sequence until it holds more than n tokens.
    while True:
        words.extend(rng.choice(_WORDS) for _ in range(max(8, n_tokens - len(words) // 2)))
        if counter.count(text(len(words))) > n_tokens:
            break
    # Longest word prefix with at most n tokens (counts grow with k; one word adds ≥ 1 token).
    lo, hi = 0, len(words)  # count(lo) ≤ n < count(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if counter.count(text(mid)) <= n_tokens:
            lo = mid
        else:
            hi = mid
    prompt = text(lo)
    have = counter.count(prompt) if lo else 0
    # Top up with short words; each usually costs one token.
    attempts = 0
    while have < n_tokens:
        attempts += 1
        if attempts > 4 * n_tokens + 64:
            raise RequestError("prompt_length", f"cannot make a prompt of exactly {n_tokens} tokens "
                               f"with {counter.source} (stuck at {have})")
        for filler in (rng.choice(_WORDS), *rng.sample(_FILLERS, len(_FILLERS))):
            candidate = f"{prompt} {filler}" if prompt else filler
            count = counter.count(candidate)
            if count <= n_tokens:
                prompt, have = candidate, count
                break
        else:
            # No filler fits: the tokenizer merges across spaces; drop the last word and retry.
            prompt = prompt.rsplit(" ", 1)[0] if " " in prompt else ""
            have = counter.count(prompt) if prompt else 0
    return prompt
