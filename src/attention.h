/* Attention of a ubatch's queries over the KV cache, with ggml's non-flash-attention numerics:
 * q rounded to the K type, K·q in the lane order of ggml's AVX2 dot, scale + mask + softmax with
 * ggml's vector expf and double sum, probabilities rounded to the V type, then P·V.
 *
 * Cache rows are cells: K is [n_cells][n_head_kv * head_dim_k], V is [n_cells][n_head_kv *
 * head_dim_v], each F32, F16 or Q8_0 blocks. A Q8_0 K takes the query quantized to Q8_0 and
 * integer dots, as ggml's mul_mat does; a Q8_0 V (which llama.cpp only allows with flash
 * attention) is dequantized row by row and weighted by unrounded probabilities. A cell is visible to a token when it holds the token's sequence,
 * is not in its future (causal) and lies inside its sliding window (p_tok - p_cell < n_swa).
 * Masked cells are skipped: ggml adds -inf and multiplies by 0, which changes nothing.
 */
#ifndef GGUFLM_ATTENTION_H
#define GGUFLM_ATTENTION_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "ops_math.h"
#include "omp_compat.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GGUFLM_ATTN_X86 1
#else
#define GGUFLM_ATTN_X86 0
#endif

enum { GGUFLM_CACHE_F32 = 0, GGUFLM_CACHE_F16 = 1, GGUFLM_CACHE_Q8_0 = 8 };

typedef struct {
    const float *q;            /* [n_tok][q_stride], head h at h * head_dim_k */
    int64_t q_stride;
    int n_tok, n_head, n_head_kv, head_dim_k, head_dim_v;
    const void *k;             /* [n_cells][k_row_bytes] */
    const void *v;             /* [n_cells][v_row_bytes] */
    int cache_type_k, cache_type_v;
    int64_t k_row_bytes, v_row_bytes;
    int n_kv;                  /* cells [0, n_kv) are candidates */
    const int32_t *cell_pos;   /* [n_kv], -1 = empty */
    const uint64_t *cell_seq;  /* [n_kv], bit s set = cell belongs to sequence s */
    const int32_t *tok_pos;    /* [n_tok] */
    const int32_t *tok_seq;    /* [n_tok], the token's first sequence id */
    int causal;
    int32_t n_swa;             /* 0 = no window */
    float kq_scale;
    float softcap;             /* 0 = none */
    float *out;                /* [n_tok][out_stride], head h at h * head_dim_v */
    int64_t out_stride;
} gguflm_attn_args;

/* ---- primitives: one scalar form, one AVX2 form with identical results ---- */

/* acc[lane] += x[i] * y[i] over i < n (n a multiple of 32), lanes as ggml's AVX2 dot */
typedef void (*gguflm_lane_dot_fn)(int n, const void *x, const float *y, float *acc);
/* acc[lane][d] += p * x[d] for d < n (n a multiple of 8): one cell's V row into its lane */
typedef void (*gguflm_lane_axpy_fn)(int n, float p, const void *x, float *acc_lane);

GGUFLM_NO_CONTRACT static void gguflm_lane_dot_f16_scalar(int n, const void *x, const float *y, float *acc) {
    const ggml_half *xh = (const ggml_half *)x;
    for (int i = 0; i < n; i += GGUFLM_DOT_LANES)
        for (int l = 0; l < GGUFLM_DOT_LANES; l++)
            acc[l] = fmaf(gguflm_fp16_to_fp32(xh[i + l]), y[i + l], acc[l]);
}

GGUFLM_NO_CONTRACT static void gguflm_lane_dot_f32_scalar(int n, const void *x, const float *y, float *acc) {
    const float *xf = (const float *)x;
    for (int i = 0; i < n; i += GGUFLM_DOT_LANES)
        for (int l = 0; l < GGUFLM_DOT_LANES; l++)
            acc[l] = fmaf(xf[i + l], y[i + l], acc[l]);
}

GGUFLM_NO_CONTRACT static void gguflm_lane_axpy_f16_scalar(int n, float p, const void *x, float *acc) {
    const ggml_half *xh = (const ggml_half *)x;
    for (int d = 0; d < n; d++) acc[d] = fmaf(gguflm_fp16_to_fp32(xh[d]), p, acc[d]);
}

GGUFLM_NO_CONTRACT static void gguflm_lane_axpy_f32_scalar(int n, float p, const void *x, float *acc) {
    const float *xf = (const float *)x;
    for (int d = 0; d < n; d++) acc[d] = fmaf(xf[d], p, acc[d]);
}

