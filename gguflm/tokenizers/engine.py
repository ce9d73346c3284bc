"""What the tokenizers written in Python share with the compiled engines of
:mod:`gguflm._ext.tokenize`: ``encode(text, fragments)``, special-token fragments passed through."""

from __future__ import annotations

from gguflm._ext import tokenize as _tk


class TextEngine:
    """An engine whose subclass tokenizes each raw fragment (:meth:`encode_raw`)."""

    def encode(self, text: bytes, fragments: _tk.Fragments) -> list[int]:
        """Token ids of ``text`` split into ``fragments`` (SpecialMatcher.partition)."""
        out: list[int] = []
        for tok, off, length in fragments:
            if tok >= 0:
                out.append(tok)
            else:
                self.encode_raw(text[off:off + length], out)
        return out

    def encode_raw(self, text: bytes, out: list[int]) -> None:
        """Append the ids of one raw fragment to ``out``."""
        raise NotImplementedError
