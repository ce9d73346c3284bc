/* Portable scalar dot products: weight row (any type) x activation row in its vec_dot partner type.
 *
 * One signature for every kernel and every ISA (STYLE.md section 2): n elements, *s the result,
 * vx the weight row, vy the activation row. Integer sums inside a block, float scales once per
 * block, as ggml. The SIMD variants (quants_simd.h) must give the same integer block sums; for the
 * K-quants they also give the same float result bit for bit, since the float arithmetic per
 * super-block is the same scalar expression there.
 */
#ifndef GGUFLM_QUANTS_DOT_H
#define GGUFLM_QUANTS_DOT_H

#include "quants_ref.h"

typedef void (*gguflm_vec_dot_fn)(int64_t n, float *s, const void *vx, const void *vy);

/* the same for GGUFLM_DOT_TOKENS activation rows at once, y_stride bytes apart, results
 * s_stride floats apart; SIMD-only, for batches (a weight block is decoded once per group) */
#define GGUFLM_DOT_TOKENS 4
_Static_assert(GGUFLM_DOT_TOKENS == 4, "the SIMD scale gathers insert exactly four lanes");
typedef void (*gguflm_vec_dotn_fn)(int64_t n, float *s, int64_t s_stride, const void *vx, const void *vy,
                                   int64_t y_stride);

/* types whose partner is Q8_1 (they carry a min; Q8_1's s = d*sum(qs) applies it once per block) */
static inline int gguflm_legacy_has_min(int type) { return type == GGUFLM_Q4_1 || type == GGUFLM_Q5_1; }

/* float value of one K super-block from its exact integer sums. The explicit fmaf leaves nothing
 * for the compiler to contract, so the FMA-enabled SIMD code and the scalar code round alike and
 * all ISAs give the same float for the same integers. */
static inline float gguflm_kblock_value(float yd, float d, float dmin, int32_t sumi, int32_t summ) {
    return fmaf(yd * d, (float)sumi, -((yd * dmin) * (float)summ));
}

/* sum_j sc[j]*bsums[j] and sum_j mn[j]*bsums[j]: the zero-point and min terms of a K dot */
static inline void gguflm_kbsum_terms(const gguflm_kblock *kb, const int16_t *bsums, int32_t *sumz, int32_t *summ) {
    int32_t z = 0, m = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
        z += kb->sc[j] * bsums[j];
        m += kb->mn[j] * bsums[j];
    }
    *sumz = z;
    *summ = m;
}

static inline __attribute__((always_inline)) void gguflm_dot_legacy_scalar(int type, size_t bx, int64_t n, float *s,
                                                                           const void *vx, const void *vy) {
    const int has_min = gguflm_legacy_has_min(type);
    const size_t by = has_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    gguflm_legacy_block xb;
    float sumf = 0;
    for (int64_t ib = 0; ib < n / 32; ++ib) {
        const uint8_t *yb = (const uint8_t *)vy + ib * by;
        const int8_t *yq = has_min ? ((const block_q8_1 *)yb)->qs : ((const block_q8_0 *)yb)->qs;
        gguflm_legacy_unpack(type, (const uint8_t *)vx + ib * bx, &xb);
        int sumi = 0;
        for (int j = 0; j < 32; ++j) sumi += xb.v[j] * yq[j];
        const float dxy = xb.d * gguflm_fp16_to_fp32(*(const ggml_half *)yb);
        if (has_min) {
            sumf += dxy * sumi + xb.m * gguflm_fp16_to_fp32(((const block_q8_1 *)yb)->s);
        } else {
            sumf += dxy * sumi;
        }
    }
    *s = sumf;
}

static inline __attribute__((always_inline)) void gguflm_dot_k_scalar(int type, size_t bx, int64_t n, float *s,
                                                                      const void *vx, const void *vy) {
    const block_q8_K *y = (const block_q8_K *)vy;
    gguflm_kblock kb;
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        gguflm_kunpack(type, (const uint8_t *)vx + i * bx, &kb);
        int32_t sumi = 0, sumz, summ;
        for (int j = 0; j < QK_K / 16; ++j) {
            int32_t sub = 0;
            for (int l = 0; l < 16; ++l) sub += kb.u[16 * j + l] * y[i].qs[16 * j + l];
            sumi += kb.sc[j] * sub;
        }
        gguflm_kbsum_terms(&kb, y[i].bsums, &sumz, &summ);
        sumf += gguflm_kblock_value(y[i].d, kb.d, kb.dmin, sumi - kb.zero * sumz, summ);
    }
    *s = sumf;
}

