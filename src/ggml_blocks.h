/* ggml's quantization blocks, declared once, and the fp16/bf16 conversions they rely on.
 *
 * The layouts are ggml's (ggml-common.h) byte for byte; a wrong layout fails to compile through
 * the size assertions. Half-precision fields are stored as raw uint16_t bits.
 */
#ifndef GGUFLM_GGML_BLOCKS_H
#define GGUFLM_GGML_BLOCKS_H

#include <stdint.h>
#include <string.h>
#include <math.h>

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef uint16_t ggml_half;

typedef struct { ggml_half d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
typedef struct { ggml_half d; ggml_half m; uint8_t qs[QK4_1 / 2]; } block_q4_1;
typedef struct { ggml_half d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;
typedef struct { ggml_half d; ggml_half m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
typedef struct { ggml_half d; int8_t qs[QK8_0]; } block_q8_0;
/* s = d * sum(qs), kept so that dots with Q4_1/Q5_1 apply the weight's min once per block */
typedef struct { ggml_half d; ggml_half s; int8_t qs[QK8_1]; } block_q8_1;

/* K-quants: 256-element super-blocks of 16 or 8 sub-blocks with quantized scales */
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; ggml_half d; ggml_half dmin; } block_q2_K;
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; ggml_half d; } block_q3_K;
typedef struct { ggml_half d; ggml_half dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct {
    ggml_half d; ggml_half dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2];
} block_q5_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; ggml_half d; } block_q6_K;
/* activation partner of every K-quant: float scale, bsums = sums of each 16 quants */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;

/* ---- grid i-quants: 256-element super-blocks whose groups of 8 (IQ3: 4) quants are indices into
 * a grid of 8-vectors (quants_iq_grids.h), with 7 sign bits per 8 and 3- or 4-bit scales ---- */
typedef struct { ggml_half d; uint16_t qs[QK_K / 8]; } block_iq2_xxs;
typedef struct { ggml_half d; uint16_t qs[QK_K / 8]; uint8_t scales[QK_K / 32]; } block_iq2_xs;
typedef struct { ggml_half d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t scales[QK_K / 32]; } block_iq2_s;
/* qs: 64 grid bytes, then 8 words of 4 7-bit sign groups and a 4-bit scale each */
typedef struct { ggml_half d; uint8_t qs[3 * QK_K / 8]; } block_iq3_xxs;
typedef struct {
    ggml_half d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t signs[QK_K / 8]; uint8_t scales[QK_K / 64];
} block_iq3_s;
typedef struct { ggml_half d; uint8_t qs[QK_K / 8]; uint16_t qh[QK_K / 32]; } block_iq1_s;
/* the fp16 super-block scale is spread over the top nibbles of the four scale words */
typedef struct { uint8_t qs[QK_K / 8]; uint8_t qh[QK_K / 16]; uint8_t scales[QK_K / 32]; } block_iq1_m;

_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 size");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");
_Static_assert(sizeof(block_q8_1) == 36, "block_q8_1 size");
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K size");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K size");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");
_Static_assert(sizeof(block_q8_K) == 292, "block_q8_K size");
_Static_assert(sizeof(block_iq2_xxs) == 66, "block_iq2_xxs size");
_Static_assert(sizeof(block_iq2_xs) == 74, "block_iq2_xs size");
_Static_assert(sizeof(block_iq2_s) == 82, "block_iq2_s size");
_Static_assert(sizeof(block_iq3_xxs) == 98, "block_iq3_xxs size");
_Static_assert(sizeof(block_iq3_s) == 110, "block_iq3_s size");
_Static_assert(sizeof(block_iq1_s) == 50, "block_iq1_s size");
_Static_assert(sizeof(block_iq1_m) == 56, "block_iq1_m size");

/* ---- fp16 / bf16 <-> fp32, bit-exact in software ----
 * fp32 -> fp16 rounds to nearest even like F16C's vcvtps2ph (imm 0) and ggml's GGML_FP32_TO_FP16;
 * NaNs become quiet NaNs that keep the top payload bits, as vcvtps2ph does. */
static inline uint32_t gguflm_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float gguflm_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float gguflm_fp16_to_fp32(ggml_half h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t em = h & 0x7fffu;
    if (em >= 0x7c00u) return gguflm_bits_f32(sign | 0x7f800000u | ((em & 0x3ffu) << 13));  /* inf, nan */
    if (em >= 0x0400u) return gguflm_bits_f32(sign | ((em << 13) + 0x38000000u));          /* normal: rebias 15 -> 127 */
    const float mag = (float)em * 5.9604644775390625e-8f;                                 /* subnormal: em * 2^-24, exact */
    return gguflm_bits_f32(sign | gguflm_f32_bits(mag));
}

