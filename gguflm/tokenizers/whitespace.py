"""The ``whitespace`` tokenizer as llama.cpp runs it (``llm_tokenizer_whitespace_session``): each
raw fragment is cut at white-space code points, which are dropped, and every piece between them
(lower-cased when the normalizer says so) is tokenized by BPE on its own, usually with the
``whitespace`` pre-tokenizer (``\\S+``, raw UTF-8 symbols)."""

from __future__ import annotations

from gguflm._ext import tokenize as _tk
from gguflm.tokenizers.engine import TextEngine


class WhitespaceEngine(TextEngine):
    """The BPE engine ``bpe`` run on the white-space-free segments."""

    def __init__(self, bpe: _tk.BpeEngine, lowercase: bool):
        self._bpe = bpe
        self._lowercase = lowercase
        self._plain = _tk.SpecialMatcher([], [], [], [])

    def encode_raw(self, text: bytes, out: list[int]) -> None:
        segment: list[int] = []
        for cpt in _tk.CodepointText(text).codepoints() + [0x20]:   # a space flushes the last
            if _tk.cpt_flags(cpt) & _tk.FLAG_WHITESPACE:
                if segment:
                    raw = "".join(map(chr, segment)).encode("utf-8", "surrogatepass")
                    out += self._bpe.encode(raw, self._plain.partition(raw))
                    segment = []
            else:
                segment.append(_tk.cpt_tolower(cpt) if self._lowercase else cpt)
