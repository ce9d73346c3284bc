/* SIMD dot kernels, written once and compiled twice by quants_simd.h: as AVX2 (+FMA, F16C) and as
 * AVX-512 with VNNI (on 256-bit vectors through AVX512VL, as ggml's q8_0 dot). GGUFLM_SIMD(name)
 * gives each copy its own names; GGUFLM_SIMD_VNNI selects vpdpbusd for the legacy blocks' byte
 * dots where the AVX2 copy uses vpmaddubsw + vpmaddwd. Both forms give the same int32 lanes (4
 * adjacent products each; no pair can saturate int16 because the activation side never holds
 * -128), so the two copies agree bit for bit. The K-quant dots need the int16 pair sums for their
 * per-16 scales (vpmaddwd), so they use vpmaddubsw in both copies, as ggml does.
 * GGUFLM_SIMD_512 gives the AVX-512 copy 512-bit vectors for the 16-float chains of the AVX-512
 * arithmetics' float dots (the AVX2 copy uses pairs of 256-bit vectors; lane by lane the same).
 * No include guard: this file is meant to be included more than once.
 */

#include "quants_simd_float.h"  /* the float formats' kernels, and hsum_f32 */

/* horizontal sums (hsum_f32: quants_simd_float.h) */
static inline int32_t GGUFLM_SIMD(hsum_i32)(__m256i a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

#include "quants_simd_act.h"  /* the activation quantizers */
#include "quants_simd_peak.h"  /* the int8 peak loop of the kernels bench */

/* u (unsigned bytes) . s (signed bytes), 4 adjacent products per int32 lane */
static inline __m256i GGUFLM_SIMD(dot_u8_s8)(__m256i u, __m256i s) {
#if GGUFLM_SIMD_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* 16 bytes of nibbles -> 32 bytes: the low nibbles (elements 0..15), then the high ones */
static inline __m256i GGUFLM_SIMD(nibbles_32)(const uint8_t *qs) {
    /* the 16 bytes in both 128-bit lanes, the upper lane shifted right by 4 */
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

/* 32 bits -> 32 bytes, 0xFF where the bit is set */
static inline __m256i GGUFLM_SIMD(bits_32)(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

/* a legacy block's 32 quants: signed values (Q4_0/Q5_0/Q8_0) or unsigned ones (Q4_1/Q5_1) */
static inline __attribute__((always_inline)) __m256i GGUFLM_SIMD(legacy_quants)(int type, const uint8_t *xb) {
    switch (type) {
    case GGUFLM_Q4_0:
        return _mm256_sub_epi8(GGUFLM_SIMD(nibbles_32)(((const block_q4_0 *)xb)->qs), _mm256_set1_epi8(8));
    case GGUFLM_Q4_1:
        return GGUFLM_SIMD(nibbles_32)(((const block_q4_1 *)xb)->qs);
    case GGUFLM_Q5_0: {
        /* nibble | 0xF0 where the fifth bit is clear reads as the signed value nibble + 16*h - 16 */
        const block_q5_0 *b = (const block_q5_0 *)xb;
        const __m256i high = _mm256_andnot_si256(GGUFLM_SIMD(bits_32)(b->qh), _mm256_set1_epi8((char)0xF0));
        return _mm256_or_si256(GGUFLM_SIMD(nibbles_32)(b->qs), high);
    }
    case GGUFLM_Q5_1: {
        const block_q5_1 *b = (const block_q5_1 *)xb;
        const __m256i high = _mm256_and_si256(GGUFLM_SIMD(bits_32)(b->qh), _mm256_set1_epi8(0x10));
        return _mm256_or_si256(GGUFLM_SIMD(nibbles_32)(b->qs), high);
    }
    default:
        return _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)xb)->qs);
    }
}

/* the 32 unsigned quants of elements 32g .. 32g+31 of a K super-block (layouts: see gguflm_kunpack) */
static inline __attribute__((always_inline)) __m256i GGUFLM_SIMD(kquants)(int type, const uint8_t *xb, int g) {
    const __m256i m2 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    switch (type) {
    case GGUFLM_Q2_K:
    case GGUFLM_Q3_K: {
        const uint8_t *qs = type == GGUFLM_Q2_K ? ((const block_q2_K *)xb)->qs : ((const block_q3_K *)xb)->qs;
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * (g / 4)));
        __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * (g % 4)), m2);
        if (type == GGUFLM_Q3_K) {
            const __m256i hm = _mm256_loadu_si256((const __m256i *)((const block_q3_K *)xb)->hmask);
            u = _mm256_or_si256(u, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, g), one), 2));
        }
        return u;
    }
    case GGUFLM_Q4_K:
    case GGUFLM_Q5_K: {
        const uint8_t *qs = type == GGUFLM_Q4_K ? ((const block_q4_K *)xb)->qs : ((const block_q5_K *)xb)->qs;
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * (g / 2)));
        __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 4 * (g % 2)), m4);
        if (type == GGUFLM_Q5_K) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)((const block_q5_K *)xb)->qh);
            u = _mm256_or_si256(u, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, g), one), 4));
        }
        return u;
    }
    default: { /* Q6_K */
        const block_q6_K *b = (const block_q6_K *)xb;
        const int n = g / 4, sub = g % 4;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * n + 32 * (sub % 2)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * n));
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (sub / 2)), m4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * sub), m2);
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    }
    }
}

