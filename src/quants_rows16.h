/* The rows-16 layout: Q4_0, IQ4_NL and MXFP4 matmul weights as gguflm holds them after loading.
 *
 * llama.cpp copies these weights at load into interleaved blocks of 8 rows (its CPU_REPACK buffer,
 * block_q4_0x8 and the like) and computes them with its repacked GEMV/GEMM; our kernels for that
 * recipe (quants_repack_simd.inc) put 16 rows in the lanes of a vector. In the file's layout every row
 * is its own stream through memory and each block is transposed in registers; in this one a group of
 * 16 rows is one stream whose vectors load as they are used.
 *
 * Rows are taken in groups of 16 (a matrix of this layout has a multiple of 16 rows). A group takes
 * the bytes of its 16 rows in the file (16 x row_bytes) and holds, block after block, the block's 16
 * rows as one group block of 16 x bx bytes:
 *   the 16 rows' scales, row r's at r x (bx - 16)         (fp16 d of Q4_0 / IQ4_NL, e8m0 of MXFP4)
 *   4 chunks of 64 bytes: chunk c, bytes 4r..4r+3 = row r's qs[4c..4c+3]
 * so chunk c, read as 16 dwords, is the dword-c column of the 16 rows (their elements 4c..4c+3 in
 * the low nibbles, 16+4c.. in the high ones): the vectors rp_decode builds by transposing.
 */
#ifndef GGUFLM_QUANTS_ROWS16_H
#define GGUFLM_QUANTS_ROWS16_H

#include <stdint.h>
#include <string.h>
#include "quants_ref.h"  /* the block types, and the type ids (GGUFLM_Q4_0, ...) */

#define GGUFLM_ROWS16 16

/* the types this layout holds, and the repacked-recipe kernels read it for */
static inline int gguflm_rows16_type(int type) {
    return type == GGUFLM_Q4_0 || type == GGUFLM_IQ4_NL || type == GGUFLM_MXFP4;
}

/* bytes of one row's block and of its scale */
static inline int64_t gguflm_rows16_bx(int type) {
    return type == GGUFLM_MXFP4 ? (int64_t)sizeof(block_mxfp4) : (int64_t)sizeof(block_q4_0);
}
static inline int64_t gguflm_rows16_scale_bytes(int type) { return gguflm_rows16_bx(type) - QK4_0 / 2; }

/* row r (< 16) of a group of 16 rows (each row_bytes long) between the two layouts: put writes the
 * file-layout row into the rows-16 group, get reads it back */
static inline void gguflm_rows16_row(int type, int put, uint8_t *group, int r, int64_t row_bytes, uint8_t *row) {
    const int64_t bx = gguflm_rows16_bx(type), sbytes = gguflm_rows16_scale_bytes(type);
    for (int64_t ib = 0; ib < row_bytes / bx; ++ib) {
        uint8_t *gb = group + ib * GGUFLM_ROWS16 * bx, *block = row + ib * bx;
        /* (scale, qs dword 0..3): its place in the group block, its place in the row's block */
        for (int part = 0; part < 5; ++part) {
            uint8_t *g = part == 0 ? gb + r * sbytes : gb + GGUFLM_ROWS16 * sbytes + 64 * (part - 1) + 4 * r;
            uint8_t *b = part == 0 ? block : block + sbytes + 4 * (part - 1);
            const size_t len = part == 0 ? (size_t)sbytes : 4;
            if (put) memcpy(g, b, len);
            else memcpy(b, g, len);
        }
    }
}

/* n_rows (a multiple of 16) rows of row_bytes each from src to dst, packed into the rows-16 layout
 * (to_rows16 1) or unpacked to the file's (0). dst may be src (in place, one thread; tmp takes 16 x
 * row_bytes); a copy to other memory runs its groups on n_threads (loading converts while the
 * file's pages fault in) */
static void gguflm_rows16_convert(int type, int to_rows16, const uint8_t *src, uint8_t *dst, int64_t n_rows,
                                  int64_t row_bytes, uint8_t *tmp, int n_threads) {
    const int64_t group = GGUFLM_ROWS16 * row_bytes, n_groups = n_rows / GGUFLM_ROWS16;
    if (src == dst) {
        for (int64_t g = 0; g < n_groups; ++g) {
            memcpy(tmp, src + g * group, (size_t)group);
            for (int r = 0; r < GGUFLM_ROWS16; ++r)
                if (to_rows16) gguflm_rows16_row(type, 1, dst + g * group, r, row_bytes, tmp + r * row_bytes);
                else gguflm_rows16_row(type, 0, tmp, r, row_bytes, dst + g * group + r * row_bytes);
        }
        return;
    }
    #pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t g = 0; g < n_groups; ++g)
        for (int r = 0; r < GGUFLM_ROWS16; ++r)
            if (to_rows16) gguflm_rows16_row(type, 1, dst + g * group, r, row_bytes, (uint8_t *)src + g * group + r * row_bytes);
            else gguflm_rows16_row(type, 0, (uint8_t *)src + g * group, r, row_bytes, dst + g * group + r * row_bytes);
}

#endif
