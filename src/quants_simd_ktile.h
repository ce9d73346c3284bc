/* The TILED GEMM (AVX-512 and AVX2) of the K-quants (Q2_K .. Q6_K), IQ4_XS and the grid i-quants
 * for batches: ggml's TILED recipe (one exact integer per super-block, res = d*s1 (- dmin*s2 fused),
 * out = fma(res, y.d, out); quants_dot.h, quants_iq.h)
 * with the integer part done by vpdpbusd on 512-bit vectors, 16 weight rows per vector (AVX2: 8
 * rows, see the width note below). Included by quants_simd_body.h in both copies; no include guard.
 *
 * Inside a super-block everything is integer, so the work is laid out for the instruction:
 * 16 weight rows are decoded once per call (a few super-blocks at a time, into L1) into vectors
 * whose lane r holds 4 consecutive unsigned quants of row r, and the activation's 4 matching int8
 * values come as one broadcast dword; vpdpbusd then gives lane r = row r's 4 products, and 4 (or 8)
 * of them in a row make a 16-element (32-element) sub-block's sum. Per sub-block one vpmulld by the
 * rows' scales (lane r = row r's), so no horizontal sums at all: lane r of the result is s1 of row
 * r. Offsets (Q3_K 4, Q6_K 32, IQ4_XS 128, the grids 64 or 16) start each sub-block's sum at
 * -offset * the activation's bsum; the mins (s2) are one vpdpwssd of the rows' min pairs by the
 * bsum pairs per 32 elements.
 * The float steps then run 16 rows per instruction, lane by lane the scalar recipe's. The repacked
 * Q4_K / Q2_K GEMM recipe (gguflm_k_repack_1: a float step per 64 or 128 elements) takes the same
 * integers per part; ggml's repack is of no use here, the file's layout is decoded as it is.
 */

/* The same code for both widths: GGUFLM_KT_W rows per vector, through the kt_* operations below.
 * AVX2 has no vpdpbusd: vpmaddubsw, vpmaddwd by ones and an add take its place (exact here: the
 * unsigned quants of these types are at most 63 (IQ grids: 126), an activation at most 127 in
 * size, so no int16 pair sum saturates). IQ4_XS's values + 128 would: in the AVX2 copy its quants
 * stay signed and their signs move onto the activation (GGUFLM_KT_SIGNED; |value| <= 127).
 * The grids' decoding has a copy per width (quants_iq_simd.h). */
#if GGUFLM_SIMD_512
#define GGUFLM_KT_W 16
#define gguflm_kt_vi __m512i
#define gguflm_kt_vf __m512
#define GGUFLM_KT_T 8           /* tokens per register tile */
#define GGUFLM_KT_T_PARTS 4     /* the repacked GEMM's: its per-part chains of the sums and the
                                 * mins spill at 8 (Q4_K, a thread: 432 GOP/s at 4, 388 at 6, 360 at 8) */
