/* Weight x activation dot products with the float arithmetic of llama.cpp's CPU backend, bit for
 * bit: the routing of a matmul to ggml's kernels, and the portable scalar reference of each one.
 *
 * ggml-cpu (x86) computes a weight row . activation row in one of these ways, which round
 * differently (each checked against llama-cpp-python 0.3.36's libggml-cpu, AVX2 and AVX-512
 * builds, whose kernels GCC compiled with -ffp-contract=fast: fmaf() below marks every FMA it
 * emitted):
 *
 *   DOT          ggml_vec_dot_<type>: 8 float lanes, lane l takes the 4-element integer sums at
 *                32-element offsets 4l..4l+3, acc = fma(d, lane, acc) per block, hsum_float_8.
 *   TILED        K-quants in batches of 8+ tokens (tiled/ GEMM): one exact integer per
 *                super-block, res = d*s1 (- dmin*s2 fused), out = fma(res, y.d, out).
 *   Q4_K_GEMV    repacked Q4_K (rows % 8 == 0), single tokens: per super-block, two fma chains
 *                (scaled sums, scaled mins) of the whole integer sums; out = acc - acc_min.
 *   Q4_K_GEMM    the same for groups of 4 tokens, but one fma per 64 elements.
 *                Both also serve Q2_K, repacked 8x8 by AVX-512 builds only: GEMM one fma per 128.
 *   Q4_0_REPACK  repacked Q4_0: one fma per block of the block's integer sum.
 *   Q4_0_ROWS16  the same recipe reading weights that gguflm holds in its rows-16 layout
 *                (quants_rows16.h; Q4_0, IQ4_NL and MXFP4 matmul weights of a loaded model).
 *   SGEMM        F32/F16/BF16 batches (llamafile tinyBLAS): one fma chain of a vector's lanes, hsum.
 *
 * The recipes of quantized weights round the same in every build (the AVX-512 kernels' float
 * steps are those of the AVX2 ones); those of float weights (DOT, SGEMM) depend on the build
 * reproduced, the arithmetic of the switch (dispatch.h), which every kernel takes as its last
 * argument. All ISA variants (quants_simd.h) reproduce every recipe of every arithmetic exactly.
 *
 * One signature for every kernel (STYLE.md section 2): out[t * out_stride + r] = W_r . Y_t for
 * r < nr weight rows w_stride bytes apart and t < nt activation rows y_stride bytes apart, the
 * activations already in the weight type's dot partner. n elements per row.
 */
#ifndef GGUFLM_QUANTS_DOT_H
#define GGUFLM_QUANTS_DOT_H

#include "ops_math.h"
#include "quants_ref.h"
#include "quants_iq_dot.h"
#include "quants_rows16.h"

typedef void (*gguflm_gemm_fn)(int64_t n, const uint8_t *w, int64_t w_stride, int64_t nr, const uint8_t *y,
                               int64_t y_stride, int64_t nt, float *out, int64_t out_stride, int arith);

enum {
    GGUFLM_PATH_DOT = 0,
    GGUFLM_PATH_TILED,
    GGUFLM_PATH_Q4_K_GEMV,
    GGUFLM_PATH_Q4_K_GEMM,
    GGUFLM_PATH_Q4_0_REPACK,
    GGUFLM_PATH_Q4_0_ROWS16,
    GGUFLM_PATH_SGEMM,
    GGUFLM_PATH_DOT_STREAM,  /* DOT's arithmetic, one row at a time: single tokens on large matrices */
    GGUFLM_PATH_COUNT
};

/* a single token's legacy-block matrix this large is streamed row by row (see dot_legacy) */
#define GGUFLM_STREAM_BYTES (16 << 20)

/* a run of token rows [t0, t1) that one recipe computes */
typedef struct {
    int path;
    int64_t t0, t1;
} gguflm_segment;

static inline int gguflm_is_kquant(int type) { return type >= GGUFLM_Q2_K && type <= GGUFLM_Q6_K; }
static inline int gguflm_is_float(int type) { return type == GGUFLM_F32 || type == GGUFLM_F16 || type == GGUFLM_BF16; }
static inline int gguflm_is_legacy(int type) {
    return type == GGUFLM_Q4_0 || type == GGUFLM_Q4_1 || type == GGUFLM_Q5_0 || type == GGUFLM_Q5_1 || type == GGUFLM_Q8_0;
}

/* ggml-cpu's float dots, by build (dispatch.h; V = gguflm_vec_lanes, 8 or 16 floats):
 *   DOT    ggml_vec_dot_f32/f16: 4 accumulator vectors of V lanes, one fma per element over steps
 *          of 4V; reduced (a0 + a2) + (a1 + a3), then the vector's horizontal sum (AVX2: two
 *          hadds; AVX-512: _mm512_reduce_add_ps); then the elements after the last whole step.
 *          ggml_vec_dot_bf16: AVX2 as f16 but with the movehl sum; AVX-512F 2 vectors of 16 lanes
 *          over steps of 32, each summed and added in double; AVX512_BF16 the same with vdpbf16ps
 *          (a lane takes a bf16 pair per step) over steps of 64.
 *   SGEMM  llamafile's tinyBLAS (batches): one vector of V lanes per output, fma (vdpbf16ps for
 *          BF16 with AVX512_BF16) over steps of V (2V), the movehl / reduce_add_ps sum; the plan
 *          sends it only rows whose length is a whole number of steps. */
