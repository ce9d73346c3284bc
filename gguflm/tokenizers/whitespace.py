"""The ``whitespace`` tokenizer as llama.cpp runs it (``llm_tokenizer_whitespace_session``): each
raw fragment is cut at white-space code points, which are dropped, and every piece between them
(lower-cased when the normalizer says so) is tokenized by BPE on its own, usually with the
``whitespace`` pre-tokenizer (``\\S+``, raw UTF-8 symbols)."""

from __future__ import annotations

from gguflm._ext import tokenize as _tk


class WhitespaceEngine:
    """The BPE engine ``bpe`` run on the white-space-free segments; ``encode(text, fragments)``
    as the other engines."""

    def __init__(self, bpe: _tk.BpeEngine, lowercase: bool):
        self._bpe = bpe
        self._lowercase = lowercase
        self._plain = _tk.SpecialMatcher([], [], [], [])

    def encode(self, text: bytes, fragments: _tk.Fragments) -> list[int]:
        out: list[int] = []
        for tok, off, length in fragments:
            if tok >= 0:
                out.append(tok)
                continue
            segment: list[int] = []
            for cpt in _tk.CodepointText(text[off:off + length]).codepoints() + [0x20]:   # a space flushes the last
                if _tk.cpt_flags(cpt) & _tk.FLAG_WHITESPACE:
                    if segment:
                        raw = "".join(map(chr, segment)).encode("utf-8", "surrogatepass")
                        out += self._bpe.encode(raw, self._plain.partition(raw))
                        segment = []
                else:
                    segment.append(_tk.cpt_tolower(cpt) if self._lowercase else cpt)
        return out
