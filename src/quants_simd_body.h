/* SIMD dot kernels, written once and compiled twice by quants_simd.h: as AVX2 (+FMA, F16C) and as
 * AVX-512 with VNNI (on 256-bit vectors through AVX512VL, as ggml's q8_0 dot). GGUFLM_SIMD(name)
 * gives each copy its own names; GGUFLM_SIMD_VNNI selects vpdpbusd for the legacy blocks' byte
 * dots where the AVX2 copy uses vpmaddubsw + vpmaddwd. Both forms give the same int32 lanes (4
 * adjacent products each; no pair can saturate int16 because the activation side never holds
 * -128), so the two copies agree bit for bit. The K-quant dots need the int16 pair sums for their
 * per-16 scales (vpmaddwd), so they use vpmaddubsw in both copies, as ggml does.
 * No include guard: this file is meant to be included more than once.
 */

/* horizontal sums */
static inline float GGUFLM_SIMD(hsum_f32)(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline int32_t GGUFLM_SIMD(hsum_i32)(__m256i a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

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

/* the block scales for nt tokens at once, as dxy[t] = dx * dy_t broadcast; for Q4_1/Q5_1 also
 * summs lane 2t+1 += mx * sy_t (one fma, the same single rounding for every ISA). The activation
 * blocks' halves (d, or d and s) of all tokens go through one vcvtph2ps. */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(legacy_scales)(int has_min, const uint8_t *xb,
                                                                            const uint8_t *y0, int64_t y_stride, int nt,
                                                                            __m256 *dxy, __m256 *summs) {
    if (has_min) {
        /* literal lane numbers: the insert instructions take immediates (GGUFLM_DOT_TOKENS is 4) */
        uint32_t ds[GGUFLM_DOT_TOKENS] = {0};
        for (int t = 0; t < nt; ++t) memcpy(&ds[t], y0 + t * y_stride, 4);
        __m128i halves = _mm_cvtsi32_si128((int)ds[0]);
        if (nt > 1) halves = _mm_insert_epi32(halves, (int)ds[1], 1);
        if (nt > 2) halves = _mm_insert_epi32(halves, (int)ds[2], 2);
        if (nt > 3) halves = _mm_insert_epi32(halves, (int)ds[3], 3);
        const __m256 v = _mm256_cvtph_ps(halves);                        /* [dy0 sy0 dy1 sy1 ...] */
        uint32_t dm;
        memcpy(&dm, xb, 4);
        const __m128 xdm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dm));   /* [dx mx 0 0] */
        const __m256 xv = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(xdm)));
        const __m256 prod = _mm256_mul_ps(xv, v);                        /* even lanes: dx*dy_t */
        *summs = _mm256_fmadd_ps(xv, v, *summs);                          /* odd lanes: += mx*sy_t */
        for (int t = 0; t < nt; ++t) dxy[t] = _mm256_permutevar8x32_ps(prod, _mm256_set1_epi32(2 * t));
    } else if (nt == 1) {
        dxy[0] = _mm256_set1_ps(GGUFLM_FP16_TO_FP32_SIMD(*(const ggml_half *)xb) * GGUFLM_FP16_TO_FP32_SIMD(*(const ggml_half *)y0));
    } else {
        ggml_half d[GGUFLM_DOT_TOKENS] = {0};
        for (int t = 0; t < nt; ++t) d[t] = *(const ggml_half *)(y0 + t * y_stride);
        __m128i halves = _mm_cvtsi32_si128(d[0]);
        if (nt > 1) halves = _mm_insert_epi16(halves, d[1], 1);
        if (nt > 2) halves = _mm_insert_epi16(halves, d[2], 2);
        if (nt > 3) halves = _mm_insert_epi16(halves, d[3], 3);
        const __m128 prod = _mm_mul_ps(_mm_cvtph_ps(halves), _mm_set1_ps(GGUFLM_FP16_TO_FP32_SIMD(*(const ggml_half *)xb)));
        for (int t = 0; t < nt; ++t) dxy[t] = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(prod), _mm256_set1_epi32(t));
    }
}

