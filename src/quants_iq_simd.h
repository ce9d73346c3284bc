/* SIMD kernels of the grid i-quants, compiled with quants_simd_body.h once for AVX2 and once for
 * AVX-512 (GGUFLM_SIMD names each copy). DOT decodes each 32-element group in registers as ggml's
 * AVX2 vec_dot does (grid entries gathered by table lookups, sign masks from ksigns64 or the sign
 * bits) and runs its integer dots (magnitudes . activations with the signs applied by xor/sub,
 * vpmaddubsw, vpmaddwd by the scale of each 16), so the lanes, and the floats after them, are the
 * scalar reference's bit for bit. TILED reuses that decoding for the signed values and sums the
 * exact products (activations offset to unsigned bytes, the offset's share taken off once).
 * No include guard: this file is meant to be included more than once.
 */

#ifndef GGUFLM_IQ_TILED_TOKENS
#define GGUFLM_IQ_TILED_TOKENS 16  /* tokens per decoded weight row in TILED (the matmul's token tile) */
#endif

/* t[i0], .., t[i3] as a vector's 4 qwords: a load, then broadcasts from memory (load ports only)
 * blended in (any vector port), where _mm256_set_epi64x's inserts take the shuffle port. IQ1_M's
 * entries come so, where it measured faster (one thread, Intel Xeon with AMX, GGUFLM_ISA=avx2); the
 * other qword grids measured 2-5% slower so and keep their inserts. */
static inline __attribute__((always_inline)) __m256i GGUFLM_SIMD(iq_qwords4)(const uint64_t *t, unsigned i0, unsigned i1,
                                                                            unsigned i2, unsigned i3) {
    __m256i r = _mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)(t + i0)));
    r = _mm256_blend_epi32(r, _mm256_set1_epi64x((long long)t[i1]), 0x0c);
    r = _mm256_blend_epi32(r, _mm256_set1_epi64x((long long)t[i2]), 0x30);
    return _mm256_blend_epi32(r, _mm256_set1_epi64x((long long)t[i3]), 0xc0);
}

/* What the groups of an IQ1_S, IQ1_M, IQ2_XS or IQ2_S super-block share, prepared once for all
 * of them:
 * - ix (IQ1): the 32 grid indices, computed in vectors and left in memory for the scalar loads of the
 *   entries (the index arithmetic entry by entry was most of the work): entry e = qs[e] | a 3-bit
 *   field of the qh bits at bits 8-10. IQ1_S: field e % 4 (bits 3j) of qh word e / 4; IQ1_M: the
 *   low or high nibble's 3 bits (e odd) of qh byte e / 2.
 * - scales: the int16 2 s + 1 of its scales, so that one vpshufb gives a group its own
 *   (iq_group_scales): IQ1_S's 8 in both lanes; the 16 of the others, the even-numbered 16s' in
 *   the low lane and the odd ones' in the high (IQ1_M's scale arithmetic group by group, with
 *   variable shifts, took more than the decoding around it: ~58 -> ~45 TSC cycles a super-block,
 *   one thread, 256 x 24576, Intel Xeon with AMX, GGUFLM_ISA=avx2; IQ2_XS/IQ2_S broadcast two
 *   scales a group). */
typedef struct {
    uint16_t ix[32];
    __m256i scales;
} GGUFLM_SIMD(iq_prep);

