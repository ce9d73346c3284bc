/* The float formats' SIMD kernels (F32, F16, BF16 weights: quants_dot.h's DOT and SGEMM chains),
 * included by quants_simd_body.h in each of its copies, and by quants_simd.h once more for the
 * avx512bf16 ISA, whose BF16 kernels run vdpbf16ps itself (GGUFLM_SIMD_DPBF16) where the others
 * emulate it; that copy defines only the BF16 kernels. GGUFLM_SIMD_512: 512-bit vectors for the
 * 16-float chains. No include guard: this file is meant to be included more than once.
 */

/* horizontal sums */
static inline float GGUFLM_SIMD(hsum_f32)(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}


/* ---- float formats (F32, F16, BF16): the chains of quants_dot.h's gguflm_float_1 ---- */

/* 8 consecutive elements of a float-format row as fp32 */
static inline __attribute__((always_inline)) __m256 GGUFLM_SIMD(load8)(int type, const void *p, int64_t i) {
    if (type == GGUFLM_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const ggml_half *)p + i)));
    if (type == GGUFLM_BF16) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
    return _mm256_loadu_ps((const float *)p + i);
}

/* the 8 lanes summed as hsum_f32, but ending in two hadds (ggml's AVX2 vec_dot_f32/f16) */
static inline float GGUFLM_SIMD(hsum_hadd)(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    r = _mm_hadd_ps(r, r);
    return _mm_cvtss_f32(_mm_hadd_ps(r, r));
}

/* vdpbf16ps' fused steps (gguflm_daz, gguflm_fma_ftz). Denormal inputs and results are so rare
 * (a bf16 weight or activation below 2^-126; a partial sum there) that the kernels only test for
 * them, off the chain of fmas, and take the exact form where a vector holds one: denormals read
 * as signed zeros; a result flushed to its sign where the same fma scaled by 2^24 is below
 * 2^-102 (only a result that is denormal or the smallest normal can be tiny). */
static inline __m256 GGUFLM_SIMD(daz8)(__m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i denormal = _mm256_cmpeq_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7f800000)),
                                                _mm256_setzero_si256());
    return _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_and_si256(denormal, _mm256_set1_epi32(0x7fffffff)), bits));
}

static inline __m256 GGUFLM_SIMD(fma_ftz8_exact)(__m256 a, __m256 b, __m256 c) {
    const __m256 scale = _mm256_set1_ps(0x1p24f), magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 scaled = _mm256_fmadd_ps(_mm256_mul_ps(a, scale), b, _mm256_mul_ps(c, scale));
    const __m256 tiny = _mm256_cmp_ps(_mm256_and_ps(scaled, magnitude), _mm256_set1_ps(0x1p-102f), _CMP_LT_OQ);
    return _mm256_andnot_ps(_mm256_and_ps(tiny, magnitude), _mm256_fmadd_ps(a, b, c));
}

static inline __m256 GGUFLM_SIMD(fma_ftz8)(__m256 a, __m256 b, __m256 c) {
    const __m256 r = _mm256_fmadd_ps(a, b, c);
    /* 0 < |r| <= 2^-126, as integers */
    const __m256i m = _mm256_and_si256(_mm256_castps_si256(r), _mm256_set1_epi32(0x7fffffff));
    const __m256i small = _mm256_andnot_si256(_mm256_cmpeq_epi32(m, _mm256_setzero_si256()),
                                              _mm256_cmpgt_epi32(_mm256_set1_epi32(0x00800001), m));
    return __builtin_expect(_mm256_testz_si256(small, small), 1) ? r : GGUFLM_SIMD(fma_ftz8_exact)(a, b, c);
}

/* any denormal among the 16 bf16 values of v (a zero exponent, a non-zero mantissa) */
static inline int GGUFLM_SIMD(bf16_denormal8)(__m256i v) {
    const __m256i zero_exp = _mm256_cmpeq_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7f80)), _mm256_setzero_si256());
    const __m256i zero_man = _mm256_cmpeq_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x007f)), _mm256_setzero_si256());
    return !_mm256_testc_si256(zero_man, zero_exp);  /* some lane with zero_exp and not zero_man */
}

/* 16 float lanes: one 512-bit vector in the AVX-512 copy, two 256-bit halves in the AVX2 copy;
 * every operation is lane by lane, so both give the same bits */
