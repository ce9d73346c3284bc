/* The kernel API other modules call with the GIL released: type traits, the kernel tables of each
 * ISA, activation quantization, matmul and get_rows.
 *
 * Nothing here keeps state: the entry points that pick kernels take the ISA (GGUFLM_ISA_*) as an
 * argument, which callers read from gguflm._ext.system's one switch when a call starts (see
 * dispatch.h). Functions assume valid arguments (the Python wrappers in quants.pyx check them):
 * type ids with a dot kernel, lengths a multiple of the block size, an ISA this CPU runs, buffers
 * of the sizes given by gguflm_row_bytes and gguflm_act_buffer_bytes.
 */
#ifndef GGUFLM_QUANTS_KERNELS_H
#define GGUFLM_QUANTS_KERNELS_H

#include <stdlib.h>
#include "omp_compat.h"
#include "quants_simd.h"
#include "quants_iq_quantize.h"
#include "quants_imatrix.h"
#include "quants_tq_held.h"

typedef void (*gguflm_to_float_fn)(const void *x, float *y, int64_t k);
typedef void (*gguflm_from_float_fn)(const float *x, void *y, int64_t k);

typedef struct {
    const char *name;
    int block_size;                      /* 0: not a type the kernels handle */
    int type_size;                       /* bytes per block */
    int vec_dot_type;                    /* partner type of the activations; -1: no dot (Q8_1, Q8_K) */
    gguflm_to_float_fn to_float;
    gguflm_from_float_fn from_float;     /* weights: ggml's reference quantizer */
    gguflm_from_float_fn from_float_act; /* activations: what ggml's CPU backend uses for src1 */
} gguflm_type_traits;

