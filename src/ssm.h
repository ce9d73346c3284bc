/* The state-space kernels of recurrent models, as ggml-cpu computes them (ops.cpp's
 * ggml_compute_forward_ssm_conv_f32 and ssm_scan_f32, Mamba-1's per-state decay): the causal
 * convolution over each sequence's last d_conv - 1 inputs and its new ones, and the selective scan
 * that folds each token into the SSM state. States live in the recurrent memory's rows
 * (gguflm/memory_recurrent.py), read and written in place: a ubatch's tokens come sequence after
 * sequence, as many each (llama.cpp's equal split), and cells[t] is the row of token t's sequence.
 *
 * Floats: ggml's loops compiled with GCC's default contraction, so the running sums are FMAs
 * (fmaf here: the build passes -ffp-contract=off); expf, logf are the C library's, as ggml's
 * scalar loops call them; the SiLU after the convolution is ggml_vec_silu_f32's (its vector form
 * over whole vectors, the scalar one on the rest of the row). Every output element is computed
 * by one thread in a fixed order: results do not depend on the thread count. */
#ifndef GGUFLM_SSM_H
#define GGUFLM_SSM_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "ops_math.h"
#include "omp_compat.h"

typedef struct {
    float *r;                      /* the layer's conv states [size][d_inner][d_conv - 1] */
    float *s;                      /* the layer's SSM states [size][d_inner][d_state] */
    const int64_t *cells;          /* [n_tokens] the state row of each token's sequence (dynamic) */
    int64_t n_tokens, d_conv, d_inner, d_state;
    const float *x;                /* conv: its input; scan: the conv's output [n_tokens][x_stride] */
    int64_t x_stride;
    const float *conv_w, *conv_b;  /* [d_inner][d_conv], [d_inner] (NULL: no bias) */
    int32_t conv_linear;           /* 1: no SiLU after the conv (LFM2's short convolution) */
    const float *dt;               /* scan: [n_tokens][dt_stride], before softplus */
    int64_t dt_stride;
    const float *dt_b;             /* grouped scan: [n_head], added to dt first */
    const float *A, *D;            /* [d_inner][d_state], [d_inner]; grouped scan: [n_head] each */
    const float *B, *C;            /* [n_tokens][bc_stride], d_state values each (grouped: n_group * d_state) */
    int64_t n_head, n_group;       /* grouped scan (Mamba-2): heads of d_inner / n_head channels */
    int64_t bc_stride;
    float *out;                    /* [n_tokens][out_stride] */
    int64_t out_stride;
} gguflm_ssm_args;

/* how many tokens each sequence of the ubatch has: the run of token 0's row */
static inline int64_t gguflm_ssm_seq_tokens(const int64_t *cells, int64_t n_tokens) {
    int64_t n = 1;
    while (n < n_tokens && cells[n] == cells[0]) n++;
    return n;
}

/* ggml_compute_softplus_f32 */
static inline float gguflm_softplus(float x) {
    return x > 20.0f ? x : logf(1 + expf(x));
}

/* out = silu(conv(window) + b) for every token (without b or the SiLU where the args say so), the
 * conv state moved on by the sequence's tokens */
