/* SIMD kernels of issue 15's value-table and ternary formats (IQ4_NL, MXFP4, IQ4_XS, TQ1_0,
 * TQ2_0), included by quants_simd_body.h and so compiled once for AVX2 and once for AVX-512 with
 * VNNI (dot_u8_s8: vpmaddubsw + vpmaddwd, or vpdpbusd; the same exact int32 lanes). Each output
 * follows its scalar recipe in quants_lut_dot.h step for step: the integer lanes are the same
 * (exact), the float steps the same instructions in the same order.
 * No include guard: included once per ISA.
 */

/* 16 bytes of 4-bit indices -> their 32 table values (low nibbles: elements 0-15, high: 16-31) */
static inline __m256i GGUFLM_SIMD(lut_32)(__m256i table, const uint8_t *qs) {
    return _mm256_shuffle_epi8(table, GGUFLM_SIMD(nibbles_32)(qs));
}

/* signed v . signed y in 8 int32 lanes of 4 adjacent products (|v| <= 127: no int16 saturation) */
static inline __m256i GGUFLM_SIMD(dot_s8_s8)(__m256i v, __m256i y) {
    return GGUFLM_SIMD(dot_u8_s8)(_mm256_sign_epi8(v, v), _mm256_sign_epi8(y, v));
}

static inline __m256i GGUFLM_SIMD(lut_table)(const int8_t *t) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t));
}

/* ---- 32-element blocks (IQ4_NL, MXFP4) against Q8_0 ---- */
static inline __attribute__((always_inline)) float GGUFLM_SIMD(lut32_1)(int path, int type, int arith, int64_t n,
                                                                       const uint8_t *x, const block_q8_0 *y) {
    const __m256i table = GGUFLM_SIMD(lut_table)(gguflm_lut32_table(type));
    const size_t bx = gguflm_lut32_bytes(type);
    const int64_t nb = n / 32;
#define GGUFLM_LUT32_LANES(ib)                                                                                   \
    GGUFLM_SIMD(dot_s8_s8)(GGUFLM_SIMD(lut_32)(table, gguflm_lut32_qs(type, x + (ib) * bx)),                     \
                           _mm256_loadu_si256((const __m256i *)y[ib].qs))
    if (path == GGUFLM_PATH_DOT || path == GGUFLM_PATH_DOT_STREAM) {
        __m256 acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
        int64_t ib = 0;
        for (; ib + 1 < nb; ib += 2) {
            GGUFLM_SIMD(prefetch)(x + (ib + 8) * bx, 2 * bx);
            const float d1 = GGUFLM_FP16_TO_FP32_SIMD(y[ib].d) * gguflm_lut32_scale(type, x + ib * bx);
            const float d2 = GGUFLM_FP16_TO_FP32_SIMD(y[ib + 1].d) * gguflm_lut32_scale(type, x + (ib + 1) * bx);
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1), _mm256_cvtepi32_ps(GGUFLM_LUT32_LANES(ib)), acc1);
            acc2 = _mm256_fmadd_ps(_mm256_set1_ps(d2), _mm256_cvtepi32_ps(GGUFLM_LUT32_LANES(ib + 1)), acc2);
        }
        float sumf = GGUFLM_SIMD(hsum_f32)(_mm256_add_ps(acc1, acc2));
        if (ib < nb) {
            const float d = GGUFLM_FP16_TO_FP32_SIMD(y[ib].d) * gguflm_lut32_scale(type, x + ib * bx);
            const float sum = (float)GGUFLM_SIMD(hsum_i32)(GGUFLM_LUT32_LANES(ib));
            sumf = gguflm_arith_fuses_loop_sums(arith) ? fmaf(d, sum, sumf) : sumf + d * sum;
        }
        return sumf;
    }
    __m256 acc = _mm256_setzero_ps();   /* SGEMM: tinyBLAS_Q0's one chain */
    for (int64_t ib = 0; ib < nb; ++ib) {
        const float d = gguflm_lut32_scale(type, x + ib * bx) * GGUFLM_FP16_TO_FP32_SIMD(y[ib].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(GGUFLM_LUT32_LANES(ib)), acc);
    }
    return GGUFLM_SIMD(hsum_f32)(acc);
