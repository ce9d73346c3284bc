/* AVX-512 batch GEMM tiles: the same floats as the DOT kernels of quants_simd_body.h, twice the
 * outputs per instruction. Included by quants_simd_body.h in its AVX-512 copy only
 * (GGUFLM_SIMD_512); the AVX2 copy keeps the 256-bit tiles. No include guard.
 *
 * ggml's DOT recipe of a legacy block keeps 8 float lanes per output (acc = fma(dx*dy, lanes, acc)
 * per 32-element block), so an output fills half a 512-bit vector: here the low half is weight
 * row r and the high half row r+1, against the same token. The integer lanes come from one
 * vpdpbusd per pair of rows (AVX-512 has no vpsignb, so signed weights take the offset form:
 * (y + 128) . x - 128 * sum4(x), computed exactly in int32 from the xor-ed activations and a
 * per-block correction of the weights), then one conversion, one multiply for the two scales
 * dx * dy and one fma: the float steps of each output are ggml's, in its order.
 * Every tile holds 2 row pairs x up to 8 tokens of accumulators in registers; the weight block is
 * decoded once per tile of tokens and the token's block loaded once for the 4 rows.
 */

/* tokens per table of the tokens' block scales (dy, and Q8_1's s) */
#define GGUFLM_GEMM_TOKENS 16
/* the tables' capacity: at most this many blocks per row go through the GEMM tiles */
#define GGUFLM_GEMM_MAX_BLOCKS 256
#ifndef GGUFLM_GEMM_T
#define GGUFLM_GEMM_T 8
#endif

/* the 32 quants of block xb0 (low 256 bits) and of xb1 (high 256 bits), as legacy_quants gives
 * them one at a time: signed (Q4_0, Q5_0, Q8_0) or unsigned (Q4_1, Q5_1) */
static inline __attribute__((always_inline)) __m512i GGUFLM_SIMD(legacy_pair)(int type, const uint8_t *xb0,
                                                                            const uint8_t *xb1) {
    if (type == GGUFLM_Q8_0)
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)((const block_q8_0 *)xb0)->qs)),
                                  _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)xb1)->qs), 1);
    /* each row's 16 bytes of nibbles twice, the second copy shifted right by 4 */
    const size_t qs = type == GGUFLM_Q4_0 ? offsetof(block_q4_0, qs) : type == GGUFLM_Q4_1 ? offsetof(block_q4_1, qs)
                      : type == GGUFLM_Q5_0 ? offsetof(block_q5_0, qs) : offsetof(block_q5_1, qs);
    const __m512i both = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xb0 + qs)))),
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xb1 + qs))), 1);
    const __m512i nib = _mm512_and_si512(_mm512_srlv_epi64(both, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)),
                                         _mm512_set1_epi8(0x0F));
    if (type == GGUFLM_Q4_0) return _mm512_sub_epi8(nib, _mm512_set1_epi8(8));
    if (type == GGUFLM_Q4_1) return nib;
    /* the fifth bits: bit e of qh is element e; row xb1's in the high 32 bits */
    const size_t qh = type == GGUFLM_Q5_0 ? offsetof(block_q5_0, qh) : offsetof(block_q5_1, qh);
    uint32_t h0, h1;
    memcpy(&h0, xb0 + qh, 4);
    memcpy(&h1, xb1 + qh, 4);
    const uint64_t h = (uint64_t)h0 | (uint64_t)h1 << 32;
    /* Q5_0: nibble + 16 * h - 16; Q5_1: nibble + 16 * h */
    if (type == GGUFLM_Q5_0) return _mm512_mask_sub_epi8(nib, (__mmask64)~h, nib, _mm512_set1_epi8(16));
    return _mm512_mask_add_epi8(nib, (__mmask64)h, nib, _mm512_set1_epi8(16));
}

/* lanes 0-7 = v[2p], lanes 8-15 = v[2p+1]: the two rows' scales of pair p */
static inline __m512 GGUFLM_SIMD(pair_scales)(__m128 v, int p) {
    const __m512i idx = _mm512_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p + 1, 2 * p + 1,
                                          2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
}

