"""ggml's CPU matmul arithmetic re-implemented in numpy: the test oracle for exact dot products.

Written from ggml-cpu's x86 source (``arch/x86/quants.c`` AVX2 branches, ``vec.cpp``,
``llamafile/sgemm.cpp``, ``arch/x86/repack.cpp``, ``tiled/`` AVX2 kernel, the AVX-512 and
AVX512_BF16 branches of the float dots), the Intel SDM (VDPBF16PS) and the instructions GCC 12
emitted for llama-cpp-python 0.3.36's builds (which ops it fused into FMAs, how it vectorized
plain loops), independently of gguflm's C kernels: blocks are decoded here from their byte layout, integer sums are formed in
int64, and every float operation is a float32 numpy operation in ggml's order. ``fma32`` rounds
once, exactly, through a double-double sum.

Every function returns float32 and takes raw blocks as uint8 arrays: weights [n_rows, row bytes],
activations [n_tok, row bytes] already in the weight type's dot partner (F16/BF16/F32 activations
are rows of that type).
"""

from __future__ import annotations

import numpy as np

from gguflm.ggml_types import GGMLType as T

F32 = np.float32


# ---------------------------------------------------------------- float helpers

def fma32(a, b, c) -> np.ndarray:
    """a*b + c on float32 values with a single rounding (x86 vfmadd)."""
    a64, b64, c64 = (np.asarray(v, F32).astype(np.float64) for v in (a, b, c))
    p = a64 * b64                       # exact: 24 + 24 bits
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)   # p + c == s + err exactly (TwoSum)
    r = s.astype(F32)
    up = np.nextafter(r, F32(np.inf))
    down = np.nextafter(r, F32(-np.inf))
    r64 = r.astype(np.float64)
    # s on a float32 midpoint: round-to-nearest-even chose r, the dropped err decides the side
    r = np.where((s == (r64 + up.astype(np.float64)) / 2) & (err > 0), up, r)
    r = np.where((s == (r64 + down.astype(np.float64)) / 2) & (err < 0), down, r)
    return r.astype(F32)


def hsum_movehl(v: np.ndarray) -> np.ndarray:
    """ggml's hsum_float_8 (and sgemm's hsum) over the last axis of 8 lanes."""
    v = v.astype(F32)
    t = v[..., 4:] + v[..., :4]
    return (t[..., 0] + t[..., 2]) + (t[..., 1] + t[..., 3])


def hsum_hadd(v: np.ndarray) -> np.ndarray:
    """GGML_F32x8_REDUCE's final step: high half onto the low one, then two hadds."""
    v = v.astype(F32)
    t = v[..., :4] + v[..., 4:]
    return (t[..., 0] + t[..., 1]) + (t[..., 2] + t[..., 3])


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16).astype(F32)[..., 0]


def _u32(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.uint32)[..., 0].astype(np.int64)


# ---------------------------------------------------------------- block decoding

BLOCK_BYTES = {T.Q4_0: 18, T.Q4_1: 20, T.Q5_0: 22, T.Q5_1: 24, T.Q8_0: 34, T.Q8_1: 36,
               T.Q2_K: 84, T.Q3_K: 110, T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210, T.Q8_K: 292,
               T.IQ2_XXS: 66, T.IQ2_XS: 74, T.IQ2_S: 82, T.IQ3_XXS: 98, T.IQ3_S: 110, T.IQ1_S: 50, T.IQ1_M: 56}
GRID_IQ = (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M)
LEGACY = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)
KQUANTS = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K)
FLOATS = (T.F32, T.F16, T.BF16)


def _blocks(t: T, rows: np.ndarray) -> np.ndarray:
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    return rows.reshape(rows.shape[0], -1, BLOCK_BYTES[t])