/* one element of a float-format row */
static inline __attribute__((always_inline)) float gguflm_float_at(int type, const void *p, int64_t i) {
    if (type == GGUFLM_F16) return gguflm_fp16_to_fp32(((const ggml_half *)p)[i]);
    if (type == GGUFLM_BF16) return gguflm_bf16_to_fp32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* F32/F16/BF16 x same type: float products summed in double (ggml's ggml_float) */
static inline __attribute__((always_inline)) void gguflm_dot_float_scalar(int type, int64_t n, float *s, const void *vx, const void *vy) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += (double)(gguflm_float_at(type, vx, i) * gguflm_float_at(type, vy, i));
    *s = (float)sum;
}

static void gguflm_dot_q4_0_scalar(int64_t n, float *s, const void *x, const void *y) { gguflm_dot_legacy_scalar(GGUFLM_Q4_0, sizeof(block_q4_0), n, s, x, y); }
static void gguflm_dot_q4_1_scalar(int64_t n, float *s, const void *x, const void *y) { gguflm_dot_legacy_scalar(GGUFLM_Q4_1, sizeof(block_q4_1), n, s, x, y); }
static void gguflm_dot_q5_0_scalar(int64_t n, float *s, const void *x, const void *y) { gguflm_dot_legacy_scalar(GGUFLM_Q5_0, sizeof(block_q5_0), n, s, x, y); }
static void gguflm_dot_q5_1_scalar(int64_t n, float *s, const void *x, const void *y) { gguflm_dot_legacy_scalar(GGUFLM_Q5_1, sizeof(block_q5_1), n, s, x, y); }
static void gguflm_dot_q8_0_scalar(int64_t n, float *s, const void *x, const void *y) { gguflm_dot_legacy_scalar(GGUFLM_Q8_0, sizeof(block_q8_0), n, s, x, y); }
static void gguflm_dot_q2_K_scalar(int64_t n, float *s, const void *x, const void *y) { gguflm_dot_k_scalar(GGUFLM_Q2_K, sizeof(block_q2_K), n, s, x, y); }
static void gguflm_dot_q3_K_scalar(int64_t n, float *s, const void *x, const void *y) { gguflm_dot_k_scalar(GGUFLM_Q3_K, sizeof(block_q3_K), n, s, x, y); }
static void gguflm_dot_q4_K_scalar(int64_t n, float *s, const void *x, const void *y) { gguflm_dot_k_scalar(GGUFLM_Q4_K, sizeof(block_q4_K), n, s, x, y); }
static void gguflm_dot_q5_K_scalar(int64_t n, float *s, const void *x, const void *y) { gguflm_dot_k_scalar(GGUFLM_Q5_K, sizeof(block_q5_K), n, s, x, y); }
static void gguflm_dot_q6_K_scalar(int64_t n, float *s, const void *x, const void *y) { gguflm_dot_k_scalar(GGUFLM_Q6_K, sizeof(block_q6_K), n, s, x, y); }
static void gguflm_dot_f32_scalar(int64_t n, float *s, const void *x, const void *y) { gguflm_dot_float_scalar(GGUFLM_F32, n, s, x, y); }
static void gguflm_dot_f16_scalar(int64_t n, float *s, const void *x, const void *y) { gguflm_dot_float_scalar(GGUFLM_F16, n, s, x, y); }
static void gguflm_dot_bf16_scalar(int64_t n, float *s, const void *x, const void *y) { gguflm_dot_float_scalar(GGUFLM_BF16, n, s, x, y); }

static const gguflm_vec_dot_fn gguflm_dot_table_scalar[GGUFLM_TYPE_COUNT] = {
    [GGUFLM_F32] = gguflm_dot_f32_scalar,   [GGUFLM_F16] = gguflm_dot_f16_scalar,   [GGUFLM_BF16] = gguflm_dot_bf16_scalar,
    [GGUFLM_Q4_0] = gguflm_dot_q4_0_scalar, [GGUFLM_Q4_1] = gguflm_dot_q4_1_scalar, [GGUFLM_Q5_0] = gguflm_dot_q5_0_scalar,
    [GGUFLM_Q5_1] = gguflm_dot_q5_1_scalar, [GGUFLM_Q8_0] = gguflm_dot_q8_0_scalar, [GGUFLM_Q2_K] = gguflm_dot_q2_K_scalar,
    [GGUFLM_Q3_K] = gguflm_dot_q3_K_scalar, [GGUFLM_Q4_K] = gguflm_dot_q4_K_scalar, [GGUFLM_Q5_K] = gguflm_dot_q5_K_scalar,
    [GGUFLM_Q6_K] = gguflm_dot_q6_K_scalar,
};

#endif