#if GGUFLM_SIMD_512
typedef __m512 GGUFLM_SIMD(v16);
static inline GGUFLM_SIMD(v16) GGUFLM_SIMD(zero16)(void) { return _mm512_setzero_ps(); }
static inline GGUFLM_SIMD(v16) GGUFLM_SIMD(fma16)(GGUFLM_SIMD(v16) a, GGUFLM_SIMD(v16) b, GGUFLM_SIMD(v16) c) {
    return _mm512_fmadd_ps(a, b, c);
}
static inline GGUFLM_SIMD(v16) GGUFLM_SIMD(add16)(GGUFLM_SIMD(v16) a, GGUFLM_SIMD(v16) b) { return _mm512_add_ps(a, b); }
/* _mm512_reduce_add_ps: the upper 8 lanes onto the lower, then as hsum_f32 */
static inline float GGUFLM_SIMD(hsum16)(GGUFLM_SIMD(v16) v) {
    return GGUFLM_SIMD(hsum_f32)(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}
static inline __attribute__((always_inline)) GGUFLM_SIMD(v16) GGUFLM_SIMD(load16)(int type, const void *p, int64_t i) {
    if (type == GGUFLM_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const ggml_half *)p + i)));
    if (type == GGUFLM_BF16) {
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    }
    return _mm512_loadu_ps((const float *)p + i);
}
/* lanes of v whose magnitude, as an integer, is in [1, top] (0 < |v| <= top) */
static inline __mmask16 GGUFLM_SIMD(magnitude_in16)(__m512 v, uint32_t top) {
    const __m512i m = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff));
    return _mm512_cmple_epu32_mask(_mm512_sub_epi32(m, _mm512_set1_epi32(1)), _mm512_set1_epi32((int)(top - 1)));
}
/* the 32 bf16 values at p + i as 16 pairs: the even elements (low halves of the 32-bit words),
 * the odd ones (high halves); denormals read as signed zeros */