static inline __attribute__((always_inline)) void GGUFLM_SIMD(iq_prepare)(int type, const uint8_t *xb, GGUFLM_SIMD(iq_prep) *p) {
    if (gguflm_iq_is_1bit(type)) {
        const int s = type == GGUFLM_IQ1_S;
        const uint8_t *qs = xb + (s ? 2 : 0);
        const __m256i qh = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xb + (s ? 34 : 32))));
        /* each lane's field to bits 13-15 (the rest of its 16 bits shifted out), then down to 8-10 */
        const __m256i mul = s ? _mm256_setr_epi16(8192, 1024, 128, 16, 8192, 1024, 128, 16, 8192, 1024, 128, 16, 8192, 1024, 128, 16)
                              : _mm256_setr_epi16(8192, 512, 8192, 512, 8192, 512, 8192, 512, 8192, 512, 8192, 512, 8192, 512, 8192, 512);
        /* lane e (of 16) of each half takes qh word e / 4 (IQ1_S) or byte e / 2 (IQ1_M, high byte zero) */
        static const int8_t picks[2][2][32] = {
            {{0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1, 4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1},
             {8, -1, 8, -1, 9, -1, 9, -1, 10, -1, 10, -1, 11, -1, 11, -1, 12, -1, 12, -1, 13, -1, 13, -1, 14, -1, 14, -1, 15, -1, 15, -1}},
            {{0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7},
             {8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 12, 13, 12, 13, 12, 13, 12, 13, 14, 15, 14, 15, 14, 15, 14, 15}}};
        for (int half = 0; half < 2; ++half) {
            const __m256i pick = _mm256_loadu_si256((const __m256i *)picks[s][half]);
            const __m256i h = _mm256_slli_epi16(_mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(qh, pick), mul), 13), 8);
            const __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(qs + 16 * half)));
            _mm256_storeu_si256((__m256i *)(p->ix + 16 * half), _mm256_or_si256(q, h));
        }
    }
    __m256i ls;   /* the scale levels s */
    if (type == GGUFLM_IQ1_S) {         /* scale g: bits 12-14 of qh word g, in both lanes */
        ls = _mm256_broadcastsi128_si256(_mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(xb + 34)), 12), _mm_set1_epi16(7)));
    } else if (type == GGUFLM_IQ1_M) {  /* scale c: bits 3 (c % 4) .. of scale word c / 4; slot k of the
                                         * low lane takes c = 2k (word k / 2, shift 0 or 6), of the high c = 2k + 1 */
        static const int8_t words[32] = {0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7,
                                         0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7};
        /* (w >> shift) & 7 as the top 3 bits of w * 2^(13 - shift) */
        const __m256i w = _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)gguflm_u64_at(xb + 48)),
                                              _mm256_loadu_si256((const __m256i *)words));
        ls = _mm256_srli_epi16(_mm256_mullo_epi16(w, _mm256_setr_epi16(8192, 128, 8192, 128, 8192, 128, 8192, 128,
                                                                       1024, 16, 1024, 16, 1024, 16, 1024, 16)), 13);
    } else {                            /* IQ2_XS, IQ2_S: nibble 2g, 2g + 1: byte g's low, high */
        const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(xb + (type == GGUFLM_IQ2_XS ? 66 : 74))));
        ls = _mm256_set_m128i(_mm_srli_epi16(b, 4), _mm_and_si128(b, _mm_set1_epi16(15)));
    }
    p->scales = _mm256_add_epi16(_mm256_add_epi16(ls, ls), _mm256_set1_epi16(1));
}

/* group g's int16 scales from the prepared ones: word g of each lane (IQ1_S: its scale in both;
 * the others: its first and second half's) */
static inline __attribute__((always_inline)) __m256i GGUFLM_SIMD(iq_group_scales)(const GGUFLM_SIMD(iq_prep) *p, int g) {
#define GGUFLM_IQ1_AT4(g) 2 * (g), 2 * (g) + 1, 2 * (g), 2 * (g) + 1, 2 * (g), 2 * (g) + 1, 2 * (g), 2 * (g) + 1
#define GGUFLM_IQ1_AT(g) {GGUFLM_IQ1_AT4(g), GGUFLM_IQ1_AT4(g), GGUFLM_IQ1_AT4(g), GGUFLM_IQ1_AT4(g)}
    static const int8_t at[8][32] __attribute__((aligned(32))) = {
        GGUFLM_IQ1_AT(0), GGUFLM_IQ1_AT(1), GGUFLM_IQ1_AT(2), GGUFLM_IQ1_AT(3),
        GGUFLM_IQ1_AT(4), GGUFLM_IQ1_AT(5), GGUFLM_IQ1_AT(6), GGUFLM_IQ1_AT(7)};
#undef GGUFLM_IQ1_AT
#undef GGUFLM_IQ1_AT4
    return _mm256_shuffle_epi8(p->scales, _mm256_load_si256((const __m256i *)at[g]));
}

