"""Dot products and matmuls round exactly as llama.cpp's CPU backend does, on every ISA and in the
arithmetic of every ggml build.

The oracle is tests/ggml_lanes.py, a numpy re-implementation of ggml-cpu's x86 arithmetic for each
kernel llama.cpp runs (the float weights' per build); where llama-cpp-python is installed, that
oracle and gguflm are also checked against ggml-cpu's own vec_dot functions and its ggml_mul_mat,
in the arithmetic of that build.
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
from quants_oracles import DOT_TYPES, KERNEL_TYPES, LANES_TYPES

ISAS = system.supported_isas()
FLOAT_TYPES = [t for t in KERNEL_TYPES if q.get(t).block_size == 1]

# float weights in every build's arithmetic; quantized ones, which round alike in all, in a drawn one
CASES = ([pytest.param(t, a, id=f"{t.name}-{a}") for t in FLOAT_TYPES for a in system.ARITHMETICS]
         + [pytest.param(t, None, id=t.name) for t in LANES_TYPES if t not in FLOAT_TYPES])


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


def _tiny_after_rounding(value: Fraction) -> bool:
    """|value| rounded to 24 significant bits (exponent unbounded, ties to even) < 2^-126."""
    if value == 0:
        return True
    magnitude = abs(value)
    e = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()   # 2^e <= |v| < 2^(e+2)
    while Fraction(2) ** (e + 1) <= magnitude:
        e += 1
    while Fraction(2) ** e > magnitude:
        e -= 1
    quantum = Fraction(2) ** (e - 23)
    whole, rest = divmod(magnitude, quantum)
    up = rest > quantum / 2 or (rest == quantum / 2 and whole % 2 == 1)
    return (whole + up) * quantum < Fraction(2) ** -126


def test_dpbf16_steps_flush_as_the_instruction():
    """The oracle's vdpbf16ps step (denormal inputs read as zeros, results tiny after rounding to
    24 bits flushed to zeros of their sign) against exact rationals, on sums around the smallest
    normal: an exact sum just below 2^-126 that rounds up to it is kept, one a representable step
    below is flushed although a plain fma (which rounds on the denormal grid) gives 2^-126."""
    smallest = 2.0 ** -126
    cases = [(-smallest, 2.0 ** -24, smallest), (-smallest, 2.0 ** -25, smallest), (-1.5 * smallest, 2.0 ** -25, smallest),
             (-smallest, 0.5, smallest), (smallest, 0.5, -smallest), (2.0 ** -130, 1.0, smallest),
             (1.0, 1.0, 2.0 ** -130), (-3.0, 2.0, 6.0)]
    rng = np.random.default_rng(11)
    for _ in range(400):   # bf16 operands near 2^-63, accumulators near 2^-126
        a, b = (rng.choice([-1, 1]) * (1 + rng.integers(0, 128) / 128) * 2.0 ** rng.integers(-70, -56) for _ in range(2))
        cases.append((a, b, rng.choice([-1, 1]) * rng.uniform(1, 4) * smallest))
    a, b, c = (np.array(v, np.float32) for v in zip(*cases))
    got = lanes.fma_daz_ftz(a, b, c)

    def read(v):   # a denormal input reads as a zero
        return Fraction(0) if abs(float(v)) < smallest else Fraction(float(v))

    for x, y, z, r in zip(a, b, c, got):
        exact = read(x) * read(y) + read(z)
        if exact == 0:
            assert r == 0, (x, y, z, r)
            continue
        expected = np.float32(0) if _tiny_after_rounding(exact) else _round_f32(exact)
        assert _bits(r) == _bits(np.copysign(expected, np.float32(float(exact)))), (x, y, z, r)
    assert list(_bits(got[:3])) == [0, _bits(np.float32(smallest)), 0]
    assert list(_bits(lanes.fma32(a[:3], b[:3], c[:3]))) == [_bits(np.float32(smallest))] * 3


def _n_elements(fmt, blocks):
    return max(fmt.block_size, 32) * blocks


@pytest.mark.parametrize("t, arith", CASES)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_vec_dot_is_ggml_vec_dot(t, arith, data):
    """ggml_vec_dot's float order (lanes, fused steps, horizontal sums, tails) bit for bit."""
    fmt, partner = q.get(t), q.get(q.get(t).vec_dot_type)
    arith = arith or data.draw(st.sampled_from(system.ARITHMETICS))
    if fmt.block_size == 1:   # float formats: any length, so the 16-, 32- and 64-element steps leave tails
        n = data.draw(st.integers(1, 200))
    else:
        n = _n_elements(fmt, data.draw(st.integers(1, 6)))
    tiny = t == GGMLType.BF16 and data.draw(st.booleans())
    w = data.draw(gst.quantized_blocks(fmt, n // fmt.block_size, tiny=tiny))
    xq = data.draw(gst.quantized_blocks(partner, n // partner.block_size, int8_min=-127, tiny=tiny))
    expected = lanes.vec_dot(t, w.reshape(1, -1), xq.reshape(1, -1), arith)[0, 0]
    for name in ISAS:
        with system.using(isa=name, arithmetic=arith):
            assert _bits(q._k.vec_dot(int(t), w, xq, n)) == _bits(expected), name


def _matmul_case(t, n_rows, n_tok, seed, n_in=None):
    fmt = q.get(t)
    rng = np.random.default_rng(seed)
    n_in = n_in or _n_elements(fmt, 3)
    w = random_blocks(fmt, n_rows * n_in // fmt.block_size, rng).reshape(n_rows, -1)
    x = (rng.standard_normal((n_tok, n_in)) * rng.uniform(0.1, 10, (n_tok, 1))).astype(np.float32)
    return w, x, n_in


# rows: 8 (Q4_0/Q4_K repacked, Q2_K too in AVX-512 arithmetics; floats' sgemm), 12 (not repacked, sgemm), 13 (neither); tokens: a
# single one, the repack GEMV (< 4), GEMM groups with a GEMV tail (5, 17), the tiled K GEMM (8+)
SHAPES = [(n_rows, n_tok) for n_rows in (8, 12, 13) for n_tok in (1, 3, 5, 8, 17)]
# float rows: 48 (tinyBLAS's 8- and 16-float steps, not vdpbf16ps' 32; one vec_dot tail), 64 (every
# step), 72 (only 8-float steps), 100 (none; vec_dot tails of 36, 4 and 4 elements)
FLOAT_N_IN = (48, 64, 72, 100)


@pytest.mark.parametrize("t, arith", CASES)
def test_matmul_takes_llama_cpp_recipes(t, arith):
    """Each output of a matmul rounds like the kernel llama.cpp runs for that shape, whatever the
    ISA, the thread count, and whether the activations come quantized or as floats."""
    lengths = FLOAT_N_IN if t in FLOAT_TYPES else (None,)
    for i, ((n_rows, n_tok), n_in) in enumerate((shape, n) for shape in SHAPES for n in lengths):
        w, x, n_in = _matmul_case(t, n_rows, n_tok, 100 * int(t) + i, n_in)
        case_arith = arith or system.ARITHMETICS[i % len(system.ARITHMETICS)]
        xq = q.quantize_rows_for_dot(t, x)
        for repacked in ((True, False) if t in (GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q2_K) else (True,)):
            expected = _bits(lanes.matmul_reference(t, w, xq, n_in, case_arith, repacked))
            for name in ISAS:
                with system.using(isa=name, arithmetic=case_arith):
                    for n_threads in (1, 2):
                        got = q.matmul_quantized(w, t, xq, n_threads=n_threads, repacked=repacked)
                        assert np.array_equal(_bits(got), expected), (name, n_rows, n_tok, n_in, repacked, n_threads)
                    assert np.array_equal(_bits(q.matmul(w, t, x, n_threads=2, repacked=repacked)), expected)


# ---- against ggml-cpu itself (llama-cpp-python's libraries), in its build's arithmetic ----

# float rows: every tail of the 16-, 32- and 64-element steps and of GCC's vectorized leftovers
FLOAT_LENGTHS = (1, 7, 8, 12, 15, 16, 17, 31, 33, 40, 48, 56, 63, 64, 65, 72, 88, 100, 127, 128, 129, 229)


@pytest.mark.parametrize("t", [t for t in DOT_TYPES if t in LANES_TYPES], ids=lambda t: t.name)
def test_oracle_is_ggml_vec_dot(t):
    """The numpy oracle against the library's own vec_dot functions (realistic blocks: quantized
    rows of varied magnitude; BF16 also near the smallest normal, where vdpbf16ps flushes)."""
    _ggml.require_ggml()
    fmt = q.get(t)
    rng = np.random.default_rng(int(t))
    lengths = FLOAT_LENGTHS if t in FLOAT_TYPES else [_n_elements(fmt, blocks) for blocks in (1, 2, 7)]
    for n in lengths:
        w = fmt.quantize((rng.standard_normal((6, n)) * rng.uniform(0.01, 5, (6, 1))).astype(np.float32))
        w = w.view(np.uint8).reshape(6, -1)
        xq = q.quantize_rows_for_dot(t, (rng.standard_normal((3, n)) * 3).astype(np.float32))
        cases = [(w, xq)]
        if t == GGMLType.BF16:
            cases.append((random_blocks(fmt, 6 * n, rng, tiny=True).reshape(6, -1),
                          random_blocks(fmt, 3 * n, rng, tiny=True).reshape(3, -1)))
        for w, xq in cases:
            ours = lanes.vec_dot(t, w, xq, _ggml.arithmetic())
            theirs = np.array([[_ggml.vec_dot(int(t), w[r], xq[i], n) for r in range(6)] for i in range(3)])
            assert np.array_equal(_bits(ours), _bits(theirs)), n


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
                               GGMLType.TQ1_0, GGMLType.TQ2_0], ids=lambda t: t.name)
def test_batch_strips_are_ggml_mul_mat(t):
    """The AVX-512 strips of the legacy and ternary types (16 rows, batches of 16 tokens or more;
    ternary: 8) against ggml_mul_mat: 300 rows (not a multiple of 8, so Q4_0 is not repacked on either side)
    leave 12 rows to the other tiles; 67 tokens end on a lone token; one thread takes 64-row
    chunks."""
    _ggml.require_ggml()
    ternary = q.get(t).block_size == 256
    n_in = 4352 if ternary else 4160
    with _ggml.same_arithmetic():
        for n_tok in ((8, 67) if ternary else (16, 67)):
            w, x, n_in = _matmul_case(t, 300, n_tok, 2000 + int(t) + n_tok, n_in)
            theirs = _bits(_ggml.mul_mat(int(t), w, n_in, x, n_threads=2))
            for n_threads in (1, 2):
                assert np.array_equal(_bits(q.matmul(w, t, x, n_threads=n_threads)), theirs), (n_tok, n_threads)


@pytest.mark.parametrize("t", KERNEL_TYPES, ids=lambda t: t.name)
def test_matmul_is_ggml_mul_mat(t):
    """gguflm's matmul against ggml_mul_mat computed by ggml-cpu for the same float input."""
    _ggml.require_ggml()
    lengths = FLOAT_N_IN if t in FLOAT_TYPES else (None,)
    with _ggml.same_arithmetic():
        for i, ((n_rows, n_tok), n_in) in enumerate((shape, n) for shape in SHAPES for n in lengths):
            w, x, n_in = _matmul_case(t, n_rows, n_tok, 1000 + 100 * int(t) + i, n_in)
            theirs = _ggml.mul_mat(int(t), w, n_in, x, n_threads=2)
            assert np.array_equal(_bits(q.matmul(w, t, x, n_threads=2)), _bits(theirs)), (n_rows, n_tok, n_in)
