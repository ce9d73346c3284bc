/* The grid magnitudes and sign masks of a whole super-block through AVX512_VBMI, GFNI and
 * AVX512_BITALG, for the VBMI copy of quants_iq_simd512.h (GGUFLM_SIMD_VBMI): no per-entry scalar
 * loads, no bit arithmetic on the sign fields.
 * The grids are stored as codes (quants_iq_codes.h: each element's value number, 2 bits in the
 * 8-element IQ2 entries, 3 bits in the 4-element IQ3 ones) in two byte planes. Per super-block
 * the entry indices sit in one vector (the 2-bit grids' 32 in both halves, the 3-bit grids' 64),
 * and each plane is looked up for all of them at once: vpermi2b reads a 128-entry piece with the
 * 7 low index bits, and the pieces of larger grids are blended on the higher bits (masks). The
 * 2-bit grids then keep the low plane's lookups in the low half and the high plane's in the high
 * half; per 64 weights one vpermb puts an entry's two code bytes in its qword, vpmultishiftqb moves
 * element j's 2 bits to the bottom of byte j, and vgf2p8affineqb maps them to 8, 25, 43. The
 * 3-bit grids put their low and high code bytes of entries 0-31, then 32-63, in one vector each
 * (vshufi64x2), spread them per 64 weights with a vpermb and map the fields with vpermb (IQ3_XXS)
 * or vgf2p8affineqb (IQ3_S: 2 c + 1). The magnitudes are the same bytes as the
 * lookups of quants_iq_simd512.h; the 7-bit sign fields (IQ2_XXS, IQ2_XS, IQ3_XXS) become masks
 * through iqv_field_signs, the 4-bit scales a vector of dwords through shifts (iqv_pair_scales);
 * the dot itself does not change.
 * IQ1_S/IQ1_M keep the scalar-load path: their 2048 entries take 16 pieces a plane (62 lookup ops
 * a super-block); written so, the decoding ran at 0.88x (IQ1_S) and 0.79x (IQ1_M) of the
 * scalar-load path's speed (1 thread, weights in L2, AMD EPYC).
 * IQ2_XS loads its 512-entry grid's entries too: its lookups took 8 vpermi2b a super-block, and
 * the loads (with these sign masks) ran 5.0 GB/s against 4.5 (1 thread, Intel Xeon; equal on the
 * Zen 4 below).
 * On Intel's cores every byte permute (vpermb, vpmultishiftqb, vpshufbitqmb, and kmov from memory)
 * takes the one shuffle port, vpermi2b two of its cycles, and the decoding waits on that port:
 * the bit-matrix maps (vgf2p8affineqb runs beside it) took IQ2_XXS's single-token loop from ~64
 * to ~48 cycles a super-block (1 thread, 256 x 24576 streamed, Intel Xeon with AMX: 3.7 -> 4.9
 * GB/s of weights; IQ3_XXS 5.8 -> 6.5).
 * Earlier (1 thread, a 16384x8192 matrix streamed, best of 8, AMD EPYC Zen 4), GB/s of weights
 * without -> with VBMI (byte permutes only): IQ2_XXS 8.1 -> 8.4, IQ2_XS 9.2 -> 9.4, IQ2_S 7.5 ->
 * 10.5, IQ3_XXS 6.8 -> 13.9, IQ3_S 5.1 -> 16.5.
 * No include guard: included once, inside the VBMI region (GGUFLM_SIMD_VBMI).
 */

#include "quants_iq_codes.h"

/* the types whose magnitudes iqv_mags looks up (the others load their grid entries), and those of
 * 7-bit sign fields, whose masks iqv_field_signs makes */
static inline int gguflm_iq_vbmi_type(int type) { return !gguflm_iq_is_1bit(type) && type != GGUFLM_IQ2_XS; }
static inline int gguflm_iqv_field_sign_type(int type) {
    return type == GGUFLM_IQ2_XXS || type == GGUFLM_IQ2_XS || type == GGUFLM_IQ3_XXS;
}

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

/* GF(2) affine maps for vgf2p8affineqb (output bit i: the parity of matrix byte 7 - i AND the input
 * byte, XOR bit i of the constant operand), each reading only its field's bits: the IQ2 value
 * numbers 0, 1, 2 at bits 0-1 -> 8, 25, 43 (constant 8); the IQ3_S ones at bits 0-2 -> 2 c + 1
 * (constant 1); a 7-bit sign field at bits 0-6 (KSIGNS) or 1-7 (KSIGNS_HI) -> ggml's ksigns_iq2xs
 * byte (the field, its parity as bit 7) */