/* One 32-element group g of a super-block decoded in registers, as ggml's AVX2 vec_dot does it:
 * the grid magnitudes (bytes), the signs (0xff where an element is negative; IQ1: the signed grid
 * values -1, 0, 1 themselves, for vpsignb as ggml's mul_add_epi8), the int16 scale of each element
 * pair (its 16's scale), and for IQ1 0xff where the element's delta is negative. gather: the
 * 3-bit grids' 8 entries by one vpgatherdd instead of 8 loads and inserts (the faster way on
 * Intel's cores, quants_kernels.h: gguflm_avx2_gathers_pay; same bytes). */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(iq_group)(int type, int gather, const uint8_t *xb, int g,
                                                                       const GGUFLM_SIMD(iq_prep) *p, __m256i *mag,
                                                                       __m256i *neg, __m256i *sc, __m256i *dneg) {
    switch (type) {
    case GGUFLM_IQ2_XXS: {
        const uint8_t *q = xb + 2 + 8 * g;
        const uint32_t a = gguflm_u32_at(q + 4);
        *mag = _mm256_set_epi64x((int64_t)gguflm_iq2xxs_grid[q[3]], (int64_t)gguflm_iq2xxs_grid[q[2]],
                                 (int64_t)gguflm_iq2xxs_grid[q[1]], (int64_t)gguflm_iq2xxs_grid[q[0]]);
        *neg = _mm256_set_epi64x((int64_t)gguflm_ksigns64[(a >> 21) & 127], (int64_t)gguflm_ksigns64[(a >> 14) & 127],
                                 (int64_t)gguflm_ksigns64[(a >> 7) & 127], (int64_t)gguflm_ksigns64[a & 127]);
        *sc = _mm256_set1_epi16((int16_t)(2 * (a >> 28) + 1));
        break;
    }
    case GGUFLM_IQ2_XS: {
        const uint8_t *q = xb + 2 + 8 * g;
        uint16_t v[4];
        memcpy(v, q, 8);
        *mag = _mm256_set_epi64x((int64_t)gguflm_iq2xs_grid[v[3] & 511], (int64_t)gguflm_iq2xs_grid[v[2] & 511],
                                 (int64_t)gguflm_iq2xs_grid[v[1] & 511], (int64_t)gguflm_iq2xs_grid[v[0] & 511]);
        *neg = _mm256_set_epi64x((int64_t)gguflm_ksigns64[v[3] >> 9], (int64_t)gguflm_ksigns64[v[2] >> 9],
                                 (int64_t)gguflm_ksigns64[v[1] >> 9], (int64_t)gguflm_ksigns64[v[0] >> 9]);
        *sc = GGUFLM_SIMD(iq_group_scales)(p, g);
        break;
    }
    case GGUFLM_IQ2_S: {
        const uint8_t *q = xb + 2 + 4 * g;
        const unsigned h = xb[66 + g];
        *mag = _mm256_set_epi64x((int64_t)gguflm_iq2s_grid[q[3] | ((h << 2) & 0x300)], (int64_t)gguflm_iq2s_grid[q[2] | ((h << 4) & 0x300)],
                                 (int64_t)gguflm_iq2s_grid[q[1] | ((h << 6) & 0x300)], (int64_t)gguflm_iq2s_grid[q[0] | ((h << 8) & 0x300)]);
        *neg = GGUFLM_SIMD(bits_32)(xb + 34 + 4 * g);
        *sc = GGUFLM_SIMD(iq_group_scales)(p, g);
        break;
    }
    case GGUFLM_IQ3_XXS: {
        const uint8_t *q = xb + 2 + 8 * g;
        const uint32_t a = gguflm_u32_at(xb + 66 + 4 * g);
        if (gather)
            *mag = _mm256_i32gather_epi32((const int *)gguflm_iq3xxs_grid, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q)), 4);
        else
            *mag = _mm256_set_epi32((int)gguflm_iq3xxs_grid[q[7]], (int)gguflm_iq3xxs_grid[q[6]], (int)gguflm_iq3xxs_grid[q[5]],
                                    (int)gguflm_iq3xxs_grid[q[4]], (int)gguflm_iq3xxs_grid[q[3]], (int)gguflm_iq3xxs_grid[q[2]],
                                    (int)gguflm_iq3xxs_grid[q[1]], (int)gguflm_iq3xxs_grid[q[0]]);
        *neg = _mm256_set_epi64x((int64_t)gguflm_ksigns64[(a >> 21) & 127], (int64_t)gguflm_ksigns64[(a >> 14) & 127],
                                 (int64_t)gguflm_ksigns64[(a >> 7) & 127], (int64_t)gguflm_ksigns64[a & 127]);
        *sc = _mm256_set1_epi16((int16_t)(2 * (a >> 28) + 1));
        break;
    }
    case GGUFLM_IQ3_S: {
        const uint8_t *q = xb + 2 + 8 * g;
        const unsigned h = xb[66 + g];
        if (gather)  /* index j: q[j] | bit j of h at bit 8 */
            *mag = _mm256_i32gather_epi32((const int *)gguflm_iq3s_grid,
                                          _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q)),
                                                          _mm256_and_si256(_mm256_sllv_epi32(_mm256_set1_epi32((int)h), _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1)),
                                                                           _mm256_set1_epi32(256))), 4);
        else
            *mag = _mm256_set_epi32((int)gguflm_iq3s_grid[q[7] | ((h << 1) & 256)], (int)gguflm_iq3s_grid[q[6] | ((h << 2) & 256)],
                                    (int)gguflm_iq3s_grid[q[5] | ((h << 3) & 256)], (int)gguflm_iq3s_grid[q[4] | ((h << 4) & 256)],
                                    (int)gguflm_iq3s_grid[q[3] | ((h << 5) & 256)], (int)gguflm_iq3s_grid[q[2] | ((h << 6) & 256)],
                                    (int)gguflm_iq3s_grid[q[1] | ((h << 7) & 256)], (int)gguflm_iq3s_grid[q[0] | ((h << 8) & 256)]);
        *neg = GGUFLM_SIMD(bits_32)(xb + 74 + 4 * g);
        *sc = _mm256_set1_epi16((int16_t)(1 + 2 * ((xb[106 + g / 2] >> (4 * (g % 2))) & 15)));
        break;
    }
    case GGUFLM_IQ1_S: {    /* entries by scalar loads: a vpgatherdq of 4 took twice as long on Zen 5 */
        const uint16_t *ix = p->ix + 4 * g;
        const unsigned h = gguflm_u16_at(xb + 34 + 2 * g);
        const __m256i v = _mm256_set_epi64x((int64_t)gguflm_iq1s_grid[ix[3]], (int64_t)gguflm_iq1s_grid[ix[2]],
                                            (int64_t)gguflm_iq1s_grid[ix[1]], (int64_t)gguflm_iq1s_grid[ix[0]]);
        *mag = _mm256_abs_epi8(v);
        *neg = v;
        *sc = GGUFLM_SIMD(iq_group_scales)(p, g);
        *dneg = _mm256_set1_epi8(h & 0x8000 ? -1 : 0);
        break;
    }
    default: { /* IQ1_M: entry j's delta sign is bit 3 + 4j of its two qh bytes, widened to its 8
                * elements by comparing the broadcast bits (no shuffles) */
        const uint16_t *ix = p->ix + 4 * g;
        const __m256i v = GGUFLM_SIMD(iq_qwords4)(gguflm_iq1s_grid, ix[0], ix[1], ix[2], ix[3]);
        const __m256i bit = _mm256_setr_epi64x(0x08, 0x80, 0x800, 0x8000);
        *mag = _mm256_abs_epi8(v);
        *neg = v;
        *sc = GGUFLM_SIMD(iq_group_scales)(p, g);
        /* (the dword at qh byte 2g: 4 bytes, inside the 56-byte block for g = 7 too) */
        *dneg = _mm256_cmpeq_epi64(_mm256_and_si256(_mm256_set1_epi32((int)gguflm_u32_at(xb + 32 + 2 * g)), bit), bit);
        break;
    }
    }
}