static const gguflm_type_traits gguflm_traits[GGUFLM_TYPE_COUNT] = {
    [GGUFLM_F32] = {"F32", 1, 4, GGUFLM_F32, gguflm_dequantize_row_f32, gguflm_quantize_row_f32, gguflm_quantize_row_f32},
    [GGUFLM_F16] = {"F16", 1, 2, GGUFLM_F16, gguflm_dequantize_row_f16, gguflm_quantize_row_f16, gguflm_quantize_row_f16},
    [GGUFLM_BF16] = {"BF16", 1, 2, GGUFLM_BF16, gguflm_dequantize_row_bf16, gguflm_quantize_row_bf16, gguflm_quantize_row_bf16},
    [GGUFLM_Q4_0] = {"Q4_0", 32, 18, GGUFLM_Q8_0, gguflm_dequantize_row_q4_0, gguflm_quantize_row_q4_0, gguflm_quantize_row_q4_0},
    [GGUFLM_Q4_1] = {"Q4_1", 32, 20, GGUFLM_Q8_1, gguflm_dequantize_row_q4_1, gguflm_quantize_row_q4_1, gguflm_quantize_row_q4_1},
    [GGUFLM_Q5_0] = {"Q5_0", 32, 22, GGUFLM_Q8_0, gguflm_dequantize_row_q5_0, gguflm_quantize_row_q5_0, gguflm_quantize_row_q5_0},
    [GGUFLM_Q5_1] = {"Q5_1", 32, 24, GGUFLM_Q8_1, gguflm_dequantize_row_q5_1, gguflm_quantize_row_q5_1, gguflm_quantize_row_q5_1},
    [GGUFLM_Q8_0] = {"Q8_0", 32, 34, GGUFLM_Q8_0, gguflm_dequantize_row_q8_0, gguflm_quantize_row_q8_0, gguflm_quantize_act_q8_0},
    [GGUFLM_Q8_1] = {"Q8_1", 32, 36, -1, gguflm_dequantize_row_q8_1, gguflm_quantize_row_q8_1, gguflm_quantize_act_q8_1},
    [GGUFLM_Q2_K] = {"Q2_K", 256, 84, GGUFLM_Q8_K, gguflm_dequantize_row_q2_K, gguflm_quantize_row_q2_K, gguflm_quantize_row_q2_K},
    [GGUFLM_Q3_K] = {"Q3_K", 256, 110, GGUFLM_Q8_K, gguflm_dequantize_row_q3_K, gguflm_quantize_row_q3_K, gguflm_quantize_row_q3_K},
    [GGUFLM_Q4_K] = {"Q4_K", 256, 144, GGUFLM_Q8_K, gguflm_dequantize_row_q4_K, gguflm_quantize_row_q4_K, gguflm_quantize_row_q4_K},
    [GGUFLM_Q5_K] = {"Q5_K", 256, 176, GGUFLM_Q8_K, gguflm_dequantize_row_q5_K, gguflm_quantize_row_q5_K, gguflm_quantize_row_q5_K},
    [GGUFLM_Q6_K] = {"Q6_K", 256, 210, GGUFLM_Q8_K, gguflm_dequantize_row_q6_K, gguflm_quantize_row_q6_K, gguflm_quantize_row_q6_K},
    [GGUFLM_Q8_K] = {"Q8_K", 256, 292, -1, gguflm_dequantize_row_q8_K, gguflm_quantize_row_q8_K, gguflm_quantize_row_q8_K},
    /* grid i-quants (quants_iq_dot.h, quants_iq_quantize.h); IQ2_XXS, IQ2_XS, IQ1_S: importance weights needed */
    [GGUFLM_IQ2_XXS] = {"IQ2_XXS", 256, 66, GGUFLM_Q8_K, gguflm_dequantize_row_iq2_xxs, NULL, NULL},
    [GGUFLM_IQ2_XS] = {"IQ2_XS", 256, 74, GGUFLM_Q8_K, gguflm_dequantize_row_iq2_xs, NULL, NULL},
    [GGUFLM_IQ2_S] = {"IQ2_S", 256, 82, GGUFLM_Q8_K, gguflm_dequantize_row_iq2_s, gguflm_quantize_row_iq2_s, gguflm_quantize_row_iq2_s},
    [GGUFLM_IQ3_XXS] = {"IQ3_XXS", 256, 98, GGUFLM_Q8_K, gguflm_dequantize_row_iq3_xxs, gguflm_quantize_row_iq3_xxs, gguflm_quantize_row_iq3_xxs},
    [GGUFLM_IQ3_S] = {"IQ3_S", 256, 110, GGUFLM_Q8_K, gguflm_dequantize_row_iq3_s, gguflm_quantize_row_iq3_s, gguflm_quantize_row_iq3_s},
    [GGUFLM_IQ1_S] = {"IQ1_S", 256, 50, GGUFLM_Q8_K, gguflm_dequantize_row_iq1_s, NULL, NULL},
    [GGUFLM_IQ1_M] = {"IQ1_M", 256, 56, GGUFLM_Q8_K, gguflm_dequantize_row_iq1_m, gguflm_quantize_row_iq1_m, gguflm_quantize_row_iq1_m},
    /* the value-table and ternary formats */
    [GGUFLM_IQ4_NL] = {"IQ4_NL", 32, 18, GGUFLM_Q8_0, gguflm_dequantize_row_iq4_nl, gguflm_quantize_row_iq4_nl, gguflm_quantize_row_iq4_nl},
    [GGUFLM_IQ4_XS] = {"IQ4_XS", 256, 136, GGUFLM_Q8_K, gguflm_dequantize_row_iq4_xs, gguflm_quantize_row_iq4_xs, gguflm_quantize_row_iq4_xs},
    [GGUFLM_TQ1_0] = {"TQ1_0", 256, 54, GGUFLM_Q8_K, gguflm_dequantize_row_tq1_0, gguflm_quantize_row_tq1_0, gguflm_quantize_row_tq1_0},
    [GGUFLM_TQ2_0] = {"TQ2_0", 256, 66, GGUFLM_Q8_K, gguflm_dequantize_row_tq2_0, gguflm_quantize_row_tq2_0, gguflm_quantize_row_tq2_0},
    [GGUFLM_MXFP4] = {"MXFP4", 32, 17, GGUFLM_Q8_0, gguflm_dequantize_row_mxfp4, gguflm_quantize_row_mxfp4, gguflm_quantize_row_mxfp4},
};

static inline int gguflm_type_known(int type) {
    return type >= 0 && type < GGUFLM_TYPE_COUNT && gguflm_traits[type].block_size > 0;
}

