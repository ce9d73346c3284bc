/* The grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M): dequantizers equal to
 * ggml's (ggml-quants.c dequantize_row_*), the unpacking of a super-block that the dots share, and
 * the scalar reference of the two recipes ggml-cpu (x86) computes them with:
 *
 *   DOT    ggml_vec_dot_<type>_q8_K (AVX2 code, also in the AVX-512 builds): per 32 elements a
 *          byte dot of the grid magnitudes with the activations, the signs applied to the
 *          activations (_mm256_sign_epi8, or xor/sub: -(-128) stays -128), int16 pair sums times
 *          the scale of their 16 elements (vpmaddwd) into 8 int32 lanes, lane l taking the
 *          elements 4l..4l+3 of every 32; per super-block acc = fma(d * y.d, lane, acc); the
 *          result factor * hsum_float_8(acc). IQ1_S adds its delta term through the activation's
 *          bsums (one exact integer, acc1 = fma(d, sumi1, acc1), + 0.125f * acc1 at the end);
 *          IQ1_M through a second lane vector (fma(hsum(acc2), 0.125f, hsum(acc1))).
 *   TILED  batches of 8+ tokens (ggml-cpu/tiled): one exact integer per super-block of the
 *          signed values (IQ1: 8 * grid + delta) times scale times activation, then as the
 *          K-quants: res = (fp16 d * factor) * s1, out = fma(res, y.d, out).
 * Both are bit-exact with ggml-cpu; the SIMD variants (quants_iq_simd.inc) compute the same integers.
 */
#ifndef GGUFLM_QUANTS_IQ_H
#define GGUFLM_QUANTS_IQ_H

#include "quants_ref.h"
#include "quants_iq_grids.h"
#include "ops_math.h"

static inline int gguflm_is_iq_grid(int type) {
    return type == GGUFLM_IQ2_XXS || type == GGUFLM_IQ2_XS || type == GGUFLM_IQ2_S || type == GGUFLM_IQ3_XXS ||
           type == GGUFLM_IQ3_S || type == GGUFLM_IQ1_S || type == GGUFLM_IQ1_M;
}

static inline int gguflm_iq_is_1bit(int type) { return type == GGUFLM_IQ1_S || type == GGUFLM_IQ1_M; }

/* the types whose AVX2 groups share what iq_prepare makes once a super-block (quants_iq_simd.inc) */
static inline int gguflm_iq_prepared(int type) {
    return gguflm_iq_is_1bit(type) || type == GGUFLM_IQ2_XS || type == GGUFLM_IQ2_S;
}

/* the float factor of a super-block's d in both recipes (the IQ1 tiled values are 8x too) */
static inline float gguflm_iq_factor(int type) {
    if (type == GGUFLM_IQ3_XXS) return 0.25f;
    if (type == GGUFLM_IQ3_S) return 1.0f;
    return 0.125f;
}

/* One super-block unpacked. mag/neg: the grid magnitude of each element and 0xff where it is
 * negative (IQ1: |grid| and its sign); val: the signed value the tiled path multiplies (IQ1:
 * 8 * grid + delta); sc: the odd integer scale of each 16 elements; dneg: 0xff where an IQ1
 * element's delta is negative; d: the fp16 super-block scale. */
typedef struct {
    uint8_t mag[QK_K], neg[QK_K], dneg[QK_K];
    int8_t val[QK_K];
    int16_t sc[QK_K / 16];
    float d;
} gguflm_iqblock;

