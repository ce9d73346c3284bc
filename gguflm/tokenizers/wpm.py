"""WordPiece as llama.cpp runs it (``llm_tokenizer_wpm_session``).

The text is normalized (NFD and accent marks dropped when ``strip_accents``, lowercased when
``lowercase``, control characters dropped) and split at white space, punctuation, ASCII symbols and
CJK ideographs. Each word, prefixed with U+2581, is cut greedily into the longest tokens from the
left; a word with an unmatched rest becomes the unknown token.
"""

from __future__ import annotations

from gguflm._ext import tokenize as _tk


def build_engine(table: _tk.TokenTable, unk: int | None, max_token_len: int, lowercase: bool,
                 strip_accents: bool) -> _tk.WpmEngine:
    """A WordPiece engine; an unknown word gives -1 when the vocabulary has no unknown token."""
    return _tk.WpmEngine(table, -1 if unk is None else unk, max_token_len, lowercase, strip_accents)
