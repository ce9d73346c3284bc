/* The value-table and ternary formats (IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0) in the matmul recipes
 * (quants_recipe.h): the portable scalar reference of each way ggml-cpu (x86, llama-cpp-python
 * 0.3.36's AVX2 and AVX-512 builds; the float steps read off its disassembly and checked against
 * its vec_dot by tests/test_quants_lut.py) computes a weight row . activation row:
 *
 *   DOT  IQ4_NL, MXFP4 (ggml_vec_dot_{iq4_nl,mxfp4}_q8_0): blocks in pairs, two chains of 8
 *        lanes (even blocks, odd blocks), lane l the integer sum of elements 4l..4l+3,
 *        acc = fma(dy*dx, lane, acc); hsum_float_8(acc_even + acc_odd); an odd last block adds
 *        dy*dx * its whole sum, fused or not as the build's tuning has it (dispatch.h:
 *        gguflm_arith_fuses_loop_sums).
 *   DOT  IQ4_XS (ggml_vec_dot_iq4_xs_q8_K): one chain, lanes of the scaled sums of a super-block
 *        (lane l: elements 4l..4l+3 of every 32), acc = fma(dx*dy, lane, acc), hsum_float_8.
 *   DOT  TQ1_0, TQ2_0: lanes of (value + 1) * y over elements 4l..4l+3 of every 32 minus
 *        bsums[2l] + bsums[2l+1] (the +1 taken off through other elements than the products'),
 *        acc = fma(lane, dy*dx, acc), hsum_float_8.
 *   TILED IQ4_XS in batches of 8+ tokens (tiled GEMM): as the K-quants, res = d * s1,
 *        out = fma(res, dy, out).
 *   Q4_0_REPACK  IQ4_NL, MXFP4 repacked 8x8 (rows % 8 == 0, GEMV and GEMM): one fma per block of
 *        the block's integer sum, the recipe of repacked Q4_0 (the same ggml template).
 *   SGEMM IQ4_NL batches that are not repacked (llamafile's tinyBLAS_Q0_AVX): one chain,
 *        acc = fma(dx*dy, lane, acc), hsum.
 * Every integer above is exact, so only the lanes' element sets and the float steps matter.
 */
#ifndef GGUFLM_QUANTS_LUT_DOT_H
#define GGUFLM_QUANTS_LUT_DOT_H

#include "quants_recipe.h"
#include "quants_lut_ref.h"

static inline int gguflm_is_lut32(int type) { return type == GGUFLM_IQ4_NL || type == GGUFLM_MXFP4; }
static inline int gguflm_is_ternary(int type) { return type == GGUFLM_TQ1_0 || type == GGUFLM_TQ2_0; }
static inline int gguflm_is_lut(int type) { return gguflm_is_lut32(type) || gguflm_is_ternary(type) || type == GGUFLM_IQ4_XS; }

/* a 32-element IQ4_NL / MXFP4 block: its table, quants and scale */
static inline const int8_t *gguflm_lut32_table(int type) {
    return type == GGUFLM_MXFP4 ? gguflm_kvalues_mxfp4 : gguflm_kvalues_iq4nl;
}
static inline const uint8_t *gguflm_lut32_qs(int type, const uint8_t *xb) {
    return type == GGUFLM_MXFP4 ? ((const block_mxfp4 *)xb)->qs : ((const block_iq4_nl *)xb)->qs;
}
static inline float gguflm_lut32_scale(int type, const uint8_t *xb) {
    return type == GGUFLM_MXFP4 ? gguflm_e8m0_to_fp32_half(((const block_mxfp4 *)xb)->e)
                                : gguflm_fp16_to_fp32(((const block_iq4_nl *)xb)->d);
}
static inline size_t gguflm_lut32_bytes(int type) { return type == GGUFLM_MXFP4 ? sizeof(block_mxfp4) : sizeof(block_iq4_nl); }

/* lanes[l] = sum of v[j] * y[j] for j = 4l..4l+3 (+ 32 g for each 32 elements g of n) */
static inline void gguflm_lanes_i8(const int8_t *v, const int8_t *y, int32_t lanes[8]) {
    for (int l = 0; l < 8; ++l) {
        int32_t s = 0;
        for (int j = 4 * l; j < 4 * l + 4; ++j) s += v[j] * y[j];
        lanes[l] = s;
    }
}

/* ---- 32-element blocks against Q8_0 ---- */
static inline float gguflm_lut32_dot_1(int type, int arith, int64_t n, const uint8_t *x, const block_q8_0 *y) {
    const size_t bx = gguflm_lut32_bytes(type);
    const int64_t nb = n / 32;
    float acc[2][8] = {{0}}, s[8];
    int8_t v[32];
    int32_t lanes[8];
    int64_t ib = 0;
    for (; ib + 1 < nb; ib += 2)
        for (int h = 0; h < 2; ++h) {
            const uint8_t *xb = x + (ib + h) * bx;
            gguflm_lut_unpack32(gguflm_lut32_table(type), gguflm_lut32_qs(type, xb), v);
            gguflm_lanes_i8(v, y[ib + h].qs, lanes);
            const float d = gguflm_fp16_to_fp32(y[ib + h].d) * gguflm_lut32_scale(type, xb);
            for (int l = 0; l < 8; ++l) acc[h][l] = fmaf(d, (float)lanes[l], acc[h][l]);
        }
    for (int l = 0; l < 8; ++l) s[l] = acc[0][l] + acc[1][l];
    float sumf = gguflm_hsum8_movehl(s);
    if (ib < nb) {
        const uint8_t *xb = x + ib * bx;
        gguflm_lut_unpack32(gguflm_lut32_table(type), gguflm_lut32_qs(type, xb), v);
        gguflm_lanes_i8(v, y[ib].qs, lanes);
        const float d = gguflm_fp16_to_fp32(y[ib].d) * gguflm_lut32_scale(type, xb);
        const float sum = (float)gguflm_sum8_i32(lanes);
        sumf = gguflm_arith_fuses_loop_sums(arith) ? fmaf(d, sum, sumf) : sumf + d * sum;
    }
    return sumf;
}

