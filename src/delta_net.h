/* The gated delta-net recurrence of Qwen3-Next and Qwen3.5's linear-attention layers, as ggml-cpu
 * computes it (ops.cpp's ggml_compute_forward_gated_delta_net_f32, the fused op llama.cpp's CPU
 * backend runs for prompts and single tokens alike; no chunked form there). Per value head h of a
 * sequence, with a scalar gate g and write strength beta per token:
 *     S = S * exp(g);  delta = (v - S^T k) * beta;  S += k delta^T;  out = S^T q / sqrt(d)
 * S is held as ggml holds it, transposed: row j of the d x d block is column j of S, so every
 * product is a contiguous dot. Key heads are shared by value heads as ggml broadcasts them
 * (tiled: value head h reads key head h % n_head_k).
 *
 * States live in the recurrent memory's rows (gguflm/memory_recurrent.py), read and written in
 * place: a ubatch's tokens come sequence after sequence, as many each (llama.cpp's equal split),
 * and cells[t] is the row of token t's sequence.
 *
 * Floats: the dots are ggml_vec_dot_f32's (gguflm_float_1's DOT recipe, in the arithmetic of the
 * build reproduced), the state's decay ggml_vec_scale_f32's plain products, the rank-one update
 * ggml_vec_mad_f32's fused multiply-adds, exp the C library's (ggml calls expf on the scalar gate).
 * Each (sequence, head) is computed by one thread start to end: results do not depend on the
 * thread count, nor on the ISA (a portable copy and an AVX2 + FMA one). */
#ifndef GGUFLM_DELTA_NET_H
#define GGUFLM_DELTA_NET_H

#include <math.h>
#include <stdint.h>
#include "quants_dot.h"
#include "simd_targets.h"
#include "ssm.h"   /* gguflm_ssm_seq_tokens: the ubatch layout every recurrent kernel reads */
#include "omp_compat.h"

typedef struct {
    float *s;                      /* the layer's states [size][n_head_v][d][d] (each block transposed) */
    const int64_t *cells;          /* [n_tokens] the state row of each token's sequence (dynamic) */
    int64_t n_tokens, d, n_head_k, n_head_v;
    const float *q, *k;            /* [n_tokens][qk_stride]: n_head_k heads of d values each */
    int64_t q_stride, k_stride;
    const float *v;                /* [n_tokens][v_stride]: n_head_v heads of d values */
    int64_t v_stride;
    const float *g, *beta;         /* [n_tokens][gb_stride]: one log-decay, one strength per value head */
    int64_t g_stride, beta_stride;
    float *out;                    /* [n_tokens][out_stride]: n_head_v heads of d values */
    int64_t out_stride;
} gguflm_gdn_args;

/* The delta-net's per-head gates, as llama.cpp's graph makes them (ggml_add, ggml_softplus,
 * ggml_mul; ggml_sigmoid, each libm's scalar form): g = softplus(alpha + dt_b) * A (the log-decay)
 * and beta = sigmoid(beta), in place, over n_rows rows of n_head values. */
static void gguflm_gdn_gates(int64_t n_rows, int64_t n_head, float *alpha, int64_t alpha_stride, const float *dt_b,
                             const float *A, float *beta, int64_t beta_stride) {
    for (int64_t t = 0; t < n_rows; t++)
        for (int64_t h = 0; h < n_head; h++) {
            const float x = alpha[t * alpha_stride + h] + dt_b[h];
            alpha[t * alpha_stride + h] = (x > 20.0f ? x : logf(1.0f + expf(x))) * A[h];
            float *b = beta + t * beta_stride + h;
            *b = 1.0f / (1.0f + expf(-*b));
        }
}

/* x *= sigmoid(gate) elementwise (ggml_sigmoid, then ggml_mul: gated attention outputs); gate_step
 * 0 broadcasts one gate per row (Qwen3.5-MoE's shared expert), 1 reads one per value */
static void gguflm_sigmoid_mul(int64_t n_rows, int64_t n, float *x, int64_t x_stride, const float *gate,
                               int64_t gate_stride, int64_t gate_step) {
    for (int64_t t = 0; t < n_rows; t++)
        for (int64_t j = 0; j < n; j++)
            x[t * x_stride + j] *= 1.0f / (1.0f + expf(-gate[t * gate_stride + j * gate_step]));
}

/* the row kernels, once portably and once for AVX2 + FMA (delta_net_rows.inc) */
#define GGUFLM_SIMD(name) gguflm_##name##_scalar
#define GGUFLM_SIMD_AVX2 0
#include "delta_net_rows.inc"
#include "simd_copy_end.inc"

#if GGUFLM_HAVE_SIMD
GGUFLM_TARGET_AVX2_BEGIN
#define GGUFLM_SIMD(name) gguflm_##name##_avx2
#define GGUFLM_SIMD_AVX2 1
#include "delta_net_rows.inc"
#include "simd_copy_end.inc"
GGUFLM_TARGET_END
#endif

/* Every (sequence, head) row on the ISA's copy (GGUFLM_ISA_*), one thread each */
static void gguflm_gated_delta_net(const gguflm_gdn_args *a, int isa, int arith, int n_threads) {
    const int64_t nst = gguflm_ssm_seq_tokens(a->cells, a->n_tokens), n_rows = (a->n_tokens / nst) * a->n_head_v;
    const int nth = n_rows < n_threads ? (int)(n_rows > 0 ? n_rows : 1) : n_threads;
    #pragma omp parallel for num_threads(nth) schedule(static)
    for (int64_t ir = 0; ir < n_rows; ir++) {
#if GGUFLM_HAVE_SIMD
        if (isa >= GGUFLM_ISA_AVX2) {
            gguflm_gdn_row_avx2(a, ir, nst, arith);
            continue;
        }
#endif
        gguflm_gdn_row_scalar(a, ir, nst, arith);
    }
}

#endif
