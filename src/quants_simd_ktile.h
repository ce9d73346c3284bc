/* AVX-512 TILED GEMM of the K-quants (Q2_K .. Q6_K), IQ4_XS and the grid i-quants for batches:
 * ggml's TILED recipe (one exact integer per super-block, res = d*s1 (- dmin*s2 fused),
 * out = fma(res, y.d, out); quants_dot.h, quants_iq.h)
 * with the integer part done by vpdpbusd on 512-bit vectors, 16 weight rows per vector.
 * Included by quants_simd_body.h in its AVX-512 copy only (GGUFLM_SIMD_512). No include guard.
 *
 * Inside a super-block everything is integer, so the work is laid out for the instruction:
 * 16 weight rows are decoded once per call (a few super-blocks at a time, into L1) into vectors
 * whose lane r holds 4 consecutive unsigned quants of row r, and the activation's 4 matching int8
 * values come as one broadcast dword; vpdpbusd then gives lane r = row r's 4 products, and 4 (or 8)
 * of them in a row make a 16-element (32-element) sub-block's sum. Per sub-block one vpmulld by the
 * rows' scales (lane r = row r's), so no horizontal sums at all: lane r of the result is s1 of row
 * r. Offsets (Q3_K 4, Q6_K 32, IQ4_XS 128, the grids 64 or 16) start each sub-block's sum at
 * -offset * the activation's bsum; the mins (s2) are one vpdpwssd of the rows' min pairs by the bsum pairs per 32 elements.
 * The float steps then run 16 rows per instruction, lane by lane the scalar recipe's. The repacked
 * Q4_K / Q2_K GEMM recipe (gguflm_k_repack_1: a float step per 64 or 128 elements) takes the same
 * integers per part; ggml's repack is of no use here, the file's layout is decoded as it is.
 */

#define GGUFLM_KT_SB 4          /* super-blocks decoded per pass: 16 rows' stay in L1 (23 KB) */
#define GGUFLM_KT_T 8           /* tokens per register tile */
#define GGUFLM_KT_T_PARTS 4     /* the repacked GEMM's: its per-part chains of the sums and the
                                 * mins spill at 8 (Q4_K, a thread: 432 GOP/s at 4, 388 at 6, 360 at 8) */
#define GGUFLM_KT_MIN_TOKENS 16 /* fewer tokens: TILED goes to k_sums_tile (decoding would not pay) */
#define GGUFLM_KT_MIN_REPACK 32 /* and the repacked GEMM to q4_K_rows8_tile (as fast at 24 tokens) */

/* one super-block of 16 weight rows, decoded; lane r of each vector is row r */
typedef struct {
    __m512i q[QK_K / 4];  /* unsigned quants 4g .. 4g+3 */
    __m512i sc[16];       /* int32 scale of each 16 elements (32-element types: the pair's, twice) */
    __m512i mn[8];        /* int16 pair of the mins of elements 32k .. 32k+31 (per 16 elements) */
    __m512 d, dmin, neg_dmin;
} GGUFLM_SIMD(ktile_sb);

/* v[i] lane j <-> v[j] lane i: off-diagonal blocks of 8, 4, 2, 1 swapped in turn */
static inline void GGUFLM_SIMD(transpose16_epi32)(__m512i v[16]) {
    for (int b = 8; b >= 1; b /= 2) {
        int lo_idx[16], hi_idx[16];
        for (int l = 0; l < 16; ++l) {
            lo_idx[l] = (l & b) ? 16 + l - b : l;
            hi_idx[l] = (l & b) ? 16 + l : l + b;
        }
        const __m512i lo = _mm512_loadu_si512((const void *)lo_idx), hi = _mm512_loadu_si512((const void *)hi_idx);
        for (int i = 0; i < 16; ++i)
            if (!(i & b)) {
                const __m512i a = v[i], c = v[i + b];
                v[i] = _mm512_permutex2var_epi32(a, lo, c);
                v[i + b] = _mm512_permutex2var_epi32(a, hi, c);
            }
    }
}

/* per type: elements per scale, and the offset of the unsigned quants (IQ4_XS: its signed table
 * values + 128; the grid i-quants: their signed values, at most 62 in size, + 64, IQ1's 8 * grid +
 * delta, at most 9, + 16) */
