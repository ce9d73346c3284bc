/* Scalar math that reproduces ggml's CPU numerics: its vector expf, SiLU, the GELU lookup table and
 * the lane orders of its AVX2 reductions. Every variant of our kernels inlines these (the build
 * passes -ffp-contract=off, and fmaf() marks where ggml fuses), so results do not depend on
 * which ISA ran them. The forms are branch-free so that compilers can vectorize the loops. */
#ifndef GGUFLM_OPS_MATH_H
#define GGUFLM_OPS_MATH_H

#include <math.h>
#include <stdint.h>
#include "ggml_blocks.h"
#include "dispatch.h"  /* GGUFLM_ARITH_* */

#define GGUFLM_INLINE static inline __attribute__((always_inline))

/* ggml_v_expf (AVX2 form, from ARM's optimized routines): max error 1.45 ulp + 0.5 */
GGUFLM_INLINE float gguflm_expf(float x) {
    const float r = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, r);
    const float n = z - r;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const uint32_t e = gguflm_f32_bits(z) << 23;
    const float k = gguflm_bits_f32(e + gguflm_f32_bits(1.0f));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                              fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, 0x1.ffffecp-1f * b);
    const float an = fabsf(n);
    const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
    const float s1 = gguflm_bits_f32(g + 0x7f000000u);
    const float s2 = gguflm_bits_f32(e - g);
    /* all three candidates computed, then selected: the loop stays branch-free */
    const float normal = fmaf(j, k, k);
    const float scaled = fmaf(s2, j, s2) * s1;
    const float extreme = s1 * s1;
    const float result = an > 126.0f ? scaled : normal;
    return an > 192.0f ? extreme : result;
}

/* tanh-approximated GELU as ggml computes it once per fp16 value to fill its lookup table
 * (with the FMA that GCC contracts 1 + a*x*x into) */
static float gguflm_gelu_exact(float x) {
    const float sqrt_2_over_pi = 0.79788456080286535587989211986876f;
    const float coef_a = 0.044715f;
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * fmaf(coef_a * x, x, 1.0f)));
}

/* Fill the 65,536-entry fp16 GELU table (ggml_table_gelu_f16). */
static void gguflm_gelu_table_init(ggml_half *table) {
    for (uint32_t i = 0; i < 65536u; i++)
        table[i] = gguflm_fp32_to_fp16(gguflm_gelu_exact(gguflm_fp16_to_fp32((ggml_half)i)));
}

/* GELU via the table, with ggml's saturation outside [-10, 10] */
GGUFLM_INLINE float gguflm_gelu(const ggml_half *table, float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return gguflm_fp16_to_fp32(table[gguflm_fp32_to_fp16(x)]);
}

/* Horizontal sums of 8 lanes in the two orders ggml's AVX2 code uses: both first add the high
 * half onto the low half; the dot products then hadd twice, softmax adds movehl then movehdup. */
GGUFLM_INLINE float gguflm_hsum8_hadd(const float v[8]) {
    const float t0 = v[0] + v[4], t1 = v[1] + v[5], t2 = v[2] + v[6], t3 = v[3] + v[7];
    return (t0 + t1) + (t2 + t3);
}

GGUFLM_INLINE float gguflm_hsum8_movehl(const float v[8]) {
    const float t0 = v[0] + v[4], t1 = v[1] + v[5], t2 = v[2] + v[6], t3 = v[3] + v[7];
    return (t0 + t2) + (t1 + t3);
}

#define GGUFLM_MAX_LANES 64

/* _mm512_reduce_add_ps as GCC expands it: the upper half added onto the lower, then as hsum8_movehl */
GGUFLM_INLINE float gguflm_hsum16(const float v[16]) {
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = v[l] + v[8 + l];
    return gguflm_hsum8_movehl(t);
}

/* ggml_vec_dot_f16/f32 keep 4 accumulator vectors (32 or 64 lanes); llamafile's sgemm (batches)
 * and the softmax's exp sums one vector (8 or 16 lanes) */
GGUFLM_INLINE int gguflm_dot_lanes(int arith) { return gguflm_arith_avx512(arith) ? 64 : 32; }
GGUFLM_INLINE int gguflm_vec_lanes(int arith) { return gguflm_arith_avx512(arith) ? 16 : 8; }

/* ggml_vec_dot_f32 leaves the elements after its last whole step of dot lanes to a scalar loop,
 * which GCC vectorised W = gguflm_arith_autovec_lanes wide, then W/2 wide: the products of all
 * but the last n % (W/2) of those n elements are rounded and then added in order; the rest are
 * fused multiply-adds (its scalar epilogue). This is how many of the n leftover elements are
 * unfused (objdump of llama-cpp-python 0.3.36's builds: W = 16 in the zen4 build, 8 in the
 * others). */
GGUFLM_INLINE int gguflm_dot_f32_unfused(int n, int arith) {
    return n - n % (gguflm_arith_autovec_lanes(arith) / 2);
}

/* the sum of one vector's lanes (8 or 16), as the build's horizontal sum adds them */
GGUFLM_INLINE float gguflm_hsum_vec(const float *v, int n_lanes) {
    return n_lanes == 16 ? gguflm_hsum16(v) : gguflm_hsum8_movehl(v);
}

/* ggml_v_expf of the AVX-512 build: the same polynomial as gguflm_expf, but 1 is added inside
 * the last FMA and the result scaled by 2^n exactly (scalef) */
GGUFLM_INLINE float gguflm_expf_avx512(float x) {
    const float r = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, r);
    const float n = z - r;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, fmaf(0x1.ffffecp-1f, b, 1.0f));
    /* scalef rounds j * 2^n once, as a multiply by an exact power of two does; beyond the normal
     * exponents the power is split in two, the first product still exact (branch-free, so that
     * loops of it vectorise) */
    const int32_t e = (int32_t)n;
    const int32_t split = e < -126 ? -100 : (e > 127 ? 100 : 0);
    const float scaled = (j * gguflm_bits_f32((uint32_t)(e - split + 127) << 23)) *
                         gguflm_bits_f32((uint32_t)(split + 127) << 23);
    const float extreme = n <= 0.0f ? 0.0f : INFINITY;
    return fabsf(n) > 192.0f ? extreme : scaled;
}

GGUFLM_INLINE float gguflm_expf_arith(float x, int arith) {
    return gguflm_arith_avx512(arith) ? gguflm_expf_avx512(x) : gguflm_expf(x);
}

/* ggml_v_silu: x / (1 + exp(-x)) with a real divide */
GGUFLM_INLINE float gguflm_silu(float x, int arith) {
    return x / (1.0f + gguflm_expf_arith(0.0f - x, arith));
}

#endif