#define GGUFLM_IQV_AFFINE_IQ2 0x0302000001020000LL
#define GGUFLM_IQV_AFFINE_IQ3S 0x0001020400000000LL
#define GGUFLM_IQV_AFFINE_KSIGNS 0x010204081020407fLL
#define GGUFLM_IQV_AFFINE_KSIGNS_HI 0x02040810204080feLL

/* The sign masks of a super-block's 4 x 64 elements for the types of 7-bit sign fields, each the
 * signs of 8 elements (IQ2_XXS, IQ2_XS, IQ3_XXS): one vpermb brings field f = 8 p + k (elements
 * 64 p + 8 k ..) to qword k (IQ2_XXS, IQ3_XXS: the 2 bytes of its word that hold it, at byte 2 p,
 * vpmultishiftqb then moving it to byte p's low bits; IQ2_XS: its index word's high byte, at byte
 * p), one vgf2p8affineqb makes each field ggml's ksigns byte, and per 64 elements one vpshufbitqmb
 * takes byte p of every qword as the mask. Replaces 32-byte parity arithmetic and the masks'
 * moves through general registers, which ran on the shuffle port the decoding waits on. */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(iqv_field_signs)(int type, const uint8_t *xb, __mmask64 neg[4]) {
    static const int8_t iq2xxs_words[64] __attribute__((aligned(64))) = {  /* word g at 8 g + 4 */
        4, 5, 20, 21, 36, 37, 52, 53, 4, 5, 20, 21, 36, 37, 52, 53, 5, 6, 21, 22, 37, 38, 53, 54,
        6, 7, 22, 23, 38, 39, 54, 55, 12, 13, 28, 29, 44, 45, 60, 61, 12, 13, 28, 29, 44, 45, 60, 61,
        13, 14, 29, 30, 45, 46, 61, 62, 14, 15, 30, 31, 46, 47, 62, 63};
    static const int8_t iq3xxs_words[64] __attribute__((aligned(64))) = {  /* word g at 4 g */
        0, 1, 8, 9, 16, 17, 24, 25, 0, 1, 8, 9, 16, 17, 24, 25, 1, 2, 9, 10, 17, 18, 25, 26,
        2, 3, 10, 11, 18, 19, 26, 27, 4, 5, 12, 13, 20, 21, 28, 29, 4, 5, 12, 13, 20, 21, 28, 29,
        5, 6, 13, 14, 21, 22, 29, 30, 6, 7, 14, 15, 22, 23, 30, 31};
    static const int8_t iq2xs_high[64] __attribute__((aligned(64))) = {    /* word e's high byte at 2 e + 1 */
        1, 17, 33, 49, 0, 0, 0, 0, 3, 19, 35, 51, 0, 0, 0, 0, 5, 21, 37, 53, 0, 0, 0, 0,
        7, 23, 39, 55, 0, 0, 0, 0, 9, 25, 41, 57, 0, 0, 0, 0, 11, 27, 43, 59, 0, 0, 0, 0,
        13, 29, 45, 61, 0, 0, 0, 0, 15, 31, 47, 63, 0, 0, 0, 0};
    /* field l of a word (bits 7 l ..) from the pair of its bytes at 2 p: 16 p + 7 l mod 8 */
    const __m512i at = _mm512_set_epi64(0x35251505, 0x36261606, 0x37271707, 0x30201000,
                                        0x35251505, 0x36261606, 0x37271707, 0x30201000);
    __m512i f;
    if (type == GGUFLM_IQ2_XS) {
        f = _mm512_permutexvar_epi8(_mm512_load_si512((const void *)iq2xs_high), _mm512_loadu_si512((const void *)(xb + 2)));
        f = _mm512_gf2p8affine_epi64_epi8(f, _mm512_set1_epi64(GGUFLM_IQV_AFFINE_KSIGNS_HI), 0);
    } else {
        const __m512i w = type == GGUFLM_IQ2_XXS
                              ? _mm512_permutexvar_epi8(_mm512_load_si512((const void *)iq2xxs_words), _mm512_loadu_si512((const void *)(xb + 2)))
                              : _mm512_permutexvar_epi8(_mm512_load_si512((const void *)iq3xxs_words),
                                                        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(xb + 66))));
        f = _mm512_gf2p8affine_epi64_epi8(_mm512_multishift_epi64_epi8(at, w), _mm512_set1_epi64(GGUFLM_IQV_AFFINE_KSIGNS), 0);
    }
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p)  /* byte j of each qword: bit 8 p + j */
        neg[p] = _mm512_bitshuffle_epi64_mask(f, _mm512_add_epi8(_mm512_set1_epi64(0x0706050403020100LL), _mm512_set1_epi8((char)(8 * p))));
}

