"""Independent numpy references for the quantization tests (float64, written from ggml's formulas)."""

from __future__ import annotations

import numpy as np

import gguflm.quants as q
from gguflm.ggml_types import GGMLType

# formats ggml quantizes only with an importance matrix (ggml_quantize_requires_imatrix):
# tests/test_quants_iq.py checks them with imatrices and generated blocks
GRID_IQ_TYPES = frozenset({GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ1_S})
# the value-table and ternary formats: tests/ggml_lanes.py does not re-implement them, they
# are checked against ggml's own functions instead (tests/test_quants_lut.py)
LUT_TYPES = frozenset({GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4, GGMLType.TQ1_0, GGMLType.TQ2_0})

# every format that has a dot kernel (tests on generated blocks)
KERNEL_TYPES = [f.type for f in q.formats() if f.vec_dot_type is not None]
# every format that has a dot kernel and a quantizer
DOT_TYPES = [t for t in KERNEL_TYPES if t not in GRID_IQ_TYPES]
# the ones tests/ggml_lanes.py re-implements in numpy
LANES_TYPES = [t for t in KERNEL_TYPES if t not in LUT_TYPES]


def generate_data(offset: float, n: int, amplitude: float = 2.0) -> np.ndarray:
    """llama.cpp's test-quantize-fns synthetic data: 0.1 + amplitude*cos(i + offset)."""
    i = np.arange(n, dtype=np.float32) + np.float32(offset)
    return (0.1 + np.float64(np.float32(amplitude) * np.cos(i).astype(np.float32))).astype(np.float32)


