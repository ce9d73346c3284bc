/* The grid magnitudes of a whole super-block through AVX-512 VBMI, for the VBMI copy of
 * quants_iq_simd512.h (GGUFLM_SIMD_VBMI): no per-entry scalar loads.
 * The grids are stored as codes (quants_iq_codes.h: each element's value number, 2 bits in the
 * 8-element IQ2 entries, 3 bits in the 4-element IQ3 ones) in two byte planes. Per super-block
 * the entry indices sit in one vector (32 entries of the 2-bit grids, 64 of the 3-bit ones), and
 * each plane is looked up for all of them at once: vpermi2b reads a 128-entry piece with the 7
 * low index bits, and the pieces of larger grids are blended on the higher bits (masks). Per 64
 * weights then: vpermi2b spreads each entry's two code bytes over its qword (dword), vpmultishiftqb
 * moves element j's field to the low bits of byte j, and vpermb maps the fields to grid values
 * (64-byte value tables, the bits above the field ignored). The magnitudes are the same bytes as
 * the lookups of quants_iq_simd512.h; signs, scales and the dot itself do not change.
 * Ops per super-block (2 planes: pieces + blends each; 4 x the 3 per-64 ops; index vector):
 *   IQ2_XXS 2 x 3 + 12 + 3   IQ2_XS 2 x 7 + 12 + 4   IQ2_S 2 x 15 + 12 + 4
 *   IQ3_XXS 2 x 3 + 12 + 2   IQ3_S  2 x 7 + 12 + 2
 * against the scalar-load path's 32 loads + 32 inserts (2-bit grids) or 64 + 64 (3-bit), plus
 * their index arithmetic. IQ1_S/IQ1_M keep that path: their 2048 entries take 16 pieces a plane
 * (62 lookup ops a super-block); written so, the decoding ran at 0.88x (IQ1_S) and 0.79x (IQ1_M)
 * of the scalar-load path's speed (1 thread, weights in L2, AMD EPYC).
 * Measured (1 thread, a 16384x8192 matrix streamed, best of 8, AMD EPYC Zen 4), GB/s of weights
 * without -> with VBMI: IQ2_XXS 8.1 -> 8.4, IQ2_XS 9.2 -> 9.4, IQ2_S 7.5 -> 10.5, IQ3_XXS 6.8 ->
 * 13.9, IQ3_S 5.1 -> 16.5. The 2-bit grids gain little: their single-token loop went from 151
 * (IQ2_XXS) and 174 (IQ2_XS) instructions a super-block to 95 and 107, but it waits on its ~30
 * shuffle-class instructions (sign masks, scales, the dot's), not on the lookups.
 * No include guard: included once, inside the VBMI region (GGUFLM_SIMD_VBMI).
 */

#include "quants_iq_codes.h"

static inline int gguflm_iq_vbmi_type(int type) { return !gguflm_iq_is_1bit(type); }

