/* Intel AMX (the tile registers and their matrix unit) for the AVX-512 ISAs' batch kernels, where the
 * CPU has AMX-INT8, the OS enables the tile state and the kernel granted it to the process (the
 * dispatch's amx, set by gguflm._ext.system; never otherwise, so never a SIGILL). Included by
 * quants_simd.h before its SIMD copies: the tile helpers here, and the int8 peak loop of the kernels
 * bench, in an AMX target region of their own (nothing where the compiler has no AMX intrinsics).
 * The kernels' tile functions (quants_repack_simd.inc, quants_ktile_simd.inc) are compiled in their
 * AVX-512 copy under the AMX target too, out of line, and called there while the dispatch's amx is
 * on.
 *
 * A tile holds up to 16 rows of up to 64 bytes. tdpbsud C += A . B (A signed bytes, B unsigned)
 * takes A as M rows of K bytes and B as K/4 rows of N dwords, the 4 consecutive k of column n side
 * by side: C[m][n] += sum_k A[m][k] * B[k/4][4n + k%4], an exact int32 sum. B's rows are thus
 * what the repacked Q4_0 recipe's transposed blocks already are (group g's vector: lane r = row r's
 * elements 4g..4g+3), and A's rows the tokens' Q8_0 blocks, read in place.
 *
 * Each thread loads its tile configuration before its first tile instruction and releases the
 * tiles after its last one (the state is per thread, and a released one is cheap to switch).
 */
#ifndef GGUFLM_QUANTS_AMX_H
#define GGUFLM_QUANTS_AMX_H

#include <stdint.h>
#include <string.h>
#include "simd_targets.h"

#if GGUFLM_HAVE_AMX
GGUFLM_TARGET_AMX_BEGIN

/* GCC's tile loads and stores are asm statements that name no memory, only a pointer: without
 * this barrier, which hands the compiler buffer p as read and written here, between stores to a
 * buffer and a tile load of it (or a tile store to it and loads from it), the compiler may drop
 * or reorder the plain accesses (it dropped the memset of a local tile source) */
#define GGUFLM_AMX_MEMORY(p) __asm__ volatile("" : : "r"(p) : "memory")

/* ldtilecfg's 64-byte operand (palette 1) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} gguflm_amx_config;

/* the block-dot shape, for blocks of k_bytes (16 or 32) elements: tiles 0, 1 C (16 x 16 int32),
 * 2, 3 A (16 rows of k_bytes), 4, 5 and 6 B (k_bytes / 4 rows of 16 dwords; 6 a kernel's constant
 * one); macros, not an enum: the tile intrinsics paste their tile numbers into the instruction's
 * text */
#define GGUFLM_AMX_C0 0
#define GGUFLM_AMX_C1 1
#define GGUFLM_AMX_A0 2
#define GGUFLM_AMX_A1 3
#define GGUFLM_AMX_B0 4
#define GGUFLM_AMX_B1 5
#define GGUFLM_AMX_OFF 6
static void gguflm_amx_config_blocks(int k_bytes) {
    gguflm_amx_config cfg __attribute__((aligned(64)));
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int c = GGUFLM_AMX_C0; c <= GGUFLM_AMX_C1; ++c) cfg.rows[c] = 16, cfg.colsb[c] = 64;
    for (int a = GGUFLM_AMX_A0; a <= GGUFLM_AMX_A1; ++a) cfg.rows[a] = 16, cfg.colsb[a] = (uint16_t)k_bytes;
    for (int b = GGUFLM_AMX_B0; b <= GGUFLM_AMX_OFF; ++b) cfg.rows[b] = (uint8_t)(k_bytes / 4), cfg.colsb[b] = 64;
    GGUFLM_AMX_MEMORY(&cfg);   /* (GCC 12 dropped all but the palette's store without it) */
    _tile_loadconfig(&cfg);
}

/* the block-dot shape for blocks of k_bytes, and the tile GGUFLM_AMX_OFF of -off bytes: a token's
 * A row against it is -off * the sum of its block, where unsigned weights u = value + off start */
static void gguflm_amx_begin(int k_bytes, int off) {
    int8_t neg[8 * 64] __attribute__((aligned(64)));
    memset(neg, -off, sizeof(neg));
    GGUFLM_AMX_MEMORY(neg);
    gguflm_amx_config_blocks(k_bytes);
    _tile_loadd(GGUFLM_AMX_OFF, neg, 64);
}

static void gguflm_amx_end(void) { _tile_release(); }

/* C (tile c) = the 16 tokens' k_bytes at a (rows ys bytes apart) times B (tile b, loaded from bq,
 * rows 64 bytes apart), starting from -off * their sums (with_off) or 0: the block's int32 sums,
 * lane r of C's row t that of token t and weight row r */
#define GGUFLM_AMX_BLOCK_DOT(c, a_tile, b_tile, a, ys, bq, with_off)  \
    do {                                                            \
        _tile_zero(c);                                              \
        _tile_loadd(a_tile, (a), (ys));                             \
        _tile_loadd(b_tile, (bq), 64);                              \
        if (with_off) _tile_dpbssd(c, a_tile, GGUFLM_AMX_OFF);      \
        _tile_dpbsud(c, a_tile, b_tile);                            \
    } while (0)

/* int8 operations (2 per multiply-add) of one gguflm_int8_peak_amx round: 4 tiles of 16 x 16 x 64 */
#define GGUFLM_INT8_PEAK_OPS_AMX ((int64_t)4 * 16 * 16 * 64 * 2)

/* The AMX int8 peak the bench measures the tile kernels against: full tiles (K = 64), four
 * independent accumulators fed by two A and two B tiles, `iters` rounds. Returns a checksum. */
static int32_t gguflm_int8_peak_amx(int64_t iters) {
    gguflm_amx_config cfg __attribute__((aligned(64)));
    int8_t src[16 * 64] __attribute__((aligned(64)));
    int32_t c[16 * 16] __attribute__((aligned(64)));
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    for (int i = 0; i < 16 * 64; ++i) src[i] = (int8_t)(i % 7 - 3);
    GGUFLM_AMX_MEMORY(src);
    GGUFLM_AMX_MEMORY(&cfg);
    _tile_loadconfig(&cfg);
    _tile_loadd(4, src, 64);
    _tile_loadd(5, src, 64);
    _tile_loadd(6, src, 64);
    _tile_loadd(7, src, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t k = 0; k < iters; ++k) {
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
    }
    _tile_stored(0, c, 64);
    GGUFLM_AMX_MEMORY(c);
    int32_t sum = c[0];
    _tile_stored(3, c, 64);
    GGUFLM_AMX_MEMORY(c);
    sum += c[255];
    _tile_release();
    return sum;
}

GGUFLM_TARGET_END
#endif

#endif
