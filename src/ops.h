/* Row-wise operations of the forward pass with ggml's numerics: RMS norm, RoPE, gated linear
 * units. Each works on one row; the Cython wrappers spread rows over threads. */
#ifndef GGUFLM_OPS_H
#define GGUFLM_OPS_H

#include <stdint.h>
#include <math.h>
#include "ops_math.h"

/* y = x / sqrt(mean(x^2) + eps) [* w]: squares summed in double, scale applied in float */
GGUFLM_NO_CONTRACT static void gguflm_rms_norm_row(int n, const float *x, const float *w, float eps, float *y) {
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

GGUFLM_NO_CONTRACT static void gguflm_rope_angles(const gguflm_rope_params *p, float pos, float *cos_sin) {
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
GGUFLM_NO_CONTRACT static void gguflm_rope_rows(const gguflm_rope_params *p, const float *cos_sin,
                                                int n_heads, int head_dim, float *x) {
    const int half = p->n_dims / 2;
    for (int h = 0; h < n_heads; h++) {
        float *r = x + (int64_t)h * head_dim;
        for (int i0 = 0; i0 < p->n_dims; i0 += 2) {
            const int a = p->neox ? i0 / 2 : i0;
            const int b = p->neox ? i0 / 2 + half : i0 + 1;
            const float c = cos_sin[i0], s = cos_sin[i0 + 1];
            const float x0 = r[a], x1 = r[b];
            r[a] = x0 * c - x1 * s;
            r[b] = x0 * s + x1 * c;
        }
    }
}

/* ---- gated linear units: y = act(gate) * up ---- */
GGUFLM_NO_CONTRACT static void gguflm_swiglu_row(int n, const float *gate, const float *up, float *y) {
    for (int i = 0; i < n; i++) y[i] = gguflm_silu(gate[i]) * up[i];
}

static void gguflm_geglu_row(const ggml_half *gelu_table, int n, const float *gate, const float *up, float *y) {
    for (int i = 0; i < n; i++) y[i] = gguflm_gelu(gelu_table, gate[i]) * up[i];
}

#endif