/* block ib of one weight row against nt activation rows: acc[t] += dx*dy_t * (x . y_t) lanes,
 * summs lane 2t+1 += mx*sy_t (Q4_1/Q5_1) */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(legacy_block)(int type, const uint8_t *xb, const uint8_t *y0,
                                                                           int64_t y_stride, int nt, __m256 *acc,
                                                                           __m256 *summs) {
    const int has_min = gguflm_legacy_has_min(type);
    const __m256i qx = GGUFLM_SIMD(legacy_quants)(type, xb);
    /* signed quants go in as |x| with x's sign moved onto y */
    const __m256i ux = has_min ? qx : _mm256_sign_epi8(qx, qx);
    __m256 dxy[GGUFLM_DOT_TOKENS];
    GGUFLM_SIMD(legacy_scales)(has_min, xb, y0, y_stride, nt, dxy, summs);
    for (int t = 0; t < nt; ++t) {
        const uint8_t *yb = y0 + t * y_stride;
        const __m256i qy = _mm256_loadu_si256((const __m256i *)(yb + (has_min ? 4 : 2)));
        const __m256i p = GGUFLM_SIMD(dot_u8_s8)(ux, has_min ? qy : _mm256_sign_epi8(qy, qx));
        acc[t] = _mm256_fmadd_ps(dxy[t], _mm256_cvtepi32_ps(p), acc[t]);
    }
}

/* One weight row against nt activation rows (nt <= GGUFLM_DOT_TOKENS, a constant after inlining):
 * s[t * s_stride] = W . Y_t where Y_t starts y_stride bytes after Y_(t-1). Each weight block is
 * decoded once for all nt tokens; every token's arithmetic is the same as with nt = 1, so the
 * multi-token kernels give the single-token floats bit for bit. */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(dot_legacy)(int type, size_t bx, int64_t n, float *s,
                                                                         int64_t s_stride, const void *vx,
                                                                         const void *vy, int64_t y_stride, int nt) {
    const size_t by = gguflm_legacy_has_min(type) ? sizeof(block_q8_1) : sizeof(block_q8_0);
    /* even blocks go to acc0, odd ones to acc1 (two chains hide the FMA latency); lane 2t+1 of
     * summs accumulates token t's Q4_1/Q5_1 min terms */
    __m256 acc0[GGUFLM_DOT_TOKENS], acc1[GGUFLM_DOT_TOKENS];
    __m256 summs = _mm256_setzero_ps();
    for (int t = 0; t < nt; ++t) acc0[t] = acc1[t] = _mm256_setzero_ps();
    const uint8_t *x = (const uint8_t *)vx, *y = (const uint8_t *)vy;
    const int64_t nb = n / 32;
    int64_t ib = 0;
    for (; ib + 1 < nb; ib += 2) {
        GGUFLM_SIMD(legacy_block)(type, x + ib * bx, y + ib * by, y_stride, nt, acc0, &summs);
        GGUFLM_SIMD(legacy_block)(type, x + (ib + 1) * bx, y + (ib + 1) * by, y_stride, nt, acc1, &summs);
    }
    if (ib < nb) GGUFLM_SIMD(legacy_block)(type, x + ib * bx, y + ib * by, y_stride, nt, acc0, &summs);
    float min_terms[8];
    _mm256_storeu_ps(min_terms, summs);
    for (int t = 0; t < nt; ++t) s[t * s_stride] = GGUFLM_SIMD(hsum_f32)(_mm256_add_ps(acc0[t], acc1[t])) + min_terms[2 * t + 1];
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

static inline __attribute__((always_inline)) void GGUFLM_SIMD(dot_k)(int type, size_t bx, int64_t n, float *s,
                                                                    int64_t s_stride, const void *vx, const void *vy,
                                                                    int64_t y_stride, int nt) {
    const int zero = type == GGUFLM_Q3_K ? 4 : type == GGUFLM_Q6_K ? 32 : 0;
    /* int16 lanes 0-7 take the scale of elements 32g..32g+15, lanes 8-15 that of the next 16: the
     * pair (2g, 2g+1) broadcast as one int32, then its low or high half repeated per 128-bit lane */
    const __m256i pair_spread = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                                 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    float sumf[GGUFLM_DOT_TOKENS];
    for (int t = 0; t < nt; ++t) sumf[t] = 0.0f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const uint8_t *xb = (const uint8_t *)vx + i * bx;
        __m256i sc16, mn16, acc[GGUFLM_DOT_TOKENS];
        float d, dmin;
        GGUFLM_SIMD(kscales)(type, xb, &sc16, &mn16, &d, &dmin);
        for (int t = 0; t < nt; ++t) acc[t] = _mm256_setzero_si256();
        for (int g = 0; g < QK_K / 32; ++g) {
            const __m256i u = GGUFLM_SIMD(kquants)(type, xb, g);
            const __m256i sc = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(g)), pair_spread);
            for (int t = 0; t < nt; ++t) {
                const block_q8_K *y = (const block_q8_K *)((const uint8_t *)vy + t * y_stride) + i;
                const __m256i p = _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(y->qs + 32 * g)));
                acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(p, sc));
            }
        }
        for (int t = 0; t < nt; ++t) {
            const block_q8_K *y = (const block_q8_K *)((const uint8_t *)vy + t * y_stride) + i;
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)y->bsums);
            if (zero) acc[t] = _mm256_sub_epi32(acc[t], _mm256_mullo_epi32(_mm256_madd_epi16(bsums, sc16), _mm256_set1_epi32(zero)));
            const int32_t summ = zero ? 0 : GGUFLM_SIMD(hsum_i32)(_mm256_madd_epi16(bsums, mn16));
            sumf[t] += gguflm_kblock_value(y->d, d, dmin, GGUFLM_SIMD(hsum_i32)(acc[t]), summ);
        }
    }
    for (int t = 0; t < nt; ++t) s[t * s_stride] = sumf[t];
}

