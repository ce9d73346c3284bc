"""The quantize/dequantize row APIs (and the dot built on them) on random blocks of every type.

Must hold: for well-formed shapes, every format dequantizes any bytes and quantizes any float32
rows (finite or not; with or without importance weights) to arrays of the documented shape and
dtype; the types ggml refuses to quantize without an importance matrix raise ValueError then
(their documented contract); no read or write outside the given buffers (the sanitizer build).
"""

from __future__ import annotations

import numpy as np

from gguflm import quants

from . import Check

FORMATS = quants.formats()
NEEDS_IMATRIX = {"IQ2_XXS", "IQ2_XS", "IQ1_S"}


def _cycled(payload: bytes, n: int) -> bytes:
    """``n`` bytes: the payload repeated (zeros when it is empty)."""
    if not payload:
        return bytes(n)
    return (payload * (n // len(payload) + 1))[:n]


def quants_rows() -> Check:
    """Input: format, flags (bits 0-1 rows - 1, bits 2-3 blocks - 1, bit 4 importance weights,
    bit 5 finite floats only), then the bytes the blocks and floats are cut from."""
    for fmt in FORMATS:    # the first use builds a format's search tables (seconds, once)
        x = np.ones((1, fmt.block_size), np.float32)
        fmt.quantize(x, imatrix=x[0])
        if fmt.name not in NEEDS_IMATRIX:
            fmt.quantize(x)

    def check(data: bytes) -> None:
        if len(data) < 2:
            return
        fmt, flags, payload = FORMATS[data[0] % len(FORMATS)], data[1], data[2:]
        rows, blocks = (flags & 3) + 1, ((flags >> 2) & 3) + 1
        n = blocks * fmt.block_size
        blob = np.frombuffer(_cycled(payload, rows * fmt.row_bytes(n)), np.uint8).reshape(rows, -1)
        out = fmt.dequantize(blob)
        assert out.shape == (rows, n) and out.dtype == np.float32

        x = np.frombuffer(_cycled(payload, rows * n * 4), "<f4").reshape(rows, n).astype(np.float32)
        if flags & 32:
            x = np.nan_to_num(x, nan=0.0, posinf=1e30, neginf=-1e30)
        imatrix = None
        if flags & 16:
            imatrix = np.abs(np.nan_to_num(x[0], nan=1.0, posinf=1e30, neginf=1e30))
        try:
            q = fmt.quantize(x, imatrix=imatrix)
        except ValueError:
            assert imatrix is None and fmt.name in NEEDS_IMATRIX
            return
        assert q.shape == blob.shape and q.dtype == np.uint8
        assert fmt.dequantize(q).shape == (rows, n)
        if fmt.vec_dot_type is not None:
            assert isinstance(fmt.dot(q[0], x[0]), float)

    return check
