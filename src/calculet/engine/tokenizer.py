"""The calbin's tokenizer with its BOS policy and special ids (no torch, no transformers)."""

from __future__ import annotations

from pathlib import Path

from calculet.calbin.manifest import TokenizerInfo
from calculet.runtime.heap import trim_heap


class TextTokenizer:
    def __init__(self, tokenizer_file: str | Path, info: TokenizerInfo):
        from tokenizers import Tokenizer

        self.info = info
        self._tok = Tokenizer.from_file(str(tokenizer_file))
        trim_heap()  # parsing a 262k-token tokenizer.json leaves ~200 MB of freed heap resident
        self.eos_ids = frozenset(info.eos_token_ids)

    @classmethod
    def from_program(cls, program) -> "TextTokenizer":
        info = program.manifest.tokenizer
        return cls(program.path / info.file, info)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_bos is None:
            add_bos = self.info.add_bos_token
        if add_bos and self.info.bos_token_id is not None:
            ids = [self.info.bos_token_id] + ids
        return ids

    def encode_prompt(self, text: str) -> list[int]:
        """Encode a user prompt; an empty one (no tokens besides BOS) is a request error."""
        from calculet.errors import RequestError

        ids = self.encode(text, add_bos=False)
        if not ids:
            raise RequestError("empty_prompt", "the prompt is empty; give at least one token of text")
        return self.encode(text)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def pieces(self) -> list[str]:
        """Every entry of the vocabulary (added tokens included) as the tokenizer writes it."""
        return list(self._tok.get_vocab(with_added_tokens=True))

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size