/* a K super-block's 16 scales and 16 mins (one per 16 elements, int16) and its d, dmin; the same
 * values as gguflm_kscales, decoded with vector instructions */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(kscales)(int type, const uint8_t *xb, __m256i *sc16,
                                                                      __m256i *mn16, float *d, float *dmin) {
    switch (type) {
    case GGUFLM_Q2_K: {
        const block_q2_K *b = (const block_q2_K *)xb;
        const __m128i s = _mm_loadu_si128((const __m128i *)b->scales);
        *sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s, _mm_set1_epi8(0x0F)));
        *mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(0x0F)));
        *d = GGUFLM_FP16_TO_FP32_SIMD(b->d);
        *dmin = GGUFLM_FP16_TO_FP32_SIMD(b->dmin);
        break;
    }
    case GGUFLM_Q3_K: {
        /* 32-bit words: low nibbles of scales 0-7 and 8-15 in words 0-1, two-bit highs in word 2 */
        const block_q3_K *b = (const block_q3_K *)xb;
        uint32_t w[3], s[4];
        memcpy(w, b->scales, 12);
        s[0] = (w[0] & 0x0f0f0f0f) | ((w[2] & 0x03030303) << 4);
        s[1] = (w[1] & 0x0f0f0f0f) | (((w[2] >> 2) & 0x03030303) << 4);
        s[2] = ((w[0] >> 4) & 0x0f0f0f0f) | (((w[2] >> 4) & 0x03030303) << 4);
        s[3] = ((w[1] >> 4) & 0x0f0f0f0f) | (((w[2] >> 6) & 0x03030303) << 4);
        const __m128i v = _mm_setr_epi32((int)s[0], (int)s[1], (int)s[2], (int)s[3]);
        *sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(v), _mm256_set1_epi16(32));
        *mn16 = _mm256_setzero_si256();
        *d = GGUFLM_FP16_TO_FP32_SIMD(b->d);
        *dmin = 0.0f;
        break;
    }
    case GGUFLM_Q4_K:
    case GGUFLM_Q5_K: {
        /* words: scales 0-3 | mins 0-3 (low six bits of bytes 0-7), then nibbles of bytes 8-11 with
         * the top two bits of bytes 0-7 give scales and mins 4-7 */
        const block_q4_K *b = (const block_q4_K *)xb;
        uint32_t w[3], s[4];
        memcpy(w, b->scales, 12);
        s[0] = w[0] & 0x3f3f3f3f;
        s[1] = (w[2] & 0x0f0f0f0f) | (((w[0] >> 6) & 0x03030303) << 4);
        s[2] = w[1] & 0x3f3f3f3f;
        s[3] = ((w[2] >> 4) & 0x0f0f0f0f) | (((w[1] >> 6) & 0x03030303) << 4);
        const __m128i v = _mm_setr_epi32((int)s[0], (int)s[1], (int)s[2], (int)s[3]);   /* scales 0-7, mins 0-7 */
        *sc16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(v, v));     /* each one twice: 32-element sub-blocks */
        *mn16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(v, v));
        *d = GGUFLM_FP16_TO_FP32_SIMD(b->d);
        *dmin = GGUFLM_FP16_TO_FP32_SIMD(b->dmin);
        break;
    }
    default: { /* Q6_K */
        const block_q6_K *b = (const block_q6_K *)xb;
        *sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        *mn16 = _mm256_setzero_si256();
        *d = GGUFLM_FP16_TO_FP32_SIMD(b->d);
        *dmin = 0.0f;
        break;
    }
    }
}

/* ======================= tiles: R weight rows x T tokens ======================= */

/* Every kernel below computes a tile of R rows x T tokens (GGUFLM_TILE_LOOP, quants_simd.h). */
#define GGUFLM_MAX_TOKENS 8   /* tokens of a legacy-block tile */

/* Weight rows are streamed from memory once per matmul; the hardware prefetchers follow one long
 * stream well but not R short interleaved ones (rows of a few hundred bytes), so each tile asks
 * for the same block of the rows one tile ahead. */
#ifndef GGUFLM_PREFETCH_TILES
#define GGUFLM_PREFETCH_TILES 4
#endif
static inline __attribute__((always_inline)) void GGUFLM_SIMD(prefetch)(const uint8_t *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)(p + o), _MM_HINT_T0);
}

/* ---- DOT, legacy blocks: 8 lanes of 4-product sums, acc = fma(dx*dy, lanes, acc) ----
 * yd, ysum (or NULL): the tokens' block scales d and (Q8_1) s as floats, token t's block ib at
 * [t * yf_stride + ib], converted once by dot_legacy for all the rows of a batch */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(dot_legacy_tile)(int type, size_t bx, int64_t n,
                                                                              const uint8_t *w, int64_t ws, int R,
                                                                              const uint8_t *y, int64_t ys, int T,
                                                                              const float *yd, const float *ysum,
                                                                              int64_t yf_stride, float *out,
                                                                              int64_t os) {
    const int has_min = gguflm_legacy_has_min(type);
    const size_t by = has_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    __m256 acc[GGUFLM_MAX_TILE][GGUFLM_MAX_TOKENS];
    float summs[GGUFLM_MAX_TILE][GGUFLM_MAX_TOKENS];
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps(), summs[r][t] = 0.0f;
    for (int64_t ib = 0; ib < n / 32; ++ib) {
        __m256i qx[GGUFLM_MAX_TILE], ux[GGUFLM_MAX_TILE];
        float dx[GGUFLM_MAX_TILE], mx[GGUFLM_MAX_TILE];
        for (int r = 0; r < R; ++r) {
            const uint8_t *xb = w + r * ws + ib * bx;
            GGUFLM_SIMD(prefetch)(xb + GGUFLM_PREFETCH_TILES * (R == 1 && T == 1 ? 4 : R) * ws, bx);
            qx[r] = GGUFLM_SIMD(legacy_quants)(type, xb);
            /* signed quants go in as |x| with x's sign moved onto y */
            ux[r] = has_min ? qx[r] : _mm256_sign_epi8(qx[r], qx[r]);
            dx[r] = GGUFLM_FP16_TO_FP32_SIMD(*(const ggml_half *)xb);
            if (has_min) mx[r] = GGUFLM_FP16_TO_FP32_SIMD(((const ggml_half *)xb)[1]);
        }
        for (int t = 0; t < T; ++t) {
            const uint8_t *yb = y + t * ys + ib * by;
            const __m256i qy = _mm256_loadu_si256((const __m256i *)(yb + (has_min ? 4 : 2)));
            const float dy = yd ? yd[t * yf_stride + ib] : GGUFLM_FP16_TO_FP32_SIMD(*(const ggml_half *)yb);
            for (int r = 0; r < R; ++r) {
                const __m256i p = GGUFLM_SIMD(dot_u8_s8)(ux[r], has_min ? qy : _mm256_sign_epi8(qy, qx[r]));
                acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dx[r] * dy), _mm256_cvtepi32_ps(p), acc[r][t]);
                if (has_min) {
                    const float sy = ysum ? ysum[t * yf_stride + ib] : GGUFLM_FP16_TO_FP32_SIMD(((const block_q8_1 *)yb)->s);
                    summs[r][t] = fmaf(mx[r], sy, summs[r][t]);
                }
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) out[t * os + r] = GGUFLM_SIMD(hsum_f32)(acc[r][t]) + summs[r][t];
}

