"""The repacked Q4_0 / IQ4_NL / MXFP4 kernels (src/quants_repack_simd.inc) against ggml-cpu's own
CPU_REPACK GEMV and GEMM (llama-cpp-python's libggml-cpu), bit for bit, on the shapes where the
kernels' tiling has edges: strips of rows cut short (rows % 16 == 8), passes of more than 64 rows,
rows longer than a K-chunk and not a whole number of them, token counts past a table block (32)
and every leftover tile size, and the 64-row chunks the matmul driver hands out for batches.
The same weights in gguflm's rows-16 layout (src/quants_rows16.h, how a loaded model holds them)
give the same floats, at 1-4 threads (the driver's chunks are then whole groups of 16 rows)."""

from __future__ import annotations

import numpy as np
import pytest

import _ggml
import gguflm.quants as q
from gguflm import system
from gguflm.ggml_types import GGMLType
from gguflm.testing import random_blocks

TYPES = [GGMLType.Q4_0, GGMLType.IQ4_NL, GGMLType.MXFP4]
ISAS = system.supported_isas()

# (n_rows, n_in, token counts): 88 rows = one 64-row pass + a 16-row strip + an 8-row one; 72
# blocks = two 32-block K-chunks + 8; 45 tokens = a 32-token table block + 8 + 5; 520 rows with 2
# threads take the driver's 64-row batch chunks (the last one 8 rows). Rows-16 weights: 80 rows = a
# 64-row pass + one group; 48 rows at 3-4 threads: one-group chunks
SHAPES = {False: [(88, 32 * 72, (1, 2, 4, 13, 45)), (520, 64, (1, 6))],
          True: [(80, 32 * 72, (1, 2, 4, 13, 45)), (48, 96, (1, 3)), (528, 64, (1, 6))]}


@pytest.mark.parametrize("rows16", [False, True], ids=["file", "rows16"])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_repacked_matmul_matches_ggml_repack(t, isa, rows16):
    _ggml.require_ggml()
    fmt = q.get(t)
    rng = np.random.default_rng(int(t) + 7)
    for n_rows, n_in, toks in SHAPES[rows16]:
        w = random_blocks(fmt, n_rows * n_in // 32, rng).reshape(n_rows, -1)
        held = q.to_rows16(w, t) if rows16 else w
        for n_tok in toks:
            x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
            ref = _ggml.mul_mat(t, w, n_in, x, n_threads=2, repacked=True)
            for n_threads in (1, 2, 3, 4):
                with system.using(isa=isa):
                    ours = q.matmul(held, t, x, n_threads=n_threads, repacked=True, rows16=rows16)
                assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), (n_rows, n_in, n_tok, n_threads)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_rows16_layout_round_trips_and_converts_in_place(t):
    fmt = q.get(t)
    rng = np.random.default_rng(int(t))
    w = random_blocks(fmt, 32 * 5, rng).reshape(32, -1)
    w16 = q.to_rows16(w, t)
    assert np.array_equal(q.from_rows16(w16, t), w)
    # group 0, block 0: the 16 rows' scales first, then chunk 0 holds each row's first qs dword
    bx, sbytes = fmt.type_size, fmt.type_size - 16
    assert np.array_equal(w16[0, :16 * sbytes].reshape(16, sbytes), w[:16, :sbytes])
    assert np.array_equal(w16.reshape(-1)[16 * sbytes:16 * sbytes + 64].reshape(16, 4), w[:16, sbytes:sbytes + 4])
    # group 1 starts where row 16 does
    assert np.array_equal(w16[16, :16 * sbytes].reshape(16, sbytes), w[16:, :sbytes])
    inplace = w.copy()
    assert q.to_rows16(inplace, t, out=inplace) is inplace
    assert np.array_equal(inplace, w16)
    assert np.array_equal(q.to_rows16(w, t, n_threads=3), w16)
    assert np.array_equal(q.from_rows16(w16, t, n_threads=2), w)
    assert bx * 5 == w.shape[1]


def test_rows16_rejects_what_it_cannot_hold():
    w = random_blocks(q.get("Q4_0"), 24, np.random.default_rng(0)).reshape(24, -1)
    x = np.ones((1, 32), np.float32)
    with pytest.raises(ValueError, match="multiple of 16"):
        q.to_rows16(w, "Q4_0")
    with pytest.raises(ValueError, match="multiple of 16"):
        q.matmul(w, "Q4_0", x, rows16=True)
    with pytest.raises(ValueError, match="no rows-16 layout"):
        q.matmul(random_blocks(q.get("Q4_1"), 16, np.random.default_rng(0)).reshape(16, -1), "Q4_1", x, rows16=True)
    with pytest.raises(ValueError, match="repacked=True"):
        q.matmul(w[:16], "Q4_0", x, repacked=False, rows16=True)

