/* AVX-512 batch GEMM of the legacy blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), 16 weight rows per
 * vector: the same floats as the DOT kernels (ggml's vec_dot and tinyBLAS recipe), laid out so
 * that no vector op is spent on what is one scalar per output.
 * ggml keeps 8 float lanes per output, lane l taking elements 4l..4l+3 of each 32-element block:
 * acc[l] = fma(dx*dy, (float)sum4, acc[l]) per block, then ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
 * Here vector l of a token holds that lane l for 16 rows (lane r: row r), so per block and token
 * the 8 lanes cost 8 vpdpbusd, 8 conversions and 8 fmas with one multiply for the 16 rows' dx*dy,
 * where the two-outputs-per-vector tiles (quants_simd_gemm.h) spend one multiply per vpdpbusd;
 * the final sum of the 8 lanes is 7 vertical adds in ggml's order.
 * A strip of 16 rows is decoded once for all the tokens of the call (the matmul hands it batches of
 * GGUFLM_LEGACY_STRIP_TOKENS or more whole, the decoding does not pay below): each block's
 * quants, offset to unsigned (+128 for the signed types), transposed so that vector l has row r's
 * 4 quants of lane l in lane r. The token's 4 int8 values of lane l are one broadcast dword; the
 * offset comes back as -128 * their sum, the accumulator's starting value.
 * No include guard: included once, in the AVX-512 copy of quants_simd_body.h (GGUFLM_SIMD_512).
 */

#define GGUFLM_L16_ROWS 16
#define GGUFLM_L16_PREFETCH 16  /* blocks ahead in each row */

/* a strip's decoded blocks: q[8 ib + l] lane r = row r's unsigned quants 4l..4l+3 of block ib;
 * d[16 ib + r], m[16 ib + r]: row r's scale and (Q4_1, Q5_1) min of block ib */
typedef struct {
    __m512i *q;
    float *d, *m;
} GGUFLM_SIMD(l16_strip);

/* a tile of tokens (up to 2), token t's block ib at [2 ib + t]: dy, sy its scale and (Q8_1) s as
 * floats; start[8 (2 ib + t) + l]: the signed types' -128 * the sum of lane l's 4 activations.
 * Made once per tile for all the strips, and kept in memory so that the loop broadcasts them from
 * there (held in registers, GCC shuffled each one out) */
typedef struct {
    float *dy, *sy;
    int32_t *start;
} GGUFLM_SIMD(l16_tokens);

/* 16 rows of nb blocks (w, ws bytes apart) into a strip */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(l16_decode)(int type, size_t bx, int64_t nb,
                                                                         const uint8_t *w, int64_t ws,
                                                                         GGUFLM_SIMD(l16_strip) *s) {
    const int has_min = gguflm_legacy_has_min(type);
    const __m256i bias = has_min ? _mm256_setzero_si256() : _mm256_set1_epi8((char)0x80);
    for (int64_t ib = 0; ib < nb; ib += 2) {
        const int pair = ib + 1 < nb;
        __m512i v[GGUFLM_L16_ROWS];  /* v[r]: row r's 16 dwords, blocks ib and ib + 1 */
        uint16_t dh[2][GGUFLM_L16_ROWS], mh[2][GGUFLM_L16_ROWS];
        for (int r = 0; r < GGUFLM_L16_ROWS; ++r) {
            const uint8_t *xb = w + r * ws + ib * bx;
            /* 16 rows read side by side: the prefetchers alone left this loop waiting on memory */
            _mm_prefetch((const char *)(xb + GGUFLM_L16_PREFETCH * bx), _MM_HINT_T0);
            const __m256i lo = _mm256_xor_si256(GGUFLM_SIMD(legacy_quants)(type, xb), bias);
            const __m256i hi = pair ? _mm256_xor_si256(GGUFLM_SIMD(legacy_quants)(type, xb + bx), bias) : _mm256_setzero_si256();
            v[r] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            for (int k = 0; k <= pair; ++k) {
                memcpy(&dh[k][r], xb + k * bx, 2);
                if (has_min) memcpy(&mh[k][r], xb + k * bx + 2, 2);
            }
        }
        for (int k = 0; k <= pair; ++k) {
            _mm512_store_ps(s->d + 16 * (ib + k), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh[k])));
            if (has_min) _mm512_store_ps(s->m + 16 * (ib + k), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)mh[k])));
        }
        GGUFLM_SIMD(kt_transpose)(v);
        for (int l = 0; l < 8; ++l) s->q[8 * ib + l] = v[l];
        if (pair)
            for (int l = 0; l < 8; ++l) s->q[8 * (ib + 1) + l] = v[8 + l];
    }
}

/* the tables of a tile of T tokens (l16_tokens) */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(l16_prepare)(int has_min, int64_t nb, const uint8_t *y,
                                                                          int64_t ys, int T,
                                                                          const GGUFLM_SIMD(l16_tokens) *k) {
    const size_t by = has_min ? sizeof(block_q8_1) : sizeof(block_q8_0), qoff = has_min ? 4 : 2;
    for (int64_t ib = 0; ib < nb; ++ib)
        for (int t = 0; t < T; ++t) {
            const uint8_t *yb = y + t * ys + ib * by;
            k->dy[2 * ib + t] = GGUFLM_FP16_TO_FP32_SIMD(*(const ggml_half *)yb);
            if (has_min) {
                k->sy[2 * ib + t] = GGUFLM_FP16_TO_FP32_SIMD(((const block_q8_1 *)yb)->s);
            } else {
                const __m256i sum4 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80),
                                                         _mm256_loadu_si256((const __m256i *)(yb + qoff)));
                _mm256_store_si256((__m256i *)(k->start + 8 * (2 * ib + t)), _mm256_sub_epi32(_mm256_setzero_si256(), sum4));
            }
        }
}

