/* Repacked Q4_0, IQ4_NL and MXFP4: the Q4_0_REPACK recipe (ggml-cpu's block_q4_0x8 /
 * block_iq4_nlx8 / mxfp4x8 GEMV and GEMM, gguflm_q4_0_repack_1) with weight rows in vector lanes.
 * Included by quants_simd_body.h once per ISA; no include guard.
 *
 * The recipe keeps, per output, one float chain over the 32-element blocks: acc = fma(sum, dx*dy,
 * acc), sum the block's exact integer dot. ggml gets there by interleaving 8 rows in its repacked
 * buffer; we keep the file's layout (no second copy of the weights) and transpose W rows (16 in the
 * AVX-512 copy, 8 in the AVX2 one) per block in registers: 4-byte groups of the W rows' nibbles
 * become the W lanes of one vector, so the 8 groups of a block meet 8 broadcast 4-byte groups of
 * the token and every lane ends with its row's whole block sum, no horizontal sums. Then one
 * conversion, one multiply of the W scales by dy and one fma per block run the W rows' float steps
 * lane by lane (the same operations, in the same order, as the scalar recipe).
 *
 * The integer dot: AVX-512 VNNI takes unsigned weights, so the lanes hold u = value + off (Q4_0:
 * the nibble, off 8; IQ4_NL / MXFP4: table value + 128, off 128) and start from -off * sum(y) of
 * the token's block. AVX2 (vpmaddubsw) takes Q4_0's nibbles the same way, off 8, their int16 pair
 * sums adding up over the block without overflow; IQ4_NL / MXFP4 values (up to 127) would
 * saturate them, so there the lanes keep signed values whose signs move onto y (vpsignb).
 * Single tokens (decode) decode straight into registers, GGUFLM_RP_GEMV_ROWS rows per pass over
 * the blocks; batches first write a strip of transposed blocks (and the tokens' dy and
 * -off * sum(y)) to a scratch area, a K-chunk at a time, which tiles of W rows x T tokens then
 * read once per T tokens.
 */

#if GGUFLM_SIMD_512
#define GGUFLM_RP_W 16       /* rows per vector */
#define GGUFLM_RP_TMAX 8     /* tokens per batch tile */
#define gguflm_rp_vi __m512i
#define gguflm_rp_vf __m512
#else
#define GGUFLM_RP_W 8
#define GGUFLM_RP_TMAX 4
#define gguflm_rp_vi __m256i
#define gguflm_rp_vf __m256
#endif
#define GGUFLM_RP_VB (4 * GGUFLM_RP_W)                    /* bytes of one vector */
#define GGUFLM_RP_BLOCK (8 * GGUFLM_RP_VB + GGUFLM_RP_VB)  /* a transposed block: 8 groups, W scales */
#define GGUFLM_RP_GROUP 64                                 /* rows of a batch's pass (a strip is W rows) */
/* rows of a single token's pass: each row is a stream through memory, and past 16 of them the
 * hardware and our per-row prefetches no longer keep up once W is out of cache (AMD EPYC Zen 4,
 * one thread, Q4_0 65536x640: 64 rows 4.5 GB/s, 32 rows 4.5, 16 rows 11.4-12.3; in cache 16 rows
 * cost ~10%); the next pass's rows, one contiguous range, are asked for into L2 meanwhile */
#define GGUFLM_RP_GEMV_ROWS 16
#define GGUFLM_RP_KB 32                                    /* blocks of a batch's K-chunk */
#define GGUFLM_RP_TB 32                                    /* tokens of a batch's tables */

static inline size_t GGUFLM_SIMD(rp_bx)(int type) { return type == GGUFLM_MXFP4 ? sizeof(block_mxfp4) : sizeof(block_q4_0); }

/* off of the unsigned weights; 0: signed (IQ4_NL / MXFP4 in the AVX2 copy) */
static inline int GGUFLM_SIMD(rp_off)(int type) { return type == GGUFLM_Q4_0 ? 8 : GGUFLM_SIMD_512 ? 128 : 0; }

/* k[c] lane r: row r's qs dword c -> q[g] lane r: its elements 4g..4g+3 (low nibbles g < 4, high
 * nibbles g >= 4) as rp_off's unsigned values, or signed ones (IQ4_NL / MXFP4 in the AVX2 copy) */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(rp_values)(int type, const gguflm_rp_vi k[4], gguflm_rp_vi q[8]) {
#if GGUFLM_SIMD_512
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
        q[c] = _mm512_and_si512(k[c], m4);
        q[c + 4] = _mm512_and_si512(_mm512_srli_epi16(k[c], 4), m4);
    }
    if (type != GGUFLM_Q4_0) {
        const __m512i table = _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)gguflm_lut32_table(type))),
                                               _mm512_set1_epi8((char)0x80));   /* value + 128 */
        for (int g = 0; g < 8; ++g) q[g] = _mm512_shuffle_epi8(table, q[g]);
    }
