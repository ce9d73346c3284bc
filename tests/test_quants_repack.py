"""The repacked Q4_0 / IQ4_NL / MXFP4 kernels (src/quants_simd_repack.h) against ggml-cpu's own
CPU_REPACK GEMV and GEMM (llama-cpp-python's libggml-cpu), bit for bit, on the shapes where the
kernels' tiling has edges: strips of rows cut short (rows % 16 == 8), passes of more than 64 rows,
rows longer than a K-chunk and not a whole number of them, token counts past a table block (32)
and every leftover tile size, and the 64-row chunks the matmul driver hands out for batches."""

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
# threads take the driver's 64-row batch chunks (the last one 8 rows)
SHAPES = [(88, 32 * 72, (1, 2, 4, 13, 45)), (520, 64, (1, 6))]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_repacked_matmul_matches_ggml_repack(t, isa):
    _ggml.require_ggml()
    fmt = q.get(t)
    rng = np.random.default_rng(int(t) + 7)
    for n_rows, n_in, toks in SHAPES:
        w = random_blocks(fmt, n_rows * n_in // 32, rng).reshape(n_rows, -1)
        for n_tok in toks:
            x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
            with system.using(isa=isa):
                ours = q.matmul(w, t, x, n_threads=2, repacked=True)
            ref = _ggml.mul_mat(t, w, n_in, x, n_threads=2, repacked=True)
            assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), (n_rows, n_in, n_tok)
