"""HybriDNA's tokenizer as llama.cpp runs it (``llm_tokenizer_hybriddna_session``): byte-level BPE,
except between ``<dna>`` and ``</dna>`` in a raw fragment, where the sequence (upper-cased) is
cut into 6-mers, the last padded with ``A``, each the k-mer token of that text or ``<oov>``.

K-mer tokens are stored with the marker U+E000 appended (keeping them apart from BPE tokens of
the same letters); lookups keep it, the tokens after ``<oov>`` render without it.
"""

from __future__ import annotations

from collections.abc import Callable

from gguflm._ext import tokenize as _tk
from gguflm.tokenizers.engine import TextEngine

KMER_MARKER = "\ue000".encode()
_K = 6
_OPEN, _CLOSE = b"<dna>", b"</dna>"


def strip_markers(texts: list[bytes], strs: list[str], oov: int | None) -> None:
    """Drop the marker from the texts of the tokens after ``<oov>`` (in place)."""
    if oov is None:
        return
    for tok in range(oov + 1, len(texts)):
        if len(texts[tok]) > len(KMER_MARKER) and texts[tok].endswith(KMER_MARKER):
            texts[tok] = texts[tok][:-len(KMER_MARKER)]
            strs[tok] = texts[tok].decode("utf-8", "surrogateescape")


class DnaEngine(TextEngine):
    """The BPE engine ``bpe`` with the DNA spans; plain BPE where the tags or ``<oov>`` are no
    tokens."""

    def __init__(self, bpe: _tk.BpeEngine, token_id: Callable[[bytes], int | None]):
        self._bpe = bpe
        self._token_id = token_id
        self._ids = [token_id(t) for t in (_OPEN, _CLOSE, b"<oov>")]
        self._plain = _tk.SpecialMatcher([], [], [], [])

    def _text(self, text: bytes) -> list[int]:
        return self._bpe.encode(text, self._plain.partition(text)) if text else []

    def encode_raw(self, text: bytes, out: list[int]) -> None:
        if None in self._ids:
            out += self._text(text)
            return
        begin, end, oov = self._ids
        pos = 0
        while pos < len(text):
            start = text.find(_OPEN, pos)
            if start < 0:
                out += self._text(text[pos:])
                return
            out += self._text(text[pos:start])
            out.append(begin)
            content = start + len(_OPEN)
            stop = text.find(_CLOSE, content)
            seq = text[content:len(text) if stop < 0 else stop]
            seq = bytes(c - 32 if 0x61 <= c <= 0x7A else c for c in seq)
            for i in range(0, len(seq), _K):
                kmer = seq[i:i + _K].ljust(_K, b"A")
                tok = self._token_id(kmer + KMER_MARKER)
                out.append(oov if tok is None else tok)
            if stop < 0:
                return
            out.append(end)
            pos = stop + len(_CLOSE)