typedef struct {
    int lanes;  /* floats of one accumulator vector */
    int vecs;   /* accumulator vectors, each over its own consecutive part of a step */
    int pairs;  /* 1: a lane takes a bf16 pair per step (vdpbf16ps); 0: one element (fma) */
} gguflm_float_chain;

#define GGUFLM_FLOAT_ACC 64  /* most accumulator lanes of a chain */

static inline gguflm_float_chain gguflm_float_chain_of(int path, int type, int arith) {
    const int lanes = gguflm_vec_lanes(arith), pairs = type == GGUFLM_BF16 && gguflm_arith_dpbf16(arith);
    if (path == GGUFLM_PATH_SGEMM) return (gguflm_float_chain){lanes, 1, pairs};
    return (gguflm_float_chain){lanes, type == GGUFLM_BF16 && lanes == 16 ? 2 : 4, pairs};
}

/* elements per step of a chain */
static inline int gguflm_float_step(gguflm_float_chain c) { return c.vecs * c.lanes * (1 + c.pairs); }

/* How a matmul weight is held (gguflm_matmul_job.repacked): where llama.cpp keeps it, and for the
 * types of the rows-16 layout, whether gguflm holds it so */
enum {
    GGUFLM_PLAIN = 0,           /* llama.cpp's plain CPU buffer (a tied token embedding) */
    GGUFLM_REPACKED = 1,        /* llama.cpp's CPU_REPACK buffer; here in the file's layout */
    GGUFLM_REPACKED_ROWS16 = 2  /* the same, here in the rows-16 layout (rows % 16 == 0) */
};

/* The recipes llama.cpp's CPU backend applies to a matmul of n_rows weight rows (w_stride bytes
 * apart) by n_tok tokens: up to two segments. `repacked`: the weight is a matrix that llama.cpp would
 * keep in its CPU_REPACK buffer (a model weight only used by matmuls: not a tied token embedding),
 * one of the values above. DOT_STREAM is ours: DOT's arithmetic in another row order. */
/* ggml_repack_get_optimal_repack_type on x86 AVX2+: Q4_0, Q4_K, and (8x8, Q4_0's recipe) IQ4_NL
 * and MXFP4; AVX-512: Q2_K; rows in groups of 8. Dense matmuls and mul_mat_id alike. */
static inline int gguflm_repacks(int wtype, int64_t n_rows, int arith) {
    return n_rows % 8 == 0 &&
           (wtype == GGUFLM_Q4_0 || wtype == GGUFLM_Q4_K || wtype == GGUFLM_IQ4_NL || wtype == GGUFLM_MXFP4 ||
            (wtype == GGUFLM_Q2_K && gguflm_arith_avx512(arith)));
}

/* the repacked Q4_0 recipe, in either layout */
static inline int gguflm_q4_0_recipe(int path) { return path == GGUFLM_PATH_Q4_0_REPACK || path == GGUFLM_PATH_Q4_0_ROWS16; }

static inline int gguflm_matmul_plan(int wtype, int64_t n_rows, int64_t w_stride, int64_t n_in, int64_t n_tok,
                                     int repacked, int arith, gguflm_segment seg[2]) {
    const int repack = repacked && gguflm_repacks(wtype, n_rows, arith);
    const int k_repack = wtype == GGUFLM_Q4_K || wtype == GGUFLM_Q2_K;
    if (repack && k_repack && n_tok > 3) {
        /* tokens go to the GEMM in groups of 4, the rest to the GEMV */
        const int64_t grouped = n_tok - n_tok % 4;
        seg[0] = (gguflm_segment){GGUFLM_PATH_Q4_K_GEMM, 0, grouped};
        seg[1] = (gguflm_segment){GGUFLM_PATH_Q4_K_GEMV, grouped, n_tok};
        return grouped < n_tok ? 2 : 1;
    }
    int path = GGUFLM_PATH_DOT;
    if (repack && repacked == GGUFLM_REPACKED_ROWS16 && gguflm_rows16_type(wtype)) path = GGUFLM_PATH_Q4_0_ROWS16;
    else if (repack) path = k_repack ? GGUFLM_PATH_Q4_K_GEMV : GGUFLM_PATH_Q4_0_REPACK;
    else if (gguflm_is_legacy(wtype) && n_tok == 1 && n_rows * w_stride >= GGUFLM_STREAM_BYTES)
        path = GGUFLM_PATH_DOT_STREAM;
    else if ((gguflm_is_kquant(wtype) || wtype == GGUFLM_IQ4_XS || gguflm_is_iq_grid(wtype)) && n_tok >= 8)
        path = GGUFLM_PATH_TILED;
    else if (wtype == GGUFLM_IQ4_NL && n_tok >= 2) path = GGUFLM_PATH_SGEMM;  /* tinyBLAS_Q0_AVX */
    else if (gguflm_is_float(wtype) && n_tok >= 2 && n_rows % 4 == 0 &&
             n_in % gguflm_float_step(gguflm_float_chain_of(GGUFLM_PATH_SGEMM, wtype, arith)) == 0)
        path = GGUFLM_PATH_SGEMM;  /* tinyBLAS::matmul's conditions; it declines other shapes */
    seg[0] = (gguflm_segment){path, 0, n_tok};
    return 1;
}

