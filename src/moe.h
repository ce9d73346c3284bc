/* Mixture-of-experts feed-forward with ggml-cpu's numbers (llama.cpp's build_moe_ffn):
 *
 *   route      router logits -> probabilities (softmax, sigmoid, or the logits themselves for
 *              gpt-oss's softmax-after-top-k), plus the selection bias where there is one
 *              (DeepSeek V3's exp_probs_b: it only ranks, the weights stay unbiased),
 *              where the experts come in groups (DeepSeek V3's group-limited routing) every group
 *              but the n_group_used whose best two selection scores sum highest masked to -inf,
 *              ggml_argsort's std::sort (ties broken where libstdc++'s introsort leaves them), the
 *              selected probabilities as weights, then softmax of the
 *              selected / normalisation by their sum (clamped at 2^-14) / a scale, each as its own
 *              ggml op rounds. The tokens are then grouped by expert (ggml_compute_forward_mul_mat_id's
 *              matrix_rows, in token-then-slot order): a "sorted row" r is one (token, slot) pair,
 *              and the rows of expert e are offsets[e] .. offsets[e + 1].
 *   matmul_id  every expert's weight rows times the sorted rows routed to it: each expert's rows
 *              are read once for all its tokens, and an expert no token picked is never read. Each
 *              output is the recipe ggml's mul_mat_id uses for that expert: the repacked GEMV for
 *              the types CPU_REPACK holds (every token), the tiled GEMM for K-quants when 8+ tokens chose
 *              the expert, vec_dot otherwise (no tinyBLAS: mul_mat_id never calls it).
 *   combine    out[t] = ((e0 * w0 + e1 * w1) + e2 * w2) + ...: ggml_mul by the weights, then the
 *              views of the slots added in order.
 */
#ifndef GGUFLM_MOE_H
#define GGUFLM_MOE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "ops.h"
#include "ops_math.h"
#include "quants_kernels.h"
#include "sampling_kernels.h"  /* gguflm_std_sort_positions: ggml_argsort's std::sort, move for move */

/* llama.cpp's llama_expert_gating_func_type */
enum { GGUFLM_GATING_SOFTMAX = 1, GGUFLM_GATING_SIGMOID = 2, GGUFLM_GATING_SOFTMAX_WEIGHT = 3 };

typedef struct {
    int32_t n_expert, n_used, gating, norm_w;
    float w_scale;                 /* 0 or 1: none */
    int32_t n_group, n_group_used; /* n_group > 1: experts in n_group equal groups, the selection
                                      limited to the n_group_used best groups; else no groups */
    int32_t *ids;                  /* OUT [n_tok, n_used]: selected experts, best first */
    float *weights;                /* OUT [n_tok, n_used] */
    int32_t *offsets;              /* OUT [n_expert + 1]: expert e's sorted rows start at offsets[e] */
    int32_t *src;                  /* OUT [n_tok * n_used]: the token of each sorted row */
    int32_t *slot;                 /* OUT [n_tok * n_used]: the sorted row of (token t, slot i) */
} gguflm_moe_args;

/* ggml_soft_max_f32 of one row (scale 1, no mask): the max, exp summed a vector at a time (the
 * build's lanes and horizontal sum, each vector's sum added in double), libm expf on the tail,
 * then every value times (float)(1.0 / sum) */