#define gguflm_kt_zero() _mm512_setzero_si512()
#define gguflm_kt_set1(x) _mm512_set1_epi32(x)
#define gguflm_kt_load(p) _mm512_loadu_si512((const void *)(p))
#define gguflm_kt_dot(acc, u, y) _mm512_dpbusd_epi32((acc), (u), (y))
#define gguflm_kt_dot16(acc, a, b) _mm512_dpwssd_epi32((acc), (a), (b))
#define gguflm_kt_add(a, b) _mm512_add_epi32((a), (b))
#define gguflm_kt_mullo(a, b) _mm512_mullo_epi32((a), (b))
#define gguflm_kt_mullo16(a, b) _mm512_mullo_epi16((a), (b))
#define gguflm_kt_or(a, b) _mm512_or_si512((a), (b))
#define gguflm_kt_slli32(a, n) _mm512_slli_epi32((a), (n))
#define gguflm_kt_zerof() _mm512_setzero_ps()
#define gguflm_kt_set1f(x) _mm512_set1_ps(x)
#define gguflm_kt_loadf(p) _mm512_loadu_ps(p)
#define gguflm_kt_storef(p, v) _mm512_storeu_ps((p), (v))
#define gguflm_kt_cvt(v) _mm512_cvtepi32_ps(v)
#define gguflm_kt_mulf(a, b) _mm512_mul_ps((a), (b))
#define gguflm_kt_fma(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define gguflm_kt_subf(a, b) _mm512_sub_ps((a), (b))
#else
#define GGUFLM_KT_W 8
#define gguflm_kt_vi __m256i
#define gguflm_kt_vf __m256
#define GGUFLM_KT_T 4           /* 16 registers */
#define GGUFLM_KT_T_PARTS 2
#define gguflm_kt_zero() _mm256_setzero_si256()
#define gguflm_kt_set1(x) _mm256_set1_epi32(x)
#define gguflm_kt_load(p) _mm256_loadu_si256((const __m256i *)(p))
#define gguflm_kt_dot(acc, u, y) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (y)), _mm256_set1_epi16(1)))
#define gguflm_kt_dot16(acc, a, b) _mm256_add_epi32((acc), _mm256_madd_epi16((a), (b)))
#define gguflm_kt_add(a, b) _mm256_add_epi32((a), (b))
#define gguflm_kt_mullo(a, b) _mm256_mullo_epi32((a), (b))
#define gguflm_kt_mullo16(a, b) _mm256_mullo_epi16((a), (b))
#define gguflm_kt_or(a, b) _mm256_or_si256((a), (b))
#define gguflm_kt_slli32(a, n) _mm256_slli_epi32((a), (n))
#define gguflm_kt_zerof() _mm256_setzero_ps()
#define gguflm_kt_set1f(x) _mm256_set1_ps(x)
#define gguflm_kt_loadf(p) _mm256_loadu_ps(p)
#define gguflm_kt_storef(p, v) _mm256_storeu_ps((p), (v))
#define gguflm_kt_cvt(v) _mm256_cvtepi32_ps(v)
#define gguflm_kt_mulf(a, b) _mm256_mul_ps((a), (b))
#define gguflm_kt_fma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define gguflm_kt_subf(a, b) _mm256_sub_ps((a), (b))
#endif
/* signed quants, |value| . (y with the value's sign): IQ4_XS in the AVX2 copy */
#define GGUFLM_KT_SIGNED(type) (!GGUFLM_SIMD_512 && (type) == GGUFLM_IQ4_XS)
/* quants decoded times their sub-block's scale, Q2_K's (at most 3 * 15: still a byte, and the
 * integer sum is the same), so that a part's sub-blocks make one chain of vpdpbusd with no
 * vpmulld or add per sub-block */
#define GGUFLM_KT_PRESCALED(type) ((type) == GGUFLM_Q2_K)
#define GGUFLM_KT_SB 4          /* super-blocks decoded per pass: 16 rows' stay in L1 (23 KB; 8 rows half) */
#define GGUFLM_KT_MIN_TOKENS 16 /* fewer tokens: TILED goes to k_sums_tile (decoding would not pay) */
#define GGUFLM_KT_MIN_REPACK 32 /* and the repacked GEMM to q4_K_rows8_tile (as fast at 24 tokens) */

/* one super-block of GGUFLM_KT_W weight rows, decoded; lane r of each vector is row r */
typedef struct {
    gguflm_kt_vi q[QK_K / 4];  /* unsigned quants 4g .. 4g+3 */
    gguflm_kt_vi sc[16];       /* int32 scale of each 16 elements (32-element types: the pair's, twice) */
    gguflm_kt_vi mn[8];        /* int16 pair of the mins of elements 32k .. 32k+31 (per 16 elements) */
    gguflm_kt_vf d, dmin, neg_dmin;
} GGUFLM_SIMD(ktile_sb);