/* One token against 4 weight rows of a type with mins (Q4_1, Q5_1; decode): the tile's arithmetic
 * for R = 4, T = 1, except that the rows' scales and mins are converted, multiplied by the token's
 * scale or accumulated with its sum as 4-lane vectors, lane r being row r's scalar operation (same
 * roundings), where the tile spends two conversions, a multiply and a scalar fma per row and block
 * (13% faster on a 1536x576 Q4_1 matrix; no gain for the types without mins). */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(dot_legacy_rows4)(int type, size_t bx, int64_t n,
                                                                               const uint8_t *w, int64_t ws,
                                                                               const uint8_t *y, float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m128 summs = _mm_setzero_ps();
    for (int64_t ib = 0; ib < n / 32; ++ib) {
        const uint8_t *x[4] = {w + ib * bx, w + ws + ib * bx, w + 2 * ws + ib * bx, w + 3 * ws + ib * bx};
        const block_q8_1 *yb = (const block_q8_1 *)y + ib;
        const __m256i qy = _mm256_loadu_si256((const __m256i *)yb->qs);
        /* each block starts with its half-precision d and m: both for the 4 rows into one vector */
        int32_t head[4];
        for (int r = 0; r < 4; ++r) memcpy(&head[r], x[r], 4);
        __m128i dm = _mm_cvtsi32_si128(head[0]);
        dm = _mm_insert_epi32(dm, head[1], 1);
        dm = _mm_insert_epi32(dm, head[2], 2);
        dm = _mm_insert_epi32(dm, head[3], 3);
        const __m128i d16 = _mm_shuffle_epi8(dm, _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1));
        const __m128i m16 = _mm_shuffle_epi8(dm, _mm_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1));
        float ddy[4];
        _mm_storeu_ps(ddy, _mm_mul_ps(_mm_cvtph_ps(d16), _mm_set1_ps(GGUFLM_FP16_TO_FP32_SIMD(yb->d))));
        summs = _mm_fmadd_ps(_mm_cvtph_ps(m16), _mm_set1_ps(GGUFLM_FP16_TO_FP32_SIMD(yb->s)), summs);
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
            GGUFLM_SIMD(prefetch)(x[r] + GGUFLM_PREFETCH_TILES * 4 * ws, bx);
            const __m256i p = GGUFLM_SIMD(dot_u8_s8)(GGUFLM_SIMD(legacy_quants)(type, x[r]), qy);
            acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&ddy[r]), _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    float mins[4];
    _mm_storeu_ps(mins, summs);
    for (int r = 0; r < 4; ++r) out[r] = GGUFLM_SIMD(hsum_f32)(acc[r]) + mins[r];
}

/* ---- K-quants: the integers of one super-block ---- */

/* int16 lanes 0-7 take the scale of elements 32g..32g+15, lanes 8-15 that of the next 16: the
 * 128-bit half of sc16 holding scales 2g, 2g+1 repeated in both lanes (the same two permutes for
 * every g of a super-block, which the compiler computes once), then one byte shuffle per g */
static inline __m256i GGUFLM_SIMD(kscale_pair)(__m256i sc16, int g) {
    const __m256i pair_spread = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                                 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    const __m256i half = g < 4 ? _mm256_permute2x128_si256(sc16, sc16, 0x00) : _mm256_permute2x128_si256(sc16, sc16, 0x11);
    return _mm256_shuffle_epi8(half, _mm256_add_epi8(pair_spread, _mm256_set1_epi8((char)(4 * (g % 4)))));
}

#if GGUFLM_SIMD_512
/* the 32 int16 scales of the vpmaddubsw pair sums of elements 16k .. 16k + 63, from sc16's one
 * scale per 16 elements (int16 lanes 8j .. 8j + 7 take scale k + j): one word permute. The
 * K-quants' pair of 32-element groups g, g + 1 (k = 2g) and the grid i-quants' 64 elements p
 * (k = 4p, quants_iq_simd512.h) */
static inline __m512i GGUFLM_SIMD(pair_scales512)(__m256i sc16, int k) {
    const __m512i idx = _mm512_add_epi16(_mm512_set_epi64(0x0003000300030003LL, 0x0003000300030003LL, 0x0002000200020002LL,
                                                          0x0002000200020002LL, 0x0001000100010001LL, 0x0001000100010001LL, 0, 0),
                                         _mm512_set1_epi16((short)k));
    return _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(sc16));
}
#endif

/* lanes[r][t]: the int32 lanes of ggml_vec_dot (gguflm_kints.lanes) of super-block i of weight
 * rows w + r*ws against tokens y + t*ys; part[r][t][p] (when part is given) the sum per 64
 * elements. Also each row's scales (sc16, mn16, d, dmin) for the epilogues. */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(k_ints)(int type, size_t bx, int64_t i, const uint8_t *w,
                                                                     int64_t ws, int R, const uint8_t *y, int64_t ys,
                                                                     int T, __m256i lanes[][GGUFLM_MAX_TILE],
                                                                     int32_t part[][GGUFLM_MAX_TILE][4], __m256i *sc16,
                                                                     __m256i *mn16, float *d, float *dmin) {
    const uint8_t *xb[GGUFLM_MAX_TILE];
    const block_q8_K *yb[GGUFLM_MAX_TILE];
    __m256i pair[GGUFLM_MAX_TILE][GGUFLM_MAX_TILE] = {{_mm256_setzero_si256()}};
    for (int r = 0; r < R; ++r) {
        xb[r] = w + r * ws + i * bx;
        GGUFLM_SIMD(prefetch)(xb[r] + GGUFLM_PREFETCH_TILES * R * ws, bx);
        GGUFLM_SIMD(kscales)(type, xb[r], &sc16[r], &mn16[r], &d[r], &dmin[r]);
        for (int t = 0; t < T; ++t) lanes[r][t] = _mm256_setzero_si256();
    }
    for (int t = 0; t < T; ++t) yb[t] = (const block_q8_K *)(y + t * ys) + i;
#if GGUFLM_SIMD_512
    /* two 32-element groups (2k: low half, 2k+1: high half) per 512-bit vector; lane l of each half
     * is the lane l of ggml's, so the halves added at the end give the same exact lanes, and a
     * vector's sum is the 64-element part */
    __m512i lanes2[GGUFLM_MAX_TILE][GGUFLM_MAX_TILE];
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) lanes2[r][t] = _mm512_setzero_si512();
    for (int g = 0; g < QK_K / 32; g += 2) {
        __m512i u[GGUFLM_MAX_TILE], sc[GGUFLM_MAX_TILE];
        for (int r = 0; r < R; ++r) {
            u[r] = _mm512_inserti64x4(_mm512_castsi256_si512(GGUFLM_SIMD(kquants)(type, xb[r], g)),
                                      GGUFLM_SIMD(kquants)(type, xb[r], g + 1), 1);
            sc[r] = GGUFLM_SIMD(pair_scales512)(sc16[r], 2 * g);
        }
        for (int t = 0; t < T; ++t) {
            const __m512i qy = _mm512_loadu_si512((const void *)(yb[t]->qs + 32 * g));
            const __m512i off = type == GGUFLM_Q3_K ? _mm512_maddubs_epi16(_mm512_set1_epi8(4), qy) : _mm512_setzero_si512();
            for (int r = 0; r < R; ++r) {
                __m512i p = _mm512_maddubs_epi16(u[r], qy);
                if (type == GGUFLM_Q3_K) p = _mm512_sub_epi16(p, off);
                const __m512i s = _mm512_madd_epi16(p, sc[r]);
                lanes2[r][t] = _mm512_add_epi32(lanes2[r][t], s);
                if (part)
                    part[r][t][g / 2] = GGUFLM_SIMD(hsum_i32)(_mm256_add_epi32(_mm512_castsi512_si256(s),
                                                                               _mm512_extracti64x4_epi64(s, 1)));
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t)
            lanes[r][t] = _mm256_add_epi32(_mm512_castsi512_si256(lanes2[r][t]), _mm512_extracti64x4_epi64(lanes2[r][t], 1));
    (void)pair;
#else
    for (int g = 0; g < QK_K / 32; ++g) {
        __m256i u[GGUFLM_MAX_TILE], sc[GGUFLM_MAX_TILE];
        for (int r = 0; r < R; ++r) {
            u[r] = GGUFLM_SIMD(kquants)(type, xb[r], g);
            sc[r] = GGUFLM_SIMD(kscale_pair)(sc16[r], g);
        }
        for (int t = 0; t < T; ++t) {
            const __m256i qy = _mm256_loadu_si256((const __m256i *)(yb[t]->qs + 32 * g));
            /* Q3_K's offset of 4 per element, in the same int16 pairs as the products */
            const __m256i off = type == GGUFLM_Q3_K ? _mm256_maddubs_epi16(_mm256_set1_epi8(4), qy) : _mm256_setzero_si256();
            for (int r = 0; r < R; ++r) {
                __m256i p = _mm256_maddubs_epi16(u[r], qy);
                if (type == GGUFLM_Q3_K) p = _mm256_sub_epi16(p, off);
                const __m256i s = _mm256_madd_epi16(p, sc[r]);
                lanes[r][t] = _mm256_add_epi32(lanes[r][t], s);
                if (part) {
                    /* groups 2p and 2p+1 make the p-th 64 elements */
                    if (g % 2 == 0) pair[r][t] = s;
                    else part[r][t][g / 2] = GGUFLM_SIMD(hsum_i32)(_mm256_add_epi32(pair[r][t], s));
                }
            }
        }
    }
#endif
    if (type == GGUFLM_Q6_K) {
        /* ggml multiplies the unsigned 6-bit quants and takes 32 * scale * bsums off each lane */
        for (int t = 0; t < T; ++t) {
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)yb[t]->bsums);
            for (int r = 0; r < R; ++r)
                lanes[r][t] = _mm256_sub_epi32(lanes[r][t], _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16[r]), 5));
        }
    }
}

