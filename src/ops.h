/* The forward pass's kernels other than matmul, with ggml's CPU numerics: RMS norm, LayerNorm, RoPE,
 * gated linear units, GELU and tanh, attention over the KV cache (or, for encoders, over the
 * ubatch itself) and mean pooling.
 *
 * Attention follows ggml's non-flash-attention path: q rounded to the K type, K·q in the lane
 * order of ggml's AVX2 dot (single tokens) or of llamafile's sgemm (batches), scale + mask +
 * softmax with ggml's vector expf and double sum, probabilities rounded to the V type, then P·V
 * in the same two orders. Cache rows are cells: K is [n_cells][n_head_kv *
 * head_dim_k], V is [n_cells][n_head_kv * head_dim_v], each F32, F16 or Q8_0 blocks. A Q8_0 K takes
 * the query quantized to Q8_0 and integer dots, as ggml's mul_mat does; a Q8_0 V (which llama.cpp
 * only allows with flash attention) is dequantized row by row and weighted by unrounded
 * probabilities. A cell is visible to a token when it holds the token's sequence, is not in its
 * future (causal) and lies inside its sliding window (p_tok - p_cell < n_swa; a symmetric window,
 * llama.cpp's LLAMA_SWA_TYPE_SYMMETRIC of EmbeddingGemma, |p_tok - p_cell| <= n_swa / 2). Masked cells are
 * skipped: ggml adds -inf and multiplies by 0, which changes nothing.
 *
 * Without a cache (encoders, llama.cpp's build_attn_inp_no_cache) K and V are the ubatch's own F32
 * rows, one cell per token, each in exactly one sequence, and ggml's score rows are n_tok long
 * rather than padded to 256 cells: their vector loops then leave the last n_tok % lanes cells to
 * scalar tails (libm expf in the softmax, gguflm_dot_f32_unfused's loop in the dots), which
 * gguflm reproduces. ALiBi
 * (jina-bert-v2) adds slope(head) * -|p_cell - p_tok| to every visible score. Attention sinks
 * (gpt-oss) join each head's softmax as ggml_soft_max_add_sinks does: the max is taken over the
 * scores and the sink, and exp(sink - max) (libm) is added to the sum.
 *
 * The row kernels live in ops_rows.inc, compiled twice in the idiom of simd_targets.h (as
 * quants_simd.h compiles its kernels): scalar, and AVX2+FMA+F16C.
 */
#ifndef GGUFLM_OPS_H
#define GGUFLM_OPS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "ops_math.h"
#include "omp_compat.h"
#include "simd_targets.h"

enum { GGUFLM_CACHE_F32 = 0, GGUFLM_CACHE_F16 = 1, GGUFLM_CACHE_Q8_0 = 8 };

/* y = x / sqrt(mean(x^2) + eps) [* w]: squares summed in double, scale applied in float */
static void gguflm_rms_norm_row(int n, const float *x, const float *w, float eps, float *y) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    if (w) {
        for (int i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
    } else {
        for (int i = 0; i < n; i++) y[i] = x[i] * scale;
    }
}

/* ---- RoPE ----
 * The rotation angles of one position, as ggml_rope_cache_init computes them: theta starts at
 * the position and is multiplied by theta_scale = base^(-2/n_dims) once per pair (a running
 * product, not a power), with YaRN's ramp between interpolation and extrapolation. */
typedef struct {
    int n_dims;          /* rotated dimensions (the rest pass through) */
    int neox;            /* 1: pairs (i, i + n_dims/2); 0: adjacent pairs (2i, 2i+1) */
    float freq_base, freq_scale, ext_factor, attn_factor;
    float corr_low, corr_high;   /* YaRN correction dims, from gguflm_rope_corr_dims */
    const float *freq_factors;   /* [n_dims/2] or NULL */
} gguflm_rope_params;

static float gguflm_rope_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return n_dims * logf(n_ctx_orig / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
}

static void gguflm_rope_corr_dims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast,
                                  float beta_slow, float *low, float *high) {
    const float start = floorf(gguflm_rope_corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base));
    const float end = ceilf(gguflm_rope_corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base));
    *low = start > 0 ? start : 0;
    *high = end < n_dims - 1 ? end : n_dims - 1;
}

static void gguflm_rope_angles(const gguflm_rope_params *p, float pos, float *cos_sin) {
    const float theta_scale = powf(p->freq_base, -2.0f / p->n_dims);
    float theta = pos;
    for (int i0 = 0; i0 < p->n_dims; i0 += 2) {
        const float ff = p->freq_factors ? p->freq_factors[i0 / 2] : 1.0f;
        const float theta_extrap = theta / ff;
        const float theta_interp = p->freq_scale * theta_extrap;
        float t = theta_interp, mscale = p->attn_factor;
        if (p->ext_factor != 0.0f) {
            const float y = (i0 / 2 - p->corr_low) / fmaxf(0.001f, p->corr_high - p->corr_low);
            const float ramp_mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * p->ext_factor;
            t = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
            mscale *= 1.0f + 0.1f * logf(1.0f / p->freq_scale);
        }
        cos_sin[i0] = cosf(t) * mscale;
        cos_sin[i0 + 1] = sinf(t) * mscale;
        theta *= theta_scale;
    }
}