static void gguflm_ssm_conv(const gguflm_ssm_args *a, int arith, int n_threads) {
    const int64_t nc = a->d_conv, w = nc - 1, n_inner = a->d_inner;
    const int64_t nst = gguflm_ssm_seq_tokens(a->cells, a->n_tokens), n_seqs = a->n_tokens / nst;
    const int lanes = gguflm_arith_avx512(arith) ? 16 : 8;
    const int64_t vec_end = n_inner - n_inner % lanes;   /* ggml_vec_silu_f32's vector part */
    const int nth = n_inner < n_threads ? (int)(n_inner > 0 ? n_inner : 1) : n_threads;
    #pragma omp parallel for num_threads(nth) schedule(static)
    for (int64_t c = 0; c < n_inner; c++) {
        const float *cw = a->conv_w + c * nc;
        for (int64_t q = 0; q < n_seqs; q++) {
            const int64_t t0 = q * nst;
            float *state = a->r + a->cells[t0] * n_inner * w + c * w;
            /* the window of token t: state[t .. w), then inputs t0 .. t0 + t */
            for (int64_t t = 0; t < nst; t++) {
                float sum = 0.0f;
                for (int64_t k = 0; k < nc; k++) {
                    const int64_t i = t + k;
                    const float v = i < w ? state[i] : a->x[(t0 + i - w) * a->x_stride + c];
                    sum = fmaf(v, cw[k], sum);
                }
                const float y = a->conv_b ? sum + a->conv_b[c] : sum;
                a->out[(t0 + t) * a->out_stride + c] = a->conv_linear ? y
                    : c < vec_end ? gguflm_silu(y, arith) : y / (1.0f + expf(-y));
            }
            /* the last w values of the window stay (read ahead of the write: ascending is safe) */
            for (int64_t j = 0; j < w; j++) {
                const int64_t i = nst + j;
                state[j] = i < w ? state[i] : a->x[(t0 + i - w) * a->x_stride + c];
            }
        }
    }
}

/* Mamba-1's selective scan: per channel h, state = state * exp(softplus(dt) * A) + B * x * softplus(dt),
 * y = state . C; out = y + x * D (ggml_mul, then ggml_add) */
static void gguflm_ssm_scan(const gguflm_ssm_args *a, int n_threads) {
    const int64_t ds = a->d_state, n_inner = a->d_inner;
    const int64_t nst = gguflm_ssm_seq_tokens(a->cells, a->n_tokens), n_seqs = a->n_tokens / nst;
    const int nth = n_inner < n_threads ? (int)(n_inner > 0 ? n_inner : 1) : n_threads;
    #pragma omp parallel for num_threads(nth) schedule(static)
    for (int64_t h = 0; h < n_inner; h++) {
        const float *A = a->A + h * ds;
        for (int64_t q = 0; q < n_seqs; q++) {
            float *s = a->s + a->cells[q * nst] * n_inner * ds + h * ds;
            for (int64_t t = q * nst; t < (q + 1) * nst; t++) {
                const float dt_sp = gguflm_softplus(a->dt[t * a->dt_stride + h]);
                const float xv = a->x[t * a->x_stride + h];
                const float x_dt = xv * dt_sp;
                const float *B = a->B + t * a->bc_stride, *C = a->C + t * a->bc_stride;
                float sum = 0.0f;
                for (int64_t i = 0; i < ds; i++) {
                    /* GCC contracts (s0 * dA) + (B * x_dt) into one FMA over the first product */
                    const float state = fmaf(s[i], expf(dt_sp * A[i]), B[i] * x_dt);
                    sum = fmaf(state, C[i], sum);
                    s[i] = state;
                }
                a->out[t * a->out_stride + h] = sum + xv * a->D[h];
            }
        }
    }
}

/* Mamba-2's selective scan: a scalar decay per head, B and C per group of heads; per channel i of
 * head h, state = state * exp(softplus(dt + dt_b) * A[h]) + B * x * softplus(.), y = state . C;
 * out = y + x * D[h]. ggml runs the first d_state - d_state % (4 vectors) states of a channel in
 * vectors (GCC's vector operators: the state's first product fused as in the scalar loop; the dot
 * with C by FMAs into 4 vectors of lanes, reduced as GGML_F32_VEC_REDUCE), the rest as Mamba-1's
 * scalar loop. */