/* ======================= integer parts ======================= */

/* types whose partner is Q8_1 (they carry a min, applied through Q8_1's s = d*sum(qs)) */
static inline int gguflm_legacy_has_min(int type) { return type == GGUFLM_Q4_1 || type == GGUFLM_Q5_1; }
static inline int gguflm_k_has_min(int type) { return type == GGUFLM_Q2_K || type == GGUFLM_Q4_K || type == GGUFLM_Q5_K; }

/* The integers of one K super-block against one Q8_K block.
 * lanes:  ggml_vec_dot's int32 lanes of sc * (q - zero) * y, element e in lane (e % 32) / 4;
 *         Q6_K takes its -32 offset off each lane as 32 * (sc[2l] bsums[2l] + sc[2l+1] bsums[2l+1]).
 * part:   the same products summed per 64 elements (all four add up to the lanes' total).
 * mins:   mn[2l] bsums[2l] + mn[2l+1] bsums[2l+1], the min terms (16 elements per index). */
typedef struct {
    int32_t lanes[8], part[4], mins[8];
} gguflm_kints;

static inline void gguflm_k_ints(int type, const gguflm_kblock *kb, const block_q8_K *y, gguflm_kints *o) {
    const int lane_zero = type == GGUFLM_Q6_K ? 0 : kb->zero;
    memset(o, 0, sizeof(*o));
    for (int e = 0; e < QK_K; ++e) {
        const int32_t sy = kb->sc[e / 16] * y->qs[e];
        o->lanes[(e % 32) / 4] += sy * (kb->u[e] - lane_zero);
        o->part[e / 64] += sy * (kb->u[e] - kb->zero);
    }
    for (int l = 0; l < 8; ++l) {
        o->mins[l] = kb->mn[2 * l] * y->bsums[2 * l] + kb->mn[2 * l + 1] * y->bsums[2 * l + 1];
        if (type == GGUFLM_Q6_K) o->lanes[l] -= 32 * (kb->sc[2 * l] * y->bsums[2 * l] + kb->sc[2 * l + 1] * y->bsums[2 * l + 1]);
    }
}

static inline int32_t gguflm_sum8_i32(const int32_t v[8]) {
    int32_t s = 0;
    for (int l = 0; l < 8; ++l) s += v[l];
    return s;
}

/* ======================= float epilogues, shared by every ISA ======================= */

/* ggml_vec_dot_q4_K_q8_K folds its 4 min lanes as (m0 + m2) + (m1 + m3) */
static inline float gguflm_hsum4_movehl(const float m[4]) { return (m[0] + m[2]) + (m[1] + m[3]); }

/* TILED, per super-block: the weight row's res = d*s1 - dmin*s2 (fused), then out += res*y.d */
static inline float gguflm_tiled_step(int has_min, float d, float dmin, int32_t s1, int32_t s2, float yd, float out) {
    float res = d * (float)s1;
    if (has_min) res = fmaf(-dmin, (float)s2, res);
    return fmaf(res, yd, out);
}

#include "quants_lut_dot.h"  /* issue 15's value-table and ternary formats */

/* batches of at least this many tokens take the AVX-512 strips of the legacy and ternary types
 * (quants_strips_avx512.inc), whose decoding of 16 rows at a time pays from there on (one thread,
 * 4096x4096: the legacy blocks 0.75-0.9x the 2-row tiles' speed at 8 tokens, 1.05-1.4x at 16,
 * 1.4-1.6x at 32 and up; at 8 tokens TQ1_0 1.3x its one-row tiles, TQ2_0 1.03-1.05x) */
static inline int64_t gguflm_strip_tokens(int type) { return gguflm_is_ternary(type) ? 8 : 16; }

/* ======================= scalar reference kernels (one output) ======================= */