/* group g's signed values (IQ1: 8 * grid + delta, grid -1, 0 or 1 and delta -1 where dneg, else 1)
 * and the int16 scale of each element pair; p: the super-block's iq_prepare (gguflm_iq_prepared), else NULL */
static inline __attribute__((always_inline)) __m256i GGUFLM_SIMD(iq_group_values)(int type, const uint8_t *xb, int g,
                                                                                 const GGUFLM_SIMD(iq_prep) *p, __m256i *sc) {
    __m256i mag, neg, dneg = _mm256_setzero_si256();
    GGUFLM_SIMD(iq_group)(type, 0, xb, g, p, &mag, &neg, sc, &dneg);
    if (!gguflm_iq_is_1bit(type)) return _mm256_sub_epi8(_mm256_xor_si256(mag, neg), neg);
    return _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), neg), _mm256_or_si256(dneg, _mm256_set1_epi8(1)));
}

#if GGUFLM_SIMD_512
#include "quants_iq_simd512.h"
#endif

/* the super-block scale as a float */
static inline __attribute__((always_inline)) float GGUFLM_SIMD(iq_d)(int type, const uint8_t *xb) {
    if (type == GGUFLM_IQ1_M) return GGUFLM_FP16_TO_FP32_SIMD(gguflm_iq1m_scale((const block_iq1_m *)xb));
#if GGUFLM_SIMD_512 && !defined(GGUFLM_SIMDE)
    /* vcvtph2ps reading the block's first 8 bytes itself: GCC inserts the half into a register
     * (vpinsrw), a shuffle-port uop the AVX-512 decoding waits on (IQ3_S: ~1.5 cycles a super-block) */
    __m128 f;
    __asm__("vcvtph2ps %[h], %[f]" : [f] "=v"(f) : [h] "m"(*(const struct { uint8_t b[8]; } *)xb));
    return _mm_cvtss_f32(f);
#else
    return GGUFLM_FP16_TO_FP32_SIMD(gguflm_u16_at(xb));
#endif
}

