"""The grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) against what others wrote.

Grids and sign tables against the ``gguf`` package's own encoding of them; dequantize against the
``gguf`` package and libggml-base's ``to_float``; the dots of every ISA against ggml-cpu's
``vec_dot`` and ``mul_mat`` (vec_dot for single tokens, the tiled GEMM for 8+), bit for bit; tiny
models whose matrices use these types against llama.cpp's logits.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _ggml
import gguflm.quants as q
import gguflm.testing.strategies as gst
from _ggml import require_ggml
from gguflm import Model, system
from gguflm._ext import quants as _k
from gguflm.ggml_types import GGMLType
from gguflm.testing import random_blocks

IQ_TYPES = [GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ1_S,
            GGMLType.IQ1_M]
ids = [t.name for t in IQ_TYPES]

# ggml table -> (gguf class, entries, values per entry, signed bytes)
GRIDS = {"iq2xxs_grid": (gguf.quants.IQ2_XXS, 256, 8, False), "iq2xs_grid": (gguf.quants.IQ2_XS, 512, 8, False),
         "iq2s_grid": (gguf.quants.IQ2_S, 1024, 8, False), "iq3xxs_grid": (gguf.quants.IQ3_XXS, 256, 4, False),
         "iq3s_grid": (gguf.quants.IQ3_S, 512, 4, False), "iq1s_grid": (gguf.quants.IQ1_S, 2048, 8, True)}


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_grids_are_the_gguf_packages(name):
    cls, n, width, signed = GRIDS[name]
    cls.init_grid()
    theirs = np.asarray(cls.grid, dtype=np.float64).reshape(n, width)
    ours = np.frombuffer(_k.iq_grid_tables()[name], dtype=np.int8 if signed else np.uint8).reshape(n, width)
    np.testing.assert_array_equal(ours, theirs)


def test_sign_tables_are_the_gguf_packages():
    tables = _k.iq_grid_tables()
    ksigns = np.frombuffer(tables["ksigns_iq2xs"], dtype=np.uint8)
    assert ksigns.tobytes() == gguf.quants.IQ2_XXS.ksigns
    # bit 7 makes the number of minus signs even; ksigns64 is the same as bytes 0xff / 0x00
    bits = (ksigns[:, None] >> np.arange(8)) & 1
    assert np.all(bits.sum(1) % 2 == 0) and np.array_equal(ksigns & 127, np.arange(128))
    np.testing.assert_array_equal(np.frombuffer(tables["ksigns64"], np.uint8).reshape(128, 8), bits * 0xFF)


def test_formats_and_errors():
    sizes = {"IQ2_XXS": 66, "IQ2_XS": 74, "IQ2_S": 82, "IQ3_XXS": 98, "IQ3_S": 110, "IQ1_S": 50, "IQ1_M": 56}
    for name, size in sizes.items():
        fmt = q.get(name)
        assert (fmt.block_size, fmt.type_size, fmt.vec_dot_type) == (256, size, GGMLType.Q8_K)
        with pytest.raises(ValueError, match="multiple of 256"):
            fmt.dequantize(np.zeros(size, np.uint8), n=128)


@pytest.mark.parametrize("t", IQ_TYPES, ids=ids)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_dequantize_is_ggml_and_gguf(t, data):
    require_ggml()
    fmt = q.get(t)
    blob = data.draw(gst.quantized_blocks(fmt, st.integers(1, 6)))
    ours = fmt.dequantize(blob)
    np.testing.assert_array_equal(ours.view(np.uint32), _ggml.to_float(t, blob, ours.size).view(np.uint32))
    theirs = gguf.quants.dequantize(blob.reshape(-1, fmt.type_size), gguf.GGMLQuantizationType[t.name]).reshape(-1)
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32))


def _q8_K_with_minus_128(rng: np.random.Generator, nb: int) -> np.ndarray:
    """Q8_K activations that hold -128 (ggml's quantizer never writes it; its sign tricks wrap it)."""
    blocks = random_blocks(q.get("Q8_K"), nb, rng).reshape(nb, 292)
    qs = blocks[:, 4:260].view(np.int8)
    qs[rng.random(qs.shape) < 0.1] = -128
    blocks[:, 260:292] = qs.reshape(nb, 16, 16).sum(-1, dtype=np.int16).view(np.uint8).reshape(nb, 32)
    return blocks.reshape(-1)


@pytest.mark.parametrize("t", IQ_TYPES, ids=ids)
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_vec_dot_is_ggml_vec_dot_on_every_isa(t, data):
    """Bit for bit: the integer lanes, the fma per super-block and the final sums are ggml's."""
    require_ggml()
    nb = data.draw(st.integers(1, 5))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    w = random_blocks(q.get(t), nb, rng)
    xq = _q8_K_with_minus_128(rng, nb) if data.draw(st.booleans()) else random_blocks(q.get("Q8_K"), nb, rng)
    expected = _ggml.vec_dot(t, w, xq, 256 * nb)
    for isa in system.supported_isas():
        with system.using(isa=isa):
            got = np.float32(_k.vec_dot(int(t), w, xq, 256 * nb))
        assert got.view(np.uint32) == expected.view(np.uint32), (isa, got, expected)


@pytest.mark.parametrize("t", IQ_TYPES, ids=ids)
def test_matmul_is_ggml_mul_mat(t):
    """Single tokens through vec_dot, batches of 8+ through ggml-cpu's tiled GEMM (one exact integer
    per super-block); every ISA and thread count bit-identical with ggml's mul_mat. 16+ tokens go
    through the K GEMM: 28 rows are whole strips and a part (16 rows a strip on AVX-512, 8 on
    AVX2), 5 super-blocks a whole pass of decoded super-blocks and a part."""
    require_ggml()
    rng = np.random.default_rng(int(t))
    n_rows, n_in = 28, 1280
    w = random_blocks(q.get(t), n_rows * n_in // 256, rng).reshape(n_rows, -1)
    for n_tok in (1, 3, 8, 13, 21):   # 21: a whole 16-token tile of the tiled path and 5 more
        x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
        expected = _ggml.mul_mat(t, w, n_in, x)
        for isa in system.supported_isas():
            for n_threads in (1, 2):
                with system.using(isa=isa):
                    got = q.matmul(w, t, x, n_threads=n_threads)
                np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32),
                                              err_msg=f"{isa} n_tok {n_tok} n_threads {n_threads}")


