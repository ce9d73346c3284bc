/* Quantization with importance weights (ggml's quant_weights: one float per column of the row),
 * byte-identical with ggml_quantize_chunk given the same weights: ggml's quantize_row_<type>_impl
 * paths (ggml-quants.c), which search other scales than the reference quantizers. A type whose
 * ggml quantizer ignores the weights (Q8_0, MXFP4, TQ1_0, TQ2_0) has none here (NULL): its
 * reference quantizer is the answer.
 */
#ifndef GGUFLM_QUANTS_IMATRIX_H
#define GGUFLM_QUANTS_IMATRIX_H

#include "quants_lut_ref.h"
#include "quants_iq_quantize.h"

/* ---- ggml's weighted searches (ggml-quants.c) ---- */

/* make_qkx3_quants: a scale and a min (returned as -min in *the_min) for n values in 0..nmax,
 * the best weighted squared error of the plain range and nstep + 1 trial scales */
static float gguflm_make_qkx3_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                                     uint8_t *Laux, float rmin, float rdelta, int nstep) {
    float min, max, sum_w, sum_x;
    gguflm_weighted_range(n, x, weights, &min, &max, &sum_w, &sum_x);
    if (min > 0) min = 0;
    if (max <= min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    return gguflm_search_scale_min(n, nmax, x, weights, min, max, sum_w, sum_x, L, the_min, Laux, rmin, rdelta,
                                   nstep, false);
}

/* the weights of ggml's impls: qw * sqrt(sigma2 + x^2) */
static inline void gguflm_imatrix_weights(int n, const float *x, const float *qw, float sigma2, float *weight) {
    for (int j = 0; j < n; ++j) weight[j] = qw[j] * sqrtf(sigma2 + x[j] * x[j]);
}

static inline float gguflm_sum_x2(const float *x, int64_t n) {
    float s = 0;
    for (int64_t j = 0; j < n; ++j) s += x[j] * x[j];
    return s;
}

/* ---- legacy blocks (quantize_row_q{4,5}_{0,1}_impl): sigma2 over the whole row ---- */
static inline __attribute__((always_inline)) void gguflm_quantize_w_legacy(int type, const float *x, void *vy, int64_t k,
                                                                          const float *qw) {
    const int bits = (type == GGUFLM_Q4_0 || type == GGUFLM_Q4_1) ? 4 : 5;
    const int has_min = type == GGUFLM_Q4_1 || type == GGUFLM_Q5_1;
    const size_t block_bytes = type == GGUFLM_Q4_0 ? sizeof(block_q4_0) : type == GGUFLM_Q4_1 ? sizeof(block_q4_1)
                             : type == GGUFLM_Q5_0 ? sizeof(block_q5_0) : sizeof(block_q5_1);
    const float sigma2 = gguflm_sum_x2(x, k) / k;
    float weight[32];
    uint8_t L[32], Laux[32];
    for (int64_t ib = 0; ib < k / 32; ++ib) {
        const float *xb = x + 32 * ib;
        uint8_t *b = (uint8_t *)vy + ib * block_bytes;
        ggml_half *dm = (ggml_half *)b;
        gguflm_imatrix_weights(32, xb, qw + 32 * ib, sigma2, weight);
        if (has_min) {
            float min;
            const float d = gguflm_make_qkx3_quants(32, (1 << bits) - 1, xb, weight, L, &min, Laux, -0.9f, 0.05f, 36);
            dm[0] = gguflm_fp32_to_fp16(d);
            dm[1] = gguflm_fp32_to_fp16(-min);
        } else {
            dm[0] = gguflm_fp32_to_fp16(gguflm_make_qx_quants(32, 1 << (bits - 1), xb, (int8_t *)L, weight));
        }
        uint8_t *after = b + (has_min ? 4 : 2);
        if (bits == 4) gguflm_pack_q4(L, after);
        else gguflm_pack_q5(L, after + 4, after);
    }
}

static void gguflm_quantize_w_q4_0(const float *x, void *y, int64_t k, const float *qw) { gguflm_quantize_w_legacy(GGUFLM_Q4_0, x, y, k, qw); }
static void gguflm_quantize_w_q4_1(const float *x, void *y, int64_t k, const float *qw) { gguflm_quantize_w_legacy(GGUFLM_Q4_1, x, y, k, qw); }
static void gguflm_quantize_w_q5_0(const float *x, void *y, int64_t k, const float *qw) { gguflm_quantize_w_legacy(GGUFLM_Q5_0, x, y, k, qw); }
static void gguflm_quantize_w_q5_1(const float *x, void *y, int64_t k, const float *qw) { gguflm_quantize_w_legacy(GGUFLM_Q5_1, x, y, k, qw); }

/* ---- K-quants (quantize_row_q*_K_impl): sigma2 per super-block ---- */
static void gguflm_quantize_w_q2_K(const float *x, void *vy, int64_t k, const float *qw) {
    block_q2_K *y = (block_q2_K *)vy;
    uint8_t L[QK_K], Laux[16], Ls[QK_K / 16], Lm[QK_K / 16];
    float mins[QK_K / 16], scales[QK_K / 16], sw[QK_K / 16], weight[16];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        const float sigma2 = gguflm_sum_x2(x, QK_K) / QK_K;
        for (int j = 0; j < QK_K / 16; ++j) {
            gguflm_imatrix_weights(16, x + 16 * j, qw + QK_K * i + 16 * j, sigma2, weight);
            sw[j] = 0;
            for (int l = 0; l < 16; ++l) sw[j] += weight[l];
            scales[j] = gguflm_make_qkx3_quants(16, 3, x + 16 * j, weight, L + 16 * j, &mins[j], Laux, -0.9f, 0.05f, 36);
        }
        y[i].d = gguflm_fp32_to_fp16(gguflm_make_qp_quants(QK_K / 16, 15, scales, Ls, sw));
        y[i].dmin = gguflm_fp32_to_fp16(gguflm_make_qp_quants(QK_K / 16, 15, mins, Lm, sw));
        for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
        gguflm_q2_K_quants(x, &y[i], L);
    }
}