static inline __attribute__((always_inline)) float gguflm_dot_legacy_1(int type, size_t bx, int64_t n, const uint8_t *x,
                                                                      const uint8_t *y) {
    const int has_min = gguflm_legacy_has_min(type);
    const size_t by = has_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    gguflm_legacy_block xb;
    float acc[8] = {0}, summs = 0.0f;
    for (int64_t ib = 0; ib < n / 32; ++ib) {
        const uint8_t *yb = y + ib * by;
        const int8_t *yq = (const int8_t *)(yb + (has_min ? 4 : 2));
        gguflm_legacy_unpack(type, x + ib * bx, &xb);
        const float d = xb.d * gguflm_fp16_to_fp32(*(const ggml_half *)yb);
        for (int l = 0; l < 8; ++l) {
            int32_t lane = 0;
            for (int j = 4 * l; j < 4 * l + 4; ++j) lane += xb.v[j] * yq[j];
            acc[l] = fmaf(d, (float)lane, acc[l]);
        }
        if (has_min) summs = fmaf(xb.m, gguflm_fp16_to_fp32(((const block_q8_1 *)yb)->s), summs);
    }
    return gguflm_hsum8_movehl(acc) + summs;
}

static inline __attribute__((always_inline)) float gguflm_dot_k_1(int type, size_t bx, int64_t n, const uint8_t *x,
                                                                 const block_q8_K *y) {
    gguflm_kblock kb;
    gguflm_kints in;
    float acc[8] = {0}, acc_m[4] = {0}, summs = 0.0f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        gguflm_kunpack(type, x + i * bx, &kb);
        gguflm_k_ints(type, &kb, &y[i], &in);
        const float d = y[i].d * kb.d, dmin = -y[i].d * kb.dmin;
        if (type == GGUFLM_Q2_K) {
            for (int l = 0; l < 8; ++l) acc[l] = fmaf(dmin, (float)in.mins[l], acc[l]);
        } else if (type == GGUFLM_Q4_K) {
            for (int m = 0; m < 4; ++m) acc_m[m] = fmaf(dmin, (float)(in.mins[2 * m] + in.mins[2 * m + 1]), acc_m[m]);
        } else if (type == GGUFLM_Q5_K) {
            summs = fmaf((float)gguflm_sum8_i32(in.mins), dmin, summs);
        }
        for (int l = 0; l < 8; ++l) acc[l] = fmaf(d, (float)in.lanes[l], acc[l]);
    }
    return gguflm_hsum8_movehl(acc) + (type == GGUFLM_Q4_K ? gguflm_hsum4_movehl(acc_m) : summs);
}

static inline __attribute__((always_inline)) float gguflm_tiled_1(int type, size_t bx, int64_t n, const uint8_t *x,
                                                                 const block_q8_K *y) {
    gguflm_kblock kb;
    gguflm_kints in;
    float out = 0.0f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        gguflm_kunpack(type, x + i * bx, &kb);
        gguflm_k_ints(type, &kb, &y[i], &in);
        out = gguflm_tiled_step(gguflm_k_has_min(type), kb.d, kb.dmin, gguflm_sum8_i32(in.lanes),
                                gguflm_sum8_i32(in.mins), y[i].d, out);
    }
    return out;
}

/* integer sums per super-block of repacked Q4_K / Q2_K: GEMV 1; GEMM 4 (Q4_K, per 64 elements) or
 * 2 (Q2_K, per 128) */
static inline int gguflm_k_repack_parts(int path, int type) {
    return path == GGUFLM_PATH_Q4_K_GEMV ? 1 : type == GGUFLM_Q4_K ? 4 : 2;
}

static inline float gguflm_k_repack_1(int type, int parts, int64_t n, const uint8_t *x, const block_q8_K *y) {
    const size_t bx = type == GGUFLM_Q4_K ? sizeof(block_q4_K) : sizeof(block_q2_K);
    gguflm_kblock kb;
    gguflm_kints in;
    float acc = 0.0f, acc_min = 0.0f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        gguflm_kunpack(type, x + i * bx, &kb);
        gguflm_k_ints(type, &kb, &y[i], &in);
        const float scale = kb.d * y[i].d, scale_min = kb.dmin * y[i].d;
        for (int p = 0; p < parts; ++p) {
            int32_t sum = 0, min = 0;
            for (int j = 4 / parts * p; j < 4 / parts * (p + 1); ++j) sum += in.part[j];
            for (int j = 8 / parts * p; j < 8 / parts * (p + 1); ++j) min += in.mins[j];
            acc = fmaf((float)sum, scale, acc);
            acc_min = fmaf((float)min, scale_min, acc_min);
        }
    }
    return acc - acc_min;
}

static inline float gguflm_q4_0_repack_1(int64_t n, const uint8_t *x, const block_q8_0 *y) {
    gguflm_legacy_block xb;
    float acc = 0.0f;
    for (int64_t ib = 0; ib < n / 32; ++ib) {
        gguflm_legacy_unpack(GGUFLM_Q4_0, x + ib * sizeof(block_q4_0), &xb);
        int32_t sum = 0;
        for (int j = 0; j < 32; ++j) sum += xb.v[j] * y[ib].qs[j];
        acc = fmaf((float)sum, xb.d * gguflm_fp16_to_fp32(y[ib].d), acc);
    }
    return acc;
}

/* ======================= float weights (F32, F16, BF16) ======================= */

