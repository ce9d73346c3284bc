/* The SIMD dot kernels, in the idiom of simd_targets.h: quants_dot_simd.inc and quants_iq_simd.inc
 * compiled once for AVX2 (+FMA, F16C) and once for AVX-512 with VNNI, each inside its GCC target
 * region, each with its [path][type] kernel table (gguflm_kernel maps the ISA a caller passes to a
 * kernel); the avx512bf16 ISA adds BF16 kernels that run vdpbf16ps (quants_float_simd.inc once
 * more) to the AVX-512 ones, and AVX512_VBMI, where the CPU has it, grid i-quant kernels
 * (quants_iq_simd.inc once more, see quants_iq_vbmi.inc). Off x86, or without GCC's target
 * pragmas, only the scalar kernels exist. Every copy defines the same flags, which say what its
 * fragments may use:
 *   GGUFLM_SIMD_VNNI    vpdpbusd for the byte dots (else vpmaddubsw + vpmaddwd)
 *   GGUFLM_SIMD_512     512-bit vectors (AVX-512F/BW/VL/DQ)
 *   GGUFLM_SIMD_DPBF16  vdpbf16ps itself for BF16 pairs (else its rounding emulated)
 *   GGUFLM_SIMD_VBMI    AVX512_VBMI, GFNI and AVX512_BITALG for the grid lookups
 *   GGUFLM_SIMD_AMX     the batch kernels' tile functions, under the AMX target (quants_amx.h)
 */
#ifndef GGUFLM_QUANTS_SIMD_H
#define GGUFLM_QUANTS_SIMD_H

#include "quants_dot.h"
#include "cpu_features.h"
#include "simd_targets.h"

#if GGUFLM_HAVE_SIMD
/* Every SIMD kernel computes tiles of R weight rows x T tokens, R, T <= GGUFLM_MAX_TILE
 * (constants after inlining: R*T accumulators stay in registers, each weight block is decoded
 * once for the T tokens and each activation block loaded once for the R rows); the float
 * arithmetic per output is the recipe of quants_dot.h and does not depend on the tile shape. */
#define GGUFLM_MAX_TILE 4

/* one token: 4 rows per tile; several tokens: 4 tokens per tile, row by row */
#define GGUFLM_TILE_LOOP(TILE, ...)                                                                              \
    do {                                                                                                         \
        if (nt == 1) {                                                                                           \
            int64_t r = 0;                                                                                       \
            for (; r + 4 <= nr; r += 4) TILE(__VA_ARGS__ w + r * ws, ws, 4, y, ys, 1, o + r, os);                \
            for (; r < nr; ++r) TILE(__VA_ARGS__ w + r * ws, ws, 1, y, ys, 1, o + r, os);                        \
        } else {                                                                                                 \
            for (int64_t r = 0; r < nr; ++r) {                                                                   \
                int64_t t = 0;                                                                                   \
                for (; t + 4 <= nt; t += 4) TILE(__VA_ARGS__ w + r * ws, ws, 1, y + t * ys, ys, 4, o + t * os + r, os); \
                for (; t < nt; ++t) TILE(__VA_ARGS__ w + r * ws, ws, 1, y + t * ys, ys, 1, o + t * os + r, os); \
            }                                                                                                    \
        }                                                                                                        \
    } while (0)

/* rows in fours and tokens in fours (the leftovers one by one): for kernels whose registers hold
 * 16 accumulators */
#define GGUFLM_TILE_LOOP_4X4(TILE, ...)                                                                          \
    do {                                                                                                         \
        int64_t r = 0;                                                                                           \
        for (; r + 4 <= nr; r += 4) {                                                                            \
            int64_t t = 0;                                                                                       \
            for (; t + 4 <= nt; t += 4) TILE(__VA_ARGS__ w + r * ws, ws, 4, y + t * ys, ys, 4, o + t * os + r, os); \
            for (; t < nt; ++t) TILE(__VA_ARGS__ w + r * ws, ws, 4, y + t * ys, ys, 1, o + t * os + r, os);     \
        }                                                                                                        \
        for (; r < nr; ++r) {                                                                                    \
            int64_t t = 0;                                                                                       \
            for (; t + 4 <= nt; t += 4) TILE(__VA_ARGS__ w + r * ws, ws, 1, y + t * ys, ys, 4, o + t * os + r, os); \
            for (; t < nt; ++t) TILE(__VA_ARGS__ w + r * ws, ws, 1, y + t * ys, ys, 1, o + t * os + r, os);     \
        }                                                                                                        \
    } while (0)

/* the AMX tile helpers and the bench's tile peak loop (in the AMX target); the AVX-512 copy's batch
 * kernels carry their tile functions (GGUFLM_SIMD_AMX), in the same target, out of line */