/* bytes of n elements of type, or -1 when n is not a whole number of blocks */
static inline int64_t gguflm_row_bytes(int type, int64_t n) {
    const gguflm_type_traits *t = &gguflm_traits[type];
    if (n < 0 || n % t->block_size) return -1;
    return n / t->block_size * t->type_size;
}

/* scratch for n_tok activation rows of n_in elements quantized to vec_dot_type */
static inline int64_t gguflm_act_buffer_bytes(int vec_dot_type, int64_t n_tok, int64_t n_in) {
    const int64_t row = gguflm_row_bytes(vec_dot_type, n_in);
    return row < 0 ? -1 : row * n_tok;
}

/* ======================= ISA dispatch ======================= */

/* the [path][type] kernel table of isa; scalar where this build has no SIMD variants (off x86,
 * where the system module never selects another ISA) */
static inline const gguflm_gemm_fn (*gguflm_kernel_table(int isa))[GGUFLM_TYPE_COUNT] {
#if GGUFLM_HAVE_SIMD
    if (isa >= GGUFLM_ISA_AVX512) return gguflm_kernels_avx512;
    if (isa == GGUFLM_ISA_AVX2) return gguflm_kernels_avx2;
#endif
    (void)isa;
    return gguflm_kernels_scalar;
}

/* whether type's VBMI kernels are the faster ones on this machine's cores. On Intel's, only for the
 * grids they look up with few permutes (IQ2_XXS, IQ3_XXS, IQ3_S: 2-4 vpermi2b a plane): IQ2_S's
 * 1024-entry grid takes 16 (two cycles each of the one shuffle port), and the VBMI kernels load
 * IQ2_XS's and IQ1's entries one by one, where the AVX-512 kernels gather them (quants_iq_avx512.inc:
 * iq512_mag; single token, cycles a super-block, VBMI -> AVX-512 kernels: IQ2_S 59 -> 37-46,
 * IQ1_S 55 -> 47, IQ2_XS and IQ1_M level; Xeon with AMX). On AMD's Zen 4 gathers ran 3x slower
 * than loads and IQ2_S's lookups 1.4x faster than its loads. */
static inline int gguflm_vbmi_pays(int type) {
    return gguflm_bound_dispatch->vendor != GGUFLM_VENDOR_INTEL || type == GGUFLM_IQ2_XXS || type == GGUFLM_IQ3_XXS ||
           type == GGUFLM_IQ3_S;
}

/* whether the AVX2 kernels that gather the 3-bit grids' entries (gguflm_iq_kernels_avx2gather) are
 * the faster ones: on Intel's cores, where the 8 inserts a group wait on the one shuffle port
 * (single token, cycles a super-block: IQ3_XXS 76 -> 57, IQ3_S 99 -> 58; Xeon with AMX, GGUFLM_ISA=avx2);
 * AMD's gathers are slow (a vpgatherdq of 4 took twice as long as its loads on Zen 5) */
static inline int gguflm_avx2_gathers_pay(void) {
    return gguflm_bound_dispatch && gguflm_bound_dispatch->vendor == GGUFLM_VENDOR_INTEL;
}

/* isa's kernel of recipe `path` for weight type `type` (NULL: no such recipe); it takes the
 * arithmetic as its last argument. avx512bf16: the AVX-512 kernels, but its own BF16 ones; the
 * AVX-512 ISAs with the dispatch's vbmi on: the VBMI grid i-quant kernels (of the types where they
 * pay); AVX2 on Intel's cores: the 3-bit grids' gathering DOT kernels. (The AVX-512 batch kernels
 * that have AMX tile functions call them themselves while the dispatch's amx is on.) */
static inline gguflm_gemm_fn gguflm_kernel(int isa, int path, int type) {
#if GGUFLM_HAVE_DPBF16
    if (isa == GGUFLM_ISA_AVX512BF16 && type == GGUFLM_BF16) {
        if (path == GGUFLM_PATH_DOT) return gguflm_DOT_bf16_avx512bf16;
        if (path == GGUFLM_PATH_SGEMM) return gguflm_SGEMM_bf16_avx512bf16;
    }
#endif
#if GGUFLM_HAVE_SIMD
    if (isa >= GGUFLM_ISA_AVX512 && gguflm_vbmi_on() && gguflm_iq_kernels_avx512vbmi[path][type] && gguflm_vbmi_pays(type))
        return gguflm_iq_kernels_avx512vbmi[path][type];
    if (isa == GGUFLM_ISA_AVX2 && gguflm_iq_kernels_avx2gather[path][type] && gguflm_avx2_gathers_pay())
        return gguflm_iq_kernels_avx2gather[path][type];
#endif
    return gguflm_kernel_table(isa)[path][type];
}