/* DOT of one weight row with T <= 4 activation rows, the weights decoded once per group for all */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(iq_dot_tile)(int type, int gather, size_t bx, int64_t n,
                                                                          const uint8_t *w, const uint8_t *y,
                                                                          int64_t ys, int T, float *o, int64_t os) {
    __m256 acc[4], acc2[4];
    float acc1[4];
    for (int k = 0; k < 4; ++k) {
        acc[k] = acc2[k] = _mm256_setzero_ps();
        acc1[k] = 0.0f;
    }
#if GGUFLM_SIMD_512   /* the next super-block's grid lookups made one step ahead: shorter chains */
    GGUFLM_SIMD(iq512_ahead) ahead = GGUFLM_SIMD(iq512_look_ahead)(type, n >= QK_K ? w : NULL);
#endif
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const uint8_t *xb = w + i * bx;
        __m256i lanes[4], delta[4];
        int32_t sumi1[4] = {0, 0, 0, 0};
        for (int k = 0; k < 4; ++k) lanes[k] = delta[k] = _mm256_setzero_si256();
#if GGUFLM_SIMD_512   /* every grid type: quants_iq_simd512.h */
        {
            GGUFLM_SIMD(iq512_sb) b;
            const GGUFLM_SIMD(iq512_ahead) now = ahead;
            /* (the last super-block looks itself up again: no branch, no read past the row) */
            ahead = GGUFLM_SIMD(iq512_look_ahead)(type, i + 1 < n / QK_K ? xb + bx : xb);
            GGUFLM_SIMD(iq512_decode)(type, xb, now, &b);
            for (int k = 0; k < T; ++k) {
                __m512i dl = _mm512_setzero_si512();
                const __m512i l = GGUFLM_SIMD(iq512_lanes)(type, &b, (const block_q8_K *)(y + k * ys) + i, &dl);
                lanes[k] = _mm256_add_epi32(_mm512_castsi512_si256(l), _mm512_extracti64x4_epi64(l, 1));
                delta[k] = _mm256_add_epi32(_mm512_castsi512_si256(dl), _mm512_extracti64x4_epi64(dl, 1));
                if (type == GGUFLM_IQ1_S) sumi1[k] = GGUFLM_SIMD(hsum_i32)(delta[k]);
            }
        }
#else
        GGUFLM_SIMD(iq_prep) prep;
        if (gguflm_iq_prepared(type)) GGUFLM_SIMD(iq_prepare)(type, xb, &prep);
        for (int g = 0; g < QK_K / 32; ++g) {
            __m256i mag, neg, sc, dneg = _mm256_setzero_si256();
            GGUFLM_SIMD(iq_group)(type, gather, xb, g, gguflm_iq_prepared(type) ? &prep : NULL, &mag, &neg, &sc, &dneg);
            for (int k = 0; k < T; ++k) {
                const block_q8_K *yb = (const block_q8_K *)(y + k * ys) + i;
                const __m256i q8 = _mm256_loadu_si256((const __m256i *)(yb->qs + 32 * g));
                const __m256i q8s = gguflm_iq_is_1bit(type) ? _mm256_sign_epi8(q8, neg)
                                                            : _mm256_sub_epi8(_mm256_xor_si256(q8, neg), neg);
                lanes[k] = _mm256_add_epi32(lanes[k], _mm256_madd_epi16(_mm256_maddubs_epi16(mag, q8s), sc));
                if (type == GGUFLM_IQ1_M) {
                    const __m256i q8d = _mm256_sub_epi8(_mm256_xor_si256(q8, dneg), dneg);
                    delta[k] = _mm256_add_epi32(delta[k], _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q8d), sc));
                }
                if (type == GGUFLM_IQ1_S) {   /* the scale and delta sign from qh itself, not the vectors */
                    const unsigned h = gguflm_u16_at(xb + 34 + 2 * g), ls = 2 * ((h >> 12) & 7) + 1;
                    sumi1[k] += (yb->bsums[2 * g] + yb->bsums[2 * g + 1]) * (h & 0x8000 ? -(int)ls : (int)ls);
                }
            }
        }
#endif
        const float dx = GGUFLM_SIMD(iq_d)(type, xb);
        for (int k = 0; k < T; ++k) {
            const block_q8_K *yb = (const block_q8_K *)(y + k * ys) + i;
            const float d = dx * yb->d;
            const __m256 dv = _mm256_set1_ps(d);
#if GGUFLM_SIMD_512 && !defined(GGUFLM_SIMDE)
            /* d broadcast by the fma's memory operand: no vbroadcastss on the shuffle port, which the
             * AVX-512 decoding waits on (GCC broadcasts from a register; ~1 cycle a super-block) */
            __asm__("vfmadd231ps %[d]%{1to8%}, %[x], %[acc]" : [acc] "+v"(acc[k]) : [x] "v"(_mm256_cvtepi32_ps(lanes[k])), [d] "m"(d));
#else
            acc[k] = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(lanes[k]), acc[k]);
#endif
            if (type == GGUFLM_IQ1_M) acc2[k] = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(delta[k]), acc2[k]);
            if (type == GGUFLM_IQ1_S) acc1[k] = fmaf(d, (float)sumi1[k], acc1[k]);
        }
    }
    for (int k = 0; k < T; ++k) {
        float a[8], a2[8];
        _mm256_storeu_ps(a, acc[k]);
        _mm256_storeu_ps(a2, acc2[k]);
        o[k * os] = gguflm_iq_dot_result(type, a, a2, acc1[k]);
    }
}

