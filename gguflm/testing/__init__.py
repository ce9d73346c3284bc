"""Helpers for testing code built on gguflm's kernels.

:func:`random_blocks` makes valid random quantized blocks of any format with numpy alone;
:mod:`gguflm.testing.strategies` holds hypothesis strategies (adversarial float rows, random blocks,
matmul shapes) and needs the ``hypothesis`` package.
"""

from __future__ import annotations

import numpy as np

from gguflm.ggml_types import GGMLType
from gguflm.quants import Format

# byte offsets of the half-precision scale fields inside a block: (offset, role); "d" is a scale,
# "m" the signed min of Q4_1/Q5_1, "dmin" the positive min scale of K-quants
_HALF_FIELDS = {
    GGMLType.Q4_0: [(0, "d")], GGMLType.Q4_1: [(0, "d"), (2, "m")], GGMLType.Q5_0: [(0, "d")],
    GGMLType.Q5_1: [(0, "d"), (2, "m")], GGMLType.Q8_0: [(0, "d")], GGMLType.Q8_1: [(0, "d")],
    GGMLType.Q2_K: [(80, "d"), (82, "dmin")], GGMLType.Q3_K: [(108, "d")],
    GGMLType.Q4_K: [(0, "d"), (2, "dmin")], GGMLType.Q5_K: [(0, "d"), (2, "dmin")], GGMLType.Q6_K: [(208, "d")],
    # grid i-quants: any bytes after d index their grids (IQ1_M: see _iq1_m_scale)
    GGMLType.IQ2_XXS: [(0, "d")], GGMLType.IQ2_XS: [(0, "d")], GGMLType.IQ2_S: [(0, "d")],
    GGMLType.IQ3_XXS: [(0, "d")], GGMLType.IQ3_S: [(0, "d")], GGMLType.IQ1_S: [(0, "d")], GGMLType.IQ1_M: [],
    GGMLType.IQ4_NL: [(0, "d")], GGMLType.IQ4_XS: [(0, "d")], GGMLType.TQ1_0: [(52, "d")], GGMLType.TQ2_0: [(64, "d")],
}


def _iq1_m_scale(blocks: np.ndarray, d: np.ndarray) -> None:
    """Write fp16 ``d`` into IQ1_M blocks: its four nibbles are the top nibbles of the scale words."""
    sc = blocks[:, 48:56].copy().view(np.uint16)
    bits = d.view(np.uint16)
    for k in range(4):
        sc[:, k] = (sc[:, k] & 0x0FFF) | (((bits >> (4 * k)) & 0xF) << 12)
    blocks[:, 48:56] = sc.view(np.uint8)


def _halves(rng: np.random.Generator, n: int, role: str, exact: bool) -> np.ndarray:
    if exact:
        values = rng.choice([-1.0, 1.0], n) if role == "d" else rng.integers(-2, 3, n).astype(np.float64)
    else:
        values = rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 0, n)
    if role == "dmin":
        values = np.abs(values)
    return values.astype(np.float16)


def random_blocks(fmt: Format, n_blocks: int, rng: np.random.Generator, exact: bool = False,
                  int8_min: int = -128, tiny: bool = False) -> np.ndarray:
    """uint8 bytes of ``n_blocks`` valid random blocks of ``fmt`` (F32/F16/BF16: elements).

    Valid means finite scales (magnitudes 1e-4..1), a Q8_1 ``s`` equal to fp16(d*sum(qs)) and
    Q8_K ``bsums`` equal to the sums of its quants.

    Parameters
    ----------
    exact : bool
        Scales of +-1 and small integer mins (floats: small integers), so that every float
        operation of a dot on such blocks is exact.
    int8_min : int
        Smallest int8 quant for Q8 formats; pass -127 for activations (ggml's activation
        quantizers never produce -128, and the SIMD sign trick relies on that).
    tiny : bool
        BF16 only: magnitudes near 2^-63 and one value in ten denormal, so that the sums of
        products of two such rows cross the smallest normal float (2^-126), where vdpbf16ps
        reads denormals as zeros and flushes tiny results.
    """
    t = fmt.type
    if tiny:
        if t != GGMLType.BF16:
            raise ValueError(f"tiny values are BF16 values, not {t.name}")
        exponent = np.where(rng.random(n_blocks) < 0.1, 0, rng.integers(58, 70, n_blocks))
        bits = (rng.integers(0, 2, n_blocks) << 15) | (exponent << 7) | rng.integers(0, 128, n_blocks)
        return bits.astype(np.uint16).view(np.uint8)
    if t in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        values = rng.integers(-8, 9, n_blocks) if exact else rng.standard_normal(n_blocks) * 10.0 ** rng.uniform(-3, 2, n_blocks)
        return fmt.quantize(values.astype(np.float32))
    nb = n_blocks
    blocks = rng.integers(0, 256, (nb, fmt.type_size), dtype=np.uint8)
    if t == GGMLType.Q8_K:
        qs = rng.integers(max(int8_min, -127), 128, (nb, 256), dtype=np.int8)
        d = rng.choice([-1.0, 1.0], nb) if exact else rng.standard_normal(nb) * 10.0 ** rng.uniform(-4, 0, nb)
        blocks[:, 0:4] = d.astype(np.float32).view(np.uint8).reshape(nb, 4)
        blocks[:, 4:260] = qs.view(np.uint8)
        blocks[:, 260:292] = qs.reshape(nb, 16, 16).sum(-1, dtype=np.int16).view(np.uint8).reshape(nb, 32)
        return blocks.reshape(-1)
    if t == GGMLType.MXFP4:
        # E8M0 exponents: scales 2^(e-128) of 2^-28..2^4, or (exact) 1
        blocks[:, 0] = 128 if exact else rng.integers(100, 133, nb)
        return blocks.reshape(-1)
    if t == GGMLType.TQ2_0:
        # 2-bit values 0..2 (value + 1; ggml's quantizer never writes 3)
        blocks[:, :64] = (rng.integers(0, 3, (nb, 64, 4)) << np.arange(0, 8, 2)).sum(-1).astype(np.uint8)
    if t == GGMLType.TQ1_0:
        # base-3 fractions: 5 (qh: 4 and a zero) trits q as ceil(q * 256 / 243), as ggml writes them
        trits = rng.integers(0, 243, (nb, 52))
        trits[:, 48:] = trits[:, 48:] // 3 * 3
        blocks[:, :52] = ((trits * 256 + 242) // 243).astype(np.uint8)
    for offset, role in _HALF_FIELDS[t]:
        blocks[:, offset:offset + 2] = _halves(rng, nb, role, exact).view(np.uint8).reshape(nb, 2)
    if t == GGMLType.IQ1_M:
        _iq1_m_scale(blocks, _halves(rng, nb, "d", exact))
    if t in (GGMLType.Q8_0, GGMLType.Q8_1):
        start = 2 if t == GGMLType.Q8_0 else 4
        qs = rng.integers(int8_min, 128, (nb, 32), dtype=np.int8)
        blocks[:, start:start + 32] = qs.view(np.uint8)
        if t == GGMLType.Q8_1:
            d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]
            s = (d * qs.sum(-1, dtype=np.int32)).astype(np.float16)
            blocks[:, 2:4] = s.view(np.uint8).reshape(nb, 2)
    return blocks.reshape(-1)