static inline void GGUFLM_SIMD(load_pairs16)(const void *p, int64_t i, GGUFLM_SIMD(v16) *even, GGUFLM_SIMD(v16) *odd) {
    const __m512i words = _mm512_loadu_si512((const uint16_t *)p + i);
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(words, _mm512_set1_epi32((int)0xffff0000u)));
    const __mmask32 zero_exp = _mm512_cmp_epi16_mask(_mm512_and_si512(words, _mm512_set1_epi16(0x7f80)),
                                                     _mm512_setzero_si512(), _MM_CMPINT_EQ);
    if (__builtin_expect(_mm512_mask_test_epi16_mask(zero_exp, words, _mm512_set1_epi16(0x007f)) != 0, 0)) {
        const __m512 sign = _mm512_set1_ps(-0.0f);
        *even = _mm512_mask_and_ps(*even, GGUFLM_SIMD(magnitude_in16)(*even, 0x007fffff), *even, sign);
        *odd = _mm512_mask_and_ps(*odd, GGUFLM_SIMD(magnitude_in16)(*odd, 0x007fffff), *odd, sign);
    }
}
static inline GGUFLM_SIMD(v16) GGUFLM_SIMD(fma_ftz16)(GGUFLM_SIMD(v16) a, GGUFLM_SIMD(v16) b, GGUFLM_SIMD(v16) c) {
    const __m512 r = _mm512_fmadd_ps(a, b, c);
    if (__builtin_expect(GGUFLM_SIMD(magnitude_in16)(r, 0x00800000) == 0, 1)) return r;
    const __m512 scale = _mm512_set1_ps(0x1p24f);
    const __m512 scaled = _mm512_fmadd_ps(_mm512_mul_ps(a, scale), b, _mm512_mul_ps(c, scale));
    const __mmask16 tiny = _mm512_cmp_ps_mask(_mm512_abs_ps(scaled), _mm512_set1_ps(0x1p-102f), _CMP_LT_OQ);
    return _mm512_mask_and_ps(r, tiny, r, _mm512_set1_ps(-0.0f));
}
#else
typedef struct {
    __m256 lo, hi;
} GGUFLM_SIMD(v16);
static inline GGUFLM_SIMD(v16) GGUFLM_SIMD(zero16)(void) {
    return (GGUFLM_SIMD(v16)){_mm256_setzero_ps(), _mm256_setzero_ps()};
}
static inline GGUFLM_SIMD(v16) GGUFLM_SIMD(fma16)(GGUFLM_SIMD(v16) a, GGUFLM_SIMD(v16) b, GGUFLM_SIMD(v16) c) {
    return (GGUFLM_SIMD(v16)){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
static inline GGUFLM_SIMD(v16) GGUFLM_SIMD(add16)(GGUFLM_SIMD(v16) a, GGUFLM_SIMD(v16) b) {
    return (GGUFLM_SIMD(v16)){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)};
}
static inline float GGUFLM_SIMD(hsum16)(GGUFLM_SIMD(v16) v) { return GGUFLM_SIMD(hsum_f32)(_mm256_add_ps(v.lo, v.hi)); }
static inline __attribute__((always_inline)) GGUFLM_SIMD(v16) GGUFLM_SIMD(load16)(int type, const void *p, int64_t i) {
    return (GGUFLM_SIMD(v16)){GGUFLM_SIMD(load8)(type, p, i), GGUFLM_SIMD(load8)(type, p, i + 8)};
}
static inline void GGUFLM_SIMD(load_pairs16)(const void *p, int64_t i, GGUFLM_SIMD(v16) *even, GGUFLM_SIMD(v16) *odd) {
    const __m256i high = _mm256_set1_epi32((int)0xffff0000u);
    const __m256i lo = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    const __m256i hi = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i + 16));
    *even = (GGUFLM_SIMD(v16)){_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16))};
    *odd = (GGUFLM_SIMD(v16)){_mm256_castsi256_ps(_mm256_and_si256(lo, high)), _mm256_castsi256_ps(_mm256_and_si256(hi, high))};
    if (__builtin_expect(GGUFLM_SIMD(bf16_denormal8)(lo) | GGUFLM_SIMD(bf16_denormal8)(hi), 0)) {
        *even = (GGUFLM_SIMD(v16)){GGUFLM_SIMD(daz8)(even->lo), GGUFLM_SIMD(daz8)(even->hi)};
        *odd = (GGUFLM_SIMD(v16)){GGUFLM_SIMD(daz8)(odd->lo), GGUFLM_SIMD(daz8)(odd->hi)};
    }
}
static inline GGUFLM_SIMD(v16) GGUFLM_SIMD(fma_ftz16)(GGUFLM_SIMD(v16) a, GGUFLM_SIMD(v16) b, GGUFLM_SIMD(v16) c) {
    return (GGUFLM_SIMD(v16)){GGUFLM_SIMD(fma_ftz8)(a.lo, b.lo, c.lo), GGUFLM_SIMD(fma_ftz8)(a.hi, b.hi, c.hi)};
}
#endif

#if GGUFLM_SIMD_DPBF16
/* vdpbf16ps itself, on the words of 32 bf16 values */
typedef __m512i GGUFLM_SIMD(pairs16);

static inline __attribute__((always_inline)) GGUFLM_SIMD(pairs16) GGUFLM_SIMD(pairs_at)(const void *p, int64_t i) {
    return _mm512_loadu_si512((const uint16_t *)p + i);
}

static inline __attribute__((always_inline)) GGUFLM_SIMD(v16) GGUFLM_SIMD(dp16)(GGUFLM_SIMD(v16) acc, GGUFLM_SIMD(pairs16) x,
                                                                               GGUFLM_SIMD(pairs16) y) {
    return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)y);
}
#else
/* bf16 pairs for vdpbf16ps: the even and the odd elements, denormals already read as zeros */
typedef struct {
    GGUFLM_SIMD(v16) even, odd;
} GGUFLM_SIMD(pairs16);

static inline __attribute__((always_inline)) GGUFLM_SIMD(pairs16) GGUFLM_SIMD(pairs_at)(const void *p, int64_t i) {
    GGUFLM_SIMD(pairs16) q;
    GGUFLM_SIMD(load_pairs16)(p, i, &q.even, &q.odd);
    return q;
}

/* vdpbf16ps emulated: the odd products first */
static inline __attribute__((always_inline)) GGUFLM_SIMD(v16) GGUFLM_SIMD(dp16)(GGUFLM_SIMD(v16) acc, GGUFLM_SIMD(pairs16) x,
                                                                               GGUFLM_SIMD(pairs16) y) {
    acc = GGUFLM_SIMD(fma_ftz16)(x.odd, y.odd, acc);
    return GGUFLM_SIMD(fma_ftz16)(x.even, y.even, acc);
}
#endif

