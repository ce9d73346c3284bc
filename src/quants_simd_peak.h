/* The int8 multiply-add peak that the batch kernels are measured against (gguflm bench kernels):
 * GGUFLM_INT8_PEAK_CHAINS independent accumulators, enough to hide the instruction's latency,
 * updated `iters` times; vpdpbusd on 512-bit vectors in the AVX-512 (VNNI) copy, vpmaddubsw +
 * vpmaddwd + vpaddd on 256-bit ones in the AVX2 copy. Returns a checksum so that the loop stays.
 * Included by quants_simd_body.h once per ISA; no include guard. */
#define GGUFLM_INT8_PEAK_CHAINS 24

static int32_t GGUFLM_SIMD(int8_peak)(int64_t iters) {
#if GGUFLM_SIMD_512
    __m512i acc[GGUFLM_INT8_PEAK_CHAINS], u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
    for (int i = 0; i < GGUFLM_INT8_PEAK_CHAINS; ++i) acc[i] = _mm512_set1_epi32(i);
    for (int64_t k = 0; k < iters; ++k) {
        for (int i = 0; i < GGUFLM_INT8_PEAK_CHAINS; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], u, s);
        __asm__ volatile("" : "+v"(u), "+v"(s));   /* the operands are not known constants */
    }
    __m512i t = acc[0];
    for (int i = 1; i < GGUFLM_INT8_PEAK_CHAINS; ++i) t = _mm512_add_epi32(t, acc[i]);
    return GGUFLM_SIMD(hsum_i32)(_mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1)));
#else
    __m256i acc[GGUFLM_INT8_PEAK_CHAINS], u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2), one = _mm256_set1_epi16(1);
    for (int i = 0; i < GGUFLM_INT8_PEAK_CHAINS; ++i) acc[i] = _mm256_set1_epi32(i);
    for (int64_t k = 0; k < iters; ++k) {
        for (int i = 0; i < GGUFLM_INT8_PEAK_CHAINS; ++i)
            acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), one));
        __asm__ volatile("" : "+x"(u), "+x"(s));
    }
    __m256i t = acc[0];
    for (int i = 1; i < GGUFLM_INT8_PEAK_CHAINS; ++i) t = _mm256_add_epi32(t, acc[i]);
    return GGUFLM_SIMD(hsum_i32)(t);
#endif
}

/* int8 operations (2 per multiply-add) of one int8_peak round */
#define GGUFLM_INT8_PEAK_OPS(wide) ((int64_t)GGUFLM_INT8_PEAK_CHAINS * ((wide) ? 128 : 64))
