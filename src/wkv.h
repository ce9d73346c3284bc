/* The kernels of RWKV's time mix and channel mix, as ggml-cpu computes them: the WKV recurrences
 * (ops.cpp's ggml_compute_forward_rwkv_wkv6_f32 and rwkv_wkv7_f32), the token shift that hands
 * each token its predecessor's row (llama.cpp's build_rwkv_token_shift_load/store and the
 * concats around them), and the element-wise chains of ggml ops the RWKV graphs build around
 * them (lerps, decays, gates, RWKV-7's key normalisation and bonus), each op rounded as ggml
 * rounds it. States live in the recurrent memory's rows (gguflm/memory_recurrent.py), read and
 * written in place: a ubatch's tokens come sequence after sequence, as many each (llama.cpp's
 * equal split), and cells[t] is the row of token t's sequence.
 *
 * Floats: ggml's vector FMAs are fmaf here (the build passes -ffp-contract=off); its scalar
 * unary ops call the C library's expf, as these do; RWKV-7's two dot products per state row
 * accumulate in 4 vectors of lanes reduced as GGML_F32_VEC_REDUCE. Every output element is
 * computed by one thread in a fixed order: results do not depend on the thread count. */
#ifndef GGUFLM_WKV_H
#define GGUFLM_WKV_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "ops_math.h"
#include "omp_compat.h"

#define GGUFLM_WKV_MAX_IO 8

/* what gguflm_wkv_run computes */
enum {
    GGUFLM_WKV6 = 0,         /* x: k, v, r, w (decay); p: u (time_first); out: y */
    GGUFLM_WKV7,             /* x: r, w, k, v, a, b; out: y */
    GGUFLM_WKV_SHIFT,        /* x: rows; out: the rows one token back (the state's at each sequence start) */
    GGUFLM_WKV_LERP,         /* x: cur, prev, then n_out addends or NULL; p: mu [n_out][n]; out: n_out rows */
    GGUFLM_WKV_DECAY6,       /* out = exp(-exp(x0 + p0)) */
    GGUFLM_WKV_DECAY7,       /* out = exp(sigmoid(x0 + p0) * -0.606531) */
    GGUFLM_WKV_SIGMOID,      /* out = sigmoid(x0 (+ p0)) */
    GGUFLM_WKV_RELU_SQR,     /* out = relu(x0)^2 */
    GGUFLM_WKV_SIGMOID_MUL,  /* out = sigmoid(x0) * x1 */
    GGUFLM_WKV_MUL,          /* out = x0 * x1 */
    GGUFLM_WKV_VALUE_MIX,    /* out = x0 + (x1 - x0) * sigmoid(x2 + p0): RWKV-7's value residual */
    GGUFLM_WKV_KEY_DECAY,    /* out = x0 - x0 * x1: QRWKV's k * (1 - w) */
    GGUFLM_WKV7_KEYS,        /* x: k, a; p: k_k, k_a; out: k (new), -kk, kk * a */
    GGUFLM_WKV7_BONUS,       /* x: k, r, v; p: r_k; out[0] += v * sum_head(k * r * r_k) */
    GGUFLM_WKV_GLA,          /* x: k, v, q, g (decay); scale; out: y (gated linear attention, QRWKV-6) */
    GGUFLM_WKV_REPEAT,       /* x: rows of n_in values in heads; out: each head repeated n / n_in times */
    GGUFLM_WKV_KIND_COUNT
};

typedef struct {
    int32_t kind;                           /* GGUFLM_WKV_* */
    int32_t n_out;                          /* LERP: how many rows */
    int64_t n_tokens, n, head_size;         /* rows, values per row, values per head */
    int64_t n_in;                           /* REPEAT: values per input row */
    float scale;                            /* GLA: q's scale */
    float *state;                           /* WKV: [size][n / head_size][head_size][head_size]; SHIFT: [size][width] */
    int64_t state_width, state_offset;      /* SHIFT: floats per state row, where this shift's n values are */
    const int64_t *cells;                   /* [n_tokens] the state row of each token's sequence (dynamic) */
    const float *x[GGUFLM_WKV_MAX_IO];      /* [n_tokens][x_stride] inputs */
    int64_t x_stride[GGUFLM_WKV_MAX_IO];
    const float *p[2];                      /* parameter rows (weights) */
    float *out[GGUFLM_WKV_MAX_IO];          /* [n_tokens][out_stride] */
    int64_t out_stride[GGUFLM_WKV_MAX_IO];
} gguflm_wkv_args;

/* how many tokens each sequence of the ubatch has: the run of token 0's row */
static inline int64_t gguflm_wkv_seq_tokens(const int64_t *cells, int64_t n_tokens) {
    int64_t n = 1;
    while (n < n_tokens && cells[n] == cells[0]) n++;
    return n;
}

