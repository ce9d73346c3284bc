/* 512-bit decoding of the grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M)
 * for the AVX-512 copy of quants_iq_simd.h (AVX-512 F/BW/VL/DQ and VNNI only). Two 32-element
 * groups share a vector: the grid entries (8 qwords, or 16 dwords for the 3-bit grids) are
 * gathered (iq512_mag; IQ1: magnitude and sign taken from the signed grid), the signs a 64-bit
 * mask applied to the activations by one masked subtract, and the int16 pair products times the
 * scales summed into int32 lanes by vpdpwssd.
 * Lane l of the low half takes elements 4l..4l+3 of the even group, lane l of the high half those
 * of the odd group, so low + high are ggml's 8 AVX2 lanes exactly (integers, no rounding).
 * The sign bits of the 7-bit sign fields' types (ksigns_iq2xs: bit 7 is the parity of the other
 * seven) and the 16 scales of a super-block are unpacked once per super-block, 32 bytes at a time.
 * The VBMI copy (GGUFLM_SIMD_VBMI, quants_iq_vbmi.h) looks the magnitudes of the grids other
 * than IQ1's and IQ2_XS's up with byte permutes (and loads those two's entries one by one), and
 * decodes the 7-bit sign fields without the 32-byte parity arithmetic below; everything else here
 * is shared.
 * No include guard: included once in each AVX-512 region (GGUFLM_SIMD_512).
 */
#if GGUFLM_SIMD_VBMI
#include "quants_iq_vbmi.h"
#endif

/* 32 bytes of 7-bit sign fields -> ksigns_iq2xs of each (bit 7 = parity of bits 0-6) */
static inline __m256i GGUFLM_SIMD(iq512_ksigns)(__m256i x) {
    x = _mm256_and_si256(x, _mm256_set1_epi8(0x7f));
    __m256i p = _mm256_xor_si256(x, _mm256_and_si256(_mm256_srli_epi16(x, 4), _mm256_set1_epi8(0x0f)));
    p = _mm256_xor_si256(p, _mm256_srli_epi16(p, 2));
    p = _mm256_xor_si256(p, _mm256_srli_epi16(p, 1));  /* bit 0 of each byte: the parity */
    return _mm256_or_si256(x, _mm256_and_si256(_mm256_slli_epi16(p, 7), _mm256_set1_epi8((char)0x80)));
}

/* the four 7-bit fields of each of 8 dwords (their bits 0-27) as 32 bytes, in element order */
static inline __m256i GGUFLM_SIMD(iq512_fields)(__m256i a) {
    const __m256i f0 = _mm256_and_si256(a, _mm256_set1_epi32(0x7f));
    const __m256i f1 = _mm256_and_si256(_mm256_slli_epi32(a, 1), _mm256_set1_epi32(0x7f00));
    const __m256i f2 = _mm256_and_si256(_mm256_slli_epi32(a, 2), _mm256_set1_epi32(0x7f0000));
    const __m256i f3 = _mm256_and_si256(_mm256_slli_epi32(a, 3), _mm256_set1_epi32(0x7f000000));
    return _mm256_or_si256(_mm256_or_si256(f0, f1), _mm256_or_si256(f2, f3));
}

/* 16 nibbles of 8 bytes in order (low nibble first) as 16 odd int16 scales 2 s + 1 */
static inline __m256i GGUFLM_SIMD(iq512_nibble_scales)(__m128i b) {
    const __m128i m = _mm_set1_epi8(0x0f);
    const __m128i n = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    const __m256i s = _mm256_cvtepu8_epi16(n);
    return _mm256_add_epi16(_mm256_add_epi16(s, s), _mm256_set1_epi16(1));
}

/* 8 int16 group scales (2 s + 1 already) -> the 16 int16 scales of the 16-element halves */
static inline __m256i GGUFLM_SIMD(iq512_group_scales16)(__m128i w) {
    return _mm256_set_m128i(_mm_unpackhi_epi16(w, w), _mm_unpacklo_epi16(w, w));
}
static inline __m256i GGUFLM_SIMD(iq512_group_scales)(__m256i s) {
    return GGUFLM_SIMD(iq512_group_scales16)(_mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packs_epi32(s, s), 0x08)));
}