/* the int16 scales of 64 elements 64p .. (iq512_lanes' sc[p]), one vpermd from a vector of dwords
 * 2 s + 1 in both halves, s a 4-bit scale: per 32 elements, IQ2_XXS's and IQ3_XXS's from their
 * words' top 4 bits (IQ2_XXS's word g the high half of qword g of the block after its scale,
 * IQ3_XXS's at 66 + 4 g), IQ3_S's from nibble g of its 4 scale bytes (dword g shifted by 4 g); per
 * 16 elements, IQ2_XS's and IQ2_S's from nibble k of their 8 scale bytes (dword 2k the low 4
 * bytes shifted by 4k, dword 2k + 1 the high 4 by 4k for nibble 8 + k): no other shuffle */
static inline int gguflm_iqv_scale_type(int type) { return !gguflm_iq_is_1bit(type); }
static inline __attribute__((always_inline)) __m512i GGUFLM_SIMD(iqv_pair_scales)(int type, const uint8_t *xb, int p) {
    const int per16 = type == GGUFLM_IQ2_XS || type == GGUFLM_IQ2_S;
    __m512i s;   /* 2 s + 1 */
    if (per16 || type == GGUFLM_IQ3_S) {
        const __m512i a = per16 ? _mm512_srlv_epi32(_mm512_set1_epi64((long long)gguflm_iqv_u64_at(xb + (type == GGUFLM_IQ2_XS ? 66 : 74))),
                                                    _mm512_set_epi32(28, 28, 24, 24, 20, 20, 16, 16, 12, 12, 8, 8, 4, 4, 0, 0))
                                : _mm512_srlv_epi32(_mm512_set1_epi32((int)gguflm_u32_at(xb + 106)),
                                                    _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 28, 24, 20, 16, 12, 8, 4, 0));
        s = _mm512_or_si512(_mm512_and_si512(_mm512_slli_epi32(a, 1), _mm512_set1_epi32(0x1e)), _mm512_set1_epi32(1));
    } else {
        const __m512i a = type == GGUFLM_IQ2_XXS ? _mm512_srli_epi64(_mm512_loadu_si512((const void *)(xb + 2)), 32)
                                                 : _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(xb + 66)));
        s = _mm512_or_si512(_mm512_srli_epi32(a, 28 - 1), _mm512_set1_epi32(1));
    }
    const __m512i w = _mm512_or_si512(s, _mm512_slli_epi32(s, 16));
    /* the dwords of the four 16-element scales of 64p ..: per 16 nibble k = 4p + i at dword 2k (k < 8)
     * or 2 (k - 8) + 1; per 32 group 2p's (twice) then 2p + 1's (IQ2_XXS: dword 2 g) */
    const int k0 = 4 * p, d0 = k0 < 8 ? 2 * k0 : 2 * (k0 - 8) + 1;
    const int g = type == GGUFLM_IQ2_XXS ? 4 * p : 2 * p, step = type == GGUFLM_IQ2_XXS ? 2 : 1;
    const int at[4] = {per16 ? d0 : g, per16 ? d0 + 2 : g, per16 ? d0 + 4 : g + step, per16 ? d0 + 6 : g + step};
    return _mm512_permutexvar_epi32(_mm512_set_epi32(at[3], at[3], at[3], at[3], at[2], at[2], at[2], at[2],
                                                     at[1], at[1], at[1], at[1], at[0], at[0], at[0], at[0]), w);
}

/* a super-block's grid codes as looked up: the 2-bit grids' low code bytes of their 32 entries in
 * lo's low half, the high ones in its high half; the 3-bit grids' 64 low bytes in lo, high in hi */
typedef struct {
    __m512i lo, hi;
} GGUFLM_SIMD(iqv_codes);