static inline int gguflm_wkv_threads(int64_t work, int n_threads) {
    return work < n_threads ? (int)(work > 0 ? work : 1) : n_threads;
}

/* op_sigmoid of ggml's unary ops */
static inline float gguflm_wkv_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

#define GGUFLM_WKV_X(a, i, t) ((a)->x[i] + (t) * (a)->x_stride[i])
#define GGUFLM_WKV_OUT(a, i, t) ((a)->out[i] + (t) * (a)->out_stride[i])

/* one token's step of a recurrence over the head_size x head_size state S of the head starting
 * at value h0 */
typedef void (*gguflm_wkv_step)(const gguflm_wkv_args *a, int arith, float *S, int64_t t, int64_t h0);

/* the recurrences' loop: heads across threads, each head's sequences and their tokens in order */
static void gguflm_wkv_heads(const gguflm_wkv_args *a, int arith, int n_threads, gguflm_wkv_step step) {
    const int64_t hs = a->head_size, n_head = a->n / hs;
    const int64_t nst = gguflm_wkv_seq_tokens(a->cells, a->n_tokens), n_seqs = a->n_tokens / nst;
    #pragma omp parallel for num_threads(gguflm_wkv_threads(n_head, n_threads)) schedule(static)
    for (int64_t h = 0; h < n_head; h++) {
        for (int64_t q = 0; q < n_seqs; q++) {
            float *S = a->state + a->cells[q * nst] * a->n * hs + h * hs * hs;
            for (int64_t t = q * nst; t < (q + 1) * nst; t++) step(a, arith, S, t, h * hs);
        }
    }
}

/* RWKV-6: y[j] = sum_i r[i] * (u[i] * k[i] v[j] + S[i][j]), S[i][j] = S[i][j] * w[i] + k[i] v[j]
 * (the sum over i in order, each step one FMA, as ggml's vector loop over j) */
static void gguflm_wkv6_step(const gguflm_wkv_args *a, int arith, float *S, int64_t t, int64_t h0) {
    (void)arith;
    const int64_t hs = a->head_size;
    const float *k = GGUFLM_WKV_X(a, 0, t) + h0, *v = GGUFLM_WKV_X(a, 1, t) + h0;
    const float *r = GGUFLM_WKV_X(a, 2, t) + h0, *w = GGUFLM_WKV_X(a, 3, t) + h0, *u = a->p[0] + h0;
    float *y = GGUFLM_WKV_OUT(a, 0, t) + h0;
    for (int64_t j = 0; j < hs; j++) y[j] = 0.0f;
    for (int64_t i = 0; i < hs; i++) {
        float *Si = S + i * hs;
        for (int64_t j = 0; j < hs; j++) {
            const float kv = v[j] * k[i];
            const float prev = Si[j];
            y[j] = fmaf(fmaf(kv, u[i], prev), r[i], y[j]);
            Si[j] = fmaf(prev, w[i], kv);
        }
    }
}

/* gated linear attention (ggml_gated_linear_attn): S[i][j] = S[i][j] * g[i] + k[i] v[j],
 * y[j] = sum_i (q[i] * scale) * S[i][j], each step one FMA as ggml's vector loop over j; on the
 * rest of a row after whole vectors GCC fuses the other product into the state's sum */
static void gguflm_wkv_gla_step(const gguflm_wkv_args *a, int arith, float *S, int64_t t, int64_t h0) {
    const int64_t hs = a->head_size, vec_end = hs - hs % gguflm_vec_lanes(arith);
    const float *k = GGUFLM_WKV_X(a, 0, t) + h0, *v = GGUFLM_WKV_X(a, 1, t) + h0;
    const float *qq = GGUFLM_WKV_X(a, 2, t) + h0, *g = GGUFLM_WKV_X(a, 3, t) + h0;
    float *y = GGUFLM_WKV_OUT(a, 0, t) + h0;
    for (int64_t j = 0; j < hs; j++) y[j] = 0.0f;
    for (int64_t i = 0; i < hs; i++) {
        float *Si = S + i * hs;
        const float qs = qq[i] * a->scale;
        for (int64_t j = 0; j < hs; j++) {
            const float s = j < vec_end ? fmaf(Si[j], g[i], v[j] * k[i]) : fmaf(v[j], k[i], Si[j] * g[i]);
            y[j] = fmaf(s, qs, y[j]);
            Si[j] = s;
        }
    }
}

/* the sum of 4 vectors of lanes (state element j in lane j % step), as GGML_F32_VEC_REDUCE */
static inline float gguflm_wkv_reduce(const float *acc, int epr) {
    float v[16];
    for (int l = 0; l < epr; l++) v[l] = (acc[l] + acc[2 * epr + l]) + (acc[epr + l] + acc[3 * epr + l]);
    return epr == 16 ? gguflm_hsum16(v) : gguflm_hsum8_hadd(v);
}

