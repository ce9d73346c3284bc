"""Hypothesis strategies for property tests of quantization kernels.

``float_rows`` draws float32 rows whose 16-to-256-element stretches are each of an adversarial
kind (zeros, constants, one spike among small values, subnormals, huge or tiny magnitudes, mixed
signs, one-signed runs); ``quantized_blocks`` draws valid blocks of any format (finite scales,
consistent Q8_1 ``s`` and Q8_K ``bsums``), optionally with scales of +-1 so that every float
operation of a dot is exact; ``matmul_shapes`` draws (n_rows, n_in, n_tok) for a format.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from gguflm.ggml_types import GGMLType
from gguflm.quants import Format

KINDS = ("normal", "zeros", "constant", "spike", "subnormal", "huge", "tiny", "integers", "positive", "negative")

# byte offsets of the half-precision scale fields inside a block: (offset, role); "d" is a scale,
# "m" a signed min (Q4_1/Q5_1) or positive min (K-quants' dmin)
_HALF_FIELDS = {
    GGMLType.Q4_0: [(0, "d")], GGMLType.Q4_1: [(0, "d"), (2, "m")], GGMLType.Q5_0: [(0, "d")],
    GGMLType.Q5_1: [(0, "d"), (2, "m")], GGMLType.Q8_0: [(0, "d")], GGMLType.Q8_1: [(0, "d")],
    GGMLType.Q2_K: [(80, "d"), (82, "m")], GGMLType.Q3_K: [(108, "d")], GGMLType.Q4_K: [(0, "d"), (2, "m")],
    GGMLType.Q5_K: [(0, "d"), (2, "m")], GGMLType.Q6_K: [(208, "d")],
}


def _stretch(rng: np.random.Generator, kind: str, n: int, magnitude: float, max_magnitude: float) -> np.ndarray:
    if kind == "zeros":
        return np.zeros(n)
    if kind == "constant":
        return np.full(n, magnitude * rng.choice([-1.0, 1.0]))
    if kind == "spike":
        v = rng.standard_normal(n) * magnitude * 1e-3
        v[rng.integers(n)] = magnitude * rng.choice([-1.0, 1.0])
        return v
    if kind == "subnormal":
        return rng.standard_normal(n) * 1e-40
    if kind == "huge":
        return rng.standard_normal(n) * max_magnitude
    if kind == "tiny":
        return rng.standard_normal(n) * 1e-20
    if kind == "integers":
        return rng.integers(-8, 8, n).astype(np.float64)
    if kind == "positive":
        return rng.uniform(0.5, 1.0, n) * magnitude
    if kind == "negative":
        return -rng.uniform(0.5, 1.0, n) * magnitude
    return rng.standard_normal(n) * magnitude


@st.composite
def float_rows(draw, n_elements: int | st.SearchStrategy[int], n_rows: int | st.SearchStrategy[int] = 1,
               max_magnitude: float = 1e4, kinds: tuple[str, ...] = KINDS) -> np.ndarray:
    """float32 [n_rows, n_elements] made of adversarial stretches (see module doc).

    ``max_magnitude`` bounds the largest values; keep it small enough that scales stay finite in
    fp16 (amax/127 < 65504) when the rows are to be quantized and compared numerically.
    """
    n = draw(n_elements) if isinstance(n_elements, st.SearchStrategy) else n_elements
    rows = draw(n_rows) if isinstance(n_rows, st.SearchStrategy) else n_rows
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    out = np.empty((rows, n), dtype=np.float64)
    for r in range(rows):
        pos = 0
        while pos < n:
            length = min(draw(st.sampled_from([16, 32, 64, 256])), n - pos)
            kind = draw(st.sampled_from(kinds))
            magnitude = 10.0 ** draw(st.floats(-6, np.log10(max_magnitude)))
            out[r, pos:pos + length] = _stretch(rng, kind, length, magnitude, max_magnitude)
            pos += length
    return out.astype(np.float32)


def _halves(rng: np.random.Generator, n: int, role: str, exact: bool) -> np.ndarray:
    if exact:
        values = rng.choice([-1.0, 1.0], n) if role == "d" else rng.integers(-2, 3, n).astype(np.float64)
    else:
        values = rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 0, n)
    if role == "m" and not exact:
        values = np.abs(values)
    return values.astype(np.float16)


@st.composite
def quantized_blocks(draw, fmt: Format, n_blocks: int | st.SearchStrategy[int], exact: bool = False,
                     int8_min: int = -128) -> np.ndarray:
    """uint8 bytes of ``n_blocks`` valid random blocks of ``fmt`` (for F32/F16/BF16: elements).

    Parameters
    ----------
    exact : bool
        Scales of +-1 and small integer mins (floats: small integers), so dots are exact in float32.
    int8_min : int
        Smallest int8 quant for Q8 formats; pass -127 for activations (ggml's activation
        quantizers never produce -128, and the SIMD sign trick relies on that).
    """
    nb = draw(n_blocks) if isinstance(n_blocks, st.SearchStrategy) else n_blocks
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    t = fmt.type
    if t in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        values = rng.integers(-8, 9, nb) if exact else rng.standard_normal(nb) * 10.0 ** rng.uniform(-3, 2, nb)
        return fmt.quantize(values.astype(np.float32))
    blocks = rng.integers(0, 256, (nb, fmt.type_size), dtype=np.uint8)
    if t == GGMLType.Q8_K:
        qs = rng.integers(max(int8_min, -127), 128, (nb, 256), dtype=np.int8)
        d = rng.choice([-1.0, 1.0], nb) if exact else rng.standard_normal(nb) * 10.0 ** rng.uniform(-4, 0, nb)
        blocks[:, 0:4] = d.astype(np.float32).view(np.uint8).reshape(nb, 4)
        blocks[:, 4:260] = qs.view(np.uint8)
        blocks[:, 260:292] = qs.reshape(nb, 16, 16).sum(-1, dtype=np.int16).view(np.uint8).reshape(nb, 32)
        return blocks.reshape(-1)
    for offset, role in _HALF_FIELDS[t]:
        blocks[:, offset:offset + 2] = _halves(rng, nb, role, exact).view(np.uint8).reshape(nb, 2)
    if t in (GGMLType.Q8_0, GGMLType.Q8_1):
        start = 2 if t == GGMLType.Q8_0 else 4
        qs = rng.integers(int8_min, 128, (nb, 32), dtype=np.int8)
        blocks[:, start:start + 32] = qs.view(np.uint8)
        if t == GGMLType.Q8_1:  # s = d * sum(qs), as the quantizer stores it
            d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]
            s = (d * qs.sum(-1, dtype=np.int32)).astype(np.float16)
            blocks[:, 2:4] = s.view(np.uint8).reshape(nb, 2)
    return blocks.reshape(-1)


@st.composite
def matmul_shapes(draw, fmt: Format, max_rows: int = 80, max_blocks: int = 4,
                  n_tok: st.SearchStrategy[int] = st.integers(1, 20)) -> tuple[int, int, int]:
    """(n_rows, n_in, n_tok) with n_in a whole number of ``fmt``'s blocks."""
    block = max(fmt.block_size, 32)
    return (draw(st.integers(1, max_rows)), block * draw(st.integers(1, max_blocks)), draw(n_tok))
