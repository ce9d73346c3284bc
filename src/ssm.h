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
#include "dispatch.h"
#include "ops_math.h"
#include "omp_compat.h"
#include "simd_targets.h"

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

/* the rows, once portably, once for AVX2 + FMA and once for AVX-512 (ssm_rows.inc) */
#define GGUFLM_SIMD(name) gguflm_##name##_scalar
#define GGUFLM_SIMD_AVX2 0
#define GGUFLM_SIMD_512 0
#include "ssm_rows.inc"
#include "simd_copy_end.inc"

#if GGUFLM_HAVE_SIMD
GGUFLM_TARGET_AVX2_BEGIN
#define GGUFLM_SIMD(name) gguflm_##name##_avx2
#define GGUFLM_SIMD_AVX2 1
#define GGUFLM_SIMD_512 0
#include "ssm_rows.inc"
#include "simd_copy_end.inc"
GGUFLM_TARGET_END
GGUFLM_TARGET_AVX512_BEGIN
#define GGUFLM_SIMD(name) gguflm_##name##_avx512
#define GGUFLM_SIMD_AVX2 1
#define GGUFLM_SIMD_512 1
#include "ssm_rows.inc"
#include "simd_copy_end.inc"
GGUFLM_TARGET_END
#define GGUFLM_SSM_ROW(isa, name, ...)                                                                 \
    ((isa) >= GGUFLM_ISA_AVX512 ? gguflm_##name##_avx512(__VA_ARGS__)                                  \
     : (isa) >= GGUFLM_ISA_AVX2 ? gguflm_##name##_avx2(__VA_ARGS__) : gguflm_##name##_scalar(__VA_ARGS__))
#else
#define GGUFLM_SSM_ROW(isa, name, ...) gguflm_##name##_scalar(__VA_ARGS__)
#endif

/* out = silu(conv(window) + b) for every token (without b or the SiLU where the args say so), the
 * conv state moved on by the sequence's tokens; each thread convolves a span of channels, then
 * applies the SiLU to its span of every token's row (in vectors: per channel it cost more than
 * the convolution); on the ISA's copy */
static void gguflm_ssm_conv(const gguflm_ssm_args *a, int isa, int arith, int n_threads) {
    const int64_t n_inner = a->d_inner;
    const int64_t nst = gguflm_ssm_seq_tokens(a->cells, a->n_tokens), n_seqs = a->n_tokens / nst;
    const int lanes = gguflm_arith_avx512(arith) ? 16 : 8;
    const int64_t vec_end = n_inner - n_inner % lanes;   /* ggml_vec_silu_f32's vector part */
    const int nth = n_inner < n_threads ? (int)(n_inner > 0 ? n_inner : 1) : n_threads;
    #pragma omp parallel num_threads(nth)
    {
        const int64_t ith = omp_get_thread_num(), per = (n_inner + nth - 1) / nth;
        const int64_t c0 = ith * per < n_inner ? ith * per : n_inner, c1 = c0 + per < n_inner ? c0 + per : n_inner;
        for (int64_t c = c0; c < c1; c++) GGUFLM_SSM_ROW(isa, ssm_conv_channel, a, c, nst, n_seqs);
        if (!a->conv_linear)
            for (int64_t t = 0; t < a->n_tokens; t++)
                GGUFLM_SSM_ROW(isa, ssm_conv_silu, a->out + t * a->out_stride, c0, c1, vec_end, arith);
    }
}

/* Mamba-1's selective scan: per channel h, state = state * exp(softplus(dt) * A) + B * x * softplus(dt),
 * y = state . C; out = y + x * D (ggml_mul, then ggml_add) */
static void gguflm_ssm_scan(const gguflm_ssm_args *a, int isa, int n_threads) {
    const int64_t n_inner = a->d_inner;
    const int64_t nst = gguflm_ssm_seq_tokens(a->cells, a->n_tokens), n_seqs = a->n_tokens / nst;
    const int nth = n_inner < n_threads ? (int)(n_inner > 0 ? n_inner : 1) : n_threads;
    #pragma omp parallel for num_threads(nth) schedule(static)
    for (int64_t h = 0; h < n_inner; h++) GGUFLM_SSM_ROW(isa, ssm_scan_channel, a, h, nst, n_seqs);
}

/* Mamba-2's selective scan: a scalar decay per head, B and C per group of heads; per channel i of
 * head h, state = state * exp(softplus(dt + dt_b) * A[h]) + B * x * softplus(.), y = state . C;
 * out = y + x * D[h]. ggml runs the first d_state - d_state % (4 vectors) states of a channel in
 * vectors (GCC's vector operators: the state's first product fused as in the scalar loop; the dot
 * with C by FMAs into 4 vectors of lanes, reduced as GGML_F32_VEC_REDUCE), the rest as Mamba-1's
 * scalar loop. Heads on the ISA's copy, one thread each. */
static void gguflm_ssm_scan_grouped(const gguflm_ssm_args *a, int isa, int arith, int n_threads) {
    const int64_t nh = a->n_head;
    const int64_t nst = gguflm_ssm_seq_tokens(a->cells, a->n_tokens), n_seqs = a->n_tokens / nst;
    const int nth = nh < n_threads ? (int)(nh > 0 ? nh : 1) : n_threads;
    #pragma omp parallel for num_threads(nth) schedule(static)
    for (int64_t h = 0; h < nh; h++) GGUFLM_SSM_ROW(isa, ssm_scan_head, a, h, nst, n_seqs, arith);
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
