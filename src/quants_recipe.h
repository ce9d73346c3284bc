/* The matmul recipes of llama.cpp's CPU backend, bit for bit: their names (the paths), which of them
 * a matmul takes (gguflm_matmul_plan, ggml's routing), the one kernel signature, and the integer and
 * float steps the portable references share (quants_dot.h, quants_lut_dot.h, quants_iq_dot.h).
 *
 * ggml-cpu (x86) computes a weight row . activation row in one of these ways, which round
 * differently (each checked against llama-cpp-python 0.3.36's libggml-cpu, AVX2 and AVX-512
 * builds, whose kernels GCC compiled with -ffp-contract=fast: fmaf() in the references marks every
 * FMA it emitted):
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
#ifndef GGUFLM_QUANTS_RECIPE_H
#define GGUFLM_QUANTS_RECIPE_H

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

/* The recipes of a one-token matmul for each of n_tok tokens (gguflm's own, for checking drafted
 * tokens: llama.cpp's batches take the batch recipes above): each token's products round as its
 * one-token decode's. DOT_STREAM is DOT's arithmetic in another row order. */
static inline int gguflm_matmul_plan_per_token(int wtype, int64_t n_rows, int64_t w_stride, int64_t n_in,
                                               int64_t n_tok, int repacked, int arith, gguflm_segment seg[2]) {
    const int n_seg = gguflm_matmul_plan(wtype, n_rows, w_stride, n_in, 1, repacked, arith, seg);
    if (seg[0].path == GGUFLM_PATH_DOT_STREAM && n_tok > 1) seg[0].path = GGUFLM_PATH_DOT;
    seg[0].t1 = n_tok;
    return n_seg;
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

#endif
