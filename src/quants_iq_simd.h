/* SIMD kernels of the grid i-quants, compiled with quants_simd_body.h once for AVX2 and once for
 * AVX-512 (GGUFLM_SIMD names each copy). The super-block is unpacked by the scalar code of
 * quants_iq.h (grid entries are table lookups either way); the integer dots then run on vectors
 * exactly as ggml's AVX2 vec_dot does them (magnitudes . activations with the signs applied by
 * xor/sub, vpmaddubsw, vpmaddwd by the scale of each 16), so the lanes, and the floats after them,
 * are the scalar reference's bit for bit. TILED sums the exact products in int16 x int16 pairs.
 * No include guard: this file is meant to be included more than once.
 */

/* DOT's lanes of one super-block against one activation block (delta: IQ1_M's second vector) */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(iq_lanes)(int type, const gguflm_iqblock *b,
                                                                       const block_q8_K *y, __m256i *lanes,
                                                                       __m256i *delta) {
    __m256i acc = _mm256_setzero_si256(), acc_d = _mm256_setzero_si256();
    for (int g = 0; g < QK_K / 32; ++g) {
        const __m256i q8 = _mm256_loadu_si256((const __m256i *)(y->qs + 32 * g));
        const __m256i neg = _mm256_loadu_si256((const __m256i *)(b->neg + 32 * g));
        const __m256i mag = _mm256_loadu_si256((const __m256i *)(b->mag + 32 * g));
        const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(b->sc[2 * g + 1]), _mm_set1_epi16(b->sc[2 * g]));
        const __m256i q8s = _mm256_sub_epi8(_mm256_xor_si256(q8, neg), neg);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(mag, q8s), sc));
        if (type == GGUFLM_IQ1_M) {
            const __m256i dneg = _mm256_loadu_si256((const __m256i *)(b->dneg + 32 * g));
            const __m256i q8d = _mm256_sub_epi8(_mm256_xor_si256(q8, dneg), dneg);
            acc_d = _mm256_add_epi32(acc_d, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q8d), sc));
        }
    }
    *lanes = acc;
    *delta = acc_d;
}

/* TILED's exact integer: sum of scale * value * activation */
static inline __attribute__((always_inline)) int32_t GGUFLM_SIMD(iq_tiled_int)(const gguflm_iqblock *b,
                                                                              const block_q8_K *y) {
    __m256i acc = _mm256_setzero_si256();
    for (int s = 0; s < QK_K / 16; ++s) {
        const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b->val + 16 * s)));
        const __m256i q = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(y->qs + 16 * s)));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_mullo_epi16(v, _mm256_set1_epi16(b->sc[s])), q));
    }
    return GGUFLM_SIMD(hsum_i32)(acc);
}

/* rows one by one, tokens in fours: each weight super-block is unpacked once per 4 tokens */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(iq_gemm)(int path, int type, size_t bx, int64_t n,
                                                                      const uint8_t *w, int64_t ws, int64_t nr,
                                                                      const uint8_t *y, int64_t ys, int64_t nt,
                                                                      float *o, int64_t os) {
    gguflm_iqblock b;
    for (int64_t r = 0; r < nr; ++r) {
        for (int64_t t0 = 0; t0 < nt; t0 += 4) {
            const int T = (int)(nt - t0 < 4 ? nt - t0 : 4);
            __m256 acc[4], acc2[4];
            float acc1[4], out[4];
            for (int k = 0; k < 4; ++k) {
                acc[k] = acc2[k] = _mm256_setzero_ps();
                acc1[k] = out[k] = 0.0f;
            }
            for (int64_t i = 0; i < n / QK_K; ++i) {
                gguflm_iq_unpack(type, w + r * ws + i * bx, &b);
                for (int k = 0; k < T; ++k) {
                    const block_q8_K *yb = (const block_q8_K *)(y + (t0 + k) * ys) + i;
                    if (path == GGUFLM_PATH_TILED) {
                        const float res = b.d * gguflm_iq_factor(type) * (float)GGUFLM_SIMD(iq_tiled_int)(&b, yb);
                        out[k] = fmaf(res, yb->d, out[k]);
                        continue;
                    }
                    __m256i lanes, delta;
                    GGUFLM_SIMD(iq_lanes)(type, &b, yb, &lanes, &delta);
                    const __m256 d = _mm256_set1_ps(b.d * yb->d);
                    acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[k]);
                    if (type == GGUFLM_IQ1_M) acc2[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(delta), acc2[k]);
                    if (type == GGUFLM_IQ1_S) {
                        int32_t sumi1 = 0;
                        for (int g = 0; g < 8; ++g)
                            sumi1 += (yb->bsums[2 * g] + yb->bsums[2 * g + 1]) * (b.dneg[32 * g] ? -1 : 1) * b.sc[2 * g];
                        acc1[k] = fmaf(b.d * yb->d, (float)sumi1, acc1[k]);
                    }
                }
            }
            for (int k = 0; k < T; ++k) {
                if (path != GGUFLM_PATH_TILED) {
                    float a[8], a2[8];
                    _mm256_storeu_ps(a, acc[k]);
                    _mm256_storeu_ps(a2, acc2[k]);
                    out[k] = gguflm_iq_dot_result(type, a, a2, acc1[k]);
                }
                o[(t0 + k) * os + r] = out[k];
            }
        }
    }
}

#define GGUFLM_IQ_SIMD_KERNELS(tag, TYPE)                                                                        \
    static void GGUFLM_SIMD(DOT_##tag)(int64_t n, const uint8_t *w, int64_t ws, int64_t nr, const uint8_t *y,    \
                                       int64_t ys, int64_t nt, float *o, int64_t os, int arith) {                \
        (void)arith;                                                                                             \
        GGUFLM_SIMD(iq_gemm)(GGUFLM_PATH_DOT, TYPE, sizeof(block_##tag), n, w, ws, nr, y, ys, nt, o, os);        \
    }                                                                                                            \
    static void GGUFLM_SIMD(TILED_##tag)(int64_t n, const uint8_t *w, int64_t ws, int64_t nr, const uint8_t *y,  \
                                         int64_t ys, int64_t nt, float *o, int64_t os, int arith) {              \
        (void)arith;                                                                                             \
        GGUFLM_SIMD(iq_gemm)(GGUFLM_PATH_TILED, TYPE, sizeof(block_##tag), n, w, ws, nr, y, ys, nt, o, os);      \
    }
GGUFLM_IQ_TYPES(GGUFLM_IQ_SIMD_KERNELS)
#undef GGUFLM_IQ_SIMD_KERNELS