#if GGUFLM_SIMD_512
/* v[i] lane j <-> v[j] lane i: off-diagonal blocks of 8, 4, 2, 1 swapped in turn (step s swaps
 * blocks of b = 8 >> s: lane l of the pair's first vector takes lane l - b of the second where
 * l & b, of the second vector lane l + b of the first where !(l & b)). Unrolled with constant
 * tables: written as loops, GCC kept v on the stack and rebuilt the tables per call, which was most
 * of a legacy strip's decoding */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(kt_transpose)(__m512i v[16]) {
    static const int32_t idx[4][2][16] __attribute__((aligned(64))) = {
        {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
         {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}},
        {{0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
         {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}},
        {{0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
         {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}},
        {{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
         {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}},
    };
    #pragma GCC unroll 4
    for (int s = 0; s < 4; ++s) {
        const int b = 8 >> s;
        const __m512i lo = _mm512_load_si512((const void *)idx[s][0]), hi = _mm512_load_si512((const void *)idx[s][1]);
        #pragma GCC unroll 16
        for (int i = 0; i < 16; ++i)
            if (!(i & b)) {
                const __m512i a = v[i], c = v[i + b];
                v[i] = _mm512_permutex2var_epi32(a, lo, c);
                v[i + b] = _mm512_permutex2var_epi32(a, hi, c);
            }
    }
}
#else
/* v[i] lane j <-> v[j] lane i for 8 vectors of 8 dwords */
static inline void GGUFLM_SIMD(kt_transpose)(__m256i v[8]) {
    __m256i a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
        a[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        b[i] = _mm256_unpacklo_epi64(a[i], a[i + 2]);
        b[i + 1] = _mm256_unpackhi_epi64(a[i], a[i + 2]);
        b[i + 2] = _mm256_unpacklo_epi64(a[i + 1], a[i + 3]);
        b[i + 3] = _mm256_unpackhi_epi64(a[i + 1], a[i + 3]);
    }
    for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_permute2x128_si256(b[i], b[i + 4], 0x20);
        v[i + 4] = _mm256_permute2x128_si256(b[i], b[i + 4], 0x31);
    }
}
#endif

/* per-row vectors v (lane j: the row's dword j) into dst[0 .. W-1] with lane r: row r's */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(kt_store_lanes)(gguflm_kt_vi v[GGUFLM_KT_W],
                                                                             gguflm_kt_vi *dst) {
    GGUFLM_SIMD(kt_transpose)(v);
    for (int k = 0; k < GGUFLM_KT_W; ++k) dst[k] = v[k];
}

/* a decoded super-block's float scales, lane r: row r's (neg_dmin: -dmin for TILED's
 * fma(-dmin, s2, res), fused: SIMDe's vfnmadd is not) */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(kt_set_d)(GGUFLM_SIMD(ktile_sb) *o, const float *d,
                                                                       const float *dmin) {
    float neg[GGUFLM_KT_W];
    for (int r = 0; r < GGUFLM_KT_W; ++r) neg[r] = -dmin[r];
    o->d = gguflm_kt_loadf(d);
    o->dmin = gguflm_kt_loadf(dmin);
    o->neg_dmin = gguflm_kt_loadf(neg);
}

#ifndef GGUFLM_KT_TYPES  /* once: the file is included in both copies */
#define GGUFLM_KT_TYPES
/* per type: elements per scale, and the offset of the unsigned quants (IQ4_XS: its signed table
 * values + 128; the grid i-quants: their signed values, at most 62 in size, + 64, IQ1's 8 * grid +
 * delta, at most 9, + 16) */
static inline int gguflm_kt_sub(int type) {
    return type == GGUFLM_Q4_K || type == GGUFLM_Q5_K || type == GGUFLM_IQ4_XS || type == GGUFLM_IQ2_XXS ||
                   type == GGUFLM_IQ3_XXS || type == GGUFLM_IQ3_S || type == GGUFLM_IQ1_S
               ? 32
               : 16;
}
/* whether TILED (parts 0) of type takes its 16-token tiles from AMX where it is on (see ktile_gemm) */
static inline int gguflm_kt_amx_type(int type, int parts) { return !parts && gguflm_kt_sub(type) == 32; }
static inline int gguflm_kt_offset(int type) {
    if (gguflm_is_iq_grid(type)) return gguflm_iq_is_1bit(type) ? 16 : 64;
    return type == GGUFLM_Q3_K ? 4 : type == GGUFLM_Q6_K ? 32 : type == GGUFLM_IQ4_XS ? 128 : 0;
}
#endif

/* the grid i-quants' decoding into the same layout (quants_iq_simd.h, included after this file) */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(iq_ktile_decode)(int type, size_t bx, const uint8_t *w,
                                                                              int64_t ws, int R, int64_t i0, int nsb,
                                                                              GGUFLM_SIMD(ktile_sb) *dec);

/* the 4 * GGUFLM_KT_W unsigned quants of elements 4Wc .. 4Wc + 4W - 1 of a super-block */
static inline __attribute__((always_inline)) gguflm_kt_vi GGUFLM_SIMD(kt_quants)(int type, const uint8_t *xb, int c) {
    if (type == GGUFLM_IQ4_XS) {
        const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)gguflm_kvalues_iq4nl));
        const uint8_t *qs = ((const block_iq4_xs *)xb)->qs + 4 * GGUFLM_KT_W * c / 2;
#if GGUFLM_SIMD_512
        const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_shuffle_epi8(table, GGUFLM_SIMD(nibbles_32)(qs))),
                                             _mm256_shuffle_epi8(table, GGUFLM_SIMD(nibbles_32)(qs + 16)), 1);
        return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));   /* value + 128 */
