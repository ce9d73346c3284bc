"""Dot and matmul kernels: against float64 references, across ISAs, threads and shapes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gguflm.quants as q
from gguflm import system
from gguflm._ext import quants as _kernels
from gguflm.ggml_types import GGMLType
from gguflm.testing import random_blocks
from gguflm.testing import strategies as gst
import ggml_lanes as lanes
from quants_oracles import DOT_TYPES, KERNEL_TYPES, reference_matmul

ISAS = system.supported_isas()
# float32 accumulation over at most a few thousand terms, relative to the sum of |terms| that ggml
# adds in float (quants_oracles.weight_parts splits off the parts it adds separately)
RTOL = 2e-6


@pytest.fixture
def isa():
    """Restores the ISA a test switches."""
    previous = system.current_isa()
    yield
    system.set_isa(previous)


def _n_in(fmt, blocks):
    return max(fmt.block_size, 32) * blocks


@pytest.mark.parametrize("t", DOT_TYPES, ids=lambda t: t.name)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_dot_equals_float_dot_of_dequantized_operands(t, data):
    fmt = q.get(t)
    n = _n_in(fmt, data.draw(st.integers(1, 4)))
    w = data.draw(gst.quantized_blocks(fmt, n // fmt.block_size))
    x = data.draw(gst.float_rows(n, max_magnitude=1e3))[0]
    xq = q.quantize_rows_for_dot(t, x[None])
    ref, mag = reference_matmul(t, w, xq, n)
    assert abs(fmt.dot(w, x) - ref[0, 0]) <= RTOL * mag[0, 0] + 1e-30


@pytest.mark.parametrize("t", KERNEL_TYPES, ids=lambda t: t.name)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_every_isa_equals_scalar(t, data):
    """Every ISA gives the very same float as the scalar kernels, which emulate ggml's lanes in
    each build's arithmetic (test_quants_exact checks them against ggml itself), on exact operands
    (scales +-1, small integers: every float operation exact), on general ones and, for BF16, on
    values near the smallest normal (vdpbf16ps' flushes: emulated by the scalar, AVX2 and AVX-512
    kernels, the instruction itself in avx512bf16's)."""
    fmt, partner = q.get(t), q.get(q.get(t).vec_dot_type)
    arith = data.draw(st.sampled_from(system.ARITHMETICS))
    # float formats: any length, so that every step of every arithmetic leaves tails
    n = data.draw(st.integers(1, 300)) if fmt.block_size == 1 else _n_in(fmt, data.draw(st.integers(1, 6)))
    kind = data.draw(st.sampled_from(["exact", "general"] + (["tiny"] if t == GGMLType.BF16 else [])))
    w = data.draw(gst.quantized_blocks(fmt, n // fmt.block_size, exact=kind == "exact", tiny=kind == "tiny"))
    xq = data.draw(gst.quantized_blocks(partner, n // partner.block_size, exact=kind == "exact", int8_min=-127,
                                        tiny=kind == "tiny"))
    results = {}
    for name in ISAS:
        with system.using(isa=name, arithmetic=arith):
            results[name] = np.float32(q._k.vec_dot(int(t), w, xq, n))
    for name, value in results.items():
        assert value.view(np.uint32) == results["scalar"].view(np.uint32), (name, arith)


@pytest.mark.parametrize("t", DOT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 3, 17, 512])
def test_matmul_equals_reference_all_isas_and_threads(t, n_tok, isa):
    fmt = q.get(t)
    rng = np.random.default_rng(int(t) * 1000 + n_tok)
    n_in, n_rows = _n_in(fmt, 2), 70  # 70 rows: a partial chunk at the end
    w = fmt.quantize((rng.standard_normal((n_rows, n_in)) * rng.uniform(0.1, 3, (n_rows, 1))).astype(np.float32))
    x = (rng.standard_normal((n_tok, n_in)) * 2).astype(np.float32)
    xq = q.quantize_rows_for_dot(t, x)
    ref, mag = reference_matmul(t, w, xq, n_in)
    first = None
    for name in ISAS:
        system.set_isa(name)
        for n_threads in (1, 2):
            out = q.matmul(w, t, x, n_threads=n_threads)
            assert out.shape == (n_tok, n_rows) and out.dtype == np.float32
            assert np.all(np.abs(out - ref) <= RTOL * mag + 1e-30), (name, n_threads)
            if n_threads == 1:
                first = out
            else:  # each output is one dot call whichever thread runs it
                assert np.array_equal(out, first)
        # the pre-quantized path gives the same floats
        assert np.array_equal(q.matmul_quantized(w, t, xq, n_threads=2), first)


@pytest.mark.parametrize("t", [GGMLType.F32, GGMLType.F16, GGMLType.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("arith", system.ARITHMETICS)
def test_float_matmul_isas_agree_bit_for_bit(t, arith):
    """Float weights through every tile shape of the kernels (4-row tiles and leftover rows for one
    token, 4-token tiles and leftover tokens for a batch; rows % 4 == 0 or not, so that batches
    take tinyBLAS or vec_dot), rows with and without tails, in every ISA as in the scalar one."""
    rng = np.random.default_rng(int(t))
    fmt = q.get(t)
    for n_in in (48, 100, 160):
        for n_rows in (36, 37):
            w = random_blocks(fmt, n_rows * n_in, rng).reshape(n_rows, -1)
            for n_tok in (1, 2, 23):
                x = (rng.standard_normal((n_tok, n_in)) * 3).astype(np.float32)
                outs = {}
                for name in ISAS:
                    with system.using(isa=name, arithmetic=arith):
                        outs[name] = q.matmul(w, t, x, n_threads=2)
                for name, out in outs.items():
                    np.testing.assert_array_equal(out, outs["scalar"], err_msg=f"{name} {n_in} {n_rows} {n_tok}")


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0],
                         ids=lambda t: t.name)
@pytest.mark.parametrize("n_in", [640, 8448])   # batch block scales from the float table, or per tile
@pytest.mark.parametrize("n_tok", [1, 2, 21, 23])  # one token (4-row kernels); batches: tiles of 8, 4, 3, 2, 1 tokens
def test_legacy_matmul_isas_agree_bit_for_bit(t, n_in, n_tok, isa):
    rng = np.random.default_rng(int(t) + n_in)
    w = q.get(t).quantize(rng.standard_normal((26, n_in)).astype(np.float32))
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    outs = {}
    for name in ISAS:
        system.set_isa(name)
        outs[name] = q.matmul(w, t, x, n_threads=2)
    for name, out in outs.items():
        np.testing.assert_array_equal(out, outs["scalar"], err_msg=name)


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
                               GGMLType.TQ1_0, GGMLType.TQ2_0], ids=lambda t: t.name)