static void gguflm_ggml_softmax_row(const float *x, float *y, int n, int arith) {
    float max = -INFINITY;
    for (int i = 0; i < n; i++) max = max > x[i] ? max : x[i];
    const int vec = gguflm_vec_lanes(arith);
    double sum = 0.0;
    int i = 0;
    for (; i + vec <= n; i += vec) {
        float v[16];
        for (int l = 0; l < vec; l++) v[l] = y[i + l] = gguflm_expf_arith(x[i + l] - max, arith);
        sum += (double)gguflm_hsum_vec(v, vec);
    }
    for (; i < n; i++) {
        y[i] = expf(x[i] - max);
        sum += (double)y[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int j = 0; j < n; j++) y[j] *= inv;
}

/* build_moe_ffn's group-limited selection of one token: the selection scores sel [n_expert] cut
 * into n_group groups; each group scores the sum of its best two (argsort_top_k, get_rows,
 * sum_rows: a double sum of two floats, that is their float sum); the n_group_used best groups
 * (argsort_top_k again) keep their scores, the others become -inf. Returns masked [n_expert]
 * (its n_group tail holds the group scores); order and scratch are the sort's. */
static const float *gguflm_moe_mask_groups(const gguflm_moe_args *m, const float *sel, float *masked, int32_t *order,
                                           uint64_t *scratch) {
    const int ng = m->n_group, per = m->n_expert / ng;
    float *group_score = masked + m->n_expert;
    for (int g = 0; g < ng; g++) {
        gguflm_std_sort_positions(sel + g * per, per, order, scratch);
        group_score[g] = sel[g * per + order[0]] + sel[g * per + order[1]];
    }
    for (int e = 0; e < m->n_expert; e++) masked[e] = -INFINITY;
    gguflm_std_sort_positions(group_score, ng, order, scratch);
    for (int i = 0; i < m->n_group_used; i++)
        memcpy(masked + order[i] * per, sel + order[i] * per, sizeof(float) * per);
    return masked;
}

/* Route n_tok tokens by their router logits (row stride `stride` floats); fills m's outputs.
 * bias (NULL: none): [n_expert] added to the probabilities for the selection only (ggml_add).
 * Returns -1 if scratch could not be allocated. */
static int gguflm_moe_route(const gguflm_moe_args *m, const float *logits, int64_t stride, int64_t n_tok,
                            const float *bias, int arith) {
    const int ne = m->n_expert, k = m->n_used;
    float *probs = (float *)malloc(sizeof(float) * 2 * ne), *sel = bias ? probs + ne : probs;
    int32_t *order = (int32_t *)malloc(sizeof(int32_t) * ne);
    uint64_t *scratch = (uint64_t *)malloc(sizeof(uint64_t) * 3 * ne);
    int32_t *cursor = (int32_t *)malloc(sizeof(int32_t) * ne);
    const int grouped = m->n_group > 1;
    float *masked = grouped ? (float *)malloc(sizeof(float) * (ne + m->n_group)) : NULL;
    if (!probs || !order || !scratch || !cursor || (grouped && !masked)) {
        free(probs); free(order); free(scratch); free(cursor); free(masked);
        return -1;
    }
    for (int64_t t = 0; t < n_tok; t++) {
        const float *l = logits + t * stride;
        if (m->gating == GGUFLM_GATING_SOFTMAX) gguflm_ggml_softmax_row(l, probs, ne, arith);
        else if (m->gating == GGUFLM_GATING_SIGMOID) for (int e = 0; e < ne; e++) probs[e] = 1.0f / (1.0f + expf(-l[e]));
        else memcpy(probs, l, sizeof(float) * ne);
        if (bias)
            for (int e = 0; e < ne; e++) sel[e] = probs[e] + bias[e];
        /* ggml_argsort_top_k: std::sort of all expert indices, greatest first */
        gguflm_std_sort_positions(grouped ? gguflm_moe_mask_groups(m, sel, masked, order, scratch) : sel, ne,
                                  order, scratch);
        int32_t *ids = m->ids + t * k;
        float *w = m->weights + t * k;
        for (int i = 0; i < k; i++) {
            ids[i] = order[i];
            w[i] = probs[order[i]];
        }
        if (m->gating == GGUFLM_GATING_SOFTMAX_WEIGHT) gguflm_ggml_softmax_row(w, w, k, arith);
        if (m->norm_w) {
            double s = 0.0;  /* ggml_sum_rows: a double sum rounded to float */
            for (int i = 0; i < k; i++) s += (double)w[i];
            float sum = (float)s;
            sum = sum < 6.103515625e-5f ? 6.103515625e-5f : sum;  /* ggml_clamp to F16's smallest normal */
            for (int i = 0; i < k; i++) w[i] = w[i] / sum;
        }
        if (m->w_scale != 0.0f && m->w_scale != 1.0f)
            for (int i = 0; i < k; i++) w[i] *= m->w_scale;
    }
    /* group the (token, slot) pairs by expert, in ggml's order */
    memset(cursor, 0, sizeof(int32_t) * ne);
    for (int64_t j = 0; j < n_tok * k; j++) cursor[m->ids[j]]++;
    m->offsets[0] = 0;
    for (int e = 0; e < ne; e++) {
        m->offsets[e + 1] = m->offsets[e] + cursor[e];
        cursor[e] = m->offsets[e];
    }
    for (int64_t j = 0; j < n_tok * k; j++) {
        const int32_t r = cursor[m->ids[j]]++;
        m->src[r] = (int32_t)(j / k);
        m->slot[j] = r;
    }
    free(probs); free(order); free(scratch); free(cursor); free(masked);
    return 0;
}

/* out row r = xq row src[r] (n_rows rows of row_bytes bytes) */
static void gguflm_moe_gather(const uint8_t *xq, int64_t row_bytes, const int32_t *src, int64_t n_rows, uint8_t *out) {
    for (int64_t r = 0; r < n_rows; r++) memcpy(out + r * row_bytes, xq + src[r] * row_bytes, (size_t)row_bytes);
}

/* Llama 4's routing weight on the experts' input (build_moe_ffn's weight_before_ffn: the row
 * repeated per slot, times its weight): out[r] = x[src[r]] * the weight of the slot of token
 * src[r] that chose e, for every row r of expert e (float rows, n values each) */
static void gguflm_moe_gather_weighted(const float *x, int64_t x_stride, int64_t n, const int32_t *ids,
                                       const float *weights, const int32_t *offsets, const int32_t *src,
                                       int n_expert, int k, float *out, int64_t out_stride) {
    for (int e = 0; e < n_expert; e++)
        for (int32_t r = offsets[e]; r < offsets[e + 1]; r++) {
            const int32_t t = src[r];
            float w = 0.0f;
            for (int i = 0; i < k; i++)
                if (ids[t * k + i] == e) w = weights[t * k + i];
            for (int64_t j = 0; j < n; j++) out[r * out_stride + j] = x[t * x_stride + j] * w;
        }
}

/* out[t] = sum over slots i, in order, of experts[slot[t * k + i]] * weights[t * k + i] (weights NULL:
 * the plain sum, the experts having weighed their inputs) */
static void gguflm_moe_combine(const float *experts, int64_t e_stride, const float *weights, const int32_t *slot,
                               int64_t n_tok, int k, int64_t n, float *out, int64_t out_stride) {
    for (int64_t t = 0; t < n_tok; t++) {
        float *o = out + t * out_stride;
        const float *e0 = experts + slot[t * k] * e_stride;
        const float w0 = weights ? weights[t * k] : 1.0f;
        for (int64_t j = 0; j < n; j++) o[j] = e0[j] * w0;
        for (int i = 1; i < k; i++) {
            const float *ei = experts + slot[t * k + i] * e_stride;
            const float wi = weights ? weights[t * k + i] : 1.0f;
            for (int64_t j = 0; j < n; j++) o[j] = o[j] + ei[j] * wi;
        }
    }
}

/* x[t] *= silu(g[t]) / g[t]: Qwen 2 MoE's sigmoid gate of its shared expert as llama.cpp builds it
 * (ggml_silu of a one-value row runs ggml_silu_f32, libm's expf; then ggml_div; then ggml_mul) */
static void gguflm_moe_shared_gate(const float *g, int64_t g_stride, int64_t n_tok, int64_t n, float *x,
                                   int64_t x_stride) {
    for (int64_t t = 0; t < n_tok; t++) {
        const float v = g[t * g_stride];
        const float gate = (v / (1.0f + expf(-v))) / v;
        for (int64_t j = 0; j < n; j++) x[t * x_stride + j] *= gate;
    }
}

/* ggml_swiglu_oai (gpt-oss): x = min(gate, limit), y = clamp(up, -limit, limit),
 * out = x / (1 + expf(alpha * -x)) * (y + 1), libm's expf, element by element */
static void gguflm_swiglu_oai_rows(int64_t n_rows, int64_t n, const float *gate, int64_t g_stride, const float *up,
                                   int64_t u_stride, float alpha, float limit, float *out, int64_t out_stride,
                                   int n_threads) {
    #pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t i = 0; i < n_rows; i++) {
        for (int64_t k = 0; k < n; k++) {
            const float g = gate[i * g_stride + k], u = up[i * u_stride + k];
            const float x = limit < g ? limit : g;                          /* std::min(g, limit) */
            const float y = u < -limit ? -limit : (limit < u ? limit : u);  /* std::clamp */
            const float glu = x / (1.f + expf(alpha * (-x)));
            out[i * out_stride + k] = glu * (y + 1.f);
        }
    }
}