#else
        return _mm256_shuffle_epi8(table, GGUFLM_SIMD(nibbles_32)(qs));   /* signed: GGUFLM_KT_SIGNED */
#endif
    }
#if GGUFLM_SIMD_512
    return _mm512_inserti64x4(_mm512_castsi256_si512(GGUFLM_SIMD(kquants)(type, xb, 2 * c)),
                              GGUFLM_SIMD(kquants)(type, xb, 2 * c + 1), 1);
#else
    return GGUFLM_SIMD(kquants)(type, xb, c);
#endif
}

/* a super-block's 16 int32 scales (one per 16 elements; AVX2: two vectors of 8), its 16 int16
 * mins, d and dmin */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(kt_scales)(int type, const uint8_t *xb,
                                                                        gguflm_kt_vi sc[16 / GGUFLM_KT_W],
                                                                        __m256i *mn16, float *d, float *dmin) {
    if (type == GGUFLM_IQ4_XS) {
        const block_iq4_xs *b = (const block_iq4_xs *)xb;
        int32_t ls[16];
        for (int c = 0; c < 8; ++c) ls[2 * c] = ls[2 * c + 1] = gguflm_iq4_xs_scale(b, c);
        for (int h = 0; h < 16 / GGUFLM_KT_W; ++h) sc[h] = gguflm_kt_load(ls + GGUFLM_KT_W * h);
        *mn16 = _mm256_setzero_si256();
        *d = GGUFLM_FP16_TO_FP32_SIMD(b->d);
        *dmin = 0.0f;
        return;
    }
    __m256i sc16;
    GGUFLM_SIMD(kscales)(type, xb, &sc16, mn16, d, dmin);
#if GGUFLM_SIMD_512
    sc[0] = _mm512_cvtepi16_epi32(sc16);
#else
    sc[0] = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(sc16));
    sc[1] = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(sc16, 1));
#endif
}

/* super-blocks i0 .. i0+nsb-1 of R <= GGUFLM_KT_W rows (the missing ones zero) into dec */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(ktile_decode)(int type, size_t bx, const uint8_t *w,
                                                                           int64_t ws, int R, int64_t i0, int nsb,
                                                                           GGUFLM_SIMD(ktile_sb) *dec) {
    enum { W = GGUFLM_KT_W, NSC = 16 / GGUFLM_KT_W };
    if (gguflm_is_iq_grid(type)) {
        GGUFLM_SIMD(iq_ktile_decode)(type, bx, w, ws, R, i0, nsb, dec);
        return;
    }
    for (int s = 0; s < nsb; ++s) {
        GGUFLM_SIMD(ktile_sb) *o = &dec[s];
        gguflm_kt_vi v[W], sc[NSC][W], mn[W];
        float d[W] = {0}, dmin[W] = {0};
        for (int r = 0; r < W; ++r) {
            mn[r] = gguflm_kt_zero();
            for (int h = 0; h < NSC; ++h) sc[h][r] = gguflm_kt_zero();
        }
        for (int r = 0; r < R; ++r) {
            const uint8_t *xb = w + r * ws + (i0 + s) * bx;
            GGUFLM_SIMD(prefetch)(xb + GGUFLM_KT_SB * bx, bx);
            __m256i mn16;
            gguflm_kt_vi scr[NSC];
            GGUFLM_SIMD(kt_scales)(type, xb, scr, &mn16, &d[r], &dmin[r]);
            for (int h = 0; h < NSC; ++h) sc[h][r] = scr[h];
#if GGUFLM_SIMD_512
            mn[r] = _mm512_castsi256_si512(mn16);
#else
            mn[r] = mn16;
#endif
        }
        for (int h = 0; h < NSC; ++h) GGUFLM_SIMD(kt_store_lanes)(sc[h], &o->sc[W * h]);
        GGUFLM_SIMD(kt_transpose)(mn);   /* 8 int16 pairs a row: the first 8 vectors */
        for (int k = 0; k < 8; ++k) o->mn[k] = mn[k];
        GGUFLM_SIMD(kt_set_d)(o, d, dmin);
        for (int c = 0; c < QK_K / (4 * W); ++c) {
            for (int r = 0; r < W; ++r)
                v[r] = r < R ? GGUFLM_SIMD(kt_quants)(type, w + r * ws + (i0 + s) * bx, c) : gguflm_kt_zero();
            GGUFLM_SIMD(kt_store_lanes)(v, &o->q[W * c]);
            if (GGUFLM_KT_PRESCALED(type))   /* each byte of a 16-bit lane times the scale: no carry */
                for (int k = 0; k < W; ++k) {
                    const gguflm_kt_vi sc = o->sc[(W * c + k) / 4];
                    o->q[W * c + k] = gguflm_kt_mullo16(o->q[W * c + k], gguflm_kt_or(sc, gguflm_kt_slli32(sc, 16)));
                }
        }
    }
}