static inline __attribute__((always_inline)) GGUFLM_SIMD(iqv_codes) GGUFLM_SIMD(iqv_lookup)(int type, const uint8_t *xb) {
    /* IQ2_XXS's 32 index bytes in both halves */
    static const int8_t iq2xxs_index[32] __attribute__((aligned(32))) = {
        0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27, 32, 33, 34, 35, 40, 41, 42, 43, 48, 49, 50, 51, 56, 57, 58, 59};
    const __m512i v = _mm512_loadu_si512((const void *)(xb + 2));
    __m512i idx;
    __mmask64 bit[3] = {0, 0, 0};
    const uint8_t *codes;
    int pieces, entries = 32;
    switch (type) {
    case GGUFLM_IQ2_XXS:
        idx = _mm512_permutexvar_epi8(_mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)iq2xxs_index)), v);
        codes = gguflm_iq2xxs_codes, pieces = 2;
        break;
    case GGUFLM_IQ2_S: {    /* bits 8, 9 of entry e: bits 2e, 2e + 1 of the 8 qh bytes */
        const __m512i h = _mm512_multishift_epi64_epi8(
            _mm512_set_epi64(0x3e3c3a3836343230LL, 0x2e2c2a2826242220LL, 0x1e1c1a1816141210LL, 0x0e0c0a0806040200LL,
                             0x3e3c3a3836343230LL, 0x2e2c2a2826242220LL, 0x1e1c1a1816141210LL, 0x0e0c0a0806040200LL),
            _mm512_set1_epi64((long long)gguflm_iqv_u64_at(xb + 66)));
        idx = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xb + 2)));
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
    GGUFLM_SIMD(iqv_codes) c;
    c.lo = GGUFLM_SIMD(iqv_plane)(codes, pieces, idx, bit);
    c.hi = GGUFLM_SIMD(iqv_plane)(codes + 128 * pieces, pieces, idx, bit);
    if (entries == 32) c.lo = _mm512_mask_blend_epi8(0xFFFFFFFF00000000ull, c.lo, c.hi);
    return c;
}

/* the four 64-byte magnitude vectors of a super-block (iq512_mag's p = 0..3) from its codes */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(iqv_mags)(int type, GGUFLM_SIMD(iqv_codes) codes, __m512i mag[4]) {
    if (type == GGUFLM_IQ2_XXS || type == GGUFLM_IQ2_S) {
        /* per 64 weights one vpermb puts entry 8p + k's two code bytes in qword k, vpmultishiftqb
         * element j's 2 bits at byte j's bottom, vgf2p8affineqb makes them the value (vpermb and
         * vpermi2b, a table each, before) */
        const __m512i shift = _mm512_set1_epi64(0x0e0c0a0806040200LL);
        const __m512i spread = _mm512_set1_epi64(0x2000);  /* qword k of vector p: bytes 8p + k, 32 + 8p + k */
        const __m512i entry = _mm512_set_epi64(0x0707, 0x0606, 0x0505, 0x0404, 0x0303, 0x0202, 0x0101, 0);
#pragma GCC unroll 4
        for (int p = 0; p < 4; ++p) {
            const __m512i at = _mm512_add_epi8(_mm512_add_epi8(spread, entry), _mm512_set1_epi16((short)(0x0808 * p)));
            const __m512i code = _mm512_multishift_epi64_epi8(shift, _mm512_permutexvar_epi8(at, codes.lo));
            mag[p] = _mm512_gf2p8affine_epi64_epi8(code, _mm512_set1_epi64(GGUFLM_IQV_AFFINE_IQ2), 8);
        }
    } else {              /* dword k of vector p: entry 16p + k's code bytes */
        /* the low and high code bytes of entries 0-31, then of 32-63, in one vector each, so that
         * one vpermb a vector spreads them (vpermi2b takes two shuffle cycles) */
        const __m512i half[2] = {_mm512_shuffle_i64x2(codes.lo, codes.hi, 0x44), _mm512_shuffle_i64x2(codes.lo, codes.hi, 0xEE)};
        const __m512i shift = _mm512_set1_epi64(0x2926232009060300LL);
        const __m512i spread = _mm512_set_epi32(0x2f0f2f0f, 0x2e0e2e0e, 0x2d0d2d0d, 0x2c0c2c0c, 0x2b0b2b0b, 0x2a0a2a0a,
                                                0x29092909, 0x28082808, 0x27072707, 0x26062606, 0x25052505, 0x24042404,
                                                0x23032303, 0x22022202, 0x21012101, 0x20002000);
#pragma GCC unroll 4
        for (int p = 0; p < 4; ++p) {
            const __m512i c = _mm512_permutexvar_epi8(_mm512_add_epi8(spread, _mm512_set1_epi8((char)(16 * (p & 1)))), half[p >> 1]);
            const __m512i code = _mm512_multishift_epi64_epi8(shift, c);
            mag[p] = type == GGUFLM_IQ3_S
                         ? _mm512_gf2p8affine_epi64_epi8(code, _mm512_set1_epi64(GGUFLM_IQV_AFFINE_IQ3S), 1)
                         : _mm512_permutexvar_epi8(code, _mm512_load_si512((const void *)gguflm_iq3xxs_values));
        }
    }
}