#else
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
        q[c] = _mm256_and_si256(k[c], m4);
        q[c + 4] = _mm256_and_si256(_mm256_srli_epi16(k[c], 4), m4);
    }
    if (type != GGUFLM_Q4_0) {
        const __m256i table = GGUFLM_SIMD(lut_table)(gguflm_lut32_table(type));
        for (int g = 0; g < 8; ++g) q[g] = _mm256_shuffle_epi8(table, q[g]);
    }
#endif
}

/* MXFP4's e8m0 exponents (one per lane) as gguflm_e8m0_to_fp32_half */
static inline gguflm_rp_vf GGUFLM_SIMD(rp_e8m0)(gguflm_rp_vi e) {
#if GGUFLM_SIMD_512
    const __m512i big = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __mmask16 tiny = _mm512_cmple_epu32_mask(e, _mm512_set1_epi32(1));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(tiny, big, _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e)));
#else
    const __m256i big = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(big, _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e), tiny));
#endif
}

/* The W rows' weights of one block (b: the block's start in row 0's place; roff: each row's byte
 * offset from row 0, rows past the matrix repeating its last): q[g] lane r = row r's elements
 * 4g..4g+3 (u or signed values, see above), dx lane r = row r's scale. */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(rp_decode)(int type, const uint8_t *b, const int32_t *roff,
                                                                        gguflm_rp_vi q[8], gguflm_rp_vf *dx) {
    const size_t qo = type == GGUFLM_MXFP4 ? offsetof(block_mxfp4, qs) : offsetof(block_q4_0, qs);
#define GGUFLM_RP_Q(r) _mm_loadu_si128((const __m128i *)(b + roff[r] + qo))
#if GGUFLM_SIMD_512
    /* a[i]'s 128-bit lane j: row 4j + i's 16 bytes, i.e. its 4 dwords of nibbles */
    __m512i a[4];
    for (int i = 0; i < 4; ++i)
        a[i] = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(GGUFLM_RP_Q(i)), GGUFLM_RP_Q(4 + i), 1),
                                                     GGUFLM_RP_Q(8 + i), 2),
                                  GGUFLM_RP_Q(12 + i), 3);
    /* 4x4 dword transposes in each 128-bit lane: k[c] dword 4j + i = row 4j + i's dword c */
    const __m512i t0 = _mm512_unpacklo_epi32(a[0], a[1]), t1 = _mm512_unpackhi_epi32(a[0], a[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(a[2], a[3]), t3 = _mm512_unpackhi_epi32(a[2], a[3]);
    const __m512i k[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2), _mm512_unpacklo_epi64(t1, t3),
                          _mm512_unpackhi_epi64(t1, t3)};
    GGUFLM_SIMD(rp_values)(type, k, q);
    /* the scales: the first 4 bytes of each row's block */
#if defined(GGUFLM_SIMDE)   /* SIMDe has no vpgatherdd: the same dwords one by one */
    __m512i s;
    {
        int32_t d4[16];
        for (int r = 0; r < 16; ++r) d4[r] = (int32_t)gguflm_u32_at(b + roff[r]);
        s = _mm512_loadu_si512((const void *)d4);
    }
#else
    const __m512i s = _mm512_i32gather_epi32(_mm512_loadu_si512((const void *)roff), (const void *)b, 1);
#endif
    if (type == GGUFLM_MXFP4) {
        *dx = GGUFLM_SIMD(rp_e8m0)(_mm512_and_si512(s, _mm512_set1_epi32(0xFF)));
    } else {
#if defined(GGUFLM_SIMDE)   /* nor vpmovdw */
        int32_t d4[16];
        uint16_t h[16];
        _mm512_storeu_si512((void *)d4, s);
        for (int r = 0; r < 16; ++r) h[r] = (uint16_t)d4[r];
        *dx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
#else
        *dx = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(s));
#endif
    }