#undef GGUFLM_LUT32_LANES
}

/* ---- 256-element super-blocks against Q8_K ---- */

/* q * 3 and q * 9 per byte, mod 256 (no 8-bit multiply: shifts within 16-bit lanes, masked) */
static inline __m256i GGUFLM_SIMD(mul3_u8)(__m256i q) { return _mm256_add_epi8(q, _mm256_add_epi8(q, q)); }
static inline __m256i GGUFLM_SIMD(mul9_u8)(__m256i q) {
    return _mm256_add_epi8(_mm256_and_si256(_mm256_slli_epi16(q, 3), _mm256_set1_epi8((char)0xF8)), q);
}

/* the top trit of each byte, 3 q / 256: avg(q', avg(q', 0)) with q' = q - 1 (saturating) is
 * (3 q' + 3) / 4 rounded down, whose bits 6-7 are those of 3 q / 256 for every byte q */
static inline __m256i GGUFLM_SIMD(top_trit)(__m256i q) {
    const __m256i zero = _mm256_setzero_si256();
    q = _mm256_subs_epu8(q, _mm256_set1_epi8(1));
    q = _mm256_avg_epu8(q, _mm256_avg_epu8(q, zero));
    return _mm256_and_si256(_mm256_srli_epi16(q, 6), _mm256_set1_epi8(3));
}

/* the unsigned values (value + 1) of elements 32c .. 32c+31 of a ternary super-block */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(tq_values)(int type, const uint8_t *xb, __m256i u[8]) {
    if (type == GGUFLM_TQ2_0) {
        const block_tq2_0 *b = (const block_tq2_0 *)xb;
        const __m256i m3 = _mm256_set1_epi8(3);
        for (int h = 0; h < 2; ++h) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * h));
            u[4 * h + 0] = _mm256_and_si256(q, m3);
            u[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 2), m3);
            u[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m3);
            u[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16(q, 6), m3);
        }
        return;
    }
    const block_tq1_0 *b = (const block_tq1_0 *)xb;
    /* elements 0-159: trit n of the 32 bytes qs[0..31] for elements 32n .. 32n+31 */
    const __m256i q = _mm256_loadu_si256((const __m256i *)b->qs);
    const __m256i q3 = GGUFLM_SIMD(mul3_u8)(q), q9 = GGUFLM_SIMD(mul9_u8)(q);
    u[0] = GGUFLM_SIMD(top_trit)(q);
    u[1] = GGUFLM_SIMD(top_trit)(q3);
    u[2] = GGUFLM_SIMD(top_trit)(q9);
    u[3] = GGUFLM_SIMD(top_trit)(GGUFLM_SIMD(mul9_u8)(q3));
    u[4] = GGUFLM_SIMD(top_trit)(GGUFLM_SIMD(mul9_u8)(q9));
    /* elements 160-239: trit n of qs[32..47] for 160 + 16n .. ; 240-255: trit p/4 of qh[p % 4] */
    const __m256i r = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b->qs + 32)));
    const __m256i r3 = GGUFLM_SIMD(mul3_u8)(r), r9 = GGUFLM_SIMD(mul9_u8)(r);
    /* qh's 4 bytes times 1, 3, 9, 27 in the 4 words of each half (in registers: bytes stored one
     * by one and loaded as a vector stall the load) */
    const __m256i x = _mm256_set1_epi32((int)gguflm_u32_at(b->qh)), x9 = GGUFLM_SIMD(mul9_u8)(x);
    const __m256i h = _mm256_blend_epi32(_mm256_blend_epi32(x, GGUFLM_SIMD(mul3_u8)(x), 0x22),
                                         _mm256_blend_epi32(x9, GGUFLM_SIMD(mul3_u8)(x9), 0x88), 0xCC);
    const __m256i r81 = GGUFLM_SIMD(mul9_u8)(r9);
    u[5] = GGUFLM_SIMD(top_trit)(_mm256_blend_epi32(r, r3, 0xF0));
    u[6] = GGUFLM_SIMD(top_trit)(_mm256_blend_epi32(r9, GGUFLM_SIMD(mul3_u8)(r9), 0xF0));
    u[7] = GGUFLM_SIMD(top_trit)(_mm256_blend_epi32(r81, h, 0xF0));
}

