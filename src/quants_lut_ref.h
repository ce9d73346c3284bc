/* The value-table and ternary formats (IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0): quantizers
 * byte-identical with ggml_quantize_chunk (ggml-quants.c quantize_iq4_nl / quantize_iq4_xs with
 * ntry 7, with or without importance weights; quantize_row_mxfp4_ref, quantize_row_tq1_0_ref,
 * quantize_row_tq2_0_ref, which ignore weights), dequantizers equal to ggml's to_float, and the
 * unpacking of blocks into the integer values that the scalar dots share.
 *
 * As in quants_ref.h, ggml's expression shapes are kept (left-to-right products, the same
 * divisions) and nothing is contracted (no FMA in this file's build flags).
 */
#ifndef GGUFLM_QUANTS_LUT_REF_H
#define GGUFLM_QUANTS_LUT_REF_H

#include "quants_ref.h"

/* ======================= IQ4_NL, IQ4_XS ======================= */

/* ggml's best_index_int8: the index of the table value nearest to x (table ascending; a tie goes
 * to the upper one) */
static inline int gguflm_best_index_int8(int n, const int8_t *val, float x) {
    if (x <= val[0]) return 0;
    if (x >= val[n - 1]) return n - 1;
    int ml = 0, mu = n - 1;
    while (mu - ml > 1) {
        const int mav = (ml + mu) / 2;
        if (x < val[mav]) mu = mav;
        else ml = mav;
    }
    return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

/* ggml's quantize_row_iq4_nl_impl with block_size 32 and ntry 7 (what quantize_iq4_nl and
 * quantize_iq4_xs, hence ggml_quantize_chunk, use): per 32 elements the best scale of 15 trials
 * by weighted least squares (weights x^2, or qw * sqrt(sigma2 + x^2) with importance weights qw);
 * for a 256-element super-block the 8 scales are then quantized to 6 bits under one d and the
 * indices recomputed. qw: the importance weights of these elements, or NULL. */
static void gguflm_quantize_iq4_nl_impl(int super_block_size, const float *x, ggml_half *dh, uint8_t *q4,
                                        uint16_t *scales_h, uint8_t *scales_l, const float *qw) {
    const int block_size = 32, ntry = 7, nb = super_block_size / block_size;
    const int8_t *values = gguflm_kvalues_iq4nl;
    float scales[QK_K / 32], weight[32];
    uint8_t L[QK_K];
    float sigma2 = 0;
    for (int j = 0; j < super_block_size; ++j) sigma2 += x[j] * x[j];
    sigma2 *= 2.f / super_block_size;
    memset(q4, 0, (size_t)super_block_size / 2);
    memset(L, 0, sizeof(L));
    dh[0] = gguflm_fp32_to_fp16(0.f);
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < nb; ++ib) {
        const float *xb = x + ib * block_size;
        uint8_t *Lb = L + ib * block_size;
        if (qw) {
            for (int j = 0; j < block_size; ++j) weight[j] = qw[ib * block_size + j] * sqrtf(sigma2 + xb[j] * xb[j]);
        } else {
            for (int j = 0; j < block_size; ++j) weight[j] = xb[j] * xb[j];
        }
        float amax = 0, max = 0;
        for (int j = 0; j < block_size; ++j) {
            const float ax = fabsf(xb[j]);
            if (ax > amax) {
                amax = ax;
                max = xb[j];
            }
        }
        if (amax < GROUP_MAX_EPS) {
            scales[ib] = 0;
            continue;
        }
        float d = -max / values[0];
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < block_size; ++j) {
            const float al = id * xb[j];
            const int l = gguflm_best_index_int8(16, values, al);
            Lb[j] = (uint8_t)l;
            const float q = values[l];
            const float w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; ++itry) {
            id = (itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < block_size; ++j) {
                const float al = id * xb[j];
                const int l = gguflm_best_index_int8(16, values, al);
                const float q = values[l];
                const float w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        const float abs_d = fabsf(d);
        if (abs_d > amax_scale) {
            amax_scale = abs_d;
            max_scale = d;
        }
    }
    if (nb > 1) {
        memset(scales_h, 0, (size_t)((nb + 7) / 8) * sizeof(uint16_t));
        const float d = -max_scale / 32;
        dh[0] = gguflm_fp32_to_fp16(d);
        const float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < nb; ++ib) {
            int l = gguflm_nearest_int(id * scales[ib]);
            l = GGUFLM_MAX(-32, GGUFLM_MIN(31, l));
            const float dl = d * l;
            const float idl = dl ? 1 / dl : 0.f;
            uint8_t *Lb = L + ib * block_size;
            const float *xb = x + ib * block_size;
            for (int j = 0; j < block_size; ++j) Lb[j] = (uint8_t)gguflm_best_index_int8(16, values, idl * xb[j]);
            l += 32;
            const uint8_t l_l = l & 0xf, l_h = (uint8_t)(l >> 4);
            if (ib % 2 == 0) scales_l[ib / 2] = l_l;
            else scales_l[ib / 2] |= (uint8_t)(l_l << 4);
            scales_h[ib / 8] |= (uint16_t)(l_h << 2 * (ib % 8));
        }
    } else {
        dh[0] = gguflm_fp32_to_fp16(scales[0]);
        const float id = scales[0] ? 1 / scales[0] : 0;
        for (int j = 0; j < super_block_size; ++j) L[j] = (uint8_t)gguflm_best_index_int8(16, values, id * x[j]);
    }
    for (int i = 0; i < super_block_size / 32; ++i)
        for (int j = 0; j < 16; ++j) q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

/* qw: importance weights of the row's k columns, or NULL */
static void gguflm_quantize_w_iq4_nl(const float *x, void *vy, int64_t k, const float *qw) {
    block_iq4_nl *y = (block_iq4_nl *)vy;
    for (int64_t i = 0; i < k / QK4_NL; ++i) {
        uint16_t unused_h;
        gguflm_quantize_iq4_nl_impl(QK4_NL, x + QK4_NL * i, &y[i].d, y[i].qs, &unused_h, NULL,
                                    qw ? qw + QK4_NL * i : NULL);
    }
}

static void gguflm_quantize_w_iq4_xs(const float *x, void *vy, int64_t k, const float *qw) {
    block_iq4_xs *y = (block_iq4_xs *)vy;
    for (int64_t i = 0; i < k / QK_K; ++i)
        gguflm_quantize_iq4_nl_impl(QK_K, x + QK_K * i, &y[i].d, y[i].qs, &y[i].scales_h, y[i].scales_l,
                                    qw ? qw + QK_K * i : NULL);
}

static void gguflm_quantize_row_iq4_nl(const float *x, void *y, int64_t k) { gguflm_quantize_w_iq4_nl(x, y, k, NULL); }
static void gguflm_quantize_row_iq4_xs(const float *x, void *y, int64_t k) { gguflm_quantize_w_iq4_xs(x, y, k, NULL); }

/* the 6-bit scale (ls - 32) of sub-block ib of an IQ4_XS super-block */
static inline int gguflm_iq4_xs_scale(const block_iq4_xs *b, int ib) {
    return (((b->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((b->scales_h >> 2 * ib) & 3) << 4)) - 32;
}

/* the 32 table values of 16 bytes of 4-bit indices: low nibbles are elements 0-15, high 16-31 */
static inline void gguflm_lut_unpack32(const int8_t *table, const uint8_t *qs, int8_t *v) {
    for (int j = 0; j < 16; ++j) {
        v[j] = table[qs[j] & 0xf];
        v[j + 16] = table[qs[j] >> 4];
    }
}

static void gguflm_dequantize_row_iq4_nl(const void *vx, float *y, int64_t k) {
    const block_iq4_nl *x = (const block_iq4_nl *)vx;
    int8_t v[32];
    for (int64_t i = 0; i < k / QK4_NL; ++i) {
        const float d = gguflm_fp16_to_fp32(x[i].d);
        gguflm_lut_unpack32(gguflm_kvalues_iq4nl, x[i].qs, v);
        for (int j = 0; j < 32; ++j) y[32 * i + j] = d * v[j];
    }
}

static void gguflm_dequantize_row_iq4_xs(const void *vx, float *y, int64_t k) {
    const block_iq4_xs *x = (const block_iq4_xs *)vx;
    int8_t v[32];
    for (int64_t i = 0; i < k / QK_K; ++i) {
        const float d = gguflm_fp16_to_fp32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            const float dl = d * gguflm_iq4_xs_scale(&x[i], ib);
            gguflm_lut_unpack32(gguflm_kvalues_iq4nl, x[i].qs + 16 * ib, v);
            for (int j = 0; j < 32; ++j) y[QK_K * i + 32 * ib + j] = dl * v[j];
        }
    }
}

/* ======================= MXFP4 ======================= */

/* ggml's best_index_mxfp4: the first index of the least |value * e - x| */
static inline int gguflm_best_index_mxfp4(float x, float e) {
    int best_index = 0;
    float best_err = fabsf(gguflm_kvalues_mxfp4[0] * e - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf(gguflm_kvalues_mxfp4[i] * e - x);
        if (err < best_err) {
            best_index = i;
            best_err = err;
        }
    }
    return best_index;
}

/* ggml's quantize_row_mxfp4_ref: the exponent floor(log2(amax)) - 2 puts amax in the top E2M1
 * binade; each element takes its nearest table value. The exponent goes through float -> int ->
 * byte, as GCC compiles ggml's (uint8_t) cast of a float on x86. */
static void gguflm_quantize_row_mxfp4(const float *x, void *vy, int64_t k) {
    block_mxfp4 *y = (block_mxfp4 *)vy;
    for (int64_t i = 0; i < k / QK_MXFP4; i++, x += QK_MXFP4) {
        float amax = 0.0f;
        for (int j = 0; j < QK_MXFP4; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        const uint8_t e = amax > 0.0f ? (uint8_t)(int32_t)(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = gguflm_e8m0_to_fp32_half(e);
        y[i].e = e;
        for (int j = 0; j < QK_MXFP4 / 2; ++j)
            y[i].qs[j] = (uint8_t)(gguflm_best_index_mxfp4(x[j], d) | (gguflm_best_index_mxfp4(x[QK_MXFP4 / 2 + j], d) << 4));
    }
}

static void gguflm_dequantize_row_mxfp4(const void *vx, float *y, int64_t k) {
    const block_mxfp4 *x = (const block_mxfp4 *)vx;
    int8_t v[32];
    for (int64_t i = 0; i < k / QK_MXFP4; ++i) {
        const float d = gguflm_e8m0_to_fp32_half(x[i].e);
        gguflm_lut_unpack32(gguflm_kvalues_mxfp4, x[i].qs, v);
        for (int j = 0; j < 32; ++j) y[32 * i + j] = v[j] * d;
    }
}

/* ======================= TQ1_0, TQ2_0 ======================= */

/* ggml's ternary scale: amax; each element is lroundf(x / amax) in -1..1, stored + 1 */
static inline float gguflm_tq_scale(const float *x, ggml_half *dh) {
    float amax = 0.0f;
    for (int j = 0; j < QK_K; j++) amax = GGUFLM_MAX(amax, fabsf(x[j]));
    *dh = gguflm_fp32_to_fp16(amax);
    return amax ? 1.0f / amax : 0.0f;
}

/* n trits (x[0], x[stride], ...) as a base-3 number, the first the most significant */
static inline uint8_t gguflm_trits(const float *x, int n, int stride, float id) {
    uint8_t q = 0;
    for (int t = 0; t < n; ++t) q = (uint8_t)(q * 3 + (lroundf(x[t * stride] * id) + 1));
    return q;
}

/* ggml's quantize_row_tq1_0_ref: bytes hold 5 trits (4 in qh, padded by a zero trit) as the
 * fraction q / 243 of 256, rounded up, so that multiplying by 3^n brings trit n to the top */
static void gguflm_quantize_row_tq1_0(const float *x, void *vy, int64_t k) {
    block_tq1_0 *y = (block_tq1_0 *)vy;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        const float id = gguflm_tq_scale(x, &y[i].d);
        for (int m = 0; m < 32; ++m) y[i].qs[m] = (uint8_t)(((uint16_t)gguflm_trits(x + m, 5, 32, id) * 256 + 242) / 243);
        for (int m = 0; m < 16; ++m) y[i].qs[32 + m] = (uint8_t)(((uint16_t)gguflm_trits(x + 160 + m, 5, 16, id) * 256 + 242) / 243);
        for (int j = 0; j < 4; ++j) {
            const uint8_t q = (uint8_t)(gguflm_trits(x + 240 + j, 4, 4, id) * 3);
            y[i].qh[j] = (uint8_t)(((uint16_t)q * 256 + 242) / 243);
        }
    }
}

static void gguflm_quantize_row_tq2_0(const float *x, void *vy, int64_t k) {
    block_tq2_0 *y = (block_tq2_0 *)vy;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        const float id = gguflm_tq_scale(x, &y[i].d);
        for (int j = 0; j < 64; j += 32)
            for (int m = 0; m < 32; ++m) {
                uint8_t q = 0;
                for (int n = 0; n < 4; ++n) q += (uint8_t)(((lroundf(x[4 * j + m + 32 * n] * id) + 1) & 3) << (2 * n));
                y[i].qs[j + m] = q;
            }
    }
}

/* the trit of a TQ1_0 byte at base-3 position n (0: the most significant): 3 * (q * 3^n mod 256) / 256 */
static inline int gguflm_tq1_trit(uint8_t q, int n) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    const uint8_t r = (uint8_t)(q * pow3[n]);
    return ((uint16_t)r * 3) >> 8;
}