/* P row pairs (1 or 2) x T tokens (<= 8) of a legacy type (the loops over them unrolled by
 * pragma, as GCC does not by itself: Q8_0 and Q4_1 batches 5-10% faster). dy, sy: the tokens'
 * block scales d and s as floats, token t's block ib at [ib * GGUFLM_GEMM_TOKENS + t]. Q4_1 and Q5_1 also keep
 * ggml's scalar chain of the mins, summs = fma(m, s, summs), for the 4 rows x 4 tokens of a vector
 * (lane 4t + r). */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(legacy_gemm_tile)(int type, size_t bx, int64_t nb,
                                                                               const uint8_t *w, int64_t ws, int P,
                                                                               const uint8_t *y, int64_t ys, int T,
                                                                               const float *dy, const float *sy,
                                                                               float *out, int64_t os) {
    const int has_min = gguflm_legacy_has_min(type);
    const size_t by = has_min ? sizeof(block_q8_1) : sizeof(block_q8_0), qoff = has_min ? 4 : 2;
    const __m512i zero = _mm512_setzero_si512(), bias = _mm512_set1_epi8((char)0x80);
    /* lane 4t + r of the mins' vectors: row r's m, token t's s */
    const __m512i rows4 = _mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
    const __m512i toks4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 acc[2][8], summ[2];
    #pragma GCC unroll 2
    for (int p = 0; p < P; ++p)
        #pragma GCC unroll 8
        for (int t = 0; t < T; ++t) acc[p][t] = _mm512_setzero_ps();
    summ[0] = summ[1] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < nb; ++ib) {
        uint16_t dh[4] = {0}, mh[4] = {0};
        for (int r = 0; r < 2 * P; ++r) {
            const uint8_t *xb = w + r * ws + ib * bx;
            GGUFLM_SIMD(prefetch)(xb + GGUFLM_GEMM_TOKENS * ws, bx);
            memcpy(&dh[r], xb, 2);
            if (has_min) memcpy(&mh[r], xb + 2, 2);
        }
        const __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)dh));
        __m512i wq[2], corr[2];
        __m512 dx[2];
        #pragma GCC unroll 2
        for (int p = 0; p < P; ++p) {
            wq[p] = GGUFLM_SIMD(legacy_pair)(type, w + 2 * p * ws + ib * bx, w + (2 * p + 1) * ws + ib * bx);
            dx[p] = GGUFLM_SIMD(pair_scales)(d4, p);
            /* signed weights: -128 * (the 4 weights of each lane) */
            if (!has_min) corr[p] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, wq[p]));
        }
        const float *dyb = dy + ib * GGUFLM_GEMM_TOKENS;
        #pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            const __m256i qy256 = _mm256_loadu_si256((const __m256i *)(y + t * ys + ib * by + qoff));
            __m512i qy = _mm512_broadcast_i64x4(qy256);
            if (!has_min) qy = _mm512_xor_si512(qy, bias);
            const __m512 dyt = _mm512_set1_ps(dyb[t]);
            #pragma GCC unroll 2
            for (int p = 0; p < P; ++p) {
                const __m512i lanes = has_min ? _mm512_dpbusd_epi32(zero, wq[p], qy) : _mm512_dpbusd_epi32(corr[p], qy, wq[p]);
                acc[p][t] = _mm512_fmadd_ps(_mm512_mul_ps(dx[p], dyt), _mm512_cvtepi32_ps(lanes), acc[p][t]);
            }
        }
        if (has_min) {
            const __m512 mx = _mm512_permutexvar_ps(rows4, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)mh))));
            const float *syb = sy + ib * GGUFLM_GEMM_TOKENS;
            for (int g = 0; g < (T + 3) / 4; ++g) {
                const __m512 s4 = _mm512_maskz_loadu_ps((__mmask16)((1u << (T - 4 * g < 4 ? T - 4 * g : 4)) - 1), syb + 4 * g);
                summ[g] = _mm512_fmadd_ps(mx, _mm512_permutexvar_ps(toks4, s4), summ[g]);
            }
        }
    }
    float mins[8][4];
    _mm512_storeu_ps(&mins[0][0], summ[0]);
    _mm512_storeu_ps(&mins[4][0], summ[1]);
    #pragma GCC unroll 2
    for (int p = 0; p < P; ++p)
        #pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            const __m512 a = acc[p][t];
            out[t * os + 2 * p] = GGUFLM_SIMD(hsum_f32)(_mm512_castps512_ps256(a)) + (has_min ? mins[t][2 * p] : 0.0f);
            out[t * os + 2 * p + 1] = GGUFLM_SIMD(hsum_f32)(_mm512_extractf32x8_ps(a, 1)) + (has_min ? mins[t][2 * p + 1] : 0.0f);
        }
}