/* whether isa's batch matmul (16+ tokens) of a weight of wtype, n_rows rows, held as `repacked` says,
 * takes its integer dots from the AMX tiles (the bench says which peak a row is measured against):
 * the repacked Q4_0 recipe (quants_repack_simd.inc), or TILED's K GEMM for the types of 32-element
 * sub-blocks (quants_ktile_simd.inc) */
static inline int gguflm_amx_batch(int isa, int wtype, int64_t n_rows, int64_t w_stride, int64_t n_in, int repacked,
                                   int arith) {
#if GGUFLM_HAVE_AMX
    gguflm_segment seg[2];
    gguflm_matmul_plan(wtype, n_rows, w_stride, n_in, 16, repacked, arith, seg);
    const int repack = seg[0].path == GGUFLM_PATH_Q4_0_REPACK || seg[0].path == GGUFLM_PATH_Q4_0_ROWS16;
    const int k_gemm = seg[0].path == GGUFLM_PATH_TILED && gguflm_kt_amx_type(wtype, 0);
    return isa >= GGUFLM_ISA_AVX512 && gguflm_amx_on() && (repack || k_gemm);
#else
    (void)isa, (void)wtype, (void)n_rows, (void)w_stride, (void)n_in, (void)repacked, (void)arith;
    return 0;
#endif
}

/* isa's row conversions of type: the traits' portable ones, but F16 rows take F16C in the SIMD
 * ISAs (the same bits) */
#if GGUFLM_ROW_F16C
static void gguflm_dequantize_row_f16_f16c(const void *x, float *y, int64_t k) {
    gguflm_fp16_to_fp32_row_f16c((const ggml_half *)x, y, k);
}
static void gguflm_quantize_row_f16_f16c(const float *x, void *y, int64_t k) {
    gguflm_fp32_to_fp16_row_f16c(x, (ggml_half *)y, k);
}
#endif

static inline gguflm_to_float_fn gguflm_to_float(int isa, int type) {
#if GGUFLM_ROW_F16C
    if (type == GGUFLM_F16 && isa >= GGUFLM_ISA_AVX2) return gguflm_dequantize_row_f16_f16c;
#endif
    (void)isa;
    return gguflm_traits[type].to_float;
}

/* activation: the quantizer ggml's CPU backend uses for src1, else ggml's reference one */
static inline gguflm_from_float_fn gguflm_from_float(int isa, int type, int activation) {
#if GGUFLM_ROW_F16C
    if (type == GGUFLM_F16 && isa >= GGUFLM_ISA_AVX2) return gguflm_quantize_row_f16_f16c;
#endif
#if GGUFLM_HAVE_SIMD
    /* the activation partners' quantizers with vector instructions: the same bytes */
    if (activation && isa >= GGUFLM_ISA_AVX2) {
        const int wide = isa >= GGUFLM_ISA_AVX512;
        if (type == GGUFLM_Q8_0) return wide ? gguflm_quantize_act_q8_0_avx512 : gguflm_quantize_act_q8_0_avx2;
        if (type == GGUFLM_Q8_1) return wide ? gguflm_quantize_act_q8_1_avx512 : gguflm_quantize_act_q8_1_avx2;
        if (type == GGUFLM_Q8_K) return wide ? gguflm_quantize_row_q8_K_avx512 : gguflm_quantize_row_q8_K_avx2;
    }
#endif
    (void)isa;
    return activation ? gguflm_traits[type].from_float_act : gguflm_traits[type].from_float;
}

/* ======================= activations ======================= */

/* thread ith of nth quantizes its share of the blocks of every row of x [n_tok, n_in] (row stride
 * x_stride floats) into xq [n_tok, row_bytes(vec_dot_type, n_in)] */
