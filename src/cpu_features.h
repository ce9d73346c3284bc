/* Run-time CPU feature detection and build facts, read once by gguflm._ext.system. */
#ifndef GGUFLM_CPU_FEATURES_H
#define GGUFLM_CPU_FEATURES_H

#if defined(__x86_64__) || defined(__i386__)
#define GGUFLM_X86 1
/* __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0). */
static inline int gguflm_has_avx2(void) { __builtin_cpu_init(); return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
static inline int gguflm_has_f16c(void) { __builtin_cpu_init(); return __builtin_cpu_supports("f16c"); }
static inline int gguflm_has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
static inline int gguflm_has_avx512_vnni(void) { __builtin_cpu_init(); return __builtin_cpu_supports("avx512vnni"); }
#else
#define GGUFLM_X86 0
static inline int gguflm_has_avx2(void) { return 0; }
static inline int gguflm_has_f16c(void) { return 0; }
static inline int gguflm_has_avx512(void) { return 0; }
static inline int gguflm_has_avx512_vnni(void) { return 0; }
#endif

#if defined(__clang__)
#define GGUFLM_COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define GGUFLM_COMPILER "gcc " __VERSION__
#else
#define GGUFLM_COMPILER "unknown"
#endif

#endif