#include "quants_amx.h"

GGUFLM_TARGET_AVX2_BEGIN
#define GGUFLM_SIMD(name) gguflm_##name##_avx2
#define GGUFLM_SIMD_VNNI 0
#define GGUFLM_SIMD_512 0
#define GGUFLM_SIMD_DPBF16 0
#define GGUFLM_SIMD_VBMI 0
#define GGUFLM_SIMD_AMX 0
#include "quants_dot_simd.inc"
#include "quants_iq_simd.inc"
static const gguflm_gemm_fn gguflm_kernels_avx2[GGUFLM_PATH_COUNT][GGUFLM_TYPE_COUNT] = GGUFLM_KERNEL_TABLE(_avx2);
/* the 3-bit grids' DOT kernels that gather their entries (quants_iq_simd.inc), for Intel's cores */
static const gguflm_gemm_fn gguflm_iq_kernels_avx2gather[GGUFLM_PATH_COUNT][GGUFLM_TYPE_COUNT] = {
    [GGUFLM_PATH_DOT][GGUFLM_IQ3_XXS] = gguflm_DOT_GATHER_iq3_xxs_avx2, [GGUFLM_PATH_DOT][GGUFLM_IQ3_S] = gguflm_DOT_GATHER_iq3_s_avx2};
#include "simd_copy_end.inc"
GGUFLM_TARGET_END

GGUFLM_TARGET_AVX512_BEGIN
#define GGUFLM_SIMD(name) gguflm_##name##_avx512
#define GGUFLM_SIMD_VNNI 1
#define GGUFLM_SIMD_512 1
#define GGUFLM_SIMD_DPBF16 0
#define GGUFLM_SIMD_VBMI 0
#define GGUFLM_SIMD_AMX GGUFLM_HAVE_AMX
#include "quants_dot_simd.inc"
#include "quants_iq_simd.inc"
static const gguflm_gemm_fn gguflm_kernels_avx512[GGUFLM_PATH_COUNT][GGUFLM_TYPE_COUNT] = GGUFLM_KERNEL_TABLE(_avx512);
#include "simd_copy_end.inc"
GGUFLM_TARGET_END

/* the grid i-quants once more with AVX512_VBMI (quants_iq_vbmi.inc), for the CPUs that have it
 * (gguflm_kernel picks them while the dispatch's vbmi is on); they call the AVX-512 copy's
 * helpers, which GCC inlines into the wider target */
GGUFLM_TARGET_AVX512VBMI_BEGIN
#define GGUFLM_SIMD(name) gguflm_##name##_avx512vbmi
#define GGUFLM_SIMD_VNNI 1
#define GGUFLM_SIMD_512 1
#define GGUFLM_SIMD_DPBF16 0
#define GGUFLM_SIMD_VBMI 1
#define GGUFLM_SIMD_AMX 0
#define gguflm_bits_32_avx512vbmi gguflm_bits_32_avx512
#define gguflm_hsum_i32_avx512vbmi gguflm_hsum_i32_avx512
#define gguflm_reduce8_512_avx512vbmi gguflm_reduce8_512_avx512
#define gguflm_ktile_gemm_avx512vbmi gguflm_ktile_gemm_avx512
#define gguflm_pair_scales512_avx512vbmi gguflm_pair_scales512_avx512
#include "quants_iq_simd.inc"
static const gguflm_gemm_fn gguflm_iq_kernels_avx512vbmi[GGUFLM_PATH_COUNT][GGUFLM_TYPE_COUNT] = {
    GGUFLM_IQ_KERNEL_ENTRIES(_avx512vbmi)};
#undef gguflm_bits_32_avx512vbmi
#undef gguflm_hsum_i32_avx512vbmi
#undef gguflm_reduce8_512_avx512vbmi
#undef gguflm_ktile_gemm_avx512vbmi
#undef gguflm_pair_scales512_avx512vbmi
#include "simd_copy_end.inc"
GGUFLM_TARGET_END

/* the float formats once more with AVX512_BF16 (only its BF16 kernels: quants_float_simd.inc) */
#if GGUFLM_HAVE_DPBF16
GGUFLM_TARGET_AVX512BF16_BEGIN
#define GGUFLM_SIMD(name) gguflm_##name##_avx512bf16
#define GGUFLM_SIMD_VNNI 1
#define GGUFLM_SIMD_512 1
#define GGUFLM_SIMD_DPBF16 1
#define GGUFLM_SIMD_VBMI 0
#define GGUFLM_SIMD_AMX 0
#include "quants_float_simd.inc"
#include "simd_copy_end.inc"
GGUFLM_TARGET_END
#endif
#undef GGUFLM_TILE_LOOP
#undef GGUFLM_TILE_LOOP_4X4
#endif

#endif
