/* The int8 multiply-add peak that the batch kernels are measured against (gguflm bench kernels):
 * independent accumulators, enough to hide the instruction's latency, updated `iters` times;
 * vpdpbusd on 512-bit vectors in the AVX-512 (VNNI) copy (12 chains), vpmaddubsw + vpmaddwd +
 * vpaddd on 256-bit ones in the AVX2 copy (8 chains, within its 16 registers). The chains are
 * named variables, not an array: GCC kept an array of 24 vectors on the stack, a load and a
 * store per step, which read half the real peak. Returns a checksum so that the loop stays.
 * Included by quants_simd_body.h once per ISA; no include guard. */
#define GGUFLM_PEAK_8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
#define GGUFLM_PEAK_12(M) GGUFLM_PEAK_8(M) M(8) M(9) M(10) M(11)
#ifndef GGUFLM_INT8_PEAK_OPS
/* v made opaque to the compiler: in a register of class c natively; SIMDe's vectors are structs,
 * which only a memory operand takes (its test harness, built at -O0, refused "v" and "x") */
#ifdef GGUFLM_SIMDE
#define GGUFLM_PEAK_OPAQUE(v, c) __asm__ volatile("" : "+m"(v))
#else
#define GGUFLM_PEAK_OPAQUE(v, c) __asm__ volatile("" : "+" c(v))
#endif
/* int8 operations (2 per multiply-add) of one int8_peak round: 12 chains x 64, or 8 x 32 */
#define GGUFLM_INT8_PEAK_OPS(wide) ((wide) ? (int64_t)12 * 128 : (int64_t)8 * 64)
#endif

static int32_t GGUFLM_SIMD(int8_peak)(int64_t iters) {
#if GGUFLM_SIMD_512
    __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
#define GGUFLM_PEAK_INIT(i) __m512i a##i = _mm512_set1_epi32(i);
#define GGUFLM_PEAK_STEP(i) a##i = _mm512_dpbusd_epi32(a##i, u, s);
#define GGUFLM_PEAK_SUM(i) t = _mm512_add_epi32(t, a##i);
    GGUFLM_PEAK_12(GGUFLM_PEAK_INIT)
    for (int64_t k = 0; k < iters; ++k) {
        GGUFLM_PEAK_12(GGUFLM_PEAK_STEP)
        GGUFLM_PEAK_OPAQUE(u, "v");   /* the operands are not known constants */
        GGUFLM_PEAK_OPAQUE(s, "v");
    }
    __m512i t = _mm512_setzero_si512();
    GGUFLM_PEAK_12(GGUFLM_PEAK_SUM)
    return GGUFLM_SIMD(hsum_i32)(_mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1)));
#else
    __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2), one = _mm256_set1_epi16(1);
#define GGUFLM_PEAK_INIT(i) __m256i a##i = _mm256_set1_epi32(i);
    /* the asm makes each chain's vpmaddubsw its own (without it the 8 would be one, reused) */
#define GGUFLM_PEAK_STEP(i)                          \
    GGUFLM_PEAK_OPAQUE(u, "x");                      \
    a##i = _mm256_add_epi32(a##i, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), one));
#define GGUFLM_PEAK_SUM(i) t = _mm256_add_epi32(t, a##i);
    GGUFLM_PEAK_8(GGUFLM_PEAK_INIT)
    for (int64_t k = 0; k < iters; ++k) {
        GGUFLM_PEAK_8(GGUFLM_PEAK_STEP)
    }
    __m256i t = _mm256_setzero_si256();
    GGUFLM_PEAK_8(GGUFLM_PEAK_SUM)
    return GGUFLM_SIMD(hsum_i32)(t);
#endif
#undef GGUFLM_PEAK_INIT
#undef GGUFLM_PEAK_STEP
#undef GGUFLM_PEAK_SUM
}
#undef GGUFLM_PEAK_8
#undef GGUFLM_PEAK_12