/* 8 consecutive elements of a float-format row as fp32 */
static inline __attribute__((always_inline)) __m256 GGUFLM_SIMD(load8)(int type, const void *p, int64_t i) {
    if (type == GGUFLM_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const ggml_half *)p + i)));
    if (type == GGUFLM_BF16) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
    return _mm256_loadu_ps((const float *)p + i);
}

static inline __attribute__((always_inline)) void GGUFLM_SIMD(dot_float)(int type, int64_t n, float *s, const void *vx, const void *vy) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int k = 0; k < 4; ++k) {
            acc[k] = _mm256_fmadd_ps(GGUFLM_SIMD(load8)(type, vx, i + 8 * k), GGUFLM_SIMD(load8)(type, vy, i + 8 * k), acc[k]);
        }
    }
    for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(GGUFLM_SIMD(load8)(type, vx, i), GGUFLM_SIMD(load8)(type, vy, i), acc[0]);
    float sum = GGUFLM_SIMD(hsum_f32)(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; ++i) sum = fmaf(gguflm_float_at(type, vx, i), gguflm_float_at(type, vy, i), sum);
    *s = sum;
}

/* single-token and GGUFLM_DOT_TOKENS-token kernels of the block formats */
#define GGUFLM_BLOCK_DOTS(tag, TYPE, body, block)                                                                         \
    static void GGUFLM_SIMD(dot_##tag)(int64_t n, float *s, const void *x, const void *y) {                               \
        GGUFLM_SIMD(body)(TYPE, sizeof(block), n, s, 0, x, y, 0, 1);                                                     \
    }                                                                                                                     \
    static void GGUFLM_SIMD(dotn_##tag)(int64_t n, float *s, int64_t s_stride, const void *x, const void *y,             \
                                        int64_t y_stride) {                                                               \
        GGUFLM_SIMD(body)(TYPE, sizeof(block), n, s, s_stride, x, y, y_stride, GGUFLM_DOT_TOKENS);                       \
    }
