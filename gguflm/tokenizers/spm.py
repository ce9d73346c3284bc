"""SentencePiece BPE as llama.cpp runs it (``llm_tokenizer_spm_session``).

Spaces are escaped as U+2581 (with one prepended at the start of the text and after each special
token when ``add_space_prefix``); the text starts as one symbol per UTF-8 character; the adjacent
pair whose concatenation is the highest-scoring token merges first (leftmost on ties) until no pair
forms a token; symbols that are not tokens fall back to byte tokens ``<0xXX>``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gguflm._ext import tokenize as _tk


def byte_token(token_id: Callable[[bytes], int | None], byte: int) -> int | None:
    """llama.cpp's byte_to_token for SPM: ``<0xXX>``, else the one-byte text itself."""
    tok = token_id(f"<0x{byte:02X}>".encode())
    return tok if tok is not None else token_id(bytes([byte]))


def build_engine(table: _tk.TokenTable, scores: np.ndarray, token_id: Callable[[bytes], int | None],
                 add_space_prefix: bool) -> _tk.SpmEngine:
    """An SPM engine over the vocabulary's token table and scores."""
    bytes_ = [byte_token(token_id, b) for b in range(256)]
    return _tk.SpmEngine(table, scores, [-1 if t is None else t for t in bytes_], add_space_prefix)