static void gguflm_quantize_act_part(int vec_dot_type, const float *x, int64_t x_stride, int64_t n_tok, int64_t n_in,
                                     void *xq, int isa, int ith, int nth) {
    const gguflm_type_traits *t = &gguflm_traits[vec_dot_type];
    const gguflm_from_float_fn from_float = gguflm_from_float(isa, vec_dot_type, 1);
    const int64_t nb = n_in / t->block_size, row_bytes = nb * t->type_size;
    const int64_t b0 = nb * ith / nth, b1 = nb * (ith + 1) / nth;
    if (b1 <= b0) return;
    for (int64_t r = 0; r < n_tok; ++r) {
        from_float(x + r * x_stride + b0 * t->block_size, (uint8_t *)xq + r * row_bytes + b0 * t->type_size,
                   (b1 - b0) * t->block_size);
    }
}

/* x -> xq for the dot partner vec_dot_type, on n_threads threads */
static void gguflm_quantize_act(int vec_dot_type, const float *x, int64_t x_stride, int64_t n_tok, int64_t n_in,
                                void *xq, int isa, int n_threads) {
    const int64_t nb = n_in / gguflm_traits[vec_dot_type].block_size;
    const int nth = (int)(n_threads < nb ? n_threads : (nb > 0 ? nb : 1));
    /* the team may be smaller than asked (no OpenMP, thread limits): split by its real size */
    #pragma omp parallel num_threads(nth)
    gguflm_quantize_act_part(vec_dot_type, x, x_stride, n_tok, n_in, xq, isa, omp_get_thread_num(),
                             omp_get_num_threads());
}

/* ======================= matmul ======================= */

/* token tile: the weight rows of a chunk stay in L1 while they meet every token of the tile */
#define GGUFLM_TOKEN_TILE 16

/* decode (one token) hands out 64-row chunks, batches 16-row chunks, as ggml's mul_mat; and as it
 * does, a matrix too small for 4 chunks per thread is cut into one chunk per thread instead (a
 * multiple of `step` rows: 8, the repacked Q4_K kernels' step, or a rows-16 weight's 16), so that
 * no thread waits on another's second chunk */
static inline int64_t gguflm_chunk_rows(int64_t n_rows, int64_t n_tok, int n_threads, int64_t step) {
    const int64_t rows = n_tok == 1 ? 64 : 16;
    if (n_tok > 1 || n_threads <= 1 || (n_rows + rows - 1) / rows >= 4 * (int64_t)n_threads) return rows;
    const int64_t per_thread = (n_rows + n_threads - 1) / n_threads;
    return (per_thread + step - 1) / step * step;
}

/* one weight matrix W [n_rows, n_in] (row stride w_stride bytes, type wtype) times activations xq
 * already quantized to wtype's vec_dot_type, into out [n_tok, n_rows] (row stride out_stride floats);
 * repacked: W is a model weight llama.cpp keeps repacked (see gguflm_matmul_plan), 0 for a tied
 * embedding */
typedef struct {
    int wtype, repacked;
    const uint8_t *w;
    int64_t w_stride, n_rows;
    const uint8_t *xq;
    float *out;
    int64_t out_stride;
} gguflm_matmul_job;

/* the most matmuls of one input that share a parallel region (a fused Q, K, V projection) */
#define GGUFLM_MAX_JOBS 4

static inline int64_t gguflm_job_chunk_step(const gguflm_matmul_job *job) {
    return job->repacked == GGUFLM_REPACKED_ROWS16 ? GGUFLM_ROWS16 : 8;
}

static inline int64_t gguflm_job_chunks(const gguflm_matmul_job *job, int64_t n_tok, int n_threads) {
    const int64_t rows = gguflm_chunk_rows(job->n_rows, n_tok, n_threads, gguflm_job_chunk_step(job));
    return (job->n_rows + rows - 1) / rows;
}

static inline int gguflm_matmul_threads(const gguflm_matmul_job *jobs, int n_jobs, int64_t n_tok, int n_threads) {
    int64_t n_chunks = 0;
    for (int j = 0; j < n_jobs; ++j) n_chunks += gguflm_job_chunks(&jobs[j], n_tok, n_threads);
    return (int)(n_threads < n_chunks ? n_threads : (n_chunks > 0 ? n_chunks : 1));
}