/* T tokens (1 or 2, prepared in k) against a decoded strip: out[t * os + r] for its 16 rows */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(l16_tile)(int has_min, int64_t nb,
                                                                       const GGUFLM_SIMD(l16_strip) *s,
                                                                       const GGUFLM_SIMD(l16_tokens) *k,
                                                                       const uint8_t *y, int64_t ys, int T,
                                                                       float *out, int64_t os) {
    const size_t by = has_min ? sizeof(block_q8_1) : sizeof(block_q8_0), qoff = has_min ? 4 : 2;
    __m512 acc[2][8], summ[2];
    #pragma GCC unroll 2
    for (int t = 0; t < T; ++t) {
        summ[t] = _mm512_setzero_ps();
        #pragma GCC unroll 8
        for (int l = 0; l < 8; ++l) acc[t][l] = _mm512_setzero_ps();
    }
    for (int64_t ib = 0; ib < nb; ++ib) {
        const __m512 dx = _mm512_load_ps(s->d + 16 * ib);
        __m512 dxy[2];
        #pragma GCC unroll 2
        for (int t = 0; t < T; ++t) {
            dxy[t] = _mm512_mul_ps(dx, _mm512_set1_ps(k->dy[2 * ib + t]));
            if (has_min) summ[t] = _mm512_fmadd_ps(_mm512_load_ps(s->m + 16 * ib), _mm512_set1_ps(k->sy[2 * ib + t]), summ[t]);
        }
        #pragma GCC unroll 8
        for (int l = 0; l < 8; ++l) {
            const __m512i q = _mm512_load_si512((const void *)&s->q[8 * ib + l]);
            #pragma GCC unroll 2
            for (int t = 0; t < T; ++t) {
                const __m512i a = _mm512_set1_epi32((int)gguflm_u32_at(y + t * ys + ib * by + qoff + 4 * l));
                const __m512i start = has_min ? _mm512_setzero_si512() : _mm512_set1_epi32(k->start[8 * (2 * ib + t) + l]);
                acc[t][l] = _mm512_fmadd_ps(dxy[t], _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, q, a)), acc[t][l]);
            }
        }
    }
    #pragma GCC unroll 2
    for (int t = 0; t < T; ++t) {
        const __m512 *a = acc[t];
        __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                                   _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])));
        if (has_min) sum = _mm512_add_ps(sum, summ[t]);
        _mm512_storeu_ps(out + t * os, sum);
    }
}

/* the rows of whole strips of 16 (nr rounded down) against all nt tokens, up to
 * GGUFLM_L16_STRIPS strips decoded at a time and each tile of tokens prepared once for them;
 * returns those rows, 0 when the batch is too small or the buffer cannot be had */
#define GGUFLM_L16_STRIPS 4
static inline __attribute__((always_inline)) int64_t GGUFLM_SIMD(legacy16_gemm)(int type, size_t bx, int64_t n,
                                                                               const uint8_t *w, int64_t ws, int64_t nr,
                                                                               const uint8_t *y, int64_t ys, int64_t nt,
                                                                               float *o, int64_t os) {
    const int64_t nb = n / 32, strips = nr / GGUFLM_L16_ROWS;
    if (nt < GGUFLM_LEGACY_STRIP_TOKENS || strips == 0) return 0;
    const int has_min = gguflm_legacy_has_min(type);
    /* per block: a strip's 8 vectors and 2 x 16 row floats, a tile's 2 x 8 starts and 2 x 2 floats */
    const size_t strip_bytes = (size_t)nb * (8 * 64 + 2 * 64);
    const int held = (int)(strips < GGUFLM_L16_STRIPS ? strips : GGUFLM_L16_STRIPS);  /* a 16-row chunk: 1 */
    void *buf = aligned_alloc(64, held * strip_bytes + ((size_t)nb * (64 + 16) + 63) / 64 * 64);
    if (!buf) return 0;
    GGUFLM_SIMD(l16_strip) s[GGUFLM_L16_STRIPS];
    for (int j = 0; j < held; ++j) {
        s[j].q = (__m512i *)((uint8_t *)buf + j * strip_bytes);
        s[j].d = (float *)(s[j].q + 8 * nb);
        s[j].m = s[j].d + GGUFLM_L16_ROWS * nb;
    }
    GGUFLM_SIMD(l16_tokens) k;
    k.start = (int32_t *)((uint8_t *)buf + held * strip_bytes);
    k.dy = (float *)(k.start + 16 * nb);
    k.sy = k.dy + 2 * nb;
    for (int64_t k0 = 0; k0 < strips; k0 += held) {
        const int ns = (int)(strips - k0 < held ? strips - k0 : held);
        const int64_t r0 = k0 * GGUFLM_L16_ROWS;
        for (int j = 0; j < ns; ++j) GGUFLM_SIMD(l16_decode)(type, bx, nb, w + (r0 + j * GGUFLM_L16_ROWS) * ws, ws, &s[j]);
        for (int64_t t = 0; t < nt; t += 2) {
            const int T = nt - t >= 2 ? 2 : 1;
            GGUFLM_SIMD(l16_prepare)(has_min, nb, y + t * ys, ys, T, &k);
            for (int j = 0; j < ns; ++j) {  /* T a constant in each call, for the unrolled tile */
                float *ot = o + t * os + r0 + j * GGUFLM_L16_ROWS;
                if (T == 2) GGUFLM_SIMD(l16_tile)(has_min, nb, &s[j], &k, y + t * ys, ys, 2, ot, os);
                else GGUFLM_SIMD(l16_tile)(has_min, nb, &s[j], &k, y + t * ys, ys, 1, ot, os);
            }
        }
    }
    free(buf);
    return strips * GGUFLM_L16_ROWS;
}