/* min lanes mn[2l] bsums[2l] + mn[2l+1] bsums[2l+1] of super-block i for token row y */
static inline __m256i GGUFLM_SIMD(k_mins)(__m256i mn16, const uint8_t *y, int64_t i) {
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)((const block_q8_K *)y + i)->bsums), mn16);
}

/* ---- DOT, K-quants ---- */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(dot_k_tile)(int type, size_t bx, int64_t n,
                                                                         const uint8_t *w, int64_t ws, int R,
                                                                         const uint8_t *y, int64_t ys, int T,
                                                                         float *out, int64_t os) {
    __m256 acc[GGUFLM_MAX_TILE][GGUFLM_MAX_TILE];
    __m128 acc_m[GGUFLM_MAX_TILE][GGUFLM_MAX_TILE];
    float summs[GGUFLM_MAX_TILE][GGUFLM_MAX_TILE];
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps(), acc_m[r][t] = _mm_setzero_ps(), summs[r][t] = 0.0f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m256i lanes[GGUFLM_MAX_TILE][GGUFLM_MAX_TILE], sc16[GGUFLM_MAX_TILE], mn16[GGUFLM_MAX_TILE];
        float d[GGUFLM_MAX_TILE], dmin[GGUFLM_MAX_TILE];
        GGUFLM_SIMD(k_ints)(type, bx, i, w, ws, R, y, ys, T, lanes, NULL, sc16, mn16, d, dmin);
        for (int t = 0; t < T; ++t) {
            const float yd = ((const block_q8_K *)(y + t * ys))[i].d;
            for (int r = 0; r < R; ++r) {
                if (gguflm_k_has_min(type)) {
                    const float neg_dmin = -yd * dmin[r];
                    const __m256i mins = GGUFLM_SIMD(k_mins)(mn16[r], y + t * ys, i);
                    if (type == GGUFLM_Q2_K) {
                        acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(neg_dmin), _mm256_cvtepi32_ps(mins), acc[r][t]);
                    } else if (type == GGUFLM_Q4_K) {
                        /* 4 lanes of 32-element min sums: adjacent pairs of the 16-element lanes */
                        const __m256i pairs = _mm256_hadd_epi32(mins, mins);
                        const __m128i m4 = _mm_unpacklo_epi64(_mm256_castsi256_si128(pairs), _mm256_extracti128_si256(pairs, 1));
                        acc_m[r][t] = _mm_fmadd_ps(_mm_set1_ps(neg_dmin), _mm_cvtepi32_ps(m4), acc_m[r][t]);
                    } else {
                        summs[r][t] = fmaf((float)GGUFLM_SIMD(hsum_i32)(mins), neg_dmin, summs[r][t]);
                    }
                }
                acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(yd * d[r]), _mm256_cvtepi32_ps(lanes[r][t]), acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) {
            float m[4];
            _mm_storeu_ps(m, acc_m[r][t]);
            out[t * os + r] = GGUFLM_SIMD(hsum_f32)(acc[r][t]) + (type == GGUFLM_Q4_K ? gguflm_hsum4_movehl(m) : summs[r][t]);
        }
}