GGUFLM_BLOCK_DOTS(q4_0, GGUFLM_Q4_0, dot_legacy, block_q4_0)
GGUFLM_BLOCK_DOTS(q4_1, GGUFLM_Q4_1, dot_legacy, block_q4_1)
GGUFLM_BLOCK_DOTS(q5_0, GGUFLM_Q5_0, dot_legacy, block_q5_0)
GGUFLM_BLOCK_DOTS(q5_1, GGUFLM_Q5_1, dot_legacy, block_q5_1)
GGUFLM_BLOCK_DOTS(q8_0, GGUFLM_Q8_0, dot_legacy, block_q8_0)
GGUFLM_BLOCK_DOTS(q2_K, GGUFLM_Q2_K, dot_k, block_q2_K)
GGUFLM_BLOCK_DOTS(q3_K, GGUFLM_Q3_K, dot_k, block_q3_K)
GGUFLM_BLOCK_DOTS(q4_K, GGUFLM_Q4_K, dot_k, block_q4_K)
GGUFLM_BLOCK_DOTS(q5_K, GGUFLM_Q5_K, dot_k, block_q5_K)
GGUFLM_BLOCK_DOTS(q6_K, GGUFLM_Q6_K, dot_k, block_q6_K)
#undef GGUFLM_BLOCK_DOTS
static void GGUFLM_SIMD(dot_f32)(int64_t n, float *s, const void *x, const void *y) { GGUFLM_SIMD(dot_float)(GGUFLM_F32, n, s, x, y); }
static void GGUFLM_SIMD(dot_f16)(int64_t n, float *s, const void *x, const void *y) { GGUFLM_SIMD(dot_float)(GGUFLM_F16, n, s, x, y); }
static void GGUFLM_SIMD(dot_bf16)(int64_t n, float *s, const void *x, const void *y) { GGUFLM_SIMD(dot_float)(GGUFLM_BF16, n, s, x, y); }

static const gguflm_vec_dot_fn GGUFLM_SIMD(dot_table)[GGUFLM_TYPE_COUNT] = {
    [GGUFLM_F32] = GGUFLM_SIMD(dot_f32),   [GGUFLM_F16] = GGUFLM_SIMD(dot_f16),
    [GGUFLM_BF16] = GGUFLM_SIMD(dot_bf16), [GGUFLM_Q4_0] = GGUFLM_SIMD(dot_q4_0),
    [GGUFLM_Q4_1] = GGUFLM_SIMD(dot_q4_1), [GGUFLM_Q5_0] = GGUFLM_SIMD(dot_q5_0),
    [GGUFLM_Q5_1] = GGUFLM_SIMD(dot_q5_1), [GGUFLM_Q8_0] = GGUFLM_SIMD(dot_q8_0),
    [GGUFLM_Q2_K] = GGUFLM_SIMD(dot_q2_K), [GGUFLM_Q3_K] = GGUFLM_SIMD(dot_q3_K),
    [GGUFLM_Q4_K] = GGUFLM_SIMD(dot_q4_K), [GGUFLM_Q5_K] = GGUFLM_SIMD(dot_q5_K),
    [GGUFLM_Q6_K] = GGUFLM_SIMD(dot_q6_K),
};

static const gguflm_vec_dotn_fn GGUFLM_SIMD(dotn_table)[GGUFLM_TYPE_COUNT] = {
    [GGUFLM_Q4_0] = GGUFLM_SIMD(dotn_q4_0), [GGUFLM_Q4_1] = GGUFLM_SIMD(dotn_q4_1),
    [GGUFLM_Q5_0] = GGUFLM_SIMD(dotn_q5_0), [GGUFLM_Q5_1] = GGUFLM_SIMD(dotn_q5_1),
    [GGUFLM_Q8_0] = GGUFLM_SIMD(dotn_q8_0), [GGUFLM_Q2_K] = GGUFLM_SIMD(dotn_q2_K),
    [GGUFLM_Q3_K] = GGUFLM_SIMD(dotn_q3_K), [GGUFLM_Q4_K] = GGUFLM_SIMD(dotn_q4_K),
    [GGUFLM_Q5_K] = GGUFLM_SIMD(dotn_q5_K), [GGUFLM_Q6_K] = GGUFLM_SIMD(dotn_q6_K),
};