static inline ggml_half gguflm_fp32_to_fp16(float f) {
    const uint32_t x = gguflm_f32_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (ggml_half)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) return (ggml_half)(sign | 0x7c00u);   /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {
        /* below fp16's smallest normal: adding 0.5 puts the fp16 subnormal unit (2^-24) at the last
         * mantissa bit of an fp32 in [0.5, 1), so the FPU's own round-to-nearest-even does the work */
        const float t = gguflm_bits_f32(ax) + 0.5f;
        return (ggml_half)(sign | (gguflm_f32_bits(t) - 0x3f000000u));
    }
    const uint32_t odd = (ax >> 13) & 1u;
    ax += 0xc8000fffu + odd;   /* rebias exponent by -112 and add the round-to-nearest-even increment */
    return (ggml_half)(sign | (ax >> 13));
}

static inline float gguflm_bf16_to_fp32(uint16_t h) { return gguflm_bits_f32((uint32_t)h << 16); }

/* ggml_compute_fp32_to_bf16: round to nearest even, NaNs forced quiet */
static inline uint16_t gguflm_fp32_to_bf16(float f) {
    const uint32_t u = gguflm_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64u);
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

/* ---- the value-table and ternary formats: IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0 ----
 * Layouts and tables from ggml-common.h (llama.cpp, vendored in llama-cpp-python 0.3.36). */
#define QK4_NL 32
#define QK_MXFP4 32

/* 4-bit indices into kvalues_iq4nl, one fp16 scale per 32 */
typedef struct { ggml_half d; uint8_t qs[QK4_NL / 2]; } block_iq4_nl;
/* the same indices, 6-bit signed scales (stored + 32) per 32 under one fp16 d per 256 */
typedef struct { ggml_half d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } block_iq4_xs;
/* 4-bit indices into the E2M1 values (doubled), one E8M0 exponent per 32 */
typedef struct { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; } block_mxfp4;
/* ternary: 5 trits per byte (qs), 4 per byte (qh), as base-3 fractions of 256 */
typedef struct { uint8_t qs[(QK_K - 4 * QK_K / 64) / 5]; uint8_t qh[QK_K / 64]; ggml_half d; } block_tq1_0;
/* ternary: 2 bits per element, value - 1 */
typedef struct { uint8_t qs[QK_K / 4]; ggml_half d; } block_tq2_0;

_Static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl size");
_Static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs size");
_Static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 size");
_Static_assert(sizeof(block_tq1_0) == 54, "block_tq1_0 size");
_Static_assert(sizeof(block_tq2_0) == 66, "block_tq2_0 size");

/* ggml-common.h kvalues_iq4nl: the non-linear 4-bit grid of IQ4_NL and IQ4_XS */
static const int8_t gguflm_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                1, 13, 25, 38, 53, 69, 89, 113};
/* ggml-common.h kvalues_fp4: the E2M1 values doubled (OCP Microscaling Formats MX v1.0, FP4 E2M1:
 * 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives), so that they are integers */
static const int8_t gguflm_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* ggml_e8m0_to_fp32_half (ggml-impl.h): half of the E8M0 scale 2^(e-127), i.e. 2^(e-128), which
 * pairs with the doubled E2M1 values; e < 2 gives the denormals 2^-128 and 2^-127 */
static inline float gguflm_e8m0_to_fp32_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return gguflm_bits_f32(bits);
}

/* ---- rows: the software conversions above, and F16C variants (target attributes) with the same
 * bits, which the SIMD ISAs select (quants_kernels.h) ---- */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(GGUFLM_SIMDE)
#include <immintrin.h>
#define GGUFLM_ROW_F16C 1

__attribute__((target("avx,f16c"))) static void gguflm_fp32_to_fp16_row_f16c(const float *x, ggml_half *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        /* rounding immediate 0: round to nearest even */
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), 0));
    }
    for (; i < n; ++i) y[i] = gguflm_fp32_to_fp16(x[i]);
}

__attribute__((target("avx,f16c"))) static void gguflm_fp16_to_fp32_row_f16c(const ggml_half *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; ++i) y[i] = gguflm_fp16_to_fp32(x[i]);
}
#else
#define GGUFLM_ROW_F16C 0
#endif

static inline void gguflm_fp32_to_fp16_row(const float *x, ggml_half *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = gguflm_fp32_to_fp16(x[i]);
}

static inline void gguflm_fp16_to_fp32_row(const ggml_half *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = gguflm_fp16_to_fp32(x[i]);
}

#endif