static inline int gguflm_kt_sub(int type) {
    return type == GGUFLM_Q4_K || type == GGUFLM_Q5_K || type == GGUFLM_IQ4_XS || type == GGUFLM_IQ2_XXS ||
                   type == GGUFLM_IQ3_XXS || type == GGUFLM_IQ3_S || type == GGUFLM_IQ1_S
               ? 32
               : 16;
}
static inline int gguflm_kt_offset(int type) {
    if (gguflm_is_iq_grid(type)) return gguflm_iq_is_1bit(type) ? 16 : 64;
    return type == GGUFLM_Q3_K ? 4 : type == GGUFLM_Q6_K ? 32 : type == GGUFLM_IQ4_XS ? 128 : 0;
}

/* the grid i-quants' decoding into the same layout (quants_iq_simd.h, included after this file) */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(iq_ktile_decode)(int type, size_t bx, const uint8_t *w,
                                                                              int64_t ws, int R, int64_t i0, int nsb,
                                                                              GGUFLM_SIMD(ktile_sb) *dec);

/* the 64 unsigned quants of elements 64c .. 64c+63 of a super-block */
static inline __attribute__((always_inline)) __m512i GGUFLM_SIMD(kt_quants)(int type, const uint8_t *xb, int c) {
    if (type == GGUFLM_IQ4_XS) {
        const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)gguflm_kvalues_iq4nl));
        const uint8_t *qs = ((const block_iq4_xs *)xb)->qs + 32 * c;
        const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_shuffle_epi8(table, GGUFLM_SIMD(nibbles_32)(qs))),
                                             _mm256_shuffle_epi8(table, GGUFLM_SIMD(nibbles_32)(qs + 16)), 1);
        return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(GGUFLM_SIMD(kquants)(type, xb, 2 * c)),
                              GGUFLM_SIMD(kquants)(type, xb, 2 * c + 1), 1);
}

/* a super-block's 16 int32 scales (one per 16 elements), its 16 int16 mins, d and dmin */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(kt_scales)(int type, const uint8_t *xb, __m512i *sc,
                                                                        __m256i *mn16, float *d, float *dmin) {
    if (type == GGUFLM_IQ4_XS) {
        const block_iq4_xs *b = (const block_iq4_xs *)xb;
        int32_t ls[16];
        for (int c = 0; c < 8; ++c) ls[2 * c] = ls[2 * c + 1] = gguflm_iq4_xs_scale(b, c);
        *sc = _mm512_loadu_si512((const void *)ls);
        *mn16 = _mm256_setzero_si256();
        *d = GGUFLM_FP16_TO_FP32_SIMD(b->d);
        *dmin = 0.0f;
        return;
    }
    __m256i sc16;
    GGUFLM_SIMD(kscales)(type, xb, &sc16, mn16, d, dmin);
    *sc = _mm512_cvtepi16_epi32(sc16);
}

/* super-blocks i0 .. i0+nsb-1 of R <= 16 rows (the missing ones zero) into dec (neg_dmin: -dmin for
 * TILED's fma(-dmin, s2, res), fused: SIMDe's vfnmadd is not) */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(ktile_decode)(int type, size_t bx, const uint8_t *w,
                                                                           int64_t ws, int R, int64_t i0, int nsb,
                                                                           GGUFLM_SIMD(ktile_sb) *dec) {
    if (gguflm_is_iq_grid(type)) {
        GGUFLM_SIMD(iq_ktile_decode)(type, bx, w, ws, R, i0, nsb, dec);
        return;
    }
    for (int s = 0; s < nsb; ++s) {
        GGUFLM_SIMD(ktile_sb) *o = &dec[s];
        __m512i v[16], sc[16], mn[16];
        float d[16] = {0}, dmin[16] = {0};
        for (int r = 0; r < 16; ++r) sc[r] = mn[r] = _mm512_setzero_si512();
        for (int r = 0; r < R; ++r) {
            const uint8_t *xb = w + r * ws + (i0 + s) * bx;
            GGUFLM_SIMD(prefetch)(xb + GGUFLM_KT_SB * bx, bx);
            __m256i mn16;
            GGUFLM_SIMD(kt_scales)(type, xb, &sc[r], &mn16, &d[r], &dmin[r]);
            mn[r] = _mm512_castsi256_si512(mn16);
        }
        GGUFLM_SIMD(transpose16_epi32)(sc);
        GGUFLM_SIMD(transpose16_epi32)(mn);
        for (int j = 0; j < 16; ++j) o->sc[j] = sc[j];
        for (int k = 0; k < 8; ++k) o->mn[k] = mn[k];
        o->d = _mm512_loadu_ps(d);
        o->dmin = _mm512_loadu_ps(dmin);
        for (int r = 0; r < 16; ++r) dmin[r] = -dmin[r];
        o->neg_dmin = _mm512_loadu_ps(dmin);
        for (int c = 0; c < QK_K / 64; ++c) {
            for (int r = 0; r < 16; ++r)
                v[r] = r < R ? GGUFLM_SIMD(kt_quants)(type, w + r * ws + (i0 + s) * bx, c) : _mm512_setzero_si512();
            GGUFLM_SIMD(transpose16_epi32)(v);
            for (int k = 0; k < 16; ++k) o->q[16 * c + k] = v[k];
        }
    }
}

