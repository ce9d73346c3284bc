"""Hypothesis strategies for property tests of quantization kernels.

``float_rows`` draws float32 rows whose 16-to-256-element stretches are each of an adversarial
kind (zeros, constants, one spike among small values, subnormals, huge or tiny magnitudes, mixed
signs, one-signed runs); ``quantized_blocks`` draws valid blocks of any format (finite scales,
consistent Q8_1 ``s`` and Q8_K ``bsums``), optionally with scales of +-1 so that every float
operation of a dot is exact; ``imatrices`` draws importance weights (ggml's quant_weights);
``matmul_shapes`` draws (n_rows, n_in, n_tok) for a format.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from gguflm.quants import Format
from gguflm.testing import random_blocks

KINDS = ("normal", "zeros", "constant", "spike", "subnormal", "huge", "tiny", "integers", "positive", "negative")


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


@st.composite
def quantized_blocks(draw, fmt: Format, n_blocks: int | st.SearchStrategy[int], exact: bool = False,
                     int8_min: int = -128, tiny: bool = False) -> np.ndarray:
    """uint8 bytes of ``n_blocks`` valid random blocks of ``fmt``; see :func:`gguflm.testing.random_blocks`."""
    nb = draw(n_blocks) if isinstance(n_blocks, st.SearchStrategy) else n_blocks
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return random_blocks(fmt, nb, rng, exact=exact, int8_min=int8_min, tiny=tiny)


@st.composite
def imatrices(draw, n_columns: int) -> np.ndarray:
    """float32 [n_columns] importance weights as ggml's imatrix holds them (mean squared
    activations, >= 0): of one kind each, lognormal spreads, uniform, constant, or sparse with
    most columns zero."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["lognormal", "uniform", "constant", "sparse"]))
    if kind == "lognormal":
        w = np.exp(rng.standard_normal(n_columns) * draw(st.floats(0.1, 4.0)))
    elif kind == "uniform":
        w = rng.uniform(0.0, 1.0, n_columns)
    elif kind == "constant":
        w = np.full(n_columns, 10.0 ** draw(st.floats(-4, 4)))
    else:
        w = np.where(rng.random(n_columns) < 0.1, rng.uniform(0.1, 10.0, n_columns), 0.0)
    return w.astype(np.float32)


@st.composite
def matmul_shapes(draw, fmt: Format, max_rows: int = 80, max_blocks: int = 4,
                  n_tok: st.SearchStrategy[int] = st.integers(1, 20)) -> tuple[int, int, int]:
    """(n_rows, n_in, n_tok) with n_in a whole number of ``fmt``'s blocks."""
    block = max(fmt.block_size, 32)
    return (draw(st.integers(1, max_rows)), block * draw(st.integers(1, max_blocks)), draw(n_tok))