/* Rotate n_heads rows of head_dim values in place with the angles of one position. */
static void gguflm_rope_rows(const gguflm_rope_params *p, const float *cos_sin,
                                                int n_heads, int head_dim, float *x) {
    const int half = p->n_dims / 2;
    for (int h = 0; h < n_heads; h++) {
        float *r = x + (int64_t)h * head_dim;
        for (int i0 = 0; i0 < p->n_dims; i0 += 2) {
            const int a = p->neox ? i0 / 2 : i0;
            const int b = p->neox ? i0 / 2 + half : i0 + 1;
            const float c = cos_sin[i0], s = cos_sin[i0 + 1];
            const float x0 = r[a], x1 = r[b];
            /* the FMAs GCC contracts ggml's rotate_pairs into (the first product fused) */
            r[a] = fmaf(x0, c, -(x1 * s));
            r[b] = fmaf(x0, s, x1 * c);
        }
    }
}

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
    int arith;                 /* GGUFLM_ARITH_*: the ggml build whose rounding to reproduce */
    const int32_t *cell_seq_id;  /* no cache: [n_kv] each cell's one sequence (in place of cell_seq); else NULL */
    int n_cols;                /* no cache: ggml's score row length (n_kv), for its scalar tails; 0 with a cache */
    float max_bias;            /* ALiBi's maximum bias, 0 = none */
    const float *sinks;        /* [n_head] attention sinks (gpt-oss): a logit per head that takes
                                  part in the softmax without a value; NULL = none */
    int per_stream;            /* 1: the cache has one region per sequence (llama.cpp's KV streams), and
                                  ggml multiplies each sequence's tokens apart */
    int per_token;             /* 1: every token rounds as a single token would (checking drafts) */
    uint64_t batched_seqs;     /* set by gguflm_attention: with per_stream, the sequences that have two
                                  or more tokens in the ubatch */
    int swa_symmetric;         /* 1: the window reaches n_swa / 2 positions both ways (bidirectional) */
    const float *rel_bias;     /* T5's relative position biases, [rel_buckets][n_head] (row = bucket); NULL = none */
    int rel_buckets;           /* how many buckets (llama.cpp's n_rel_attn_bkts) */
    int rel_bidirectional;     /* 1: buckets for keys either side (the encoder's), else only the past */
    int swa_chunked;           /* 1: the window is the token's chunk of n_swa positions (Llama 4's
                                  LLAMA_SWA_TYPE_CHUNKED: cells from (p_tok / n_swa) * n_swa on) */
} gguflm_attn_args;

/* Whether ggml computes token t's K·q and P·V products as a batch: llamafile's sgemm takes them
 * when the product has two or more query columns, which are the ubatch's tokens, or with one
 * region per sequence those of t's own sequence (its stream). A server's parallel slots, one
 * token each, then round as each would alone. */
static inline int gguflm_attn_batched(const gguflm_attn_args *a, int t) {
    if (a->per_token) return 0;
    return a->per_stream ? (int)((a->batched_seqs >> (a->tok_seq[t] & 63)) & 1u) : a->n_tok >= 2;
}

/* ggml-cpu's quantize_row_q8_0 (x86): d = amax/127 stored as fp16, values x * (127/amax)
 * rounded to nearest even */