/* the R <= 16 outputs of a vector (lane r: row r): whole vectors, or through a buffer (no masked
 * moves: SIMDe's, in the emulated tests, write the whole vector) */
static inline __m512 GGUFLM_SIMD(kt_load)(const float *p, int R) {
    if (R == 16) return _mm512_loadu_ps(p);
    float b[16] = {0};
    memcpy(b, p, sizeof(float) * R);
    return _mm512_loadu_ps(b);
}
static inline void GGUFLM_SIMD(kt_store)(float *p, int R, __m512 v) {
    if (R == 16) {
        _mm512_storeu_ps(p, v);
        return;
    }
    float b[16];
    _mm512_storeu_ps(b, v);
    memcpy(p, b, sizeof(float) * R);
}

static inline int32_t GGUFLM_SIMD(kt_dword)(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

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
    const int sub = gguflm_kt_sub(type), off = gguflm_kt_offset(type), has_min = gguflm_k_has_min(type);
    const int subs = QK_K / sub, subs_per_part = parts ? subs / parts : subs;
    __m512 acc[GGUFLM_KT_T], accm[GGUFLM_KT_T];
    #pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
        acc[t] = i0 == 0 ? _mm512_setzero_ps() : GGUFLM_SIMD(kt_load)(out + t * os, R);
        if (parts) accm[t] = i0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(acc_min + 16 * t);
    }
    for (int s = 0; s < nsb; ++s) {
        const GGUFLM_SIMD(ktile_sb) *b = &dec[s];
        const block_q8_K *yb[GGUFLM_KT_T];
        __m512i s1[GGUFLM_KT_T] = {_mm512_setzero_si512()};   /* (set per part below) */
        __m512 scale[GGUFLM_KT_T], scale_min[GGUFLM_KT_T];   /* parts: d * y.d and dmin * y.d */
        #pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            yb[t] = (const block_q8_K *)(y + t * ys) + i0 + s;
            if (parts) {
                const __m512 yd = _mm512_set1_ps(yb[t]->d);
                scale[t] = _mm512_mul_ps(b->d, yd);
                scale_min[t] = _mm512_mul_ps(b->dmin, yd);
            }
        }
        for (int j = 0; j < subs; ++j) {
            if (j % subs_per_part == 0)   /* a part's (TILED: the super-block's) first sub-block */
                #pragma GCC unroll 8
                for (int t = 0; t < T; ++t) s1[t] = _mm512_setzero_si512();
            __m512i part[GGUFLM_KT_T];
            #pragma GCC unroll 8
            for (int t = 0; t < T; ++t)
                part[t] = !off ? _mm512_setzero_si512()
                          : _mm512_set1_epi32(-off * (sub == 16 ? yb[t]->bsums[j] : yb[t]->bsums[2 * j] + yb[t]->bsums[2 * j + 1]));
#pragma GCC unroll 8
            for (int g = j * sub / 4; g < (j + 1) * sub / 4; ++g) {
                const __m512i q = b->q[g];
                #pragma GCC unroll 8
                for (int t = 0; t < T; ++t)
                    part[t] = _mm512_dpbusd_epi32(part[t], q, _mm512_set1_epi32(GGUFLM_SIMD(kt_dword)(yb[t]->qs + 4 * g)));
            }
            const __m512i sc = b->sc[j * sub / 16];
            #pragma GCC unroll 8
            for (int t = 0; t < T; ++t) s1[t] = _mm512_add_epi32(s1[t], _mm512_mullo_epi32(part[t], sc));
            if (parts && j % subs_per_part == subs_per_part - 1) {
                /* the end of a part (64 or 128 elements): its sums and its mins (per 32 elements) */
                const int p = j / subs_per_part, k0 = 8 / parts * p, k1 = 8 / parts * (p + 1);
                #pragma GCC unroll 8
                for (int t = 0; t < T; ++t) {
                    __m512i s2 = _mm512_setzero_si512();
                    for (int k = k0; k < k1; ++k)
                        s2 = _mm512_dpwssd_epi32(s2, b->mn[k], _mm512_set1_epi32(GGUFLM_SIMD(kt_dword)(&yb[t]->bsums[2 * k])));
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1[t]), scale[t], acc[t]);
                    accm[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s2), scale_min[t], accm[t]);
                }
            }
        }
        if (parts) continue;
        #pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            __m512 res = _mm512_mul_ps(b->d, _mm512_cvtepi32_ps(s1[t]));
            if (has_min) {
                __m512i s2 = _mm512_setzero_si512();
                for (int k = 0; k < 8; ++k)
                    s2 = _mm512_dpwssd_epi32(s2, b->mn[k], _mm512_set1_epi32(GGUFLM_SIMD(kt_dword)(&yb[t]->bsums[2 * k])));
                res = _mm512_fmadd_ps(b->neg_dmin, _mm512_cvtepi32_ps(s2), res);
            }
            acc[t] = _mm512_fmadd_ps(res, _mm512_set1_ps(yb[t]->d), acc[t]);
        }
    }
    #pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
        GGUFLM_SIMD(kt_store)(out + t * os, R, acc[t]);
        if (parts) _mm512_store_ps(acc_min + 16 * t, accm[t]);
    }
}