/* TILED of one weight row with T <= GGUFLM_IQ_TILED_TOKENS activation rows (each weight group decoded
 * once for all of them): per super-block the exact integer of scale
 * * signed value (IQ1: 8 * grid + delta) * activation, from the same register decoding as DOT
 * (values fit a byte), products in int16 pairs */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(iq_tiled_tile)(int type, size_t bx, int64_t n,
                                                                            const uint8_t *w, const uint8_t *y,
                                                                            int64_t ys, int T, float *o, int64_t os) {
    float out[GGUFLM_IQ_TILED_TOKENS] = {0.0f};
    const float factor = gguflm_iq_factor(type);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const uint8_t *xb = w + i * bx;
#if GGUFLM_SIMD_512
        {  /* the signs on the activations as DOT does: no offset */
            GGUFLM_SIMD(iq512_sb) b;
            GGUFLM_SIMD(iq512_decode)(type, xb, GGUFLM_SIMD(iq512_look_ahead)(type, xb), &b);
            const float dx = GGUFLM_SIMD(iq_d)(type, xb) * factor;
            for (int k0 = 0; k0 < T; k0 += 8) {   /* 8 tokens' integers reduced together */
                __m512i v[8];
                float res[8];
                for (int j = 0; j < 8; ++j) {
                    __m512i dl = _mm512_setzero_si512();
                    v[j] = k0 + j < T ? GGUFLM_SIMD(iq512_lanes)(type, &b, (const block_q8_K *)(y + (k0 + j) * ys) + i, &dl)
                                      : _mm512_setzero_si512();
                    if (gguflm_iq_is_1bit(type))  /* 8 * grid + delta */
                        v[j] = _mm512_add_epi32(_mm512_slli_epi32(v[j], 3), dl);
                }
                const __m256i s8 = GGUFLM_SIMD(reduce8_512)(v);
                _mm256_storeu_ps(res, _mm256_mul_ps(_mm256_set1_ps(dx), _mm256_cvtepi32_ps(s8)));  /* dx * (float)s */
                for (int j = 0; j < 8 && k0 + j < T; ++j)
                    out[k0 + j] = fmaf(res[j], ((const block_q8_K *)(y + (k0 + j) * ys) + i)->d, out[k0 + j]);
            }
            continue;
        }
#endif
        __m256i acc[GGUFLM_IQ_TILED_TOKENS], bias = _mm256_setzero_si256();
        for (int k = 0; k < T; ++k) acc[k] = _mm256_setzero_si256();
        GGUFLM_SIMD(iq_prep) prep;
        if (gguflm_iq_prepared(type)) GGUFLM_SIMD(iq_prepare)(type, xb, &prep);
        for (int g = 0; g < QK_K / 32; ++g) {
            __m256i sc;
            const __m256i v = GGUFLM_SIMD(iq_group_values)(type, xb, g, gguflm_iq_prepared(type) ? &prep : NULL, &sc);
            /* exact products through vpmaddubsw with the activations made unsigned (q + 128: pairs
             * of at most 255 * 62 stay in int16), the 128 * scale * value taken off once per block */
            bias = _mm256_add_epi32(bias, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), sc));
            for (int k = 0; k < T; ++k) {
                const __m256i q8 = _mm256_loadu_si256((const __m256i *)(((const block_q8_K *)(y + k * ys) + i)->qs + 32 * g));
                const __m256i qu = _mm256_xor_si256(q8, _mm256_set1_epi8((char)0x80));
                acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(_mm256_maddubs_epi16(qu, v), sc));
            }
        }
        const int32_t corr = 128 * GGUFLM_SIMD(hsum_i32)(bias);
        const float dx = GGUFLM_SIMD(iq_d)(type, xb) * factor;
        for (int k = 0; k < T; ++k) {
            const block_q8_K *yb = (const block_q8_K *)(y + k * ys) + i;
            out[k] = fmaf(dx * (float)(GGUFLM_SIMD(hsum_i32)(acc[k]) - corr), yb->d, out[k]);
        }
    }
    for (int k = 0; k < T; ++k) o[k * os] = out[k];
}

/* ---- batches through the K GEMM (quants_simd_ktile.h): 16 rows (AVX2: 8) decoded once per pass ---- */
#define GGUFLM_IQ_GEMM_MIN_TOKENS 16  /* fewer tokens: iq_tiled_tile (decoding the rows would not pay) */

