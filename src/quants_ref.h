/* Reference quantizers and dequantizers, byte-identical with ggml's (ggml-quants.c, no imatrix).
 *
 * Byte identity needs ggml's exact float operation order, so the arithmetic below keeps ggml's
 * expression shapes (left-to-right products, the same divisions, the same clamps). This code is
 * compiled without FMA, so nothing is contracted. Also here: the activation quantizers that feed
 * the dots (ggml's CPU `from_float`), and the unpacking of blocks into plain integer quants that
 * the scalar dots and the dequantizers share.
 */
#ifndef GGUFLM_QUANTS_REF_H
#define GGUFLM_QUANTS_REF_H

#include <float.h>
#include <stdbool.h>
#include "ggml_blocks.h"

#define GGUFLM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define GGUFLM_MAX(a, b) ((a) > (b) ? (a) : (b))
#define GROUP_MAX_EPS 1e-15f

/* type ids are ggml's (enum ggml_type) */
enum {
    GGUFLM_F32 = 0, GGUFLM_F16 = 1, GGUFLM_Q4_0 = 2, GGUFLM_Q4_1 = 3, GGUFLM_Q5_0 = 6, GGUFLM_Q5_1 = 7,
    GGUFLM_Q8_0 = 8, GGUFLM_Q8_1 = 9, GGUFLM_Q2_K = 10, GGUFLM_Q3_K = 11, GGUFLM_Q4_K = 12,
    GGUFLM_Q5_K = 13, GGUFLM_Q6_K = 14, GGUFLM_Q8_K = 15, GGUFLM_BF16 = 30,
    /* the value-table and ternary formats */
    GGUFLM_IQ4_NL = 20, GGUFLM_IQ4_XS = 23, GGUFLM_TQ1_0 = 34, GGUFLM_TQ2_0 = 35, GGUFLM_MXFP4 = 39,
    GGUFLM_TYPE_COUNT = 40
};
/* the grid i-quants (quants_iq_dot.h) */
enum {
    GGUFLM_IQ2_XXS = 16, GGUFLM_IQ2_XS = 17, GGUFLM_IQ3_XXS = 18, GGUFLM_IQ1_S = 19, GGUFLM_IQ3_S = 21,
    GGUFLM_IQ2_S = 22, GGUFLM_IQ1_M = 29
};

/* round to nearest, ties to even, for |fval| <= 2^22: adding 1.5 * 2^23 leaves the integer in the
 * low mantissa bits (ggml's nearest_int) */
static inline int gguflm_nearest_int(float fval) {
    const float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

/* ======================= legacy 32-element blocks ======================= */

/* the element of largest magnitude, sign kept (the first one on ties) */
static inline float gguflm_signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
    }
    return max;
}

/* Q4_0/Q5_0: d = max / -2^(bits-1), quants trunc(x/d + 2^(bits-1) + 0.5) clamped to 2^bits - 1 */
static inline float gguflm_quantize_sym_block(const float *x, int bits, uint8_t *xi) {
    const int half = 1 << (bits - 1);
    const float d = gguflm_signed_absmax(x, 32) / -half;
    const float id = d ? 1.0f / d : 0.0f;
    const float offset = half + 0.5f;
    for (int j = 0; j < 32; ++j) xi[j] = GGUFLM_MIN(2 * half - 1, (int8_t)(int32_t)(x[j] * id + offset));
    return d;
}

/* Q4_1/Q5_1: d = (max - min) / (2^bits - 1), quants trunc((x - min)/d + 0.5) */
static inline float gguflm_quantize_min_block(const float *x, int bits, uint8_t *xi, float *min_out) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < 32; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    const int nmax = (1 << bits) - 1;
    const float d = (max - min) / nmax;
    const float id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; ++j) xi[j] = GGUFLM_MIN(nmax, (int8_t)(int32_t)((x[j] - min) * id + 0.5f));
    *min_out = min;
    return d;
}

/* Q4_0/Q4_1: element j in the low nibble of qs[j], element j + 16 in the high one */
static inline void gguflm_pack_q4(const uint8_t *xi, uint8_t *qs) {
    for (int j = 0; j < 16; ++j) qs[j] = (uint8_t)(xi[j] | (xi[j + 16] << 4));
}

/* Q5_0/Q5_1: low nibbles as Q4, the fifth bit of element j in bit j of qh */
static inline void gguflm_pack_q5(const uint8_t *xi, uint8_t *qs, uint8_t *qh_bytes) {
    uint32_t qh = 0;
    for (int j = 0; j < 32; ++j) qh |= ((xi[j] & 0x10u) >> 4) << j;
    for (int j = 0; j < 16; ++j) qs[j] = (uint8_t)((xi[j] & 0x0F) | ((xi[j + 16] & 0x0F) << 4));
    memcpy(qh_bytes, &qh, sizeof(qh));
}