/* kernels handed a segment's whole batch, which block its tokens themselves (the others get
 * GGUFLM_TOKEN_TILE tokens at a time): the Q4_0 recipe's repacked ones, and the TILED and repacked
 * GEMM ones of the K-quants, IQ4_XS and the grid i-quants, and the legacy and ternary types'
 * AVX-512 DOT from gguflm_strip_tokens() tokens on (they decode a chunk's rows once for all its
 * tokens) */
static inline int gguflm_row_strips(int isa, int path, int wtype, int64_t n_tok) {
    return path == GGUFLM_PATH_DOT && (gguflm_is_legacy(wtype) || gguflm_is_ternary(wtype)) && isa >= GGUFLM_ISA_AVX512 &&
           n_tok >= gguflm_strip_tokens(wtype);
}
static inline int gguflm_takes_whole_batch(int isa, int path, int wtype, int64_t n_tok) {
    if (gguflm_q4_0_recipe(path) || gguflm_row_strips(isa, path, wtype, n_tok)) return 1;
    return (path == GGUFLM_PATH_TILED || path == GGUFLM_PATH_Q4_K_GEMM) &&
           (gguflm_is_kquant(wtype) || wtype == GGUFLM_IQ4_XS || gguflm_is_iq_grid(wtype));
}

/* The chunks of a parallel region, dealt by ranges: chunks 0..n-1 are cut into one contiguous range
 * per thread; a thread takes its own range's chunks front to back, then helps with the others'
 * from their back ends. Each thread's weights thus stream from one address range, which the
 * hardware prefetchers follow: chunks dealt alternately from one counter made both threads jump
 * every 64 rows (Gemma 3 270M's decode at 2 threads: best of 15 runs 132 t/s, against 87 with one
 * counter; its 262144x640 output has rows of 680 bytes).
 * A thread held up elsewhere still gets its range finished by the others. taken[r]: chunks of
 * range r taken from its front (low 32 bits) and from its back (high 32 bits); zero before the
 * region. */
#define GGUFLM_MAX_RANGES 64
typedef struct {
    uint64_t taken[GGUFLM_MAX_RANGES];
} gguflm_chunk_queue;