#else
    __m256i a[4];
    for (int i = 0; i < 4; ++i) a[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(GGUFLM_RP_Q(i)), GGUFLM_RP_Q(4 + i), 1);
    const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
    const __m256i k[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t1, t3),
                          _mm256_unpackhi_epi64(t1, t3)};
    GGUFLM_SIMD(rp_values)(type, k, q);
    if (type == GGUFLM_MXFP4) {
        *dx = GGUFLM_SIMD(rp_e8m0)(_mm256_setr_epi32(b[roff[0]], b[roff[1]], b[roff[2]], b[roff[3]], b[roff[4]], b[roff[5]],
                                                     b[roff[6]], b[roff[7]]));
    } else {
        __m128i h = _mm_setzero_si128();
#define GGUFLM_RP_H(r) h = _mm_insert_epi16(h, gguflm_u16_at(b + roff[r]), r)
        GGUFLM_RP_H(0); GGUFLM_RP_H(1); GGUFLM_RP_H(2); GGUFLM_RP_H(3);
        GGUFLM_RP_H(4); GGUFLM_RP_H(5); GGUFLM_RP_H(6); GGUFLM_RP_H(7);
#undef GGUFLM_RP_H
        *dx = _mm256_cvtph_ps(h);
    }
#endif
#undef GGUFLM_RP_Q
}

/* The same from a rows-16 group block gb (quants_rows16.h), whose chunks are the k vectors already:
 * the AVX-512 copy takes all 16 rows, the AVX2 one rows 8 half .. 8 half + 7 */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(rp_decode16)(int type, const uint8_t *gb, int half,
                                                                          gguflm_rp_vi q[8], gguflm_rp_vf *dx) {
    const int64_t sbytes = gguflm_rows16_scale_bytes(type);
    const uint8_t *chunks = gb + GGUFLM_ROWS16 * sbytes;
    gguflm_rp_vi k[4];
#if GGUFLM_SIMD_512
    (void)half;
    for (int c = 0; c < 4; ++c) k[c] = _mm512_loadu_si512((const void *)(chunks + 64 * c));
    GGUFLM_SIMD(rp_values)(type, k, q);
    if (type == GGUFLM_MXFP4) {
#if defined(GGUFLM_SIMDE)   /* SIMDe has no vpmovzxbd */
        int32_t e[16];
        for (int r = 0; r < 16; ++r) e[r] = gb[r];
        *dx = GGUFLM_SIMD(rp_e8m0)(_mm512_loadu_si512((const void *)e));
#else
        *dx = GGUFLM_SIMD(rp_e8m0)(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)gb)));
#endif
    } else {
        *dx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
    }
#else
    for (int c = 0; c < 4; ++c) k[c] = _mm256_loadu_si256((const __m256i *)(chunks + 64 * c + 32 * half));
    GGUFLM_SIMD(rp_values)(type, k, q);
    if (type == GGUFLM_MXFP4) *dx = GGUFLM_SIMD(rp_e8m0)(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(gb + 8 * half))));
    else *dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 16 * half)));
#endif
}

#if !GGUFLM_SIMD_512
/* AVX2: the 8 groups' int16 pair sums of unsigned nibbles (Q4_0) add up in int16: at most
 * 8 * 2 * 15 * 128 = 30720 */
static inline __m256i GGUFLM_SIMD(rp_pairs16)(__m256i acc16, __m256i q, __m256i y4) {
    return _mm256_add_epi16(acc16, _mm256_maddubs_epi16(q, y4));
}
/* signed values: their signs moved onto y, one int32 sum per group (pairs up to 2 * 127 * 127) */
static inline __m256i GGUFLM_SIMD(rp_signed4)(__m256i acc, __m256i u, __m256i q, __m256i y4) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(y4, q)), _mm256_set1_epi16(1)));
}
#endif

/* acc + the W rows' block dots with the token's 8 groups yq (4 bytes each); off: rp_off */
static inline __attribute__((always_inline)) gguflm_rp_vi GGUFLM_SIMD(rp_dot)(int off, gguflm_rp_vi acc, const gguflm_rp_vi q[8],
                                                                           const uint8_t *yq) {
#if GGUFLM_SIMD_512
    (void)off;
    for (int g = 0; g < 8; ++g) acc = _mm512_dpbusd_epi32(acc, q[g], _mm512_set1_epi32((int32_t)gguflm_u32_at(yq + 4 * g)));
#else
    if (off) {
        __m256i acc16 = _mm256_setzero_si256();
        for (int g = 0; g < 8; ++g) acc16 = GGUFLM_SIMD(rp_pairs16)(acc16, q[g], _mm256_set1_epi32((int32_t)gguflm_u32_at(yq + 4 * g)));
        return _mm256_add_epi32(acc, _mm256_madd_epi16(acc16, _mm256_set1_epi16(1)));
    }
    for (int g = 0; g < 8; ++g)
        acc = GGUFLM_SIMD(rp_signed4)(acc, _mm256_sign_epi8(q[g], q[g]), q[g], _mm256_set1_epi32((int32_t)gguflm_u32_at(yq + 4 * g)));
#endif
    return acc;
}