#if GGUFLM_ATTN_X86
#define GGUFLM_TARGET_AVX2_F16C __attribute__((target("avx2,fma,f16c")))

GGUFLM_TARGET_AVX2_F16C static void gguflm_lane_dot_f16_avx2(int n, const void *x, const float *y, float *acc) {
    const ggml_half *xh = (const ggml_half *)x;
    __m256 a0 = _mm256_loadu_ps(acc), a1 = _mm256_loadu_ps(acc + 8);
    __m256 a2 = _mm256_loadu_ps(acc + 16), a3 = _mm256_loadu_ps(acc + 24);
    for (int i = 0; i < n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xh + i))), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xh + i + 8))), _mm256_loadu_ps(y + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xh + i + 16))), _mm256_loadu_ps(y + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xh + i + 24))), _mm256_loadu_ps(y + i + 24), a3);
    }
    _mm256_storeu_ps(acc, a0); _mm256_storeu_ps(acc + 8, a1);
    _mm256_storeu_ps(acc + 16, a2); _mm256_storeu_ps(acc + 24, a3);
}

GGUFLM_TARGET_AVX2_F16C static void gguflm_lane_dot_f32_avx2(int n, const void *x, const float *y, float *acc) {
    const float *xf = (const float *)x;
    __m256 a[4];
    for (int j = 0; j < 4; j++) a[j] = _mm256_loadu_ps(acc + 8 * j);
    for (int i = 0; i < n; i += 32)
        for (int j = 0; j < 4; j++)
            a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(xf + i + 8 * j), _mm256_loadu_ps(y + i + 8 * j), a[j]);
    for (int j = 0; j < 4; j++) _mm256_storeu_ps(acc + 8 * j, a[j]);
}

GGUFLM_TARGET_AVX2_F16C static void gguflm_lane_axpy_f16_avx2(int n, float p, const void *x, float *acc) {
    const ggml_half *xh = (const ggml_half *)x;
    const __m256 vp = _mm256_set1_ps(p);
    for (int d = 0; d < n; d += 8) {
        const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xh + d)));
        _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(v, vp, _mm256_loadu_ps(acc + d)));
    }
}

GGUFLM_TARGET_AVX2_F16C static void gguflm_lane_axpy_f32_avx2(int n, float p, const void *x, float *acc) {
    const float *xf = (const float *)x;
    const __m256 vp = _mm256_set1_ps(p);
    for (int d = 0; d < n; d += 8)
        _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(_mm256_loadu_ps(xf + d), vp, _mm256_loadu_ps(acc + d)));
}
#endif

/* ---- Q8_0 keys ---- */

/* ggml-cpu's quantize_row_q8_0 (x86): d = amax/127 stored as fp16, values x * (127/amax)
 * rounded to nearest even */
GGUFLM_NO_CONTRACT static void gguflm_quantize_q8_0_act(int n, const float *x, block_q8_0 *y) {
    for (int ib = 0; ib < n / QK8_0; ib++) {
        const float *xb = x + ib * QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[ib].d = gguflm_fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++) y[ib].qs[j] = (int8_t)nearbyintf(xb[j] * id);
    }
}

/* ggml's AVX2 vec_dot_q8_0_q8_0: per block, 8 int32 lanes of 4 products each, scaled and fused
 * into 8 float lanes; the lanes are summed at the end in hsum_float_8's order */
GGUFLM_NO_CONTRACT static float gguflm_dot_q8_0_lanes(int n, const block_q8_0 *x, const block_q8_0 *y) {
    float acc[8] = {0};
    for (int ib = 0; ib < n / QK8_0; ib++) {
        const float d = gguflm_fp16_to_fp32(x[ib].d) * gguflm_fp16_to_fp32(y[ib].d);
        for (int l = 0; l < 8; l++) {
            int32_t sum = 0;
            for (int j = 4 * l; j < 4 * l + 4; j++) sum += x[ib].qs[j] * y[ib].qs[j];
            acc[l] = fmaf(d, (float)sum, acc[l]);
        }
    }
    return gguflm_hsum8_movehl(acc);
}

/* one Q8_0 row dequantized: d * q */
static void gguflm_dequantize_q8_0_row(int n, const block_q8_0 *x, float *y) {
    for (int ib = 0; ib < n / QK8_0; ib++) {
        const float d = gguflm_fp16_to_fp32(x[ib].d);
        for (int j = 0; j < QK8_0; j++) y[ib * QK8_0 + j] = d * x[ib].qs[j];
    }
}

