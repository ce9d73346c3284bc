/* The portable scalar reference of each matmul recipe (quants_recipe.h) for the legacy blocks, the
 * K-quants and the float formats, and for the value-table and ternary formats through
 * quants_lut_dot.h (the grid i-quants': quants_iq_dot.h): one output at a time, in ggml's order of
 * float operations; the scalar kernel table built from them. The SIMD kernels (quants_simd.h)
 * compute the same floats.
 */
#ifndef GGUFLM_QUANTS_DOT_H
#define GGUFLM_QUANTS_DOT_H

#include "quants_recipe.h"
#include "quants_lut_dot.h"  /* IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0 */

/* batches of at least this many tokens take the AVX-512 strips of the legacy and ternary types
 * (quants_strips_avx512.inc), whose decoding of 16 rows at a time pays from there on (one thread,
 * 4096x4096: the legacy blocks 0.75-0.9x the 2-row tiles' speed at 8 tokens, 1.05-1.4x at 16,
 * 1.4-1.6x at 32 and up; at 8 tokens TQ1_0 1.3x its one-row tiles, TQ2_0 1.03-1.05x) */
static inline int64_t gguflm_strip_tokens(int type) { return gguflm_is_ternary(type) ? 8 : 16; }

/* ======================= scalar reference kernels (one output) ======================= */

static inline __attribute__((always_inline)) float gguflm_dot_legacy_1(int type, size_t bx, int64_t n, const uint8_t *x,
                                                                      const uint8_t *y) {
    const int has_min = gguflm_legacy_has_min(type);
    const size_t by = has_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    gguflm_legacy_block xb;
    float acc[8] = {0}, summs = 0.0f;
    for (int64_t ib = 0; ib < n / 32; ++ib) {
        const uint8_t *yb = y + ib * by;
        const int8_t *yq = (const int8_t *)(yb + (has_min ? 4 : 2));
        gguflm_legacy_unpack(type, x + ib * bx, &xb);
        const float d = xb.d * gguflm_fp16_to_fp32(*(const ggml_half *)yb);
        for (int l = 0; l < 8; ++l) {
            int32_t lane = 0;
            for (int j = 4 * l; j < 4 * l + 4; ++j) lane += xb.v[j] * yq[j];
            acc[l] = fmaf(d, (float)lane, acc[l]);
        }
        if (has_min) summs = fmaf(xb.m, gguflm_fp16_to_fp32(((const block_q8_1 *)yb)->s), summs);
    }
    return gguflm_hsum8_movehl(acc) + summs;
}

static inline __attribute__((always_inline)) float gguflm_dot_k_1(int type, size_t bx, int64_t n, const uint8_t *x,
                                                                 const block_q8_K *y) {
    gguflm_kblock kb;
    gguflm_kints in;
    float acc[8] = {0}, acc_m[4] = {0}, summs = 0.0f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        gguflm_kunpack(type, x + i * bx, &kb);
        gguflm_k_ints(type, &kb, &y[i], &in);
        const float d = y[i].d * kb.d, dmin = -y[i].d * kb.dmin;
        if (type == GGUFLM_Q2_K) {
            for (int l = 0; l < 8; ++l) acc[l] = fmaf(dmin, (float)in.mins[l], acc[l]);
        } else if (type == GGUFLM_Q4_K) {
            for (int m = 0; m < 4; ++m) acc_m[m] = fmaf(dmin, (float)(in.mins[2 * m] + in.mins[2 * m + 1]), acc_m[m]);
        } else if (type == GGUFLM_Q5_K) {
            summs = fmaf((float)gguflm_sum8_i32(in.mins), dmin, summs);
        }
        for (int l = 0; l < 8; ++l) acc[l] = fmaf(d, (float)in.lanes[l], acc[l]);
    }
    return gguflm_hsum8_movehl(acc) + (type == GGUFLM_Q4_K ? gguflm_hsum4_movehl(acc_m) : summs);
}

static inline __attribute__((always_inline)) float gguflm_tiled_1(int type, size_t bx, int64_t n, const uint8_t *x,
                                                                 const block_q8_K *y) {
    gguflm_kblock kb;
    gguflm_kints in;
    float out = 0.0f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        gguflm_kunpack(type, x + i * bx, &kb);
        gguflm_k_ints(type, &kb, &y[i], &in);
        out = gguflm_tiled_step(gguflm_k_has_min(type), kb.d, kb.dmin, gguflm_sum8_i32(in.lanes),
                                gguflm_sum8_i32(in.mins), y[i].d, out);
    }
    return out;
}