static void gguflm_quantize_w_q3_K(const float *x, void *vy, int64_t k, const float *qw) {
    block_q3_K *y = (block_q3_K *)vy;
    int8_t L[QK_K], Ls[QK_K / 16];
    float scales[QK_K / 16], weight[16], sw[QK_K / 16];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        const float sigma2 = 2 * gguflm_sum_x2(x, QK_K) / QK_K;
        for (int j = 0; j < QK_K / 16; ++j) {
            gguflm_imatrix_weights(16, x + 16 * j, qw + QK_K * i + 16 * j, sigma2, weight);
            float sumw = 0;
            for (int l = 0; l < 16; ++l) sumw += weight[l];
            sw[j] = sumw;
            scales[j] = gguflm_make_qx_quants(16, 4, x + 16 * j, L + 16 * j, weight);
        }
        memset(y[i].scales, 0, 12);
        const float d_block = gguflm_make_qx_quants(QK_K / 16, 32, scales, Ls, sw);
        for (int j = 0; j < QK_K / 16; ++j) gguflm_q3_K_put_scale(y[i].scales, j, Ls[j]);
        y[i].d = gguflm_fp32_to_fp16(d_block);
        gguflm_q3_K_quants(x, &y[i], L);
    }
}

/* Q4_K (nmax 15) and Q5_K (nmax 31): the 8 sub-block scales and mins, then the quants */
static void gguflm_quantize_w_q45_K(const float *x, int nmax, const float *qw, uint8_t *L, uint8_t *packed, ggml_half *dh,
                                    ggml_half *dminh) {
    uint8_t Laux[32], Ls[QK_K / 32], Lm[QK_K / 32];
    float weights[32], sw[QK_K / 32], mins[QK_K / 32], scales[QK_K / 32];
    const float sigma2 = 2 * gguflm_sum_x2(x, QK_K) / QK_K;
    for (int j = 0; j < QK_K / 32; ++j) {
        gguflm_imatrix_weights(32, x + 32 * j, qw + 32 * j, sigma2, weights);
        float sumw = 0;
        for (int l = 0; l < 32; ++l) sumw += weights[l];
        sw[j] = sumw;
        scales[j] = gguflm_make_qkx3_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -0.9f, 0.05f, 36);
    }
    const float d_block = gguflm_make_qp_quants(QK_K / 32, 63, scales, Ls, sw);
    const float m_block = gguflm_make_qp_quants(QK_K / 32, 63, mins, Lm, sw);
    /* ggml's quantize_row_q5_K_impl clamps the levels to 63, its q4_K one packs them as they are: a
     * wrapped negative one (a sub-block whose one weighted value fits a negative scale) keeps its
     * low bits there */
    const bool clamp = nmax == 31;
    for (int j = 0; j < QK_K / 32; ++j)
        gguflm_put_scale_min_k4(packed, j, clamp ? GGUFLM_MIN(63, Ls[j]) : Ls[j], clamp ? GGUFLM_MIN(63, Lm[j]) : Lm[j]);
    *dh = gguflm_fp32_to_fp16(d_block);
    *dminh = gguflm_fp32_to_fp16(m_block);
    gguflm_requantize_q45_K(x, nmax, packed, *dh, *dminh, L);
}