static inline uint32_t gguflm_u32_at(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint16_t gguflm_u16_at(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint64_t gguflm_u64_at(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* 8 elements from a 64-bit grid entry and 8 sign bits (bit j: element j negative) */
static inline void gguflm_iq_put8(gguflm_iqblock *o, int e, uint64_t grid, unsigned signs) {
    memcpy(o->mag + e, &grid, 8);
    for (int j = 0; j < 8; ++j) o->neg[e + j] = (signs >> j) & 1 ? 0xff : 0;
}

/* 8 elements of IQ1's {-1, 0, 1} grid with a delta of sign dneg */
static inline void gguflm_iq1_put8(gguflm_iqblock *o, int e, uint64_t grid, int dneg) {
    for (int j = 0; j < 8; ++j) {
        const int8_t g = (int8_t)(grid >> (8 * j));
        o->mag[e + j] = (uint8_t)(g < 0 ? -g : g);
        o->neg[e + j] = g < 0 ? 0xff : 0;
        o->dneg[e + j] = dneg ? 0xff : 0;
        o->val[e + j] = (int8_t)(8 * g + (dneg ? -1 : 1));
    }
}

/* IQ1_M: the fp16 super-block scale in the top nibbles of the four scale words */
static inline ggml_half gguflm_iq1m_scale(const block_iq1_m *b) {
    const uint16_t s0 = gguflm_u16_at(b->scales), s1 = gguflm_u16_at(b->scales + 2), s2 = gguflm_u16_at(b->scales + 4),
                   s3 = gguflm_u16_at(b->scales + 6);
    return (ggml_half)((s0 >> 12) | ((s1 >> 8) & 0x00f0) | ((s2 >> 4) & 0x0f00) | (s3 & 0xf000));
}

static inline __attribute__((always_inline)) void gguflm_iq_unpack(int type, const void *vb, gguflm_iqblock *o) {
    switch (type) {
    case GGUFLM_IQ2_XXS: {
        const block_iq2_xxs *b = (const block_iq2_xxs *)vb;
        o->d = gguflm_fp16_to_fp32(b->d);
        for (int g = 0; g < 8; ++g) {
            const uint8_t *q = (const uint8_t *)(b->qs + 4 * g);  /* 4 grid bytes, then signs and scale */
            const uint32_t a = gguflm_u32_at(q + 4);
            o->sc[2 * g] = o->sc[2 * g + 1] = (int16_t)(2 * (a >> 28) + 1);
            for (int l = 0; l < 4; ++l) gguflm_iq_put8(o, 32 * g + 8 * l, gguflm_iq2xxs_grid[q[l]], gguflm_ksigns_iq2xs[(a >> (7 * l)) & 127]);
        }
        break;
    }
    case GGUFLM_IQ2_XS: {
        const block_iq2_xs *b = (const block_iq2_xs *)vb;
        o->d = gguflm_fp16_to_fp32(b->d);
        for (int g = 0; g < 8; ++g) {
            o->sc[2 * g] = (int16_t)(2 * (b->scales[g] & 0xf) + 1);
            o->sc[2 * g + 1] = (int16_t)(2 * (b->scales[g] >> 4) + 1);
            for (int l = 0; l < 4; ++l) {
                const uint16_t q = b->qs[4 * g + l];
                gguflm_iq_put8(o, 32 * g + 8 * l, gguflm_iq2xs_grid[q & 511], gguflm_ksigns_iq2xs[q >> 9]);
            }
        }
        break;
    }
    case GGUFLM_IQ2_S: {
        const block_iq2_s *b = (const block_iq2_s *)vb;
        const uint8_t *signs = b->qs + QK_K / 8;
        o->d = gguflm_fp16_to_fp32(b->d);
        for (int g = 0; g < 8; ++g) {
            o->sc[2 * g] = (int16_t)(2 * (b->scales[g] & 0xf) + 1);
            o->sc[2 * g + 1] = (int16_t)(2 * (b->scales[g] >> 4) + 1);
            for (int l = 0; l < 4; ++l)
                gguflm_iq_put8(o, 32 * g + 8 * l, gguflm_iq2s_grid[b->qs[4 * g + l] | ((b->qh[g] << (8 - 2 * l)) & 0x300)],
                               signs[4 * g + l]);
        }
        break;
    }
    case GGUFLM_IQ3_XXS: {
        const block_iq3_xxs *b = (const block_iq3_xxs *)vb;
        o->d = gguflm_fp16_to_fp32(b->d);
        for (int g = 0; g < 8; ++g) {
            const uint32_t a = gguflm_u32_at(b->qs + QK_K / 4 + 4 * g);
            const uint8_t *q = b->qs + 8 * g;
            o->sc[2 * g] = o->sc[2 * g + 1] = (int16_t)(2 * (a >> 28) + 1);
            for (int l = 0; l < 4; ++l) {
                const uint64_t grid = (uint64_t)gguflm_iq3xxs_grid[q[2 * l + 1]] << 32 | gguflm_iq3xxs_grid[q[2 * l]];
                gguflm_iq_put8(o, 32 * g + 8 * l, grid, gguflm_ksigns_iq2xs[(a >> (7 * l)) & 127]);
            }
        }
        break;
    }
    case GGUFLM_IQ3_S: {
        const block_iq3_s *b = (const block_iq3_s *)vb;
        o->d = gguflm_fp16_to_fp32(b->d);
        for (int g = 0; g < 8; ++g) {
            const uint8_t *q = b->qs + 8 * g;
            const unsigned qh = b->qh[g];
            o->sc[2 * g] = o->sc[2 * g + 1] = (int16_t)(1 + 2 * ((b->scales[g / 2] >> (4 * (g % 2))) & 0xf));
            for (int l = 0; l < 4; ++l) {
                const uint64_t grid = (uint64_t)gguflm_iq3s_grid[q[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)] << 32 |
                                      gguflm_iq3s_grid[q[2 * l] | ((qh << (8 - 2 * l)) & 256)];
                gguflm_iq_put8(o, 32 * g + 8 * l, grid, b->signs[4 * g + l]);
            }
        }
        break;
    }
    case GGUFLM_IQ1_S: {
        const block_iq1_s *b = (const block_iq1_s *)vb;
        o->d = gguflm_fp16_to_fp32(b->d);
        for (int g = 0; g < 8; ++g) {
            const unsigned qh = b->qh[g];
            o->sc[2 * g] = o->sc[2 * g + 1] = (int16_t)(2 * ((qh >> 12) & 7) + 1);
            for (int l = 0; l < 4; ++l)
                gguflm_iq1_put8(o, 32 * g + 8 * l, gguflm_iq1s_grid[b->qs[4 * g + l] | (((qh >> (3 * l)) & 7) << 8)],
                                (qh & 0x8000) != 0);
        }
        break;
    }
    default: { /* IQ1_M */
        const block_iq1_m *b = (const block_iq1_m *)vb;
        o->d = gguflm_fp16_to_fp32(gguflm_iq1m_scale(b));
        for (int g = 0; g < 8; ++g) {
            const unsigned sc = gguflm_u16_at(b->scales + 2 * (g / 2)), sh = 6 * (g % 2);
            o->sc[2 * g] = (int16_t)(2 * ((sc >> sh) & 7) + 1);
            o->sc[2 * g + 1] = (int16_t)(2 * ((sc >> (sh + 3)) & 7) + 1);
            const uint8_t *q = b->qs + 4 * g, *qh = b->qh + 2 * g;
            for (int l = 0; l < 4; ++l) {
                const unsigned h = qh[l / 2] >> (4 * (l % 2));  /* index bits 0-2, delta sign bit 3 */
                gguflm_iq1_put8(o, 32 * g + 8 * l, gguflm_iq1s_grid[q[l] | ((h & 7) << 8)], (h & 8) != 0);
            }
        }
        break;
    }
    }
    if (!gguflm_iq_is_1bit(type))
        for (int e = 0; e < QK_K; ++e) o->val[e] = (int8_t)(o->neg[e] ? -o->mag[e] : o->mag[e]);
}

/* ======================= dequantize (ggml's float operations) ======================= */

static inline __attribute__((always_inline)) void gguflm_dequantize_iq(int type, const void *vx, float *y, int64_t k,
                                                                      size_t block_bytes) {
    gguflm_iqblock b;
    for (int64_t i = 0; i < k / QK_K; ++i, y += QK_K) {
        gguflm_iq_unpack(type, (const uint8_t *)vx + i * block_bytes, &b);
        for (int s = 0; s < QK_K / 16; ++s) {
            float dl;
            const int ls = (b.sc[s] - 1) / 2;
            /* IQ2: d * (0.5 + ls) * 0.25, IQ3_XXS: ... * 0.5, IQ3_S and IQ1: d * (2 ls + 1) */
            if (type == GGUFLM_IQ3_XXS) dl = b.d * (0.5f + (float)ls) * 0.5f;
            else if (type == GGUFLM_IQ3_S || gguflm_iq_is_1bit(type)) dl = b.d * (float)b.sc[s];
            else dl = b.d * (0.5f + (float)ls) * 0.25f;
            for (int e = 16 * s; e < 16 * s + 16; ++e) {
                if (gguflm_iq_is_1bit(type)) {
                    const float g = (float)(int8_t)(b.neg[e] ? -b.mag[e] : b.mag[e]);
                    y[e] = dl * (g + (b.dneg[e] ? -0.125f : 0.125f));
                } else {
                    const float v = dl * (float)b.mag[e];
                    y[e] = b.neg[e] ? -v : v;
                }
            }
        }
    }
}

static void gguflm_dequantize_row_iq2_xxs(const void *x, float *y, int64_t k) { gguflm_dequantize_iq(GGUFLM_IQ2_XXS, x, y, k, sizeof(block_iq2_xxs)); }
static void gguflm_dequantize_row_iq2_xs(const void *x, float *y, int64_t k) { gguflm_dequantize_iq(GGUFLM_IQ2_XS, x, y, k, sizeof(block_iq2_xs)); }
static void gguflm_dequantize_row_iq2_s(const void *x, float *y, int64_t k) { gguflm_dequantize_iq(GGUFLM_IQ2_S, x, y, k, sizeof(block_iq2_s)); }
static void gguflm_dequantize_row_iq3_xxs(const void *x, float *y, int64_t k) { gguflm_dequantize_iq(GGUFLM_IQ3_XXS, x, y, k, sizeof(block_iq3_xxs)); }
static void gguflm_dequantize_row_iq3_s(const void *x, float *y, int64_t k) { gguflm_dequantize_iq(GGUFLM_IQ3_S, x, y, k, sizeof(block_iq3_s)); }
static void gguflm_dequantize_row_iq1_s(const void *x, float *y, int64_t k) { gguflm_dequantize_iq(GGUFLM_IQ1_S, x, y, k, sizeof(block_iq1_s)); }
static void gguflm_dequantize_row_iq1_m(const void *x, float *y, int64_t k) { gguflm_dequantize_iq(GGUFLM_IQ1_M, x, y, k, sizeof(block_iq1_m)); }

/* ======================= the dots' integers and float steps ======================= */

/* a signed activation byte negated as _mm256_sign_epi8 does it (-(-128) wraps to -128) */
static inline int gguflm_iq_signed_act(int q, int neg) { return neg ? (q == -128 ? -128 : -q) : q; }

/* DOT's int32 lanes of one super-block: grid part, and IQ1_M's delta part */
typedef struct {
    int32_t lanes[8], delta[8], sumi1;  /* sumi1: IQ1_S's delta term through the bsums */
} gguflm_iqints;

static inline __attribute__((always_inline)) void gguflm_iq_ints(int type, const gguflm_iqblock *b, const block_q8_K *y,
                                                               gguflm_iqints *o) {
    memset(o, 0, sizeof(*o));
    for (int e = 0; e < QK_K; ++e) {
        const int sc = b->sc[e / 16];
        o->lanes[(e % 32) / 4] += sc * b->mag[e] * gguflm_iq_signed_act(y->qs[e], b->neg[e]);
        if (type == GGUFLM_IQ1_M) o->delta[(e % 32) / 4] += sc * gguflm_iq_signed_act(y->qs[e], b->dneg[e]);
    }
    if (type == GGUFLM_IQ1_S)
        for (int g = 0; g < 8; ++g)
            o->sumi1 += (y->bsums[2 * g] + y->bsums[2 * g + 1]) * (b->dneg[32 * g] ? -1 : 1) * b->sc[2 * g];
}

/* the tiled path's exact integer of one super-block */
static inline __attribute__((always_inline)) int32_t gguflm_iq_tiled_int(const gguflm_iqblock *b, const block_q8_K *y) {
    int32_t s = 0;
    for (int e = 0; e < QK_K; ++e) s += b->sc[e / 16] * b->val[e] * y->qs[e];
    return s;
}

/* DOT's float steps, once the lanes are summed into acc (and acc2 for IQ1_M, acc1 for IQ1_S) */
static inline float gguflm_iq_dot_result(int type, const float acc[8], const float acc2[8], float acc1) {
    if (type == GGUFLM_IQ1_S) return gguflm_hsum8_movehl(acc) + 0.125f * acc1;
    if (type == GGUFLM_IQ1_M) return fmaf(gguflm_hsum8_movehl(acc2), 0.125f, gguflm_hsum8_movehl(acc));
    return gguflm_iq_factor(type) * gguflm_hsum8_movehl(acc);
}

/* ======================= scalar reference kernels (one output) ======================= */

static inline __attribute__((always_inline)) float gguflm_iq_dot_1(int type, size_t bx, int64_t n, const uint8_t *x,
                                                                  const block_q8_K *y) {
    gguflm_iqblock b;
    gguflm_iqints in;
    float acc[8] = {0}, acc2[8] = {0}, acc1 = 0.0f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        gguflm_iq_unpack(type, x + i * bx, &b);
        gguflm_iq_ints(type, &b, &y[i], &in);
        const float d = b.d * y[i].d;
        for (int l = 0; l < 8; ++l) acc[l] = fmaf(d, (float)in.lanes[l], acc[l]);
        if (type == GGUFLM_IQ1_M)
            for (int l = 0; l < 8; ++l) acc2[l] = fmaf(d, (float)in.delta[l], acc2[l]);
        if (type == GGUFLM_IQ1_S) acc1 = fmaf(d, (float)in.sumi1, acc1);
    }
    return gguflm_iq_dot_result(type, acc, acc2, acc1);
}

static inline __attribute__((always_inline)) float gguflm_iq_tiled_1(int type, size_t bx, int64_t n, const uint8_t *x,
                                                                    const block_q8_K *y) {
    gguflm_iqblock b;
    float out = 0.0f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        gguflm_iq_unpack(type, x + i * bx, &b);
        const float res = b.d * gguflm_iq_factor(type) * (float)gguflm_iq_tiled_int(&b, &y[i]);
        out = fmaf(res, y[i].d, out);
    }
    return out;
}

/* DOT and TILED kernels of each type, and the entries of a [path][type] kernel table */
#define GGUFLM_IQ_TYPES(X)                  \
    X(iq2_xxs, GGUFLM_IQ2_XXS)              \
    X(iq2_xs, GGUFLM_IQ2_XS)                \
    X(iq2_s, GGUFLM_IQ2_S)                  \
    X(iq3_xxs, GGUFLM_IQ3_XXS)              \
    X(iq3_s, GGUFLM_IQ3_S)                  \
    X(iq1_s, GGUFLM_IQ1_S)                  \
    X(iq1_m, GGUFLM_IQ1_M)

#define GGUFLM_IQ_SCALAR_KERNELS(tag, TYPE)                                                                     \
    static void gguflm_DOT_##tag##_scalar(int64_t n, const uint8_t *w, int64_t ws, int64_t nr, const uint8_t *y,  \
                                          int64_t ys, int64_t nt, float *o, int64_t os, int arith) {             \
        (void)arith;                                                                                             \
        for (int64_t t = 0; t < nt; ++t)                                                                         \
            for (int64_t r = 0; r < nr; ++r)                                                                     \
                o[t * os + r] = gguflm_iq_dot_1(TYPE, sizeof(block_##tag), n, w + r * ws, (const block_q8_K *)(y + t * ys)); \
    }                                                                                                            \
    static void gguflm_TILED_##tag##_scalar(int64_t n, const uint8_t *w, int64_t ws, int64_t nr, const uint8_t *y, \
                                            int64_t ys, int64_t nt, float *o, int64_t os, int arith) {           \
        (void)arith;                                                                                             \
        for (int64_t t = 0; t < nt; ++t)                                                                         \
            for (int64_t r = 0; r < nr; ++r)                                                                     \
                o[t * os + r] = gguflm_iq_tiled_1(TYPE, sizeof(block_##tag), n, w + r * ws, (const block_q8_K *)(y + t * ys)); \
    }
GGUFLM_IQ_TYPES(GGUFLM_IQ_SCALAR_KERNELS)
#undef GGUFLM_IQ_SCALAR_KERNELS

/* [path][type] designators of the i-quant kernels named gguflm_<PATH>_<tag><suffix>, for
 * GGUFLM_KERNEL_TABLE */
#define GGUFLM_IQ_TABLE_ENTRY(tag, TYPE, suffix) \
    [GGUFLM_PATH_DOT][TYPE] = gguflm_DOT_##tag##suffix, [GGUFLM_PATH_TILED][TYPE] = gguflm_TILED_##tag##suffix,
#define GGUFLM_IQ_KERNEL_ENTRIES(suffix)                                                                        \
    GGUFLM_IQ_TABLE_ENTRY(iq2_xxs, GGUFLM_IQ2_XXS, suffix) GGUFLM_IQ_TABLE_ENTRY(iq2_xs, GGUFLM_IQ2_XS, suffix) \
    GGUFLM_IQ_TABLE_ENTRY(iq2_s, GGUFLM_IQ2_S, suffix) GGUFLM_IQ_TABLE_ENTRY(iq3_xxs, GGUFLM_IQ3_XXS, suffix)    \
    GGUFLM_IQ_TABLE_ENTRY(iq3_s, GGUFLM_IQ3_S, suffix) GGUFLM_IQ_TABLE_ENTRY(iq1_s, GGUFLM_IQ1_S, suffix)       \
    GGUFLM_IQ_TABLE_ENTRY(iq1_m, GGUFLM_IQ1_M, suffix)

#endif
