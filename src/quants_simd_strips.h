/* AVX-512 batch GEMM in strips of 16 weight rows per vector, for the types whose recipe keeps 8
 * int32 lanes per output and one float step per lane and block: the legacy blocks (Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_0; ggml's vec_dot and tinyBLAS recipe) and the ternary super-blocks (TQ1_0,
 * TQ2_0), the same floats as their DOT kernels, laid out so that no vector op is spent on what is
 * one scalar per output.
 * The recipe: lane l takes elements 4l..4l+3 of each 32-element chunk of a block (a legacy block is
 * one chunk, a ternary super-block 8), starting from an offset (below);
 * acc[l] = fma(dx*dy, (float)lane, acc[l]) per block, then ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
 * Here vector l of a token holds that lane l for 16 rows (lane r: row r), so per chunk and token
 * the 8 lanes cost 8 vpdpbusd, and per block 8 conversions and 8 fmas with one multiply for the 16
 * rows' dx*dy, where the two-outputs-per-vector tiles (quants_simd_gemm.h) spend one multiply per
 * vpdpbusd; the final sum of the 8 lanes is 7 vertical adds in ggml's order.
 * A strip of 16 rows is decoded once for all the tokens of the call (the matmul hands it batches of
 * gguflm_strip_tokens() or more whole, the decoding does not pay below): each chunk's quants,
 * unsigned (+128 for the signed legacy types, the ternary values + 1), transposed so that vector l
 * has row r's 4 quants of lane l in lane r. The token's 4 int8 values of lane l are one broadcast
 * dword. The lane's offset is the accumulator's starting value: -128 * the 4 activations' sum for
 * the signed legacy types, none with a min (Q4_1, Q5_1: the min's separate sum), and for the
 * ternary types the recipe's -(bsums[2l] + bsums[2l+1]) (the activations of chunk l: the same
 * integer total, in ggml's lanes).
 * No include guard: included once, in the AVX-512 copy of quants_simd_body.h (GGUFLM_SIMD_512).
 */

#define GGUFLM_STRIP_ROWS 16

/* the ternary types' unsigned values, chunk c in u[c] (quants_simd_lut.h, included after this file) */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(tq_values)(int type, const uint8_t *xb, __m256i u[8]);

static inline int gguflm_strip_chunks(int type) { return gguflm_is_ternary(type) ? 8 : 1; }

/* tokens per tile: each strip vector loaded serves them all. A ternary block's 8 lanes are 64
 * vpdpbusd per token and its 8 accumulators stay in registers for 4 tokens (one thread,
 * 4096x4096, 256 tokens: 318-322 -> 330-346 GOP/s against 2); a legacy block has one fma per
 * vpdpbusd, and 4 tokens' 32 accumulators spill (Q5_1 185 -> 145) */
#define GGUFLM_STRIP_TILE 4
static inline int gguflm_strip_tile_tokens(int type) { return gguflm_is_ternary(type) ? 4 : 2; }

/* a strip's decoded blocks: q[8 u + l] lane r = row r's unsigned quants 4l..4l+3 of 32-element
 * chunk u (chunk c of block ib: u = chunks * ib + c); d[16 ib + r], m[16 ib + r]: row r's scale and
 * (Q4_1, Q5_1) min of block ib */
typedef struct {
    __m512i *q;
    float *d, *m;
} GGUFLM_SIMD(strip);

/* a tile of tokens (up to GGUFLM_STRIP_TILE), token t's block ib at [GGUFLM_STRIP_TILE ib + t]: dy,
 * sy its scale and (Q8_1) s as floats; start[8 (GGUFLM_STRIP_TILE ib + t) + l]: lane l's offset (none
 * with a min). Made once per tile for all the strips, and kept in memory so that the loop
 * broadcasts them from there (held in registers, GCC shuffled each one out) */
typedef struct {
    float *dy, *sy;
    int32_t *start;
} GGUFLM_SIMD(strip_tokens);

/* 16 vectors v (v[r]: row r's dwords) transposed into n (8 or 16) vectors at dst */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(strip_store)(__m512i v[GGUFLM_STRIP_ROWS], __m512i *dst,
                                                                          int n) {
    GGUFLM_SIMD(kt_transpose)(v);
    for (int l = 0; l < n; ++l) dst[l] = v[l];
}