typedef struct {
    gguflm_lane_dot_fn dot_f16, dot_f32;
    gguflm_lane_axpy_fn axpy_f16, axpy_f32;
} gguflm_attn_kernels;

static gguflm_attn_kernels gguflm_attn_select(int use_avx2) {
    gguflm_attn_kernels k = {gguflm_lane_dot_f16_scalar, gguflm_lane_dot_f32_scalar,
                             gguflm_lane_axpy_f16_scalar, gguflm_lane_axpy_f32_scalar};
#if GGUFLM_ATTN_X86
    if (use_avx2) {
        k.dot_f16 = gguflm_lane_dot_f16_avx2; k.dot_f32 = gguflm_lane_dot_f32_avx2;
        k.axpy_f16 = gguflm_lane_axpy_f16_avx2; k.axpy_f32 = gguflm_lane_axpy_f32_avx2;
    }
#else
    (void)use_avx2;
#endif
    return k;
}

static inline int gguflm_attn_visible(const gguflm_attn_args *a, int t, int c) {
    const int32_t pc = a->cell_pos[c];
    if (pc < 0 || !((a->cell_seq[c] >> a->tok_seq[t]) & 1u)) return 0;
    const int32_t pt = a->tok_pos[t];
    if (a->causal && pc > pt) return 0;
    if (a->n_swa > 0 && pt - pc >= a->n_swa) return 0;
    return 1;
}

/* Per-thread scratch: the query row, the scores over cells, and 32 lanes of V accumulators. */
typedef struct {
    float *q;         /* [head_dim_k] */
    float *score;     /* [n_kv] */
    int32_t *cells;   /* [n_kv] visible cell ids */
    float *acc;       /* [32][head_dim_v] */
    block_q8_0 *qq;   /* [head_dim_k / 32] the query as Q8_0 (Q8_0 keys) */
    float *vrow;      /* [head_dim_v] one dequantized V row (Q8_0 values) */
} gguflm_attn_scratch;

static int64_t gguflm_cache_head_offset(int type, int64_t head, int head_dim) {
    if (type == GGUFLM_CACHE_Q8_0) return head * (head_dim / QK8_0) * (int64_t)sizeof(block_q8_0);
    return head * head_dim * (type == GGUFLM_CACHE_F16 ? 2 : 4);
}