/* ggml_add_id on rows grouped by expert: x[r] += b[e] (b_stride floats apart) for e's rows */
static void gguflm_moe_add_id(float *x, int64_t x_stride, int64_t n, const float *b, int64_t b_stride,
                              const int32_t *offsets, int n_expert) {
    for (int e = 0; e < n_expert; e++)
        for (int32_t r = offsets[e]; r < offsets[e + 1]; r++)
            for (int64_t j = 0; j < n; j++) x[r * x_stride + j] += b[e * b_stride + j];
}

/* the per-expert scale of ggml_mul_mat_id's output (llama.cpp's build_lora_mm_id with w_s, Gemma 4's
 * down scale) on rows grouped by expert: x[r] *= s[e] for e's rows */
static void gguflm_moe_scale_id(float *x, int64_t x_stride, int64_t n, const float *s, const int32_t *offsets,
                                int n_expert) {
    for (int e = 0; e < n_expert; e++)
        for (int32_t r = offsets[e]; r < offsets[e + 1]; r++)
            for (int64_t j = 0; j < n; j++) x[r * x_stride + j] *= s[e];
}

/* one stack of expert matrices [n_expert][n_rows, n_in] (row stride w_stride bytes, expert stride
 * n_rows * w_stride) times the sorted rows xq (already in wtype's dot partner), into out
 * [n_sorted, n_rows] (row stride out_stride floats): a dense matmul's fields, w the stack */
