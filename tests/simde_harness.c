/* Test harness: the kernel headers built on SIMDe's portable intrinsics, so the AVX2 and AVX-512
 * (+VNNI) dot kernels run on any CPU. tests/test_quants_simd_emulated.py compiles this into a
 * shared library at test time and calls it through ctypes. */
#define GGUFLM_SIMDE 1
/* make SIMDe's _mm*_fmadd_ps round once (through fmaf), as the FMA instructions do */
#define FP_FAST_FMAF 1
#include "quants_kernels.h"

/* the dispatch's vbmi and vendor as gguflm_kernel reads them: harness isa 3 is avx512 with VBMI
 * on, 4 avx2 on an Intel core (the 3-bit grids' gathering kernels) */
static gguflm_dispatch gguflm_harness_switch;
static int gguflm_harness_isa(int isa) {
    gguflm_harness_switch.vbmi = isa == 3;
    gguflm_harness_switch.vendor = isa == 4 ? GGUFLM_VENDOR_INTEL : GGUFLM_VENDOR_OTHER;
    gguflm_bind_dispatch(&gguflm_harness_switch);
    return isa == 3 ? GGUFLM_ISA_AVX512 : isa == 4 ? GGUFLM_ISA_AVX2 : isa;
}

/* whether gguflm_kernel gives, on a machine of vendor (GGUFLM_VENDOR_*), the VBMI kernel of `path`
 * for `type` (avx512 with the dispatch's vbmi on; avx2: the gathering kernel) */
int gguflm_emulated_picks_special(int avx2, int vendor, int path, int type) {
    gguflm_harness_isa(avx2 ? 1 : 3);
    gguflm_harness_switch.vendor = vendor;
    const gguflm_gemm_fn f = gguflm_kernel(avx2 ? GGUFLM_ISA_AVX2 : GGUFLM_ISA_AVX512, path, type);
    gguflm_harness_switch.vendor = GGUFLM_VENDOR_OTHER;
    return f != NULL && f == (avx2 ? gguflm_iq_kernels_avx2gather : gguflm_iq_kernels_avx512vbmi)[path][type];
}

/* *s = dot of n elements with the DOT kernel of isa (0 scalar, 1 avx2, 2 avx512, 3 avx512 with
 * VBMI, 4 avx2 on Intel) in arithmetic arith (GGUFLM_ARITH_*); 0 if none exists */
int gguflm_emulated_dot(int isa, int arith, int type, int64_t n, const void *x, const void *y, float *s) {
    isa = gguflm_harness_isa(isa);
    if (type < 0 || type >= GGUFLM_TYPE_COUNT || !gguflm_kernel(isa, GGUFLM_PATH_DOT, type)) return 0;
    gguflm_kernel(isa, GGUFLM_PATH_DOT, type)(n, x, 0, 1, y, 0, 1, s, 0, arith);
    return 1;
}

/* the matmul driver on isa's kernels, given directly: gguflm._ext.system would refuse AVX-512 on a
 * CPU without it, and emulation makes it safe */
void gguflm_emulated_matmul(int isa, int arith, int wtype, const void *w, int64_t w_stride, int64_t n_rows,
                            int64_t n_in, const void *xq, int64_t n_tok, float *out, int n_threads) {
    isa = gguflm_harness_isa(isa);
    gguflm_matmul_q(wtype, w, w_stride, n_rows, n_in, xq, n_tok, out, n_rows, 1, isa, arith, n_threads);
}

/* the software fp16 row conversions (GGUFLM_SIMDE builds leave out the F16C ones) */
void gguflm_software_fp32_to_fp16(const float *x, ggml_half *y, int64_t n) { gguflm_fp32_to_fp16_row(x, y, n); }
void gguflm_software_fp16_to_fp32(const ggml_half *x, float *y, int64_t n) { gguflm_fp16_to_fp32_row(x, y, n); }