/* One super-block's sign bits (bit e of sign[e / 64] for element e) and its 16 int16 scales */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(iq512_block)(int type, const uint8_t *xb,
                                                                          uint64_t sign[4], __m256i *scales) {
    switch (type) {
    case GGUFLM_IQ2_XXS: {  /* 8 qwords: 4 grid bytes, then the word of 4 sign fields and the scale */
        const __m256i a = _mm512_cvtepi64_epi32(_mm512_srli_epi64(_mm512_loadu_si512((const void *)(xb + 2)), 32));
        _mm256_storeu_si256((__m256i *)sign, GGUFLM_SIMD(iq512_ksigns)(GGUFLM_SIMD(iq512_fields)(a)));
        const __m256i s = _mm256_srli_epi32(a, 28);
        *scales = GGUFLM_SIMD(iq512_group_scales)(_mm256_add_epi32(_mm256_add_epi32(s, s), _mm256_set1_epi32(1)));
        break;
    }
    case GGUFLM_IQ2_XS: {   /* 32 words: 9-bit grid index, 7-bit sign field */
        const __m512i v = _mm512_loadu_si512((const void *)(xb + 2));
        const __m256i f = _mm512_cvtepi16_epi8(_mm512_srli_epi16(v, 9));
        _mm256_storeu_si256((__m256i *)sign, GGUFLM_SIMD(iq512_ksigns)(f));
        *scales = GGUFLM_SIMD(iq512_nibble_scales)(_mm_loadl_epi64((const __m128i *)(xb + 66)));
        break;
    }
    case GGUFLM_IQ2_S:
        memcpy(sign, xb + 34, 32);
        *scales = GGUFLM_SIMD(iq512_nibble_scales)(_mm_loadl_epi64((const __m128i *)(xb + 74)));
        break;
    case GGUFLM_IQ3_XXS: {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(xb + 66));
        _mm256_storeu_si256((__m256i *)sign, GGUFLM_SIMD(iq512_ksigns)(GGUFLM_SIMD(iq512_fields)(a)));
        const __m256i s = _mm256_srli_epi32(a, 28);
        *scales = GGUFLM_SIMD(iq512_group_scales)(_mm256_add_epi32(_mm256_add_epi32(s, s), _mm256_set1_epi32(1)));
        break;
    }
    case GGUFLM_IQ1_S: {    /* scale in bits 12-14 of each group's qh word */
        const __m128i h = _mm_srli_epi16(_mm_loadu_si128((const __m128i *)(xb + 34)), 12);
        const __m128i ls = _mm_and_si128(h, _mm_set1_epi16(7));
        *scales = GGUFLM_SIMD(iq512_group_scales16)(_mm_add_epi16(_mm_add_epi16(ls, ls), _mm_set1_epi16(1)));
        break;
    }
    case GGUFLM_IQ1_M: {    /* scale of 16 elements c: bits 3 (c % 4) .. + 2 of scale word c / 4 */
        static const int8_t word_of[32] = {0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3,
                                           4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7};
        static const int16_t mul[16] = {8192, 1024, 128, 16, 8192, 1024, 128, 16, 8192, 1024, 128, 16, 8192, 1024, 128, 16};
        uint64_t w8;
        memcpy(&w8, xb + 48, 8);
        const __m256i w = _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)w8), _mm256_loadu_si256((const __m256i *)word_of));
        /* (w >> 3 (c % 4)) & 7 as the high bits of w * 2^(13 - 3 (c % 4)) */
        const __m256i ls = _mm256_srli_epi16(_mm256_mullo_epi16(w, _mm256_loadu_si256((const __m256i *)mul)), 13);
        *scales = _mm256_add_epi16(_mm256_add_epi16(ls, ls), _mm256_set1_epi16(1));
        break;
    }
    default: {  /* IQ3_S: one scale per group, nibbles of 4 bytes */
        memcpy(sign, xb + 74, 32);
        const __m256i g = GGUFLM_SIMD(iq512_nibble_scales)(_mm_cvtsi32_si128((int)gguflm_u32_at(xb + 106)));
        *scales = GGUFLM_SIMD(iq512_group_scales)(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(g)));
        break;
    }
    }
}

