"""llama.cpp's attention rotation for quantized KV caches (``attn_rot_k``/``attn_rot_v``).

A quantized K cache stores K rotated by an orthonormal Walsh-Hadamard matrix (Q is rotated alike,
so Q.K is unchanged but the outliers of each head are spread over its blocks); a quantized V cache
stores V rotated and the attention output is rotated back. Without it a q8_0 K cache gives logits
about 1% away from llama.cpp's; with it they are llama.cpp's to the bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _llama import LlamaDecoder
from gguflm import Batch, Context, Model
from gguflm._ext import ops
from gguflm.ggml_types import GGMLType
from gguflm.kv_store import rotation
from tiny_models import N_VOCAB, TinyModel, write_tiny_model

F32 = np.float32


def sylvester(n: int) -> np.ndarray:
    """The orthonormal Walsh-Hadamard matrix of order n, in float64."""
    h = np.ones((1, 1))
    while len(h) < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def fwht_float32(x: np.ndarray, chunk: int) -> np.ndarray:
    """ggml-cpu's fast transform, transcribed in float32: scale first, then spans 1, 2, 4, ..."""
    y = x.astype(F32).reshape(-1, chunk) * (F32(1) / np.sqrt(F32(chunk)))
    span = 1
    while span < chunk:
        y = y.reshape(len(y), -1, 2, span)
        u, v = y[:, :, 0, :].copy(), y[:, :, 1, :].copy()
        y[:, :, 0, :], y[:, :, 1, :] = u + v, u - v
        y = y.reshape(len(y), chunk)
        span *= 2
    return y.reshape(x.shape)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([1, 2, 8, 64, 128, 256]), st.integers(1, 4), st.integers(1, 5), st.integers(0, 2**32 - 1),
       st.sampled_from([1, 3]))
def test_hadamard_is_ggml_fast_walsh_hadamard_transform(chunk, per_row, n_rows, seed, n_threads):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n_rows, chunk * per_row)) * rng.choice([1e-3, 1, 1e3], (n_rows, 1))).astype(F32)
    y = x.copy()
    ops.hadamard(y, chunk, n_threads)
    np.testing.assert_array_equal(y, fwht_float32(x, chunk))    # the same roundings
    exact = (x.reshape(-1, chunk).astype(np.float64) @ sylvester(chunk)).reshape(x.shape)
    np.testing.assert_allclose(y, exact, rtol=0, atol=1e-5 * np.abs(x).max())
    ops.hadamard(y, chunk, n_threads)                            # its own inverse
    np.testing.assert_allclose(y, x, rtol=0, atol=1e-5 * np.abs(x).max())


def test_hadamard_rejects_chunks_that_are_no_power_of_two_or_do_not_divide_the_row():
    x = np.zeros((2, 96), F32)
    for chunk in (0, 3, 48, 64):
        with pytest.raises(ValueError):
            ops.hadamard(x, chunk)


@pytest.mark.parametrize("which,cache,head,expected", [
    ("k", "q8_0", 64, 64), ("k", "q8_0", 128, 128), ("k", "q8_0", 256, 256), ("k", "q8_0", 192, 64),
    ("k", "q8_0", 320, 64), ("k", "q8_0", 96, 0), ("k", "q8_0", 32, 0), ("k", "f16", 128, 0), ("k", "f32", 64, 0),
    ("v", "q8_0", 64, 64), ("v", "q8_0", 256, 64), ("v", "q8_0", 96, 0), ("v", "f16", 128, 0),
])
def test_rotation_follows_llama_cpp(which, cache, head, expected):
    """llama_kv_cache: attn_rot_k/v when the cache type is quantized and the head size a multiple
    of 64; K's matrix is the largest power of two dividing the head size, V's 64."""
    assert rotation(which, cache, head) == expected


def tiny(head_dim: int, path) -> None:
    types = {k: GGMLType.F16 for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                        "ffn_down", "token_embd", "output")}
    write_tiny_model(TinyModel("llama", n_embd=256, head_dim=head_dim, n_head=256 // head_dim,
                               n_head_kv=max(1, 128 // head_dim), n_ff=320, n_layer=2, types=types),
                     path, np.random.default_rng(head_dim))


@pytest.mark.parametrize("head_dim", [64, 128, 32])
def test_quantized_k_cache_gives_llama_cpp_logits_to_the_bit(tmp_path, head_dim):
    """A q8_0 K cache (rotated for head sizes 64 and 128, not for 32), before and after a K shift
    (the shift rotates K back, re-applies RoPE and rotates it again). llama.cpp 0.3.36 crashes
    shifting an unrotated quantized K cache (build_rope_shift multiplies by a null rotation), so
    head size 32 is compared without the shift."""
    path = tmp_path / "m.gguf"
    tiny(head_dim, path)
    tokens = [1] + [int(t) for t in np.random.default_rng(1).integers(3, N_VOCAB - 2, 15)]
    steps = [(tokens[:12], 0, 5), (tokens[12:], 17, 0)] if rotation("k", "q8_0", head_dim) else [(tokens, 0, 0)]
    peer = LlamaDecoder(path, type_k=8, type_v=1)
    try:
        theirs = []
        for chunk, start, shift in steps:
            theirs.append(peer.decode(chunk, start))
            if shift:
                peer.seq_add(0, 0, -1, shift)
    finally:
        peer.close()
    with Model.load(path) as model, Context(model, n_ctx=256, type_k="q8_0", type_v="f16") as ctx:
        for (chunk, start, shift), expected in zip(steps, theirs):
            batch = Batch(len(chunk))
            for k, tok in enumerate(chunk):
                batch.add(tok, start + k, [0], True)
            assert ctx.decode(batch) == 0
            np.testing.assert_array_equal(ctx.get_logits(), expected)
            if shift:
                ctx.memory.seq_add(0, 0, -1, shift)


def test_quantized_v_cache_is_rotated_and_back(tmp_path):
    """llama.cpp accepts a quantized V cache only with flash attention, which gguflm does not
    reproduce, so this checks the rotation on its own: with a q8_0 V cache the logits stay close
    to the f16 cache's (V rotated before the store and the output rotated back)."""
    path = tmp_path / "m.gguf"
    tiny(64, path)
    tokens = [1] + list(range(40, 60))
    logits = {}
    with Model.load(path) as model:
        for tv in ("f16", "q8_0"):
            with Context(model, n_ctx=256, type_k="f16", type_v=tv) as ctx:
                batch = Batch(len(tokens))
                for k, tok in enumerate(tokens):
                    batch.add(tok, k, [0], True)
                assert ctx.decode(batch) == 0
                logits[tv] = ctx.get_logits().copy()
    spread = logits["f16"].max() - logits["f16"].min()
    assert 0 < np.abs(logits["q8_0"] - logits["f16"]).max() < 0.02 * spread