/* Q4_0, Q4_1, Q5_0, Q5_1 rows: fields after the half-precision d (and m) as the structs lay them */
static inline __attribute__((always_inline)) void gguflm_quantize_legacy(int type, const float *x, void *vy, int64_t k) {
    const int bits = (type == GGUFLM_Q4_0 || type == GGUFLM_Q4_1) ? 4 : 5;
    const int has_min = type == GGUFLM_Q4_1 || type == GGUFLM_Q5_1;
    const size_t block_bytes = type == GGUFLM_Q4_0 ? sizeof(block_q4_0) : type == GGUFLM_Q4_1 ? sizeof(block_q4_1)
                             : type == GGUFLM_Q5_0 ? sizeof(block_q5_0) : sizeof(block_q5_1);
    uint8_t xi[32];
    float min = 0.0f;
    for (int64_t i = 0; i < k / 32; i++, x += 32) {
        uint8_t *b = (uint8_t *)vy + i * block_bytes;
        const float d = has_min ? gguflm_quantize_min_block(x, bits, xi, &min) : gguflm_quantize_sym_block(x, bits, xi);
        ggml_half *dm = (ggml_half *)b;
        dm[0] = gguflm_fp32_to_fp16(d);
        if (has_min) dm[1] = gguflm_fp32_to_fp16(min);
        uint8_t *after = b + (has_min ? 4 : 2);
        if (bits == 4) gguflm_pack_q4(xi, after);
        else gguflm_pack_q5(xi, after + 4, after);   /* qh[4] comes before qs */
    }
}

static void gguflm_quantize_row_q4_0(const float *x, void *y, int64_t k) { gguflm_quantize_legacy(GGUFLM_Q4_0, x, y, k); }
static void gguflm_quantize_row_q4_1(const float *x, void *y, int64_t k) { gguflm_quantize_legacy(GGUFLM_Q4_1, x, y, k); }
static void gguflm_quantize_row_q5_0(const float *x, void *y, int64_t k) { gguflm_quantize_legacy(GGUFLM_Q5_0, x, y, k); }
static void gguflm_quantize_row_q5_1(const float *x, void *y, int64_t k) { gguflm_quantize_legacy(GGUFLM_Q5_1, x, y, k); }

/* weight-side Q8_0/Q8_1 (ggml's *_ref): scale amax/127, roundf (ties away from zero) */
static inline float gguflm_q8_ref_block(const float *x, int8_t *qs) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = GGUFLM_MAX(amax, fabsf(x[j]));
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; ++j) qs[j] = (int8_t)(int32_t)roundf(x[j] * id);
    return d;
}

static void gguflm_quantize_row_q8_0(const float *x, void *vy, int64_t k) {
    block_q8_0 *y = (block_q8_0 *)vy;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) y[i].d = gguflm_fp32_to_fp16(gguflm_q8_ref_block(x, y[i].qs));
}

static void gguflm_quantize_row_q8_1(const float *x, void *vy, int64_t k) {
    block_q8_1 *y = (block_q8_1 *)vy;
    for (int64_t i = 0; i < k / QK8_1; i++, x += QK8_1) {
        const float d = gguflm_q8_ref_block(x, y[i].qs);
        int sum = 0;
        for (int j = 0; j < QK8_1; ++j) sum += y[i].qs[j];
        y[i].d = gguflm_fp32_to_fp16(d);
        y[i].s = gguflm_fp32_to_fp16(sum * d);
    }
}

/* ---- activation-side Q8_0/Q8_1, as ggml's x86 CPU backend quantizes src1 before a matmul ----
 * (arch/x86/quants.c quantize_row_q8_0/q8_1 with AVX): multiplier 127/amax and round-half-even
 * with int8 saturation. This differs from the weight-side reference above in rare ties and last
 * bits, and it is what llama.cpp computes on this kind of machine, so every ISA here uses it. */
static inline int8_t gguflm_round_even_sat_i8(float v) {
    if (v != v) return -128;                 /* cvtps2dq gives INT_MIN for NaN; packs saturate it */
    if (v >= 127.5f) return 127;
    if (v <= -128.5f) return -128;
    return (int8_t)gguflm_nearest_int(v);
}

static inline float gguflm_q8_act_block(const float *x, int8_t *qs, int *sum) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = GGUFLM_MAX(amax, fabsf(x[j]));
    const float d = amax / 127.f;
    const float id = (amax != 0.0f) ? 127.f / amax : 0.0f;
    int s = 0;
    for (int j = 0; j < 32; ++j) {
        qs[j] = gguflm_round_even_sat_i8(x[j] * id);
        s += qs[j];
    }
    *sum = s;
    return d;
}