/* 16 rows' fp16 scales (h) as floats at dst */
static inline void GGUFLM_SIMD(strip_scales)(const uint16_t h[GGUFLM_STRIP_ROWS], float *dst) {
    _mm512_store_ps(dst, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)));
}

/* 16 legacy rows of nb blocks (w, ws bytes apart) into a strip, two blocks per transpose */
#define GGUFLM_STRIP_PREFETCH 16  /* legacy blocks ahead in each row */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(strip_decode_legacy)(int type, size_t bx, int64_t nb,
                                                                                  const uint8_t *w, int64_t ws,
                                                                                  GGUFLM_SIMD(strip) *s) {
    const int has_min = gguflm_legacy_has_min(type);
    const __m256i bias = has_min ? _mm256_setzero_si256() : _mm256_set1_epi8((char)0x80);
    for (int64_t ib = 0; ib < nb; ib += 2) {
        const int pair = ib + 1 < nb;
        __m512i v[GGUFLM_STRIP_ROWS];  /* v[r]: row r's 16 dwords, blocks ib and ib + 1 */
        uint16_t dh[2][GGUFLM_STRIP_ROWS], mh[2][GGUFLM_STRIP_ROWS];
        for (int r = 0; r < GGUFLM_STRIP_ROWS; ++r) {
            const uint8_t *xb = w + r * ws + ib * bx;
            /* 16 rows read side by side: the prefetchers alone left this loop waiting on memory */
            _mm_prefetch((const char *)(xb + GGUFLM_STRIP_PREFETCH * bx), _MM_HINT_T0);
            const __m256i lo = _mm256_xor_si256(GGUFLM_SIMD(legacy_quants)(type, xb), bias);
            const __m256i hi = pair ? _mm256_xor_si256(GGUFLM_SIMD(legacy_quants)(type, xb + bx), bias) : _mm256_setzero_si256();
            v[r] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            for (int k = 0; k <= pair; ++k) {
                memcpy(&dh[k][r], xb + k * bx, 2);
                if (has_min) memcpy(&mh[k][r], xb + k * bx + 2, 2);
            }
        }
        for (int k = 0; k <= pair; ++k) {
            GGUFLM_SIMD(strip_scales)(dh[k], s->d + 16 * (ib + k));
            if (has_min) GGUFLM_SIMD(strip_scales)(mh[k], s->m + 16 * (ib + k));
        }
        GGUFLM_SIMD(strip_store)(v, &s->q[8 * ib], pair ? 16 : 8);
    }
}

/* 16 ternary rows of nb super-blocks into a strip, one pair of chunks per transpose */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(strip_decode_ternary)(int type, size_t bx, int64_t nb,
                                                                                   const uint8_t *w, int64_t ws,
                                                                                   GGUFLM_SIMD(strip) *s) {
    for (int64_t ib = 0; ib < nb; ++ib) {
        __m512i v[4][GGUFLM_STRIP_ROWS];  /* v[p][r]: row r's chunks 2p, 2p + 1 */
        uint16_t dh[GGUFLM_STRIP_ROWS];
        for (int r = 0; r < GGUFLM_STRIP_ROWS; ++r) {
            const uint8_t *xb = w + r * ws + ib * bx;
            _mm_prefetch((const char *)(xb + 4 * bx), _MM_HINT_T0);
            __m256i u[8];
            GGUFLM_SIMD(tq_values)(type, xb, u);
            for (int p = 0; p < 4; ++p) v[p][r] = _mm512_inserti64x4(_mm512_castsi256_si512(u[2 * p]), u[2 * p + 1], 1);
            dh[r] = gguflm_tq_d(type, xb);
        }
        GGUFLM_SIMD(strip_scales)(dh, s->d + 16 * ib);
        for (int p = 0; p < 4; ++p) GGUFLM_SIMD(strip_store)(v[p], &s->q[8 * (8 * ib + 2 * p)], 16);
    }
}

/* the activation's layout: block bytes, offset of its int8 quants */
static inline size_t gguflm_strip_act_bytes(int type) {
    return gguflm_is_ternary(type) ? sizeof(block_q8_K)
           : gguflm_legacy_has_min(type) ? sizeof(block_q8_1) : sizeof(block_q8_0);
}
static inline size_t gguflm_strip_act_qs(int type) {
    return gguflm_is_ternary(type) ? offsetof(block_q8_K, qs) : gguflm_legacy_has_min(type) ? 4 : 2;
}