static inline uint64_t gguflm_iqv_u64_at(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* one code plane (pieces of 128 bytes) at the 7 low bits of idx; bit[l]: the index bit 7 + l */
static inline __attribute__((always_inline)) __m512i GGUFLM_SIMD(iqv_plane)(const uint8_t *t, int pieces, __m512i idx,
                                                                           const __mmask64 *bit) {
    __m512i r[8];
    for (int j = 0; j < pieces; ++j)
        r[j] = _mm512_permutex2var_epi8(_mm512_load_si512((const void *)(t + 128 * j)), idx,
                                        _mm512_load_si512((const void *)(t + 128 * j + 64)));
    for (int level = 0, n = pieces; n > 1; ++level, n /= 2)
        for (int j = 0; j < n / 2; ++j) r[j] = _mm512_mask_blend_epi8(bit[level], r[2 * j], r[2 * j + 1]);
    return r[0];
}

/* the 64 bytes after an IQ2_XXS or IQ2_XS block's scale (v) sorted by one vpermb: the 32 index
 * bytes (IQ2_XS: the low bytes of its 9-bit indices) first, then IQ2_XXS's 8 words of sign fields
 * and scale, IQ2_XS's high bytes (bit 0: index bit 8, bits 1-7: the sign field); iq512_block
 * reads the upper half, iqv_mags the lower one (the same vpermb, computed once) */
static inline __m512i GGUFLM_SIMD(iqv_split)(int type, __m512i v) {
    static const int8_t xxs[64] __attribute__((aligned(64))) = {
        0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27, 32, 33, 34, 35, 40, 41, 42, 43,
        48, 49, 50, 51, 56, 57, 58, 59, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31,
        36, 37, 38, 39, 44, 45, 46, 47, 52, 53, 54, 55, 60, 61, 62, 63};
    static const int8_t xs[64] __attribute__((aligned(64))) = {
        0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42, 44, 46,
        48, 50, 52, 54, 56, 58, 60, 62, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
        33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
    return _mm512_permutexvar_epi8(_mm512_load_si512((const void *)(type == GGUFLM_IQ2_XXS ? xxs : xs)), v);
}

/* IQ2_XXS's and IQ3_XXS's pair scales of groups 2p, 2p + 1 from their words' top 4 bits, one
 * vpermd each (the words made 2 s + 1 in both halves first): 5 shuffles fewer a super-block than
 * iq512_group_scales + pair_scales512, shuffles being what the decoding waits on here */
static inline __attribute__((always_inline)) __m512i GGUFLM_SIMD(iqv_xxs_pair_scales)(int type, const uint8_t *xb, int p) {
    const __m256i a = type == GGUFLM_IQ2_XXS
                          ? _mm512_extracti64x4_epi64(GGUFLM_SIMD(iqv_split)(type, _mm512_loadu_si512((const void *)(xb + 2))), 1)
                          : _mm256_loadu_si256((const __m256i *)(xb + 66));
    const __m256i s = _mm256_or_si256(_mm256_srli_epi32(a, 28 - 1), _mm256_set1_epi32(1));  /* 2 s + 1 */
    const __m256i w = _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
    const __m512i at = _mm512_set_epi32(2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1,
                                        2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p);
    return _mm512_permutexvar_epi32(at, _mm512_castsi256_si512(w));
}

/* the four 64-byte magnitude vectors of a super-block (iq512_mag's p = 0..3) */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(iqv_mags)(int type, const uint8_t *xb, __m512i mag[4]) {
    const __m512i v = _mm512_loadu_si512((const void *)(xb + 2));
    __m512i idx;
    __mmask64 bit[3] = {0, 0, 0};
    const uint8_t *codes;
    int pieces, entries = 32;
    switch (type) {
    case GGUFLM_IQ2_XXS:
        idx = GGUFLM_SIMD(iqv_split)(type, v);
        codes = gguflm_iq2xxs_codes, pieces = 2;
        break;
    case GGUFLM_IQ2_XS:
        idx = GGUFLM_SIMD(iqv_split)(type, v);
        bit[1] = _mm512_test_epi8_mask(idx, _mm512_set1_epi8(1)) >> 32;
        codes = gguflm_iq2xs_codes, pieces = 4;
        break;
    case GGUFLM_IQ2_S: {    /* bits 8, 9 of entry e: bits 2e, 2e + 1 of the 8 qh bytes */
        const __m512i h = _mm512_multishift_epi64_epi8(
            _mm512_set_epi64(0x3e3c3a3836343230LL, 0x2e2c2a2826242220LL, 0x1e1c1a1816141210LL, 0x0e0c0a0806040200LL,
                             0x3e3c3a3836343230LL, 0x2e2c2a2826242220LL, 0x1e1c1a1816141210LL, 0x0e0c0a0806040200LL),
            _mm512_set1_epi64((long long)gguflm_iqv_u64_at(xb + 66)));
        idx = v;
        bit[1] = _mm512_test_epi8_mask(h, _mm512_set1_epi8(1));
        bit[2] = _mm512_test_epi8_mask(h, _mm512_set1_epi8(2));
        codes = gguflm_iq2s_codes, pieces = 8;
        break;
    }
    case GGUFLM_IQ3_XXS:
        idx = v, entries = 64;
        codes = gguflm_iq3xxs_codes, pieces = 2;
        break;
    default:                /* IQ3_S: bit 8 of entry e is bit e of the 8 qh bytes */
        idx = v, entries = 64;
        bit[1] = (__mmask64)gguflm_iqv_u64_at(xb + 66);
        codes = gguflm_iq3s_codes, pieces = 4;
        break;
    }
    bit[0] = _mm512_movepi8_mask(idx);
    const __m512i lo = GGUFLM_SIMD(iqv_plane)(codes, pieces, idx, bit);
    const __m512i hi = GGUFLM_SIMD(iqv_plane)(codes + 128 * pieces, pieces, idx, bit);
    if (entries == 32) {  /* qword k of vector p: entry 8p + k's code bytes, low and high alternating */
        const __m512i shift = _mm512_set1_epi64(0x0e0c0a0806040200LL);
        const __m512i values = _mm512_load_si512((const void *)gguflm_iq2_values);
        const __m512i spread = _mm512_set_epi64(0x4707470747074707LL, 0x4606460646064606LL, 0x4505450545054505LL,
                                                0x4404440444044404LL, 0x4303430343034303LL, 0x4202420242024202LL,
                                                0x4101410141014101LL, 0x4000400040004000LL);
#pragma GCC unroll 4
        for (int p = 0; p < 4; ++p) {
            const __m512i c = _mm512_permutex2var_epi8(lo, _mm512_add_epi8(spread, _mm512_set1_epi8((char)(8 * p))), hi);
            mag[p] = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(shift, c), values);
        }
    } else {              /* dword k of vector p: entry 16p + k's code bytes */
        const __m512i shift = _mm512_set1_epi64(0x2926232009060300LL);
        const __m512i values = _mm512_load_si512((const void *)(type == GGUFLM_IQ3_XXS ? gguflm_iq3xxs_values : gguflm_iq3s_values));
        const __m512i spread = _mm512_set_epi32(0x4f0f4f0f, 0x4e0e4e0e, 0x4d0d4d0d, 0x4c0c4c0c, 0x4b0b4b0b, 0x4a0a4a0a,
                                                0x49094909, 0x48084808, 0x47074707, 0x46064606, 0x45054505, 0x44044404,
                                                0x43034303, 0x42024202, 0x41014101, 0x40004000);
#pragma GCC unroll 4
        for (int p = 0; p < 4; ++p) {
            const __m512i c = _mm512_permutex2var_epi8(lo, _mm512_add_epi8(spread, _mm512_set1_epi8((char)(16 * p))), hi);
            mag[p] = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(shift, c), values);
        }
    }
}