static void gguflm_quantize_act_q8_0(const float *x, void *vy, int64_t k) {
    block_q8_0 *y = (block_q8_0 *)vy;
    int sum;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) y[i].d = gguflm_fp32_to_fp16(gguflm_q8_act_block(x, y[i].qs, &sum));
}

static void gguflm_quantize_act_q8_1(const float *x, void *vy, int64_t k) {
    block_q8_1 *y = (block_q8_1 *)vy;
    int sum;
    for (int64_t i = 0; i < k / QK8_1; i++, x += QK8_1) {
        const float d = gguflm_q8_act_block(x, y[i].qs, &sum);
        y[i].d = gguflm_fp32_to_fp16(d);
        y[i].s = gguflm_fp32_to_fp16(d * sum);
    }
}

/* a legacy block as signed integer quants v, value = d*v (+ m when has_min) */
typedef struct {
    int8_t v[32];
    float d, m;
    int has_min;
} gguflm_legacy_block;

static inline __attribute__((always_inline)) void gguflm_legacy_unpack(int type, const void *vb, gguflm_legacy_block *out) {
    const uint8_t *b = (const uint8_t *)vb;
    const ggml_half *halves = (const ggml_half *)vb;
    out->has_min = type == GGUFLM_Q4_1 || type == GGUFLM_Q5_1;
    out->d = gguflm_fp16_to_fp32(halves[0]);
    out->m = out->has_min ? gguflm_fp16_to_fp32(halves[1]) : 0.0f;
    if (type == GGUFLM_Q8_0 || type == GGUFLM_Q8_1) {
        memcpy(out->v, b + (type == GGUFLM_Q8_0 ? 2 : 4), 32);   /* Q8_1's second half is s */
        return;
    }
    /* after the halves: Q5's qh[4] (fifth bit of element j in bit j), then 16 bytes of nibbles with
     * element j low and element j + 16 high; Q4_0/Q5_0 store value + 8 / value + 16 */
    const int five = type == GGUFLM_Q5_0 || type == GGUFLM_Q5_1;
    const uint8_t *p = b + (out->has_min ? 4 : 2);
    const uint8_t *qs = five ? p + 4 : p;
    uint32_t qh = 0;
    if (five) memcpy(&qh, p, 4);
    const int zero = out->has_min ? 0 : (five ? 16 : 8);
    for (int j = 0; j < 16; ++j) {
        out->v[j] = (int8_t)(((qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - zero);
        out->v[j + 16] = (int8_t)(((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - zero);
    }
}

static inline __attribute__((always_inline)) void gguflm_dequantize_legacy(int type, const void *vx, float *y, int64_t k, size_t block_bytes) {
    gguflm_legacy_block b;
    for (int64_t i = 0; i < k / 32; i++, y += 32) {
        gguflm_legacy_unpack(type, (const uint8_t *)vx + i * block_bytes, &b);
        if (b.has_min) {
            for (int j = 0; j < 32; ++j) y[j] = b.v[j] * b.d + b.m;
        } else {
            for (int j = 0; j < 32; ++j) y[j] = b.v[j] * b.d;
        }
    }
}

static void gguflm_dequantize_row_q4_0(const void *x, float *y, int64_t k) { gguflm_dequantize_legacy(GGUFLM_Q4_0, x, y, k, sizeof(block_q4_0)); }
static void gguflm_dequantize_row_q4_1(const void *x, float *y, int64_t k) { gguflm_dequantize_legacy(GGUFLM_Q4_1, x, y, k, sizeof(block_q4_1)); }
static void gguflm_dequantize_row_q5_0(const void *x, float *y, int64_t k) { gguflm_dequantize_legacy(GGUFLM_Q5_0, x, y, k, sizeof(block_q5_0)); }
static void gguflm_dequantize_row_q5_1(const void *x, float *y, int64_t k) { gguflm_dequantize_legacy(GGUFLM_Q5_1, x, y, k, sizeof(block_q5_1)); }
static void gguflm_dequantize_row_q8_0(const void *x, float *y, int64_t k) { gguflm_dequantize_legacy(GGUFLM_Q8_0, x, y, k, sizeof(block_q8_0)); }
static void gguflm_dequantize_row_q8_1(const void *x, float *y, int64_t k) { gguflm_dequantize_legacy(GGUFLM_Q8_1, x, y, k, sizeof(block_q8_1)); }

/* ======================= K-quants: scale searches ======================= */

/* ggml's make_qx_quants with rmse_type 1: the best of 19 trial scales around -nmax/max by weighted
 * least squares, weights qw (importance weights) or, without them, x^2. L gets quants offset by
 * nmax. */
static float gguflm_make_qx_quants(int n, int nmax, const float *x, int8_t *L, const float *qw) {
    const float max = gguflm_signed_absmax(x, n);
    if (fabsf(max) < GROUP_MAX_EPS) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = gguflm_nearest_int(iscale * x[i]);
        l = GGUFLM_MAX(-nmax, GGUFLM_MIN(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        const float w = qw ? qw[i] : x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = gguflm_nearest_int(iscale * x[i]);
            l = GGUFLM_MAX(-nmax, GGUFLM_MIN(nmax - 1, l));
            const float w = qw ? qw[i] : x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) {
                const int l = gguflm_nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + GGUFLM_MAX(-nmax, GGUFLM_MIN(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* ggml's make_q3_quants(do_rmse=true): start from -nmax/max, then up to 5 rounds of moving single
 * quants while the weighted fit improves */
static float gguflm_make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
    const float max = gguflm_signed_absmax(x, n);
    if (fabsf(max) < GROUP_MAX_EPS) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = gguflm_nearest_int(iscale * x[i]);
        l = GGUFLM_MAX(-nmax, GGUFLM_MIN(nmax - 1, l));
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = gguflm_nearest_int(x[i] * sl2 / slx);
                new_l = GGUFLM_MAX(-nmax, GGUFLM_MIN(nmax - 1, new_l));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* the weighted range of n values: min and max, the sum of the weights and of weight * value */
static inline void gguflm_weighted_range(int n, const float *x, const float *weights, float *min, float *max,
                                         float *sum_w, float *sum_x) {
    *min = x[0], *max = x[0];
    *sum_w = weights[0];
    *sum_x = *sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < *min) *min = x[i];
        if (x[i] > *max) *max = x[i];
        const float w = weights[i];
        *sum_w += w;
        *sum_x += w * x[i];
    }
}

/* the search make_qkx2_quants and make_qkx3_quants share: quants L of the plain range [min, max]
 * in 0..nmax, then nstep + 1 trial scales (none when nstep < 0), each fitted by weighted least
 * squares, keeping the smallest weighted error (absolute with use_mad, else squared); returns the
 * scale, *the_min gets -min */
static float gguflm_search_scale_min(int n, int nmax, const float *x, const float *weights, float min, float max,
                                     float sum_w, float sum_x, uint8_t *L, float *the_min, uint8_t *Laux, float rmin,
                                     float rdelta, int nstep, bool use_mad) {
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        const int l = gguflm_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)GGUFLM_MAX(0, GGUFLM_MIN(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = gguflm_nearest_int(iscale * (x[i] - min));
            l = GGUFLM_MAX(0, GGUFLM_MIN(nmax, l));
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; ++i) L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* ggml's make_qkx2_quants: scale and min (x ~ scale*L - min) by weighted least squares over
 * nstep+1 trial scales (none when nstep < 1); returns the scale, *the_min gets the (positive) min */
static float gguflm_make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                                     float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                                     bool use_mad) {
    float min, max, sum_w, sum_x;
    gguflm_weighted_range(n, x, weights, &min, &max, &sum_w, &sum_x);
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    return gguflm_search_scale_min(n, nmax, x, weights, min, max, sum_w, sum_x, L, the_min, Laux, rmin, rdelta,
                                   nstep < 1 ? -1 : nstep, use_mad);
}

/* Q4_K/Q5_K pack 8 six-bit scales and 8 six-bit mins into 12 bytes */
static inline void gguflm_get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* 2-bit quants of four 32-element runs share a byte: element 128n + 32s + l sits at bits 2s of
 * qs[32n + l] (Q2_K and Q3_K) */
static inline void gguflm_pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QK_K; j += 128) {
        for (int l = 0; l < 32; ++l) {
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
        }
    }
}

/* Q2_K's quants requantized against the block's rounded scales and mins, packed (L: the search's
 * quants, kept where a scale is zero) */
static void gguflm_q2_K_quants(const float *x, block_q2_K *y, uint8_t *L) {
    for (int j = 0; j < QK_K / 16; ++j) {
        const float d = gguflm_fp16_to_fp32(y->d) * (y->scales[j] & 0xF);
        if (!d) continue;
        const float dm = gguflm_fp16_to_fp32(y->dmin) * (y->scales[j] >> 4);
        for (int ii = 0; ii < 16; ++ii) {
            const int l = gguflm_nearest_int((x[16 * j + ii] + dm) / d);
            L[16 * j + ii] = (uint8_t)GGUFLM_MAX(0, GGUFLM_MIN(3, l));
        }
    }
    gguflm_pack_2bit(L, y->qs);
}

static void gguflm_quantize_row_q2_K(const float *x, void *vy, int64_t k) {
    block_q2_K *y = (block_q2_K *)vy;
    uint8_t L[QK_K], Laux[16];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];
    const float q4scale = 15.f;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; ++j) {
            for (int l = 0; l < 16; ++l) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = gguflm_make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = (uint8_t)gguflm_nearest_int(iscale * scales[j]);
            y[i].d = gguflm_fp32_to_fp16(max_scale / q4scale);
        } else {
            for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = 0;
            y[i].d = gguflm_fp32_to_fp16(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] |= (uint8_t)(gguflm_nearest_int(iscale * mins[j]) << 4);
            y[i].dmin = gguflm_fp32_to_fp16(max_min / q4scale);
        } else {
            y[i].dmin = gguflm_fp32_to_fp16(0.f);
        }
        gguflm_q2_K_quants(x, &y[i], L);
    }
}

/* Q3_K scale j (6 bits, stored +32): low nibble in bytes 0..7, top two bits in bytes 8..11 */
static inline int gguflm_q3_K_scale(const uint8_t *scales, int j) {
    const int low = j < 8 ? scales[j] & 0xF : scales[j - 8] >> 4;
    return (low | (((scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
}

/* stores scale j, l in 0..63 (scale + 32), into the zeroed 12 bytes */
static inline void gguflm_q3_K_put_scale(uint8_t *scales, int j, int l) {
    if (j < 8) scales[j] = (uint8_t)(l & 0xF);
    else scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
    scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
}

/* Q3_K's quants requantized against the block's rounded scales, the high bits into hmask (that of
 * element j to bit j/32 of hmask[j % 32]), packed; L: the search's quants (+4) */
static void gguflm_q3_K_quants(const float *x, block_q3_K *y, int8_t *L) {
    for (int j = 0; j < QK_K / 16; ++j) {
        const float d = gguflm_fp16_to_fp32(y->d) * (int8_t)gguflm_q3_K_scale(y->scales, j);
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii) {
            const int l = gguflm_nearest_int(x[16 * j + ii] / d);
            L[16 * j + ii] = (int8_t)(GGUFLM_MAX(-4, GGUFLM_MIN(3, l)) + 4);
        }
    }
    memset(y->hmask, 0, QK_K / 8);
    for (int j = 0; j < QK_K; ++j) {
        if (L[j] > 3) {
            y->hmask[j % 32] |= (uint8_t)(1 << (j / 32));
            L[j] -= 4;
        }
    }
    gguflm_pack_2bit((const uint8_t *)L, y->qs);
}

static void gguflm_quantize_row_q3_K(const float *x, void *vy, int64_t k) {
    block_q3_K *y = (block_q3_K *)vy;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        for (int j = 0; j < QK_K / 16; ++j) scales[j] = gguflm_make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
        const float max_scale = gguflm_signed_absmax(scales, QK_K / 16);
        memset(y[i].scales, 0, 12);
        if (max_scale) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; ++j) {
                const int l = gguflm_nearest_int(iscale * scales[j]);
                gguflm_q3_K_put_scale(y[i].scales, j, GGUFLM_MAX(-32, GGUFLM_MIN(31, l)) + 32);
            }
            y[i].d = gguflm_fp32_to_fp16(1 / iscale);
        } else {
            y[i].d = gguflm_fp32_to_fp16(0.f);
        }
        gguflm_q3_K_quants(x, &y[i], L);
    }
}

/* stores 6-bit scale ls and min lm of sub-block j (the layout gguflm_get_scale_min_k4 reads) */
static inline void gguflm_put_scale_min_k4(uint8_t *packed, int j, uint8_t ls, uint8_t lm) {
    if (j < 4) {
        packed[j] = ls;
        packed[j + 4] = lm;
    } else {
        packed[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
        packed[j - 4] |= (uint8_t)((ls >> 4) << 6);
        packed[j - 0] |= (uint8_t)((lm >> 4) << 6);
    }
}

/* Q4_K / Q5_K quants requantized against the rounded scales and mins (L: the search's, kept where
 * a scale is zero) */
static void gguflm_requantize_q45_K(const float *x, int nmax, const uint8_t *packed, ggml_half dh, ggml_half dminh,
                                    uint8_t *L) {
    uint8_t sc, m;
    for (int j = 0; j < QK_K / 32; ++j) {
        gguflm_get_scale_min_k4(j, packed, &sc, &m);
        const float d = gguflm_fp16_to_fp32(dh) * sc;
        if (!d) continue;
        const float dm = gguflm_fp16_to_fp32(dminh) * m;
        for (int ii = 0; ii < 32; ++ii) {
            const int l = gguflm_nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)GGUFLM_MAX(0, GGUFLM_MIN(nmax, l));
        }
    }
}

/* Q4_K: elements 64n + l and 64n + 32 + l share byte 32n + l */
static inline void gguflm_pack_q4_K(const uint8_t *L, uint8_t *q) {
    for (int j = 0; j < QK_K; j += 64, q += 32)
        for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

/* Q5_K: as Q4_K, the fifth bits in qh (bits 2n and 2n+1 of qh[l] for elements 64n + l, + 32) */
static inline void gguflm_pack_q5_K(const uint8_t *L, uint8_t *ql, uint8_t *qh) {
    memset(qh, 0, QK_K / 8);
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < QK_K; n += 64, ql += 32) {
        for (int j = 0; j < 32; ++j) {
            int l1 = L[n + j], l2 = L[n + j + 32];
            if (l1 > 15) { l1 -= 16; qh[j] |= m1; }
            if (l2 > 15) { l2 -= 16; qh[j] |= m2; }
            ql[j] = (uint8_t)(l1 | (l2 << 4));
        }
        m1 <<= 2;
        m2 <<= 2;
    }
}

/* Q4_K and Q5_K share the sub-block search (32 elements, weights av_x + |x|) and scale packing */
static void gguflm_quantize_q45_K_scales(const float *x, int nmax, float rmin, float rdelta, int nstep,
                                         uint8_t *L, uint8_t *packed, ggml_half *d_out, ggml_half *dmin_out) {
    uint8_t Laux[32];
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = gguflm_make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, rdelta, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t ls = (uint8_t)gguflm_nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)gguflm_nearest_int(inv_min * mins[j]);
        gguflm_put_scale_min_k4(packed, j, GGUFLM_MIN(63, ls), GGUFLM_MIN(63, lm));
    }
    *d_out = gguflm_fp32_to_fp16(max_scale / 63.f);
    *dmin_out = gguflm_fp32_to_fp16(max_min / 63.f);
    gguflm_requantize_q45_K(x, nmax, packed, *d_out, *dmin_out, L);
}