GGUFLM_INLINE void gguflm_quantize_q8_0_act(int n, const float *x, block_q8_0 *y) {
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
GGUFLM_INLINE float gguflm_dot_q8_0_lanes(int n, const block_q8_0 *x, const block_q8_0 *y) {
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
GGUFLM_INLINE void gguflm_dequantize_q8_0_row(int n, const block_q8_0 *x, float *y) {
    for (int ib = 0; ib < n / QK8_0; ib++) {
        const float d = gguflm_fp16_to_fp32(x[ib].d);
        for (int j = 0; j < QK8_0; j++) y[ib * QK8_0 + j] = d * x[ib].qs[j];
    }
}

static inline int gguflm_attn_visible(const gguflm_attn_args *a, int t, int c) {
    const int32_t pc = a->cell_pos[c];
    if (a->cell_seq_id ? a->cell_seq_id[c] != a->tok_seq[t] : pc < 0 || !((a->cell_seq[c] >> a->tok_seq[t]) & 1u))
        return 0;
    const int32_t pt = a->tok_pos[t];
    if (a->causal && pc > pt) return 0;
    if (a->n_swa > 0 && (a->swa_symmetric ? abs(pt - pc) > a->n_swa / 2 :
                         a->swa_chunked ? pc < (pt / a->n_swa) * a->n_swa : pt - pc >= a->n_swa)) return 0;
    return 1;
}

/* Per-thread scratch of one attention item (see gguflm_attn_scheme). */
#define GGUFLM_MAX_GQA 128         /* query heads per KV head (DeepSeek-V3's latent attention: 128 on one) */
#define GGUFLM_ATTN_DBLOCK 64      /* value dimensions accumulated at a time */
#define GGUFLM_ATTN_CBLOCK 32      /* K rows (or V^T rows) handed to the dot kernel at a time */
#define GGUFLM_ATTN_TBLOCK 4       /* tokens per item of a batch with F16 K and V */

typedef struct {
    float *q;         /* [gqa][head_dim_k] the queries, in the K type's precision */
    block_q8_0 *qq;   /* [gqa][head_dim_k / 32] the queries as Q8_0 (Q8_0 keys) */
    float *score;     /* [gqa][n_kv] scores, then probabilities */
    int32_t *cells;   /* [n_kv] visible cell ids */
    float *row;       /* [max(head_dim_k, head_dim_v)] one K or V row as floats */
    float *acc;       /* [gqa][MAX_LANES][DBLOCK] lane accumulators of P·V */
    int32_t *order;   /* [n_kv] visible cells' indices grouped by P·V lane */
    uint8_t *vis;     /* [TBLOCK][vt_stride] which cells each token of a block sees */
    int wide;         /* the block path's 16-lane dots on AVX-512 registers (gguflm_dots16_block_avx512) */
} gguflm_attn_scratch;

/* order[start[l] .. start[l+1]) = the indices i of the cells with cells[i] % n_lanes == l, in
 * cell order: P·V visits each lane's cells together, so that the lane's chains stay in registers.
 * n_lanes is a power of two (8 to 64). */
static void gguflm_order_by_lane(const int32_t *cells, int n_vis, int n_lanes, int *start, int32_t *order) {
    const int mask = n_lanes - 1;
    int fill[GGUFLM_MAX_LANES];
    memset(start, 0, sizeof(int) * (n_lanes + 1));
    for (int i = 0; i < n_vis; i++) start[(cells[i] & mask) + 1]++;
    for (int l = 0; l < n_lanes; l++) {
        start[l + 1] += start[l];
        fill[l] = start[l];
    }
    for (int i = 0; i < n_vis; i++) order[fill[cells[i] & mask]++] = i;
}

/* cells[0 .. n) = the cells token t sees, ascending; returns n */
static int gguflm_visible_cells(const gguflm_attn_args *a, int t, int32_t *cells) {
    int n = 0;
    for (int c = 0; c < a->n_kv; c++)
        if (gguflm_attn_visible(a, t, c)) cells[n++] = c;
    return n;
}

/* T5's relative position bucket of a key at position pk for a query at pq, exactly as llama.cpp's
 * llama_relative_position_bucket computes it (max_distance 128): float logf of a double quotient,
 * the sum in double, rounded to float before floorf. */
static int32_t gguflm_rel_bucket(int32_t pk, int32_t pq, int n_buckets, int bidirectional) {
    const int64_t max_distance = 128;
    uint64_t nb = (uint64_t)n_buckets;
    if (bidirectional) nb >>= 1;
    const int64_t max_exact = (int64_t)(nb >> 1);
    int32_t rp = pk - pq, bucket = 0;
    if (bidirectional) {
        bucket += (rp > 0) * (int32_t)nb;
        rp = abs(rp);
    } else {
        rp = rp < 0 ? -rp : 0;
    }
    if (rp < max_exact) return bucket + rp;   /* llama.cpp computes the log branch too, unused */
    const float lg = logf((float)(1.0 * rp / max_exact)) * (float)(nb - max_exact);
    int32_t large = (int32_t)floorf((float)((double)max_exact + (double)lg / log(1.0 * max_distance / max_exact)));
    if (large > (int32_t)(nb - 1)) large = (int32_t)(nb - 1);
    return bucket + large;
}

/* the relative position bias of query head h for the key in cell c and token t (T5's kq_b) */
static inline float gguflm_rel_bias(const gguflm_attn_args *a, int t, int h, int c) {
    const int32_t b = gguflm_rel_bucket(a->cell_pos[c], a->tok_pos[t], a->rel_buckets, a->rel_bidirectional);
    return a->rel_bias[(int64_t)b * a->n_head + h];
}

/* ALiBi slope of query head h of n_head, as ggml_compute_forward_soft_max_f32 computes it */
static float gguflm_alibi_slope(float max_bias, int n_head, int h) {
    const uint32_t n_head_log2 = 1u << (uint32_t)floor(log2(n_head));
    const float m0 = powf(2.0f, -(max_bias) / n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / n_head_log2);
    return (uint32_t)h < n_head_log2 ? powf(m0, h + 1) : powf(m1, 2 * (h - n_head_log2) + 1);
}

/* without a cache, cells from this index on lie past ggml's last whole step of `lanes` (a tail) */
static inline int gguflm_tail_start(const gguflm_attn_args *a, int lanes) {
    return a->n_cols > 0 ? a->n_cols - a->n_cols % lanes : INT32_MAX;
}

/* how many of the ascending cells[0 .. n) lie before `start` */
static inline int gguflm_cells_before(const int32_t *cells, int n, int start) {
    int i = n;
    while (i > 0 && cells[i - 1] >= start) i--;
    return i;
}

static int64_t gguflm_cache_head_offset(int type, int64_t head, int head_dim) {
    if (type == GGUFLM_CACHE_Q8_0) return head * (head_dim / QK8_0) * (int64_t)sizeof(block_q8_0);
    return head * head_dim * (type == GGUFLM_CACHE_F16 ? 2 : 4);
}



enum { GGUFLM_UNARY_GELU = 0, GGUFLM_UNARY_TANH = 1, GGUFLM_UNARY_RELU_SQR = 2 };

#if GGUFLM_HAVE_SIMD
/* gguflm_dots_block's 16-lane chains (llamafile sgemm's AVX-512 vectors) with F16 rows of a, on
 * AVX-512 registers: one zmm accumulator per dot where the AVX2 variant keeps two ymm halves, the
 * same FMAs in the same order, summed as gguflm_hsum16; tiles of 4 rows of a by 6 rows of b keep
 * 24 accumulators in registers. */
GGUFLM_TARGET_AVX512_BEGIN
static inline __attribute__((always_inline)) void gguflm_dots16_tile_avx512(
        int n, const void *const *a, int RM, const float *const *b, int RN, float *res, int64_t res_stride) {
    __m512 acc[4][6];
    for (int i = 0; i < RM; i++)
        for (int j = 0; j < RN; j++) acc[i][j] = _mm512_setzero_ps();
    for (int k = 0; k < n; k += 16) {
        __m512 av[4];
        for (int i = 0; i < RM; i++)
            av[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const ggml_half *)a[i] + k)));
        for (int j = 0; j < RN; j++) {
            const __m512 bv = _mm512_loadu_ps(b[j] + k);
            for (int i = 0; i < RM; i++) acc[i][j] = _mm512_fmadd_ps(av[i], bv, acc[i][j]);
        }
    }
    for (int i = 0; i < RM; i++)
        for (int j = 0; j < RN; j++) {
            const __m256 v = _mm256_add_ps(_mm512_castps512_ps256(acc[i][j]), _mm512_extractf32x8_ps(acc[i][j], 1));
            __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            r = _mm_add_ps(r, _mm_movehl_ps(r, r));
            r = _mm_add_ss(r, _mm_movehdup_ps(r));
            res[j * res_stride + i] = _mm_cvtss_f32(r);
        }
}

