/* The one switch of every kernel: which instruction set (ISA) runs and which ggml x86 build's float
 * rounding is reproduced, with their names, declared once.
 *
 * gguflm._ext.system owns the only gguflm_dispatch and its setters (which check the CPU); it
 * publishes it as the PyCapsule GGUFLM_DISPATCH_CAPSULE. Every other extension binds a const
 * pointer to it at import (dispatch.pxd) and reads it when a call starts, passing the values down:
 * the kernels themselves take the ISA and the arithmetic as arguments and keep no state, so no
 * extension can run an ISA the others do not.
 */
#ifndef GGUFLM_DISPATCH_H
#define GGUFLM_DISPATCH_H

/* kernel variants, in increasing order of what they need (cpu_features.h says which); avx512bf16
 * is avx512 with vdpbf16ps itself in the BF16 dots of the arithmetics that use it, where the
 * others emulate it */
enum { GGUFLM_ISA_SCALAR = 0, GGUFLM_ISA_AVX2 = 1, GGUFLM_ISA_AVX512 = 2, GGUFLM_ISA_AVX512BF16 = 3, GGUFLM_ISA_COUNT = 4 };
static const char *const gguflm_isa_names[GGUFLM_ISA_COUNT] = {"scalar", "avx2", "avx512", "avx512bf16"};

/* Which x86 build of ggml-cpu the float arithmetic reproduces, as GCC compiles it natively
 * (-march=native) for a CPU family. The builds differ in the vectors of ggml's own SIMD code (8
 * floats with AVX2, 16 with AVX-512: lane orders of float dots and sums, the exp polynomial's
 * form), in how BF16 dots are computed (vdpbf16ps where the CPU has AVX512_BF16), and in the
 * vectors GCC's auto-vectorizer picks for plain loops (256 bits when tuning for Intel cores,
 * 512 for AMD Zen 4 and later), which decides the fused multiply-adds of vec_dot_f32's leftover
 * elements. The integer parts of quantized dots are the same in all. Any ISA computes any.
 *   avx2        AVX2 + FMA + F16C
 *   avx512      AVX-512 without AVX512_BF16 (Intel Skylake-SP to Ice Lake, Tiger Lake, Rocket Lake)
 *   avx512bf16  AVX-512 with AVX512_BF16, Intel tuning (Cooper Lake, Sapphire Rapids and later)
 *   zen4        AVX-512 with AVX512_BF16, AMD tuning (Zen 4 and later)
 * (AVX512_FP16 changes only ggml_vec_mad_f16/ggml_vec_scale_f16, used by flash attention, which
 * gguflm does not reproduce: its float dots still accumulate in fp32.) */
enum {
    GGUFLM_ARITH_AVX2 = 0,
    GGUFLM_ARITH_AVX512 = 1,
    GGUFLM_ARITH_AVX512BF16 = 2,
    GGUFLM_ARITH_ZEN4 = 3,
    GGUFLM_ARITH_COUNT = 4
};
static const char *const gguflm_arith_names[GGUFLM_ARITH_COUNT] = {"avx2", "avx512", "avx512bf16", "zen4"};

/* the facts that tell them apart: 16-float vectors; vdpbf16ps; the auto-vectorizer's floats; the
 * FMAs GCC's tuning makes of scalar sums */
static inline int gguflm_arith_avx512(int arith) { return arith != GGUFLM_ARITH_AVX2; }
static inline int gguflm_arith_dpbf16(int arith) {
    return arith == GGUFLM_ARITH_AVX512BF16 || arith == GGUFLM_ARITH_ZEN4;
}
static inline int gguflm_arith_autovec_lanes(int arith) { return arith == GGUFLM_ARITH_ZEN4 ? 16 : 8; }
/* whether GCC contracted a scalar sum carried through a loop, s = s + a * b, into an FMA: its
 * tuning for AMD Zen avoids such chains (avoid_fma_chains), its Intel tuning makes them (the
 * leftover block of ggml_vec_dot_{iq4_nl,mxfp4}_q8_0: a native build on Intel Sapphire Rapids
 * fuses it, on AMD Zen 4 not). An AVX2-only machine's native build fuses it where GCC tunes for
 * Intel; the avx2 arithmetic, which does not tell the two apart, keeps Zen's unfused form. */
static inline int gguflm_arith_fuses_loop_sums(int arith) {
    return arith == GGUFLM_ARITH_AVX512 || arith == GGUFLM_ARITH_AVX512BF16;
}

typedef struct {
    int isa;    /* GGUFLM_ISA_*, one this CPU and OS run */
    int arith;  /* GGUFLM_ARITH_* */
    int vbmi;   /* 1: the AVX-512 ISAs' grid i-quant kernels use AVX512_VBMI (only where it runs) */
    int amx;    /* 1: the AVX-512 ISAs' batch kernels that have an AMX variant use the tiles (only
                 * where the CPU has AMX-INT8, the OS enables it and the kernel granted the state) */
    int vendor; /* the machine's GGUFLM_VENDOR_* (cpu_features.h): where vbmi pays can depend on it */
} gguflm_dispatch;

#define GGUFLM_DISPATCH_CAPSULE "gguflm._ext.system._dispatch"

/* The switch this extension bound (dispatch.pxd's bind_dispatch), read by gguflm_kernel for vbmi
 * and amx alone: neither is an ISA of its own (CPUs have them with or without AVX512_BF16) but a
 * faster way to the same bits in a few AVX-512 kernels, so they are chosen where a kernel is
 * looked up, not passed down every call chain as isa and arith are; switching them mid-pass mixes
 * no results. */
static const gguflm_dispatch *gguflm_bound_dispatch __attribute__((unused));
static inline const gguflm_dispatch *gguflm_bind_dispatch(const void *d) {
    gguflm_bound_dispatch = (const gguflm_dispatch *)d;
    return gguflm_bound_dispatch;
}
static inline int gguflm_vbmi_on(void) { return gguflm_bound_dispatch && gguflm_bound_dispatch->vbmi; }
static inline int gguflm_amx_on(void) { return gguflm_bound_dispatch && gguflm_bound_dispatch->amx; }

#endif