/* ---- TILED (K batches) and the repacked Q4_K GEMV/GEMM: whole integer sums, scalar float chains ---- */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(k_sums_tile)(int path, int type, size_t bx, int64_t n,
                                                                          const uint8_t *w, int64_t ws, int R,
                                                                          const uint8_t *y, int64_t ys, int T,
                                                                          float *out, int64_t os) {
    const int gemm = path == GGUFLM_PATH_Q4_K_GEMM;
    float acc[GGUFLM_MAX_TILE][GGUFLM_MAX_TILE], acc_min[GGUFLM_MAX_TILE][GGUFLM_MAX_TILE];
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) acc[r][t] = acc_min[r][t] = 0.0f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        __m256i lanes[GGUFLM_MAX_TILE][GGUFLM_MAX_TILE], sc16[GGUFLM_MAX_TILE], mn16[GGUFLM_MAX_TILE];
        int32_t part[GGUFLM_MAX_TILE][GGUFLM_MAX_TILE][4];
        float d[GGUFLM_MAX_TILE], dmin[GGUFLM_MAX_TILE];
        GGUFLM_SIMD(k_ints)(type, bx, i, w, ws, R, y, ys, T, lanes, gemm ? part : NULL, sc16, mn16, d, dmin);
        for (int t = 0; t < T; ++t) {
            const float yd = ((const block_q8_K *)(y + t * ys))[i].d;
            for (int r = 0; r < R; ++r) {
                const __m256i mins = GGUFLM_SIMD(k_mins)(mn16[r], y + t * ys, i);
                if (path == GGUFLM_PATH_TILED) {
                    acc[r][t] = gguflm_tiled_step(gguflm_k_has_min(type), d[r], dmin[r], GGUFLM_SIMD(hsum_i32)(lanes[r][t]),
                                                  gguflm_k_has_min(type) ? GGUFLM_SIMD(hsum_i32)(mins) : 0, yd, acc[r][t]);
                } else if (!gemm) {
                    acc[r][t] = fmaf((float)GGUFLM_SIMD(hsum_i32)(lanes[r][t]), d[r] * yd, acc[r][t]);
                    acc_min[r][t] = fmaf((float)GGUFLM_SIMD(hsum_i32)(mins), dmin[r] * yd, acc_min[r][t]);
                } else {
                    int32_t m[8];
                    _mm256_storeu_si256((__m256i *)m, mins);
                    const int parts = gguflm_k_repack_parts(path, type);
                    for (int p = 0; p < parts; ++p) {
                        int32_t sum = 0, min = 0;
                        for (int j = 4 / parts * p; j < 4 / parts * (p + 1); ++j) sum += part[r][t][j];
                        for (int j = 8 / parts * p; j < 8 / parts * (p + 1); ++j) min += m[j];
                        acc[r][t] = fmaf((float)sum, d[r] * yd, acc[r][t]);
                        acc_min[r][t] = fmaf((float)min, dmin[r] * yd, acc_min[r][t]);
                    }
                }
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) out[t * os + r] = acc[r][t] - acc_min[r][t];
}

/* ---- repacked Q4_K GEMV/GEMM over 8 rows at once: lane r of every vector is weight row r ----
 * ggml runs these on its 8-row interleaved copy of the weights with the float chains of the 8 rows
 * in the lanes of one vector; we keep the file's layout and get the same per-row integer sums by a
 * transposing reduction, so the float steps (those of gguflm_k_repack_1) run 8 rows per
 * instruction. parts: gguflm_k_repack_parts (Q2_K's 8x8 repack, AVX-512 builds, the same way). */