typedef gguflm_matmul_job gguflm_matmul_id_job;

/* the recipe of ggml's mul_mat_id for an expert that n_tok tokens chose: every type CPU_REPACK
 * holds takes its repacked GEMV, token by token (forward_mul_mat_id has no GEMM) */
static inline int gguflm_matmul_id_path(int wtype, int64_t n_rows, int64_t n_tok, int repacked, int arith) {
    if (repacked && gguflm_repacks(wtype, n_rows, arith))
        return wtype == GGUFLM_Q4_K || wtype == GGUFLM_Q2_K ? GGUFLM_PATH_Q4_K_GEMV : GGUFLM_PATH_Q4_0_REPACK;
    if (gguflm_is_kquant(wtype) && n_tok >= 8) return GGUFLM_PATH_TILED;
    return GGUFLM_PATH_DOT;
}

/* weight rows per chunk: single tokens stream 64 rows, tokens sharing an expert 16 (they meet
 * the chunk's rows while these are in L1) */
static inline int64_t gguflm_matmul_id_rows(int64_t n_tok) { return n_tok > 1 ? 16 : 64; }

/* The chunks (expert, job, rows) of the experts that have tokens: expert e's are first[e] ..
 * first[e + 1] (first: [n_expert + 1]); returns how many there are. */