static void gguflm_quantize_row_q4_K(const float *x, void *vy, int64_t k) {
    block_q4_K *y = (block_q4_K *)vy;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        gguflm_quantize_q45_K_scales(x, 15, -1.f, 0.1f, 20, L, y[i].scales, &y[i].d, &y[i].dmin);
        gguflm_pack_q4_K(L, y[i].qs);
    }
}

static void gguflm_quantize_row_q5_K(const float *x, void *vy, int64_t k) {
    block_q5_K *y = (block_q5_K *)vy;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        gguflm_quantize_q45_K_scales(x, 31, -0.5f, 0.1f, 15, L, y[i].scales, &y[i].d, &y[i].dmin);
        gguflm_pack_q5_K(L, y[i].qs, y[i].qh);
    }
}

/* Q6_K after the sub-block search (scales, L): the scales quantized to int8 under d = max/-128,
 * the quants requantized against them and packed; an all-zero block is all zeros */
static void gguflm_q6_K_finish(const float *x, const float *scales, block_q6_K *y, int8_t *L) {
    const float max_scale = gguflm_signed_absmax(scales, QK_K / 16);
    if (fabsf(max_scale) < GROUP_MAX_EPS) {
        memset(y, 0, sizeof(block_q6_K));
        return;
    }
    const float iscale = -128.f / max_scale;
    y->d = gguflm_fp32_to_fp16(1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ++ib) y->scales[ib] = (int8_t)GGUFLM_MIN(127, gguflm_nearest_int(iscale * scales[ib]));
    for (int j = 0; j < QK_K / 16; ++j) {
        const float d = gguflm_fp16_to_fp32(y->d) * y->scales[j];
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii) {
            const int l = gguflm_nearest_int(x[16 * j + ii] / d);
            L[16 * j + ii] = (int8_t)(GGUFLM_MAX(-32, GGUFLM_MIN(31, l)) + 32);
        }
    }
    uint8_t *ql = y->ql, *qh = y->qh;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
        for (int l = 0; l < 32; ++l) {
            const uint8_t q1 = L[j + l + 0] & 0xF, q2 = L[j + l + 32] & 0xF;
            const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
            ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
            ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
            qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
        }
    }
}