/* RWKV-7: per state row i, sa = a . S[i]; S[i][j] = S[i][j] * w[j] + k[j] v[i] + sa * b[j];
 * y[i] = r . S[i]. ggml runs both dots in 4 vectors of lanes, in whole steps of them only (a head
 * size that is no multiple of the step would read past the head there): the caller checks that
 * head_size is a multiple of 4 * gguflm_vec_lanes(arith). */
static void gguflm_wkv7_step(const gguflm_wkv_args *a, int arith, float *S, int64_t t, int64_t h0) {
    const int64_t hs = a->head_size;
    const int epr = gguflm_vec_lanes(arith), step = 4 * epr;
    const float *r = GGUFLM_WKV_X(a, 0, t) + h0, *w = GGUFLM_WKV_X(a, 1, t) + h0;
    const float *k = GGUFLM_WKV_X(a, 2, t) + h0, *v = GGUFLM_WKV_X(a, 3, t) + h0;
    const float *aa = GGUFLM_WKV_X(a, 4, t) + h0, *b = GGUFLM_WKV_X(a, 5, t) + h0;
    float *y = GGUFLM_WKV_OUT(a, 0, t) + h0;
    for (int64_t i = 0; i < hs; i++) {
        float *Si = S + i * hs;
        float acc[GGUFLM_MAX_LANES] = {0};
        for (int64_t j = 0; j < hs; j++) acc[j % step] = fmaf(aa[j], Si[j], acc[j % step]);
        const float sa = gguflm_wkv_reduce(acc, epr);
        for (int l = 0; l < step; l++) acc[l] = 0.0f;
        for (int64_t j = 0; j < hs; j++) {
            const float s = fmaf(sa, b[j], fmaf(Si[j], w[j], v[i] * k[j]));
            Si[j] = s;
            acc[j % step] = fmaf(s, r[j], acc[j % step]);
        }
        y[i] = gguflm_wkv_reduce(acc, epr);
    }
}

/* out[t] = x[t - 1] within each sequence, the state's row before its first token; then the state
 * keeps the sequence's last row. out may not be x. */
static void gguflm_wkv_shift(const gguflm_wkv_args *a) {
    const int64_t nst = gguflm_wkv_seq_tokens(a->cells, a->n_tokens), n_seqs = a->n_tokens / nst;
    const size_t row = sizeof(float) * (size_t)a->n;
    for (int64_t q = 0; q < n_seqs; q++) {
        const int64_t t0 = q * nst;
        float *st = a->state + a->cells[t0] * a->state_width + a->state_offset;
        memcpy(GGUFLM_WKV_OUT(a, 0, t0), st, row);
        for (int64_t t = t0 + 1; t < t0 + nst; t++) memcpy(GGUFLM_WKV_OUT(a, 0, t), GGUFLM_WKV_X(a, 0, t - 1), row);
        memcpy(st, GGUFLM_WKV_X(a, 0, t0 + nst - 1), row);
    }
}

/* one element of the element-wise kinds: ggml's ops one after another, each rounded */
static inline float gguflm_wkv_map1(int kind, const gguflm_wkv_args *a, int64_t t, int64_t j) {
    const float x0 = GGUFLM_WKV_X(a, 0, t)[j];
    const float p0 = a->p[0] ? a->p[0][j] : 0.0f;
    switch (kind) {
    case GGUFLM_WKV_DECAY6: return expf(-expf(x0 + p0));
    case GGUFLM_WKV_DECAY7: return expf(gguflm_wkv_sigmoid(x0 + p0) * -0.606531f);
    case GGUFLM_WKV_SIGMOID: return gguflm_wkv_sigmoid(a->p[0] ? x0 + p0 : x0);
    case GGUFLM_WKV_RELU_SQR: { const float v = x0 > 0.0f ? x0 : 0.0f; return v * v; }
    case GGUFLM_WKV_SIGMOID_MUL: return gguflm_wkv_sigmoid(x0) * GGUFLM_WKV_X(a, 1, t)[j];
    case GGUFLM_WKV_MUL: return x0 * GGUFLM_WKV_X(a, 1, t)[j];
    case GGUFLM_WKV_VALUE_MIX:
        return x0 + (GGUFLM_WKV_X(a, 1, t)[j] - x0) * gguflm_wkv_sigmoid(GGUFLM_WKV_X(a, 2, t)[j] + p0);
    default: /* GGUFLM_WKV_KEY_DECAY */
        return x0 - x0 * GGUFLM_WKV_X(a, 1, t)[j];
    }
}