/* the recipe's 8 int32 lanes of a ternary super-block's unsigned values u (at most 2) against the
 * activation's 256 quants, lane l: elements 4l..4l+3 of every chunk. Without VNNI the 8 chunks'
 * vpmaddubsw pair sums (at most 2 * 2 * 128 each) add up as int16 and widen once: 16 instructions
 * where a vpmaddwd and an add per chunk took 24 */
static inline __attribute__((always_inline)) __m256i GGUFLM_SIMD(tq_lanes)(const __m256i u[8], const int8_t *qs) {
#if GGUFLM_SIMD_VNNI
    __m256i lanes = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c) lanes = _mm256_dpbusd_epi32(lanes, u[c], _mm256_loadu_si256((const __m256i *)(qs + 32 * c)));
    return lanes;
#else
    __m256i pairs = _mm256_maddubs_epi16(u[0], _mm256_loadu_si256((const __m256i *)qs));
    for (int c = 1; c < 8; ++c)
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(u[c], _mm256_loadu_si256((const __m256i *)(qs + 32 * c))));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}

/* one row against T <= 4 tokens (out[t * os]): each super-block's values are decoded once for the
 * tokens, then per token the 8 int32 lanes of gguflm_lut256_lanes and the recipe's float step */
#define GGUFLM_LUT256_TOKENS 4
static inline __attribute__((always_inline)) void GGUFLM_SIMD(lut256_tile)(int path, int type, int64_t n,
                                                                          const uint8_t *x, const uint8_t *y,
                                                                          int64_t ys, int T, float *out, int64_t os) {
    const size_t bx = gguflm_lut256_bytes(type);
    const __m256i table = GGUFLM_SIMD(lut_table)(gguflm_kvalues_iq4nl);
    __m256 acc[GGUFLM_LUT256_TOKENS];
    float tiled[GGUFLM_LUT256_TOKENS];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps(), tiled[t] = 0.0f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const uint8_t *xb = x + i * bx;
        GGUFLM_SIMD(prefetch)(xb + 2 * bx, bx);
        __m256i u[8];
        int32_t ls[8];
        if (type == GGUFLM_IQ4_XS) {
            const block_iq4_xs *b = (const block_iq4_xs *)xb;
            for (int c = 0; c < 8; ++c) {
                u[c] = GGUFLM_SIMD(lut_32)(table, b->qs + 16 * c);
                ls[c] = gguflm_iq4_xs_scale(b, c);
            }
        } else {
            GGUFLM_SIMD(tq_values)(type, xb, u);
        }
        const float dx = GGUFLM_FP16_TO_FP32_SIMD(type == GGUFLM_IQ4_XS ? ((const block_iq4_xs *)xb)->d : gguflm_tq_d(type, xb));
        for (int t = 0; t < T; ++t) {
            const block_q8_K *yb = (const block_q8_K *)(y + t * ys) + i;
            __m256i lanes;
            if (type == GGUFLM_IQ4_XS) {
                lanes = _mm256_setzero_si256();
                for (int c = 0; c < 8; ++c) {
                    const __m256i qy = _mm256_loadu_si256((const __m256i *)(yb->qs + 32 * c));
                    lanes = _mm256_add_epi32(lanes, _mm256_mullo_epi32(GGUFLM_SIMD(dot_s8_s8)(u[c], qy), _mm256_set1_epi32(ls[c])));
                }
            } else {   /* less the ternary offset, through the activation's bsums */
                lanes = _mm256_sub_epi32(GGUFLM_SIMD(tq_lanes)(u, yb->qs),
                                         _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)yb->bsums), _mm256_set1_epi16(1)));
            }
            if (path == GGUFLM_PATH_TILED)
                tiled[t] = gguflm_tiled_step(0, dx, 0.0f, GGUFLM_SIMD(hsum_i32)(lanes), 0, yb->d, tiled[t]);
            else if (type == GGUFLM_IQ4_XS)
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dx * yb->d), _mm256_cvtepi32_ps(lanes), acc[t]);
            else
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(yb->d * dx), acc[t]);
        }
    }
    for (int t = 0; t < T; ++t) out[t * os] = path == GGUFLM_PATH_TILED ? tiled[t] : GGUFLM_SIMD(hsum_f32)(acc[t]);
}