/* the 256 unsigned values 0..2 (value + 1; TQ2_0: 0..3 from any bits) of a ternary block, in
 * element order */
static inline void gguflm_tq_unpack(int type, const void *vb, uint8_t *u) {
    if (type == GGUFLM_TQ2_0) {
        const block_tq2_0 *b = (const block_tq2_0 *)vb;
        for (int e = 0; e < QK_K; ++e) u[e] = (b->qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
        return;
    }
    /* elements 32 n + m: trit n of qs[m]; 160 + 16 n + m: of qs[32 + m]; 240 + 4 n + m: of qh[m] */
    const block_tq1_0 *b = (const block_tq1_0 *)vb;
    for (int n = 0; n < 5; ++n)
        for (int m = 0; m < 32; ++m) u[32 * n + m] = (uint8_t)gguflm_tq1_trit(b->qs[m], n);
    for (int n = 0; n < 5; ++n)
        for (int m = 0; m < 16; ++m) u[160 + 16 * n + m] = (uint8_t)gguflm_tq1_trit(b->qs[32 + m], n);
    for (int n = 0; n < 4; ++n)
        for (int m = 0; m < 4; ++m) u[240 + 4 * n + m] = (uint8_t)gguflm_tq1_trit(b->qh[m], n);
}

static inline ggml_half gguflm_tq_d(int type, const void *vb) {
    return type == GGUFLM_TQ2_0 ? ((const block_tq2_0 *)vb)->d : ((const block_tq1_0 *)vb)->d;
}

static inline void gguflm_dequantize_tq(int type, const void *vx, float *y, int64_t k, size_t bytes) {
    uint8_t u[QK_K];
    for (int64_t i = 0; i < k / QK_K; ++i) {
        const uint8_t *b = (const uint8_t *)vx + i * bytes;
        const float d = gguflm_fp16_to_fp32(gguflm_tq_d(type, b));
        gguflm_tq_unpack(type, b, u);
        for (int e = 0; e < QK_K; ++e) y[QK_K * i + e] = (float)(u[e] - 1) * d;
    }
}

static void gguflm_dequantize_row_tq1_0(const void *x, float *y, int64_t k) { gguflm_dequantize_tq(GGUFLM_TQ1_0, x, y, k, sizeof(block_tq1_0)); }
static void gguflm_dequantize_row_tq2_0(const void *x, float *y, int64_t k) { gguflm_dequantize_tq(GGUFLM_TQ2_0, x, y, k, sizeof(block_tq2_0)); }

#endif