static void gguflm_quantize_w_q4_K(const float *x, void *vy, int64_t k, const float *qw) {
    block_q4_K *y = (block_q4_K *)vy;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        gguflm_quantize_w_q45_K(x, 15, qw + QK_K * i, L, y[i].scales, &y[i].d, &y[i].dmin);
        gguflm_pack_q4_K(L, y[i].qs);
    }
}

static void gguflm_quantize_w_q5_K(const float *x, void *vy, int64_t k, const float *qw) {
    block_q5_K *y = (block_q5_K *)vy;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        gguflm_quantize_w_q45_K(x, 31, qw + QK_K * i, L, y[i].scales, &y[i].d, &y[i].dmin);
        gguflm_pack_q5_K(L, y[i].qs, y[i].qh);
    }
}

/* Q6_K takes the importance weights themselves as the search's weights */
static void gguflm_quantize_w_q6_K(const float *x, void *vy, int64_t k, const float *qw) {
    block_q6_K *y = (block_q6_K *)vy;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        for (int ib = 0; ib < QK_K / 16; ++ib)
            scales[ib] = gguflm_make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, qw + QK_K * i + 16 * ib);
        gguflm_q6_K_finish(x, scales, &y[i], L);
    }
}

/* ---- the table ---- */

/* x [k] -> y (row_bytes(type, k)) with the importance weights qw [k] of the row's columns */
typedef void (*gguflm_quantize_w_fn)(const float *x, void *y, int64_t k, const float *qw);

static inline gguflm_quantize_w_fn gguflm_quantize_weighted(int type) {
    switch (type) {
    case GGUFLM_Q4_0: return gguflm_quantize_w_q4_0;
    case GGUFLM_Q4_1: return gguflm_quantize_w_q4_1;
    case GGUFLM_Q5_0: return gguflm_quantize_w_q5_0;
    case GGUFLM_Q5_1: return gguflm_quantize_w_q5_1;
    case GGUFLM_Q2_K: return gguflm_quantize_w_q2_K;
    case GGUFLM_Q3_K: return gguflm_quantize_w_q3_K;
    case GGUFLM_Q4_K: return gguflm_quantize_w_q4_K;
    case GGUFLM_Q5_K: return gguflm_quantize_w_q5_K;
    case GGUFLM_Q6_K: return gguflm_quantize_w_q6_K;
    case GGUFLM_IQ4_NL: return gguflm_quantize_w_iq4_nl;
    case GGUFLM_IQ4_XS: return gguflm_quantize_w_iq4_xs;
    default: return gguflm_iq_quantize_weighted(type);  /* the grid i-quants, NULL for the rest */
    }
}

#endif
