/* Gemma 3n's own steps (llama.cpp's gemma3n graph), each op rounded as ggml-cpu rounds it: the
 * magnitude rescale of AltUp's added streams, the gaussian top-k activation sparsity, and AltUp's
 * predict and correct mixes of its GGUFLM_ALTUP_N streams. A stack of streams is one buffer of
 * GGUFLM_ALTUP_N slices of rows (ggml's [n_embd, n_tokens, n_altup]), `slice` floats apart.
 *
 * Floats: a row's sum of squares is ggml_sqr then ggml_sum_rows (each square rounded to float,
 * summed in double); the 4-term dots of predict are ggml_vec_dot_f32 of n = 4 (all leftovers:
 * products rounded then added, or fused, as gguflm_dot_f32_unfused says for the arithmetic);
 * every other op one rounding as its ggml op. Each output row is computed by one thread in a fixed
 * order: results do not depend on the thread count. */
#ifndef GGUFLM_ALTUP_H
#define GGUFLM_ALTUP_H

#include <math.h>
#include <stdint.h>
#include "ops_math.h"
#include "omp_compat.h"

#define GGUFLM_ALTUP_N 4   /* llama.cpp's n_altup: fixed, no key sets it */
#define GGUFLM_ALTUP_MIN_PARALLEL 32768   /* values below which one thread runs a node */

enum {
    GGUFLM_ALTUP_RESCALE = 0,  /* out *= |x| / |out| per row: ggml_mul by the target's magnitude, ggml_div by its own */
    GGUFLM_ALTUP_TOPK,         /* out = relu(out - (mean + f * std)) per row (std with n - 1) */
    GGUFLM_ALTUP_PREDICT,      /* out[j] = x[j] + sum_k x[k] * y[4 j + k] (x, out: stacks) */
    GGUFLM_ALTUP_CORRECT,      /* out[j] = (w - x[0]) * (y[j] + 1) + x[j] (x, out: stacks; w: the activated rows) */
};

/* sqrt(sum of x[i]^2) as ggml_sqrt(ggml_sum_rows(ggml_sqr(x))) */
static inline float gguflm_altup_magnitude(int64_t n, const float *x) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float sq = x[i] * x[i];
        sum += (double)sq;
    }
    return sqrtf((float)sum);
}

static inline double gguflm_altup_sum(int64_t n, const float *x) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)x[i];
    return sum;
}

/* llama.cpp's gaussian_topk of one row in place: mean = ggml_mean, std = sqrt(sum_rows(sqr(x -
 * mean)) * (1 / (n - 1))), cutoff = mean + std * std_mul, relu(x - cutoff) */
static void gguflm_altup_topk_row(int64_t n, float std_mul, float *x) {
    const float mean = (float)gguflm_altup_sum(n, x) / (float)n;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float d = x[i] - mean;
        const float sq = d * d;
        sum += (double)sq;
    }
    const float var = (float)sum * (1.0f / (float)(n - 1));
    const float cutoff = mean + sqrtf(var) * std_mul;
    for (int64_t i = 0; i < n; i++) {
        const float d = x[i] - cutoff;
        x[i] = d > 0.0f ? d : 0.0f;
    }
}

/* the dot of 4 values as ggml_vec_dot_f32 leaves them all to its leftover loop */
static inline float gguflm_altup_dot4(const float *a, int64_t a_step, const float *b, int unfused) {
    float s = 0.0f;
    for (int k = 0; k < GGUFLM_ALTUP_N; k++) {
        if (k < unfused) {
            const float p = a[k * a_step] * b[k];
            s = s + p;
        } else {
            s = fmaf(a[k * a_step], b[k], s);
        }
    }
    return s;
}

typedef struct {
    int32_t kind;              /* GGUFLM_ALTUP_* */
    int64_t n_rows, n;         /* rows (tokens) and values per row */
    int64_t slice;             /* floats between the slices of a stack */
    float f;                   /* TOPK: the std multiplier */
    const float *x;            /* RESCALE: the target rows; PREDICT, CORRECT: the input stack */
    int64_t x_stride;
    const float *y;            /* PREDICT: [n_rows][16] coefficients; CORRECT: [n_rows][4] */
    int64_t y_stride;
    const float *w;            /* CORRECT: the activated rows */
    int64_t w_stride;
    float *out;                /* rows (RESCALE, TOPK: in place) or the output stack */
    int64_t out_stride;
} gguflm_altup_args;

static void gguflm_altup_run(const gguflm_altup_args *a, int arith, int n_threads) {
    const int unfused = gguflm_dot_f32_unfused(GGUFLM_ALTUP_N, arith);
    const int64_t n = a->n;
    /* a few rows of a small model are done before a team of threads has started */
    const int threads = a->n_rows * n < GGUFLM_ALTUP_MIN_PARALLEL ? 1 : n_threads;
    #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t t = 0; t < a->n_rows; t++) {
        float *o = a->out + t * a->out_stride;
        if (a->kind == GGUFLM_ALTUP_RESCALE) {
            const float target = gguflm_altup_magnitude(n, a->x + t * a->x_stride);
            const float own = gguflm_altup_magnitude(n, o);
            for (int64_t i = 0; i < n; i++) o[i] = (o[i] * target) / own;
        } else if (a->kind == GGUFLM_ALTUP_TOPK) {
            gguflm_altup_topk_row(n, a->f, o);
        } else if (a->kind == GGUFLM_ALTUP_PREDICT) {
            const float *x = a->x + t * a->x_stride, *c = a->y + t * a->y_stride;
            for (int j = 0; j < GGUFLM_ALTUP_N; j++)
                for (int64_t i = 0; i < n; i++) {
                    const float p = gguflm_altup_dot4(x + i, a->slice, c + j * GGUFLM_ALTUP_N, unfused);
                    o[j * a->slice + i] = p + x[j * a->slice + i];
                }
        } else {   /* CORRECT */
            const float *x = a->x + t * a->x_stride, *c = a->y + t * a->y_stride, *act = a->w + t * a->w_stride;
            for (int j = 0; j < GGUFLM_ALTUP_N; j++) {
                const float coef = c[j] * 1.0f + 1.0f;
                for (int64_t i = 0; i < n; i++) {
                    const float innovation = act[i] - x[i];
                    const float scaled = innovation * coef;
                    o[j * a->slice + i] = scaled + x[j * a->slice + i];
                }
            }
        }
    }
}

#endif