static int64_t gguflm_matmul_id_chunks(const gguflm_matmul_id_job *jobs, int n_jobs, const int32_t *offsets,
                                       int n_expert, int64_t *first) {
    first[0] = 0;
    for (int e = 0; e < n_expert; e++) {
        const int64_t n_tok = offsets[e + 1] - offsets[e], rows = gguflm_matmul_id_rows(n_tok);
        int64_t chunks = 0;
        if (n_tok > 0)
            for (int j = 0; j < n_jobs; j++) chunks += (jobs[j].n_rows + rows - 1) / rows;
        first[e + 1] = first[e] + chunks;
    }
    return first[n_expert];
}

/* One thread's part of the jobs: chunks taken from the shared counter *next until none is left. */
static void gguflm_matmul_id_work(const gguflm_matmul_id_job *jobs, int64_t n_in, const int32_t *offsets,
                                  const int64_t *first, int64_t n_chunks, gguflm_chunk_queue *queue, int isa,
                                  int arith) {
    for (int64_t chunk; (chunk = gguflm_chunk_take(queue, n_chunks)) >= 0;) {
        int e = 0;
        while (chunk >= first[e + 1]) e++;
        const int64_t t_first = offsets[e], n_tok = offsets[e + 1] - offsets[e], rows = gguflm_matmul_id_rows(n_tok);
        int64_t c = chunk - first[e];
        int j = 0;
        while (c >= (jobs[j].n_rows + rows - 1) / rows) c -= (jobs[j++].n_rows + rows - 1) / rows;
        const gguflm_matmul_id_job *job = &jobs[j];
        const int64_t r0 = c * rows, nr = (r0 + rows < job->n_rows ? r0 + rows : job->n_rows) - r0;
        const int64_t xq_stride = gguflm_row_bytes(gguflm_traits[job->wtype].vec_dot_type, n_in);
        const uint8_t *w = job->w + (e * job->n_rows + r0) * job->w_stride;
        const gguflm_gemm_fn kernel = gguflm_kernel(isa, gguflm_matmul_id_path(job->wtype, job->n_rows, n_tok,
                                                                               job->repacked, arith), job->wtype);
        for (int64_t t0 = 0; t0 < n_tok; t0 += GGUFLM_TOKEN_TILE) {
            const int64_t nt = (t0 + GGUFLM_TOKEN_TILE < n_tok ? t0 + GGUFLM_TOKEN_TILE : n_tok) - t0;
            kernel(n_in, w, job->w_stride, nr, job->xq + (t_first + t0) * xq_stride, xq_stride, nt,
                   job->out + (t_first + t0) * job->out_stride + r0, job->out_stride, arith);
        }
    }
}

/* The jobs (experts of one input, n_jobs <= GGUFLM_MAX_JOBS) in one parallel region. Returns -1
 * if scratch could not be allocated. */
static int gguflm_matmul_id(const gguflm_matmul_id_job *jobs, int n_jobs, int64_t n_in, const int32_t *offsets,
                            int n_expert, int isa, int arith, int n_threads) {
    int64_t *first = (int64_t *)malloc(sizeof(int64_t) * (n_expert + 1));
    if (!first) return -1;
    const int64_t n_chunks = gguflm_matmul_id_chunks(jobs, n_jobs, offsets, n_expert, first);
    gguflm_chunk_queue queue = {{0}};
    const int nth = (int)(n_threads < n_chunks ? n_threads : (n_chunks > 0 ? n_chunks : 1));
    #pragma omp parallel num_threads(nth)
    gguflm_matmul_id_work(jobs, n_in, offsets, first, n_chunks, &queue, isa, arith);
    free(first);
    return 0;
}

/* A single token's router and routed SwiGLU experts (generation's every step) in one parallel
 * region: what the nodes quantize, matmul (router), route, quantize, gather, matmul_id (gate,
 * up), SwiGLU, quantize, matmul_id (down) and combine compute, with a barrier where one hands
 * over to the next instead of a parallel region each. Same kernels, same floats. */
