"""The AMX tiles (src/quants_amx.h) and their switch. On a machine that grants AMX-INT8, the batch
kernels that have an AMX part take their integer sums from the tiles, 16 tokens at a time, and
must give the floats of the VNNI kernels and of ggml bit for bit: the repacked Q4_0 recipe's
tiles (Q4_0, IQ4_NL, MXFP4; against ggml's own repack GEMM), and the TILED K GEMM of the types of
32-element sub-blocks (Q4_K, Q5_K, IQ4_XS and the 32-element grid i-quants; against the scalar
recipe, itself checked against ggml by test_quants_exact); the other batch recipes must stay as
they were with the tiles on. Elsewhere the kernel tests are skipped with the reason."""

from __future__ import annotations

import numpy as np
import pytest

import _ggml
import gguflm.quants as q
from gguflm import system
from gguflm._ext import system as ext_system
from gguflm.ggml_types import GGMLType
from gguflm.testing import random_blocks

ISAS = system.supported_isas()
AVX512 = [isa for isa in ISAS if isa.startswith("avx512")]
AMX_RUNS = ext_system.request_amx()   # (already asked at import, unless GGUFLM_AMX=0)
needs_amx = pytest.mark.skipif(not AMX_RUNS, reason="AMX-INT8 does not run here (CPU {cpu}, OS {os}, kernel grant "
                               "{permitted}): the AMX kernels need all three".format(**ext_system.amx_support()))
REPACK_TYPES = [GGMLType.Q4_0, GGMLType.IQ4_NL, GGMLType.MXFP4]


@needs_amx
@pytest.mark.parametrize("rows16", [False, True], ids=["file", "rows16"])
@pytest.mark.parametrize("t", REPACK_TYPES, ids=lambda t: t.name)
def test_amx_q4_0_recipe_gives_the_same_floats(t, rows16):
    """16, 48 and 100 tokens: whole AMX tiles, and tiles with VNNI leftovers in the same table
    block (100 = 3 x 32 + 4: two AMX tiles a table, then 4 tokens); 73 blocks: two whole K-chunks
    and one of 9, so the tiles' pairs of blocks end on a single one; 80 rows: a 64-row pass and a
    16-row one."""
    _ggml.require_ggml()
    fmt = q.get(t)
    rng = np.random.default_rng(int(t) + 11)
    n_rows, n_in = 80, 32 * 73
    w = random_blocks(fmt, n_rows * n_in // 32, rng).reshape(n_rows, -1)
    held = q.to_rows16(w, t) if rows16 else w
    for n_tok in (16, 48, 100):
        x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
        ref = _ggml.mul_mat(t, w, n_in, x, n_threads=2, repacked=True)
        for isa in AVX512:
            for amx in (True, False):
                for n_threads in (1, 2, 3):
                    with system.using(isa=isa, amx=amx):
                        ours = q.matmul(held, t, x, n_threads=n_threads, repacked=True, rows16=rows16)
                    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), (isa, amx, n_tok, n_threads)


def test_amx_switch_checks_the_machine():
    previous = system.amx()
    try:
        assert system.set_amx(False) == previous and system.amx() is False
        assert system.system_info()["amx"]["on"] is False
        if AMX_RUNS:
            assert system.set_amx(True) is False and system.amx() is True
        else:
            with pytest.raises(ValueError, match="cannot run the AMX kernels"):
                system.set_amx(True)
            assert system.amx() is False
    finally:
        system.set_amx(previous)


# K GEMM types: 32-element sub-blocks (the AMX part), then others that must stay as they were
K_TYPES = [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.IQ4_XS, GGMLType.IQ2_XXS, GGMLType.IQ3_XXS, GGMLType.IQ3_S,
           GGMLType.IQ1_S, GGMLType.Q6_K, GGMLType.Q3_K, GGMLType.Q2_K, GGMLType.IQ2_S]


@needs_amx
@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
def test_amx_k_gemm_gives_the_same_floats(t):
    """40 rows: two 16-row passes and one of 8; 5 super-blocks: a pass of 4 decoded and one more;
    16, 35 and 48 tokens: whole AMX tiles, and 3 left to the VNNI tiles; Q4_K and Q2_K both as a
    plain weight (TILED) and as one llama.cpp repacks (its GEMM)."""
    fmt = q.get(t)
    rng = np.random.default_rng(int(t) + 13)
    n_rows, n_in = 40, 256 * 5
    w = random_blocks(fmt, n_rows * n_in // 256, rng).reshape(n_rows, -1)
    for n_tok in (16, 35, 48):
        x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
        for repacked in (False, True):
            with system.using(isa="scalar"):
                ref = q.matmul(w, t, x, n_threads=1, repacked=repacked)
            for isa in AVX512:
                for amx in (True, False):
                    for n_threads in (1, 2, 3):
                        with system.using(isa=isa, amx=amx):
                            ours = q.matmul(w, t, x, n_threads=n_threads, repacked=repacked)
                        assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), \
                            (isa, amx, n_tok, repacked, n_threads)