#if GGUFLM_SIMD_512 && !GGUFLM_SIMD_VBMI  /* the VBMI copy calls the AVX-512 copy's GEMM and with it this decoding */
/* the 64 elements 64p .. 64p+63 of a decoded super-block as off + signed value (IQ1: 8 * grid + delta) */
static inline __attribute__((always_inline)) __m512i GGUFLM_SIMD(iq_kt_values)(int type, const uint8_t *xb,
                                                                              const GGUFLM_SIMD(iq512_sb) *b, int p,
                                                                              __m512i off) {
    if (!gguflm_iq_is_1bit(type))
        return _mm512_mask_sub_epi8(_mm512_add_epi8(off, b->mag[p]), b->neg[p], off, b->mag[p]);
    __mmask64 dneg = b->dneg[p];
    if (type == GGUFLM_IQ1_S)  /* bit 15 of the qh words of groups 2p, 2p + 1 */
        dneg = (gguflm_u16_at(xb + 34 + 4 * p) & 0x8000 ? 0xFFFFFFFFull : 0) |
               (gguflm_u16_at(xb + 36 + 4 * p) & 0x8000 ? 0xFFFFFFFF00000000ull : 0);
    const __m512i one = _mm512_set1_epi8(1);
    const __m512i base = _mm512_mask_blend_epi8(dneg, _mm512_add_epi8(off, one), _mm512_sub_epi8(off, one));
    const __m512i g8 = _mm512_slli_epi16(b->mag[p], 3);   /* |grid| is 0 or 1: nothing crosses a byte */
    return _mm512_mask_sub_epi8(_mm512_add_epi8(base, g8), b->neg[p], base, g8);
}

/* super-blocks i0 .. i0+nsb-1 of R <= 16 rows (the missing ones zero) into the K GEMM's layout:
 * the unsigned values of gguflm_kt_offset, the odd scale of each 16 elements, d = fp16 d * factor
 * (the TILED recipe's float), no mins */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(iq_ktile_decode)(int type, size_t bx, const uint8_t *w,
                                                                              int64_t ws, int R, int64_t i0, int nsb,
                                                                              GGUFLM_SIMD(ktile_sb) *dec) {
    const __m512i off = _mm512_set1_epi8((char)gguflm_kt_offset(type));
    const float factor = gguflm_iq_factor(type), no_min[16] = {0};
    for (int s = 0; s < nsb; ++s) {
        GGUFLM_SIMD(ktile_sb) *o = &dec[s];
        __m512i v[QK_K / 64][16], sc[16];
        float d[16] = {0};
        for (int r = 0; r < 16; ++r) {
            sc[r] = _mm512_setzero_si512();
            for (int p = 0; p < QK_K / 64; ++p) v[p][r] = _mm512_setzero_si512();
        }
        for (int r = 0; r < R; ++r) {
            const uint8_t *xb = w + r * ws + (i0 + s) * bx;
            GGUFLM_SIMD(prefetch)(xb + nsb * bx, bx);   /* the row's super-block of the next pass */
            GGUFLM_SIMD(iq512_sb) b;
            GGUFLM_SIMD(iq512_decode)(type, xb, GGUFLM_SIMD(iq512_look_ahead)(type, xb), &b);
            sc[r] = _mm512_cvtepi16_epi32(b.scales);
            d[r] = GGUFLM_SIMD(iq_d)(type, xb) * factor;
            for (int p = 0; p < QK_K / 64; ++p) v[p][r] = GGUFLM_SIMD(iq_kt_values)(type, xb, &b, p, off);
        }
        GGUFLM_SIMD(kt_store_lanes)(sc, o->sc);
        for (int k = 0; k < 8; ++k) o->mn[k] = _mm512_setzero_si512();
        GGUFLM_SIMD(kt_set_d)(o, d, no_min);
        for (int p = 0; p < QK_K / 64; ++p) GGUFLM_SIMD(kt_store_lanes)(v[p], &o->q[16 * p]);
    }
}
#elif !GGUFLM_SIMD_512
/* AVX2: 8 rows, each 32-element group decoded in registers as DOT does (iq_group_values), offset
 * to unsigned, the 8 rows' groups transposed to lanes; the same layout and floats as above */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(iq_ktile_decode)(int type, size_t bx, const uint8_t *w,
                                                                              int64_t ws, int R, int64_t i0, int nsb,
                                                                              GGUFLM_SIMD(ktile_sb) *dec) {
    const __m256i off = _mm256_set1_epi8((char)gguflm_kt_offset(type));
    const float factor = gguflm_iq_factor(type), no_min[8] = {0};
    for (int s = 0; s < nsb; ++s) {
        GGUFLM_SIMD(ktile_sb) *o = &dec[s];
        int32_t scales[QK_K / 16][8] = {{0}};   /* [16-element sub-block][row] */
        float d[8] = {0};
        GGUFLM_SIMD(iq_prep) prep[8];   /* each row's, made once for its 8 groups */
        for (int r = 0; r < R; ++r) {
            const uint8_t *xb = w + r * ws + (i0 + s) * bx;
            GGUFLM_SIMD(prefetch)(xb + nsb * bx, bx);   /* the row's super-block of the next pass */
            d[r] = GGUFLM_SIMD(iq_d)(type, xb) * factor;
            if (gguflm_iq_prepared(type)) GGUFLM_SIMD(iq_prepare)(type, xb, &prep[r]);
        }
        for (int g = 0; g < QK_K / 32; ++g) {
            __m256i v[8];
            for (int r = 0; r < 8; ++r) {
                if (r >= R) {
                    v[r] = _mm256_setzero_si256();
                    continue;
                }
                __m256i sc;
                v[r] = _mm256_add_epi8(off, GGUFLM_SIMD(iq_group_values)(type, w + r * ws + (i0 + s) * bx, g,
                                                                          gguflm_iq_prepared(type) ? &prep[r] : NULL, &sc));
                scales[2 * g][r] = _mm256_extract_epi16(sc, 0);       /* elements 0-15 of the group */
                scales[2 * g + 1][r] = _mm256_extract_epi16(sc, 8);   /* 16-31 */
            }
            GGUFLM_SIMD(kt_store_lanes)(v, &o->q[8 * g]);
        }
        for (int j = 0; j < QK_K / 16; ++j) o->sc[j] = _mm256_loadu_si256((const __m256i *)scales[j]);
        for (int k = 0; k < 8; ++k) o->mn[k] = _mm256_setzero_si256();
        GGUFLM_SIMD(kt_set_d)(o, d, no_min);
    }
}
#endif