/* res[j * res_stride + i] = the 16-lane dot of F16 row a[i] and F32 row b[j] (n a multiple of 16) */
static void gguflm_dots16_block_avx512(int n, const void *const *a, int ma, const float *const *b, int nb, float *res,
                                       int64_t res_stride) {
    for (int i = 0; i < ma; i += 4) {
        const int rm = ma - i < 4 ? ma - i : 4;
        for (int j = 0; j < nb; j += 6) {
            const int rn = nb - j < 6 ? nb - j : 6;
            float *r = res + j * res_stride + i;
            /* constant tile shapes, so that the accumulators stay in registers */
#define GGUFLM_TILE16(RM_, RN_) case RM_ * 8 + RN_: gguflm_dots16_tile_avx512(n, a + i, RM_, b + j, RN_, r, res_stride); break;
#define GGUFLM_TILE16_ROW(RM_) GGUFLM_TILE16(RM_, 1) GGUFLM_TILE16(RM_, 2) GGUFLM_TILE16(RM_, 3) \
                               GGUFLM_TILE16(RM_, 4) GGUFLM_TILE16(RM_, 5) GGUFLM_TILE16(RM_, 6)
            switch (rm * 8 + rn) {
                GGUFLM_TILE16_ROW(1) GGUFLM_TILE16_ROW(2) GGUFLM_TILE16_ROW(3) GGUFLM_TILE16_ROW(4)
            }
#undef GGUFLM_TILE16_ROW
#undef GGUFLM_TILE16
        }
    }
}
GGUFLM_TARGET_END
#endif

/* ---- the row kernels, once per ISA (ops_rows.inc; simd_targets.h) ---- */
#define GGUFLM_SIMD(name) gguflm_##name##_scalar
#define GGUFLM_SIMD_AVX2 0
#include "ops_rows.inc"
#include "simd_copy_end.inc"

#if GGUFLM_HAVE_SIMD
GGUFLM_TARGET_AVX2_BEGIN
#define GGUFLM_SIMD(name) gguflm_##name##_avx2
#define GGUFLM_SIMD_AVX2 1
#include "ops_rows.inc"
#include "simd_copy_end.inc"
GGUFLM_TARGET_END
#endif

typedef void (*gguflm_glu_fn)(int n, const float *gate, const float *up, float *y, int arith);
typedef void (*gguflm_geglu_fn)(const ggml_half *table, int n, const float *gate, const float *up, float *y);
typedef void (*gguflm_attn_heads_fn)(const gguflm_attn_args *a, int t, int h0, int nh, const int32_t *cells,
                                     int n_vis, gguflm_attn_scratch *s);
typedef void (*gguflm_attn_block_fn)(const gguflm_attn_args *a, int t0, int nt, int hkv, const ggml_half *vt,
                                     int64_t vt_stride, gguflm_attn_scratch *s);
typedef void (*gguflm_attn_seq_fn)(const gguflm_attn_args *a, int hkv, const int32_t *seq, int m, const int32_t *cells,
                                   int nt, float *kt, const void **kptr, gguflm_attn_scratch *s);
typedef void (*gguflm_layer_norm_fn)(int n, const float *x, const float *w, const float *b, float eps, float *y,
                                     int arith);
typedef void (*gguflm_unary_fn)(int kind, const ggml_half *table, int n, const float *x, float *y);
typedef void (*gguflm_pool_mean_fn)(int n_tok, int n, const float *x, int64_t x_stride, const float *m, int lanes,
                                    int main, float *acc, float *out, int arith);

typedef struct {
    gguflm_glu_fn swiglu_row;
    gguflm_geglu_fn geglu_row;
    gguflm_attn_heads_fn attn_heads;
    gguflm_attn_block_fn attn_block;
    gguflm_attn_seq_fn attn_seq;
    gguflm_layer_norm_fn layer_norm_row;
    gguflm_unary_fn unary_row;
    gguflm_pool_mean_fn pool_mean_row;
} gguflm_ops_kernels;