/* lane r = the sum of the 8 lanes of v[r] */
static inline __m256i GGUFLM_SIMD(reduce8_i32)(const __m256i v[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

#if GGUFLM_SIMD_512
/* lane r = the sum of the 16 lanes of v[r]: pairs of rows interleaved and added, twice, then the
 * four 128-bit quarters of rows 0-3 and of rows 4-7 added (one-uop shuffles only) */
static inline __m256i GGUFLM_SIMD(reduce8_512)(const __m512i v[8]) {
    __m512i ab[4], abcd[2];
    for (int k = 0; k < 4; ++k)   /* quarter q: [r0 + r2, s0 + s2, r1 + r3, s1 + s3] of rows 2k, 2k+1 */
        ab[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_epi32(v[2 * k], v[2 * k + 1]));
    for (int k = 0; k < 2; ++k)   /* quarter q: rows 4k .. 4k+3, each its quarter's sum */
        abcd[k] = _mm512_add_epi32(_mm512_unpacklo_epi64(ab[2 * k], ab[2 * k + 1]), _mm512_unpackhi_epi64(ab[2 * k], ab[2 * k + 1]));
    const __m512i half = _mm512_add_epi32(_mm512_shuffle_i32x4(abcd[0], abcd[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                          _mm512_shuffle_i32x4(abcd[0], abcd[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i q = _mm512_shuffle_i32x4(half, half, _MM_SHUFFLE(3, 1, 2, 0));
    return _mm256_add_epi32(_mm512_castsi512_si256(q), _mm512_extracti64x4_epi64(q, 1));
}
#endif

/* out[p] lane r = m[r] lanes 2p + 2p+1 (the four 64-element parts of per-32-element lanes) */
static inline void GGUFLM_SIMD(reduce8_pairs_i32)(const __m256i m[8], __m256i out[4]) {
    __m256 even[2], odd[2];
    for (int h = 0; h < 2; ++h) {
        /* [r p0, r p1, r+1 p0, r+1 p1 | r p2, r p3, r+1 p2, r+1 p3] for r = 4h, 4h+2 */
        const __m256 x = _mm256_castsi256_ps(_mm256_hadd_epi32(m[4 * h], m[4 * h + 1]));
        const __m256 y = _mm256_castsi256_ps(_mm256_hadd_epi32(m[4 * h + 2], m[4 * h + 3]));
        even[h] = _mm256_shuffle_ps(x, y, _MM_SHUFFLE(2, 0, 2, 0));   /* rows 4h..4h+3: [p0 | p2] */
        odd[h] = _mm256_shuffle_ps(x, y, _MM_SHUFFLE(3, 1, 3, 1));    /* [p1 | p3] */
    }
    out[0] = _mm256_castps_si256(_mm256_permute2f128_ps(even[0], even[1], 0x20));
    out[1] = _mm256_castps_si256(_mm256_permute2f128_ps(odd[0], odd[1], 0x20));
    out[2] = _mm256_castps_si256(_mm256_permute2f128_ps(even[0], even[1], 0x31));
    out[3] = _mm256_castps_si256(_mm256_permute2f128_ps(odd[0], odd[1], 0x31));
}

#define GGUFLM_Q4_K_TOKENS 16
static inline __attribute__((always_inline)) void GGUFLM_SIMD(q4_K_rows8_tile)(int type, size_t bx, int parts, int64_t n,
                                                                              const uint8_t *w, int64_t ws,
                                                                              const uint8_t *y, int64_t ys,
                                                                              int T, float *out, int64_t os) {
    __m256 acc[GGUFLM_Q4_K_TOKENS], acc_min[GGUFLM_Q4_K_TOKENS];
    for (int t = 0; t < T; ++t) acc[t] = acc_min[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        /* the 8 rows' quants and per-32 scale pairs, decoded once for all the tokens */
        __m256i u[8][QK_K / 32], sc[8][QK_K / 32], mn16[8];
        float d[8], dmin[8];
        for (int r = 0; r < 8; ++r) {
            const uint8_t *xb = w + r * ws + i * bx;
            GGUFLM_SIMD(prefetch)(xb + GGUFLM_PREFETCH_TILES * 8 * ws, bx);
            __m256i sc16;
            GGUFLM_SIMD(kscales)(type, xb, &sc16, &mn16[r], &d[r], &dmin[r]);
            for (int g = 0; g < QK_K / 32; ++g) {
                u[r][g] = GGUFLM_SIMD(kquants)(type, xb, g);
                sc[r][g] = GGUFLM_SIMD(kscale_pair)(sc16, g);
            }
        }
#if GGUFLM_SIMD_512
        __m512i u2[8][4], sc2[8][4];
        for (int r = 0; r < 8; ++r)
            for (int p = 0; p < 4; ++p) {
                u2[r][p] = _mm512_inserti64x4(_mm512_castsi256_si512(u[r][2 * p]), u[r][2 * p + 1], 1);
                sc2[r][p] = _mm512_inserti64x4(_mm512_castsi256_si512(sc[r][2 * p]), sc[r][2 * p + 1], 1);
            }
#endif
        const __m256 dv = _mm256_loadu_ps(d), dminv = _mm256_loadu_ps(dmin);
        for (int t = 0; t < T; ++t) {
            const block_q8_K *yb = (const block_q8_K *)(y + t * ys) + i;
            const __m256 yd = _mm256_set1_ps(yb->d);
            const __m256 scale = _mm256_mul_ps(dv, yd), scale_min = _mm256_mul_ps(dminv, yd);
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)yb->bsums);
            __m256i m[8], sums[4], mins[4];
            for (int r = 0; r < 8; ++r) m[r] = _mm256_madd_epi16(bsums, mn16[r]);
#if GGUFLM_SIMD_512
            /* a 64-element part (groups 2p, 2p+1) per 512-bit vector; its halves added, then the
             * same transposing reduction (integers: any order gives the same sums) */
            for (int p = 0; p < 4; ++p) {
                const __m512i qy = _mm512_loadu_si512((const void *)(yb->qs + 64 * p));
                __m512i v[8];
                for (int r = 0; r < 8; ++r) v[r] = _mm512_madd_epi16(_mm512_maddubs_epi16(u2[r][p], qy), sc2[r][p]);
                sums[p] = GGUFLM_SIMD(reduce8_512)(v);
            }
            if (parts == 1) sums[0] = _mm256_add_epi32(_mm256_add_epi32(sums[0], sums[1]), _mm256_add_epi32(sums[2], sums[3]));
            if (parts == 2) {   /* Q2_K: 128-element parts */
                sums[0] = _mm256_add_epi32(sums[0], sums[1]);
                sums[1] = _mm256_add_epi32(sums[2], sums[3]);
            }
#else
            for (int p = 0; p < parts; ++p) {
                const int g0 = (QK_K / 32 / parts) * p, g1 = g0 + QK_K / 32 / parts;
                __m256i v[8];
                for (int r = 0; r < 8; ++r) v[r] = _mm256_setzero_si256();
                for (int g = g0; g < g1; ++g) {
                    const __m256i qy = _mm256_loadu_si256((const __m256i *)(yb->qs + 32 * g));
                    for (int r = 0; r < 8; ++r)
                        v[r] = _mm256_add_epi32(v[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u[r][g], qy), sc[r][g]));
                }
                sums[p] = GGUFLM_SIMD(reduce8_i32)(v);
            }
#endif
            if (parts == 1) mins[0] = GGUFLM_SIMD(reduce8_i32)(m);
            else GGUFLM_SIMD(reduce8_pairs_i32)(m, mins);
            if (parts == 2) {   /* per 128 elements: pairs of the 64-element parts (exact) */
                mins[0] = _mm256_add_epi32(mins[0], mins[1]);
                mins[1] = _mm256_add_epi32(mins[2], mins[3]);
            }
            for (int p = 0; p < parts; ++p) {
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[p]), scale, acc[t]);
                acc_min[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins[p]), scale_min, acc_min[t]);
            }
        }
    }
    for (int t = 0; t < T; ++t) _mm256_storeu_ps(out + t * os, _mm256_sub_ps(acc[t], acc_min[t]));
}

#if GGUFLM_SIMD_512
#include "quants_simd_gemm.h"  /* AVX-512 batch tiles: two outputs per vector */
#endif
#include "quants_simd_ktile.h"  /* the K GEMM: 16 (AVX2: 8) rows per vector */
#if GGUFLM_SIMD_512
#include "quants_simd_strips.h"  /* AVX-512 legacy and ternary batches: 16 rows per vector */
#endif

/* TILED of a K-quant: batches through the K GEMM; fewer tokens in k_sums_tile's tiles of 1 row x
 * 4 tokens, over blocks of 16 tokens (the matmul hands the whole batch over: the rows of a block
 * stay in L1 while they meet its tokens) */
#define GGUFLM_K_TOKEN_BLOCK 16
static inline __attribute__((always_inline)) void GGUFLM_SIMD(tiled_k)(int type, size_t bx, int64_t n,
                                                                      const uint8_t *w, int64_t ws, int64_t nr,
                                                                      const uint8_t *y, int64_t ys, int64_t nt,
                                                                      float *o, int64_t os) {
    if (nt >= GGUFLM_KT_MIN_TOKENS) {
        GGUFLM_SIMD(ktile_gemm)(type, 0, bx, n, w, ws, nr, y, ys, nt, o, os);
        return;
    }
    for (int64_t t0 = 0; t0 < nt; t0 += GGUFLM_K_TOKEN_BLOCK) {
        const int64_t t1 = t0 + GGUFLM_K_TOKEN_BLOCK < nt ? t0 + GGUFLM_K_TOKEN_BLOCK : nt;
        for (int64_t r = 0; r < nr; ++r) {
            int64_t t = t0;
            for (; t + 4 <= t1; t += 4)
                GGUFLM_SIMD(k_sums_tile)(GGUFLM_PATH_TILED, type, bx, n, w + r * ws, ws, 1, y + t * ys, ys, 4, o + t * os + r, os);
            for (; t < t1; ++t)
                GGUFLM_SIMD(k_sums_tile)(GGUFLM_PATH_TILED, type, bx, n, w + r * ws, ws, 1, y + t * ys, ys, 1, o + t * os + r, os);
        }
    }
}

/* ======================= kernels: any rows x tokens, in tiles ======================= */

/* The legacy blocks' kernel: for a batch, the tokens' block scales are converted to floats once for
 * all the rows (when they fit the table; else each tile converts its own), and tiles take 8 tokens,
 * since decoding a weight block (Q5_0's bit unpacking especially) costs more than a dot. */
#define GGUFLM_LEGACY_TABLE 8192
static inline __attribute__((always_inline)) void GGUFLM_SIMD(dot_legacy)(int type, size_t bx, int64_t n,
                                                                         const uint8_t *w, int64_t ws, int64_t nr,
                                                                         const uint8_t *y, int64_t ys, int64_t nt,
                                                                         float *o, int64_t os, int stream) {
    const int has_min = gguflm_legacy_has_min(type);
    const size_t by = has_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const int64_t nb = n / 32;
#if GGUFLM_SIMD_512
    /* AVX-512: the GEMM tiles, two rows per vector, for batches and for single tokens (a Q5_0 or
     * Q4_1 row decodes ~40% faster than in the 256-bit tiles) except on a streamed matrix, whose
     * rows one at a time keep 2 threads at the memory's speed (Q8_0 262144x640: 37 GB/s, 31 in the
     * 4-row tiles) */
    if (nt > 1) {  /* whole strips of 16 rows, then the rest in the 2-row tiles */
        const int64_t done = GGUFLM_SIMD(strips_gemm)(type, bx, n, w, ws, nr, y, ys, nt, o, os);
        w += done * ws, o += done, nr -= done;
        if (nr == 0) return;
    }
    if ((nt > 1 || !stream) && GGUFLM_SIMD(legacy_gemm)(type, bx, n, w, ws, nr, y, ys, nt, o, os)) return;
#endif
    if (nt == 1) {
        /* 4 rows per tile share the activation's loads; a matrix streamed from memory (stream)
         * goes one row at a time, which the hardware prefetchers follow better */
        int64_t r = 0;
        if (!stream && has_min)
            for (; r + 4 <= nr; r += 4) GGUFLM_SIMD(dot_legacy_rows4)(type, bx, n, w + r * ws, ws, y, o + r);
        else if (!stream)
            for (; r + 4 <= nr; r += 4) GGUFLM_SIMD(dot_legacy_tile)(type, bx, n, w + r * ws, ws, 4, y, ys, 1, NULL, NULL, 0, o + r, os);
        for (; r < nr; ++r) GGUFLM_SIMD(dot_legacy_tile)(type, bx, n, w + r * ws, ws, 1, y, ys, 1, NULL, NULL, 0, o + r, os);
        return;
    }
    float table[GGUFLM_LEGACY_TABLE];
    const float *yd = NULL, *ysum = NULL;
    if (2 * nt * nb <= GGUFLM_LEGACY_TABLE) {
        for (int64_t t = 0; t < nt; ++t)
            for (int64_t ib = 0; ib < nb; ++ib) {
                const uint8_t *yb = y + t * ys + ib * by;
                table[t * nb + ib] = GGUFLM_FP16_TO_FP32_SIMD(*(const ggml_half *)yb);
                if (has_min) table[(nt + t) * nb + ib] = GGUFLM_FP16_TO_FP32_SIMD(((const block_q8_1 *)yb)->s);
            }
        yd = table;
        ysum = table + nt * nb;
    }
#define GGUFLM_LEGACY_TILE(T)                                                                                    \
    GGUFLM_SIMD(dot_legacy_tile)(type, bx, n, w + r * ws, ws, 1, y + t * ys, ys, T, yd ? yd + t * nb : NULL,      \
                                 ysum ? ysum + t * nb : NULL, nb, o + t * os + r, os)
    for (int64_t r = 0; r < nr; ++r) {
        int64_t t = 0;
        for (; t + 8 <= nt; t += 8) GGUFLM_LEGACY_TILE(8);
        for (; t + 4 <= nt; t += 4) GGUFLM_LEGACY_TILE(4);
        for (; t < nt; ++t) GGUFLM_LEGACY_TILE(1);
    }
#undef GGUFLM_LEGACY_TILE
}

/* the kernels of quantized weights round alike in every arithmetic. Its one user, the K DOT, takes a
 * single token row by row: in tiles of 4 rows its Q6_K rows of 2048 columns read at 9-13 GB/s on 2
 * threads (16 matrices of 5632 x 2048, each streamed once per pass), one by one at 18-28 (Q6_K
 * per-type model, tg64: 82-92 -> 140-169 t/s; Q3_K, Q5_K +10-25%); the float types keep their 4-row
 * tiles, which they read faster. */
#define GGUFLM_SIMD_KERNEL(path, tag, ...)                                                                       \
    static void GGUFLM_SIMD(path##_##tag)(int64_t n, const uint8_t *w, int64_t ws, int64_t nr, const uint8_t *y, \
                                          int64_t ys, int64_t nt, float *o, int64_t os, int arith) {             \
        (void)arith;                                                                                             \
        GGUFLM_TILE_LOOP_R(1, __VA_ARGS__);                                                                      \
    }
#define GGUFLM_SIMD_LEGACY(tag, TYPE)                                                                            \
    static void GGUFLM_SIMD(DOT_##tag)(int64_t n, const uint8_t *w, int64_t ws, int64_t nr, const uint8_t *y,    \
                                       int64_t ys, int64_t nt, float *o, int64_t os, int arith) {                \
        (void)arith;                                                                                             \
        GGUFLM_SIMD(dot_legacy)(TYPE, sizeof(block_##tag), n, w, ws, nr, y, ys, nt, o, os, 0);                   \
    }                                                                                                            \
    static void GGUFLM_SIMD(DOT_STREAM_##tag)(int64_t n, const uint8_t *w, int64_t ws, int64_t nr,               \
                                              const uint8_t *y, int64_t ys, int64_t nt, float *o, int64_t os,    \
                                              int arith) {                                                       \
        (void)arith;                                                                                             \
        GGUFLM_SIMD(dot_legacy)(TYPE, sizeof(block_##tag), n, w, ws, nr, y, ys, nt, o, os, 1);                   \
    }
#define GGUFLM_SIMD_K(tag, TYPE)                                                                                 \
    GGUFLM_SIMD_KERNEL(DOT, tag, GGUFLM_SIMD(dot_k_tile), TYPE, sizeof(block_##tag), n,)                         \
    static void GGUFLM_SIMD(TILED_##tag)(int64_t n, const uint8_t *w, int64_t ws, int64_t nr, const uint8_t *y,    \
                                         int64_t ys, int64_t nt, float *o, int64_t os, int arith) {              \
        (void)arith;                                                                                             \
        GGUFLM_SIMD(tiled_k)(TYPE, sizeof(block_##tag), n, w, ws, nr, y, ys, nt, o, os);                          \
    }
GGUFLM_SIMD_LEGACY(q4_0, GGUFLM_Q4_0)
GGUFLM_SIMD_LEGACY(q4_1, GGUFLM_Q4_1)
GGUFLM_SIMD_LEGACY(q5_0, GGUFLM_Q5_0)
GGUFLM_SIMD_LEGACY(q5_1, GGUFLM_Q5_1)
GGUFLM_SIMD_LEGACY(q8_0, GGUFLM_Q8_0)
GGUFLM_SIMD_K(q2_K, GGUFLM_Q2_K)
GGUFLM_SIMD_K(q3_K, GGUFLM_Q3_K)
GGUFLM_SIMD_K(q4_K, GGUFLM_Q4_K)
GGUFLM_SIMD_K(q5_K, GGUFLM_Q5_K)
GGUFLM_SIMD_K(q6_K, GGUFLM_Q6_K)
/* the GEMV (parts 1) of one token over 8 rows of Q4_K or Q2_K: the same integers and float steps
 * as q4_K_rows8_tile, but each row's quants go straight into its sum instead of being decoded for
 * a tile of tokens first (64 vectors of quants and 64 of scales do not fit the registers: a single token paid a
 * store and a reload for each) */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(q4_K_rows8_gemv1)(int type, size_t bx, int64_t n,
                                                                               const uint8_t *w, int64_t ws,
                                                                               const uint8_t *y, float *out) {
    __m256 acc = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const block_q8_K *yb = (const block_q8_K *)y + i;
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)yb->bsums);
        __m256i v[8], m[8];
        float d[8], dmin[8];
        for (int r = 0; r < 8; ++r) {
            const uint8_t *xb = w + r * ws + i * bx;
            GGUFLM_SIMD(prefetch)(xb + GGUFLM_PREFETCH_TILES * 8 * ws, bx);
            __m256i sc16, mn16;
            GGUFLM_SIMD(kscales)(type, xb, &sc16, &mn16, &d[r], &dmin[r]);
            m[r] = _mm256_madd_epi16(bsums, mn16);
            v[r] = _mm256_setzero_si256();
            for (int g = 0; g < QK_K / 32; ++g) {
                const __m256i qy = _mm256_loadu_si256((const __m256i *)(yb->qs + 32 * g));
                v[r] = _mm256_add_epi32(v[r], _mm256_madd_epi16(_mm256_maddubs_epi16(GGUFLM_SIMD(kquants)(type, xb, g), qy),
                                                                 GGUFLM_SIMD(kscale_pair)(sc16, g)));
            }
        }
        const __m256 yd = _mm256_set1_ps(yb->d);
        const __m256 scale = _mm256_mul_ps(_mm256_loadu_ps(d), yd), scale_min = _mm256_mul_ps(_mm256_loadu_ps(dmin), yd);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(GGUFLM_SIMD(reduce8_i32)(v)), scale, acc);
        acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(GGUFLM_SIMD(reduce8_i32)(m)), scale_min, acc_min);
    }
    _mm256_storeu_ps(out, _mm256_sub_ps(acc, acc_min));
}

/* a batch of the repacked Q4_K or Q2_K (GEMM, parts > 1) through the AVX-512 copy's GEMM
 * (quants_simd_ktile.h); returns 0 where that does not apply */
static inline __attribute__((always_inline)) int GGUFLM_SIMD(k_repack_gemm)(int type, int parts, size_t bx, int64_t n,
                                                                           const uint8_t *w, int64_t ws, int64_t nr,
                                                                           const uint8_t *y, int64_t ys, int64_t nt,
                                                                           float *o, int64_t os) {
    if (parts > 1 && nt >= GGUFLM_KT_MIN_REPACK) {
        GGUFLM_SIMD(ktile_gemm)(type, parts, bx, n, w, ws, nr, y, ys, nt, o, os);
        return 1;
    }
    return 0;
}

/* repacked Q4_K (and Q2_K): batches as above; else rows in groups of 8 (the plan only repacks
 * matrices of 8k rows), any others one by one */
#define GGUFLM_SIMD_Q4_K_REPACK(path, tag, TYPE)                                                                 \
    static void GGUFLM_SIMD(path##_##tag)(int64_t n, const uint8_t *w, int64_t ws, int64_t nr, const uint8_t *y, \
                                          int64_t ys, int64_t nt, float *o, int64_t os, int arith) {             \
        (void)arith;                                                                                             \
        const int parts = gguflm_k_repack_parts(GGUFLM_PATH_##path, TYPE);                                       \
        if (GGUFLM_SIMD(k_repack_gemm)(TYPE, parts, sizeof(block_##tag), n, w, ws, nr, y, ys, nt, o, os)) return; \
        for (int64_t t = 0; t < nt; t += GGUFLM_Q4_K_TOKENS) {                                                   \
            const int T = (int)(nt - t < GGUFLM_Q4_K_TOKENS ? nt - t : GGUFLM_Q4_K_TOKENS);                    \
            int64_t r = 0;                                                                                       \
            if (parts == 1 && T == 1)                                                                            \
                for (; r + 8 <= nr; r += 8)                                                                      \
                    GGUFLM_SIMD(q4_K_rows8_gemv1)(TYPE, sizeof(block_##tag), n, w + r * ws, ws, y + t * ys,      \
                                                  o + t * os + r);                                               \
            for (; r + 8 <= nr; r += 8)                                                                          \
                GGUFLM_SIMD(q4_K_rows8_tile)(TYPE, sizeof(block_##tag), parts, n, w + r * ws, ws, y + t * ys, ys, T, \
                                             o + t * os + r, os);                                                \
            for (; r < nr; ++r)                                                                                  \
                for (int k = 0; k < T; ++k)                                                                      \
                    GGUFLM_SIMD(k_sums_tile)(GGUFLM_PATH_##path, TYPE, sizeof(block_##tag), n, w + r * ws, ws, 1, \
                                             y + (t + k) * ys, ys, 1, o + (t + k) * os + r, os);                 \
        }                                                                                                        \
    }
GGUFLM_SIMD_Q4_K_REPACK(Q4_K_GEMV, q4_K, GGUFLM_Q4_K)
GGUFLM_SIMD_Q4_K_REPACK(Q4_K_GEMM, q4_K, GGUFLM_Q4_K)
GGUFLM_SIMD_Q4_K_REPACK(Q4_K_GEMV, q2_K, GGUFLM_Q2_K)
GGUFLM_SIMD_Q4_K_REPACK(Q4_K_GEMM, q2_K, GGUFLM_Q2_K)
#undef GGUFLM_SIMD_Q4_K_REPACK
#include "quants_simd_lut.h"  /* issue 15's value-table and ternary formats */
#include "quants_simd_repack.h"  /* repacked Q4_0, IQ4_NL, MXFP4 */
#undef GGUFLM_SIMD_K
#undef GGUFLM_SIMD_LEGACY
#undef GGUFLM_SIMD_KERNEL
#undef GGUFLM_MAX_TOKENS
#undef GGUFLM_LEGACY_TABLE
#undef GGUFLM_Q4_K_TOKENS
#undef GGUFLM_K_TOKEN_BLOCK
#undef GGUFLM_KT_SB
#undef GGUFLM_KT_T
#undef GGUFLM_KT_T_PARTS
#undef GGUFLM_KT_MIN_TOKENS
#undef GGUFLM_KT_MIN_REPACK
#undef GGUFLM_KT_TOKENS
#undef GGUFLM_KT_W
#undef GGUFLM_KT_SIGNED
#undef gguflm_kt_vi
#undef gguflm_kt_vf
#undef gguflm_kt_zero
#undef gguflm_kt_set1
#undef gguflm_kt_load
#undef gguflm_kt_dot
#undef gguflm_kt_dot16
#undef gguflm_kt_add
#undef gguflm_kt_mullo
#undef gguflm_kt_zerof
#undef gguflm_kt_set1f
#undef gguflm_kt_loadf
#undef gguflm_kt_storef
#undef gguflm_kt_cvt
#undef gguflm_kt_mulf
#undef gguflm_kt_fma
#undef gguflm_kt_subf