typedef struct {
    const float *bias;                /* [n_expert] the selection bias (NULL: none) */
    const float *x;                   /* [n_embd] the feed-forward input */
    uint8_t *xr;                      /* x in the router's partner */
    gguflm_matmul_job router;         /* xr -> [n_expert] router logits */
    uint8_t *xq;                      /* [n_used] rows of x in the gate/up partner (one per slot) */
    gguflm_matmul_id_job gate_up[2];  /* xq -> [n_used, n_ff] each */
    float *act;                       /* [n_used, n_ff] SwiGLU(gate, up) */
    uint8_t *act_q;                   /* [n_used] rows of act in down's partner */
    gguflm_matmul_id_job down;        /* act_q -> [n_used, n_embd] */
    float *out;                       /* [n_embd] */
    int64_t n_embd, n_ff;
} gguflm_moe_one_args;

static int gguflm_moe_one(const gguflm_moe_args *m, const gguflm_moe_one_args *a, int isa, int arith, int use_avx2,
                          int n_threads) {
    const int ne = m->n_expert, k = m->n_used;
    int64_t *first = (int64_t *)malloc(sizeof(int64_t) * 2 * (ne + 1)), *first_down = first + ne + 1;
    if (!first) return -1;
    const int r_type = gguflm_traits[a->router.wtype].vec_dot_type;
    const int x_type = gguflm_traits[a->gate_up[0].wtype].vec_dot_type;
    const int act_type = gguflm_traits[a->down.wtype].vec_dot_type;
    const int64_t act_bytes = gguflm_row_bytes(act_type, a->n_ff);
    const gguflm_ops_kernels ops = gguflm_ops_select(use_avx2);
    int64_t n_up = 0, n_down = 0;
    gguflm_chunk_queue router_queue = {{0}}, up_queue = {{0}}, down_queue = {{0}};
    int failed = 0;
    #pragma omp parallel num_threads(n_threads)
    {
        const int ith = omp_get_thread_num(), nth = omp_get_num_threads();
        /* x for the router, and once per slot for the experts (each slot's row a copy of the
         * same: the gather of a single token) */
        gguflm_quantize_act_part(r_type, a->x, a->n_embd, 1, a->n_embd, a->xr, isa, ith, nth);
        gguflm_quantize_act_part(x_type, a->x, 0, k, a->n_embd, a->xq, isa, ith, nth);
        #pragma omp barrier
        gguflm_matmul_worker(&a->router, 1, a->n_embd, 1, isa, arith, 0, &router_queue);
        #pragma omp barrier
        if (ith == 0) {
            failed = gguflm_moe_route(m, a->router.out, ne, 1, a->bias, arith);
            if (!failed) {
                n_up = gguflm_matmul_id_chunks(a->gate_up, 2, m->offsets, ne, first);
                n_down = gguflm_matmul_id_chunks(&a->down, 1, m->offsets, ne, first_down);
            }
        }
        #pragma omp barrier
        if (!failed) {
            gguflm_matmul_id_work(a->gate_up, a->n_embd, m->offsets, first, n_up, &up_queue, isa, arith);
            #pragma omp barrier
            for (int r = ith; r < k; r += nth) {  /* a slot's SwiGLU and its quantized row */
                float *act = a->act + r * a->n_ff;
                ops.swiglu_row((int)a->n_ff, a->gate_up[0].out + r * a->gate_up[0].out_stride,
                               a->gate_up[1].out + r * a->gate_up[1].out_stride, act, arith);
                gguflm_quantize_act_part(act_type, act, a->n_ff, 1, a->n_ff, a->act_q + r * act_bytes, isa, 0, 1);
            }
            #pragma omp barrier
            gguflm_matmul_id_work(&a->down, a->n_ff, m->offsets, first_down, n_down, &down_queue, isa, arith);
            #pragma omp barrier
            if (ith == 0)
                gguflm_moe_combine(a->down.out, a->down.out_stride, m->weights, m->slot, 1, k, a->n_embd, a->out,
                                   a->n_embd);
        }
    }
    free(first);
    return failed ? -1 : 0;
}

#endif