/* TILED of any number of rows and tokens (the matmul hands the whole batch over): the K GEMM for
 * batches, else iq_tiled_tile over blocks of its tokens, the rows of a block staying in
 * L1 while they meet its tokens */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(iq_tiled)(int type, size_t bx, int64_t n,
                                                                       const uint8_t *w, int64_t ws, int64_t nr,
                                                                       const uint8_t *y, int64_t ys, int64_t nt,
                                                                       float *o, int64_t os) {
    if (nt >= GGUFLM_IQ_GEMM_MIN_TOKENS) {
        GGUFLM_SIMD(ktile_gemm)(type, 0, bx, n, w, ws, nr, y, ys, nt, o, os);
        return;
    }
    for (int64_t t = 0; t < nt; t += GGUFLM_IQ_TILED_TOKENS)
        for (int64_t r = 0; r < nr; ++r)
            GGUFLM_SIMD(iq_tiled_tile)(type, bx, n, w + r * ws, y + t * ys, ys,
                                       (int)(nt - t < GGUFLM_IQ_TILED_TOKENS ? nt - t : GGUFLM_IQ_TILED_TOKENS),
                                       o + t * os + r, os);
}

/* DOT: a single token gets the tile compiled for T = 1 (decode streams the weights: no per-token
 * arrays there) */
#define GGUFLM_IQ_DOT_KERNEL(name, tag, TYPE, gather)                                                            \
    static void GGUFLM_SIMD(name)(int64_t n, const uint8_t *w, int64_t ws, int64_t nr, const uint8_t *y,         \
                                  int64_t ys, int64_t nt, float *o, int64_t os, int arith) {                     \
        (void)arith;                                                                                             \
        if (nt == 1) {                                                                                           \
            for (int64_t r = 0; r < nr; ++r)                                                                     \
                GGUFLM_SIMD(iq_dot_tile)(TYPE, gather, sizeof(block_##tag), n, w + r * ws, y, ys, 1, o + r, os); \
            return;                                                                                              \
        }                                                                                                        \
        for (int64_t r = 0; r < nr; ++r)                                                                         \
            for (int64_t t = 0; t < nt; t += 4)                                                                  \
                GGUFLM_SIMD(iq_dot_tile)(TYPE, gather, sizeof(block_##tag), n, w + r * ws, y + t * ys, ys,       \
                                         (int)(nt - t < 4 ? nt - t : 4), o + t * os + r, os);                   \
    }
#define GGUFLM_IQ_SIMD_KERNELS(tag, TYPE)                                                                        \
    GGUFLM_IQ_DOT_KERNEL(DOT_##tag, tag, TYPE, 0)                                                                \
    static void GGUFLM_SIMD(TILED_##tag)(int64_t n, const uint8_t *w, int64_t ws, int64_t nr, const uint8_t *y,  \
                                         int64_t ys, int64_t nt, float *o, int64_t os, int arith) {              \
        (void)arith;                                                                                             \
        GGUFLM_SIMD(iq_tiled)(TYPE, sizeof(block_##tag), n, w, ws, nr, y, ys, nt, o, os);                        \
    }
GGUFLM_IQ_TYPES(GGUFLM_IQ_SIMD_KERNELS)
#if !GGUFLM_SIMD_512   /* AVX2: the 3-bit grids' DOT kernels that gather their entries, for Intel's
                        * cores (quants_kernels.h: gguflm_avx2_gathers_pay) */
GGUFLM_IQ_DOT_KERNEL(DOT_GATHER_iq3_xxs, iq3_xxs, GGUFLM_IQ3_XXS, 1)
GGUFLM_IQ_DOT_KERNEL(DOT_GATHER_iq3_s, iq3_s, GGUFLM_IQ3_S, 1)
#endif
#undef GGUFLM_IQ_DOT_KERNEL
#undef GGUFLM_IQ_SIMD_KERNELS
#undef GGUFLM_IQ_GEMM_MIN_TOKENS
