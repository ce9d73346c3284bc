"""The value-table and ternary formats (IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0) against ggml itself,
through the libraries
llama-cpp-python ships: dot against ggml-cpu's vec_dot, and matmul against ggml_mul_mat on the CPU
backend (which picks the repacked GEMV/GEMM, llamafile's sgemm, the tiled GEMM or vec_dot as
llama.cpp does), on every ISA this machine runs: all bit-exact. Their quantize and dequantize
meet ggml in tests/test_quants_imatrix.py with every other format.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _ggml
import gguflm.quants as q
from gguflm import system
from gguflm.ggml_types import GGMLType
from gguflm.testing import random_blocks
from gguflm.testing import strategies as gst

TYPES = [GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4, GGMLType.TQ1_0, GGMLType.TQ2_0]
IDS = [t.name for t in TYPES]
ISAS = system.supported_isas()


def _bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("t", TYPES, ids=IDS)
def test_layout_matches_gguf_package(t):
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    fmt = q.get(t)
    assert (fmt.block_size, fmt.type_size) == GGML_QUANT_SIZES[GGMLQuantizationType(int(t))]
    assert fmt.vec_dot_type == (GGMLType.Q8_0 if fmt.block_size == 32 else GGMLType.Q8_K)
    assert fmt in q.formats() and q.get(t.name.lower()) is fmt


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t", TYPES, ids=IDS)
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_dot_matches_ggml_vec_dot(t, isa, data):
    """Weight row . activation row as ggml-cpu's vec_dot, bit for bit, on every ISA (an odd
    number of 32-blocks included: ggml's pair loop then adds the last block unfused)."""
    _ggml.require_ggml()
    fmt = q.get(t)
    nb = data.draw(st.integers(1, 9 if fmt.block_size == 32 else 3))
    n = nb * fmt.block_size
    w = data.draw(gst.quantized_blocks(fmt, nb))
    x = data.draw(gst.float_rows(n, max_magnitude=1e3))[0]
    xq = q.get(fmt.vec_dot_type).quantize_activations(x)
    with system.using(isa=isa):
        ours = fmt.dot(w, x)
    assert _bits(ours) == _bits(_ggml.vec_dot(t, w, xq, n))


# (n_rows, n_tok): rows % 8 == 0 takes IQ4_NL/MXFP4 to the repacked GEMV (1..3 tokens) and GEMM
# (4+), other row counts to vec_dot, or for IQ4_NL batches llamafile's sgemm; IQ4_XS batches of
# 8+ tokens go to the tiled GEMM (16+ to the K GEMM: 13 rows are a part strip at both widths)
SHAPES = [(16, 1), (16, 3), (16, 9), (13, 1), (13, 2), (13, 9), (24, 17), (13, 21)]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t", TYPES, ids=IDS)
@pytest.mark.parametrize("repacked", [True, False])
def test_matmul_matches_ggml_mul_mat(t, isa, repacked):
    _ggml.require_ggml()
    fmt = q.get(t)
    rng = np.random.default_rng(int(t))
    n_in = fmt.block_size * (7 if fmt.block_size == 32 else 2)
    for n_rows, n_tok in SHAPES:
        w = random_blocks(fmt, n_rows * n_in // fmt.block_size, rng).reshape(n_rows, -1)
        x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
        with system.using(isa=isa):
            ours = q.matmul(w, t, x, n_threads=2, repacked=repacked)
        ref = _ggml.mul_mat(t, w, n_in, x, repacked=repacked)
        assert np.array_equal(_bits(ours), _bits(ref)), (n_rows, n_tok)