/* the R <= GGUFLM_KT_W outputs of a vector (lane r: row r): whole vectors, or through a buffer (no
 * masked moves: SIMDe's, in the emulated tests, write the whole vector) */
static inline gguflm_kt_vf GGUFLM_SIMD(kt_load)(const float *p, int R) {
    if (R == GGUFLM_KT_W) return gguflm_kt_loadf(p);
    float b[GGUFLM_KT_W] = {0};
    memcpy(b, p, sizeof(float) * R);
    return gguflm_kt_loadf(b);
}
static inline void GGUFLM_SIMD(kt_store)(float *p, int R, gguflm_kt_vf v) {
    if (R == GGUFLM_KT_W) {
        gguflm_kt_storef(p, v);
        return;
    }
    float b[GGUFLM_KT_W];
    gguflm_kt_storef(b, v);
    memcpy(p, b, sizeof(float) * R);
}

static inline int32_t GGUFLM_SIMD(kt_dword)(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#if GGUFLM_SIMD_AMX   /* out of line in the AMX target (quants_amx.h), called while the dispatch's amx is on */
GGUFLM_TARGET_AMX_BEGIN
/* ktile_tokens (below: the K GEMM's float steps, lane r = weight row r) of the TILED recipe for 16
 * tokens, each 32-element sub-block's sums (part, with -offset * its bsums) from the
 * tiles: C = the tokens' sub-block bytes (A, in their Q8_K blocks) times the decoded super-block's
 * vectors of the sub-block (B: q[g] lane r = row r's quants 4g..4g+3, B's row g), from the -offset
 * tile; then s1 += part * scale per sub-block and the super-block's float steps as there.
 * Sub-blocks go in pairs (C0, C1), stored to a ring of two pairs: the vector units take pair
 * q - 1 while the matrix unit computes pair q. */
static void GGUFLM_SIMD(ktile_tiled16_amx)(int type, const GGUFLM_SIMD(ktile_sb) *dec, int nsb, int64_t i0, const uint8_t *y,
                                           int64_t ys, float *out, int64_t os, int R) {
    enum { SUB = 32, PAIRS = QK_K / SUB / 2 };
    const int off = gguflm_kt_offset(type), has_min = gguflm_k_has_min(type);
    __m512 acc[16];
    __m512i s1[16];
    int32_t ring[2][2][16 * 16] __attribute__((aligned(64)));
    for (int t = 0; t < 16; ++t) acc[t] = i0 == 0 ? _mm512_setzero_ps() : GGUFLM_SIMD(kt_load)(out + t * os, R);
    GGUFLM_AMX_MEMORY(dec);   /* the decoded vectors' stores before the tile loads */
    for (int q = 0; q <= nsb * PAIRS; ++q) {
        if (q < nsb * PAIRS) {   /* pair q's sums into the ring */
            const int s = q / PAIRS, j = 2 * (q % PAIRS);
            const uint8_t *ya = y + (i0 + s) * (int64_t)sizeof(block_q8_K) + offsetof(block_q8_K, qs) + j * SUB;
            GGUFLM_AMX_BLOCK_DOT(GGUFLM_AMX_C0, GGUFLM_AMX_A0, GGUFLM_AMX_B0, ya, ys, &dec[s].q[j * SUB / 4], off);
            GGUFLM_AMX_BLOCK_DOT(GGUFLM_AMX_C1, GGUFLM_AMX_A1, GGUFLM_AMX_B1, ya + SUB, ys, &dec[s].q[(j + 1) * SUB / 4], off);
            _tile_stored(GGUFLM_AMX_C0, ring[q & 1][0], 64);
            _tile_stored(GGUFLM_AMX_C1, ring[q & 1][1], 64);
        }
        if (q == 0) continue;
        const int p = q - 1, s = p / PAIRS;   /* pair p's integer steps */
        const GGUFLM_SIMD(ktile_sb) *b = &dec[s];
        GGUFLM_AMX_MEMORY(ring[p & 1]);
        for (int h = 0; h < 2; ++h) {
            const int j = 2 * (p % PAIRS) + h;
            const int32_t *c = ring[p & 1][h];
            const __m512i sc = b->sc[j * SUB / 16];
            for (int t = 0; t < 16; ++t) {
                const __m512i part = _mm512_mullo_epi32(_mm512_load_si512((const void *)(c + 16 * t)), sc);
                s1[t] = j == 0 ? part : _mm512_add_epi32(s1[t], part);
            }
        }
        if (p % PAIRS != PAIRS - 1) continue;
        for (int t = 0; t < 16; ++t) {   /* the super-block's float steps */
            const block_q8_K *yb = (const block_q8_K *)(y + t * ys) + i0 + s;
            __m512 res = _mm512_mul_ps(b->d, _mm512_cvtepi32_ps(s1[t]));
            if (has_min) {
                __m512i s2 = _mm512_setzero_si512();
                for (int k = 0; k < 8; ++k)
                    s2 = _mm512_dpwssd_epi32(s2, b->mn[k], _mm512_set1_epi32(GGUFLM_SIMD(kt_dword)(&yb->bsums[2 * k])));
                res = _mm512_fmadd_ps(b->neg_dmin, _mm512_cvtepi32_ps(s2), res);
            }
            acc[t] = _mm512_fmadd_ps(res, _mm512_set1_ps(yb->d), acc[t]);
        }
    }
    for (int t = 0; t < 16; ++t) GGUFLM_SIMD(kt_store)(out + t * os, R, acc[t]);
}
GGUFLM_TARGET_END
#endif

/* (Every loop over the tile's tokens is unrolled by pragma: left to itself GCC kept the per-token
 * arrays in memory, a load and a store per step; Q4_K's repacked GEMM went from 265 to 425 GOP/s
 * a thread.)
 * T tokens (y + t*ys, row-major Q8_K) against the decoded super-blocks (the activation's i0 ..
 * i0+nsb-1), for R rows. parts 0: TILED, out[t * os + r] accumulated from 0 on the
 * first pass (i0 == 0), else from out. parts 2, 4: the repacked Q4_K/Q2_K GEMM recipe, one fma per
 * part of each chain: the scaled sums into out, the scaled mins into acc_min[t * 16 + r], both
 * from 0 on the first pass (the caller takes acc_min off at the end). */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(ktile_tokens)(int type, int parts,
                                                                           const GGUFLM_SIMD(ktile_sb) *dec, int nsb,
                                                                           int64_t i0, const uint8_t *y, int64_t ys,
                                                                           int T, float *out, int64_t os,
                                                                           float *acc_min, int R) {
    const int sub = gguflm_kt_sub(type), off = GGUFLM_KT_SIGNED(type) ? 0 : gguflm_kt_offset(type);
    const int has_min = gguflm_k_has_min(type), prescaled = GGUFLM_KT_PRESCALED(type);
    const int subs = QK_K / sub, subs_per_part = parts ? subs / parts : subs;
    gguflm_kt_vf acc[GGUFLM_KT_T], accm[GGUFLM_KT_T];
    #pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
        acc[t] = i0 == 0 ? gguflm_kt_zerof() : GGUFLM_SIMD(kt_load)(out + t * os, R);
        if (parts) accm[t] = i0 == 0 ? gguflm_kt_zerof() : gguflm_kt_loadf(acc_min + GGUFLM_KT_W * t);
    }
    for (int s = 0; s < nsb; ++s) {
        const GGUFLM_SIMD(ktile_sb) *b = &dec[s];
        const block_q8_K *yb[GGUFLM_KT_T];
        gguflm_kt_vi s1[GGUFLM_KT_T] = {gguflm_kt_zero()};   /* (set per part below) */
        gguflm_kt_vf scale[GGUFLM_KT_T], scale_min[GGUFLM_KT_T];   /* parts: d * y.d and dmin * y.d */
        #pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            yb[t] = (const block_q8_K *)(y + t * ys) + i0 + s;
            if (parts) {
                const gguflm_kt_vf yd = gguflm_kt_set1f(yb[t]->d);
                scale[t] = gguflm_kt_mulf(b->d, yd);
                scale_min[t] = gguflm_kt_mulf(b->dmin, yd);
            }
        }
        for (int j = 0; j < subs; ++j) {
            if (j % subs_per_part == 0)   /* a part's (TILED: the super-block's) first sub-block */
                #pragma GCC unroll 8
                for (int t = 0; t < T; ++t) s1[t] = gguflm_kt_zero();
            gguflm_kt_vi part[GGUFLM_KT_T];
            #pragma GCC unroll 8
            for (int t = 0; t < T; ++t)
                part[t] = prescaled ? s1[t]
                          : !off    ? gguflm_kt_zero()
                                    : gguflm_kt_set1(-off * (sub == 16 ? yb[t]->bsums[j] : yb[t]->bsums[2 * j] + yb[t]->bsums[2 * j + 1]));
#pragma GCC unroll 8
            for (int g = j * sub / 4; g < (j + 1) * sub / 4; ++g) {
                const gguflm_kt_vi q = b->q[g];
#if !GGUFLM_SIMD_512
                if (GGUFLM_KT_SIGNED(type)) {
                    const __m256i qa = _mm256_sign_epi8(q, q);
                    #pragma GCC unroll 8
                    for (int t = 0; t < T; ++t)
                        part[t] = gguflm_kt_dot(part[t], qa, _mm256_sign_epi8(gguflm_kt_set1(GGUFLM_SIMD(kt_dword)(yb[t]->qs + 4 * g)), q));
                    continue;
                }
#endif
                #pragma GCC unroll 8
                for (int t = 0; t < T; ++t)
                    part[t] = gguflm_kt_dot(part[t], q, gguflm_kt_set1(GGUFLM_SIMD(kt_dword)(yb[t]->qs + 4 * g)));
            }
            const gguflm_kt_vi sc = b->sc[j * sub / 16];
            #pragma GCC unroll 8
            for (int t = 0; t < T; ++t) s1[t] = prescaled ? part[t] : gguflm_kt_add(s1[t], gguflm_kt_mullo(part[t], sc));
            if (parts && j % subs_per_part == subs_per_part - 1) {
                /* the end of a part (64 or 128 elements): its sums and its mins (per 32 elements) */
                const int p = j / subs_per_part, k0 = 8 / parts * p, k1 = 8 / parts * (p + 1);
                #pragma GCC unroll 8
                for (int t = 0; t < T; ++t) {
                    gguflm_kt_vi s2 = gguflm_kt_zero();
                    for (int k = k0; k < k1; ++k)
                        s2 = gguflm_kt_dot16(s2, b->mn[k], gguflm_kt_set1(GGUFLM_SIMD(kt_dword)(&yb[t]->bsums[2 * k])));
                    acc[t] = gguflm_kt_fma(gguflm_kt_cvt(s1[t]), scale[t], acc[t]);
                    accm[t] = gguflm_kt_fma(gguflm_kt_cvt(s2), scale_min[t], accm[t]);
                }
            }
        }
        if (parts) continue;
        #pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            gguflm_kt_vf res = gguflm_kt_mulf(b->d, gguflm_kt_cvt(s1[t]));
            if (has_min) {
                gguflm_kt_vi s2 = gguflm_kt_zero();
                for (int k = 0; k < 8; ++k)
                    s2 = gguflm_kt_dot16(s2, b->mn[k], gguflm_kt_set1(GGUFLM_SIMD(kt_dword)(&yb[t]->bsums[2 * k])));
                res = gguflm_kt_fma(b->neg_dmin, gguflm_kt_cvt(s2), res);
            }
            acc[t] = gguflm_kt_fma(res, gguflm_kt_set1f(yb[t]->d), acc[t]);
        }
    }
    #pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
        GGUFLM_SIMD(kt_store)(out + t * os, R, acc[t]);
        if (parts) gguflm_kt_storef(acc_min + GGUFLM_KT_W * t, accm[t]);
    }
}