def partner_values(wtype: GGMLType, xq: np.ndarray, n_in: int) -> tuple[np.ndarray, np.ndarray]:
    """Dequantized activations [n_tok, n_in] and, for Q8_1 partners, the stored per-block
    s = fp16(d * sum(qs)) [n_tok, n_blocks] (zeros otherwise), both float64."""
    fmt = q.get(wtype)
    partner = q.get(fmt.vec_dot_type)
    x = partner.dequantize(xq, n_in).astype(np.float64).reshape(-1, n_in)
    s = np.zeros((x.shape[0], n_in // 32))
    if partner.type == GGMLType.Q8_1:
        s = xq.reshape(x.shape[0], -1, 36)[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    return x, s


def check_fp16_conversions(to_fp32, to_fp16) -> None:
    """Assert that to_fp32(uint16 halves) and to_fp16(float32) convert like numpy on every half and
    on a dense sweep of float bit patterns, halfway cases included, and that NaNs become quiet
    NaNs keeping their top payload bits (what vcvtps2ph does; numpy does not say)."""
    halves = np.arange(1 << 16, dtype=np.uint16)
    back = to_fp32(halves)
    ref = halves.view(np.float16).astype(np.float32)
    finite = np.isfinite(ref)
    assert np.array_equal(back[finite].view(np.uint32), ref[finite].view(np.uint32))
    assert np.array_equal(np.isnan(back), np.isnan(ref))
    bits = np.concatenate([np.arange(0, 1 << 32, 4099, dtype=np.uint64),
                           (np.arange(1 << 16, dtype=np.uint64) << 13) + 0x1000]).astype(np.uint32)
    x = bits.view(np.float32)
    nan = np.isnan(x)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = x.astype(np.float16).view(np.uint16)
    got = to_fp16(x)
    assert np.array_equal(got[~nan], expected[~nan])
    quiet = ((bits[nan] >> 16) & 0x8000) | 0x7E00 | ((bits[nan] >> 13) & 0x3FF)
    assert np.array_equal(got[nan], quiet.astype(np.uint16))


# byte offset of the fp16 dmin of K-quants with a min
_DMIN_OFFSET = {GGMLType.Q2_K: 82, GGMLType.Q4_K: 2, GGMLType.Q5_K: 2}


# bytes of quants at the start of a block, for the types whose dots take an offset off through bsums
_OFFSET_QUANTS = {GGMLType.Q6_K: 192, GGMLType.TQ1_0: 52, GGMLType.TQ2_0: 64}


def weight_parts(wtype: GGMLType, w: np.ndarray, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dequantized rows without their min part [rows, n_in], the min part [rows, n_in],
    Q4_1/Q5_1 per-block min m [rows, n_blocks]), float64.

    ggml applies Q4_1/Q5_1 mins through the activation's s, so those rows come without m; a
    K-quant's row is d*sc*q - dmin*mn, split by dequantizing with dmin zeroed; Q6_K's row
    d*sc*(q - 32) and TQ1_0/TQ2_0's d*(q - 1) are split likewise, as ggml takes the offset off
    through the activation's bsums (in other lanes than the products). The parts matter for rounding tolerances: float sums
    round relative to each part, not to their difference."""
    fmt = q.get(wtype)
    blocks = np.array(w, dtype=np.uint8).reshape(-1, fmt.row_bytes(n_in) // fmt.type_size, fmt.type_size)
    rows = fmt.dequantize(blocks.reshape(blocks.shape[0], -1), n_in).astype(np.float64)
    m = np.zeros((rows.shape[0], n_in // 32))
    mins = np.zeros_like(rows)
    if wtype in (GGMLType.Q4_1, GGMLType.Q5_1):
        m = blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
        rows = rows - np.repeat(m, 32, axis=1)
    elif wtype in _DMIN_OFFSET:
        o = _DMIN_OFFSET[wtype]
        blocks[:, :, o:o + 2] = 0
        scaled = fmt.dequantize(blocks.reshape(blocks.shape[0], -1), n_in).astype(np.float64)
        mins, rows = scaled - rows, scaled
    elif wtype in _OFFSET_QUANTS:
        # every quant 0: the block dequantizes to its offset (Q6_K d*sc*(-32), TQ -d), which ggml
        # takes off through the activation's bsums
        blocks[:, :, :_OFFSET_QUANTS[wtype]] = 0
        mins = -fmt.dequantize(blocks.reshape(blocks.shape[0], -1), n_in).astype(np.float64)
        rows = rows + mins
    return rows, mins, m


def reference_matmul(wtype: GGMLType, w: np.ndarray, xq: np.ndarray, n_in: int) -> tuple[np.ndarray, np.ndarray]:
    """(W . x in float64 [n_tok, n_rows], sum of |terms| for a rounding tolerance)."""
    wd, wmin, m = weight_parts(wtype, w, n_in)
    xd, s = partner_values(wtype, xq, n_in)
    out = xd @ (wd - wmin).T + s @ m.T
    mag = np.abs(xd) @ (np.abs(wd) + np.abs(wmin)).T + np.abs(s) @ np.abs(m).T
    return out, mag


_GGUF_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_tensors(path) -> dict[str, tuple[GGMLType, tuple[int, ...], np.ndarray]]:
    """name -> (type, dims, raw bytes) of a GGUF file's tensors. A minimal header walk: the gguf
    package's reader parses every vocabulary string into numpy objects, which takes half a minute
    on a 262144-token vocabulary; here only the byte ranges are needed."""
    import struct

    raw = np.memmap(path, dtype=np.uint8, mode="r")
    buf = memoryview(raw)
    pos = 24
    n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)

    def string() -> str:
        nonlocal pos
        (n,) = struct.unpack_from("<Q", buf, pos)
        pos += 8 + n
        return bytes(buf[pos - n:pos]).decode()

    def skip_value(vtype: int) -> None:
        nonlocal pos
        if vtype == 8:
            string()
        elif vtype == 9:
            itype, count = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            if itype in (8, 9):
                for _ in range(count):
                    skip_value(itype)
            else:
                pos += count * _GGUF_SCALAR_SIZES[itype]
        else:
            pos += _GGUF_SCALAR_SIZES[vtype]

    alignment = 32
    for _ in range(n_kv):
        key = string()
        (vtype,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", buf, pos)
        skip_value(vtype)
    infos = []
    for _ in range(n_tensors):
        name = string()
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
        ttype, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        infos.append((name, GGMLType(ttype), dims, offset))
    data_start = (pos + alignment - 1) // alignment * alignment
    tensors = {}
    for name, ttype, dims, offset in infos:
        n_rows = int(np.prod(dims[1:], dtype=np.int64))
        row = ttype.row_bytes(dims[0])
        start = data_start + offset
        tensors[name] = (ttype, dims, raw[start:start + n_rows * row].reshape(n_rows, row))
    return tensors
