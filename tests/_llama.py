"""llama.cpp itself (through llama-cpp-python's C bindings) as a test oracle, when installed.

``LlamaVocab(path)`` loads a GGUF file vocab-only and answers with llama.cpp's own tokenize,
token_to_piece and detokenize. Tests that need it skip when ``llama_cpp`` is not importable: it is a
reference peer, not a dependency.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import pytest

try:
    import llama_cpp.llama_cpp as L
except ImportError:  # pragma: no cover - depends on the environment
    L = None


@functools.cache
def _backend() -> None:
    L.llama_backend_init()
    # llama.cpp logs every load to stderr; keep the test output readable
    _backend.silence = L.llama_log_callback(lambda level, text, user: None)
    L.llama_log_set(_backend.silence, ctypes.c_void_p())


def require_llama() -> None:
    if L is None:
        pytest.skip("llama-cpp-python is not installed (reference peer for exactness checks)")
    _backend()


class LlamaVocab:
    """llama.cpp's vocabulary of a GGUF file."""

    def __init__(self, path: str | Path):
        require_llama()
        params = L.llama_model_default_params()
        params.vocab_only = True
        self._model = L.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise RuntimeError(f"llama.cpp cannot load {path}")
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_tokens = L.llama_vocab_n_tokens(self._vocab)

    def __del__(self):
        if getattr(self, "_model", None):
            L.llama_model_free(self._model)

    def tokenize(self, data: bytes, add_special: bool, parse_special: bool) -> list[int]:
        n = len(data) + 16
        while True:
            out = (ctypes.c_int32 * n)()
            k = L.llama_tokenize(self._vocab, data, len(data), out, n, add_special, parse_special)
            if k >= 0:
                return list(out[:k])
            n = -k

    def token_to_piece(self, tok: int, lstrip: int = 0, special: bool = False) -> bytes:
        n = 64
        while True:
            buf = ctypes.create_string_buffer(n)
            k = L.llama_token_to_piece(self._vocab, tok, buf, n, lstrip, special)
            if k >= 0:
                return buf.raw[:k]
            n = -k

    def detokenize(self, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
        arr = (ctypes.c_int32 * max(1, len(ids)))(*ids)
        n = 4 * len(ids) + 64
        while True:
            buf = ctypes.create_string_buffer(n)
            k = L.llama_detokenize(self._vocab, arr, len(ids), buf, n, remove_special,
                                   unparse_special)
            if k >= 0:
                return buf.raw[:k]
            n = -k

    def special_ids(self) -> dict[str, int | None]:
        def get(fn: str) -> int | None:
            tok = getattr(L, fn)(self._vocab)
            return None if tok < 0 else tok

        return {name: get(f"llama_vocab_{name}") for name in
                ("bos", "eos", "eot", "sep", "nl", "pad", "fim_pre", "fim_suf", "fim_mid",
                 "fim_pad", "fim_rep", "fim_sep")}

    def flags(self) -> dict[str, bool]:
        return {"add_bos": L.llama_vocab_get_add_bos(self._vocab),
                "add_eos": L.llama_vocab_get_add_eos(self._vocab)}

    def eog_ids(self) -> frozenset[int]:
        return frozenset(t for t in range(self.n_tokens) if L.llama_vocab_is_eog(self._vocab, t))

    def attr(self, tok: int) -> int:
        return L.llama_vocab_get_attr(self._vocab, tok)