@pytest.mark.parametrize("n_threads", [1, 2])
def test_batch_strips_isas_agree_bit_for_bit(t, n_threads, isa):
    # batches of 16 tokens or more (ternary: 8) take the AVX-512 strips of 16 rows, from the
    # smallest such batch on; 300 rows: at one thread
    # chunks of 64 rows (4 strips decoded together), a last chunk of 44 (2 strips and 12 rows in
    # the 2-row tiles); at two, chunks of 16. An odd block count (3; the ternary types: 1) and 130
    # blocks (ternary: 17); 67 tokens end on a lone token
    rng = np.random.default_rng(int(t))
    ternary = q.get(t).block_size == 256
    for n_in in ((256, 4352) if ternary else (96, 4160)):
        w = q.get(t).quantize(rng.standard_normal((300, n_in)).astype(np.float32))
        for n_tok in ((8, 67) if ternary else (16, 67)):
            x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
            outs = {}
            for name in ISAS:
                system.set_isa(name)
                outs[name] = q.matmul(w, t, x, n_threads=n_threads)
            for name, out in outs.items():
                np.testing.assert_array_equal(out, outs["scalar"], err_msg=f"{name} {n_in} {n_tok}")


@pytest.mark.parametrize("t", [GGMLType.Q4_1, GGMLType.Q8_0], ids=lambda t: t.name)
def test_large_single_token_matmul_streams_with_the_same_floats(t, isa):
    # a single token against a matrix of STREAM_BYTES or more (16 MiB) is streamed row by row; its
    # halves, below that size, take the 4-row tiles: the floats must not change
    rng = np.random.default_rng(11)
    n_in = 1024
    n_rows = _kernels.STREAM_BYTES // q.get(t).row_bytes(n_in) + 8
    assert (n_rows - n_rows // 2) * q.get(t).row_bytes(n_in) < _kernels.STREAM_BYTES  # both halves below it
    w = q.get(t).quantize(rng.standard_normal((n_rows, n_in)).astype(np.float32))
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    half = n_rows // 2
    for name in ISAS:
        system.set_isa(name)
        whole = q.matmul(w, t, x, n_threads=2, repacked=False)
        halves = np.concatenate([q.matmul(w[:half], t, x, n_threads=2, repacked=False),
                                 q.matmul(w[half:], t, x, n_threads=2, repacked=False)], axis=1)
        np.testing.assert_array_equal(whole, halves, err_msg=name)


@pytest.mark.parametrize("t", [GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
                               GGMLType.IQ4_XS], ids=lambda t: t.name)
def test_k_batch_gemm_isas_agree_bit_for_bit(t, isa):
    # the AVX-512 K GEMM (quants_ktile_simd.inc): 16 rows per vector (37: a partial group; 48: whole
    # ones, the repacked Q4_K/Q2_K recipe too), 4 super-blocks per pass (1280 elements: one left
    # over), tokens in tiles of 8 within blocks of 256 (leftover tiles of 5, 3, 2, 7 tokens; the
    # repacked recipe's groups of 4 from 32 tokens on, the rest to its GEMV); every ISA and both
    # threads' chunks give the scalar recipe's floats
    rng = np.random.default_rng(int(t))
    for n_rows, n_tok in ((37, 21), (48, 16), (19, 27), (32, 50), (48, 263)):
        w = q.get(t).quantize((rng.standard_normal((n_rows, 1280)) * rng.uniform(0.1, 3, (n_rows, 1))).astype(np.float32))
        x = (rng.standard_normal((n_tok, 1280)) * 2).astype(np.float32)
        for repacked in (False, True):
            outs = {}
            for name in ISAS:
                system.set_isa(name)
                outs[name] = q.matmul(w, t, x, n_threads=2, repacked=repacked)
            for name, out in outs.items():
                np.testing.assert_array_equal(out, outs["scalar"], err_msg=f"{name} {n_rows} {n_tok} {repacked}")


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_matmul_shapes_property(data):
    t = data.draw(st.sampled_from(DOT_TYPES))
    fmt = q.get(t)
    n_rows, n_in, n_tok = data.draw(gst.matmul_shapes(fmt))
    w = data.draw(gst.quantized_blocks(fmt, n_rows * n_in // fmt.block_size)).reshape(n_rows, -1)
    x = data.draw(gst.float_rows(n_in, n_tok, max_magnitude=1e3))
    out = np.full((n_tok, n_rows), np.nan, dtype=np.float32)
    assert q.matmul(w, t, x, out=out, n_threads=data.draw(st.integers(1, 3))) is out
    ref, mag = reference_matmul(t, w.reshape(-1), q.quantize_rows_for_dot(t, x), n_in)
    assert np.all(np.abs(out - ref) <= RTOL * mag + 1e-30)


def test_matmul_typed_float_weights():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 48)).astype(np.float32)
    w32 = rng.standard_normal((5, 48)).astype(np.float32)
    assert np.allclose(q.matmul(w32, "F32", x), x @ w32.T, rtol=1e-5, atol=1e-5)
    w16 = w32.astype(np.float16)
    ref = x.astype(np.float16).astype(np.float64) @ w16.astype(np.float64).T
    assert np.allclose(q.matmul(w16, "F16", x), ref, rtol=1e-5, atol=1e-5)


def test_get_rows_is_dequantize_of_those_rows():
    rng = np.random.default_rng(2)
    for name in ("Q8_0", "Q4_K", "F16", "Q4_1"):
        fmt = q.get(name)
        w = fmt.quantize(rng.standard_normal((9, 256)).astype(np.float32))
        ids = np.array([8, 0, 3, 3])
        assert np.array_equal(q.get_rows(w, name, ids), fmt.dequantize(w[ids]))
    with pytest.raises(IndexError):
        q.get_rows(w, "Q4_1", np.array([9]))
    with pytest.raises(IndexError):  # would wrap to row 1 as int32
        q.get_rows(w, "Q4_1", np.array([2**32 + 1]))
    with pytest.raises(TypeError):
        q.get_rows(w, "Q4_1", np.array([0.5]))


def test_act_buffer_bytes_and_quantize_rows_for_dot():
    assert q.act_buffer_bytes("Q8_K", 3, 512) == 3 * 2 * 292
    assert q.act_buffer_bytes(GGMLType.Q8_0, 1, 64) == 68
    x = np.ones((2, 256), np.float32)
    assert q.quantize_rows_for_dot("Q4_K", x).shape == (2, 292)
    assert q.quantize_rows_for_dot("Q4_1", x).shape == (2, 8 * 36)
    with pytest.raises(ValueError):
        q.act_buffer_bytes("Q8_K", 1, 100)


def test_matmul_rejects_bad_arguments():
    w = q.get("Q8_0").quantize(np.ones((4, 64), np.float32))
    x = np.ones((2, 64), np.float32)
    with pytest.raises(ValueError, match="columns"):
        q.matmul(w, "Q8_0", np.ones((2, 32), np.float32))
    with pytest.raises(TypeError, match="float32"):
        q.matmul(w, "Q8_0", x.astype(np.float64))
    with pytest.raises(ValueError, match="2-D"):
        q.matmul(w, "Q8_0", x[0])
    with pytest.raises(ValueError, match="C-contiguous"):
        q.matmul(w, "Q8_0", np.ones((64, 2), np.float32).T)
    with pytest.raises(ValueError, match="whole blocks"):
        q.matmul(np.ascontiguousarray(w[:, :30]), "Q8_0", x)
    with pytest.raises(TypeError, match="uint8"):
        q.matmul(w.astype(np.int16), "Q8_0", x)
    with pytest.raises(ValueError, match="shape"):
        q.matmul(w, "Q8_0", x, out=np.empty((4, 2), np.float32))
    with pytest.raises(TypeError):
        q.matmul(w, "Q8_0", x, out=np.empty((2, 4), np.float64))
    with pytest.raises(ValueError, match="activation format"):
        q.matmul(q.get("Q8_K").quantize(np.ones((1, 256), np.float32)), "Q8_K", np.ones((1, 256), np.float32))
    with pytest.raises(ValueError, match="n_threads"):
        q.matmul(w, "Q8_0", x, n_threads=0)
    with pytest.raises(ValueError):
        q.matmul_quantized(w, "Q8_0", np.zeros((2, 30), np.uint8))
    assert q.matmul(w[:0], "Q8_0", x).shape == (2, 0)


def test_matmul_covers_every_row_when_the_team_is_smaller_than_asked():
    """OMP_THREAD_LIMIT=1 gives one thread whatever n_threads asks for; every chunk must still run."""
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np, gguflm.quants as q\n"
        "rng = np.random.default_rng(0)\n"
        "w = q.get('Q8_0').quantize(rng.standard_normal((300, 64)).astype(np.float32))\n"
        "x = rng.standard_normal((3, 64)).astype(np.float32)\n"
        "for n_tok in (1, 3):\n"
        "    a = q.matmul(w, 'Q8_0', x[:n_tok], n_threads=2)\n"
        "    b = q.matmul(w, 'Q8_0', x[:n_tok], n_threads=1)\n"
        "    assert np.array_equal(a, b), n_tok\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], env={**os.environ, "OMP_THREAD_LIMIT": "1"},
                         capture_output=True, text=True)
    assert run.stdout.strip() == "ok", run.stderr[-2000:]