static void gguflm_quantize_row_q6_K(const float *x, void *vy, int64_t k) {
    block_q6_K *y = (block_q6_K *)vy;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        for (int ib = 0; ib < QK_K / 16; ++ib) scales[ib] = gguflm_make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, NULL);
        gguflm_q6_K_finish(x, scales, &y[i], L);
    }
}

/* Q8_K is the activation partner of the K-quants (ggml's x86 CPU backend uses this reference
 * quantizer for it): scale -127/max of the signed largest magnitude; bsums for the min terms */
static void gguflm_quantize_row_q8_K(const float *x, void *vy, int64_t k) {
    block_q8_K *y = (block_q8_K *)vy;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        const float max = gguflm_signed_absmax(x, QK_K);
        if (!max) {
            /* ggml leaves bsums untouched here; zeros keep the block deterministic */
            memset(&y[i], 0, sizeof(block_q8_K));
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; ++j) {
            const int v = gguflm_nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)GGUFLM_MIN(127, v);
        }
        for (int j = 0; j < QK_K / 16; ++j) {
            int sum = 0;
            for (int ii = 0; ii < 16; ++ii) sum += y[i].qs[j * 16 + ii];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

/* ======================= K-quants: unpacking ======================= */

/* a K-quant super-block as unsigned quants u[e] with, per 16 elements j = e/16, an integer scale
 * sc[j] and min mn[j]: value = (d*sc[j]) * (u[e] - zero) - dmin*mn[j]. Types without a min have
 * mn = 0 and dmin = 0. The scalar dots and the dequantizers both read this form. */
typedef struct {
    uint8_t u[QK_K];
    int32_t sc[QK_K / 16];
    int32_t mn[QK_K / 16];
    float d, dmin;
    int zero;
} gguflm_kblock;

/* the 16-per-super-block scales and mins, in element order, plus d/dmin/zero */
static inline __attribute__((always_inline)) void gguflm_kscales(int type, const void *vb, gguflm_kblock *o) {
    o->dmin = 0.0f;
    o->zero = 0;
    switch (type) {
    case GGUFLM_Q2_K: {
        const block_q2_K *b = (const block_q2_K *)vb;
        o->d = gguflm_fp16_to_fp32(b->d);
        o->dmin = gguflm_fp16_to_fp32(b->dmin);
        for (int j = 0; j < 16; ++j) { o->sc[j] = b->scales[j] & 0xF; o->mn[j] = b->scales[j] >> 4; }
        break;
    }
    case GGUFLM_Q3_K: {
        const block_q3_K *b = (const block_q3_K *)vb;
        o->d = gguflm_fp16_to_fp32(b->d);
        o->zero = 4;
        for (int j = 0; j < 16; ++j) { o->sc[j] = gguflm_q3_K_scale(b->scales, j); o->mn[j] = 0; }
        break;
    }
    case GGUFLM_Q4_K:
    case GGUFLM_Q5_K: {
        /* Q4_K and Q5_K start with the same d, dmin, scales[12] */
        const block_q4_K *b = (const block_q4_K *)vb;
        o->d = gguflm_fp16_to_fp32(b->d);
        o->dmin = gguflm_fp16_to_fp32(b->dmin);
        for (int j = 0; j < 8; ++j) {
            uint8_t sc, m;
            gguflm_get_scale_min_k4(j, b->scales, &sc, &m);
            o->sc[2 * j] = o->sc[2 * j + 1] = sc;
            o->mn[2 * j] = o->mn[2 * j + 1] = m;
        }
        break;
    }
    default: { /* Q6_K */
        const block_q6_K *b = (const block_q6_K *)vb;
        o->d = gguflm_fp16_to_fp32(b->d);
        o->zero = 32;
        for (int j = 0; j < 16; ++j) { o->sc[j] = b->scales[j]; o->mn[j] = 0; }
        break;
    }
    }
}

/* u[e] = the bits-wide field of element e in qs, where each 32-byte run holds 8/bits consecutive
 * 32-element stretches (stretch s at bit bits*s), plus, when high is given, bit e/32 of
 * high[e % 32] as the next bit up (Q2_K/Q3_K: bits 2, Q4_K/Q5_K: bits 4) */
static inline void gguflm_kunpack_bits(const uint8_t *qs, int bits, const uint8_t *high, uint8_t *u) {
    const int per_byte = 8 / bits, run = 32 * per_byte;
    for (int e = 0; e < QK_K; ++e) u[e] = (qs[32 * (e / run) + e % 32] >> (bits * ((e / 32) % per_byte))) & ((1 << bits) - 1);
    if (high) {
        for (int e = 0; e < QK_K; ++e) u[e] |= (uint8_t)(((high[e % 32] >> (e / 32)) & 1) << bits);
    }
}

static inline __attribute__((always_inline)) void gguflm_kunpack(int type, const void *vb, gguflm_kblock *o) {
    gguflm_kscales(type, vb, o);
    switch (type) {
    case GGUFLM_Q2_K: gguflm_kunpack_bits(((const block_q2_K *)vb)->qs, 2, NULL, o->u); break;
    case GGUFLM_Q3_K: gguflm_kunpack_bits(((const block_q3_K *)vb)->qs, 2, ((const block_q3_K *)vb)->hmask, o->u); break;
    case GGUFLM_Q4_K: gguflm_kunpack_bits(((const block_q4_K *)vb)->qs, 4, NULL, o->u); break;
    case GGUFLM_Q5_K: gguflm_kunpack_bits(((const block_q5_K *)vb)->qs, 4, ((const block_q5_K *)vb)->qh, o->u); break;
    default: { /* Q6_K: element 128n + 32s + l: nibble of ql[64n + 32(s%2) + l] (high if s >= 2),
                  two high bits at bits 2s of qh[32n + l] */
        const block_q6_K *b = (const block_q6_K *)vb;
        for (int e = 0; e < QK_K; ++e) {
            const int n = e / 128, s = (e / 32) % 4, l = e % 32;
            const int lo = (b->ql[64 * n + 32 * (s % 2) + l] >> (4 * (s / 2))) & 0xF;
            const int hi = (b->qh[32 * n + l] >> (2 * s)) & 3;
            o->u[e] = (uint8_t)(lo | (hi << 4));
        }
        break;
    }
    }
}

static inline __attribute__((always_inline)) void gguflm_dequantize_k(int type, const void *vx, float *y, int64_t k, size_t block_bytes) {
    gguflm_kblock b;
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        gguflm_kunpack(type, (const uint8_t *)vx + i * block_bytes, &b);
        for (int j = 0; j < QK_K / 16; ++j) {
            const float dl = b.d * b.sc[j];
            const float ml = b.dmin * b.mn[j];
            for (int l = 0; l < 16; ++l) y[16 * j + l] = dl * (b.u[16 * j + l] - b.zero) - ml;
        }
    }
}