/* The grid magnitudes of groups 2p and 2p + 1 (64 bytes): 8 qword entries (16 dword ones in the
 * 3-bit grids).
 * - The AVX-512 copy gathers them (vpgatherdq/dd on indices computed in vectors). On Intel's cores
 *   that ran up to 2.5x the speed of loading them one by one and inserting them (single token,
 *   cycles a super-block, loads -> gathers: IQ3_XXS 121 -> 48, IQ3_S 110 -> 50, IQ2_XXS 50 -> 44,
 *   IQ2_XS 46 -> 39, IQ2_S 47 -> 37-46, IQ1_S 56 -> 47, IQ1_M 58 -> 56; Xeon with AMX), the
 *   inserts waiting on the one shuffle port.
 * - The VBMI copy comes here only for IQ2_XS and IQ1 (it looks the other grids up), and runs them
 *   on AMD's cores only (quants_kernels.h: gguflm_vbmi_pays): it loads them, gathers having run 3x
 *   slower than the loads on the AMD EPYC (Zen 4). */
#if GGUFLM_SIMD_VBMI
/* the grid index of entry e of an IQ2_XS, IQ1_S or IQ1_M super-block, read with scalar loads:
 * computed in vectors instead, GCC moves them out with vpextrw, which competes with the inserts for
 * the shuffle unit (measured slower) */
static inline __attribute__((always_inline)) unsigned GGUFLM_SIMD(iq512_ix)(int type, const uint8_t *xb, int e) {
    switch (type) {
    case GGUFLM_IQ2_XS: return gguflm_u16_at(xb + 2 + 2 * e) & 511;
    case GGUFLM_IQ1_S: return xb[2 + e] | ((gguflm_u16_at(xb + 34 + 2 * (e / 4)) >> (3 * (e % 4)) & 7) << 8);
    default: return xb[e] | ((unsigned)(xb[32 + e / 2] >> (4 * (e % 2)) & 7) << 8);  /* IQ1_M */
    }
}

static inline __attribute__((always_inline)) __m512i GGUFLM_SIMD(iq512_mag)(int type, const uint8_t *xb, int p) {
    const uint64_t *grid = type == GGUFLM_IQ2_XS ? gguflm_iq2xs_grid : (const uint64_t *)gguflm_iq1s_grid;
    __m128i v[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
        const int e = 8 * p + 2 * k;
        v[k] = _mm_set_epi64x((long long)grid[GGUFLM_SIMD(iq512_ix)(type, xb, e + 1)], (long long)grid[GGUFLM_SIMD(iq512_ix)(type, xb, e)]);
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(v[1], v[0])), _mm256_set_m128i(v[3], v[2]), 1);
}
#else
/* t[ix[k] | bit k of high << 8] for k < 16: vpgatherdd (SIMDe has neither integer gathers nor
 * vpmovzxbd: scalar loads there) */
static inline __attribute__((always_inline)) __m512i GGUFLM_SIMD(iq512_gather32)(const uint8_t *ix, unsigned high, const uint32_t *t) {
#if defined(GGUFLM_SIMDE)
    uint32_t v[16];
    for (int k = 0; k < 16; ++k) v[k] = t[ix[k] | ((high >> k & 1) << 8)];
    return _mm512_loadu_si512((const void *)v);
#else
    const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)ix));
    return _mm512_i32gather_epi32(_mm512_mask_or_epi32(idx, (__mmask16)high, idx, _mm512_set1_epi32(256)), (const void *)t, 4);
#endif
}
/* t[idx] for 8 dword indices: vpgatherdq */
static inline __attribute__((always_inline)) __m512i GGUFLM_SIMD(iq512_gather64)(__m256i idx, const uint64_t *t) {
#if defined(GGUFLM_SIMDE)
    int32_t i[8];
    uint64_t v[8];
    _mm256_storeu_si256((__m256i *)i, idx);
    for (int k = 0; k < 8; ++k) v[k] = t[i[k]];
    return _mm512_loadu_si512((const void *)v);
#else
    return _mm512_i32gather_epi64(idx, (const void *)t, 8);
#endif
}