/* rows x tokens, one output at a time (each weight row stays in L1 across the tokens) */
#define GGUFLM_SIMD_LUT(path, tag, TYPE, ONE, YT)                                                                \
    static void GGUFLM_SIMD(path##_##tag)(int64_t n, const uint8_t *w, int64_t ws, int64_t nr, const uint8_t *y, \
                                          int64_t ys, int64_t nt, float *o, int64_t os, int arith) {             \
        for (int64_t r = 0; r < nr; ++r)                                                                         \
            for (int64_t t = 0; t < nt; ++t)                                                                     \
                o[t * os + r] = GGUFLM_SIMD(ONE)(GGUFLM_PATH_##path, TYPE, arith, n, w + r * ws,               \
                                                 (const YT *)(y + t * ys));                                      \
    }
GGUFLM_SIMD_LUT(DOT, iq4_nl, GGUFLM_IQ4_NL, lut32_1, block_q8_0)
GGUFLM_SIMD_LUT(SGEMM, iq4_nl, GGUFLM_IQ4_NL, lut32_1, block_q8_0)
GGUFLM_SIMD_LUT(DOT, mxfp4, GGUFLM_MXFP4, lut32_1, block_q8_0)
#undef GGUFLM_SIMD_LUT
/* 256-element super-blocks: a row against the tokens in fours; a single token gets the tile
 * compiled for T = 1 (decode streams the weights: no per-token arrays there) */
