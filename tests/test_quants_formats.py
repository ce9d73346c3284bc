"""Formats: byte identity with ggml's own output and the gguf package, round-trip error bounds."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gguflm.quants as q
from gguflm import system
from gguflm.ggml_types import GGMLType
from gguflm.testing import strategies as gst
import _ggml
from quants_oracles import DOT_TYPES, GRID_IQ_TYPES, check_fp16_conversions, generate_data, gguf_tensors

ALL_TYPES = [f.type for f in q.formats() if f.type not in GRID_IQ_TYPES]
GGUF_QUANTIZES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
GGUF_DEQUANTIZES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def test_registry_lists_every_brief_format():
    names = {f.name for f in q.formats()}
    value_table_and_ternary = {"IQ4_NL", "IQ4_XS", "MXFP4", "TQ1_0", "TQ2_0"}
    assert names == {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
                     "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K",
                     "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"} | value_table_and_ternary
    for f in q.formats():
        assert (f.block_size, f.type_size) == (f.type.block_size, f.type.type_size)
        assert q.get(f.name) is f and q.get(f.type) is f and q.get(f.name.lower()) is f


def test_vec_dot_types_are_ggmls():
    expected = {"Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q8_0": "Q8_0", "Q4_1": "Q8_1", "Q5_1": "Q8_1",
                "Q2_K": "Q8_K", "Q3_K": "Q8_K", "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K",
                "F16": "F16", "BF16": "BF16", "F32": "F32", "Q8_1": None, "Q8_K": None}
    for name, partner in expected.items():
        vdt = q.get(name).vec_dot_type
        assert (vdt.name if vdt is not None else None) == partner


def test_registry_errors():
    with pytest.raises(ValueError, match="unknown"):
        q.get("Q9_9")
    with pytest.raises(ValueError, match="not handled"):
        q.get(GGMLType.I32)
    with pytest.raises(TypeError):
        q.get(12)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_quantize_matches_ggml_reference_output(reference_dir, name):
    folder = reference_dir / "quants"
    info = json.loads((folder / "README.json").read_text())["types"][name]
    rows = np.load(folder / "rows.npy")
    expected = np.load(folder / f"{name}.npy")
    fmt = q.get(name)
    assert (fmt.block_size, fmt.type_size) == (info["block"], info["bytes_per_block"])
    got = fmt.quantize(rows)
    assert got.shape == expected.shape
    bad = np.flatnonzero((got.reshape(-1, fmt.type_size) != expected.reshape(-1, fmt.type_size)).any(-1))
    assert bad.size == 0, f"{name}: blocks {bad.tolist()} differ from ggml's"


@pytest.mark.parametrize("name", GGUF_QUANTIZES)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_quantize_matches_gguf_package(name, data):
    fmt = q.get(name)
    block = max(fmt.block_size, 32)
    x = data.draw(gst.float_rows(st.integers(1, 4).map(lambda b: b * block), st.integers(1, 3), max_magnitude=2e5))
    with np.errstate(all="ignore"):  # tiny blocks overflow 1/d to inf in both implementations
        expected = gguf.quants.quantize(x, gguf.GGMLQuantizationType[name]).view(np.uint8).reshape(x.shape[0], -1)
    assert np.array_equal(fmt.quantize(x), expected)


@pytest.mark.parametrize("name", GGUF_DEQUANTIZES)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_dequantize_matches_gguf_package(name, data):
    fmt = q.get(name)
    blob = data.draw(gst.quantized_blocks(fmt, st.integers(1, 3 * 256 // max(fmt.block_size, 32) + 1)))
    expected = gguf.quants.dequantize(blob, gguf.GGMLQuantizationType[name]).reshape(-1)
    got = fmt.dequantize(blob)
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), expected.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("isa", system.supported_isas())
def test_fp16_conversion_is_exact_both_ways(isa):
    f16 = q.get("F16")  # F16C rows in the SIMD ISAs, the portable ones in scalar
    with system.using(isa=isa):
        check_fp16_conversions(f16.dequantize, lambda x: f16.quantize(x).view(np.uint16))
        check_fp16_conversions(lambda h: q.get_rows(h[None].view(np.uint8), "F16", np.zeros(1, np.int32))[0],
                               lambda x: q.quantize_rows_for_dot("F16", x[None]).view(np.uint16)[0])


def test_bf16_nan_stays_nan_and_quiet():
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0], dtype=np.float32)
    back = q.get("BF16").dequantize(q.get("BF16").quantize(x))
    assert np.isnan(back[:2]).all() and np.array_equal(back[2:], x[2:])


# llama.cpp's test-quantize-fns thresholds
# (IQ1_M, which that test skips, with its bounds for the other sub-2-bit format, Q1_0)
MAX_TOTAL_ERROR = {GGMLType.Q2_K: 0.0075, GGMLType.Q3_K: 0.0040, GGMLType.IQ2_S: 0.0075, GGMLType.IQ3_S: 0.0040,
                   GGMLType.IQ3_XXS: 0.0050, GGMLType.IQ1_M: 0.025, GGMLType.TQ1_0: 0.01, GGMLType.TQ2_0: 0.01}
MAX_DOT_ERROR = {GGMLType.Q2_K: 0.04, GGMLType.IQ2_S: 0.04, GGMLType.IQ3_S: 0.04, GGMLType.IQ3_XXS: 0.04,
                 GGMLType.IQ1_M: 0.40, GGMLType.TQ1_0: 0.15, GGMLType.TQ2_0: 0.15}


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_round_trip_error_within_ggml_bounds(t):
    fmt = q.get(t)
    n = 32 * 128
    data = generate_data(0.0, n)
    rmse = np.sqrt(np.sum((fmt.dequantize(fmt.quantize_activations(data)).astype(np.float64) - data) ** 2)) / n
    assert rmse < MAX_TOTAL_ERROR.get(t, 0.002)
    # ggml's "reference implementation error": CPU from_float vs from_float_ref
    via_ref = fmt.dequantize(fmt.quantize(data)).astype(np.float64)
    via_act = fmt.dequantize(fmt.quantize_activations(data)).astype(np.float64)
    assert np.sqrt(np.sum((via_ref - via_act) ** 2)) / n < 0.0001


@pytest.mark.parametrize("t", DOT_TYPES, ids=lambda t: t.name)
def test_dot_error_within_ggml_bounds(t):
    fmt = q.get(t)
    n = 32 * 128
    a, b = generate_data(0.0, n), generate_data(1.0, n)
    err = abs(fmt.dot(fmt.quantize_activations(a), b) - float(np.dot(a.astype(np.float64), b))) / n
    assert err < MAX_DOT_ERROR.get(t, 0.02)


def test_quantize_errors():
    with pytest.raises(ValueError, match="multiple of 256"):
        q.get("Q4_K").quantize(np.zeros(100, np.float32))
    with pytest.raises(ValueError, match="1-D or 2-D"):
        q.get("Q8_0").quantize(np.zeros((2, 2, 32), np.float32))
    with pytest.raises(TypeError):
        q.get("Q8_0").quantize(np.array(["a"] * 32))
    with pytest.raises(ValueError, match="whole blocks"):
        q.get("Q8_0").dequantize(np.zeros(35, np.uint8))
    with pytest.raises(ValueError, match="take 68 bytes"):
        q.get("Q8_0").dequantize(np.zeros(34, np.uint8), n=64)


def test_quantize_shapes_round_trip():
    fmt = q.get("Q8_0")
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    one = fmt.quantize(x)
    assert one.shape == (68,) and fmt.dequantize(one).shape == (64,)
    two = fmt.quantize(np.stack([x, -x]))
    assert two.shape == (2, 68) and fmt.dequantize(two).shape == (2, 64)
    assert np.array_equal(two[0], one)
    assert fmt.quantize(np.zeros((3, 0), np.float32)).shape == (3, 0)


@pytest.mark.parametrize("model, name", [("gemma", "Q8_0"), ("gemma", "Q5_0"), ("gemma", "Q4_K"),
                                         ("gemma", "Q6_K"), ("smollm", "Q4_1"), ("smollm", "Q8_0")])
def test_real_model_tensors_dequantize_like_gguf(request, model, name):
    tensors = gguf_tensors(request.getfixturevalue(f"{model}_path"))
    chosen = [(t, rows) for t, dims, rows in tensors.values() if t.name == name][:3]
    assert chosen, f"{model} should hold {name} tensors"
    fmt = q.get(name)
    for t, rows in chosen:
        rows = np.ascontiguousarray(rows[:64])
        expected = gguf.quants.dequantize(rows, gguf.GGMLQuantizationType(int(t)))
        assert np.array_equal(fmt.dequantize(rows), expected)


def _rint_i8(v: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(v), -128, 127).astype(np.int8)


@settings(max_examples=30, deadline=None)
@given(x=gst.float_rows(256, st.integers(1, 3), max_magnitude=1e4))
def test_activation_quantizers_follow_ggml_x86(x):
    """Q8_0/Q8_1 as ggml's AVX code quantizes src1 (multiplier 127/amax, round half to even), Q8_K
    as its reference quantizer (scale -127/max of the signed largest magnitude), all in float32.
    Blocks whose multiplier overflows to inf (subnormal maxima) are left out: there ggml's
    rounding works on infinities and NaNs, which numpy cannot cast to int8 portably."""
    rows = x.reshape(-1, 32)
    amax = np.abs(rows).max(axis=1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
        qs = _rint_i8(np.where(np.isfinite(inv), rows * inv, 0))
    ok = np.isfinite(inv[:, 0])
    q8_0 = q.get("Q8_0").quantize_activations(x).reshape(-1, 34)
    assert np.array_equal(q8_0[:, :2].copy().view(np.float16)[:, 0], d[:, 0].astype(np.float16))
    assert np.array_equal(q8_0[ok, 2:].view(np.int8), qs[ok])
    q8_1 = q.get("Q8_1").quantize_activations(x).reshape(-1, 36)
    with np.errstate(over="ignore"):  # s may overflow fp16 to inf, in ggml as here
        s = (d[:, 0] * qs.astype(np.int32).sum(axis=1).astype(np.float32)).astype(np.float16)
    assert np.array_equal(q8_1[ok, 2:4].copy().view(np.float16)[:, 0], s[ok])
    assert np.array_equal(q8_1[ok, 4:].view(np.int8), qs[ok])

    blocks = x.reshape(-1, 256)
    signed_max = blocks[np.arange(len(blocks)), np.abs(blocks).argmax(axis=1)][:, None]
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        iscale = np.float32(-127) / signed_max
        ok = np.isfinite(iscale[:, 0])
        qk = np.where(ok[:, None], np.minimum(np.rint(np.where(ok[:, None], iscale * blocks, 0)), 127), 0).astype(np.int8)
        dk = np.where(ok, np.float32(1) / iscale[:, 0], 0).astype(np.float32)
    q8_k = q.get("Q8_K").quantize_activations(x).reshape(-1, 292)
    assert np.array_equal(q8_k[ok, :4].copy().view(np.float32)[:, 0].view(np.uint32), dk[ok].view(np.uint32))
    assert np.array_equal(q8_k[ok, 4:260].view(np.int8), qk[ok])
    assert np.array_equal(q8_k[ok, 260:].copy().view(np.int16), qk[ok].reshape(-1, 16, 16).sum(-1, dtype=np.int16))


def _activation_edge_rows(rng: np.random.Generator) -> np.ndarray:
    """Rows of whole 256-element super-blocks whose 32-element blocks hit the activation
    quantizers' edge cases: ties after scaling, zeros, the largest magnitude with both signs (the
    first decides Q8_K's sign), subnormal maxima (the multiplier overflows), infinities, NaNs."""
    blocks = [rng.standard_normal(32) * 3, np.zeros(32), np.arange(-16, 16) + 0.5,
              np.r_[127.0, -127.0, np.arange(30) - 15.5], np.r_[-5.0, rng.uniform(-5, 5, 30), 5.0],
              rng.standard_normal(32) * 1e-40, np.r_[np.inf, rng.standard_normal(31)],
              np.r_[rng.standard_normal(31), np.nan], np.r_[-np.inf, np.zeros(31)], rng.standard_normal(32) * 1e30]
    rows = [np.concatenate([blocks[(i + j) % len(blocks)] for j in range(8)]) for i in range(len(blocks))]
    rows.append(np.r_[rng.standard_normal(255), -40.0])           # Q8_K: the maximum last, negative
    rows.append(np.r_[-7.0, rng.uniform(-6, 6, 254), 7.0])        # Q8_K: both signs, the first wins
    return np.array(rows, dtype=np.float32)