static void gguflm_dequantize_row_q2_K(const void *x, float *y, int64_t k) { gguflm_dequantize_k(GGUFLM_Q2_K, x, y, k, sizeof(block_q2_K)); }
static void gguflm_dequantize_row_q3_K(const void *x, float *y, int64_t k) { gguflm_dequantize_k(GGUFLM_Q3_K, x, y, k, sizeof(block_q3_K)); }
static void gguflm_dequantize_row_q4_K(const void *x, float *y, int64_t k) { gguflm_dequantize_k(GGUFLM_Q4_K, x, y, k, sizeof(block_q4_K)); }
static void gguflm_dequantize_row_q5_K(const void *x, float *y, int64_t k) { gguflm_dequantize_k(GGUFLM_Q5_K, x, y, k, sizeof(block_q5_K)); }
static void gguflm_dequantize_row_q6_K(const void *x, float *y, int64_t k) { gguflm_dequantize_k(GGUFLM_Q6_K, x, y, k, sizeof(block_q6_K)); }

static void gguflm_dequantize_row_q8_K(const void *vx, float *y, int64_t k) {
    const block_q8_K *x = (const block_q8_K *)vx;
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        for (int j = 0; j < QK_K; ++j) y[j] = x[i].d * x[i].qs[j];
    }
}

/* ======================= float formats ======================= */

static void gguflm_quantize_row_f32(const float *x, void *y, int64_t k) { memcpy(y, x, (size_t)k * sizeof(float)); }
static void gguflm_dequantize_row_f32(const void *x, float *y, int64_t k) { memcpy(y, x, (size_t)k * sizeof(float)); }

static void gguflm_quantize_row_f16(const float *x, void *y, int64_t k) { gguflm_fp32_to_fp16_row(x, (ggml_half *)y, k); }
static void gguflm_dequantize_row_f16(const void *x, float *y, int64_t k) { gguflm_fp16_to_fp32_row((const ggml_half *)x, y, k); }
static void gguflm_quantize_row_bf16(const float *x, void *vy, int64_t k) {
    uint16_t *y = (uint16_t *)vy;
    for (int64_t i = 0; i < k; ++i) y[i] = gguflm_fp32_to_bf16(x[i]);
}
static void gguflm_dequantize_row_bf16(const void *vx, float *y, int64_t k) {
    const uint16_t *x = (const uint16_t *)vx;
    for (int64_t i = 0; i < k; ++i) y[i] = gguflm_bf16_to_fp32(x[i]);
}

#endif