#define GGUFLM_SIMD_LUT256(path, tag, TYPE)                                                                      \
    static void GGUFLM_SIMD(path##_##tag)(int64_t n, const uint8_t *w, int64_t ws, int64_t nr, const uint8_t *y, \
                                          int64_t ys, int64_t nt, float *o, int64_t os, int arith) {             \
        (void)arith;                                                                                             \
        if (nt == 1) {                                                                                           \
            for (int64_t r = 0; r < nr; ++r)                                                                     \
                GGUFLM_SIMD(lut256_tile)(GGUFLM_PATH_##path, TYPE, n, w + r * ws, y, ys, 1, o + r, os);          \
            return;                                                                                              \
        }                                                                                                        \
        for (int64_t r = 0; r < nr; ++r)                                                                         \
            for (int64_t t = 0; t < nt; t += GGUFLM_LUT256_TOKENS) {                                             \
                const int T = (int)(nt - t < GGUFLM_LUT256_TOKENS ? nt - t : GGUFLM_LUT256_TOKENS);              \
                GGUFLM_SIMD(lut256_tile)(GGUFLM_PATH_##path, TYPE, n, w + r * ws, y + t * ys, ys, T, o + t * os + r, os); \
            }                                                                                                    \
    }
GGUFLM_SIMD_LUT256(DOT, iq4_xs, GGUFLM_IQ4_XS)
/* IQ4_XS's TILED: batches through the K GEMM (quants_simd_ktile.h); else the tiles above over
 * blocks of 16 tokens (the matmul hands the whole batch over) */
static void GGUFLM_SIMD(TILED_iq4_xs)(int64_t n, const uint8_t *w, int64_t ws, int64_t nr, const uint8_t *y,
                                      int64_t ys, int64_t nt, float *o, int64_t os, int arith) {
    (void)arith;
    if (nt >= GGUFLM_KT_MIN_TOKENS) {
        GGUFLM_SIMD(ktile_gemm)(GGUFLM_IQ4_XS, 0, sizeof(block_iq4_xs), n, w, ws, nr, y, ys, nt, o, os);
        return;
    }
    for (int64_t t0 = 0; t0 < nt; t0 += GGUFLM_K_TOKEN_BLOCK) {
        const int64_t t1 = t0 + GGUFLM_K_TOKEN_BLOCK < nt ? t0 + GGUFLM_K_TOKEN_BLOCK : nt;
        for (int64_t r = 0; r < nr; ++r)
            for (int64_t t = t0; t < t1; t += GGUFLM_LUT256_TOKENS) {
                const int T = (int)(t1 - t < GGUFLM_LUT256_TOKENS ? t1 - t : GGUFLM_LUT256_TOKENS);
                GGUFLM_SIMD(lut256_tile)(GGUFLM_PATH_TILED, GGUFLM_IQ4_XS, n, w + r * ws, y + t * ys, ys, T, o + t * os + r, os);
            }
    }
}
#if GGUFLM_SIMD_512
GGUFLM_SIMD_LUT256(DOT, tq2_0_tiles, GGUFLM_TQ2_0)
/* ---- TQ1_0 with 512-bit vectors (why: at 256 bits the decode, not the memory, bound it) ----
 * The elements of a super-block as 4 vectors of 64 in the activation's order, each byte the
 * base-3 shift q * 3^k (mod 256) whose top trit is the value + 1:
 *   [q, 3q], [9q, 27q], [81q, r, 3r], [9r, 27r, 81r, h]
 * q = qs[0..31], r = qs[32..47] (16 bytes), h = qh's 4 bytes times 1, 3, 9, 27: r and h share one
 * chain [r, 3r, r, x] -> [9r, 27r, ., 9x] -> [., ., 81r, .] with x = qh * [1, 3, 1, 3] per dword,
 * and a lane shuffle puts r, 3r into the upper half of the third vector. */
static inline __m512i GGUFLM_SIMD(mul9_z)(__m512i q) {
    return _mm512_add_epi8(_mm512_and_si512(_mm512_slli_epi16(q, 3), _mm512_set1_epi8((char)0xF8)), q);
}
/* top_trit's steps without its final shift: the trit in bits 6-7, so the dot comes out 64 times
 * too large (exact; one shift per super-block instead of one per vector) */
static inline __m512i GGUFLM_SIMD(top_trit64_z)(__m512i q) {
    q = _mm512_subs_epu8(q, _mm512_set1_epi8(1));
    q = _mm512_avg_epu8(q, _mm512_avg_epu8(q, _mm512_setzero_si512()));
    return _mm512_and_si512(q, _mm512_set1_epi8((char)0xC0));
}
static inline __attribute__((always_inline)) void GGUFLM_SIMD(tq1_values_z)(const block_tq1_0 *b, __m512i z[4]) {
    const __mmask64 hi256 = 0xFFFFFFFF00000000ull, lane2 = 0x0000FFFF00000000ull;
    const __m512i a = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b->qs));
    const __m512i q1 = _mm512_mask_add_epi8(a, hi256, a, _mm512_add_epi8(a, a));
    const __m512i q9 = GGUFLM_SIMD(mul9_z)(q1), q81 = GGUFLM_SIMD(mul9_z)(q9);
    __m512i r = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(b->qs + 32)));
    r = _mm512_mask_set1_epi32(r, 0xF000, (int)gguflm_u32_at(b->qh));
    /* times 3: all of lane 1, dwords 1 and 3 of lane 3 */
    const __m512i r1 = _mm512_mask_add_epi8(r, 0xF0F0000000000000ull | 0x00000000FFFF0000ull, r, _mm512_add_epi8(r, r));
    const __m512i r9 = GGUFLM_SIMD(mul9_z)(r1), r81 = GGUFLM_SIMD(mul9_z)(r9);
    z[0] = GGUFLM_SIMD(top_trit64_z)(q1);
    z[1] = GGUFLM_SIMD(top_trit64_z)(q9);
    z[2] = GGUFLM_SIMD(top_trit64_z)(_mm512_mask_shuffle_i64x2(q81, 0xF0, r1, r1, _MM_SHUFFLE(1, 0, 1, 0)));
    /* lane 3: x's dwords 0, 1 (qh, 3 qh) and 9x's dwords 2, 3 (9 qh, 27 qh) */
    z[3] = GGUFLM_SIMD(top_trit64_z)(_mm512_mask_mov_epi8(_mm512_mask_mov_epi8(r9, lane2, r81), 0x00FF000000000000ull, r1));
}

