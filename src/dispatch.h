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

/* kernel variants, in increasing order of what they need (cpu_features.h says which) */
enum { GGUFLM_ISA_SCALAR = 0, GGUFLM_ISA_AVX2 = 1, GGUFLM_ISA_AVX512 = 2, GGUFLM_ISA_COUNT = 3 };
static const char *const gguflm_isa_names[GGUFLM_ISA_COUNT] = {"scalar", "avx2", "avx512"};

/* Which x86 build of ggml-cpu the float arithmetic reproduces: the AVX2 build (8-float vectors)
 * or the AVX-512 build (16-float vectors). They sum vector lanes and compute exp differently;
 * the integer parts of quantized dots are the same. Any ISA computes either. */
enum { GGUFLM_ARITH_AVX2 = 0, GGUFLM_ARITH_AVX512 = 1, GGUFLM_ARITH_COUNT = 2 };
static const char *const gguflm_arith_names[GGUFLM_ARITH_COUNT] = {"avx2", "avx512"};

typedef struct {
    int isa;    /* GGUFLM_ISA_*, one this CPU and OS run */
    int arith;  /* GGUFLM_ARITH_* */
} gguflm_dispatch;

#define GGUFLM_DISPATCH_CAPSULE "gguflm._ext.system._dispatch"

#endif
