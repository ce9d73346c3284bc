"""PLaMo-2's tokenizer as llama.cpp runs it (``llm_tokenizer_plamo2``).

A Viterbi search over code points: from the end of the text back to its start, the best cost of
position i is the least of ``cost[i + len(t)] - round(score(t) * 1e4)`` over the vocabulary's
non-byte tokens t the text continues with there (longest first; ties keep the longer), and of one
unknown code point at a cost of 10^7, spelled by its UTF-8 byte tokens ``<0xXX>``. A leading
byte-order mark of each fragment is dropped. Tokens render as their text, byte tokens as their byte.
(llama.cpp walks a suffix table to find the tokens at each position; it finds the same ones.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gguflm._ext import tokenize as _tk
from gguflm.errors import VocabError
from gguflm.tokenizers.engine import TextEngine

_INVALID_SCORE = -20_000_000
_UNKNOWN_SCORE = -10_000_000
_BIG = 1 << 60


def byte_value(text: bytes) -> int | None:
    """The byte of a ``<0xXX>`` token text, or None."""
    if len(text) == 6 and text.startswith(b"<0x") and text.endswith(b">") and \
            all(chr(c) in "0123456789abcdefABCDEF" for c in text[3:5]):
        return int(text[3:5], 16)
    return None


def _score(score: float) -> int:
    """std::round(score * 1e4) as an int32 (halves away from zero; non-finite: invalid)."""
    x = float(score) * 1e4
    if not math.isfinite(x):
        return _INVALID_SCORE
    a = abs(x)
    r = math.floor(a)
    if a - r >= 0.5:
        r += 1
    return int(math.copysign(r, x))


class Plamo2Engine(TextEngine):
    """The search over one vocabulary."""

    def __init__(self, texts: Sequence[bytes], scores: np.ndarray, is_byte: Sequence[bool]):
        self._bytes = [-1] * 256
        self._pieces: dict[tuple[int, ...], tuple[int, int]] = {}   # code points -> (score, id)
        for tok, (text, byte) in enumerate(zip(texts, is_byte)):
            if byte:
                value = byte_value(text)
                if value is not None:
                    self._bytes[value] = tok
                continue
            self._pieces[tuple(_tk.CodepointText(text).codepoints())] = (_score(scores[tok]), tok)
        missing = [b for b in range(256) if self._bytes[b] < 0]
        if missing:
            raise VocabError(f"PLaMo-2 vocabulary without the byte token <0x{missing[0]:02X}>")
        self._max_len = max(map(len, self._pieces), default=0)

    def encode_raw(self, text: bytes, out: list[int]) -> None:
        cpts = _tk.CodepointText(text).codepoints()
        if cpts and cpts[0] == 0xFEFF:
            cpts = cpts[1:]
        n = len(cpts)
        cost = [_BIG] * n + [0]
        step: list[tuple[int, int]] = [(1, -1)] * n   # (length, token or -1: the code point's bytes)
        for i in range(n - 1, -1, -1):
            for length in range(min(self._max_len, n - i), 0, -1):
                found = self._pieces.get(tuple(cpts[i:i + length]))
                if found is None:
                    continue
                score, tok = found
                if score > _INVALID_SCORE and cost[i + length] - score < cost[i]:
                    cost[i], step[i] = cost[i + length] - score, (length, tok)
                if score == _UNKNOWN_SCORE:   # llama.cpp's table stops at a score equal to its sentinel's
                    break
            else:
                if cost[i + 1] - _UNKNOWN_SCORE < cost[i]:
                    cost[i], step[i] = cost[i + 1] - _UNKNOWN_SCORE, (1, -1)
        i = 0
        while i < n:
            length, tok = step[i]
            if tok >= 0:
                out.append(tok)
            else:
                out += [self._bytes[b] for b in chr(cpts[i]).encode("utf-8", "surrogatepass")]
            i += length
