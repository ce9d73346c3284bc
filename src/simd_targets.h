/* The per-ISA copies of the kernels: the GCC target region of each ISA, and the intrinsics.
 *
 * A kernel module writes its SIMD kernels once, in an .inc fragment, and compiles the fragment once
 * per ISA (quants_simd.h: quants_dot_simd.inc and quants_iq_simd.inc; ops.h: ops_rows.inc), each
 * copy the same way:
 *
 *     GGUFLM_TARGET_AVX2_BEGIN                      (no region for a scalar copy)
 *     #define GGUFLM_SIMD(name) gguflm_##name##_avx2    the copy's names: gguflm_<name>_<isa>
 *     #define GGUFLM_SIMD_<FEATURE> 0 or 1             what the fragment may use beyond the base
 *     #include "<fragment>.inc"
 *     ... the copy's kernel table ...
 *     #include "simd_copy_end.inc"                  #undef GGUFLM_SIMD and every flag
 *     GGUFLM_TARGET_END
 *
 * No -march flag: callers pass the ISA that gguflm._ext.system selected from the CPU's features.
 * GGUFLM_HAVE_SIMD is 0 off x86 or without GCC's target pragmas (only the scalar copies exist),
 * GGUFLM_HAVE_AMX without a compiler that has the AMX intrinsics (GCC 11, clang 12), and
 * GGUFLM_HAVE_DPBF16 where vdpbf16ps is not the instruction itself.
 *
 * Test harnesses may define GGUFLM_SIMDE: the intrinsics then come from SIMDe's portable
 * implementations (with native aliases) and the target regions expand to nothing, so that every
 * copy, AVX-512 included, runs and can be checked on a CPU that lacks the instructions.
 */
#ifndef GGUFLM_SIMD_TARGETS_H
#define GGUFLM_SIMD_TARGETS_H

#if defined(GGUFLM_SIMDE)
#define GGUFLM_HAVE_SIMD 1
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#include <simde/x86/fma.h>
#include <simde/x86/gfni.h>
#define GGUFLM_TARGET_AVX2_BEGIN
#define GGUFLM_TARGET_AVX512_BEGIN
#define GGUFLM_TARGET_AVX512VBMI_BEGIN
#define GGUFLM_TARGET_END
#define GGUFLM_HAVE_DPBF16 0  /* SIMDe's vdpbf16ps rounds otherwise */
#define GGUFLM_FP16_TO_FP32_SIMD(h) gguflm_fp16_to_fp32(h)
#elif (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define GGUFLM_HAVE_SIMD 1
#include <immintrin.h>
#define GGUFLM_TARGET_AVX2_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,f16c\")")
#define GGUFLM_TARGET_AVX512_BEGIN \
    _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni\")")
#define GGUFLM_TARGET_AVX512BF16_BEGIN                                                                    \
    _Pragma("GCC push_options")                                                                         \
    _Pragma("GCC target(\"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16\")")
#define GGUFLM_TARGET_AVX512VBMI_BEGIN                                                                    \
    _Pragma("GCC push_options")                                                                         \
    _Pragma("GCC target(\"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,gfni,avx512bitalg\")")
/* AMX: GCC 11 and clang 12 have its intrinsics */
#if defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11
#define GGUFLM_HAVE_AMX 1
#define GGUFLM_TARGET_AMX_BEGIN                                                                           \
    _Pragma("GCC push_options")                                                                         \
    _Pragma("GCC target(\"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8\")")
#endif
#define GGUFLM_TARGET_END _Pragma("GCC pop_options")
#define GGUFLM_HAVE_DPBF16 1
/* F16C's scalar conversion; bit-identical with the software one */
#define GGUFLM_FP16_TO_FP32_SIMD(h) _cvtsh_ss(h)
#else
#define GGUFLM_HAVE_SIMD 0
#define GGUFLM_HAVE_DPBF16 0
#endif
#ifndef GGUFLM_HAVE_AMX
#define GGUFLM_HAVE_AMX 0   /* SIMDe, other compilers, off x86 */
#endif

#endif
