"""Dot products and matmuls round exactly as llama.cpp's CPU backend does, on every ISA.

The oracle is tests/ggml_lanes.py, a numpy re-implementation of ggml-cpu's x86 (AVX2 build)
arithmetic for each kernel llama.cpp runs; where llama-cpp-python is installed, that oracle and
gguflm are also checked against ggml-cpu's own vec_dot functions and its ggml_mul_mat.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _ggml
import ggml_lanes as lanes
import gguflm.quants as q
from gguflm import system
from gguflm.ggml_types import GGMLType
from gguflm.testing import random_blocks
from gguflm.testing import strategies as gst
from quants_oracles import DOT_TYPES

ISAS = system.supported_isas()


def _bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def _round_f32(value: Fraction) -> np.float32:
    """The float32 nearest to an exact rational, ties to even (by comparing the neighbours)."""
    guess = np.float32(float(value))
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - value), int(c.view(np.uint32)) & 1))


def test_fma32_rounds_once():
    """The oracle's fused multiply-add against exact rational arithmetic, on random operands and
    on sums that land exactly between two floats (where rounding twice would go wrong)."""
    rng = np.random.default_rng(7)
    a = (rng.standard_normal(3000) * 10.0 ** rng.uniform(-12, 12, 3000)).astype(np.float32)
    b = (rng.standard_normal(3000) * 10.0 ** rng.uniform(-12, 12, 3000)).astype(np.float32)
    c = (rng.standard_normal(3000) * 10.0 ** rng.uniform(-12, 12, 3000)).astype(np.float32)
    c[::3] = -(a[::3] * b[::3]).astype(np.float32)         # cancellation
    # c = 1, a*b = 2^-24 (1 + 2^-23): a*b + c is just above the midpoint 1 + 2^-24
    a[1], b[1], c[1] = np.float32(2.0 ** -24), np.float32(1 + 2.0 ** -23), np.float32(1.0)
    a[4], b[4], c[4] = np.float32(-(2.0 ** -25)), np.float32(1 + 2.0 ** -23), np.float32(1.0)
    a[7], b[7], c[7] = np.float32(1e-30), np.float32(1e-10), np.float32(1e-40)   # subnormal range
    got = lanes.fma32(a, b, c)
    exact = [_round_f32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))) for x, y, z in zip(a, b, c)]
    assert np.array_equal(_bits(got), _bits(exact))


def _n_elements(fmt, blocks):
    return max(fmt.block_size, 32) * blocks


@pytest.mark.parametrize("t", DOT_TYPES, ids=lambda t: t.name)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_vec_dot_is_ggml_vec_dot(t, data):
    """ggml_vec_dot's float order (lanes, fused steps, horizontal sums, tails) bit for bit."""
    fmt, partner = q.get(t), q.get(q.get(t).vec_dot_type)
    if fmt.block_size == 1:   # float formats: any length, so the 32-element steps leave tails
        n = data.draw(st.integers(1, 200))
    else:
        n = _n_elements(fmt, data.draw(st.integers(1, 6)))
    w = data.draw(gst.quantized_blocks(fmt, n // fmt.block_size))
    xq = data.draw(gst.quantized_blocks(partner, n // partner.block_size, int8_min=-127))
    expected = lanes.vec_dot(t, w.reshape(1, -1), xq.reshape(1, -1))[0, 0]
    for name in ISAS:
        with system.using(isa=name):
            assert _bits(q._k.vec_dot(int(t), w, xq, n)) == _bits(expected), name


def _matmul_case(t, n_rows, n_tok, seed):
    fmt = q.get(t)
    rng = np.random.default_rng(seed)
    n_in = _n_elements(fmt, 3) if fmt.block_size > 1 else 72
    w = random_blocks(fmt, n_rows * n_in // fmt.block_size, rng).reshape(n_rows, -1)
    x = (rng.standard_normal((n_tok, n_in)) * rng.uniform(0.1, 10, (n_tok, 1))).astype(np.float32)
    return w, x, n_in


# rows: 8 (Q4_0/Q4_K repacked, floats' sgemm), 12 (not repacked, sgemm), 13 (neither); tokens: a
# single one, the repack GEMV (< 4), GEMM groups with a GEMV tail (5, 17), the tiled K GEMM (8+)
SHAPES = [(n_rows, n_tok) for n_rows in (8, 12, 13) for n_tok in (1, 3, 5, 8, 17)]


@pytest.mark.parametrize("t", DOT_TYPES, ids=lambda t: t.name)
def test_matmul_takes_llama_cpp_recipes(t):
    """Each output of a matmul rounds like the kernel llama.cpp runs for that shape, whatever the
    ISA, the thread count, and whether the activations come quantized or as floats."""
    for i, (n_rows, n_tok) in enumerate(SHAPES):
        w, x, n_in = _matmul_case(t, n_rows, n_tok, 100 * int(t) + i)
        xq = q.quantize_rows_for_dot(t, x)
        for repacked in ((True, False) if t in (GGMLType.Q4_0, GGMLType.Q4_K) else (True,)):
            expected = _bits(lanes.matmul_reference(t, w, xq, n_in, repacked))
            for name in ISAS:
                with system.using(isa=name):
                    for n_threads in (1, 2):
                        got = q.matmul_quantized(w, t, xq, n_threads=n_threads, repacked=repacked)
                        assert np.array_equal(_bits(got), expected), (name, n_rows, n_tok, repacked, n_threads)
                    assert np.array_equal(_bits(q.matmul(w, t, x, n_threads=2, repacked=repacked)), expected)


# ---- against ggml-cpu itself (llama-cpp-python's libraries) ----

@pytest.mark.parametrize("t", DOT_TYPES, ids=lambda t: t.name)
def test_oracle_is_ggml_vec_dot(t):
    """The numpy oracle against the library's own vec_dot functions (realistic blocks: quantized
    rows of varied magnitude)."""
    _ggml.require_ggml()
    fmt = q.get(t)
    rng = np.random.default_rng(int(t))
    for blocks in (1, 2, 7):
        n = _n_elements(fmt, blocks) + (5 if fmt.block_size == 1 else 0)
        w = fmt.quantize((rng.standard_normal((6, n)) * rng.uniform(0.01, 5, (6, 1))).astype(np.float32))
        w = w.view(np.uint8).reshape(6, -1)
        xq = q.quantize_rows_for_dot(t, (rng.standard_normal((3, n)) * 3).astype(np.float32))
        ours = lanes.vec_dot(t, w, xq)
        theirs = np.array([[_ggml.vec_dot(int(t), w[r], xq[i], n) for r in range(6)] for i in range(3)])
        assert np.array_equal(_bits(ours), _bits(theirs)), n


@pytest.mark.parametrize("t", DOT_TYPES, ids=lambda t: t.name)
def test_matmul_is_ggml_mul_mat(t):
    """gguflm's matmul against ggml_mul_mat computed by ggml-cpu for the same float input."""
    _ggml.require_ggml()
    for i, (n_rows, n_tok) in enumerate(SHAPES):
        w, x, n_in = _matmul_case(t, n_rows, n_tok, 1000 + 100 * int(t) + i)
        theirs = _ggml.mul_mat(int(t), w, n_in, x, n_threads=2)
        assert np.array_equal(_bits(q.matmul(w, t, x, n_threads=2)), _bits(theirs)), (n_rows, n_tok)
