/* The grid magnitudes and sign masks of a whole super-block through AVX512_VBMI, GFNI and
 * AVX512_BITALG, for the VBMI copy of quants_iq_simd512.h (GGUFLM_SIMD_VBMI): no per-entry scalar
 * loads, no bit arithmetic on the sign fields.
 * The grids are stored as codes (quants_iq_codes.h: 2 bits an element in the 8-element IQ2 entries,
 * 4 in the 4-element IQ3 ones, each mapped to its value by one vgf2p8affineqb) in two byte planes.
 * Per super-block the entry indices sit in one vector, in an arranged order (iqv_lookup), and each
 * plane is looked up for all of them at once: vpermi2b reads a 128-entry piece with the 7 low
 * index bits, and the pieces of larger grids are blended on the higher bits (masks); one unpack of
 * the two planes then puts each entry's code bytes where one vpmultishiftqb a 64 weights moves
 * element j's code to the bottom of byte j. The magnitudes are the same bytes as the lookups of
 * quants_iq_simd512.h; the 7-bit sign fields (IQ2_XXS, IQ2_XS, IQ3_XXS) become masks through
 * iqv_field_signs, the 4-bit scales rows of a table or a vector of dwords (iqv_pair_scales); the
 * dot itself does not change.
 * IQ1_S/IQ1_M keep the scalar-load path: their 2048 entries take 16 pieces a plane (62 lookup ops
 * a super-block); written so, the decoding ran at 0.88x (IQ1_S) and 0.79x (IQ1_M) of the
 * scalar-load path's speed (1 thread, weights in L2, AMD EPYC).
 * IQ2_XS loads its 512-entry grid's entries too: its lookups took 8 vpermi2b a super-block, and
 * the loads (with these sign masks) ran 5.0 GB/s against 4.5 (1 thread, Intel Xeon; equal on the
 * Zen 4 below). On Intel's cores the VBMI kernels now serve only IQ2_XXS, IQ3_XXS and IQ3_S: the
 * other types run the AVX-512 kernels there, which gather their entries (quants_kernels.h:
 * gguflm_vbmi_pays).
 * On Intel's cores every byte permute (vpermb, vpmultishiftqb, vpshufbitqmb, and kmov from memory)
 * takes the one shuffle port, vpermi2b two of its cycles, and the decoding waits on that port:
 * the bit-matrix maps (vgf2p8affineqb runs beside it) took IQ2_XXS's single-token loop from ~64
 * to ~48 cycles a super-block (1 thread, 256 x 24576 streamed, Intel Xeon with AMX: 3.7 -> 4.9
 * GB/s of weights; IQ3_XXS 5.8 -> 6.5).
 * The arranged lookups, the affine IQ3_XXS values and the scale rows then took it to ~30 (IQ3_XXS
 * ~37 -> ~32, IQ3_S ~42 -> ~36; 1 thread, 256 x 24576, weights in L2).
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
#define GGUFLM_IQV_AFFINE_IQ3XXS 0x0008000102040000LL
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

/* The int16 scales of 64 elements 64p .. (iq512_lanes' sc[p]), each 2 s + 1 for a 4-bit scale s,
 * in both halves of its dword, for the types other than IQ1's:
 * - one scale per 32 elements (IQ2_XXS: the top nibble of word g of the block after d, at
 *   9 + 8 g; IQ3_XXS: of the word at 66 + 4 g; IQ3_S: nibble g of its 4 scale bytes): the row of
 *   gguflm_iqv_pair_scale_rows that the two nibbles of groups 2p, 2p + 1 index, the index made by
 *   scalar instructions (the vector ports, which the decoding waits on, take none) and one load
 *   (was a vpermd a 64 weights on the shuffle port);
 * - one per 16 elements (IQ2_XS, IQ2_S: nibble k of their 8 scale bytes): a vector of dwords by
 *   shifts (dword 2k the low 4 bytes shifted by 4k, dword 2k + 1 the high 4 by 4k for nibble
 *   8 + k), one vpermd a 64 weights (a row per four nibbles would take a 4 MiB table). */