/* the kernels of one copy, named gguflm_<name><suffix> (as quants_dot.h's GGUFLM_KERNEL_TABLE) */
#define GGUFLM_OPS_KERNELS(suffix)                                                                                   \
    (gguflm_ops_kernels){gguflm_swiglu_row##suffix, gguflm_geglu_row##suffix, gguflm_attn_heads##suffix,             \
                         gguflm_attn_block##suffix, gguflm_attn_seq##suffix, gguflm_layer_norm_row##suffix,          \
                         gguflm_unary_row##suffix, gguflm_pool_mean_row##suffix}

static gguflm_ops_kernels gguflm_ops_select(int use_avx2) {
#if GGUFLM_HAVE_SIMD
    if (use_avx2) return GGUFLM_OPS_KERNELS(_avx2);
#else
    (void)use_avx2;
#endif
    return GGUFLM_OPS_KERNELS(_scalar);
}

/* ---- row-parallel drivers: what the Python wrappers and the plan executor both call ---- */

/* no more threads than rows, and one thread for a single row (not worth waking another) */
static inline int gguflm_row_threads(int64_t n_rows, int n_threads) {
    return n_rows <= 1 ? 1 : (int)(n_threads < n_rows ? n_threads : n_rows);
}

static void gguflm_rms_norm_rows(int64_t n_rows, int n, const float *x, int64_t x_stride, const float *w,
                                 float eps, float *out, int64_t out_stride, int n_threads) {
    #pragma omp parallel for num_threads(gguflm_row_threads(n_rows, n_threads)) schedule(static)
    for (int64_t i = 0; i < n_rows; i++) gguflm_rms_norm_row(n, x + i * x_stride, w, eps, out + i * out_stride);
}

/* llama.cpp's attention rotation for a quantized KV cache: every `chunk` values of each row (a
 * power of two) replaced by their orthonormal Walsh-Hadamard transform, in place, as ggml-cpu's
 * fast transform computes it (ggml_compute_forward_fwht): scaled by 1/sqrtf(chunk) first, then
 * the butterflies u + v, u - v with spans 1, 2, 4, ... Every step is one rounding, the same in
 * any lane order, so no ISA variant is needed. */
static void gguflm_hadamard_rows(int64_t n_rows, int64_t n, int chunk, float *x, int64_t x_stride, int n_threads) {
    const float scale = 1.0f / sqrtf((float)chunk);
    #pragma omp parallel for num_threads(gguflm_row_threads(n_rows, n_threads)) schedule(static)
    for (int64_t i = 0; i < n_rows; i++)
        for (int64_t c0 = 0; c0 < n; c0 += chunk) {
            float *y = x + i * x_stride + c0;
            for (int j = 0; j < chunk; j++) y[j] *= scale;
            for (int span = 1; span < chunk; span <<= 1)
                for (int b = 0; b < chunk; b += 2 * span)
                    for (int j = b; j < b + span; j++) {
                        const float u = y[j], v = y[j + span];
                        y[j] = u + v;
                        y[j + span] = u - v;
                    }
        }
}

/* rotate every row of x ([n_rows][n_heads * head_dim], row stride x_stride) by its position */
static int gguflm_rope_apply(const gguflm_rope_params *p, const int32_t *pos, int64_t n_rows, int n_heads,
                             int head_dim, float *x, int64_t x_stride, int n_threads) {
    int failed = 0;
    #pragma omp parallel num_threads(gguflm_row_threads(n_rows, n_threads)) reduction(|:failed)
    {
        float *cos_sin = (float *)malloc(sizeof(float) * p->n_dims);
        failed = cos_sin == NULL;
        #pragma omp for schedule(static)
        for (int64_t t = 0; t < n_rows; t++) {
            if (!cos_sin) continue;
            gguflm_rope_angles(p, (float)pos[t], cos_sin);
            gguflm_rope_rows(p, cos_sin, n_heads, head_dim, x + t * x_stride);
        }
        free(cos_sin);
    }
    return failed ? -1 : 0;
}

enum { GGUFLM_GLU_SWIGLU = 0, GGUFLM_GLU_GEGLU = 1, GGUFLM_GLU_REGLU = 2 };

/* out = act(gate) * up for every row (SiLU, GELU, ReLU); gelu_table is used by GEGLU */
static void gguflm_glu_rows(int kind, const ggml_half *gelu_table, int64_t n_rows, int n, const float *gate,
                            int64_t gate_stride, const float *up, int64_t up_stride, float *out,
                            int64_t out_stride, int arith, int use_avx2, int n_threads) {
    const gguflm_ops_kernels k = gguflm_ops_select(use_avx2);
    #pragma omp parallel for num_threads(gguflm_row_threads(n_rows, n_threads)) schedule(static)
    for (int64_t i = 0; i < n_rows; i++) {
        if (kind == GGUFLM_GLU_GEGLU)
            k.geglu_row(gelu_table, n, gate + i * gate_stride, up + i * up_stride, out + i * out_stride);
        else if (kind == GGUFLM_GLU_REGLU) {   /* ggml_vec_reglu_f32: one product, no rounding choice */
            const float *g = gate + i * gate_stride, *u = up + i * up_stride;
            float *y = out + i * out_stride;
            for (int j = 0; j < n; j++) y[j] = g[j] > 0.f ? g[j] * u[j] : 0.f;
        }
        else
            k.swiglu_row(n, gate + i * gate_stride, up + i * up_stride, out + i * out_stride, arith);
    }
}

/* LayerNorm of every row: out = norm(x) * w + b (w, b may be NULL) */
static void gguflm_layer_norm_rows(int64_t n_rows, int n, const float *x, int64_t x_stride, const float *w,
                                   const float *b, float eps, float *out, int64_t out_stride, int arith, int use_avx2,
                                   int n_threads) {
    const gguflm_ops_kernels k = gguflm_ops_select(use_avx2);
    #pragma omp parallel for num_threads(gguflm_row_threads(n_rows, n_threads)) schedule(static)
    for (int64_t i = 0; i < n_rows; i++) k.layer_norm_row(n, x + i * x_stride, w, b, eps, out + i * out_stride, arith);
}

/* out = act(x) for every row (GGUFLM_UNARY_*; gelu_table is used by GELU) */
static void gguflm_unary_rows(int kind, const ggml_half *gelu_table, int64_t n_rows, int n, const float *x,
                              int64_t x_stride, float *out, int64_t out_stride, int use_avx2, int n_threads) {
    const gguflm_ops_kernels k = gguflm_ops_select(use_avx2);
    #pragma omp parallel for num_threads(gguflm_row_threads(n_rows, n_threads)) schedule(static)
    for (int64_t i = 0; i < n_rows; i++) k.unary_row(kind, gelu_table, n, x + i * x_stride, out + i * out_stride);
}

/* Mean pooling as llama.cpp builds it, ggml_mul_mat(cont(transpose(x)), mean): out[s] = the sum
 * over tokens t of x[t] * m[s][t] (x: [n_tok][n], m: [n_seqs][n_tok], out: [n_seqs][n]). ggml
 * hands it to llamafile's sgemm (one vector of lanes over the tokens) when n_tok is a whole number
 * of vectors, there are two sequences or more and n % 4 == 0; otherwise to vec_dot_f32 (four
 * vectors of lanes, then the leftover tokens one FMA each). Returns -1 if scratch allocation
 * failed. */
static int gguflm_pool_mean(int n_tok, int n, int n_seqs, const float *x, int64_t x_stride, const float *m,
                            float *out, int64_t out_stride, int arith, int use_avx2, int n_threads) {
    const gguflm_ops_kernels k = gguflm_ops_select(use_avx2);
    const int vec = gguflm_vec_lanes(arith);
    const int sgemm = n_tok % vec == 0 && n_seqs >= 2 && n % 4 == 0;
    const int lanes = sgemm ? vec : gguflm_dot_lanes(arith);
    const int main = n_tok - n_tok % lanes;
    int failed = 0;
    #pragma omp parallel num_threads(gguflm_row_threads(n_seqs, n_threads)) reduction(|:failed)
    {
        float *acc = (float *)malloc(sizeof(float) * lanes * (n > 0 ? n : 1));
        failed = acc == NULL;
        #pragma omp for schedule(static)
        for (int s = 0; s < n_seqs; s++)
            if (acc)
                k.pool_mean_row(n_tok, n, x, x_stride, m + (int64_t)s * n_tok, lanes, main, acc, out + s * out_stride,
                                arith);
        free(acc);
    }
    return failed ? -1 : 0;
}

/* the sequences the tokens of a ubatch belong to (first sequence of each; ids < 64), as bits;
 * *twice: those with two or more tokens */
static uint64_t gguflm_attn_seqs(const gguflm_attn_args *a, uint64_t *twice) {
    uint64_t seen = 0, more = 0;
    for (int t = 0; t < a->n_tok; t++) {
        const uint64_t bit = 1ull << (a->tok_seq[t] & 63);
        more |= seen & bit;
        seen |= bit;
    }
    *twice = more;
    return seen;
}

/* With F16 K and V (the default cache), batches of sequences' runs of tokens (prompts) go through
 * gguflm_attn_block (GGUFLM_ATTN_TBLOCK tokens per item, V transposed once per call over every
 * cell) and single tokens through gguflm_attn_heads one query head per item; other caches, and
 * batches of about one token per sequence (parallel decoding: the tokens share no cells, and each
 * sees only its own), through gguflm_attn_heads one token and KV head per item, as do the batches
 * of a cache with a region per sequence where some sequence has one token (which rounds as a
 * single token, gguflm_attn_batched), and batches whose every token rounds as a single token
 * (per_token: drafted tokens checked). All give the same floats. */
enum { GGUFLM_ATTN_BY_GROUP = 0, GGUFLM_ATTN_BY_HEAD, GGUFLM_ATTN_BY_BLOCK };
static int gguflm_attn_scheme(const gguflm_attn_args *a) {
    if (a->cache_type_k != GGUFLM_CACHE_F16 || a->cache_type_v != GGUFLM_CACHE_F16) return GGUFLM_ATTN_BY_GROUP;
    uint64_t twice;
    const uint64_t seqs = gguflm_attn_seqs(a, &twice);
    if (a->n_tok >= 2 && !a->cell_seq_id &&
        (a->per_token || a->n_tok < 2 * __builtin_popcountll(seqs) || (a->per_stream && twice != seqs)))
        return GGUFLM_ATTN_BY_GROUP;
    if (a->n_tok >= 2 && !a->cell_seq_id)
        return a->head_dim_k % gguflm_vec_lanes(a->arith) == 0 && a->n_head / a->n_head_kv <= 16 ? GGUFLM_ATTN_BY_BLOCK
                                                                                                : GGUFLM_ATTN_BY_GROUP;
    return a->head_dim_k % gguflm_dot_lanes(a->arith) == 0 && a->head_dim_v % 8 == 0 ? GGUFLM_ATTN_BY_HEAD
                                                                                     : GGUFLM_ATTN_BY_GROUP;
}

/* vt[h][d][c] = V of head h, dimension d, cell c (zeros for c >= n_kv), row stride vt_stride */
static void gguflm_transpose_v(const gguflm_attn_args *a, ggml_half *vt, int64_t vt_stride) {
    const int dv = a->head_dim_v;
    #pragma omp for schedule(static)
    for (int64_t hd = 0; hd < (int64_t)a->n_head_kv * dv; hd++) {
        const int64_t h = hd / dv, d = hd % dv;
        const char *col = (const char *)a->v + gguflm_cache_head_offset(GGUFLM_CACHE_F16, h, dv) + d * 2;
        ggml_half *row = vt + hd * vt_stride;
        for (int c = 0; c < a->n_kv; c++) row[c] = *(const ggml_half *)(col + (int64_t)c * a->v_row_bytes);
        for (int64_t c = a->n_kv; c < vt_stride; c++) row[c] = 0;
    }
}


/* Attention without a cache where only sequences mask (an encoder's non-causal attention): the
 * cells, which are the ubatch's tokens, bucketed by sequence once; items are chunks of up to
 * GGUFLM_ATTN_SEQ_CHUNK tokens of one sequence and one KV head (gguflm_attn_seq). Returns 0, or -1
 * if allocation failed. */
#define GGUFLM_ATTN_SEQ_CHUNK 32
static int gguflm_attention_by_sequence(const gguflm_attn_args *a, const gguflm_ops_kernels *kernels, int n_threads) {
    const int n = a->n_kv, gqa = a->n_head / a->n_head_kv;
    int n_seq = 0;
    for (int c = 0; c < n; c++) n_seq = a->cell_seq_id[c] >= n_seq ? a->cell_seq_id[c] + 1 : n_seq;
    int32_t *seq_cells = (int32_t *)malloc(sizeof(int32_t) * (n > 0 ? n : 1));
    int32_t *seq_start = (int32_t *)calloc((size_t)n_seq + 1, sizeof(int32_t));
    int32_t *chunks = (int32_t *)malloc(sizeof(int32_t) * 2 * (n > 0 ? n : 1));   /* (sequence, first token) */
    if (!seq_cells || !seq_start || !chunks) {
        free(seq_cells);
        free(seq_start);
        free(chunks);
        return -1;
    }
    /* counting sort: each sequence's cells ascending, seq_start[q] .. seq_start[q + 1] */
    for (int c = 0; c < n; c++) seq_start[a->cell_seq_id[c] + 1]++;
    for (int q = 0; q < n_seq; q++) seq_start[q + 1] += seq_start[q];
    for (int c = 0; c < n; c++) seq_cells[seq_start[a->cell_seq_id[c]]++] = c;
    for (int q = n_seq; q > 0; q--) seq_start[q] = seq_start[q - 1];
    seq_start[0] = 0;
    int n_chunks = 0;
    for (int q = 0; q < n_seq; q++)
        for (int i = seq_start[q]; i < seq_start[q + 1]; i += GGUFLM_ATTN_SEQ_CHUNK) {
            chunks[2 * n_chunks] = q;
            chunks[2 * n_chunks + 1] = i;
            n_chunks++;
        }
    const int64_t n_items = (int64_t)n_chunks * a->n_head_kv;
    if (n_threads > n_items) n_threads = n_items > 0 ? (int)n_items : 1;
    /* floats per thread: scores [gqa][n + 15], lane accumulators, K's tail transposed
     * [64][n + 15], the K row pointers [n] (two floats each); whole cache lines */
    const int64_t acc_floats = (int64_t)gqa * GGUFLM_MAX_LANES * GGUFLM_ATTN_DBLOCK, ms = n + 15;
    const int64_t per_thread = ((int64_t)gqa * ms + acc_floats + (int64_t)GGUFLM_MAX_LANES * ms + 2 * n + 15) / 16 * 16;
    float *scratch = (float *)malloc(sizeof(float) * per_thread * n_threads);
    if (!scratch) {
        free(seq_cells);
        free(seq_start);
        free(chunks);
        return -1;
    }
    #pragma omp parallel num_threads(n_threads)
    {
        float *p = scratch + per_thread * omp_get_thread_num();
        gguflm_attn_scratch s;
        memset(&s, 0, sizeof(s));
        s.score = p;                       p += (int64_t)gqa * ms;
        s.acc = p;                         p += acc_floats;
        float *kt = p;                     p += (int64_t)GGUFLM_MAX_LANES * ms;
        const void **kptr = (const void **)p;
        #pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < n_items; item++) {
            const int chunk = (int)(item / a->n_head_kv), q = chunks[2 * chunk], first = chunks[2 * chunk + 1];
            const int end = seq_start[q + 1] - first < GGUFLM_ATTN_SEQ_CHUNK ? seq_start[q + 1]
                                                                             : first + GGUFLM_ATTN_SEQ_CHUNK;
            kernels->attn_seq(a, (int)(item % a->n_head_kv), seq_cells + seq_start[q], seq_start[q + 1] - seq_start[q],
                              seq_cells + first, end - first, kt, kptr, &s);
        }
    }
    free(scratch);
    free(seq_cells);
    free(seq_start);
    free(chunks);
    return 0;
}