static void gguflm_ssm_scan_grouped(const gguflm_ssm_args *a, int arith, int n_threads) {
    const int64_t ds = a->d_state, n_inner = a->d_inner, nh = a->n_head, hd = n_inner / nh;
    const int64_t heads_per_group = nh / a->n_group;
    const int64_t nst = gguflm_ssm_seq_tokens(a->cells, a->n_tokens), n_seqs = a->n_tokens / nst;
    const int epr = gguflm_vec_lanes(arith), step = 4 * epr;
    const int64_t np = ds & ~(int64_t)(step - 1);
    const int nth = nh < n_threads ? (int)(nh > 0 ? nh : 1) : n_threads;
    #pragma omp parallel for num_threads(nth) schedule(static)
    for (int64_t h = 0; h < nh; h++) {
        const int64_t grp = h / heads_per_group;
        for (int64_t q = 0; q < n_seqs; q++) {
            float *states = a->s + a->cells[q * nst] * n_inner * ds;
            for (int64_t t = q * nst; t < (q + 1) * nst; t++) {
                const float dt_sp = gguflm_softplus(a->dt[t * a->dt_stride + h] + a->dt_b[h]);
                const float dA = expf(dt_sp * a->A[h]);
                const float *B = a->B + t * a->bc_stride + grp * ds, *C = a->C + t * a->bc_stride + grp * ds;
                for (int64_t i1 = 0; i1 < hd; i1++) {
                    const int64_t ii = h * hd + i1;
                    const float xv = a->x[t * a->x_stride + ii];
                    const float x_dt = xv * dt_sp;
                    float *s = states + ii * ds;
                    float acc[GGUFLM_MAX_LANES] = {0};   /* 4 vectors of lanes: state i in lane i % step */
                    for (int64_t i = 0; i < np; i++) {
                        const float state = fmaf(s[i], dA, B[i] * x_dt);
                        acc[i % step] = fmaf(state, C[i], acc[i % step]);
                        s[i] = state;
                    }
                    float v[16];
                    for (int l = 0; l < epr; l++) v[l] = (acc[l] + acc[2 * epr + l]) + (acc[epr + l] + acc[3 * epr + l]);
                    float sum = epr == 16 ? gguflm_hsum16(v) : gguflm_hsum8_hadd(v);
                    for (int64_t i = np; i < ds; i++) {
                        const float state = fmaf(s[i], dA, B[i] * x_dt);
                        sum = fmaf(state, C[i], sum);
                        s[i] = state;
                    }
                    a->out[t * a->out_stride + ii] = sum + xv * a->D[h];
                }
            }
        }
    }
}

/* The state moves staged by the recurrent memory (moves: count, then (dst, src) row pairs; src -1:
 * a zero state), made in every layer of both state blocks, each layer's sources read before any
 * row is written; then the count is cleared (they are made once). Returns -1 if scratch could
 * not be allocated. */
static int gguflm_rs_moves(int32_t *moves, float *r_all, int64_t r_width, float *s_all, int64_t s_width,
                           int64_t n_layer, int64_t size) {
    const int64_t n = moves[0];
    if (n <= 0) return 0;
    const int64_t widths[2] = {r_width, s_width};
    float *blocks[2] = {r_all, s_all};
    const int64_t most = r_width > s_width ? r_width : s_width;
    float *tmp = (float *)malloc(sizeof(float) * (size_t)(n * (most > 0 ? most : 1)));
    if (!tmp) return -1;
    for (int b = 0; b < 2; b++) {
        const int64_t width = widths[b];
        for (int64_t il = 0; il < n_layer; il++) {
            float *rows = blocks[b] + il * size * width;
            for (int64_t m = 0; m < n; m++) {
                const int32_t src = moves[2 + 2 * m];
                if (src < 0) memset(tmp + m * width, 0, sizeof(float) * width);
                else memcpy(tmp + m * width, rows + src * width, sizeof(float) * width);
            }
            for (int64_t m = 0; m < n; m++)
                memcpy(rows + (int64_t)moves[1 + 2 * m] * width, tmp + m * width, sizeof(float) * width);
        }
    }
    free(tmp);
    moves[0] = 0;
    return 0;
}

#endif
