"""Every format's quantize against ggml_quantize_chunk (llama-cpp-python's libggml-base), without
and with an importance matrix (ggml's quant_weights, one float per column: ggml then takes its
weighted quantize_row_<type>_impl searches, for the legacy and K-quant types too), byte for byte;
and dequantize against ggml's to_float, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _ggml
import gguflm.quants as q
from gguflm.ggml_types import GGMLType
from gguflm.testing import strategies as gst
from quants_oracles import GRID_IQ_TYPES

# weight formats (the activation-only Q8_1 / Q8_K have no ggml_quantize_chunk of their own use)
TYPES = [f.type for f in q.formats() if f.vec_dot_type is not None and f.block_size > 1]
IGNORES_IMATRIX = {GGMLType.Q8_0, GGMLType.MXFP4, GGMLType.TQ1_0, GGMLType.TQ2_0}


def _bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_quantize_matches_ggml_quantize_chunk(t, data):
    _ggml.require_ggml()
    fmt = q.get(t)
    k = fmt.block_size * data.draw(st.integers(1, 8 if fmt.block_size == 32 else 2))
    x = data.draw(gst.float_rows(k, n_rows=st.integers(1, 3), max_magnitude=1e3))
    imatrix = data.draw(gst.imatrices(k))
    if t in GRID_IQ_TYPES:   # ggml_quantize_requires_imatrix: no quantizer without one
        with pytest.raises(ValueError, match="needs an importance matrix"):
            fmt.quantize(x)
    else:
        assert np.array_equal(fmt.quantize(x), _ggml.quantize_chunk(t, x))
    assert np.array_equal(fmt.quantize(x, imatrix=imatrix), _ggml.quantize_chunk(t, x, imatrix))


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_imatrix_is_used(t):
    """A skewed importance matrix moves some bytes, except for the formats ggml quantizes without it."""
    fmt = q.get(t)
    x = np.random.default_rng(3).standard_normal((4, 512)).astype(np.float32)
    w = np.where(np.arange(512) % 7 == 0, 100.0, 0.01).astype(np.float32)
    # the formats that need one: against a flat one
    plain = fmt.quantize(x, imatrix=np.ones(512, np.float32)) if t in GRID_IQ_TYPES else fmt.quantize(x)
    assert np.array_equal(plain, fmt.quantize(x, imatrix=w)) == (t in IGNORES_IMATRIX)


def test_imatrix_shape_is_checked():
    with pytest.raises(ValueError, match="one weight per column"):
        q.get("IQ4_NL").quantize(np.zeros(64, np.float32), imatrix=np.ones(32, np.float32))


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_dequantize_matches_ggml_to_float(t, data):
    _ggml.require_ggml()
    fmt = q.get(t)
    nb = data.draw(st.integers(1, 6))
    blob = data.draw(gst.quantized_blocks(fmt, nb))
    assert np.array_equal(_bits(fmt.dequantize(blob)), _bits(_ggml.to_float(t, blob, nb * fmt.block_size)))


@pytest.mark.parametrize("t", [GGMLType.Q4_K, GGMLType.Q5_K], ids=lambda t: t.name)
def test_k_quants_with_one_weight_per_sub_block(t):
    # an importance matrix with one nonzero weight per 32-element sub-block: the weighted fit of such
    # a sub-block can come out with a negative scale, whose level make_qp_quants wraps; ggml's
    # Q4_K packs that level as it is, its Q5_K clamps it to 63 (a hypothesis draw found this)
    _ggml.require_ggml()
    fmt = q.get(t)
    for seed in range(40):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((4, 256)).astype(np.float32)
        imatrix = np.zeros(256, np.float32)
        imatrix[rng.integers(0, 32, 8) + 32 * np.arange(8)] = rng.uniform(0.5, 8, 8).astype(np.float32)
        assert np.array_equal(fmt.quantize(x, imatrix=imatrix), _ggml.quantize_chunk(t, x, imatrix)), seed