static inline int gguflm_iqv_scale_type(int type) { return !gguflm_iq_is_1bit(type); }

#define GGUFLM_IQV_S(s) (uint32_t)((2 * (s) + 1) * 0x10001)
#define GGUFLM_IQV_S8(s) GGUFLM_IQV_S(s), GGUFLM_IQV_S(s), GGUFLM_IQV_S(s), GGUFLM_IQV_S(s), GGUFLM_IQV_S(s), \
                         GGUFLM_IQV_S(s), GGUFLM_IQV_S(s), GGUFLM_IQV_S(s)
#define GGUFLM_IQV_PAIR(lo, hi) GGUFLM_IQV_S8(lo), GGUFLM_IQV_S8(hi)
#define GGUFLM_IQV_PAIRS(hi)                                                                                   \
    GGUFLM_IQV_PAIR(0, hi), GGUFLM_IQV_PAIR(1, hi), GGUFLM_IQV_PAIR(2, hi), GGUFLM_IQV_PAIR(3, hi),           \
        GGUFLM_IQV_PAIR(4, hi), GGUFLM_IQV_PAIR(5, hi), GGUFLM_IQV_PAIR(6, hi), GGUFLM_IQV_PAIR(7, hi),       \
        GGUFLM_IQV_PAIR(8, hi), GGUFLM_IQV_PAIR(9, hi), GGUFLM_IQV_PAIR(10, hi), GGUFLM_IQV_PAIR(11, hi),     \
        GGUFLM_IQV_PAIR(12, hi), GGUFLM_IQV_PAIR(13, hi), GGUFLM_IQV_PAIR(14, hi), GGUFLM_IQV_PAIR(15, hi)
/* row lo + 16 hi: 8 dwords of scale lo, 8 of scale hi */
static const uint32_t gguflm_iqv_pair_scale_rows[256 * 16] __attribute__((aligned(64))) = {
    GGUFLM_IQV_PAIRS(0),  GGUFLM_IQV_PAIRS(1),  GGUFLM_IQV_PAIRS(2),  GGUFLM_IQV_PAIRS(3),
    GGUFLM_IQV_PAIRS(4),  GGUFLM_IQV_PAIRS(5),  GGUFLM_IQV_PAIRS(6),  GGUFLM_IQV_PAIRS(7),
    GGUFLM_IQV_PAIRS(8),  GGUFLM_IQV_PAIRS(9),  GGUFLM_IQV_PAIRS(10), GGUFLM_IQV_PAIRS(11),
    GGUFLM_IQV_PAIRS(12), GGUFLM_IQV_PAIRS(13), GGUFLM_IQV_PAIRS(14), GGUFLM_IQV_PAIRS(15)};
#undef GGUFLM_IQV_PAIRS
#undef GGUFLM_IQV_PAIR
#undef GGUFLM_IQV_S8
#undef GGUFLM_IQV_S

static inline __attribute__((always_inline)) __m512i GGUFLM_SIMD(iqv_pair_scales)(int type, const uint8_t *xb, int p) {
    if (type != GGUFLM_IQ2_XS && type != GGUFLM_IQ2_S) {
        const unsigned row = type == GGUFLM_IQ3_S     ? xb[106 + p]
                             : type == GGUFLM_IQ3_XXS ? (unsigned)(xb[69 + 8 * p] >> 4) | (xb[73 + 8 * p] & 0xF0)
                                                      : (unsigned)(xb[9 + 16 * p] >> 4) | (xb[17 + 16 * p] & 0xF0);
        return _mm512_load_si512((const void *)(gguflm_iqv_pair_scale_rows + 16 * row));
    }
    const __m512i a = _mm512_srlv_epi32(_mm512_set1_epi64((long long)gguflm_u64_at(xb + (type == GGUFLM_IQ2_XS ? 66 : 74))),
                                        _mm512_set_epi32(28, 28, 24, 24, 20, 20, 16, 16, 12, 12, 8, 8, 4, 4, 0, 0));
    const __m512i s = _mm512_or_si512(_mm512_and_si512(_mm512_slli_epi32(a, 1), _mm512_set1_epi32(0x1e)), _mm512_set1_epi32(1));
    const __m512i w = _mm512_or_si512(s, _mm512_slli_epi32(s, 16));
    const int k0 = 4 * p, d0 = k0 < 8 ? 2 * k0 : 2 * (k0 - 8) + 1;   /* nibble k0's dword */
    return _mm512_permutexvar_epi32(_mm512_set_epi32(d0 + 6, d0 + 6, d0 + 6, d0 + 6, d0 + 4, d0 + 4, d0 + 4, d0 + 4,
                                                     d0 + 2, d0 + 2, d0 + 2, d0 + 2, d0, d0, d0, d0), w);
}