/* the next chunk of n_chunks for the calling thread, or -1 when none is left */
static inline int64_t gguflm_chunk_take(gguflm_chunk_queue *q, int64_t n_chunks) {
    const int nth = omp_get_num_threads(), n_ranges = nth < GGUFLM_MAX_RANGES ? nth : GGUFLM_MAX_RANGES;
    const int own = omp_get_thread_num() % n_ranges;
    for (int k = 0; k < n_ranges; ++k) {
        const int r = (own + k) % n_ranges;
        const int64_t start = n_chunks * r / n_ranges, size = n_chunks * (r + 1) / n_ranges - start;
        uint64_t cur = __atomic_load_n(&q->taken[r], __ATOMIC_RELAXED);
        for (;;) {
            const int64_t front = (int64_t)(cur & 0xffffffffu), back = (int64_t)(cur >> 32);
            if (front + back >= size) break;
            const uint64_t next = cur + (k == 0 ? 1 : (uint64_t)1 << 32);
            /* a failed exchange reloads cur: another thread took a chunk of this range meanwhile */
            if (__atomic_compare_exchange_n(&q->taken[r], &cur, next, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                return k == 0 ? start + front : start + size - 1 - back;
        }
    }
    return -1;
}

/* inside a parallel region: every thread takes row chunks of the jobs from the shared queue (zeroed
 * before the region) until none are left, so any team size covers every chunk; each chunk runs the
 * recipes llama.cpp would use for its matmul (gguflm_matmul_plan) */
static void gguflm_matmul_worker(const gguflm_matmul_job *jobs, int n_jobs, int64_t n_in, int64_t n_tok, int isa,
                                 int arith, int per_token, gguflm_chunk_queue *queue) {
    gguflm_segment seg[GGUFLM_MAX_JOBS][2];
    int n_seg[GGUFLM_MAX_JOBS];
    int64_t rows[GGUFLM_MAX_JOBS], xq_stride[GGUFLM_MAX_JOBS], first_chunk[GGUFLM_MAX_JOBS + 1], n_chunks = 0;
    first_chunk[0] = 0;
    for (int j = 0; j < n_jobs; ++j) {
        const gguflm_matmul_job *job = &jobs[j];
        n_seg[j] = (per_token ? gguflm_matmul_plan_per_token : gguflm_matmul_plan)(
            job->wtype, job->n_rows, job->w_stride, n_in, n_tok, job->repacked, arith, seg[j]);
        xq_stride[j] = gguflm_row_bytes(gguflm_traits[job->wtype].vec_dot_type, n_in);
        rows[j] = gguflm_chunk_rows(job->n_rows, n_tok, omp_get_num_threads(), gguflm_job_chunk_step(job));
        /* the repacked Q4_0 recipe's batch kernel (quants_repack_simd.inc) and the AVX-512 strips
         * (quants_strips_avx512.inc) transpose each block of their rows once for all the tokens
         * they are given: they take all of them, and up to 64 rows (their tokens' tables shared by 4
         * strips) while every thread still gets 4 chunks */
        if ((n_tok > 1 && gguflm_q4_0_recipe(seg[j][0].path)) ||
            gguflm_row_strips(isa, seg[j][0].path, job->wtype, n_tok))
            while (rows[j] < 64 && (job->n_rows + 2 * rows[j] - 1) / (2 * rows[j]) >= 4 * (int64_t)omp_get_num_threads())
                rows[j] *= 2;
        first_chunk[j + 1] = first_chunk[j] + (job->n_rows + rows[j] - 1) / rows[j];
        n_chunks = first_chunk[j + 1];
    }
    for (int64_t chunk; (chunk = gguflm_chunk_take(queue, n_chunks)) >= 0;) {
        int j = 0;
        while (j + 1 < n_jobs && chunk >= first_chunk[j + 1]) ++j;
        const gguflm_matmul_job *job = &jobs[j];
        const int64_t r0 = (chunk - first_chunk[j]) * rows[j];
        const int64_t nr = (r0 + rows[j] < job->n_rows ? r0 + rows[j] : job->n_rows) - r0;
        for (int s = 0; s < n_seg[j]; ++s) {
            const gguflm_gemm_fn kernel = gguflm_kernel(isa, seg[j][s].path, job->wtype);
            const int64_t seg_tok = seg[j][s].t1 - seg[j][s].t0;
            const int64_t tile = gguflm_takes_whole_batch(isa, seg[j][s].path, job->wtype, seg_tok) ? seg_tok
                                                                                                   : GGUFLM_TOKEN_TILE;
            for (int64_t t0 = seg[j][s].t0; t0 < seg[j][s].t1; t0 += tile) {
                const int64_t nt = (t0 + tile < seg[j][s].t1 ? t0 + tile : seg[j][s].t1) - t0;
                kernel(n_in, job->w + r0 * job->w_stride, job->w_stride, nr, job->xq + t0 * xq_stride[j], xq_stride[j], nt,
                       job->out + t0 * job->out_stride + r0, job->out_stride, arith);
            }
        }
    }
}

/* the jobs (n_jobs <= GGUFLM_MAX_JOBS) of one input of n_tok rows in one parallel region, with isa's
 * kernels and arith's rounding (per_token: each token's as in a one-token matmul): a thread done
 * with its share of one matrix goes on with the next instead of waiting at a barrier */
static void gguflm_matmul_jobs(const gguflm_matmul_job *jobs, int n_jobs, int64_t n_in, int64_t n_tok, int isa,
                               int arith, int per_token, int n_threads) {
    gguflm_chunk_queue queue = {{0}};
    #pragma omp parallel num_threads(gguflm_matmul_threads(jobs, n_jobs, n_tok, n_threads))
    gguflm_matmul_worker(jobs, n_jobs, n_in, n_tok, isa, arith, per_token, &queue);
}

/* out [n_tok, n_rows] (row stride out_stride floats) = W [n_rows, n_in] (row stride w_stride
 * bytes, type wtype) . xq, activations already quantized to wtype's vec_dot_type (one job) */
static void gguflm_matmul_q(int wtype, const void *w, int64_t w_stride, int64_t n_rows, int64_t n_in, const void *xq,
                            int64_t n_tok, float *out, int64_t out_stride, int repacked, int isa, int arith,
                            int n_threads) {
    const gguflm_matmul_job job = {wtype, repacked, (const uint8_t *)w, w_stride, n_rows, (const uint8_t *)xq, out,
                                   out_stride};
    gguflm_matmul_jobs(&job, 1, n_in, n_tok, isa, arith, 0, n_threads);
}

/* the same from float activations x [n_tok, n_in] (row stride x_stride floats): they are quantized
 * into scratch (act_buffer_bytes) by all threads, then one barrier, then the matmul, all in one
 * parallel region as ggml does it */
static void gguflm_matmul_f32(int wtype, const void *w, int64_t w_stride, int64_t n_rows, int64_t n_in, const float *x,
                              int64_t x_stride, int64_t n_tok, void *scratch, float *out, int64_t out_stride,
                              int repacked, int isa, int arith, int n_threads) {
    const int vdt = gguflm_traits[wtype].vec_dot_type;
    const gguflm_matmul_job job = {wtype, repacked, (const uint8_t *)w, w_stride, n_rows, (const uint8_t *)scratch,
                                   out, out_stride};
    gguflm_chunk_queue queue = {{0}};
    #pragma omp parallel num_threads(gguflm_matmul_threads(&job, 1, n_tok, n_threads))
    {
        gguflm_quantize_act_part(vdt, x, x_stride, n_tok, n_in, scratch, isa, omp_get_thread_num(),
                                 omp_get_num_threads());
        #pragma omp barrier
        gguflm_matmul_worker(&job, 1, n_in, n_tok, isa, arith, 0, &queue);
    }
}

/* out[i] = row ids[i] of W dequantized (embedding lookup); ids must be in range */
static void gguflm_get_rows(int type, const void *w, int64_t w_stride, int64_t n_in, const int32_t *ids, int64_t n_ids,
                            float *out, int64_t out_stride, int isa) {
    const gguflm_to_float_fn to_float = gguflm_to_float(isa, type);
    for (int64_t i = 0; i < n_ids; ++i) to_float((const uint8_t *)w + ids[i] * w_stride, out + i * out_stride, n_in);
}

/* ======================= int8 peak probe ======================= */

/* The int8 multiply-add peak of isa's batch kernels on n_threads threads: each runs `iters` rounds
 * of quants_peak_simd.inc's loop (AVX-512: vpdpbusd; AVX2: vpmaddubsw + vpmaddwd), or with amx (an
 * AVX-512 ISA, the dispatch's amx on) of quants_amx.h's tdpbssd loop. Returns the int8 operations
 * done in all (2 per multiply-add), 0 where there is no such loop (scalar; amx where the tiles are
 * off); the bench times the call. *checksum keeps the loops from being optimised away. */
static int64_t gguflm_int8_peak(int isa, int amx, int64_t iters, int n_threads, int64_t *checksum) {
    int64_t sum = 0, ops = 0;
#if GGUFLM_HAVE_SIMD
    const int tiles = amx && isa >= GGUFLM_ISA_AVX512 && gguflm_amx_on() && GGUFLM_HAVE_AMX;
    if (isa >= GGUFLM_ISA_AVX2 && (tiles || !amx)) {
        const int wide = isa >= GGUFLM_ISA_AVX512;
        #pragma omp parallel num_threads(n_threads) reduction(+:sum, ops)
        {
#if GGUFLM_HAVE_AMX
            if (tiles) {
                sum += gguflm_int8_peak_amx(iters);
                ops += iters * GGUFLM_INT8_PEAK_OPS_AMX;
            } else
#endif
            {
                sum += wide ? gguflm_int8_peak_avx512(iters) : gguflm_int8_peak_avx2(iters);
                ops += iters * GGUFLM_INT8_PEAK_OPS(wide);
            }
        }
    }
#endif
    (void)isa;
    (void)amx;
    (void)iters;
    (void)n_threads;
    *checksum = sum;
    return ops;
}

/* ======================= memory bandwidth probe ======================= */

/* sum of the 64-bit words of buf on n_threads threads; the bench times it to get read bandwidth */
static uint64_t gguflm_read_sum(const uint64_t *buf, int64_t n_words, int n_threads) {
    uint64_t total = 0;
    #pragma omp parallel for num_threads(n_threads) schedule(static) reduction(+:total)
    for (int64_t i = 0; i < n_words; ++i) total += buf[i];
    return total;
}

#endif