static inline __attribute__((always_inline)) __m512i GGUFLM_SIMD(iq512_mag)(int type, const uint8_t *xb, int p) {
    /* entries 16p + k: index byte 2 + 16p + k (IQ3_S: bit 8 from bit k of qh bytes 66 + 2p, 67 + 2p) */
    if (type == GGUFLM_IQ3_XXS) return GGUFLM_SIMD(iq512_gather32)(xb + 2 + 16 * p, 0, gguflm_iq3xxs_grid);
    if (type == GGUFLM_IQ3_S) return GGUFLM_SIMD(iq512_gather32)(xb + 2 + 16 * p, gguflm_u16_at(xb + 66 + 2 * p), gguflm_iq3s_grid);
    /* entries 8p + j: the index bits in the 2 (IQ1_S: 4) bytes of qh of the 8 entries, shifted
     * per j to bits 8 .. (a 3-bit or 2-bit field at bits 3j (IQ1_S, of the two words), 4j (IQ1_M),
     * 2j (IQ2_S)) */
    __m256i idx;
    switch (type) {
    case GGUFLM_IQ2_XXS:    /* index bytes 0-3 of qwords 2p and 2p + 1 after d */
        idx = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(xb + 2 + 16 * p)),
                                                    _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1)));
        break;
    case GGUFLM_IQ2_XS:     /* the low 9 bits of words 8p .. */
        idx = _mm256_and_si256(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(xb + 2 + 16 * p))), _mm256_set1_epi32(511));
        break;
    case GGUFLM_IQ2_S: {
        const __m256i h = _mm256_srlv_epi32(_mm256_set1_epi32((int)gguflm_u16_at(xb + 66 + 2 * p)), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
        idx = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(xb + 2 + 8 * p))),
                              _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(3)), 8));
        break;
    }
    case GGUFLM_IQ1_S: {
        const __m256i h = _mm256_srlv_epi32(_mm256_set1_epi32((int)gguflm_u32_at(xb + 34 + 4 * p)), _mm256_setr_epi32(0, 3, 6, 9, 16, 19, 22, 25));
        idx = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(xb + 2 + 8 * p))),
                              _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(7)), 8));
        break;
    }
    default: {              /* IQ1_M */
        const __m256i h = _mm256_srlv_epi32(_mm256_set1_epi32((int)gguflm_u32_at(xb + 32 + 4 * p)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
        idx = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(xb + 8 * p))),
                              _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(7)), 8));
        break;
    }
    }
    const uint64_t *grid = type == GGUFLM_IQ2_XXS ? gguflm_iq2xxs_grid : type == GGUFLM_IQ2_XS ? gguflm_iq2xs_grid
                         : type == GGUFLM_IQ2_S ? gguflm_iq2s_grid : (const uint64_t *)gguflm_iq1s_grid;
    return GGUFLM_SIMD(iq512_gather64)(idx, grid);
}
#endif

/* One super-block decoded for any number of tokens: per pair of groups the magnitudes, the
 * scales of their pair sums and the sign mask; IQ1_M: the mask of negative deltas, IQ1_S: the
 * signed scale of each 16 for its delta term through the activation's bsums */
typedef struct {
    __m512i mag[4], sc[4];
    __mmask64 neg[4], dneg[4];
    __m256i dsc;
    __m256i scales;  /* the odd scale of each 16 elements (int16), for the K GEMM's decoding */
} GGUFLM_SIMD(iq512_sb);

/* what iq512_decode takes from a lookup made ahead of it (the VBMI copy's grid codes, so that a
 * loop can look the next super-block up while the current one is used; nothing otherwise) */
#if GGUFLM_SIMD_VBMI
typedef GGUFLM_SIMD(iqv_codes) GGUFLM_SIMD(iq512_ahead);
static inline __attribute__((always_inline)) GGUFLM_SIMD(iq512_ahead) GGUFLM_SIMD(iq512_look_ahead)(int type, const uint8_t *xb) {
    if (gguflm_iq_vbmi_type(type) && xb) return GGUFLM_SIMD(iqv_lookup)(type, xb);
    const GGUFLM_SIMD(iq512_ahead) none = {{_mm512_setzero_si512(), _mm512_setzero_si512()}};
    return none;
}
#else
typedef struct {
    char none;
} GGUFLM_SIMD(iq512_ahead);
static inline __attribute__((always_inline)) GGUFLM_SIMD(iq512_ahead) GGUFLM_SIMD(iq512_look_ahead)(int type, const uint8_t *xb) {
    (void)type, (void)xb;
    const GGUFLM_SIMD(iq512_ahead) none = {0};
    return none;
}
#endif