/* one chain of lanes (tinyBLAS_Q0) or of whole block sums (repacked GEMV/GEMM) */
static inline float gguflm_lut32_chain_1(int type, int whole, int64_t n, const uint8_t *x, const block_q8_0 *y) {
    const size_t bx = gguflm_lut32_bytes(type);
    float acc[8] = {0}, acc1 = 0.0f;
    int8_t v[32];
    int32_t lanes[8];
    for (int64_t ib = 0; ib < n / 32; ++ib) {
        const uint8_t *xb = x + ib * bx;
        gguflm_lut_unpack32(gguflm_lut32_table(type), gguflm_lut32_qs(type, xb), v);
        gguflm_lanes_i8(v, y[ib].qs, lanes);
        const float d = gguflm_lut32_scale(type, xb) * gguflm_fp16_to_fp32(y[ib].d);
        if (whole) acc1 = fmaf((float)gguflm_sum8_i32(lanes), d, acc1);
        else
            for (int l = 0; l < 8; ++l) acc[l] = fmaf(d, (float)lanes[l], acc[l]);
    }
    return whole ? acc1 : gguflm_hsum8_movehl(acc);
}

/* ---- 256-element super-blocks against Q8_K ---- */

/* the 8 integer lanes of one super-block (see the header comment) */
static inline void gguflm_lut256_lanes(int type, const uint8_t *xb, const block_q8_K *y, int32_t lanes[8]) {
    int32_t part[8];
    memset(lanes, 0, 8 * sizeof(int32_t));
    if (type == GGUFLM_IQ4_XS) {
        const block_iq4_xs *b = (const block_iq4_xs *)xb;
        int8_t v[32];
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            gguflm_lut_unpack32(gguflm_kvalues_iq4nl, b->qs + 16 * ib, v);
            gguflm_lanes_i8(v, y->qs + 32 * ib, part);
            const int ls = gguflm_iq4_xs_scale(b, ib);
            for (int l = 0; l < 8; ++l) lanes[l] += ls * part[l];
        }
        return;
    }
    uint8_t u[QK_K];
    gguflm_tq_unpack(type, xb, u);
    for (int e = 0; e < QK_K; ++e) lanes[(e % 32) / 4] += u[e] * y->qs[e];
    for (int l = 0; l < 8; ++l) lanes[l] -= y->bsums[2 * l] + y->bsums[2 * l + 1];
}

static inline size_t gguflm_lut256_bytes(int type) {
    return type == GGUFLM_IQ4_XS ? sizeof(block_iq4_xs) : type == GGUFLM_TQ1_0 ? sizeof(block_tq1_0) : sizeof(block_tq2_0);
}

static inline float gguflm_lut256_d(int type, const uint8_t *xb) {
    return gguflm_fp16_to_fp32(type == GGUFLM_IQ4_XS ? ((const block_iq4_xs *)xb)->d : gguflm_tq_d(type, xb));
}

static inline float gguflm_lut256_dot_1(int type, int tiled, int64_t n, const uint8_t *x, const block_q8_K *y) {
    const size_t bx = gguflm_lut256_bytes(type);
    float acc[8] = {0}, out = 0.0f;
    int32_t lanes[8];
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const uint8_t *xb = x + i * bx;
        gguflm_lut256_lanes(type, xb, &y[i], lanes);
        const float dx = gguflm_lut256_d(type, xb);
        if (tiled) {
            out = gguflm_tiled_step(0, dx, 0.0f, gguflm_sum8_i32(lanes), 0, y[i].d, out);
        } else if (type == GGUFLM_IQ4_XS) {
            const float d = dx * y[i].d;
            for (int l = 0; l < 8; ++l) acc[l] = fmaf(d, (float)lanes[l], acc[l]);
        } else {
            const float d = y[i].d * dx;
            for (int l = 0; l < 8; ++l) acc[l] = fmaf((float)lanes[l], d, acc[l]);
        }
    }
    return tiled ? out : gguflm_hsum8_movehl(acc);
}

/* one output of `path` for one of these weight types */
static inline __attribute__((always_inline)) float gguflm_lut_recipe_1(int path, int type, int arith, int64_t n,
                                                                      const uint8_t *x, const uint8_t *y) {
    if (gguflm_is_lut32(type)) {
        if (path == GGUFLM_PATH_DOT || path == GGUFLM_PATH_DOT_STREAM) return gguflm_lut32_dot_1(type, arith, n, x, (const block_q8_0 *)y);
        return gguflm_lut32_chain_1(type, path == GGUFLM_PATH_Q4_0_REPACK, n, x, (const block_q8_0 *)y);
    }
    return gguflm_lut256_dot_1(type, path == GGUFLM_PATH_TILED, n, x, (const block_q8_K *)y);
}

#endif