@pytest.mark.parametrize("name", ["Q8_0", "Q8_1", "Q8_K"])
def test_activation_quantizers_agree_on_every_isa(name):
    """The vector activation quantizers (AVX2, AVX-512) give the scalar code's bytes on every edge case."""
    x = _activation_edge_rows(np.random.default_rng(7))
    fmt = q.get(name)
    outs = {}
    for isa in system.supported_isas():
        with system.using(isa=isa):
            outs[isa] = fmt.quantize_activations(x)
    for isa, out in outs.items():
        assert np.array_equal(out, outs["scalar"]), isa


@pytest.mark.parametrize("name", ["Q8_0", "Q8_1", "Q8_K"])
def test_activation_quantizers_are_ggml_from_float(name):
    """ggml-cpu's own from_float gives the same bytes on the edge rows' blocks that it defines
    (finite, with a normal or zero maximum)."""
    _ggml.require_ggml()
    x = _activation_edge_rows(np.random.default_rng(7))
    fmt = q.get(name)
    size, row = fmt.block_size, fmt.row_bytes(fmt.block_size)
    amax = np.abs(x.reshape(-1, size)).max(axis=1)
    ok = np.isfinite(amax) & ((amax == 0) | (amax > 1e-30))
    theirs = _ggml.from_float(int(fmt.type), x.reshape(-1)).reshape(-1, row)
    assert np.array_equal(fmt.quantize_activations(x).reshape(-1, row)[ok], theirs[ok])