def test_get_rows_is_dequantize():
    rng = np.random.default_rng(5)
    for t in IQ_TYPES:
        w = random_blocks(q.get(t), 6, rng).reshape(3, -1)
        np.testing.assert_array_equal(q.get_rows(w, t, np.array([2, 0])), q.get(t).dequantize(w)[[2, 0]])


def test_loader_rejects_nan_iq1_m_scale(tmp_path):
    from gguflm.loader import InvalidTensorDataError, Weight, check_tensor_data
    blob = random_blocks(q.get("IQ1_M"), 2, np.random.default_rng(0)).reshape(2, 56)
    w = Weight("blk.0.ffn_up.weight", GGMLType.IQ1_M, (512,), blob.reshape(-1))
    check_tensor_data(w, "test")
    sc = blob[1, 48:56].copy().view(np.uint16)   # a NaN scale (0x7e00), a nibble per scale word
    for k in range(4):
        sc[k] = (sc[k] & 0x0FFF) | (((0x7E00 >> (4 * k)) & 0xF) << 12)
    blob[1, 48:56] = sc.view(np.uint8)
    with pytest.raises(InvalidTensorDataError):
        check_tensor_data(Weight("blk.0.ffn_up.weight", GGMLType.IQ1_M, (512,), blob.reshape(-1)), "test")