static inline __attribute__((always_inline)) void GGUFLM_SIMD(iq512_decode)(int type, const uint8_t *xb,
                                                                           GGUFLM_SIMD(iq512_ahead) ahead,
                                                                           GGUFLM_SIMD(iq512_sb) *b) {
    uint64_t sign[4];
    __m256i scales;
    GGUFLM_SIMD(iq512_block)(type, xb, sign, &scales);
    b->scales = scales;
#if GGUFLM_SIMD_VBMI
    const int vbmi = gguflm_iq_vbmi_type(type);
    const int vbmi_signs = gguflm_iqv_field_sign_type(type);
    if (vbmi) GGUFLM_SIMD(iqv_mags)(type, ahead, b->mag);
    if (vbmi_signs) GGUFLM_SIMD(iqv_field_signs)(type, xb, b->neg);
#else
    const int vbmi = 0, vbmi_signs = 0;
    (void)ahead;
#endif
#pragma GCC unroll 4  /* constant entry offsets for iq512_ix */
    for (int p = 0; p < 4; ++p) {
        if (!vbmi) b->mag[p] = GGUFLM_SIMD(iq512_mag)(type, xb, p);
#if GGUFLM_SIMD_VBMI
        if (gguflm_iqv_scale_type(type))
            b->sc[p] = GGUFLM_SIMD(iqv_pair_scales)(type, xb, p);
        else
#endif
            b->sc[p] = GGUFLM_SIMD(pair_scales512)(scales, 4 * p);
        if (gguflm_iq_is_1bit(type)) {  /* grid values -1, 0, 1: magnitude and sign from them */
            b->neg[p] = _mm512_movepi8_mask(b->mag[p]);
            b->mag[p] = _mm512_abs_epi8(b->mag[p]);
        } else if (!vbmi_signs) {
            b->neg[p] = (__mmask64)sign[p];
        }
        if (type == GGUFLM_IQ1_M) {  /* delta sign of entry e: bit 3 (even e) or 7 (odd e) of qh[e / 2] */
            const __m512i h = _mm512_shuffle_epi8(_mm512_set1_epi32((int)gguflm_u32_at(xb + 32 + 4 * p)),
                                                  _mm512_set_epi64(0x0303030303030303LL, 0x0303030303030303LL, 0x0202020202020202LL,
                                                                   0x0202020202020202LL, 0x0101010101010101LL, 0x0101010101010101LL, 0, 0));
            const long long lo = 0x0808080808080808LL, hi = (long long)0x8080808080808080ULL;
            b->dneg[p] = _mm512_test_epi8_mask(h, _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo));
        }
    }
    if (type == GGUFLM_IQ1_S) {  /* bit 15 of a group's qh word: its delta is negative */
        const __m128i h = _mm_srai_epi16(_mm_loadu_si128((const __m128i *)(xb + 34)), 15);
        const __m256i hn = GGUFLM_SIMD(iq512_group_scales16)(h);
        b->dsc = _mm256_sub_epi16(_mm256_xor_si256(scales, hn), hn);
    }
}

/* the 16 int32 lanes of one super-block against one activation block: lanes 0-7 and 8-15 added
 * are ggml's 8 lanes; IQ1 *delta: IQ1_M's delta lanes the same way, IQ1_S's delta term as 8 lanes
 * of bsums times signed scales (all of a lane vector added: the integer of the term) */
static inline __attribute__((always_inline)) __m512i GGUFLM_SIMD(iq512_lanes)(int type, const GGUFLM_SIMD(iq512_sb) *b,
                                                                             const block_q8_K *yb, __m512i *delta) {
    __m512i prod[4], dacc = _mm512_setzero_si512();
    for (int p = 0; p < 4; ++p) {
        const __m512i q8 = _mm512_loadu_si512((const void *)(yb->qs + 64 * p));
        const __m512i q8s = _mm512_mask_sub_epi8(q8, b->neg[p], _mm512_setzero_si512(), q8);
        prod[p] = _mm512_maddubs_epi16(b->mag[p], q8s);
        if (type == GGUFLM_IQ1_M) {
            const __m512i q8d = _mm512_mask_sub_epi8(q8, b->dneg[p], _mm512_setzero_si512(), q8);
            dacc = _mm512_dpwssd_epi32(dacc, _mm512_maddubs_epi16(_mm512_set1_epi8(1), q8d), b->sc[p]);
        }
    }
    if (type == GGUFLM_IQ1_S)
        dacc = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)yb->bsums), b->dsc), 0);
    *delta = dacc;
    /* two chains of vpdpwssd (a super-block's latency is what the decoding waits on), each started
     * by a vpmaddwd (no zeroed accumulator to copy) */
    const __m512i acc0 = _mm512_dpwssd_epi32(_mm512_madd_epi16(prod[0], b->sc[0]), prod[2], b->sc[2]);
    const __m512i acc1 = _mm512_dpwssd_epi32(_mm512_madd_epi16(prod[1], b->sc[1]), prod[3], b->sc[3]);
    return _mm512_add_epi32(acc0, acc1);
}