/* the tables of a tile of T tokens (strip_tokens) */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(strip_prepare)(int type, int64_t nb, const uint8_t *y,
                                                                            int64_t ys, int T,
                                                                            const GGUFLM_SIMD(strip_tokens) *k) {
    const size_t by = gguflm_strip_act_bytes(type), qoff = gguflm_strip_act_qs(type);
    for (int64_t ib = 0; ib < nb; ++ib)
        for (int t = 0; t < T; ++t) {
            const uint8_t *yb = y + t * ys + ib * by;
            __m256i start;
            if (gguflm_is_ternary(type)) {
                const block_q8_K *b = (const block_q8_K *)yb;
                k->dy[GGUFLM_STRIP_TILE * ib + t] = b->d;
                start = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)b->bsums), _mm256_set1_epi16(1));
            } else {
                k->dy[GGUFLM_STRIP_TILE * ib + t] = GGUFLM_FP16_TO_FP32_SIMD(*(const ggml_half *)yb);
                if (gguflm_legacy_has_min(type)) {
                    k->sy[GGUFLM_STRIP_TILE * ib + t] = GGUFLM_FP16_TO_FP32_SIMD(((const block_q8_1 *)yb)->s);
                    continue;
                }
                start = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80),
                                            _mm256_loadu_si256((const __m256i *)(yb + qoff)));
            }
            _mm256_store_si256((__m256i *)(k->start + 8 * (GGUFLM_STRIP_TILE * ib + t)), _mm256_sub_epi32(_mm256_setzero_si256(), start));
        }
}

/* T tokens (up to GGUFLM_STRIP_TILE, prepared in k) against a decoded strip: out[t * os + r] for its 16 rows */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(strip_tile)(int type, int64_t nb,
                                                                         const GGUFLM_SIMD(strip) *s,
                                                                         const GGUFLM_SIMD(strip_tokens) *k,
                                                                         const uint8_t *y, int64_t ys, int T,
                                                                         float *out, int64_t os) {
    const size_t by = gguflm_strip_act_bytes(type), qoff = gguflm_strip_act_qs(type);
    const int has_min = gguflm_legacy_has_min(type), chunks = gguflm_strip_chunks(type);
    __m512 acc[GGUFLM_STRIP_TILE][8], summ[GGUFLM_STRIP_TILE];
    #pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
        summ[t] = _mm512_setzero_ps();
        #pragma GCC unroll 8
        for (int l = 0; l < 8; ++l) acc[t][l] = _mm512_setzero_ps();
    }
    for (int64_t ib = 0; ib < nb; ++ib) {
        const __m512 dx = _mm512_load_ps(s->d + 16 * ib);
        __m512 dxy[GGUFLM_STRIP_TILE];
        #pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
            dxy[t] = _mm512_mul_ps(dx, _mm512_set1_ps(k->dy[GGUFLM_STRIP_TILE * ib + t]));
            if (has_min) summ[t] = _mm512_fmadd_ps(_mm512_load_ps(s->m + 16 * ib), _mm512_set1_ps(k->sy[GGUFLM_STRIP_TILE * ib + t]), summ[t]);
        }
        #pragma GCC unroll 8
        for (int l = 0; l < 8; ++l) {
            __m512i lane[GGUFLM_STRIP_TILE];
            #pragma GCC unroll 4
            for (int t = 0; t < T; ++t)
                lane[t] = has_min ? _mm512_setzero_si512() : _mm512_set1_epi32(k->start[8 * (GGUFLM_STRIP_TILE * ib + t) + l]);
            #pragma GCC unroll 8
            for (int c = 0; c < chunks; ++c) {
                const __m512i q = _mm512_load_si512((const void *)&s->q[8 * (chunks * ib + c) + l]);
                #pragma GCC unroll 4
                for (int t = 0; t < T; ++t) {
                    const __m512i a = _mm512_set1_epi32((int)gguflm_u32_at(y + t * ys + ib * by + qoff + 32 * c + 4 * l));
                    lane[t] = _mm512_dpbusd_epi32(lane[t], q, a);
                }
            }
            #pragma GCC unroll 4
            for (int t = 0; t < T; ++t) acc[t][l] = _mm512_fmadd_ps(dxy[t], _mm512_cvtepi32_ps(lane[t]), acc[t][l]);
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
        const __m512 *a = acc[t];
        __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                                   _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])));
        if (has_min) sum = _mm512_add_ps(sum, summ[t]);
        _mm512_storeu_ps(out + t * os, sum);
    }
}