/* one TQ1_0 row against T <= 4 tokens: lut256_tile's recipe (the same 8 int32 lanes: the two
 * 256-bit halves of the 16 lanes hold the same elements mod 32) */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(tq1_tile_z)(int64_t n, const uint8_t *x, const uint8_t *y,
                                                                         int64_t ys, int T, float *out, int64_t os) {
    __m256 acc[4];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const block_tq1_0 *b = (const block_tq1_0 *)x + i;
        GGUFLM_SIMD(prefetch)((const uint8_t *)(b + 2), sizeof(block_tq1_0));
        __m512i z[4];
        GGUFLM_SIMD(tq1_values_z)(b, z);
        const float dx = GGUFLM_FP16_TO_FP32_SIMD(b->d);
        for (int t = 0; t < T; ++t) {
            const block_q8_K *yb = (const block_q8_K *)(y + t * ys) + i;
            __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), z[0], _mm512_loadu_si512(yb->qs));
            s = _mm512_dpbusd_epi32(s, z[1], _mm512_loadu_si512(yb->qs + 64));
            __m512i s2 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), z[2], _mm512_loadu_si512(yb->qs + 128));
            s2 = _mm512_dpbusd_epi32(s2, z[3], _mm512_loadu_si512(yb->qs + 192));
            s = _mm512_add_epi32(s, s2);
            __m256i lanes = _mm256_srai_epi32(_mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1)), 6);
            lanes = _mm256_sub_epi32(lanes, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)yb->bsums), _mm256_set1_epi16(1)));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(yb->d * dx), acc[t]);
        }
    }
    for (int t = 0; t < T; ++t) out[t * os] = GGUFLM_SIMD(hsum_f32)(acc[t]);
}
static void GGUFLM_SIMD(DOT_tq1_0)(int64_t n, const uint8_t *w, int64_t ws, int64_t nr, const uint8_t *y, int64_t ys,
                                   int64_t nt, float *o, int64_t os, int arith) {
    (void)arith;
    if (nt == 1) {   /* decode: the tile compiled for one token */
        for (int64_t r = 0; r < nr; ++r) GGUFLM_SIMD(tq1_tile_z)(n, w + r * ws, y, ys, 1, o + r, os);
        return;
    }
    /* batches: whole strips of 16 rows (quants_simd_strips.h), the rest here */
    const int64_t done = GGUFLM_SIMD(strips_gemm)(GGUFLM_TQ1_0, sizeof(block_tq1_0), n, w, ws, nr, y, ys, nt, o, os);
    w += done * ws, o += done, nr -= done;
    for (int64_t r = 0; r < nr; ++r)
        for (int64_t t = 0; t < nt; t += 4) {
            const int T = (int)(nt - t < 4 ? nt - t : 4);
            GGUFLM_SIMD(tq1_tile_z)(n, w + r * ws, y + t * ys, ys, T, o + t * os + r, os);
        }
}
static void GGUFLM_SIMD(DOT_tq2_0)(int64_t n, const uint8_t *w, int64_t ws, int64_t nr, const uint8_t *y, int64_t ys,
                                   int64_t nt, float *o, int64_t os, int arith) {
    /* batches: whole strips of 16 rows (quants_simd_strips.h), the rest in the tiles */
    const int64_t done = nt > 1 ? GGUFLM_SIMD(strips_gemm)(GGUFLM_TQ2_0, sizeof(block_tq2_0), n, w, ws, nr, y, ys, nt, o, os) : 0;
    if (done < nr) GGUFLM_SIMD(DOT_tq2_0_tiles)(n, w + done * ws, ws, nr - done, y, ys, nt, o + done, os, arith);
}
#else
GGUFLM_SIMD_LUT256(DOT, tq1_0, GGUFLM_TQ1_0)
GGUFLM_SIMD_LUT256(DOT, tq2_0, GGUFLM_TQ2_0)
#endif
#undef GGUFLM_SIMD_LUT256
#undef GGUFLM_LUT256_TOKENS