/* the token's -off * sum(y) for the block's integer lanes to start from */
static inline __attribute__((always_inline)) int32_t GGUFLM_SIMD(rp_start1)(int off, const block_q8_0 *yb) {
    if (!off) return 0;
    return -off * GGUFLM_SIMD(hsum_i32)(GGUFLM_SIMD(dot_u8_s8)(_mm256_set1_epi8(1), _mm256_loadu_si256((const __m256i *)yb->qs)));
}
static inline __attribute__((always_inline)) gguflm_rp_vi GGUFLM_SIMD(rp_start)(int off, const block_q8_0 *yb) {
#if GGUFLM_SIMD_512
    return _mm512_set1_epi32(GGUFLM_SIMD(rp_start1)(off, yb));
#else
    return _mm256_set1_epi32(GGUFLM_SIMD(rp_start1)(off, yb));
#endif
}

static inline gguflm_rp_vf GGUFLM_SIMD(rp_fma)(gguflm_rp_vi sum, gguflm_rp_vf dx, float dy, gguflm_rp_vf acc) {
#if GGUFLM_SIMD_512
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dx, _mm512_set1_ps(dy)), acc);
#else
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dx, _mm256_set1_ps(dy)), acc);
#endif
}

/* the first R (<= W) lanes of v to out */
#if GGUFLM_SIMD_512 && !defined(GGUFLM_SIMDE)   /* (SIMDe's masked stores write zeros to the other lanes) */
#define GGUFLM_RP_MASKED 1
#else
#define GGUFLM_RP_MASKED 0
#endif
static inline void GGUFLM_SIMD(rp_store)(float *out, gguflm_rp_vf v, int R) {
#if GGUFLM_RP_MASKED
    _mm512_mask_storeu_ps(out, (__mmask16)((1u << R) - 1), v);
#else
    float tmp[GGUFLM_RP_W];
    memcpy(tmp, &v, sizeof(tmp));
    memcpy(out, tmp, (size_t)R * sizeof(float));
#endif
}

/* the first R lanes from p, zeros after */
static inline gguflm_rp_vf GGUFLM_SIMD(rp_load)(const float *p, int R) {
#if GGUFLM_RP_MASKED
    return _mm512_maskz_loadu_ps((__mmask16)((1u << R) - 1), p);
#else
    float tmp[GGUFLM_RP_W] = {0};
    gguflm_rp_vf v;
    memcpy(tmp, p, (size_t)R * sizeof(float));
    memcpy(&v, tmp, sizeof(v));
    return v;
#endif
}
#undef GGUFLM_RP_MASKED

static inline void GGUFLM_SIMD(rp_row_offsets)(int64_t ws, int R, int32_t roff[GGUFLM_RP_W]) {
    for (int r = 0; r < GGUFLM_RP_W; ++r) roff[r] = (int32_t)((r < R ? r : R - 1) * ws);
}