/* A super-block's grid codes, looked up in an arranged entry order so that one unpack of the two
 * planes' lookups puts each entry's code bytes (low, high) where vpmultishiftqb reads them for its
 * 64 weights: qword k of pairs[0] holds the codes of entries 2k, 2k + 1, 16 + 2k, 17 + 2k of the
 * 3-bit grids (pairs[1]: 32 more), or entries k, 8 + k, 16 + k, 24 + k of the 2-bit ones (element
 * block 64 p takes word p of every qword); was a vpermb a 64 weights (and two vshufi64x2) */
typedef struct {
    __m512i pairs[2];
} GGUFLM_SIMD(iqv_codes);

/* the entry at each index byte of the arranged order: qword 2m + h, bytes 4c + j hold entry
 * 32 h + 16 (j / 2) + 4 m + 2 c + j % 2 (3-bit grids), qword 2m entry 8 j + 2 m + c (2-bit grids;
 * the odd qwords are not read, entry 0) */
static const int8_t gguflm_iqv_order3[64] __attribute__((aligned(64))) = {
    0, 1, 16, 17, 2, 3, 18, 19, 32, 33, 48, 49, 34, 35, 50, 51, 4, 5, 20, 21, 6, 7, 22, 23, 36, 37, 52, 53, 38, 39, 54, 55,
    8, 9, 24, 25, 10, 11, 26, 27, 40, 41, 56, 57, 42, 43, 58, 59, 12, 13, 28, 29, 14, 15, 30, 31, 44, 45, 60, 61, 46, 47, 62, 63};
static const int8_t gguflm_iqv_order2[64] __attribute__((aligned(64))) = {
    0, 8, 16, 24, 1, 9, 17, 25, 0, 0, 0, 0, 0, 0, 0, 0, 2, 10, 18, 26, 3, 11, 19, 27, 0, 0, 0, 0, 0, 0, 0, 0,
    4, 12, 20, 28, 5, 13, 21, 29, 0, 0, 0, 0, 0, 0, 0, 0, 6, 14, 22, 30, 7, 15, 23, 31, 0, 0, 0, 0, 0, 0, 0, 0};
/* IQ2_XXS: where the arranged entries' index bytes are (entry e at 8 (e / 4) + e % 4 after d) */
static const int8_t gguflm_iqv_iq2xxs_at[64] __attribute__((aligned(64))) = {
    0, 16, 32, 48, 1, 17, 33, 49, 0, 0, 0, 0, 0, 0, 0, 0, 2, 18, 34, 50, 3, 19, 35, 51, 0, 0, 0, 0, 0, 0, 0, 0,
    8, 24, 40, 56, 9, 25, 41, 57, 0, 0, 0, 0, 0, 0, 0, 0, 10, 26, 42, 58, 11, 27, 43, 59, 0, 0, 0, 0, 0, 0, 0, 0};