/* One (token, head): scores, softmax, P·V into out. */
GGUFLM_NO_CONTRACT static void gguflm_attn_one(const gguflm_attn_args *a, const gguflm_attn_kernels *kern,
                                               int t, int h, gguflm_attn_scratch *s) {
    const int dk = a->head_dim_k, dv = a->head_dim_v;
    const int hkv = h / (a->n_head / a->n_head_kv);
    const float *q = a->q + (int64_t)t * a->q_stride + (int64_t)h * dk;
    const int tk = a->cache_type_k, tv = a->cache_type_v;
    const char *k_base = (const char *)a->k + gguflm_cache_head_offset(tk, hkv, dk);
    const char *v_base = (const char *)a->v + gguflm_cache_head_offset(tv, hkv, dv);
    float *out = a->out + (int64_t)t * a->out_stride + (int64_t)h * dv;

    /* the query enters the K·q product in the K type's precision */
    if (tk == GGUFLM_CACHE_Q8_0) {
        gguflm_quantize_q8_0_act(dk, q, s->qq);
    } else {
        for (int d = 0; d < dk; d++) s->q[d] = tk == GGUFLM_CACHE_F16 ? gguflm_fp16_to_fp32(gguflm_fp32_to_fp16(q[d])) : q[d];
    }

    /* scores of visible cells; ggml scales (and soft-caps) every cell, then adds the mask */
    int n_vis = 0;
    float max = -INFINITY;
    for (int c = 0; c < a->n_kv; c++) {
        if (!gguflm_attn_visible(a, t, c)) continue;
        const char *krow = k_base + (int64_t)c * a->k_row_bytes;
        float kq;
        if (tk == GGUFLM_CACHE_Q8_0) {
            kq = gguflm_dot_q8_0_lanes(dk, (const block_q8_0 *)krow, s->qq);
        } else {
            float lanes[GGUFLM_DOT_LANES] = {0};
            (tk == GGUFLM_CACHE_F16 ? kern->dot_f16 : kern->dot_f32)(dk, krow, s->q, lanes);
            kq = gguflm_reduce_lanes(lanes);
        }
        if (a->softcap > 0.0f) kq = tanhf(kq * (1.0f / a->softcap)) * a->softcap;
        kq = kq * a->kq_scale;
        s->cells[n_vis] = c;
        s->score[n_vis++] = kq;
        if (kq > max) max = kq;
    }
    if (n_vis == 0) {  /* a token that sees nothing gets zeros (ggml would produce NaN) */
        memset(out, 0, sizeof(float) * dv);
        return;
    }

    /* softmax: ggml sums exp in groups of 8 cells (float), the groups in double; masked cells
     * contribute exact zeros, so grouping by cell index reproduces its partial sums */
    double sum = 0.0;
    float group[8] = {0};
    int group_id = s->cells[0] / 8;
    for (int i = 0; i < n_vis; i++) {
        const int c = s->cells[i];
        if (c / 8 != group_id) {
            sum += (double)gguflm_hsum8_movehl(group);
            memset(group, 0, sizeof(group));
            group_id = c / 8;
        }
        const float e = gguflm_expf(s->score[i] - max);
        s->score[i] = e;
        group[c % 8] = e;
    }
    sum += (double)gguflm_hsum8_movehl(group);
    const float inv_sum = (float)(1.0 / sum);

    /* P·V: each cell's probability, rounded to the V type, weights its V row into the lane that
     * ggml's dot over cells would have used */
    memset(s->acc, 0, sizeof(float) * GGUFLM_DOT_LANES * dv);
    for (int i = 0; i < n_vis; i++) {
        const int c = s->cells[i];
        float p = s->score[i] * inv_sum;
        if (tv == GGUFLM_CACHE_F16) p = gguflm_fp16_to_fp32(gguflm_fp32_to_fp16(p));
        if (p == 0.0f) continue;
        const char *vrow = v_base + (int64_t)c * a->v_row_bytes;
        float *lane = s->acc + (int64_t)(c % GGUFLM_DOT_LANES) * dv;
        if (tv == GGUFLM_CACHE_Q8_0) {
            gguflm_dequantize_q8_0_row(dv, (const block_q8_0 *)vrow, s->vrow);
            kern->axpy_f32(dv, p, s->vrow, lane);
        } else {
            (tv == GGUFLM_CACHE_F16 ? kern->axpy_f16 : kern->axpy_f32)(dv, p, vrow, lane);
        }
    }
    for (int d = 0; d < dv; d++) {
        float lanes[GGUFLM_DOT_LANES];
        for (int l = 0; l < GGUFLM_DOT_LANES; l++) lanes[l] = s->acc[(int64_t)l * dv + d];
        out[d] = gguflm_reduce_lanes(lanes);
    }
}

/* All (token, head) pairs over n_threads threads. Returns 0, or -1 if scratch allocation failed. */
static int gguflm_attention(const gguflm_attn_args *a, int use_avx2, int n_threads) {
    const gguflm_attn_kernels kern = gguflm_attn_select(use_avx2);
    const int64_t n_items = (int64_t)a->n_tok * a->n_head;
    if (n_items <= 0) return 0;
    if (n_threads > n_items) n_threads = (int)n_items;
    const int64_t n_kv = a->n_kv > 0 ? a->n_kv : 1;
    /* floats per thread: q, scores, cell ids (int32, same size), 32 lanes of V accumulators,
     * the Q8_0 query (34 bytes per 32 values, rounded up to floats), one V row */
    const int64_t qq_floats = (a->head_dim_k / QK8_0 * (int64_t)sizeof(block_q8_0) + 3) / 4;
    const int64_t per_thread = a->head_dim_k + 2 * n_kv + (int64_t)GGUFLM_DOT_LANES * a->head_dim_v
                               + qq_floats + a->head_dim_v;
    float *scratch = (float *)malloc(sizeof(float) * per_thread * n_threads);
    if (!scratch) return -1;
    #pragma omp parallel num_threads(n_threads)
    {
        float *mine = scratch + per_thread * omp_get_thread_num();
        float *acc = mine + a->head_dim_k + 2 * n_kv;
        float *qq = acc + (int64_t)GGUFLM_DOT_LANES * a->head_dim_v;
        gguflm_attn_scratch s = {mine, mine + a->head_dim_k, (int32_t *)(mine + a->head_dim_k + n_kv),
                                 acc, (block_q8_0 *)qq, qq + qq_floats};
        #pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < n_items; item++)
            gguflm_attn_one(a, &kern, (int)(item / a->n_head), (int)(item % a->n_head), &s);
    }
    free(scratch);
    return 0;
}

#endif