/* any rows x nt tokens: 16 rows at a time, each pass of GGUFLM_KT_SB super-blocks decoded once
 * for up to GGUFLM_KT_TOKENS tokens (GGUFLM_KT_T per tile, the rest in one smaller tile); parts:
 * see ktile_tokens */
#define GGUFLM_KT_TOKENS 256
static inline __attribute__((always_inline)) void GGUFLM_SIMD(ktile_gemm)(int type, int parts, size_t bx, int64_t n,
                                                                         const uint8_t *w, int64_t ws, int64_t nr,
                                                                         const uint8_t *y, int64_t ys, int64_t nt,
                                                                         float *o, int64_t os) {
    GGUFLM_SIMD(ktile_sb) dec[GGUFLM_KT_SB];
    float acc_min[parts ? GGUFLM_KT_TOKENS * 16 : 1] __attribute__((aligned(64)));
    const int64_t nb = n / QK_K;
    for (int64_t r0 = 0; r0 < nr; r0 += 16) {
        const int R = (int)(nr - r0 < 16 ? nr - r0 : 16);
        for (int64_t t0 = 0; t0 < nt; t0 += GGUFLM_KT_TOKENS) {
            const int64_t t1 = t0 + GGUFLM_KT_TOKENS < nt ? t0 + GGUFLM_KT_TOKENS : nt;
            for (int64_t i0 = 0; i0 < nb; i0 += GGUFLM_KT_SB) {
                const int nsb = (int)(nb - i0 < GGUFLM_KT_SB ? nb - i0 : GGUFLM_KT_SB);
                GGUFLM_SIMD(ktile_decode)(type, bx, w + r0 * ws, ws, R, i0, nsb, dec);
#define GGUFLM_KT_TILE(T)                                                                                        \
    GGUFLM_SIMD(ktile_tokens)(type, parts, dec, nsb, i0, y + t * ys, ys, T, o + t * os + r0, os,                 \
                              acc_min + (parts ? 16 * (t - t0) : 0), R)
                int64_t t = t0;
                if (parts)
                    for (; t + GGUFLM_KT_T_PARTS <= t1; t += GGUFLM_KT_T_PARTS) GGUFLM_KT_TILE(GGUFLM_KT_T_PARTS);
                else
                    for (; t + GGUFLM_KT_T <= t1; t += GGUFLM_KT_T) GGUFLM_KT_TILE(GGUFLM_KT_T);
                switch (t1 - t) {   /* GGUFLM_KT_T - 1 at most */
                case 7: GGUFLM_KT_TILE(7); break;
                case 6: GGUFLM_KT_TILE(6); break;
                case 5: GGUFLM_KT_TILE(5); break;
                case 4: GGUFLM_KT_TILE(4); break;
                case 3: GGUFLM_KT_TILE(3); break;
                case 2: GGUFLM_KT_TILE(2); break;
                case 1: GGUFLM_KT_TILE(1); break;
                default: break;
                }
#undef GGUFLM_KT_TILE
            }
            if (parts)   /* out = acc - acc_min */
                for (int64_t t = t0; t < t1; ++t)
                    GGUFLM_SIMD(kt_store)(o + t * os + r0, R, _mm512_sub_ps(GGUFLM_SIMD(kt_load)(o + t * os + r0, R),
                                                                            _mm512_load_ps(acc_min + 16 * (t - t0))));
        }
    }
}