static inline __attribute__((always_inline)) GGUFLM_SIMD(iqv_codes) GGUFLM_SIMD(iqv_lookup)(int type, const uint8_t *xb) {
    const __m512i v = _mm512_loadu_si512((const void *)(xb + 2));
    const __m512i order3 = _mm512_load_si512((const void *)gguflm_iqv_order3);
    __m512i idx;
    __mmask64 bit[3] = {0, 0, 0};
    const uint8_t *codes;
    int pieces;
    switch (type) {
    case GGUFLM_IQ2_XXS:
        idx = _mm512_permutexvar_epi8(_mm512_load_si512((const void *)gguflm_iqv_iq2xxs_at), v);
        codes = gguflm_iq2xxs_codes, pieces = 2;
        break;
    case GGUFLM_IQ2_S: {    /* bits 8, 9 of entry e: bits 2e, 2e + 1 of the 8 qh bytes */
        const __m512i order2 = _mm512_load_si512((const void *)gguflm_iqv_order2);
        const __m512i h = _mm512_multishift_epi64_epi8(_mm512_add_epi8(order2, order2), _mm512_set1_epi64((long long)gguflm_u64_at(xb + 66)));
        idx = _mm512_permutexvar_epi8(order2, v);
        bit[1] = _mm512_test_epi8_mask(h, _mm512_set1_epi8(1));
        bit[2] = _mm512_test_epi8_mask(h, _mm512_set1_epi8(2));
        codes = gguflm_iq2s_codes, pieces = 8;
        break;
    }
    case GGUFLM_IQ3_XXS:
        idx = _mm512_permutexvar_epi8(order3, v);
        codes = gguflm_iq3xxs_codes, pieces = 2;
        break;
    default:                /* IQ3_S: bit 8 of entry e is bit e of the 8 qh bytes */
        idx = _mm512_permutexvar_epi8(order3, v);
        bit[1] = _mm512_bitshuffle_epi64_mask(_mm512_set1_epi64((long long)gguflm_u64_at(xb + 66)), order3);
        codes = gguflm_iq3s_codes, pieces = 4;
        break;
    }
    bit[0] = _mm512_movepi8_mask(idx);
    const __m512i lo = GGUFLM_SIMD(iqv_plane)(codes, pieces, idx, bit), hi = GGUFLM_SIMD(iqv_plane)(codes + 128 * pieces, pieces, idx, bit);
    GGUFLM_SIMD(iqv_codes) c = {{_mm512_unpacklo_epi8(lo, hi), _mm512_unpackhi_epi8(lo, hi)}};
    return c;
}

/* the four 64-byte magnitude vectors of a super-block (iq512_mag's p = 0..3) from its codes: per
 * 64 weights vpmultishiftqb moves element j's code to byte j's low bits, vgf2p8affineqb makes it
 * the value (the bits above it are ignored) */
static inline __attribute__((always_inline)) void GGUFLM_SIMD(iqv_mags)(int type, GGUFLM_SIMD(iqv_codes) codes, __m512i mag[4]) {
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
        if (type == GGUFLM_IQ2_XXS || type == GGUFLM_IQ2_S) {   /* 2 bits at 16 p + 2 j */
            const __m512i code = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x0e0c0a0806040200LL + 0x1010101010101010LL * p),
                                                              codes.pairs[0]);
            mag[p] = _mm512_gf2p8affine_epi64_epi8(code, _mm512_set1_epi64(GGUFLM_IQV_AFFINE_IQ2), 8);
        } else {                                                /* 4 bits at 32 (p % 2) + 4 j */
            const __m512i code = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x1c1814100c080400LL + 0x2020202020202020LL * (p & 1)),
                                                              codes.pairs[p >> 1]);
            mag[p] = type == GGUFLM_IQ3_S ? _mm512_gf2p8affine_epi64_epi8(code, _mm512_set1_epi64(GGUFLM_IQV_AFFINE_IQ3S), 1)
                                          : _mm512_gf2p8affine_epi64_epi8(code, _mm512_set1_epi64(GGUFLM_IQV_AFFINE_IQ3XXS), 4);
        }
    }
}
