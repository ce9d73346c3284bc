"""Unigram (``tokenizer.ggml.model`` = ``t5``) as llama.cpp runs it (``llm_tokenizer_ugm_session``).

The text is normalized first: user-defined token texts stay as they are, the longest prefix found
in the precompiled charsmap (SentencePiece's XOR-compressed double array plus NUL-terminated
replacements) is replaced, invalid UTF-8 becomes U+FFFD, and spaces become U+2581 (one prepended
with ``add_space_prefix``; runs merged with ``remove_extra_whitespaces``). Then a Viterbi pass over
byte offsets keeps the segmentation with the highest summed score (user-defined tokens score 0); a
code point no single token covers is the unknown token at the lowest score minus 10, and
consecutive unknown tokens merge into one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gguflm._ext import tokenize as _tk
from gguflm.errors import VocabError

CHARSMAP_KEY = "tokenizer.ggml.precompiled_charsmap"


def read_charsmap(value) -> bytes:
    """The precompiled charsmap blob, checked the way llama.cpp checks it."""
    if value is None:
        return b""
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or arr.dtype.itemsize != 1:
        raise VocabError(f"invalid gguf type for {CHARSMAP_KEY}: expected a byte array")
    blob = arr.astype(np.uint8).tobytes()
    if len(blob) < 4:
        raise VocabError(f"{CHARSMAP_KEY} is too small for its XCDA size header")
    if int.from_bytes(blob[:4], "little") + 4 >= len(blob):
        raise VocabError(f"{CHARSMAP_KEY}: the XCDA size runs past the end of the charsmap")
    return blob


def build_engine(texts: list[bytes], load_attrs: Sequence[int], attrs: Sequence[int],
                 scores: np.ndarray, unk: int | None, charsmap: bytes, add_space_prefix: bool,
                 remove_extra_whitespaces: bool) -> _tk.UgmEngine:
    """A unigram engine; ``load_attrs`` pick the tokens it can produce, ``attrs`` their scores."""
    return _tk.UgmEngine(texts, list(load_attrs), list(attrs), scores, -1 if unk is None else unk,
                         charsmap, add_space_prefix, remove_extra_whitespaces)