/* one token: up to GGUFLM_RP_GEMV_ROWS rows at a time, every block of all of them before the next;
 * rows16: w in the rows-16 layout (whole groups of 16 rows, one pass each) */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(rp_gemv)(int type, int rows16, int64_t n, const uint8_t *w,
                                                                      int64_t ws, int64_t nr, const block_q8_0 *y, float *o) {
    enum { S_MAX = GGUFLM_RP_GEMV_ROWS / GGUFLM_RP_W };
    const size_t bx = GGUFLM_SIMD(rp_bx)(type);
    const int off = GGUFLM_SIMD(rp_off)(type);
    const int64_t block_step = rows16 ? GGUFLM_ROWS16 * (int64_t)bx : (int64_t)bx;
    for (int64_t r0 = 0; r0 < nr; r0 += GGUFLM_RP_GEMV_ROWS) {
        const int rows = (int)(nr - r0 < GGUFLM_RP_GEMV_ROWS ? nr - r0 : GGUFLM_RP_GEMV_ROWS);
        const int S = (rows + GGUFLM_RP_W - 1) / GGUFLM_RP_W;
        int32_t roff[S_MAX][GGUFLM_RP_W];
        gguflm_rp_vf acc[S_MAX];
        for (int s = 0; s < S; ++s) {
            const int R = rows - s * GGUFLM_RP_W;
            GGUFLM_SIMD(rp_row_offsets)(ws, R < GGUFLM_RP_W ? R : GGUFLM_RP_W, roff[s]);
            acc[s] = GGUFLM_SIMD(rp_load)(o, 0);
        }
        const uint8_t *wg = w + r0 * ws;
        /* file layout: the next pass's rows, asked for a step (whole lines) per block so they
         * arrive in time (a rows-16 group is one stream, which the hardware follows) */
        const uint8_t *next = wg + (int64_t)rows * ws;
        const int64_t nb = n / 32, next_rows = nr - r0 - rows;
        const int64_t next_bytes = rows16 ? 0 : (next_rows < GGUFLM_RP_GEMV_ROWS ? next_rows : GGUFLM_RP_GEMV_ROWS) * ws;
        const int64_t step = ((next_bytes + nb - 1) / nb + 63) & ~(int64_t)63;
        for (int64_t ib = 0; ib < nb; ++ib) {
            const gguflm_rp_vi start = GGUFLM_SIMD(rp_start)(off, &y[ib]);
            const float dy = GGUFLM_FP16_TO_FP32_SIMD(y[ib].d);
            const uint8_t *b = wg + ib * block_step;
            for (int64_t o = ib * step; o < (ib + 1) * step && o < next_bytes; o += 64)
                _mm_prefetch((const char *)(next + o), _MM_HINT_T1);
            for (int s = 0; s < S; ++s) {
                gguflm_rp_vi q[8];
                gguflm_rp_vf dx;
                if (rows16) {
                    GGUFLM_SIMD(rp_decode16)(type, b, s, q, &dx);
                } else {
                    const uint8_t *bs = b + (int64_t)s * GGUFLM_RP_W * ws;
                    /* every other block (36 bytes, under a line) asks for the rows' data 4 lines on */
                    if (!(ib & 1))
                        for (int r = 0; r < GGUFLM_RP_W; ++r) _mm_prefetch((const char *)(bs + roff[s][r] + 256), _MM_HINT_T0);
                    GGUFLM_SIMD(rp_decode)(type, bs, roff[s], q, &dx);
                }
                acc[s] = GGUFLM_SIMD(rp_fma)(GGUFLM_SIMD(rp_dot)(off, start, q, (const uint8_t *)y[ib].qs), dx, dy, acc[s]);
            }
        }
        for (int s = 0; s < S; ++s) {
            const int R = rows - s * GGUFLM_RP_W;
            GGUFLM_SIMD(rp_store)(o + r0 + s * GGUFLM_RP_W, acc[s], R < GGUFLM_RP_W ? R : GGUFLM_RP_W);
        }
    }
}

/* A batch tile: a strip's transposed K-chunk (kb blocks at `strip`) x T tokens; dy / start: the
 * tokens' tables (block ib, token t at [ib * GGUFLM_RP_TB + t]); the float chains continue those
 * in out unless first. */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(rp_tile)(int off, int T, int kb, int first, const uint8_t *strip,
                                                                      const uint8_t *y, int64_t ys, const float *dy,
                                                                      const int32_t *start, float *out, int64_t os, int R) {
    gguflm_rp_vf acc[GGUFLM_RP_TMAX];
    for (int t = 0; t < T; ++t) acc[t] = GGUFLM_SIMD(rp_load)(out + t * os, first ? 0 : R);
    for (int ib = 0; ib < kb; ++ib) {
        const uint8_t *sb = strip + (size_t)ib * GGUFLM_RP_BLOCK;
        gguflm_rp_vi sum[GGUFLM_RP_TMAX];
#define GGUFLM_RP_Y4(t, g) ((int32_t)gguflm_u32_at(y + (t) * ys + ib * sizeof(block_q8_0) + 2 + 4 * (g)))
#if GGUFLM_SIMD_512
        (void)off;
        for (int t = 0; t < T; ++t) sum[t] = _mm512_set1_epi32(start[ib * GGUFLM_RP_TB + t]);
        for (int g = 0; g < 8; ++g) {
            const __m512i q = _mm512_load_si512((const void *)(sb + g * GGUFLM_RP_VB));
            for (int t = 0; t < T; ++t) sum[t] = _mm512_dpbusd_epi32(sum[t], q, _mm512_set1_epi32(GGUFLM_RP_Y4(t, g)));
        }
#else
        if (off) {
            __m256i s16[GGUFLM_RP_TMAX];
            for (int t = 0; t < T; ++t) s16[t] = _mm256_setzero_si256();
            for (int g = 0; g < 8; ++g) {
                const __m256i q = _mm256_load_si256((const __m256i *)(sb + g * GGUFLM_RP_VB));
                for (int t = 0; t < T; ++t) s16[t] = GGUFLM_SIMD(rp_pairs16)(s16[t], q, _mm256_set1_epi32(GGUFLM_RP_Y4(t, g)));
            }
            for (int t = 0; t < T; ++t)
                sum[t] = _mm256_add_epi32(_mm256_set1_epi32(start[ib * GGUFLM_RP_TB + t]), _mm256_madd_epi16(s16[t], _mm256_set1_epi16(1)));
        } else {
            for (int t = 0; t < T; ++t) sum[t] = _mm256_setzero_si256();
            for (int g = 0; g < 8; ++g) {
                const __m256i q = _mm256_load_si256((const __m256i *)(sb + g * GGUFLM_RP_VB)), u = _mm256_sign_epi8(q, q);
                for (int t = 0; t < T; ++t) sum[t] = GGUFLM_SIMD(rp_signed4)(sum[t], u, q, _mm256_set1_epi32(GGUFLM_RP_Y4(t, g)));
            }
        }
#endif
#undef GGUFLM_RP_Y4
#if GGUFLM_SIMD_512
        const __m512 dx = _mm512_load_ps((const void *)(sb + 8 * GGUFLM_RP_VB));
#else
        const __m256 dx = _mm256_load_ps((const float *)(sb + 8 * GGUFLM_RP_VB));
#endif
        for (int t = 0; t < T; ++t) acc[t] = GGUFLM_SIMD(rp_fma)(sum[t], dx, dy[ib * GGUFLM_RP_TB + t], acc[t]);
    }
    for (int t = 0; t < T; ++t) GGUFLM_SIMD(rp_store)(out + t * os, acc[t], R);
}

