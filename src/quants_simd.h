/* The SIMD dot kernels: quants_simd_body.h compiled once for AVX2 (+FMA, F16C) and once for
 * AVX-512 with VNNI, each inside a GCC target region, each with its [path][type] kernel table (no
 * -march flag: callers pass the ISA that gguflm._ext.system selected from the CPU's features, and
 * gguflm_kernel_table maps it to a table). Off x86, or without GCC's target pragmas, only the
 * scalar kernels exist.
 *
 * Test harnesses may define GGUFLM_SIMDE: the intrinsics then come from SIMDe's portable
 * implementations (with native aliases) and the target regions expand to nothing, so that both
 * variants, AVX-512 included, run and can be checked on a CPU that lacks the instructions.
 */
#ifndef GGUFLM_QUANTS_SIMD_H
#define GGUFLM_QUANTS_SIMD_H

#include "quants_dot.h"
#include "cpu_features.h"

#if defined(GGUFLM_SIMDE)
#define GGUFLM_HAVE_SIMD 1
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#include <simde/x86/fma.h>
#define GGUFLM_TARGET_AVX2_BEGIN
#define GGUFLM_TARGET_AVX512_BEGIN
#define GGUFLM_TARGET_END
#define GGUFLM_FP16_TO_FP32_SIMD(h) gguflm_fp16_to_fp32(h)
#elif GGUFLM_X86 && defined(__GNUC__)
#define GGUFLM_HAVE_SIMD 1
#include <immintrin.h>
#define GGUFLM_TARGET_AVX2_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,f16c\")")
#define GGUFLM_TARGET_AVX512_BEGIN \
    _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni\")")
#define GGUFLM_TARGET_END _Pragma("GCC pop_options")
/* F16C's scalar conversion; bit-identical with the software one */
#define GGUFLM_FP16_TO_FP32_SIMD(h) _cvtsh_ss(h)
#else
#define GGUFLM_HAVE_SIMD 0
#endif

#if GGUFLM_HAVE_SIMD
GGUFLM_TARGET_AVX2_BEGIN
#define GGUFLM_SIMD(name) gguflm_##name##_avx2
#define GGUFLM_SIMD_VNNI 0
#define GGUFLM_SIMD_512 0
#include "quants_simd_body.h"
static const gguflm_gemm_fn gguflm_kernels_avx2[GGUFLM_PATH_COUNT][GGUFLM_TYPE_COUNT] = GGUFLM_KERNEL_TABLE(_avx2);
#undef GGUFLM_SIMD
#undef GGUFLM_SIMD_VNNI
#undef GGUFLM_SIMD_512
GGUFLM_TARGET_END

GGUFLM_TARGET_AVX512_BEGIN
#define GGUFLM_SIMD(name) gguflm_##name##_avx512
#define GGUFLM_SIMD_VNNI 1
#define GGUFLM_SIMD_512 1
#include "quants_simd_body.h"
static const gguflm_gemm_fn gguflm_kernels_avx512[GGUFLM_PATH_COUNT][GGUFLM_TYPE_COUNT] = GGUFLM_KERNEL_TABLE(_avx512);
#undef GGUFLM_SIMD
#undef GGUFLM_SIMD_VNNI
#undef GGUFLM_SIMD_512
GGUFLM_TARGET_END
#endif

#endif