/* integer sums per super-block of repacked Q4_K / Q2_K: GEMV 1; GEMM 4 (Q4_K, per 64 elements) or
 * 2 (Q2_K, per 128) */
static inline int gguflm_k_repack_parts(int path, int type) {
    return path == GGUFLM_PATH_Q4_K_GEMV ? 1 : type == GGUFLM_Q4_K ? 4 : 2;
}

static inline float gguflm_k_repack_1(int type, int parts, int64_t n, const uint8_t *x, const block_q8_K *y) {
    const size_t bx = type == GGUFLM_Q4_K ? sizeof(block_q4_K) : sizeof(block_q2_K);
    gguflm_kblock kb;
    gguflm_kints in;
    float acc = 0.0f, acc_min = 0.0f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        gguflm_kunpack(type, x + i * bx, &kb);
        gguflm_k_ints(type, &kb, &y[i], &in);
        const float scale = kb.d * y[i].d, scale_min = kb.dmin * y[i].d;
        for (int p = 0; p < parts; ++p) {
            int32_t sum = 0, min = 0;
            for (int j = 4 / parts * p; j < 4 / parts * (p + 1); ++j) sum += in.part[j];
            for (int j = 8 / parts * p; j < 8 / parts * (p + 1); ++j) min += in.mins[j];
            acc = fmaf((float)sum, scale, acc);
            acc_min = fmaf((float)min, scale_min, acc_min);
        }
    }
    return acc - acc_min;
}

static inline float gguflm_q4_0_repack_1(int64_t n, const uint8_t *x, const block_q8_0 *y) {
    gguflm_legacy_block xb;
    float acc = 0.0f;
    for (int64_t ib = 0; ib < n / 32; ++ib) {
        gguflm_legacy_unpack(GGUFLM_Q4_0, x + ib * sizeof(block_q4_0), &xb);
        int32_t sum = 0;
        for (int j = 0; j < 32; ++j) sum += xb.v[j] * y[ib].qs[j];
        acc = fmaf((float)sum, xb.d * gguflm_fp16_to_fp32(y[ib].d), acc);
    }
    return acc;
}

/* ======================= float weights (F32, F16, BF16) ======================= */

