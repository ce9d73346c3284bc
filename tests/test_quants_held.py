"""TQ1_0 matmul weights held as TQ2_0 blocks (src/quants_tq_held.h, how a loaded model holds them):
the blocks hold the same values as the gguf package reads them, and every matmul path (one token,
the tiles, the 16-row strips of batches) gives TQ1_0's floats bit for bit, on every ISA and ggml
build arithmetic this machine runs, at 1-4 threads."""

from __future__ import annotations

import gguf
import gguf.quants as gq
import numpy as np
import pytest

import gguflm.quants as q
from gguflm import system
from gguflm.ggml_types import GGMLType
from gguflm.testing import random_blocks

TQ1, TQ2 = GGMLType.TQ1_0, GGMLType.TQ2_0


def test_held_blocks_hold_the_same_values():
    """Against the gguf package's dequantizers, for blocks as ggml writes them and for any bytes
    (a byte ggml never writes still decodes to some trits, the same ones in both forms)."""
    rng = np.random.default_rng(0)
    written = random_blocks(q.get(TQ1), 40, rng).reshape(8, -1)
    any_bytes = rng.integers(0, 256, (8, 5 * 54), dtype=np.uint8)
    any_bytes.reshape(8, 5, 54)[:, :, 52:54] = np.array([0.5], np.float16).view(np.uint8)   # finite scales
    for w in (written, any_bytes):
        held = q.hold_as(w, TQ1)
        assert held.shape == (8, w.shape[1] // 54 * 66) and held.dtype == np.uint8
        expected = gq.dequantize(w, gguf.GGMLQuantizationType.TQ1_0)
        np.testing.assert_array_equal(gq.dequantize(held, gguf.GGMLQuantizationType.TQ2_0), expected)
        np.testing.assert_array_equal(q.get(TQ2).dequantize(held), expected)
    assert q.HELD_AS[TQ1] == TQ2


# 40 rows = two 16-row strips + 8 rows in the tiles; 9 super-blocks a row; the token counts cover
# one token (the decode tile), a partial tile, the strips (16+) with a leftover
@pytest.mark.parametrize("arith", system.ARITHMETICS)
@pytest.mark.parametrize("isa", system.supported_isas())
def test_held_matmul_equals_tq1(isa, arith):
    rng = np.random.default_rng(1)
    for n_rows, n_blocks in ((40, 9), (17, 1)):
        w = random_blocks(q.get(TQ1), n_rows * n_blocks, rng).reshape(n_rows, -1)
        held = q.hold_as(w, TQ1, n_threads=2)
        for n_tok in (1, 3, 5, 16, 37):
            x = rng.standard_normal((n_tok, 256 * n_blocks)).astype(np.float32)
            for n_threads in (1, 2, 3, 4):
                with system.using(isa=isa, arithmetic=arith):
                    ref = q.matmul(w, TQ1, x, n_threads=n_threads)
                    ours = q.matmul(held, TQ2, x, n_threads=n_threads)
                assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), (n_rows, n_blocks, n_tok, n_threads)


def test_hold_as_rejects_other_types_and_partial_blocks():
    with pytest.raises(ValueError, match="held as they are"):
        q.hold_as(np.zeros((2, 66), np.uint8), TQ2)
    with pytest.raises(ValueError, match="not whole TQ1_0 blocks"):
        q.hold_as(np.zeros((2, 60), np.uint8), TQ1)
    assert q.hold_as(np.zeros((0, 54), np.uint8), TQ1).shape == (0, 66)