/* the rows of whole strips of 16 (nr rounded down) against all nt tokens, up to
 * GGUFLM_STRIPS_HELD strips decoded at a time and each tile of tokens prepared once for them;
 * returns those rows, 0 when the batch is too small or the buffer cannot be had */
#define GGUFLM_STRIPS_HELD 4
static inline __attribute__((always_inline)) int64_t GGUFLM_SIMD(strips_gemm)(int type, size_t bx, int64_t n,
                                                                             const uint8_t *w, int64_t ws, int64_t nr,
                                                                             const uint8_t *y, int64_t ys, int64_t nt,
                                                                             float *o, int64_t os) {
    const int chunks = gguflm_strip_chunks(type);
    const int64_t nb = n / (32 * chunks), strips = nr / GGUFLM_STRIP_ROWS;
    if (nt < gguflm_strip_tokens(type) || strips == 0) return 0;
    /* per block: a strip's 8 vectors per chunk and 2 x 16 row floats, a tile's 4 x 8 starts and
     * 2 x 4 floats */
    const size_t strip_bytes = (size_t)nb * (chunks * 8 * 64 + 2 * 64);
    const int held = (int)(strips < GGUFLM_STRIPS_HELD ? strips : GGUFLM_STRIPS_HELD);  /* a 16-row chunk: 1 */
    void *buf = aligned_alloc(64, held * strip_bytes + ((size_t)nb * GGUFLM_STRIP_TILE * (32 + 8) + 63) / 64 * 64);
    if (!buf) return 0;
    GGUFLM_SIMD(strip) s[GGUFLM_STRIPS_HELD];
    for (int j = 0; j < held; ++j) {
        s[j].q = (__m512i *)((uint8_t *)buf + j * strip_bytes);
        s[j].d = (float *)(s[j].q + chunks * 8 * nb);
        s[j].m = s[j].d + GGUFLM_STRIP_ROWS * nb;
    }
    const int tile = gguflm_strip_tile_tokens(type);
    GGUFLM_SIMD(strip_tokens) k;
    k.start = (int32_t *)((uint8_t *)buf + held * strip_bytes);
    k.dy = (float *)(k.start + 8 * GGUFLM_STRIP_TILE * nb);
    k.sy = k.dy + GGUFLM_STRIP_TILE * nb;
    for (int64_t k0 = 0; k0 < strips; k0 += held) {
        const int ns = (int)(strips - k0 < held ? strips - k0 : held);
        const int64_t r0 = k0 * GGUFLM_STRIP_ROWS;
        for (int j = 0; j < ns; ++j) {
            const uint8_t *wj = w + (r0 + j * GGUFLM_STRIP_ROWS) * ws;
            if (chunks == 1) GGUFLM_SIMD(strip_decode_legacy)(type, bx, nb, wj, ws, &s[j]);
            else GGUFLM_SIMD(strip_decode_ternary)(type, bx, nb, wj, ws, &s[j]);
        }
        for (int64_t t = 0; t < nt; t += tile) {
            const int T = (int)(nt - t >= tile ? tile : nt - t);
            GGUFLM_SIMD(strip_prepare)(type, nb, y + t * ys, ys, T, &k);
            for (int j = 0; j < ns; ++j) {  /* T a constant in each call, for the unrolled tile */
                float *ot = o + t * os + r0 + j * GGUFLM_STRIP_ROWS;
                if (tile > 2 && T == 4) GGUFLM_SIMD(strip_tile)(type, nb, &s[j], &k, y + t * ys, ys, 4, ot, os);
                else if (tile > 2 && T == 3) GGUFLM_SIMD(strip_tile)(type, nb, &s[j], &k, y + t * ys, ys, 3, ot, os);
                else if (T == 2) GGUFLM_SIMD(strip_tile)(type, nb, &s[j], &k, y + t * ys, ys, 2, ot, os);
                else GGUFLM_SIMD(strip_tile)(type, nb, &s[j], &k, y + t * ys, ys, 1, ot, os);
            }
        }
    }
    free(buf);
    return strips * GGUFLM_STRIP_ROWS;
}