/* Tokens (any number) of a legacy type: 16 at a time, their block scales as floats in a
 * table, then tiles of 4 rows x 8 tokens (the leftovers in smaller ones; a last odd row in the
 * 256-bit tile). Returns 0 when the rows have too many blocks for the tables. */
static inline __attribute__((always_inline)) int GGUFLM_SIMD(legacy_gemm)(int type, size_t bx, int64_t n,
                                                                         const uint8_t *w, int64_t ws, int64_t nr,
                                                                         const uint8_t *y, int64_t ys, int64_t nt,
                                                                         float *o, int64_t os) {
    const int has_min = gguflm_legacy_has_min(type);
    const size_t by = has_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const int64_t nb = n / 32;
    if (nb > GGUFLM_GEMM_MAX_BLOCKS) return 0;
    float dy[GGUFLM_GEMM_MAX_BLOCKS * GGUFLM_GEMM_TOKENS], sy[GGUFLM_GEMM_MAX_BLOCKS * GGUFLM_GEMM_TOKENS];
    for (int64_t t0 = 0; t0 < nt; t0 += GGUFLM_GEMM_TOKENS) {
        const int tt = (int)(nt - t0 < GGUFLM_GEMM_TOKENS ? nt - t0 : GGUFLM_GEMM_TOKENS);
        const uint8_t *yt = y + t0 * ys;
        for (int t = 0; t < tt; ++t)
            for (int64_t ib = 0; ib < nb; ++ib) {
                const uint8_t *yb = yt + t * ys + ib * by;
                dy[ib * GGUFLM_GEMM_TOKENS + t] = GGUFLM_FP16_TO_FP32_SIMD(*(const ggml_half *)yb);
                if (has_min) sy[ib * GGUFLM_GEMM_TOKENS + t] = GGUFLM_FP16_TO_FP32_SIMD(((const block_q8_1 *)yb)->s);
            }
#define GGUFLM_GEMM_TILE(P, T)                                                                                    \
    GGUFLM_SIMD(legacy_gemm_tile)(type, bx, nb, w + r * ws, ws, P, yt + t * ys, ys, T, dy + t, sy + t,              \
                                  o + (t0 + t) * os + r, os)
#define GGUFLM_GEMM_ROWS(P)                                                                                       \
    do {                                                                                                          \
        int t = 0;                                                                                                \
        for (; t + GGUFLM_GEMM_T <= tt; t += GGUFLM_GEMM_T) GGUFLM_GEMM_TILE(P, GGUFLM_GEMM_T);                                                       \
        for (; t + 4 <= tt; t += 4) GGUFLM_GEMM_TILE(P, 4);                                                       \
        if (tt - t == 3) GGUFLM_GEMM_TILE(P, 3);                                                                  \
        else if (tt - t == 2) GGUFLM_GEMM_TILE(P, 2);                                                             \
        else if (tt - t == 1) GGUFLM_GEMM_TILE(P, 1);                                                             \
    } while (0)
        int64_t r = 0;
        for (; r + 4 <= nr; r += 4) GGUFLM_GEMM_ROWS(2);
        for (; r + 2 <= nr; r += 2) GGUFLM_GEMM_ROWS(1);
        for (; r < nr; ++r)
            for (int t = 0; t < tt; ++t)
                GGUFLM_SIMD(dot_legacy_tile)(type, bx, n, w + r * ws, ws, 1, yt + t * ys, ys, 1, NULL, NULL, 0,
                                             o + (t0 + t) * os + r, os);
#undef GGUFLM_GEMM_ROWS
#undef GGUFLM_GEMM_TILE
    }
    return 1;
}