/* any rows x nt tokens: GGUFLM_KT_W rows at a time, each pass of GGUFLM_KT_SB super-blocks decoded once
 * for up to GGUFLM_KT_TOKENS tokens (GGUFLM_KT_T per tile, the rest in one smaller tile); parts:
 * see ktile_tokens */
#define GGUFLM_KT_TOKENS 256
static inline __attribute__((always_inline)) void GGUFLM_SIMD(ktile_gemm)(int type, int parts, size_t bx, int64_t n,
                                                                         const uint8_t *w, int64_t ws, int64_t nr,
                                                                         const uint8_t *y, int64_t ys, int64_t nt,
                                                                         float *o, int64_t os) {
    GGUFLM_SIMD(ktile_sb) dec[GGUFLM_KT_SB];
    float acc_min[parts ? GGUFLM_KT_TOKENS * GGUFLM_KT_W : 1] __attribute__((aligned(64)));
    const int64_t nb = n / QK_K;
    /* TILED's 16-token tiles through AMX where it is on, for the types of 32-element sub-blocks:
     * on an Intel Xeon with AMX (one thread's CPU clock, 2048x2048, 512 tokens) IQ4_XS 301 -> 410
     * GOP/s, IQ3_S 286 -> 386, Q4_K 320 -> 383, Q5_K 324 -> 389; not Q6_K and Q3_K (16-element
     * sub-blocks: 247 -> 248, 253 -> 251 in a first version, the vpmulld per sub-block and token
     * stays), nor the repacked Q4_K GEMM (its per-part chains of 16 tokens spilled: 262 -> 224) */
    const int amx = GGUFLM_SIMD_AMX && nt >= 16 && gguflm_kt_amx_type(type, parts) && gguflm_amx_on();
#if GGUFLM_SIMD_AMX
    if (amx) gguflm_amx_begin(32, gguflm_kt_offset(type));
#endif
    for (int64_t r0 = 0; r0 < nr; r0 += GGUFLM_KT_W) {
        const int R = (int)(nr - r0 < GGUFLM_KT_W ? nr - r0 : GGUFLM_KT_W);
        for (int64_t t0 = 0; t0 < nt; t0 += GGUFLM_KT_TOKENS) {
            const int64_t t1 = t0 + GGUFLM_KT_TOKENS < nt ? t0 + GGUFLM_KT_TOKENS : nt;
            for (int64_t i0 = 0; i0 < nb; i0 += GGUFLM_KT_SB) {
                const int nsb = (int)(nb - i0 < GGUFLM_KT_SB ? nb - i0 : GGUFLM_KT_SB);
                GGUFLM_SIMD(ktile_decode)(type, bx, w + r0 * ws, ws, R, i0, nsb, dec);
#define GGUFLM_KT_TILE(T)                                                                                        \
    GGUFLM_SIMD(ktile_tokens)(type, parts, dec, nsb, i0, y + t * ys, ys, T, o + t * os + r0, os,                 \
                              acc_min + (parts ? GGUFLM_KT_W * (t - t0) : 0), R)
                int64_t t = t0;
#if GGUFLM_SIMD_AMX
                if (amx)
                    for (; t + 16 <= t1; t += 16) GGUFLM_SIMD(ktile_tiled16_amx)(type, dec, nsb, i0, y + t * ys, ys, o + t * os + r0, os, R);
#endif
                if (parts)
                    for (; t + GGUFLM_KT_T_PARTS <= t1; t += GGUFLM_KT_T_PARTS) GGUFLM_KT_TILE(GGUFLM_KT_T_PARTS);
                else
                    for (; t + GGUFLM_KT_T <= t1; t += GGUFLM_KT_T) GGUFLM_KT_TILE(GGUFLM_KT_T);
                switch (t1 - t) {   /* GGUFLM_KT_T - 1 at most */
#if GGUFLM_KT_T > 4
                case 7: GGUFLM_KT_TILE(7); break;
                case 6: GGUFLM_KT_TILE(6); break;
                case 5: GGUFLM_KT_TILE(5); break;
                case 4: GGUFLM_KT_TILE(4); break;
#endif
                case 3: GGUFLM_KT_TILE(3); break;
                case 2: GGUFLM_KT_TILE(2); break;
                case 1: GGUFLM_KT_TILE(1); break;
                default: break;
                }
#undef GGUFLM_KT_TILE
            }
            if (parts)   /* out = acc - acc_min */
                for (int64_t t = t0; t < t1; ++t)
                    GGUFLM_SIMD(kt_store)(o + t * os + r0, R, gguflm_kt_subf(GGUFLM_SIMD(kt_load)(o + t * os + r0, R),
                                                                            gguflm_kt_loadf(acc_min + GGUFLM_KT_W * (t - t0))));
        }
    }
#if GGUFLM_SIMD_AMX
    if (amx) gguflm_amx_end();
#else
    (void)amx;
#endif
}