def decode_legacy(t: T, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(quants [R, nb, 32] int64 as the dot multiplies them, d [R, nb], m [R, nb] or zeros)."""
    b = _blocks(t, rows)
    d = _f16(b[..., 0:2])
    m = np.zeros_like(d)
    if t == T.Q8_0:
        return b[..., 2:34].view(np.int8).astype(np.int64), d, m
    has_min = t in (T.Q4_1, T.Q5_1)
    off = 4 if has_min else 2
    if has_min:
        m = _f16(b[..., 2:4])
    qh = None
    if t in (T.Q5_0, T.Q5_1):
        qh = _u32(b[..., off:off + 4])
        off += 4
    qs = b[..., off:off + 16].astype(np.int64)
    q = np.concatenate([qs & 0xF, qs >> 4], axis=-1)
    if qh is not None:
        q = q | (((qh[..., None] >> np.arange(32)) & 1) << 4)
    if t == T.Q4_0:
        q = q - 8
    elif t == T.Q5_0:
        q = q - 16
    return q, d, m


def decode_q8(t: T, rows: np.ndarray) -> dict[str, np.ndarray]:
    """Activation blocks: d, qs (and s for Q8_1, bsums for Q8_K)."""
    b = _blocks(t, rows)
    if t == T.Q8_K:
        return {"d": np.ascontiguousarray(b[..., 0:4]).view(F32)[..., 0],
                "qs": b[..., 4:260].view(np.int8).astype(np.int64),
                "bsums": np.ascontiguousarray(b[..., 260:292]).view(np.int16).astype(np.int64)}
    out = {"d": _f16(b[..., 0:2])}
    off = 2
    if t == T.Q8_1:
        out["s"] = _f16(b[..., 2:4])
        off = 4
    out["qs"] = b[..., off:off + 32].view(np.int8).astype(np.int64)
    return out


def _scale_min_k4(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 8 six-bit scales and mins from the 12 packed bytes."""
    sc = sc.astype(np.int64)
    scales, mins = [], []
    for j in range(8):
        if j < 4:
            scales.append(sc[..., j] & 63)
            mins.append(sc[..., j + 4] & 63)
        else:
            scales.append((sc[..., j + 4] & 0xF) | ((sc[..., j - 4] >> 6) << 4))
            mins.append((sc[..., j + 4] >> 4) | ((sc[..., j] >> 6) << 4))
    return np.stack(scales, -1), np.stack(mins, -1)


def _q3_scales(sc: np.ndarray) -> np.ndarray:
    aux = np.ascontiguousarray(sc).view(np.uint32).astype(np.int64)
    k1, k2 = 0x03030303, 0x0F0F0F0F
    tmp = aux[..., 2]
    words = [(aux[..., 0] & k2) | (((tmp >> 0) & k1) << 4), (aux[..., 1] & k2) | (((tmp >> 2) & k1) << 4),
             ((aux[..., 0] >> 4) & k2) | (((tmp >> 4) & k1) << 4), ((aux[..., 1] >> 4) & k2) | (((tmp >> 6) & k1) << 4)]
    w = np.stack(words, -1).astype(np.uint32)
    return w.view(np.int8).reshape(*w.shape[:-1], 16).astype(np.int64) - 32


def decode_k(t: T, rows: np.ndarray) -> dict[str, np.ndarray]:
    """K super-blocks: q [R, nb, 256] signed as the dots multiply them (Q3_K/Q6_K offsets
    applied), sc16/mn16 [R, nb, 16] per 16 elements, sc32/mn32 per 32 (K4/K5), d, dmin."""
    b = _blocks(t, rows)
    e = np.arange(256)
    n, s, lane = e // 128, (e // 32) % 4, e % 32
    out: dict[str, np.ndarray] = {}
    if t in (T.Q2_K, T.Q3_K):
        qs = b[..., 16:80] if t == T.Q2_K else b[..., 32:96]
        q = (qs[..., 32 * n + lane].astype(np.int64) >> (2 * s)) & 3
        if t == T.Q2_K:
            raw = b[..., 0:16].astype(np.int64)
            out.update(sc16=raw & 0xF, mn16=raw >> 4, d=_f16(b[..., 80:82]), dmin=_f16(b[..., 82:84]))
        else:
            h = (b[..., lane].astype(np.int64) >> (e // 32)) & 1
            q = q + 4 * h - 4
            out.update(sc16=_q3_scales(b[..., 96:108]), d=_f16(b[..., 108:110]))
    elif t in (T.Q4_K, T.Q5_K):
        sc32, mn32 = _scale_min_k4(b[..., 4:16])
        qs = b[..., 16:144] if t == T.Q4_K else b[..., 48:176]
        j, hi = e // 64, (e % 64) // 32
        q = (qs[..., 32 * j + lane].astype(np.int64) >> (4 * hi)) & 0xF
        if t == T.Q5_K:
            q = q | (((b[..., 16 + lane].astype(np.int64) >> (e // 32)) & 1) << 4)
        out.update(sc32=sc32, mn32=mn32, sc16=np.repeat(sc32, 2, -1), mn16=np.repeat(mn32, 2, -1),
                   d=_f16(b[..., 0:2]), dmin=_f16(b[..., 2:4]))
    else:
        ql = b[..., 0:128][..., 64 * n + 32 * (s % 2) + lane].astype(np.int64)
        low = (ql >> (4 * (s // 2))) & 0xF
        high = (b[..., 128:192][..., 32 * n + lane].astype(np.int64) >> (2 * s)) & 3
        out["u"] = low | (high << 4)
        q = out["u"] - 32
        out.update(sc16=b[..., 192:208].view(np.int8).astype(np.int64), d=_f16(b[..., 208:210]))
    out["q"] = q
    return out


def _iq_grid(t: T) -> np.ndarray:
    """The gguf package's grid of t as integers [points, 8 or 4] (IQ1: -1, 0, 1)."""
    import gguf
    cls = {T.IQ2_XXS: gguf.quants.IQ2_XXS, T.IQ2_XS: gguf.quants.IQ2_XS, T.IQ2_S: gguf.quants.IQ2_S,
           T.IQ3_XXS: gguf.quants.IQ3_XXS, T.IQ3_S: gguf.quants.IQ3_S, T.IQ1_S: gguf.quants.IQ1_S,
           T.IQ1_M: gguf.quants.IQ1_S}[t]
    cls.init_grid()
    return np.asarray(cls.grid).reshape(cls.grid_shape).astype(np.int64)


def _bits(b: np.ndarray, n: int) -> np.ndarray:
    """[..., k] bytes -> [..., k * 8 // n ...]: consecutive n-bit fields, lowest first (n <= 8)."""
    return (b[..., None].astype(np.int64) >> np.arange(0, 8, n)) & ((1 << n) - 1)


def _with_parity(sign7: np.ndarray) -> np.ndarray:
    """7 stored sign bits -> 8: the eighth makes the number of minus signs even."""
    return sign7 | ((((sign7[..., None] >> np.arange(7)) & 1).sum(-1) % 2) << 7)


def decode_iq(t: T, rows: np.ndarray) -> dict[str, np.ndarray]:
    """Grid i-quant super-blocks: mag (grid magnitude), neg (the element is negative), sc16 (the odd
    integer scale of each 16), d (fp16 scale) and for IQ1 dneg (negative delta), [R, nb, ...]."""
    b = _blocks(t, rows).astype(np.int64)
    R, nb = b.shape[:2]
    grid = _iq_grid(t)
    d = _f16(_blocks(t, rows)[..., 0:2]) if t != T.IQ1_M else None
    dneg = None
    if t in (T.IQ2_XXS, T.IQ3_XXS):
        if t == T.IQ2_XXS:
            words = np.ascontiguousarray(_blocks(t, rows)[..., 2:66]).view(np.uint32).astype(np.int64).reshape(R, nb, 8, 2)
            idx, aux = _blocks(t, rows)[..., 2:66].reshape(R, nb, 8, 8)[..., :4].astype(np.int64), words[..., 1]
        else:
            idx = b[..., 2:66].reshape(R, nb, 8, 8)
            aux = np.ascontiguousarray(_blocks(t, rows)[..., 66:98]).view(np.uint32).astype(np.int64).reshape(R, nb, 8)
        vals = grid[idx].reshape(R, nb, 8, 32)
        sign7 = (aux[..., None] >> (7 * np.arange(4))) & 127                          # [R, nb, 8, 4]
        signs = _with_parity(sign7)
        sc = np.repeat(2 * (aux >> 28) + 1, 2, -1)
    elif t == T.IQ2_XS:
        q = np.ascontiguousarray(_blocks(t, rows)[..., 2:66]).view(np.uint16).astype(np.int64).reshape(R, nb, 8, 4)
        vals = grid[q & 511].reshape(R, nb, 8, 32)
        sign7 = q >> 9
        signs = _with_parity(sign7)
        sc = 2 * _bits(b[..., 66:74], 4).reshape(R, nb, 16) + 1
    elif t == T.IQ2_S:
        qh = _bits(b[..., 66:74], 2)                                                     # [R, nb, 8, 4]
        idx = b[..., 2:34].reshape(R, nb, 8, 4) | (qh << 8)
        vals = grid[idx].reshape(R, nb, 8, 32)
        signs = b[..., 34:66].reshape(R, nb, 8, 4)
        sc = 2 * _bits(b[..., 74:82], 4).reshape(R, nb, 16) + 1
    elif t == T.IQ3_S:
        qh = _bits(b[..., 66:74], 1)                                                     # [R, nb, 8, 8]
        idx = b[..., 2:66].reshape(R, nb, 8, 8) | (qh << 8)
        vals = grid[idx].reshape(R, nb, 8, 32)
        signs = b[..., 74:106].reshape(R, nb, 8, 4)
        sc = np.repeat(2 * _bits(b[..., 106:110], 4).reshape(R, nb, 8) + 1, 2, -1)
    else:  # IQ1_S, IQ1_M: ternary grid values carry their own signs
        if t == T.IQ1_S:
            qh = np.ascontiguousarray(_blocks(t, rows)[..., 34:50]).view(np.uint16).astype(np.int64).reshape(R, nb, 8)
            hi = (qh[..., None] >> (3 * np.arange(4))) & 7                                # [R, nb, 8, 4]
            vals = grid[b[..., 2:34].reshape(R, nb, 8, 4) | (hi << 8)].reshape(R, nb, 8, 32)
            dneg = np.repeat((qh >> 15) & 1, 32, -1).reshape(R, nb, 256)
            sc = np.repeat(2 * ((qh >> 12) & 7) + 1, 2, -1)
        else:
            qh = _bits(b[..., 32:48], 4).reshape(R, nb, 8, 4)                            # per 8: 3 index bits, delta bit
            vals = grid[b[..., 0:32].reshape(R, nb, 8, 4) | ((qh & 7) << 8)].reshape(R, nb, 8, 32)
            dneg = np.repeat(qh >> 3, 8, -1).reshape(R, nb, 256)
            sw = np.ascontiguousarray(_blocks(t, rows)[..., 48:56]).view(np.uint16).astype(np.int64).reshape(R, nb, 4)
            sc = 2 * (((sw[..., :, None] >> (3 * np.arange(4))) & 7).reshape(R, nb, 16)) + 1
            dbits = (sw[..., 0] >> 12) | ((sw[..., 1] >> 8) & 0xF0) | ((sw[..., 2] >> 4) & 0xF00) | (sw[..., 3] & 0xF000)
            d = dbits.astype(np.uint16).view(np.float16).astype(F32)
        vals = vals.reshape(R, nb, 256)
        return {"mag": np.abs(vals), "neg": vals < 0, "val": 8 * vals + np.where(dneg == 1, -1, 1), "sc16": sc,
                "d": d, "dneg": dneg == 1}
    neg = (((signs[..., None] >> np.arange(8)) & 1) == 1).reshape(R, nb, 256)
    mag = vals.reshape(R, nb, 256)
    return {"mag": mag, "neg": neg, "val": np.where(neg, -mag, mag), "sc16": sc, "d": d, "dneg": None}


IQ_FACTOR = {T.IQ3_XXS: F32(0.25), T.IQ3_S: F32(1.0)}


def _vec_dot_iq(t, w, x):
    """ggml_vec_dot_<iq>_q8_K (AVX2): signs applied to the activations as vpsignb does (-(-128) is
    -128), lanes of scale * magnitude * signed activation, fma(d * y.d, lane) per super-block."""
    ib, act = decode_iq(t, w), decode_q8(T.Q8_K, x)
    q = act["qs"][:, None]                                                   # [T, 1, nb, 256]
    signed = lambda neg: np.where(neg[None], np.where(q == -128, -128, -q), q)
    sc = np.repeat(ib["sc16"], 16, -1)[None]
    lanes = _lanes(ib["mag"][None] * sc * signed(ib["neg"]))                 # [T, R, nb, 8]
    d = ib["d"][None] * act["d"][:, None]                                    # [T, R, nb]
    nt, nr, nb = lanes.shape[:3]
    acc, acc2, acc1 = np.zeros((nt, nr, 8), F32), np.zeros((nt, nr, 8), F32), np.zeros((nt, nr), F32)
    if t == T.IQ1_M:
        delta = _lanes(sc * signed(ib["dneg"]))
    if t == T.IQ1_S:
        b32 = act["bsums"].reshape(nt, nb, 8, 2).sum(-1)[:, None]                  # [T, 1, nb, 8]
        sumi1 = (b32 * np.where(ib["dneg"][..., ::32], -1, 1)[None] * ib["sc16"][..., ::2][None]).sum(-1)
    for i in range(nb):
        acc = fma32(d[:, :, i, None], lanes[:, :, i].astype(F32), acc)
        if t == T.IQ1_M:
            acc2 = fma32(d[:, :, i, None], delta[:, :, i].astype(F32), acc2)
        if t == T.IQ1_S:
            acc1 = fma32(d[:, :, i], sumi1[:, :, i].astype(F32), acc1)
    if t == T.IQ1_S:
        return hsum_movehl(acc) + F32(0.125) * acc1
    if t == T.IQ1_M:
        return fma32(hsum_movehl(acc2), F32(0.125), hsum_movehl(acc))
    return IQ_FACTOR.get(t, F32(0.125)) * hsum_movehl(acc)


def _lanes(prod: np.ndarray) -> np.ndarray:
    """[..., n*32] products -> [..., 8] int sums: lane l holds elements with (e % 32) // 4 == l."""
    return prod.reshape(*prod.shape[:-1], -1, 8, 4).sum(axis=(-3, -1))


# ---------------------------------------------------------------- vec_dot (one row x one row)

def _vec_dot_legacy(t, w, x):
    q, dx, m = decode_legacy(t, w)                   # [R, nb, 32]
    act = decode_q8(T.Q8_1 if t in (T.Q4_1, T.Q5_1) else T.Q8_0, x)
    lanes = _lanes(q[None] * act["qs"][:, None])     # [T, R, nb, 8]
    d = dx[None] * act["d"][:, None]                  # float32 product
    acc = np.zeros(lanes.shape[:2] + (8,), F32)
    summs = np.zeros(lanes.shape[:2], F32)
    for ib in range(lanes.shape[2]):
        acc = fma32(d[:, :, ib, None], lanes[:, :, ib].astype(F32), acc)
        if t in (T.Q4_1, T.Q5_1):
            summs = fma32(m[None, :, ib], act["s"][:, None, ib], summs)
    return hsum_movehl(acc) + summs


def _kq_lanes(t, kb, act):
    """per super-block integer lanes [T, R, nb, 8] of scale * q * y. Q6_K multiplies the unsigned
    quants and takes the -32 offset off each lane as 32 * (two adjacent bsums . scales)."""
    sc16 = np.repeat(kb["sc16"], 16, -1)[None]
    if t != T.Q6_K:
        return _lanes(kb["q"][None] * sc16 * act["qs"][:, None])
    offset = (kb["sc16"][None] * act["bsums"][:, None]).reshape(*act["bsums"].shape[:1], -1,
                                                                  kb["sc16"].shape[1], 8, 2).sum(-1)
    return _lanes(kb["u"][None] * sc16 * act["qs"][:, None]) - 32 * offset


def _vec_dot_k(t, w, x):
    kb, act = decode_k(t, w), decode_q8(T.Q8_K, x)
    lanes = _kq_lanes(t, kb, act)
    yd = act["d"][:, None]                               # [T, 1, nb]
    d = yd * kb["d"][None]
    dmin = (-yd) * kb["dmin"][None] if "dmin" in kb else None
    nt, nr, nb = lanes.shape[:3]
    acc = np.zeros((nt, nr, 8), F32)
    acc_m = np.zeros((nt, nr, 4), F32)
    summs = np.zeros((nt, nr), F32)
    for i in range(nb):
        if t == T.Q2_K:
            prod = (kb["mn16"][None, :, i] * act["bsums"][:, None, i]).reshape(nt, nr, 8, 2).sum(-1)
            acc = fma32(dmin[:, :, i, None], prod.astype(F32), acc)
        elif t in (T.Q4_K, T.Q5_K):
            q8s = act["bsums"][:, i].reshape(nt, 8, 2).sum(-1)            # per 32 elements
            prod = (kb["mn32"][None, :, i] * q8s[:, None]).reshape(nt, nr, 4, 2).sum(-1)
            if t == T.Q4_K:
                acc_m = fma32(dmin[:, :, i, None], prod.astype(F32), acc_m)
            else:
                summs = fma32(prod.sum(-1).astype(F32), dmin[:, :, i], summs)
        acc = fma32(d[:, :, i, None], lanes[:, :, i].astype(F32), acc)
    result = hsum_movehl(acc)
    if t == T.Q4_K:
        result = result + ((acc_m[..., 0] + acc_m[..., 2]) + (acc_m[..., 1] + acc_m[..., 3]))
    return result + summs


# ---------------------------------------------------------------- float weights, by ggml build

# what tells ggml-cpu's x86 builds apart (gguflm.system.ARITHMETICS), as GCC compiles them with
# -march=native: ggml's float vectors (8 floats with AVX2, 16 with AVX-512F), vdpbf16ps
# (__AVX512BF16__), and the vectors GCC's auto-vectorizer uses for plain loops (256 bits for its
# Intel tunings and AVX2, 512 for AMD Zen 4+)
VECTOR_LANES = {"avx2": 8, "avx512": 16, "avx512bf16": 16, "zen4": 16}
DPBF16 = {"avx512bf16", "zen4"}
AUTOVEC_LANES = {"avx2": 8, "avx512": 8, "avx512bf16": 8, "zen4": 16}


def float_values(t: T, rows: np.ndarray) -> np.ndarray:
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    if t == T.F32:
        return rows.view(F32)
    if t == T.F16:
        return rows.view(np.float16).astype(F32)
    return (rows.view(np.uint16).astype(np.uint32) << 16).view(F32)


def hsum16(v: np.ndarray) -> np.ndarray:
    """_mm512_reduce_add_ps as GCC 12 expands it: the upper 8 lanes onto the lower, then as an
    8-lane movehl sum."""
    v = v.astype(F32)
    return hsum_movehl(v[..., :8] + v[..., 8:])


def _signed_zero(v: np.ndarray) -> np.ndarray:
    return (v.view(np.uint32) & np.uint32(0x80000000)).view(F32)


def _daz(v: np.ndarray) -> np.ndarray:
    """Denormals read as zeros of their sign."""
    v = np.asarray(v, F32)
    return np.where((v.view(np.uint32) & 0x7F800000) == 0, _signed_zero(v), v)


def _tiny(a, b, c) -> np.ndarray:
    """Whether a*b + c (a, b bf16 values, c float32), rounded to 24 bits with an unbounded
    exponent, is below 2^-126 in magnitude: the exact sum as a double-double (the product of
    two bf16 values is exact in float64), then rounded half to even by hand."""
    p = np.asarray(a, F32).astype(np.float64) * np.asarray(b, F32).astype(np.float64)
    c64 = np.asarray(c, F32).astype(np.float64)
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)
    sign = np.where(s < 0, -1.0, 1.0)
    s, err = s * sign, err * sign
    with np.errstate(divide="ignore", invalid="ignore"):
        quantum = np.ldexp(1.0, np.frexp(s)[1] - 24)       # the last of 24 bits at s's exponent
        t = s / quantum
        whole = np.floor(t)
        frac = t - whole
        up = (frac > 0.5) | ((frac == 0.5) & ((err > 0) | ((err == 0) & (whole % 2 == 1))))
        rounded = np.where(s == 0, np.abs(err), (whole + up) * quantum)
    return rounded < 2.0 ** -126


def fma_daz_ftz(a, b, c) -> np.ndarray:
    """One of vdpbf16ps' steps: denormal inputs read as zeros, a fused multiply-add rounded to
    nearest even, a result that is tiny (after rounding) flushed to a zero of its sign."""
    a, b, c = _daz(a), _daz(b), _daz(c)
    r = fma32(a, b, c)
    return np.where(_tiny(a, b, c), _signed_zero(r), r).astype(F32)


def dpbf16(acc, x, y) -> np.ndarray:
    """_mm512_dpbf16_ps per lane: x, y [..., 2 * lanes] bf16 values as float32; lane j adds the
    product of pair element 2j+1 first, then that of 2j (Intel SDM, VDPBF16PS)."""
    acc = fma_daz_ftz(x[..., 1::2], y[..., 1::2], acc)
    return fma_daz_ftz(x[..., 0::2], y[..., 0::2], acc)


def _f32_tail(total, a, b, np_, autovec):
    """ggml_vec_dot_f32's leftover loop as GCC vectorized it for `autovec` lanes: blocks of that
    many products (unfused) added in order, then one block of half as many, the rest (fewer
    than half) with scalar fused multiply-adds."""
    r = a.shape[-1] - np_
    unfused = autovec * (r // autovec)
    if r - unfused >= autovec // 2:
        unfused += autovec // 2
    prods = a[None, :, np_:] * b[:, None, np_:]          # float32 products
    for k in range(r):
        if k < unfused:
            total = total + prods[..., k]
        else:
            total = fma32(a[None, :, np_ + k], b[:, None, np_ + k], total)
    return total.astype(F32)


def _vec_dot_float(t, w, x, arith):
    a, b = float_values(t, w), float_values(t, x)
    n, lanes = a.shape[1], VECTOR_LANES[arith]
    shape = (b.shape[0], a.shape[0])
    if t == T.BF16 and lanes == 16:
        # two 16-lane accumulators over 32 elements (64 as vdpbf16ps pairs), each summed alone
        pairs = arith in DPBF16
        half = 32 if pairs else 16
        np_ = n - n % (2 * half)
        acc = np.zeros((2,) + shape + (16,), F32)
        for i in range(0, np_, 2 * half):
            for k in range(2):
                xa, yb = a[None, :, i + half * k:i + half * (k + 1)], b[:, None, i + half * k:i + half * (k + 1)]
                acc[k] = dpbf16(acc[k], xa, yb) if pairs else fma32(xa, yb, acc[k])
        total = hsum16(acc[0]).astype(np.float64) + hsum16(acc[1]).astype(np.float64)
    else:
        # four accumulators of `lanes` over steps of 4 * lanes, (a0 + a2) + (a1 + a3)
        step = 4 * lanes
        np_ = n - n % step
        acc = np.zeros(shape + (4, lanes), F32)
        for i in range(0, np_, step):
            acc = fma32(a[None, :, i:i + step].reshape(1, -1, 4, lanes), b[:, None, i:i + step].reshape(-1, 1, 4, lanes), acc)
        v = (acc[..., 0, :] + acc[..., 2, :]) + (acc[..., 1, :] + acc[..., 3, :])
        if lanes == 16:
            total = hsum16(v)
        else:
            total = hsum_movehl(v) if t == T.BF16 else hsum_hadd(v)
    if t == T.F32:
        return _f32_tail(total.astype(F32), a, b, np_, AUTOVEC_LANES[arith])
    total = total.astype(np.float64)                       # F16, BF16: leftovers in double
    prods = a[None, :, np_:] * b[:, None, np_:]
    for k in range(n - np_):
        total = total + prods[..., k].astype(np.float64)
    return total.astype(F32)


def vec_dot(t: T, w: np.ndarray, x: np.ndarray, arith: str) -> np.ndarray:
    """ggml_vec_dot_<t> of every weight row with every activation row: [n_tok, n_rows]; float
    weights as the `arith` build rounds them (quantized ones round alike in all)."""
    t = T(t)
    w, x = np.atleast_2d(w), np.atleast_2d(x)
    if t in LEGACY:
        return _vec_dot_legacy(t, w, x)
    if t in KQUANTS:
        return _vec_dot_k(t, w, x)
    if t in GRID_IQ:
        return _vec_dot_iq(t, w, x)
    return _vec_dot_float(t, w, x, arith)


# ---------------------------------------------------------------- batch paths

def tiled(t: T, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The tiled K-quant GEMM (AVX2 microkernel): an exact int per super-block, then
    res = d*s1 (- dmin*s2 fused), buf = fma(res, y.d, buf)."""
    kb, act = decode_k(T(t), w), decode_q8(T.Q8_K, x)
    s1 = (kb["q"][None] * np.repeat(kb["sc16"], 16, -1)[None] * act["qs"][:, None]).sum(-1)   # [T, R, nb]
    buf = np.zeros(s1.shape[:2], F32)
    for i in range(s1.shape[2]):
        res = kb["d"][None, :, i] * s1[..., i].astype(F32)
        if "dmin" in kb:
            s2 = (kb["mn16"][None, :, i] * act["bsums"][:, None, i]).sum(-1)
            res = fma32(-kb["dmin"][None, :, i], s2.astype(F32), res)
        buf = fma32(res, act["d"][:, None, i], buf)
    return buf


def tiled_iq(t: T, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The tiled GEMM of the grid i-quants: an exact int per super-block of scale * signed value
    (IQ1: 8 * grid + delta) * activation; res = (d * factor) * s1, buf = fma(res, y.d, buf)."""
    ib, act = decode_iq(T(t), w), decode_q8(T.Q8_K, x)
    s1 = (ib["val"][None] * np.repeat(ib["sc16"], 16, -1)[None] * act["qs"][:, None]).sum(-1)   # [T, R, nb]
    d = ib["d"] * IQ_FACTOR.get(T(t), F32(0.125))
    buf = np.zeros(s1.shape[:2], F32)
    for i in range(s1.shape[2]):
        buf = fma32(d[None, :, i] * s1[..., i].astype(F32), act["d"][:, None, i], buf)
    return buf


def repack_k(t: T, w: np.ndarray, x: np.ndarray, gemm: bool) -> np.ndarray:
    """ggml_gemv_q4_K_8x8_q8_K (gemm False) and ggml_gemm_q4_K_8x8_q8_K, and the same of q2_K:
    the integer dot and the min term of a whole super-block (GEMV) or of each 64 (Q4_K) or 128
    (Q2_K) elements (GEMM), each scaled by d_row * d_act and accumulated in its own fma chain; the
    min chain is subtracted last."""
    kb, act = decode_k(t, w), decode_q8(T.Q8_K, x)
    parts = (4 if t == T.Q4_K else 2) if gemm else 1
    prod = kb["q"][None] * np.repeat(kb["sc16"], 16, -1)[None] * act["qs"][:, None]
    isum = prod.reshape(*prod.shape[:3], parts, -1).sum(-1)
    mins = kb["mn16"][None] * act["bsums"][:, None]
    imin = mins.reshape(*mins.shape[:3], parts, -1).sum(-1)
    acc = np.zeros(isum.shape[:2], F32)
    acc_min = np.zeros_like(acc)
    for i in range(isum.shape[2]):
        scale = kb["d"][None, :, i] * act["d"][:, None, i]
        scale_min = kb["dmin"][None, :, i] * act["d"][:, None, i]
        for p in range(parts):
            acc = fma32(isum[..., i, p].astype(F32), scale, acc)
            acc_min = fma32(imin[..., i, p].astype(F32), scale_min, acc_min)
    return acc - acc_min


def repack_q4_0(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml_gemv/gemm_q4_0_8x8_q8_0: one fma per block of the whole block's integer dot."""
    q, dx, _ = decode_legacy(T.Q4_0, w)
    act = decode_q8(T.Q8_0, x)
    isum = (q[None] * act["qs"][:, None]).sum(-1)
    acc = np.zeros(isum.shape[:2], F32)
    for ib in range(isum.shape[2]):
        acc = fma32(isum[..., ib].astype(F32), dx[None, :, ib] * act["d"][:, None, ib], acc)
    return acc


def sgemm_step(t: T, arith: str) -> int:
    """Elements per step of llamafile's tinyBLAS for float type t: its KN (tinyBLAS::matmul
    declines rows of other lengths)."""
    return VECTOR_LANES[arith] * (2 if T(t) == T.BF16 and arith in DPBF16 else 1)


def sgemm_float(t: T, w: np.ndarray, x: np.ndarray, arith: str) -> np.ndarray:
    """llamafile's tinyBLAS for F32/F16/BF16: one accumulator vector (8 or 16 lanes) per output,
    fma (vdpbf16ps for BF16 with AVX512_BF16), then its horizontal sum (movehl, reduce_add_ps)."""
    a, b = float_values(T(t), w), float_values(T(t), x)
    lanes, step = VECTOR_LANES[arith], sgemm_step(t, arith)
    acc = np.zeros((b.shape[0], a.shape[0], lanes), F32)
    for i in range(0, a.shape[1], step):
        xa, yb = a[None, :, i:i + step], b[:, None, i:i + step]
        acc = dpbf16(acc, xa, yb) if step > lanes else fma32(xa, yb, acc)
    return hsum16(acc) if lanes == 16 else hsum_movehl(acc)


def matmul_reference(t: T, w: np.ndarray, x: np.ndarray, n_in: int, arith: str, repacked: bool = True) -> np.ndarray:
    """[n_tok, n_rows] as llama.cpp's CPU backend (the `arith` build) computes it: the kernel it
    picks for the shape (probed against libggml-cpu: repacked Q4_0/Q4_K when rows % 8 == 0, Q2_K
    too in AVX-512 builds, tiled
    K-quants from 8 tokens, llamafile's sgemm for floats from 2 tokens when rows % 4 == 0 and
    n_in is a whole number of its steps, ggml_vec_dot otherwise; the Q0 sgemm rounds as vec_dot
    does)."""
    t = T(t)
    w, x = np.atleast_2d(w), np.atleast_2d(x)
    n_rows, n_tok = w.shape[0], x.shape[0]
    if repacked and n_rows % 8 == 0 and (t in (T.Q4_0, T.Q4_K) or (t == T.Q2_K and VECTOR_LANES[arith] == 16)):
        if t == T.Q4_0:
            return repack_q4_0(w, x)
        grouped = n_tok - n_tok % 4 if n_tok > 3 else 0
        parts = [repack_k(t, w, x[:grouped], gemm=True)] if grouped else []
        if grouped < n_tok:
            parts.append(repack_k(t, w, x[grouped:], gemm=False))
        return np.concatenate(parts)
    if t in KQUANTS and n_tok >= 8:
        return tiled(t, w, x)
    if t in GRID_IQ and n_tok >= 8:
        return tiled_iq(t, w, x)
    if t in FLOATS and n_tok >= 2 and n_rows % 4 == 0 and n_in % sgemm_step(t, arith) == 0:
        return sgemm_float(t, w, x, arith)
    return vec_dot(t, w, x, arith)
