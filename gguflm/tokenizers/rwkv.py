"""RWKV's greedy tokenizer as llama.cpp runs it (``llm_tokenizer_rwkv``).

Token texts are stored escaped (``\\t``, ``\\n``, ``\\r``, ``\\xHH``, a backslash before any other
character stands for that character) and may be any bytes once unescaped. The text is cut from
the left into the longest token it continues with; a byte that starts no token becomes the
unknown token (RWKV vocabularies have every byte). Tokens render as their unescaped bytes.
"""

from __future__ import annotations

from gguflm._ext import tokenize as _tk


def unescape(text: bytes) -> bytes:
    """llama_unescape_rwkv_token: the bytes of an escaped token text (hex digits read as
    llama.cpp reads them: lowercase letters and digits)."""
    out = bytearray()
    escaping, hex_left, acc = False, 0, 0
    for c in text:
        if hex_left:
            acc = ((acc << 4) + (c - 0x61 + 10 if c >= 0x61 else c - 0x30)) & 0xFF
            hex_left -= 1
            if not hex_left:
                out.append(acc)
                acc = 0
        elif escaping:
            out += {0x74: b"\t", 0x6E: b"\n", 0x72: b"\r"}.get(c, b"" if c == 0x78 else bytes([c]))
            hex_left = 2 if c == 0x78 else 0
            escaping = False
        elif c == 0x5C:
            escaping = True
        else:
            out.append(c)
    return bytes(out)


def build_engine(texts: list[bytes], unk: int | None) -> _tk.RwkvEngine:
    """A greedy engine over the unescaped token texts; ``unk`` None gives -1, as llama.cpp's null token."""
    return _tk.RwkvEngine([unescape(t) for t in texts], -1 if unk is None else unk)