def _bf16(values) -> np.ndarray:
    """float32 values that are bf16 values, as bf16 bits"""
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def test_bf16_dots_flush_at_the_smallest_normal():
    """vdpbf16ps' flushes where a plain fma would not flush, in every ISA's BF16 dots (emulated, or
    the instruction itself) and both of its recipes (vec_dot, tinyBLAS), as the numpy oracle
    computes them. Weight row r holds pattern r in lane r of the first accumulator's first step
    and of the second's second, its pair (odd product first) summing to 2^-126 - 2^-150 (tiny
    after rounding: flushed), to 2^-126 - 2^-151 (rounds up to 2^-126: kept), to 2^-127 (denormal:
    flushed), a denormal input times 2^100 (read as zero), to -2^-127 (flushed); without the
    flushes none of rows 0, 2, 3, 4 would sum to zero. Rows 5..7 are the first three far from the
    threshold, where nothing flushes."""
    n = 128
    patterns = [  # (x odd, y odd, x even, y even)
        (2.0 ** -63, 2.0 ** -63, -(2.0 ** -75), 2.0 ** -75),
        (2.0 ** -63, 2.0 ** -63, -(2.0 ** -75), 2.0 ** -76),
        (2.0 ** -63, 2.0 ** -64, 2.0 ** -64, 2.0 ** -64),
        (2.0 ** -130, 2.0 ** 100, 0.0, 0.0),
        (-(2.0 ** -63), 2.0 ** -63, 2.0 ** -63, 2.0 ** -64),
    ]
    x, y = np.zeros((8, n), np.float32), np.zeros((2, n), np.float32)
    for lane, (xo, yo, xe, ye) in enumerate(patterns):
        for step in (0, 64 + 32):
            e = step + 2 * lane
            x[lane, e + 1], x[lane, e], y[:, e + 1], y[:, e] = xo, xe, yo, ye
    x[5:] = x[:3] * np.float32(2.0 ** 60)
    w, a = _bf16(x).view(np.uint8).reshape(8, -1), _bf16(y).view(np.uint8).reshape(2, -1)
    for arith in ("avx512bf16", "zen4"):
        expected = lanes.matmul_reference(GGMLType.BF16, w, a, n, arith)
        dots = lanes.vec_dot(GGMLType.BF16, w, a, arith)
        for recipe in (expected, dots):
            assert np.all(recipe[:, :5] == [0, 2.0 ** -125, 0, 0, 0]) and np.all(np.abs(recipe[:, 5:]) > 2.0 ** -70)
        for name in ISAS:
            with system.using(isa=name, arithmetic=arith):
                got = q.matmul_quantized(w, GGMLType.BF16, a)          # 2 tokens, 8 rows: tinyBLAS
                single = [[q._k.vec_dot(int(GGMLType.BF16), w[r], a[t], n) for r in range(8)] for t in range(2)]
            np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32), err_msg=f"{name} {arith}")
            np.testing.assert_array_equal(np.float32(single).view(np.uint32), dots.view(np.uint32), err_msg=name)