@pytest.mark.parametrize("t", IQ_TYPES, ids=ids)
def test_tiny_models_equal_llama_cpp(tmp_path, t):
    """Every layer matrix in the type (quantized by ggml): position 0 is llama.cpp's
    bit for bit, a token at a time (vec_dot) and as one batch (the tiled GEMM); later positions,
    where attention's float order differs, to 1e-4 of the logits' range with the same top-1."""
    require_ggml()
    import llama_cpp
    from tiny_models import MATRIX_KINDS, TinyModel, prompt_logits, write_tiny_model
    types = {kind: t for kind in MATRIX_KINDS if kind not in ("token_embd", "output")}  # a quick quantization
    spec = TinyModel("llama", tied_output=False, types=types)
    path = tmp_path / f"llama-{t.name}.gguf"
    write_tiny_model(spec, path, np.random.default_rng(int(t)))
    assert {w.type for name, w in Model.load(path).tensors.items() if name.endswith("_up.weight")} == {t}
    tokens = np.random.default_rng(1).integers(3, 300, 20)   # 20: the batch takes the K GEMM on AVX-512
    for n_ubatch in (1, 256):
        llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=256, n_batch=256, n_ubatch=n_ubatch, n_threads=2,
                              n_threads_batch=2, verbose=False)
        llm.eval(list(tokens))
        theirs = np.asarray(llm.scores[:len(tokens)], dtype=np.float32)
        with _ggml.same_arithmetic():
            ours = prompt_logits(path, tokens, n_ubatch)
        np.testing.assert_array_equal(ours[0].view(np.uint32), theirs[0].view(np.uint32), err_msg=f"n_ubatch {n_ubatch}")
        assert np.abs(ours - theirs).max() <= 1e-4 * (theirs.max() - theirs.min())
        assert np.array_equal(ours.argmax(1), theirs.argmax(1))


@pytest.mark.parametrize("t", IQ_TYPES, ids=ids)
def test_tiny_models_same_floats_at_every_thread_count(tmp_path, t):
    """Every layer matrix in the type: for each ubatch split (single tokens: vec_dot; 5: the tiled
    tiles; 20: on AVX-512 the K GEMM, 16 rows decoded per pass) the logits are bit-identical at 1
    to 4 threads, and never NaN."""
    from test_invariance import prompt_logits as logits_at
    from tiny_models import MATRIX_KINDS, TinyModel, write_tiny_model
    types = {kind: t for kind in MATRIX_KINDS if kind not in ("token_embd", "output")}
    path = tmp_path / f"llama-{t.name}.gguf"
    write_tiny_model(TinyModel("llama", n_ff=1280, tied_output=False, types=types), path,
                     np.random.default_rng(int(t) + 1))
    tokens = [1] + [int(v) for v in np.random.default_rng(2).integers(3, 300, 19)]
    with Model.load(path) as model:
        for n_ubatch in (1, 5, 20):
            first = logits_at(model, tokens, 1, n_ubatch, "f16", "f16")
            assert not np.isnan(first).any()
            for n_threads in (2, 3, 4):
                got = logits_at(model, tokens, n_threads, n_ubatch, "f16", "f16")
                np.testing.assert_array_equal(got.view(np.uint32), first.view(np.uint32),
                                              err_msg=f"n_ubatch {n_ubatch} n_threads {n_threads}")


QUANTIZED = IQ_TYPES
NEEDS_IMATRIX = (GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ1_S)   # ggml_quantize_requires_imatrix


@pytest.mark.parametrize("t", QUANTIZED, ids=[t.name for t in QUANTIZED])
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_quantize_is_ggml_quantize_chunk(t, data):
    """Byte for byte, without and with importance weights, on adversarial rows (zero, constant and
    tiny sub-blocks included, which ggml skips: IQ3_S then packs the next ones into their place;
    IQ1's sorted splits keep equal values in index order)."""
    require_ggml()
    x = data.draw(gst.float_rows(st.integers(1, 3).map(lambda b: 256 * b), st.integers(1, 3), max_magnitude=1e4))
    imatrix = data.draw((st.nothing() if t in NEEDS_IMATRIX else st.none()) | gst.imatrices(x.shape[1]))
    expected = _ggml.quantize_chunk(t, x, imatrix)
    got = q.get(t).quantize(x, imatrix=imatrix)
    bad = np.flatnonzero((got.reshape(-1, q.get(t).type_size) != expected.reshape(-1, q.get(t).type_size)).any(-1))
    assert bad.size == 0, f"blocks {bad.tolist()} differ from ggml's"


def test_quantize_needs_what_ggml_needs():
    x = np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)
    for t in NEEDS_IMATRIX:
        with pytest.raises(ValueError, match=f"{t.name} quantization needs an importance matrix"):
            q.get(t).quantize(x)
    with pytest.raises(ValueError, match="one weight per column"):
        q.get("IQ3_S").quantize(x, imatrix=np.ones(128, np.float32))
    # ggml's search on real data stays close: the round trip error of a 3-bit format
    y = q.get("IQ3_S").dequantize(q.get("IQ3_S").quantize(x))
    assert np.sqrt(np.mean((y - x) ** 2)) < 0.25 * np.sqrt(np.mean(x ** 2))
