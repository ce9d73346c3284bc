/* TQ1_0 matmul weights held as TQ2_0 after loading.
 *
 * TQ1_0 packs five trits into a byte (base 3, as a fraction of 256) and TQ2_0 four into a byte (2
 * bits each); both hold a value + 1 in 0..2 per element and one fp16 scale per 256 elements, and
 * ggml-cpu computes both with the same recipe: the same int32 lanes (elements 4l..4l+3 of every
 * 32), less the activation's sums, and the same float step per super-block (our kernels share it:
 * quants_lut_simd.inc, quants_strips_avx512.inc, quants_lut_dot.h). A TQ1_0 weight whose blocks are
 * rewritten as TQ2_0 blocks therefore gives TQ1_0's outputs bit for bit on every path, while the
 * 2-bit fields decode with a shift and a mask where the base-3 bytes take a multiply and a rounding
 * per trit: decode streams 66 bytes a super-block where it computed 54 (22% more memory).
 */
#ifndef GGUFLM_QUANTS_TQ_HELD_H
#define GGUFLM_QUANTS_TQ_HELD_H

#include <stdint.h>
#include "ggml_blocks.h"
#include "quants_lut_ref.h"

static inline void gguflm_tq1_block_as_tq2(const block_tq1_0 *src, block_tq2_0 *dst) {
    uint8_t u[QK_K];
    gguflm_tq_unpack(GGUFLM_TQ1_0, src, u);
    /* TQ2_0 byte 32 h + m: elements 128 h + 32 n + m in bits 2 n, 2 n + 1 */
    for (int h = 0; h < 2; ++h)
        for (int m = 0; m < 32; ++m) {
            const uint8_t *e = u + 128 * h + m;
            dst->qs[32 * h + m] = (uint8_t)(e[0] | e[32] << 2 | e[64] << 4 | e[96] << 6);
        }
    dst->d = src->d;
}

/* n_blocks TQ1_0 blocks from src as TQ2_0 blocks into dst, on n_threads */
static void gguflm_tq1_as_tq2(const uint8_t *src, uint8_t *dst, int64_t n_blocks, int n_threads) {
    #pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t i = 0; i < n_blocks; ++i)
        gguflm_tq1_block_as_tq2((const block_tq1_0 *)src + i, (block_tq2_0 *)dst + i);
}

#endif