#if GGUFLM_SIMD_AMX   /* out of line in the AMX target (quants_amx.h), called while the dispatch's amx is on */
GGUFLM_TARGET_AMX_BEGIN
/* rp_tile for 16 tokens with the integer dots from the AMX tiles (quants_amx.h): per block, C
 * [16 tokens x 16 rows] = the tokens' 32 signed bytes (A, read in place, rows ys bytes apart) times
 * the tile GGUFLM_AMX_OFF of -off bytes (gguflm_amx_begin), then plus the same times the strip's
 * transposed block (B: group g's vector is B's row g, the u values unsigned): start plus rp_tile's
 * vpdpbusd chain, the same int32 sums, with no table of starts. Then rp_tile's float steps, token
 * by token. Two blocks at a time, in tiles C0 and C1: the matrix unit takes the second while the
 * vector units convert the first. */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(rp_tile16_amx)(int kb, int first, const uint8_t *strip,
                                                                            const uint8_t *y, int64_t ys, const float *dy,
                                                                            float *out, int64_t os, int R) {
    __m512 acc[16];
    int32_t c[2][16 * 16] __attribute__((aligned(64)));
#pragma GCC unroll 16  /* acc in registers (not unrolled, GCC kept it on the stack: -13%) */
    for (int t = 0; t < 16; ++t) acc[t] = GGUFLM_SIMD(rp_load)(out + t * os, first ? 0 : R);
    GGUFLM_AMX_MEMORY(strip);   /* the strip's stores before the tile loads */
    for (int ib = 0; ib < kb; ib += 2) {
        const int pair = ib + 1 < kb;
        const uint8_t *ya = y + ib * sizeof(block_q8_0) + offsetof(block_q8_0, qs), *sb = strip + (size_t)ib * GGUFLM_RP_BLOCK;
        GGUFLM_AMX_BLOCK_DOT(GGUFLM_AMX_C0, GGUFLM_AMX_A0, GGUFLM_AMX_B0, ya, ys, sb, 1);
        if (pair) GGUFLM_AMX_BLOCK_DOT(GGUFLM_AMX_C1, GGUFLM_AMX_A1, GGUFLM_AMX_B1, ya + sizeof(block_q8_0), ys, sb + GGUFLM_RP_BLOCK, 1);
        _tile_stored(GGUFLM_AMX_C0, c[0], 64);
        for (int h = 0; h <= pair; ++h) {
            if (h) _tile_stored(GGUFLM_AMX_C1, c[1], 64);
            GGUFLM_AMX_MEMORY(c[h]);
            const int b = ib + h;
            const __m512 dx = _mm512_load_ps((const void *)(strip + (size_t)b * GGUFLM_RP_BLOCK + 8 * GGUFLM_RP_VB));
#pragma GCC unroll 16
            for (int t = 0; t < 16; ++t)
                acc[t] = GGUFLM_SIMD(rp_fma)(_mm512_load_si512((const void *)(c[h] + 16 * t)), dx, dy[b * GGUFLM_RP_TB + t],
                                             acc[t]);
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t) GGUFLM_SIMD(rp_store)(out + t * os, acc[t], R);
}

/* rp_tile16_amx for tokens 0 .. tokens - 1 (a multiple of 16) of a table block: one call a strip */
static void GGUFLM_SIMD(rp_tiles_amx)(int tokens, int kb, int first, const uint8_t *strip, const uint8_t *y, int64_t ys,
                                      const float *dy, float *out, int64_t os, int R) {
    for (int t = 0; t < tokens; t += 16) GGUFLM_SIMD(rp_tile16_amx)(kb, first, strip, y + t * ys, ys, dy + t, out + t * os, os, R);
}
GGUFLM_TARGET_END
#endif

/* a batch: per K-chunk, the strips of up to GGUFLM_RP_GROUP rows transposed once, then per block of
 * GGUFLM_RP_TB tokens their tables, then tiles of W rows x GGUFLM_RP_TMAX tokens */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(rp_gemm)(int type, int rows16, int64_t n, const uint8_t *w,
                                                                      int64_t ws, int64_t nr, const uint8_t *y, int64_t ys,
                                                                      int64_t nt, float *o, int64_t os) {
    enum { S_MAX = GGUFLM_RP_GROUP / GGUFLM_RP_W };
    const size_t bx = GGUFLM_SIMD(rp_bx)(type);
    const int off = GGUFLM_SIMD(rp_off)(type);
    const int64_t nb = n / 32;
    uint8_t strips[S_MAX * GGUFLM_RP_KB * GGUFLM_RP_BLOCK] __attribute__((aligned(64)));
    float dy[GGUFLM_RP_KB * GGUFLM_RP_TB];
    int32_t start[GGUFLM_RP_KB * GGUFLM_RP_TB];
    const int amx = GGUFLM_SIMD_AMX && nt >= 16 && gguflm_amx_on();   /* 16-token tiles through AMX */
#if GGUFLM_SIMD_AMX
    if (amx) gguflm_amx_begin(32, off);
#endif
    for (int64_t r0 = 0; r0 < nr; r0 += GGUFLM_RP_GROUP) {
        const int rows = (int)(nr - r0 < GGUFLM_RP_GROUP ? nr - r0 : GGUFLM_RP_GROUP);
        const int S = (rows + GGUFLM_RP_W - 1) / GGUFLM_RP_W;
        for (int64_t kc = 0; kc < nb; kc += GGUFLM_RP_KB) {
            const int kb = (int)(nb - kc < GGUFLM_RP_KB ? nb - kc : GGUFLM_RP_KB);
            for (int s = 0; s < S; ++s) {
                const int R = rows - s * GGUFLM_RP_W < GGUFLM_RP_W ? rows - s * GGUFLM_RP_W : GGUFLM_RP_W;
                int32_t roff[GGUFLM_RP_W];
                GGUFLM_SIMD(rp_row_offsets)(ws, R, roff);
                /* rows16: the strip's group (of 16 rows) and which half of it (AVX2's strips of 8) */
                const int half = (s * GGUFLM_RP_W / 8) & 1;
                const uint8_t *b = rows16 ? w + (r0 + (int64_t)s * GGUFLM_RP_W - 8 * half) * ws + kc * GGUFLM_ROWS16 * bx
                                          : w + (r0 + (int64_t)s * GGUFLM_RP_W) * ws + kc * bx;
                for (int ib = 0; ib < kb; ++ib) {
                    gguflm_rp_vi q[8];
                    gguflm_rp_vf dx;
                    if (rows16) GGUFLM_SIMD(rp_decode16)(type, b + ib * GGUFLM_ROWS16 * bx, half, q, &dx);
                    else GGUFLM_SIMD(rp_decode)(type, b + ib * bx, roff, q, &dx);
                    uint8_t *sb = strips + ((size_t)s * GGUFLM_RP_KB + ib) * GGUFLM_RP_BLOCK;
#if GGUFLM_SIMD_512
                    for (int g = 0; g < 8; ++g) _mm512_store_si512((void *)(sb + g * GGUFLM_RP_VB), q[g]);
                    _mm512_store_ps((void *)(sb + 8 * GGUFLM_RP_VB), dx);
#else
                    for (int g = 0; g < 8; ++g) _mm256_store_si256((__m256i *)(sb + g * GGUFLM_RP_VB), q[g]);
                    _mm256_store_ps((float *)(sb + 8 * GGUFLM_RP_VB), dx);
#endif
                }
            }
            for (int64_t t0 = 0; t0 < nt; t0 += GGUFLM_RP_TB) {
                const int tt = (int)(nt - t0 < GGUFLM_RP_TB ? nt - t0 : GGUFLM_RP_TB);
                const uint8_t *yt = y + t0 * ys + kc * sizeof(block_q8_0);
                /* the AMX tiles' tokens need no starts */
                const int amx_tokens = amx ? tt / 16 * 16 : 0;
                for (int t = 0; t < tt; ++t)
                    for (int ib = 0; ib < kb; ++ib) {
                        const block_q8_0 *yb = (const block_q8_0 *)(yt + t * ys) + ib;
                        dy[ib * GGUFLM_RP_TB + t] = GGUFLM_FP16_TO_FP32_SIMD(yb->d);
                        if (t >= amx_tokens) start[ib * GGUFLM_RP_TB + t] = GGUFLM_SIMD(rp_start1)(off, yb);
                    }
                for (int s = 0; s < S; ++s) {
                    const int R = rows - s * GGUFLM_RP_W < GGUFLM_RP_W ? rows - s * GGUFLM_RP_W : GGUFLM_RP_W;
                    const uint8_t *strip = strips + (size_t)s * GGUFLM_RP_KB * GGUFLM_RP_BLOCK;
                    float *os0 = o + t0 * os + r0 + s * GGUFLM_RP_W;
#define GGUFLM_RP_TILE(T) GGUFLM_SIMD(rp_tile)(off, T, kb, kc == 0, strip, yt + t * ys, ys, dy + t, start + t, os0 + t * os, os, R)
                    int t = 0;
#if GGUFLM_SIMD_AMX
                    if (amx_tokens) GGUFLM_SIMD(rp_tiles_amx)(amx_tokens, kb, kc == 0, strip, yt, ys, dy, os0, os, R);
                    t = amx_tokens;
#endif
                    for (; t + GGUFLM_RP_TMAX <= tt; t += GGUFLM_RP_TMAX) GGUFLM_RP_TILE(GGUFLM_RP_TMAX);
                    switch (tt - t) {
#if GGUFLM_RP_TMAX > 4
                    case 7: GGUFLM_RP_TILE(7); break;
                    case 6: GGUFLM_RP_TILE(6); break;
                    case 5: GGUFLM_RP_TILE(5); break;
                    case 4: GGUFLM_RP_TILE(4); break;
#endif
                    case 3: GGUFLM_RP_TILE(3); break;
                    case 2: GGUFLM_RP_TILE(2); break;
                    case 1: GGUFLM_RP_TILE(1); break;
                    default: break;
                    }
#undef GGUFLM_RP_TILE
                }
            }
        }
    }
#if GGUFLM_SIMD_AMX
    if (amx) gguflm_amx_end();
#endif
}

#define GGUFLM_SIMD_RP(path, ROWS16, tag, TYPE)                                                                  \
    static void GGUFLM_SIMD(path##_##tag)(int64_t n, const uint8_t *w, int64_t ws, int64_t nr, const uint8_t *y, \
                                          int64_t ys, int64_t nt, float *o, int64_t os, int arith) {             \
        (void)arith;                                                                                             \
        if (nt == 1) GGUFLM_SIMD(rp_gemv)(TYPE, ROWS16, n, w, ws, nr, (const block_q8_0 *)y, o);                  \
        else GGUFLM_SIMD(rp_gemm)(TYPE, ROWS16, n, w, ws, nr, y, ys, nt, o, os);                                 \
    }
GGUFLM_SIMD_RP(Q4_0_REPACK, 0, q4_0, GGUFLM_Q4_0)
GGUFLM_SIMD_RP(Q4_0_REPACK, 0, iq4_nl, GGUFLM_IQ4_NL)
GGUFLM_SIMD_RP(Q4_0_REPACK, 0, mxfp4, GGUFLM_MXFP4)
GGUFLM_SIMD_RP(Q4_0_ROWS16, 1, q4_0, GGUFLM_Q4_0)
GGUFLM_SIMD_RP(Q4_0_ROWS16, 1, iq4_nl, GGUFLM_IQ4_NL)
GGUFLM_SIMD_RP(Q4_0_ROWS16, 1, mxfp4, GGUFLM_MXFP4)
#undef GGUFLM_SIMD_RP
#undef gguflm_rp_vi
#undef gguflm_rp_vf
#undef GGUFLM_RP_W
#undef GGUFLM_RP_TMAX
#undef GGUFLM_RP_VB
#undef GGUFLM_RP_BLOCK
#undef GGUFLM_RP_GROUP
#undef GGUFLM_RP_GEMV_ROWS
#undef GGUFLM_RP_KB
#undef GGUFLM_RP_TB