/* Every item of the scheme (gguflm_attn_scheme) over n_threads threads. Returns 0, or -1 if
 * scratch allocation failed. */
static int gguflm_attention(const gguflm_attn_args *args, int isa, int n_threads) {
    const gguflm_ops_kernels kernels = gguflm_ops_select(isa >= GGUFLM_ISA_AVX2);
    gguflm_attn_args run = *args;
    if (run.per_stream) gguflm_attn_seqs(&run, &run.batched_seqs);
    const gguflm_attn_args *a = &run;
    if (a->cell_seq_id && a->tok_seq == a->cell_seq_id && a->n_tok == a->n_kv && !a->causal && a->n_swa == 0 &&
        a->cache_type_k == GGUFLM_CACHE_F32 && a->cache_type_v == GGUFLM_CACHE_F32 &&
        a->n_head / a->n_head_kv <= GGUFLM_MAX_GQA)
        return gguflm_attention_by_sequence(a, &kernels, n_threads);
    const int scheme = gguflm_attn_scheme(a), blocked = scheme == GGUFLM_ATTN_BY_BLOCK;
    const int tb = blocked ? GGUFLM_ATTN_TBLOCK : 1;
    const int64_t n_items = ((int64_t)a->n_tok + tb - 1) / tb * (scheme == GGUFLM_ATTN_BY_HEAD ? a->n_head : a->n_head_kv);
    const int64_t gqa = a->n_head / a->n_head_kv;
    if (n_items <= 0) return 0;
    if (gqa > GGUFLM_MAX_GQA) return -1;
    if (n_threads > n_items) n_threads = (int)n_items;
    const int64_t n_kv = a->n_kv > 0 ? a->n_kv : 1;
    const int64_t vt_stride = (n_kv + 15) / 16 * 16;
    const int64_t dk = a->head_dim_k, row = dk > a->head_dim_v ? dk : a->head_dim_v;
    /* floats per thread: queries, Q8_0 queries (34 bytes per 32 values, in floats), scores, cell
     * ids (int32), one row, lane accumulators of P·V, the P·V lane order (int32), a block's
     * visibility bytes; rounded up to whole cache lines */
    const int64_t qq_floats = (gqa * (dk / QK8_0) * (int64_t)sizeof(block_q8_0) + 3) / 4;
    const int64_t acc_floats = gqa * GGUFLM_MAX_LANES * GGUFLM_ATTN_DBLOCK;
    const int64_t vis_floats = blocked ? (tb * vt_stride + 3) / 4 : 0;
    const int64_t per_thread = (tb * gqa * dk + qq_floats + tb * gqa * vt_stride + n_kv + row + acc_floats + n_kv +
                                vis_floats + 15) / 16 * 16;
    float *scratch = (float *)malloc(sizeof(float) * per_thread * n_threads);
    ggml_half *vt = blocked ? (ggml_half *)malloc(sizeof(ggml_half) * a->n_head_kv * a->head_dim_v * vt_stride) : NULL;
    /* one token, every head: the cells it sees, found once */
    int32_t *cells = scheme == GGUFLM_ATTN_BY_HEAD ? (int32_t *)malloc(sizeof(int32_t) * n_kv) : NULL;
    if (!scratch || (blocked && !vt) || (scheme == GGUFLM_ATTN_BY_HEAD && !cells)) {
        free(scratch);
        free(vt);
        free(cells);
        return -1;
    }
    const int n_vis = cells ? gguflm_visible_cells(a, 0, cells) : 0;
    #pragma omp parallel num_threads(n_threads)
    {
        float *p = scratch + per_thread * omp_get_thread_num();
        gguflm_attn_scratch s;
        s.q = p;                           p += tb * gqa * dk;
        s.qq = (block_q8_0 *)p;            p += qq_floats;
        s.score = p;                       p += tb * gqa * vt_stride;
        s.cells = (int32_t *)p;            p += n_kv;
        s.row = p;                         p += row;
        s.acc = p;                         p += acc_floats;
        s.order = (int32_t *)p;            p += n_kv;
        s.vis = (uint8_t *)p;
        s.wide = GGUFLM_HAVE_SIMD && isa >= GGUFLM_ISA_AVX512 && gguflm_vec_lanes(a->arith) == 16;
        if (blocked) {
            gguflm_transpose_v(a, vt, vt_stride);  /* ends with a barrier */
            #pragma omp for schedule(dynamic, 1)
            for (int64_t it = 0; it < n_items; it++) {
                /* the last tokens first: a causal block costs more the later it is, so the cheap
                 * ones fill the end and no thread is left with a big one */
                const int64_t item = n_items - 1 - it;
                const int t0 = (int)(item / a->n_head_kv) * tb;
                kernels.attn_block(a, t0, a->n_tok - t0 < tb ? a->n_tok - t0 : tb, (int)(item % a->n_head_kv),
                                   vt + (item % a->n_head_kv) * a->head_dim_v * vt_stride, vt_stride, &s);
            }
        } else if (scheme == GGUFLM_ATTN_BY_HEAD) {
            #pragma omp for schedule(dynamic, 1)
            for (int64_t item = 0; item < n_items; item++)
                kernels.attn_heads(a, 0, (int)item, 1, cells, n_vis, &s);
        } else {
            /* a token's KV heads in one chunk: its visible cells are found once */
            int t_cells = -1, n_vis_t = 0;
            #pragma omp for schedule(dynamic, a->n_head_kv)
            for (int64_t item = 0; item < n_items; item++) {
                const int t = (int)(item / a->n_head_kv);
                if (t != t_cells) {
                    n_vis_t = gguflm_visible_cells(a, t, s.cells);
                    t_cells = t;
                }
                kernels.attn_heads(a, t, (int)(item % a->n_head_kv * gqa), (int)gqa, s.cells, n_vis_t, &s);
            }
        }
    }
    free(scratch);
    free(vt);
    free(cells);
    return 0;
}

#endif
