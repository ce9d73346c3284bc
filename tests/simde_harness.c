/* Test harness: the kernel headers built on SIMDe's portable intrinsics, so the AVX2 and AVX-512
 * (+VNNI) dot kernels run on any CPU. tests/test_quants_simd_emulated.py compiles this into a
 * shared library at test time and calls it through ctypes. */
#define GGUFLM_SIMDE 1
/* make SIMDe's _mm*_fmadd_ps round once (through fmaf), as the FMA instructions do */
#define FP_FAST_FMAF 1
#include "quants_kernels.h"

/* *s = dot of n elements with the kernel of isa (0 scalar, 1 avx2, 2 avx512); 0 if none exists */
int gguflm_emulated_dot(int isa, int type, int64_t n, const void *x, const void *y, float *s) {
    const gguflm_vec_dot_fn *table = isa == 2 ? gguflm_dot_table_avx512 : isa == 1 ? gguflm_dot_table_avx2 : gguflm_dot_table_scalar;
    if (type < 0 || type >= GGUFLM_TYPE_COUNT || !table[type]) return 0;
    table[type](n, s, x, y);
    return 1;
}