/* the per-token kinds: LERP, the element-wise ones, RWKV-7's keys and bonus */
static void gguflm_wkv_rows(const gguflm_wkv_args *a, int n_threads) {
    const int64_t n = a->n, hs = a->head_size;
    const int kind = a->kind;
    #pragma omp parallel for num_threads(gguflm_wkv_threads(a->n_tokens, n_threads)) schedule(static)
    for (int64_t t = 0; t < a->n_tokens; t++) {
        if (kind == GGUFLM_WKV_LERP) {
            /* sx = prev - cur (ggml_sub), then (addend + mu) * sx + cur */
            const float *cur = GGUFLM_WKV_X(a, 0, t), *prev = GGUFLM_WKV_X(a, 1, t);
            for (int o = 0; o < a->n_out; o++) {
                const float *mu = a->p[0] + o * n, *add = a->x[2 + o] ? GGUFLM_WKV_X(a, 2 + o, t) : NULL;
                float *y = GGUFLM_WKV_OUT(a, o, t);
                for (int64_t j = 0; j < n; j++) {
                    const float sx = prev[j] - cur[j];
                    y[j] = (add ? add[j] + mu[j] : mu[j]) * sx + cur[j];
                }
            }
        } else if (kind == GGUFLM_WKV7_KEYS) {
            /* kk = l2_norm(k * k_k) per head (ggml_l2_norm, eps 1e-12: a double sum of the rounded
             * squares); ka = k * k_a; k += a * ka - ka */
            const float *k = GGUFLM_WKV_X(a, 0, t), *av = GGUFLM_WKV_X(a, 1, t);
            float *k_out = GGUFLM_WKV_OUT(a, 0, t), *neg_kk = GGUFLM_WKV_OUT(a, 1, t), *kka = GGUFLM_WKV_OUT(a, 2, t);
            for (int64_t h0 = 0; h0 < n; h0 += hs) {
                double sum = 0.0;
                for (int64_t j = h0; j < h0 + hs; j++) {
                    const float kk = k[j] * a->p[0][j];
                    sum += (double)(kk * kk);
                }
                const float scale = 1.0f / fmaxf(sqrtf((float)sum), 1e-12f);
                for (int64_t j = h0; j < h0 + hs; j++) {
                    const float kk = (k[j] * a->p[0][j]) * scale;
                    const float ka = k[j] * a->p[1][j];
                    neg_kk[j] = -kk;
                    kka[j] = kk * av[j];
                    k_out[j] = k[j] + (av[j] * ka - ka);
                }
            }
        } else if (kind == GGUFLM_WKV7_BONUS) {
            /* rk = sum_rows(k * r * r_k) per head (ggml_vec_sum_f32: a double sum); y += v * rk */
            const float *k = GGUFLM_WKV_X(a, 0, t), *r = GGUFLM_WKV_X(a, 1, t), *v = GGUFLM_WKV_X(a, 2, t);
            float *y = GGUFLM_WKV_OUT(a, 0, t);
            for (int64_t h0 = 0; h0 < n; h0 += hs) {
                double sum = 0.0;
                for (int64_t j = h0; j < h0 + hs; j++) sum += (double)((k[j] * r[j]) * a->p[0][j]);
                const float rk = (float)sum;
                for (int64_t j = h0; j < h0 + hs; j++) y[j] += v[j] * rk;
            }
        } else if (kind == GGUFLM_WKV_REPEAT) {
            /* ggml_repeat of [head_size, 1, n_in / head_size] rows to [head_size, rep, ...] */
            const int64_t rep = n / a->n_in;
            const float *x = GGUFLM_WKV_X(a, 0, t);
            float *y = GGUFLM_WKV_OUT(a, 0, t);
            for (int64_t h = 0; h < n / hs; h++) memcpy(y + h * hs, x + (h / rep) * hs, sizeof(float) * (size_t)hs);
        } else {
            float *y = GGUFLM_WKV_OUT(a, 0, t);
            for (int64_t j = 0; j < n; j++) y[j] = gguflm_wkv_map1(kind, a, t, j);
        }
    }
}

static void gguflm_wkv_run(const gguflm_wkv_args *a, int arith, int n_threads) {
    switch (a->kind) {
    case GGUFLM_WKV6: gguflm_wkv_heads(a, arith, n_threads, gguflm_wkv6_step); break;
    case GGUFLM_WKV7: gguflm_wkv_heads(a, arith, n_threads, gguflm_wkv7_step); break;
    case GGUFLM_WKV_GLA: gguflm_wkv_heads(a, arith, n_threads, gguflm_wkv_gla_step); break;
    case GGUFLM_WKV_SHIFT: gguflm_wkv_shift(a); break;
    default: gguflm_wkv_rows(a, n_threads); break;
    }
}

#endif