/* DOT, one output: the chain of `lanes` (8 or 16; with BF16 `pairs` for vdpbf16ps), reduced in
 * registers in gguflm_float_reduce's order, then gguflm_float_tail */
static inline __attribute__((always_inline)) float GGUFLM_SIMD(dot_float_1)(int type, int arith, int lanes, int pairs,
                                                                           int64_t n, const uint8_t *x,
                                                                           const uint8_t *y) {
    int64_t np;
    double sum;
    if (lanes == 8) {
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        np = n - n % 32;
        for (int64_t i = 0; i < np; i += 32)
            for (int k = 0; k < 4; ++k)
                a[k] = _mm256_fmadd_ps(GGUFLM_SIMD(load8)(type, x, i + 8 * k), GGUFLM_SIMD(load8)(type, y, i + 8 * k), a[k]);
        const __m256 v = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
        sum = type == GGUFLM_BF16 ? GGUFLM_SIMD(hsum_f32)(v) : GGUFLM_SIMD(hsum_hadd)(v);
    } else if (type == GGUFLM_BF16) {
        /* two vectors over 32 elements (64 in pairs), each summed, added in double */
        GGUFLM_SIMD(v16) a[2] = {GGUFLM_SIMD(zero16)(), GGUFLM_SIMD(zero16)()};
        const int half = pairs ? 32 : 16;
        np = n - n % (2 * half);
        for (int64_t i = 0; i < np; i += 2 * half)
            for (int k = 0; k < 2; ++k)
                a[k] = pairs ? GGUFLM_SIMD(dp16)(a[k], GGUFLM_SIMD(pairs_at)(x, i + half * k), GGUFLM_SIMD(pairs_at)(y, i + half * k))
                             : GGUFLM_SIMD(fma16)(GGUFLM_SIMD(load16)(type, x, i + half * k),
                                                  GGUFLM_SIMD(load16)(type, y, i + half * k), a[k]);
        sum = (double)GGUFLM_SIMD(hsum16)(a[0]) + (double)GGUFLM_SIMD(hsum16)(a[1]);
    } else {
        GGUFLM_SIMD(v16) a[4] = {GGUFLM_SIMD(zero16)(), GGUFLM_SIMD(zero16)(), GGUFLM_SIMD(zero16)(), GGUFLM_SIMD(zero16)()};
        np = n - n % 64;
        for (int64_t i = 0; i < np; i += 64)
            for (int k = 0; k < 4; ++k)
                a[k] = GGUFLM_SIMD(fma16)(GGUFLM_SIMD(load16)(type, x, i + 16 * k), GGUFLM_SIMD(load16)(type, y, i + 16 * k), a[k]);
        sum = GGUFLM_SIMD(hsum16)(GGUFLM_SIMD(add16)(GGUFLM_SIMD(add16)(a[0], a[2]), GGUFLM_SIMD(add16)(a[1], a[3])));
    }
    return gguflm_float_tail(type, arith, n, np, x, y, sum);
}

static inline __attribute__((always_inline)) void GGUFLM_SIMD(dot_float_tile)(int type, int arith, int lanes, int pairs,
                                                                             int64_t n, const uint8_t *w, int64_t ws,
                                                                             int R, const uint8_t *y, int64_t ys, int T,
                                                                             float *out, int64_t os) {
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) out[t * os + r] = GGUFLM_SIMD(dot_float_1)(type, arith, lanes, pairs, n, w + r * ws, y + t * ys);
}