/* one element of a float-format row */
static inline __attribute__((always_inline)) float gguflm_float_at(int type, const void *p, int64_t i) {
    if (type == GGUFLM_F16) return gguflm_fp16_to_fp32(((const ggml_half *)p)[i]);
    if (type == GGUFLM_BF16) return gguflm_bf16_to_fp32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* vdpbf16ps, one lane (Intel SDM: an FMA "with daz, ftz, rne, and sae"; checked against the
 * instruction, which the avx512bf16 ISA's kernels and the local ggml-cpu run, by
 * tests/test_quants_kernels.py and test_quants_exact.py): acc += x1*y1, then acc += x0*y0 (the odd
 * element of the pair first), each fused and rounded to nearest even, denormal inputs read as
 * zeros and results that are tiny flushed to zeros, signs kept. Tiny is decided after rounding to
 * 24 bits with an unbounded exponent: the same fma on operands scaled by 2^24 rounds that way
 * near the smallest normal, and it is tiny when below 2^-102 (the scalings are exact, or
 * overflow where the result is far from tiny). acc itself is never denormal: the chains start
 * at zero and only take flushed results. */
static inline float gguflm_daz(float x) {
    const uint32_t b = gguflm_f32_bits(x);
    return (b & 0x7f800000u) ? x : gguflm_bits_f32(b & 0x80000000u);
}

static inline float gguflm_fma_ftz(float a, float b, float c) {
    const float r = fmaf(a, b, c), scaled = fmaf(a * 0x1p24f, b, c * 0x1p24f);
    return fabsf(scaled) < 0x1p-102f ? gguflm_bits_f32(gguflm_f32_bits(r) & 0x80000000u) : r;
}

static inline float gguflm_dpbf16(float acc, float x0, float x1, float y0, float y1) {
    acc = gguflm_fma_ftz(gguflm_daz(x1), gguflm_daz(y1), acc);
    return gguflm_fma_ftz(gguflm_daz(x0), gguflm_daz(y0), acc);
}

/* The sum of a chain's accumulator lanes acc (vector-major), as the build reduces them (DOT of
 * F16 and BF16 goes on in double). The SIMD kernels reduce in registers in the same order. */
static inline double gguflm_float_reduce(int path, int type, int arith, const float *acc) {
    const int lanes = gguflm_vec_lanes(arith);
    if (path == GGUFLM_PATH_SGEMM) return gguflm_hsum_vec(acc, lanes);
    if (type == GGUFLM_BF16 && lanes == 16) return (double)gguflm_hsum16(acc) + (double)gguflm_hsum16(acc + 16);
    float v[16];
    for (int l = 0; l < lanes; ++l) v[l] = (acc[l] + acc[2 * lanes + l]) + (acc[lanes + l] + acc[3 * lanes + l]);
    if (lanes == 16) return gguflm_hsum16(v);
    return type == GGUFLM_BF16 ? gguflm_hsum8_movehl(v) : gguflm_hsum8_hadd(v);
}

/* DOT after the whole steps (elements np .. n-1 of x . y, sum: the reduced steps): F16 and BF16
 * add the float products in double; F32 adds them in float as GCC vectorized that loop (see
 * gguflm_dot_f32_unfused) */
static inline __attribute__((always_inline)) float gguflm_float_tail(int type, int arith, int64_t n, int64_t np,
                                                                    const void *x, const void *y, double sum) {
    if (type != GGUFLM_F32) {
        for (int64_t i = np; i < n; ++i) sum += (double)(gguflm_float_at(type, x, i) * gguflm_float_at(type, y, i));
        return (float)sum;
    }
    const int64_t r = n - np, unfused = gguflm_dot_f32_unfused((int)r, arith);
    float s = (float)sum;
    for (int64_t k = 0; k < r; ++k) {
        const float a = ((const float *)x)[np + k], b = ((const float *)y)[np + k];
        s = k < unfused ? s + a * b : fmaf(a, b, s);
    }
    return s;
}

/* one output of a float recipe (DOT or SGEMM) */
static inline __attribute__((always_inline)) float gguflm_float_1(int path, int type, int arith, int64_t n,
                                                                 const void *x, const void *y) {
    const gguflm_float_chain c = gguflm_float_chain_of(path, type, arith);
    const int width = c.lanes * (1 + c.pairs), step = gguflm_float_step(c);
    const int64_t np = n - n % step;
    float acc[GGUFLM_FLOAT_ACC] = {0};
    for (int64_t i = 0; i < np; i += step)
        for (int v = 0; v < c.vecs; ++v)
            for (int l = 0; l < c.lanes; ++l) {
                const int64_t e = i + v * width + l * (1 + c.pairs);
                float *a = &acc[v * c.lanes + l];
                if (c.pairs)
                    *a = gguflm_dpbf16(*a, gguflm_float_at(type, x, e), gguflm_float_at(type, x, e + 1),
                                       gguflm_float_at(type, y, e), gguflm_float_at(type, y, e + 1));
                else
                    *a = fmaf(gguflm_float_at(type, x, e), gguflm_float_at(type, y, e), *a);
            }
    return gguflm_float_tail(type, arith, n, np, x, y, gguflm_float_reduce(path, type, arith, acc));
}

/* one output of `path` for weight type `type` (bx bytes per weight block) */
static inline __attribute__((always_inline)) float gguflm_recipe_1(int path, int type, int arith, size_t bx,
                                                                  int64_t n, const uint8_t *x, const uint8_t *y) {
    if (gguflm_is_float(type)) return gguflm_float_1(path, type, arith, n, x, y);
    if (gguflm_is_lut(type)) return gguflm_lut_recipe_1(path, type, arith, n, x, y);
    switch (path) {
    case GGUFLM_PATH_TILED: return gguflm_tiled_1(type, bx, n, x, (const block_q8_K *)y);
    case GGUFLM_PATH_Q4_K_GEMV:
    case GGUFLM_PATH_Q4_K_GEMM: return gguflm_k_repack_1(type, gguflm_k_repack_parts(path, type), n, x, (const block_q8_K *)y);
    case GGUFLM_PATH_Q4_0_REPACK: return gguflm_q4_0_repack_1(n, x, (const block_q8_0 *)y);
    default:
        if (gguflm_is_kquant(type)) return gguflm_dot_k_1(type, bx, n, x, (const block_q8_K *)y);
        return gguflm_dot_legacy_1(type, bx, n, x, y);
    }
}

static inline __attribute__((always_inline)) void gguflm_gemm_scalar(int path, int type, size_t bx, int64_t n,
                                                                    const uint8_t *w, int64_t w_stride, int64_t nr,
                                                                    const uint8_t *y, int64_t y_stride, int64_t nt,
                                                                    float *out, int64_t out_stride, int arith) {
    for (int64_t t = 0; t < nt; ++t)
        for (int64_t r = 0; r < nr; ++r)
            out[t * out_stride + r] = gguflm_recipe_1(path, type, arith, bx, n, w + r * w_stride, y + t * y_stride);
}

/* Q4_0_ROWS16: each row read back to the file's layout, then Q4_0_REPACK's recipe (rows come in
 * whole groups of 16, w at a group's start) */
static inline __attribute__((always_inline)) void gguflm_rows16_scalar(int type, int64_t n, const uint8_t *w, int64_t ws,
                                                                      int64_t nr, const uint8_t *y, int64_t ys, int64_t nt,
                                                                      float *out, int64_t os, int arith) {
    uint8_t row[ws];
    for (int64_t r = 0; r < nr; ++r) {
        gguflm_rows16_row(type, 0, (uint8_t *)w + (r - r % GGUFLM_ROWS16) * ws, (int)(r % GGUFLM_ROWS16), ws, row);
        for (int64_t t = 0; t < nt; ++t)
            out[t * os + r] = gguflm_recipe_1(GGUFLM_PATH_Q4_0_REPACK, type, arith, (size_t)gguflm_rows16_bx(type), n, row,
                                              y + t * ys);
    }
}

/* the scalar kernel table: [path][type], NULL where llama.cpp has no such recipe */
#define GGUFLM_SCALAR_KERNEL(path, tag, TYPE, bx)                                                                \
    static void gguflm_##path##_##tag##_scalar(int64_t n, const uint8_t *w, int64_t ws, int64_t nr,            \
                                               const uint8_t *y, int64_t ys, int64_t nt, float *o, int64_t os,  \
                                               int arith) {                                                     \
        gguflm_gemm_scalar(GGUFLM_PATH_##path, TYPE, bx, n, w, ws, nr, y, ys, nt, o, os, arith);                \
    }
#define GGUFLM_SCALAR_KERNELS_K(tag, TYPE)                             \
    GGUFLM_SCALAR_KERNEL(DOT, tag, TYPE, sizeof(block_##tag))          \
    GGUFLM_SCALAR_KERNEL(TILED, tag, TYPE, sizeof(block_##tag))
#define GGUFLM_SCALAR_KERNELS_LEGACY(tag, TYPE)                        \
    GGUFLM_SCALAR_KERNEL(DOT, tag, TYPE, sizeof(block_##tag))          \
    GGUFLM_SCALAR_KERNEL(DOT_STREAM, tag, TYPE, sizeof(block_##tag))
GGUFLM_SCALAR_KERNELS_LEGACY(q4_0, GGUFLM_Q4_0)
GGUFLM_SCALAR_KERNELS_LEGACY(q4_1, GGUFLM_Q4_1)
GGUFLM_SCALAR_KERNELS_LEGACY(q5_0, GGUFLM_Q5_0)
GGUFLM_SCALAR_KERNELS_LEGACY(q5_1, GGUFLM_Q5_1)
GGUFLM_SCALAR_KERNELS_LEGACY(q8_0, GGUFLM_Q8_0)
GGUFLM_SCALAR_KERNELS_K(q2_K, GGUFLM_Q2_K)
GGUFLM_SCALAR_KERNELS_K(q3_K, GGUFLM_Q3_K)
GGUFLM_SCALAR_KERNELS_K(q4_K, GGUFLM_Q4_K)
GGUFLM_SCALAR_KERNELS_K(q5_K, GGUFLM_Q5_K)
GGUFLM_SCALAR_KERNELS_K(q6_K, GGUFLM_Q6_K)
GGUFLM_SCALAR_KERNEL(Q4_K_GEMV, q4_K, GGUFLM_Q4_K, sizeof(block_q4_K))
GGUFLM_SCALAR_KERNEL(Q4_K_GEMM, q4_K, GGUFLM_Q4_K, sizeof(block_q4_K))
GGUFLM_SCALAR_KERNEL(Q4_K_GEMV, q2_K, GGUFLM_Q2_K, sizeof(block_q2_K))
GGUFLM_SCALAR_KERNEL(Q4_K_GEMM, q2_K, GGUFLM_Q2_K, sizeof(block_q2_K))
GGUFLM_SCALAR_KERNEL(Q4_0_REPACK, q4_0, GGUFLM_Q4_0, sizeof(block_q4_0))
GGUFLM_SCALAR_KERNEL(DOT, f32, GGUFLM_F32, 4)
GGUFLM_SCALAR_KERNEL(DOT, f16, GGUFLM_F16, 2)
GGUFLM_SCALAR_KERNEL(DOT, bf16, GGUFLM_BF16, 2)
GGUFLM_SCALAR_KERNEL(SGEMM, f32, GGUFLM_F32, 4)
GGUFLM_SCALAR_KERNEL(SGEMM, f16, GGUFLM_F16, 2)
GGUFLM_SCALAR_KERNEL(SGEMM, bf16, GGUFLM_BF16, 2)
/* issue 15's value-table and ternary formats */
GGUFLM_SCALAR_KERNEL(DOT, iq4_nl, GGUFLM_IQ4_NL, sizeof(block_iq4_nl))
GGUFLM_SCALAR_KERNEL(SGEMM, iq4_nl, GGUFLM_IQ4_NL, sizeof(block_iq4_nl))
GGUFLM_SCALAR_KERNEL(Q4_0_REPACK, iq4_nl, GGUFLM_IQ4_NL, sizeof(block_iq4_nl))
GGUFLM_SCALAR_KERNEL(DOT, mxfp4, GGUFLM_MXFP4, sizeof(block_mxfp4))
GGUFLM_SCALAR_KERNEL(Q4_0_REPACK, mxfp4, GGUFLM_MXFP4, sizeof(block_mxfp4))
#define GGUFLM_SCALAR_ROWS16(tag, TYPE)                                                                          \
    static void gguflm_Q4_0_ROWS16_##tag##_scalar(int64_t n, const uint8_t *w, int64_t ws, int64_t nr,          \
                                                  const uint8_t *y, int64_t ys, int64_t nt, float *o, int64_t os, \
                                                  int arith) {                                                    \
        gguflm_rows16_scalar(TYPE, n, w, ws, nr, y, ys, nt, o, os, arith);                                       \
    }
GGUFLM_SCALAR_ROWS16(q4_0, GGUFLM_Q4_0)
GGUFLM_SCALAR_ROWS16(iq4_nl, GGUFLM_IQ4_NL)
GGUFLM_SCALAR_ROWS16(mxfp4, GGUFLM_MXFP4)
#undef GGUFLM_SCALAR_ROWS16
GGUFLM_SCALAR_KERNEL(DOT, iq4_xs, GGUFLM_IQ4_XS, sizeof(block_iq4_xs))
GGUFLM_SCALAR_KERNEL(TILED, iq4_xs, GGUFLM_IQ4_XS, sizeof(block_iq4_xs))
GGUFLM_SCALAR_KERNEL(DOT, tq1_0, GGUFLM_TQ1_0, sizeof(block_tq1_0))
GGUFLM_SCALAR_KERNEL(DOT, tq2_0, GGUFLM_TQ2_0, sizeof(block_tq2_0))
#undef GGUFLM_SCALAR_KERNELS_K
#undef GGUFLM_SCALAR_KERNELS_LEGACY
#undef GGUFLM_SCALAR_KERNEL

/* a [path][type] table of kernels named gguflm_<PATH>_<tag><suffix> */
#define GGUFLM_KERNEL_TABLE(suffix)                                                                              \
    {                                                                                                            \
        [GGUFLM_PATH_DOT] = {[GGUFLM_F32] = gguflm_DOT_f32##suffix, [GGUFLM_F16] = gguflm_DOT_f16##suffix,       \
                             [GGUFLM_BF16] = gguflm_DOT_bf16##suffix, [GGUFLM_Q4_0] = gguflm_DOT_q4_0##suffix,   \
                             [GGUFLM_Q4_1] = gguflm_DOT_q4_1##suffix, [GGUFLM_Q5_0] = gguflm_DOT_q5_0##suffix,   \
                             [GGUFLM_Q5_1] = gguflm_DOT_q5_1##suffix, [GGUFLM_Q8_0] = gguflm_DOT_q8_0##suffix,   \
                             [GGUFLM_Q2_K] = gguflm_DOT_q2_K##suffix, [GGUFLM_Q3_K] = gguflm_DOT_q3_K##suffix,   \
                             [GGUFLM_Q4_K] = gguflm_DOT_q4_K##suffix, [GGUFLM_Q5_K] = gguflm_DOT_q5_K##suffix,   \
                             [GGUFLM_Q6_K] = gguflm_DOT_q6_K##suffix},                                           \
        [GGUFLM_PATH_TILED] = {[GGUFLM_Q2_K] = gguflm_TILED_q2_K##suffix, [GGUFLM_Q3_K] = gguflm_TILED_q3_K##suffix, \
                               [GGUFLM_Q4_K] = gguflm_TILED_q4_K##suffix, [GGUFLM_Q5_K] = gguflm_TILED_q5_K##suffix, \
                               [GGUFLM_Q6_K] = gguflm_TILED_q6_K##suffix},                                       \
        [GGUFLM_PATH_Q4_K_GEMV] = {[GGUFLM_Q4_K] = gguflm_Q4_K_GEMV_q4_K##suffix,                               \
                                   [GGUFLM_Q2_K] = gguflm_Q4_K_GEMV_q2_K##suffix},                              \
        [GGUFLM_PATH_Q4_K_GEMM] = {[GGUFLM_Q4_K] = gguflm_Q4_K_GEMM_q4_K##suffix,                               \
                                   [GGUFLM_Q2_K] = gguflm_Q4_K_GEMM_q2_K##suffix},                              \
        [GGUFLM_PATH_Q4_0_REPACK] = {[GGUFLM_Q4_0] = gguflm_Q4_0_REPACK_q4_0##suffix},                          \
        [GGUFLM_PATH_SGEMM] = {[GGUFLM_F32] = gguflm_SGEMM_f32##suffix, [GGUFLM_F16] = gguflm_SGEMM_f16##suffix, \
                               [GGUFLM_BF16] = gguflm_SGEMM_bf16##suffix},                                       \
        [GGUFLM_PATH_DOT_STREAM] = {[GGUFLM_Q4_0] = gguflm_DOT_STREAM_q4_0##suffix,                              \
                                    [GGUFLM_Q4_1] = gguflm_DOT_STREAM_q4_1##suffix,                              \
                                    [GGUFLM_Q5_0] = gguflm_DOT_STREAM_q5_0##suffix,                              \
                                    [GGUFLM_Q5_1] = gguflm_DOT_STREAM_q5_1##suffix,                              \
                                    [GGUFLM_Q8_0] = gguflm_DOT_STREAM_q8_0##suffix},                             \
        GGUFLM_IQ_KERNEL_ENTRIES(suffix)                                                                         \
        GGUFLM_LUT_KERNEL_ENTRIES(suffix)                                                                        \
    }

/* issue 15's value-table and ternary formats (nested designators: they add to the rows above) */
#define GGUFLM_LUT_KERNEL_ENTRIES(suffix)                                                                        \
    [GGUFLM_PATH_DOT][GGUFLM_IQ4_NL] = gguflm_DOT_iq4_nl##suffix, [GGUFLM_PATH_DOT][GGUFLM_MXFP4] = gguflm_DOT_mxfp4##suffix, \
    [GGUFLM_PATH_DOT][GGUFLM_IQ4_XS] = gguflm_DOT_iq4_xs##suffix, [GGUFLM_PATH_DOT][GGUFLM_TQ1_0] = gguflm_DOT_tq1_0##suffix, \
    [GGUFLM_PATH_DOT][GGUFLM_TQ2_0] = gguflm_DOT_tq2_0##suffix,                                                  \
    [GGUFLM_PATH_TILED][GGUFLM_IQ4_XS] = gguflm_TILED_iq4_xs##suffix,                                            \
    [GGUFLM_PATH_SGEMM][GGUFLM_IQ4_NL] = gguflm_SGEMM_iq4_nl##suffix,                                            \
    [GGUFLM_PATH_Q4_0_REPACK][GGUFLM_IQ4_NL] = gguflm_Q4_0_REPACK_iq4_nl##suffix,                                \
    [GGUFLM_PATH_Q4_0_REPACK][GGUFLM_MXFP4] = gguflm_Q4_0_REPACK_mxfp4##suffix,                                  \
    [GGUFLM_PATH_Q4_0_ROWS16][GGUFLM_Q4_0] = gguflm_Q4_0_ROWS16_q4_0##suffix,                                    \
    [GGUFLM_PATH_Q4_0_ROWS16][GGUFLM_IQ4_NL] = gguflm_Q4_0_ROWS16_iq4_nl##suffix,                                \
    [GGUFLM_PATH_Q4_0_ROWS16][GGUFLM_MXFP4] = gguflm_Q4_0_ROWS16_mxfp4##suffix,

static const gguflm_gemm_fn gguflm_kernels_scalar[GGUFLM_PATH_COUNT][GGUFLM_TYPE_COUNT] = GGUFLM_KERNEL_TABLE(_scalar);

#endif
