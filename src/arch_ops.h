/* Element-wise steps a few architectures need, each as ggml-cpu computes it: ggml_clamp (MPT's
 * and OLMo's clamp_kqv), the per-token attention temperature of Llama 4 / Mistral 3 (llama.cpp's
 * llm_graph_input_attn_temp, a scale of each query row), and xIELU (Apertus's activation,
 * ggml_xielu, with the FMAs GCC contracts ggml's expressions into). */
#ifndef GGUFLM_ARCH_OPS_H
#define GGUFLM_ARCH_OPS_H

#include <math.h>
#include <stdint.h>
#include "ssm.h"   /* gguflm_softplus */

/* x = max(min(x, hi), lo), rows of n values */
static void gguflm_clamp_rows(int64_t n_rows, int64_t n, float lo, float hi, float *x, int64_t stride) {
    for (int64_t i = 0; i < n_rows; i++)
        for (int64_t j = 0; j < n; j++) {
            float *v = x + i * stride + j;
            const float m = *v < hi ? *v : hi;
            *v = m > lo ? m : lo;
        }
}

/* log(floor((pos + offset) / floor_scale) + 1) * scale + 1: the float and double steps of
 * llama.cpp's attention temperature */
static inline float gguflm_attn_temp(int32_t pos, float scale, float offset, uint32_t floor_scale) {
    return (float)(log((double)floorf(((float)pos + offset) / (float)floor_scale) + 1.0) * (double)scale + 1.0);
}

/* row i of x (a query per row) *= gguflm_attn_temp(pos[i], ...) */
static void gguflm_attn_temp_rows(int64_t n_rows, int64_t n, const int32_t *pos, float scale, float offset,
                                  uint32_t floor_scale, float *x, int64_t stride) {
    for (int64_t i = 0; i < n_rows; i++) {
        const float s = gguflm_attn_temp(pos[i], scale, offset, floor_scale);
        for (int64_t j = 0; j < n; j++) x[i * stride + j] *= s;
    }
}

/* xIELU in place; p: the file's alpha_n, alpha_p, beta, eps (ggml_xielu turns the alphas into
 * beta + softplus(alpha_n) and softplus(alpha_p)) */
static void gguflm_xielu_rows(int64_t n_rows, int64_t n, const float *p, float *x, int64_t stride) {
    const float beta = p[2], eps = p[3];
    const float alpha_n = beta + gguflm_softplus(p[0]), alpha_p = gguflm_softplus(p[1]);
    for (int64_t i = 0; i < n_rows; i++)
        for (int64_t j = 0; j < n; j++) {
            float *v = x + i * stride + j;
            const float t = *v;
            *v = t > 0.0f ? fmaf(alpha_p * t, t, beta * t) : fmaf(expm1f(fminf(t, eps)) - t, alpha_n, beta * t);
        }
}

#endif