/* SGEMM: llamafile's tinyBLAS, one chain of `lanes` per output (n a whole number of steps) */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(sgemm_tile)(int type, int arith, int lanes, int pairs,
                                                                         int64_t n, const uint8_t *w, int64_t ws, int R,
                                                                         const uint8_t *y, int64_t ys, int T, float *out,
                                                                         int64_t os) {
    (void)arith;
    if (lanes == 8) {
        __m256 acc[GGUFLM_MAX_TILE][GGUFLM_MAX_TILE];
        for (int r = 0; r < R; ++r)
            for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
        for (int64_t i = 0; i < n; i += 8) {
            __m256 b[GGUFLM_MAX_TILE];
            for (int t = 0; t < T; ++t) b[t] = GGUFLM_SIMD(load8)(type, y + t * ys, i);
            for (int r = 0; r < R; ++r) {
                const __m256 a = GGUFLM_SIMD(load8)(type, w + r * ws, i);
                for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(a, b[t], acc[r][t]);
            }
        }
        for (int r = 0; r < R; ++r)
            for (int t = 0; t < T; ++t) out[t * os + r] = GGUFLM_SIMD(hsum_f32)(acc[r][t]);
        return;
    }
    GGUFLM_SIMD(v16) acc[GGUFLM_MAX_TILE][GGUFLM_MAX_TILE];
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) acc[r][t] = GGUFLM_SIMD(zero16)();
    for (int64_t i = 0; i < n; i += pairs ? 32 : 16) {
        if (pairs) {
            GGUFLM_SIMD(pairs16) b[GGUFLM_MAX_TILE];
            for (int t = 0; t < T; ++t) b[t] = GGUFLM_SIMD(pairs_at)(y + t * ys, i);
            for (int r = 0; r < R; ++r) {
                const GGUFLM_SIMD(pairs16) a = GGUFLM_SIMD(pairs_at)(w + r * ws, i);
                for (int t = 0; t < T; ++t) acc[r][t] = GGUFLM_SIMD(dp16)(acc[r][t], a, b[t]);
            }
        } else {
            GGUFLM_SIMD(v16) b[GGUFLM_MAX_TILE];
            for (int t = 0; t < T; ++t) b[t] = GGUFLM_SIMD(load16)(type, y + t * ys, i);
            for (int r = 0; r < R; ++r) {
                const GGUFLM_SIMD(v16) a = GGUFLM_SIMD(load16)(type, w + r * ws, i);
                for (int t = 0; t < T; ++t) acc[r][t] = GGUFLM_SIMD(fma16)(a, b[t], acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) out[t * os + r] = GGUFLM_SIMD(hsum16)(acc[r][t]);
}

/* float weights: the arithmetic's chain as constants (8 lanes; 16; 16 with vdpbf16ps pairs); the
 * 512-bit copy's tinyBLAS chains in 4 x 4 tiles (16 registers of accumulators, each token's loads
 * shared by 4 rows) */
#define GGUFLM_SIMD_FLOAT_KERNEL(path, tag, TYPE, TILE, LOOP16)                                                  \
    static void GGUFLM_SIMD(path##_##tag)(int64_t n, const uint8_t *w, int64_t ws, int64_t nr, const uint8_t *y, \
                                          int64_t ys, int64_t nt, float *o, int64_t os, int arith) {             \
        if (!gguflm_arith_avx512(arith)) GGUFLM_TILE_LOOP(TILE, TYPE, arith, 8, 0, n,);                          \
        else if (TYPE == GGUFLM_BF16 && gguflm_arith_dpbf16(arith)) LOOP16(TILE, TYPE, arith, 16, 1, n,);        \
        else LOOP16(TILE, TYPE, arith, 16, 0, n,);                                                               \
    }
#if GGUFLM_SIMD_512
#define GGUFLM_SGEMM_LOOP16 GGUFLM_TILE_LOOP_4X4
#else
#define GGUFLM_SGEMM_LOOP16 GGUFLM_TILE_LOOP
#endif
#define GGUFLM_SIMD_FLOAT(tag, TYPE)                                                                             \
    GGUFLM_SIMD_FLOAT_KERNEL(DOT, tag, TYPE, GGUFLM_SIMD(dot_float_tile), GGUFLM_TILE_LOOP)                      \
    GGUFLM_SIMD_FLOAT_KERNEL(SGEMM, tag, TYPE, GGUFLM_SIMD(sgemm_tile), GGUFLM_SGEMM_LOOP16)
#if !GGUFLM_SIMD_DPBF16
GGUFLM_SIMD_FLOAT(f32, GGUFLM_F32)
GGUFLM_SIMD_FLOAT(f16, GGUFLM_F16)
#endif
GGUFLM_SIMD_FLOAT(bf16, GGUFLM_BF16)
#undef GGUFLM_SIMD_FLOAT
#undef GGUFLM_SIMD_FLOAT_KERNEL
#undef GGUFLM_SGEMM_LOOP16