/* one element of a float-format row */
static inline __attribute__((always_inline)) float gguflm_float_at(int type, const void *p, int64_t i) {
    if (type == GGUFLM_F16) return gguflm_fp16_to_fp32(((const ggml_half *)p)[i]);
    if (type == GGUFLM_BF16) return gguflm_bf16_to_fp32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* vdpbf16ps, one lane (Intel SDM: an FMA "with daz, ftz, rne, and sae"; checked against the
 * instruction, which the avx512bf16 ISA's kernels and the local ggml-cpu run, by
 * tests/test_quants_kernels.py and test_quants_exact.py): acc += x1*y1, then acc += x0*y0 (the odd
 * element of the pair first), each fused and rounded to nearest even, denormal inputs read as
 * zeros and results that are tiny flushed to zeros, signs kept. Tiny is decided after rounding to
 * 24 bits with an unbounded exponent: the same fma on operands scaled by 2^24 rounds that way
 * near the smallest normal, and it is tiny when below 2^-102 (the scalings are exact, or
 * overflow where the result is far from tiny). acc itself is never denormal: the chains start
 * at zero and only take flushed results. */
static inline float gguflm_daz(float x) {
    const uint32_t b = gguflm_f32_bits(x);
    return (b & 0x7f800000u) ? x : gguflm_bits_f32(b & 0x80000000u);
}

static inline float gguflm_fma_ftz(float a, float b, float c) {
    const float r = fmaf(a, b, c), scaled = fmaf(a * 0x1p24f, b, c * 0x1p24f);
    return fabsf(scaled) < 0x1p-102f ? gguflm_bits_f32(gguflm_f32_bits(r) & 0x80000000u) : r;
}

static inline float gguflm_dpbf16(float acc, float x0, float x1, float y0, float y1) {
    acc = gguflm_fma_ftz(gguflm_daz(x1), gguflm_daz(y1), acc);
    return gguflm_fma_ftz(gguflm_daz(x0), gguflm_daz(y0), acc);
}

/* The sum of a chain's accumulator lanes acc (vector-major), as the build reduces them (DOT of
 * F16 and BF16 goes on in double). The SIMD kernels reduce in registers in the same order. */
static inline double gguflm_float_reduce(int path, int type, int arith, const float *acc) {
    const int lanes = gguflm_vec_lanes(arith);
    if (path == GGUFLM_PATH_SGEMM) return gguflm_hsum_vec(acc, lanes);
    if (type == GGUFLM_BF16 && lanes == 16) return (double)gguflm_hsum16(acc) + (double)gguflm_hsum16(acc + 16);
    float v[16];
    for (int l = 0; l < lanes; ++l) v[l] = (acc[l] + acc[2 * lanes + l]) + (acc[lanes + l] + acc[3 * lanes + l]);
    if (lanes == 16) return gguflm_hsum16(v);
    return type == GGUFLM_BF16 ? gguflm_hsum8_movehl(v) : gguflm_hsum8_hadd(v);
}

/* DOT after the whole steps (elements np .. n-1 of x . y, sum: the reduced steps): F16 and BF16
 * add the float products in double; F32 adds them in float as GCC vectorized that loop (see
 * gguflm_dot_f32_unfused) */
static inline __attribute__((always_inline)) float gguflm_float_tail(int type, int arith, int64_t n, int64_t np,
                                                                    const void *x, const void *y, double sum) {
    if (type != GGUFLM_F32) {
        for (int64_t i = np; i < n; ++i) sum += (double)(gguflm_float_at(type, x, i) * gguflm_float_at(type, y, i));
        return (float)sum;
    }
    const int64_t r = n - np, unfused = gguflm_dot_f32_unfused((int)r, arith);
    float s = (float)sum;
    for (int64_t k = 0; k < r; ++k) {
        const float a = ((const float *)x)[np + k], b = ((const float *)y)[np + k];
        s = k < unfused ? s + a * b : fmaf(a, b, s);
    }
    return s;
}

/* one output of a float recipe (DOT or SGEMM) */
static inline __attribute__((always_inline)) float gguflm_float_1(int path, int type, int arith, int64_t n,
                                                                 const void *x, const void *y) {
    const gguflm_float_chain c = gguflm_float_chain_of(path, type, arith);
    const int width = c.lanes * (1 + c.pairs), step = gguflm_float_step(c);
    const int64_t np = n - n % step;
    float acc[GGUFLM_FLOAT_ACC] = {0};
    for (int64_t i = 0; i < np; i += step)
        for (int v = 0; v < c.vecs; ++v)
            for (int l = 0; l < c.lanes; ++l) {
                const int64_t e = i + v * width + l * (1 + c.pairs);
                float *a = &acc[v * c.lanes + l];
                if (c.pairs)
                    *a = gguflm_dpbf16(*a, gguflm_float_at(type, x, e), gguflm_float_at(type, x, e + 1),
                                       gguflm_float_at(type, y, e), gguflm_float_at(type, y, e + 1));
                else
                    *a = fmaf(gguflm_float_at(type, x, e), gguflm_float_at(type, y, e), *a);
            }
    return gguflm_float_tail(type, arith, n, np, x, y, gguflm_float_reduce(path, type, arith, acc));
}

/* one output of `path` for weight type `type` (bx bytes per weight block) */
static inline __attribute__((always_inline)) float gguflm_recipe_1(int path, int type, int arith, size_t bx,
                                                                  int64_t n, const uint8_t *x, const uint8_t *y) {
    if (gguflm_is_float(type)) return gguflm_float_1(path, type, arith, n, x, y);
    if (gguflm_is_lut(type)) return gguflm_lut_recipe_1(path, type, arith, n, x, y);
    switch (path) {
    case GGUFLM_PATH_TILED: return gguflm_tiled_1(type, bx, n, x, (const block_q8_K *)y);
    case GGUFLM_PATH_Q4_K_GEMV:
    case GGUFLM_PATH_Q4_K_GEMM: return gguflm_k_repack_1(type, gguflm_k_repack_parts(path, type), n, x, (const block_q8_K *)y);
    case GGUFLM_PATH_Q4_0_REPACK: return gguflm_q4_0_repack_1(n, x, (const block_q8_0 *)y);
    default:
        if (gguflm_is_kquant(type)) return gguflm_dot_k_1(type, bx, n, x, (const block_q8_K *)y);
        return gguflm_dot_legacy_1(type, bx, n, x, y);
    }
}

static inline __attribute__((always_inline)) void gguflm_gemm_scalar(int path, int type, size_t bx, int64_t n,
                                                                    const uint8_t *w, int64_t w_stride, int64_t nr,
                                                                    const uint8_t *y, int64_t y_stride, int64_t nt,
                                                                    float *out, int64_t out_stride, int arith) {
    for (int64_t t = 0; t < nt; ++t)
        for (int64_t r = 0; r < nr; ++r)
            out[t * out_stride + r] = gguflm_recipe_1(path, type, arith, bx, n, w + r * w_stride, y + t * y_stride);
}

/* Q4_0_ROWS16: each row read back to the file's layout, then Q4_0_REPACK's recipe (rows come in
 * whole groups of 16, w at a group's start) */
static inline __attribute__((always_inline)) void gguflm_rows16_scalar(int type, int64_t n, const uint8_t *w, int64_t ws,
                                                                      int64_t nr, const uint8_t *y, int64_t ys, int64_t nt,
                                                                      float *out, int64_t os, int arith) {
    uint8_t row[ws];
    for (int64_t r = 0; r < nr; ++r) {
        gguflm_rows16_row(type, 0, (uint8_t *)w + (r - r % GGUFLM_ROWS16) * ws, (int)(r % GGUFLM_ROWS16), ws, row);
        for (int64_t t = 0; t < nt; ++t)
            out[t * os + r] = gguflm_recipe_1(GGUFLM_PATH_Q4_0_REPACK, type, arith, (size_t)gguflm_rows16_bx(type), n, row,
                                              y + t * ys);
    }
}

/* the scalar kernel table: [path][type], NULL where llama.cpp has no such recipe */
#define GGUFLM_SCALAR_KERNEL(path, tag, TYPE, bx)                                                                \
    static void gguflm_##path##_##tag##_scalar(int64_t n, const uint8_t *w, int64_t ws, int64_t nr,            \
                                               const uint8_t *y, int64_t ys, int64_t nt, float *o, int64_t os,  \
                                               int arith) {                                                     \
        gguflm_gemm_scalar(GGUFLM_PATH_##path, TYPE, bx, n, w, ws, nr, y, ys, nt, o, os, arith);                \
    }
#define GGUFLM_SCALAR_KERNELS_K(tag, TYPE)                             \
    GGUFLM_SCALAR_KERNEL(DOT, tag, TYPE, sizeof(block_##tag))          \
    GGUFLM_SCALAR_KERNEL(TILED, tag, TYPE, sizeof(block_##tag))
#define GGUFLM_SCALAR_KERNELS_LEGACY(tag, TYPE)                        \
    GGUFLM_SCALAR_KERNEL(DOT, tag, TYPE, sizeof(block_##tag))          \
    GGUFLM_SCALAR_KERNEL(DOT_STREAM, tag, TYPE, sizeof(block_##tag))
GGUFLM_SCALAR_KERNELS_LEGACY(q4_0, GGUFLM_Q4_0)
GGUFLM_SCALAR_KERNELS_LEGACY(q4_1, GGUFLM_Q4_1)
GGUFLM_SCALAR_KERNELS_LEGACY(q5_0, GGUFLM_Q5_0)
GGUFLM_SCALAR_KERNELS_LEGACY(q5_1, GGUFLM_Q5_1)
GGUFLM_SCALAR_KERNELS_LEGACY(q8_0, GGUFLM_Q8_0)
GGUFLM_SCALAR_KERNELS_K(q2_K, GGUFLM_Q2_K)
GGUFLM_SCALAR_KERNELS_K(q3_K, GGUFLM_Q3_K)
GGUFLM_SCALAR_KERNELS_K(q4_K, GGUFLM_Q4_K)
GGUFLM_SCALAR_KERNELS_K(q5_K, GGUFLM_Q5_K)
GGUFLM_SCALAR_KERNELS_K(q6_K, GGUFLM_Q6_K)
GGUFLM_SCALAR_KERNEL(Q4_K_GEMV, q4_K, GGUFLM_Q4_K, sizeof(block_q4_K))
GGUFLM_SCALAR_KERNEL(Q4_K_GEMM, q4_K, GGUFLM_Q4_K, sizeof(block_q4_K))
GGUFLM_SCALAR_KERNEL(Q4_K_GEMV, q2_K, GGUFLM_Q2_K, sizeof(block_q2_K))
GGUFLM_SCALAR_KERNEL(Q4_K_GEMM, q2_K, GGUFLM_Q2_K, sizeof(block_q2_K))
GGUFLM_SCALAR_KERNEL(Q4_0_REPACK, q4_0, GGUFLM_Q4_0, sizeof(block_q4_0))
GGUFLM_SCALAR_KERNEL(DOT, f32, GGUFLM_F32, 4)
GGUFLM_SCALAR_KERNEL(DOT, f16, GGUFLM_F16, 2)
GGUFLM_SCALAR_KERNEL(DOT, bf16, GGUFLM_BF16, 2)
GGUFLM_SCALAR_KERNEL(SGEMM, f32, GGUFLM_F32, 4)
GGUFLM_SCALAR_KERNEL(SGEMM, f16, GGUFLM_F16, 2)
GGUFLM_SCALAR_KERNEL(SGEMM, bf16, GGUFLM_BF16, 2)
/* the value-table and ternary formats (IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0) */
GGUFLM_SCALAR_KERNEL(DOT, iq4_nl, GGUFLM_IQ4_NL, sizeof(block_iq4_nl))
GGUFLM_SCALAR_KERNEL(SGEMM, iq4_nl, GGUFLM_IQ4_NL, sizeof(block_iq4_nl))
GGUFLM_SCALAR_KERNEL(Q4_0_REPACK, iq4_nl, GGUFLM_IQ4_NL, sizeof(block_iq4_nl))
GGUFLM_SCALAR_KERNEL(DOT, mxfp4, GGUFLM_MXFP4, sizeof(block_mxfp4))
GGUFLM_SCALAR_KERNEL(Q4_0_REPACK, mxfp4, GGUFLM_MXFP4, sizeof(block_mxfp4))
#define GGUFLM_SCALAR_ROWS16(tag, TYPE)                                                                          \
    static void gguflm_Q4_0_ROWS16_##tag##_scalar(int64_t n, const uint8_t *w, int64_t ws, int64_t nr,          \
                                                  const uint8_t *y, int64_t ys, int64_t nt, float *o, int64_t os, \
                                                  int arith) {                                                    \
        gguflm_rows16_scalar(TYPE, n, w, ws, nr, y, ys, nt, o, os, arith);                                       \
    }
GGUFLM_SCALAR_ROWS16(q4_0, GGUFLM_Q4_0)
GGUFLM_SCALAR_ROWS16(iq4_nl, GGUFLM_IQ4_NL)
GGUFLM_SCALAR_ROWS16(mxfp4, GGUFLM_MXFP4)
#undef GGUFLM_SCALAR_ROWS16
GGUFLM_SCALAR_KERNEL(DOT, iq4_xs, GGUFLM_IQ4_XS, sizeof(block_iq4_xs))
GGUFLM_SCALAR_KERNEL(TILED, iq4_xs, GGUFLM_IQ4_XS, sizeof(block_iq4_xs))
GGUFLM_SCALAR_KERNEL(DOT, tq1_0, GGUFLM_TQ1_0, sizeof(block_tq1_0))
GGUFLM_SCALAR_KERNEL(DOT, tq2_0, GGUFLM_TQ2_0, sizeof(block_tq2_0))
#undef GGUFLM_SCALAR_KERNELS_K
#undef GGUFLM_SCALAR_KERNELS_LEGACY
#undef GGUFLM_SCALAR_KERNEL

/* a [path][type] table of kernels named gguflm_<PATH>_<tag><suffix> */
#define GGUFLM_KERNEL_TABLE(suffix)                                                                              \
    {                                                                                                            \
        [GGUFLM_PATH_DOT] = {[GGUFLM_F32] = gguflm_DOT_f32##suffix, [GGUFLM_F16] = gguflm_DOT_f16##suffix,       \
                             [GGUFLM_BF16] = gguflm_DOT_bf16##suffix, [GGUFLM_Q4_0] = gguflm_DOT_q4_0##suffix,   \
                             [GGUFLM_Q4_1] = gguflm_DOT_q4_1##suffix, [GGUFLM_Q5_0] = gguflm_DOT_q5_0##suffix,   \
                             [GGUFLM_Q5_1] = gguflm_DOT_q5_1##suffix, [GGUFLM_Q8_0] = gguflm_DOT_q8_0##suffix,   \
                             [GGUFLM_Q2_K] = gguflm_DOT_q2_K##suffix, [GGUFLM_Q3_K] = gguflm_DOT_q3_K##suffix,   \
                             [GGUFLM_Q4_K] = gguflm_DOT_q4_K##suffix, [GGUFLM_Q5_K] = gguflm_DOT_q5_K##suffix,   \
                             [GGUFLM_Q6_K] = gguflm_DOT_q6_K##suffix},                                           \
        [GGUFLM_PATH_TILED] = {[GGUFLM_Q2_K] = gguflm_TILED_q2_K##suffix, [GGUFLM_Q3_K] = gguflm_TILED_q3_K##suffix, \
                               [GGUFLM_Q4_K] = gguflm_TILED_q4_K##suffix, [GGUFLM_Q5_K] = gguflm_TILED_q5_K##suffix, \
                               [GGUFLM_Q6_K] = gguflm_TILED_q6_K##suffix},                                       \
        [GGUFLM_PATH_Q4_K_GEMV] = {[GGUFLM_Q4_K] = gguflm_Q4_K_GEMV_q4_K##suffix,                               \
                                   [GGUFLM_Q2_K] = gguflm_Q4_K_GEMV_q2_K##suffix},                              \
        [GGUFLM_PATH_Q4_K_GEMM] = {[GGUFLM_Q4_K] = gguflm_Q4_K_GEMM_q4_K##suffix,                               \
                                   [GGUFLM_Q2_K] = gguflm_Q4_K_GEMM_q2_K##suffix},                              \
        [GGUFLM_PATH_Q4_0_REPACK] = {[GGUFLM_Q4_0] = gguflm_Q4_0_REPACK_q4_0##suffix},                          \
        [GGUFLM_PATH_SGEMM] = {[GGUFLM_F32] = gguflm_SGEMM_f32##suffix, [GGUFLM_F16] = gguflm_SGEMM_f16##suffix, \
                               [GGUFLM_BF16] = gguflm_SGEMM_bf16##suffix},                                       \
        [GGUFLM_PATH_DOT_STREAM] = {[GGUFLM_Q4_0] = gguflm_DOT_STREAM_q4_0##suffix,                              \
                                    [GGUFLM_Q4_1] = gguflm_DOT_STREAM_q4_1##suffix,                              \
                                    [GGUFLM_Q5_0] = gguflm_DOT_STREAM_q5_0##suffix,                              \
                                    [GGUFLM_Q5_1] = gguflm_DOT_STREAM_q5_1##suffix,                              \
                                    [GGUFLM_Q8_0] = gguflm_DOT_STREAM_q8_0##suffix},                             \
        GGUFLM_IQ_KERNEL_ENTRIES(suffix)                                                                         \
        GGUFLM_LUT_KERNEL_ENTRIES(suffix)                                                                        \
    }

/* the value-table and ternary formats (IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0; nested designators: they
 * add to the rows above) */
#define GGUFLM_LUT_KERNEL_ENTRIES(suffix)                                                                        \
    [GGUFLM_PATH_DOT][GGUFLM_IQ4_NL] = gguflm_DOT_iq4_nl##suffix, [GGUFLM_PATH_DOT][GGUFLM_MXFP4] = gguflm_DOT_mxfp4##suffix, \
    [GGUFLM_PATH_DOT][GGUFLM_IQ4_XS] = gguflm_DOT_iq4_xs##suffix, [GGUFLM_PATH_DOT][GGUFLM_TQ1_0] = gguflm_DOT_tq1_0##suffix, \
    [GGUFLM_PATH_DOT][GGUFLM_TQ2_0] = gguflm_DOT_tq2_0##suffix,                                                  \
    [GGUFLM_PATH_TILED][GGUFLM_IQ4_XS] = gguflm_TILED_iq4_xs##suffix,                                            \
    [GGUFLM_PATH_SGEMM][GGUFLM_IQ4_NL] = gguflm_SGEMM_iq4_nl##suffix,                                            \
    [GGUFLM_PATH_Q4_0_REPACK][GGUFLM_IQ4_NL] = gguflm_Q4_0_REPACK_iq4_nl##suffix,                                \
    [GGUFLM_PATH_Q4_0_REPACK][GGUFLM_MXFP4] = gguflm_Q4_0_REPACK_mxfp4##suffix,                                  \
    [GGUFLM_PATH_Q4_0_ROWS16][GGUFLM_Q4_0] = gguflm_Q4_0_ROWS16_q4_0##suffix,                                    \
    [GGUFLM_PATH_Q4_0_ROWS16][GGUFLM_IQ4_NL] = gguflm_Q4_0_ROWS16_iq4_nl##suffix,                                \
    [GGUFLM_PATH_Q4_0_ROWS16][GGUFLM_MXFP4] = gguflm_Q4_0_ROWS16_mxfp4##suffix,

static const gguflm_gemm_fn gguflm_kernels_scalar[GGUFLM_PATH_COUNT][GGUFLM_TYPE_COUNT] = GGUFLM_KERNEL_TABLE(_scalar);

#endif
