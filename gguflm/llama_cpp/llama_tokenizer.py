"""llama-cpp-python's tokenizer wrappers (``llama_cpp.llama_tokenizer``): a ``Llama``'s vocabulary
behind ``tokenize``/``detokenize`` (bytes) and ``encode``/``decode`` (str)."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gguflm.llama_cpp.llama import Llama

__all__ = ["BaseLlamaTokenizer", "LlamaTokenizer"]


class BaseLlamaTokenizer(abc.ABC):
    @abc.abstractmethod
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]: ...

    @abc.abstractmethod
    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes: ...


class LlamaTokenizer(BaseLlamaTokenizer):
    """The vocabulary of ``llama``."""

    def __init__(self, llama: Llama):
        self._llama = llama

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return self._llama.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        return self._llama.detokenize(tokens, special=special)

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos=add_bos, special=special)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")

    @classmethod
    def from_ggml_file(cls, path: str) -> LlamaTokenizer:
        from gguflm.llama_cpp.llama import Llama

        return cls(Llama(path, vocab_only=True))
