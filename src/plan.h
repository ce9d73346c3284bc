/* The forward pass as a list of nodes, executed without Python: what a ubatch's Graph records and
 * what later ubatches of the same shape replay (llama.cpp's graph reuse).
 *
 * A node names one kernel call with its buffers as raw pointers. Buffers are the arena's, the
 * model's weights and the KV cache's, all stable while the plan lives; what changes from one
 * ubatch to the next (tokens, positions, cache cells, the number of cells to scan, the output
 * rows) lives in arrays owned by the plan that the context fills before each run. LAYER nodes
 * split the list into segments so that the caller can check its abort callback in between.
 */
#ifndef GGUFLM_PLAN_H
#define GGUFLM_PLAN_H

#include <stdint.h>
#include <string.h>
#include "ops.h"
#include "quants_kernels.h"
#include "moe.h"
#include "ssm.h"
#include "delta_net.h"
#include "wkv.h"
#include "arch_ops.h"
#include "altup.h"

typedef enum {
    GGUFLM_OP_LAYER = 0,     /* segment boundary */
    GGUFLM_OP_GET_ROWS,      /* out[i] = row ids[i] of W, dequantized */
    GGUFLM_OP_COPY,          /* out[i] = x[i][col0 : col0 + n] (embeddings in, fused projections out) */
    GGUFLM_OP_TAKE_ROWS,     /* out[i] = x[rows[i]] */
    GGUFLM_OP_SCALE,         /* x *= s */
    GGUFLM_OP_ADD,           /* x += y */
    GGUFLM_OP_ADD_ROW,       /* x[i] += b */
    GGUFLM_OP_RMS_NORM,      /* out = rms_norm(x) * w */
    GGUFLM_OP_QUANTIZE,      /* xq = x in the partner type */
    GGUFLM_OP_MATMUL,        /* out = W . xq */
    GGUFLM_OP_ROPE,          /* x rotated by positions */
    GGUFLM_OP_KV_STORE,      /* cache row cells[i] = x[i] in the cache type */
    GGUFLM_OP_ATTENTION,
    GGUFLM_OP_GLU,           /* out = act(gate) * up */
    GGUFLM_OP_SOFTCAP,       /* x = tanh(x / cap) * cap */
    GGUFLM_OP_LAYER_NORM,    /* out = norm(x) * w + b */
    GGUFLM_OP_UNARY,         /* out = act(x): GELU, tanh */
    GGUFLM_OP_POOL_MEAN,     /* out[s] = sum_t mean[s][t] * x[t] */
    GGUFLM_OP_MOE_ROUTE,     /* router logits x -> experts, weights, rows grouped by expert (moe); w: selection bias or NULL */
    GGUFLM_OP_MOE_GATHER,    /* out[r] = xq[moe.src[r]] (bytes; aux 1: float rows times their routing weight) */
    GGUFLM_OP_MATMUL_ID,     /* out[r] = W[expert of r] . xq[r] */
    GGUFLM_OP_MOE_COMBINE,   /* out[t] = sum_i x[moe.slot[t, i]] * moe.weights[t, i] */
    GGUFLM_OP_MOE_SHARED_GATE, /* x[t] *= silu(y[t]) / y[t] */
    GGUFLM_OP_SWIGLU_OAI,    /* out = gpt-oss's clamped SwiGLU of x (gate) and y (up) */
    GGUFLM_OP_MOE_ADD_ID,    /* out[r] += w[expert of sorted row r] (aux 1: out[r] *= w[e], one value each) */
    GGUFLM_OP_MUL_ROW,       /* x[i] *= w (ggml_mul by a broadcast row) */
    GGUFLM_OP_HADAMARD,      /* x = every aux values of each row rotated by the Walsh-Hadamard matrix */
    GGUFLM_OP_MOE_ONE,       /* one token's routed experts (moe; w: gguflm_moe_one_args) */
    GGUFLM_OP_RS_MOVES,      /* the recurrent memory's staged state moves (i32: moves; out, w: the state blocks) */
    GGUFLM_OP_SSM_CONV,      /* Mamba's causal convolution, bias and SiLU (ssm) */
    GGUFLM_OP_SSM_SCAN,      /* Mamba-1's selective scan, + x * D (ssm) */
    GGUFLM_OP_SSM_SCAN_GROUPED, /* Mamba-2's selective scan, + x * D (ssm) */
    GGUFLM_OP_MUL,           /* x *= y (ggml_mul of two same-shaped rows: the short convolution's gates) */
    GGUFLM_OP_GATED_DELTA_NET, /* Qwen3-Next / Qwen3.5's linear attention (gdn) */
    GGUFLM_OP_GDN_GATES,     /* x = softplus(x + w) * y (log-decays), out = sigmoid(out) (strengths) */
    GGUFLM_OP_SIGMOID_MUL,   /* out *= sigmoid(y) (aux: y's step along a row, 0 broadcasts) */
    GGUFLM_OP_WKV,           /* RWKV's WKV, token shift and element-wise steps (wkv: its kind) */
    GGUFLM_OP_CLAMP,         /* x = max(min(x, f2), f) (ggml_clamp: MPT's and OLMo's clamp_kqv) */
    GGUFLM_OP_ATTN_TEMP,     /* x[i] *= attention temperature of pos i (f: scale, f2: offset, aux64: floor scale) */
    GGUFLM_OP_XIELU,         /* x = xielu(x) (w: alpha_n, alpha_p, beta, eps) */
    GGUFLM_OP_ALTUP,         /* Gemma 3n's AltUp mixes, magnitude rescale, top-k sparsity (altup: its kind) */
} gguflm_op;

typedef struct {
    int32_t op;
    int32_t n_threads;
    int64_t n_rows, n;                   /* rows and values per row of the main operand */
    int64_t x_stride, y_stride, out_stride;
    int32_t type, aux;                   /* ggml type / cache type; GLU kind, n_in, col0, repacked, ... */
    int32_t group;                       /* on the first MATMUL of matmuls run together: how many */
    int32_t per_token;                   /* MATMUL: each token rounds as in a one-token matmul */
    int64_t aux64;
    float f, f2;                         /* eps, scale, cap; SwiGLU-OAI's alpha and limit */
    const void *w;                       /* weights, bias, norm weight, cache data */
    int64_t w_stride;
    const float *x, *y;                  /* y: second operand, LayerNorm bias, mean-pooling matrix */
    void *out;
    const int32_t *i32;                  /* token ids, positions, n_kv (dynamic) */
    const int64_t *i64;                  /* cells, output rows (dynamic) */
    gguflm_rope_params rope;
    gguflm_attn_args attn;
    gguflm_moe_args moe;
    gguflm_ssm_args ssm;
    gguflm_gdn_args gdn;
    gguflm_wkv_args wkv;
    gguflm_altup_args altup;
} gguflm_node;

static void gguflm_kv_store(int cache_type, void *data, int64_t row_bytes, const int64_t *cells,
                            int64_t n_rows, int64_t n, const float *x, int64_t x_stride) {
    for (int64_t i = 0; i < n_rows; i++) {
        uint8_t *row = (uint8_t *)data + cells[i] * row_bytes;
        const float *src = x + i * x_stride;
        if (cache_type == GGUFLM_CACHE_F16) {
            for (int64_t j = 0; j < n; j++) ((ggml_half *)row)[j] = gguflm_fp32_to_fp16(src[j]);
        } else if (cache_type == GGUFLM_CACHE_F32) {
            memcpy(row, src, sizeof(float) * n);
        } else {
            gguflm_traits[GGUFLM_Q8_0].from_float_act(src, row, n);
        }
    }
}

/* The guard mode's zones: bytes around every arena buffer that no kernel may write. Before the
 * step that starts at node k, the zones fill[fill_ptr[k] .. fill_ptr[k + 1]) (of the buffers
 * first used there) get the canary byte; after it, the zones check[check_ptr[k] ..
 * check_ptr[k + 1]) (of every buffer in use there) must still hold it. */
#define GGUFLM_CANARY 0xA5
typedef struct {
    uint8_t *const *at;
    const int64_t *len;
    const int64_t *fill_ptr, *fill;
    const int64_t *check_ptr, *check;
} gguflm_guards;

static void gguflm_guards_fill(const gguflm_guards *g, int64_t k) {
    for (int64_t i = g->fill_ptr[k]; i < g->fill_ptr[k + 1]; i++) memset(g->at[g->fill[i]], GGUFLM_CANARY, g->len[g->fill[i]]);
}

/* the first damaged zone checked after node k, or -1 */
static int64_t gguflm_guards_damaged(const gguflm_guards *g, int64_t k) {
    for (int64_t i = g->check_ptr[k]; i < g->check_ptr[k + 1]; i++) {
        const uint8_t *z = g->at[g->check[i]];
        for (int64_t j = 0; j < g->len[g->check[i]]; j++)
            if (z[j] != GGUFLM_CANARY) return g->check[i];
    }
    return -1;
}

/* Run nodes[start..] up to the next LAYER node (exclusive) in the arithmetic arith
 * (GGUFLM_ARITH_*) on isa's kernels (GGUFLM_ISA_*); returns the index after it, or n_nodes at the
 * end; -1 if a kernel could not allocate its scratch; -2 if guards (NULL: no guard mode) found a
 * zone written by the step starting at node *bad_node, and *bad_zone is that zone. */
static int64_t gguflm_plan_run(const gguflm_node *nodes, int64_t start, int64_t n_nodes,
                               const ggml_half *gelu_table, int arith, int isa,
                               const gguflm_guards *guards, int64_t *bad_node, int64_t *bad_zone) {
    const int use_avx2 = isa >= GGUFLM_ISA_AVX2;  /* the ops kernels' variants: scalar and AVX2 */
    for (int64_t k = start; k < n_nodes; k++) {
        const gguflm_node *nd = &nodes[k];
        const int64_t step = k;
        float *out = (float *)nd->out;
        if (guards) gguflm_guards_fill(guards, step);
        switch (nd->op) {
        case GGUFLM_OP_LAYER:
            if (k > start) return k + 1;
            break;
        case GGUFLM_OP_GET_ROWS:
            gguflm_get_rows(nd->type, nd->w, nd->w_stride, nd->n, nd->i32, nd->n_rows, out, nd->out_stride, isa);
            break;
        case GGUFLM_OP_COPY:
            for (int64_t i = 0; i < nd->n_rows; i++)
                memcpy(out + i * nd->out_stride, nd->x + i * nd->x_stride + nd->aux, sizeof(float) * nd->n);
            break;
        case GGUFLM_OP_TAKE_ROWS:
            for (int64_t i = 0; i < nd->n_rows; i++)
                memcpy(out + i * nd->out_stride, nd->x + nd->i64[i] * nd->x_stride, sizeof(float) * nd->n);
            break;
        case GGUFLM_OP_HADAMARD:
            gguflm_hadamard_rows(nd->n_rows, nd->n, nd->aux, out, nd->out_stride, nd->n_threads);
            break;
        case GGUFLM_OP_SCALE:
            for (int64_t i = 0; i < nd->n_rows; i++)
                for (int64_t j = 0; j < nd->n; j++) out[i * nd->out_stride + j] *= nd->f;
            break;
        case GGUFLM_OP_ADD:
            for (int64_t i = 0; i < nd->n_rows; i++)
                for (int64_t j = 0; j < nd->n; j++) out[i * nd->out_stride + j] += nd->y[i * nd->y_stride + j];
            break;
        case GGUFLM_OP_ADD_ROW:
            for (int64_t i = 0; i < nd->n_rows; i++)
                for (int64_t j = 0; j < nd->n; j++) out[i * nd->out_stride + j] += ((const float *)nd->w)[j];
            break;
        case GGUFLM_OP_MUL_ROW:
            for (int64_t i = 0; i < nd->n_rows; i++)
                for (int64_t j = 0; j < nd->n; j++) out[i * nd->out_stride + j] *= ((const float *)nd->w)[j];
            break;
        case GGUFLM_OP_RMS_NORM:
            gguflm_rms_norm_rows(nd->n_rows, (int)nd->n, nd->x, nd->x_stride, (const float *)nd->w, nd->f,
                                 out, nd->out_stride, nd->n_threads);
            break;
        case GGUFLM_OP_QUANTIZE:
            gguflm_quantize_act(nd->type, nd->x, nd->x_stride, nd->n_rows, nd->n, nd->out, isa, nd->n_threads);
            break;
        case GGUFLM_OP_MATMUL: {
            /* this node and the group - 1 after it: matmuls of one input in one parallel region */
            const int n_jobs = nd->group > 1 ? nd->group : 1;
            gguflm_matmul_job jobs[GGUFLM_MAX_JOBS];
            for (int j = 0; j < n_jobs; j++) {
                const gguflm_node *m = nd + j;
                jobs[j] = (gguflm_matmul_job){m->type, m->aux, (const uint8_t *)m->w, m->w_stride, m->aux64,
                                              (const uint8_t *)m->x, (float *)m->out, m->out_stride};
            }
            gguflm_matmul_jobs(jobs, n_jobs, nd->n, nd->n_rows, isa, arith, nd->per_token, nd->n_threads);
            k += n_jobs - 1;
            break;
        }
        case GGUFLM_OP_ROPE:
            if (gguflm_rope_apply(&nd->rope, nd->i32, nd->n_rows, nd->aux, (int)(nd->n / nd->aux), out,
                                  nd->out_stride, nd->n_threads))
                return -1;
            break;
        case GGUFLM_OP_KV_STORE:
            gguflm_kv_store(nd->type, nd->out, nd->w_stride, nd->i64, nd->n_rows, nd->n, nd->x, nd->x_stride);
            break;
        case GGUFLM_OP_ATTENTION: {
            gguflm_attn_args a = nd->attn;
            a.n_kv = *nd->i32;
            a.arith = arith;
            if (gguflm_attention(&a, isa, nd->n_threads)) return -1;
            break;
        }
        case GGUFLM_OP_GLU:
            gguflm_glu_rows(nd->aux, gelu_table, nd->n_rows, (int)nd->n, nd->x, nd->x_stride, nd->y, nd->y_stride,
                            out, nd->out_stride, arith, use_avx2, nd->n_threads);
            break;
        case GGUFLM_OP_LAYER_NORM:
            gguflm_layer_norm_rows(nd->n_rows, (int)nd->n, nd->x, nd->x_stride, (const float *)nd->w, nd->y, nd->f,
                                   out, nd->out_stride, arith, use_avx2, nd->n_threads);
            break;
        case GGUFLM_OP_UNARY:
            gguflm_unary_rows(nd->aux, gelu_table, nd->n_rows, (int)nd->n, nd->x, nd->x_stride, out, nd->out_stride,
                              use_avx2, nd->n_threads);
            break;
        case GGUFLM_OP_POOL_MEAN:
            if (gguflm_pool_mean((int)nd->n_rows, (int)nd->n, nd->aux, nd->x, nd->x_stride, nd->y, out, nd->out_stride,
                                 arith, use_avx2, nd->n_threads))
                return -1;
            break;
        case GGUFLM_OP_MOE_ROUTE:
            if (gguflm_moe_route(&nd->moe, nd->x, nd->x_stride, nd->n_rows, (const float *)nd->w, arith)) return -1;
            break;
        case GGUFLM_OP_MOE_GATHER:
            if (nd->aux)
                gguflm_moe_gather_weighted(nd->x, nd->x_stride, nd->n, nd->moe.ids, nd->moe.weights, nd->moe.offsets,
                                           nd->moe.src, nd->moe.n_expert, nd->moe.n_used, out, nd->out_stride);
            else
                gguflm_moe_gather((const uint8_t *)nd->x, nd->n, nd->moe.src, nd->n_rows, (uint8_t *)nd->out);
            break;
        case GGUFLM_OP_MATMUL_ID: {
            /* this node and the group - 1 after it: experts of one input in one parallel region */
            const int n_jobs = nd->group > 1 ? nd->group : 1;
            gguflm_matmul_id_job jobs[GGUFLM_MAX_JOBS];
            for (int j = 0; j < n_jobs; j++) {
                const gguflm_node *m = nd + j;
                jobs[j] = (gguflm_matmul_id_job){m->type, m->aux, (const uint8_t *)m->w, m->w_stride, m->aux64,
                                                 (const uint8_t *)m->x, (float *)m->out, m->out_stride};
            }
            if (gguflm_matmul_id(jobs, n_jobs, nd->n, nd->moe.offsets, nd->moe.n_expert, isa, arith, nd->n_threads))
                return -1;
            k += n_jobs - 1;
            break;
        }
        case GGUFLM_OP_MOE_ONE:
            if (gguflm_moe_one(&nd->moe, (const gguflm_moe_one_args *)nd->w, isa, arith, use_avx2, nd->n_threads))
                return -1;
            break;
        case GGUFLM_OP_MOE_COMBINE:
            gguflm_moe_combine(nd->x, nd->x_stride, nd->moe.weights, nd->moe.slot, nd->n_rows, nd->moe.n_used, nd->n,
                               out, nd->out_stride);
            break;
        case GGUFLM_OP_SWIGLU_OAI:
            gguflm_swiglu_oai_rows(nd->n_rows, nd->n, nd->x, nd->x_stride, nd->y, nd->y_stride, nd->f,
                                   nd->f2, out, nd->out_stride, nd->n_threads);
            break;
        case GGUFLM_OP_MOE_ADD_ID:
            if (nd->aux)
                gguflm_moe_scale_id(out, nd->out_stride, nd->n, (const float *)nd->w, nd->moe.offsets, nd->moe.n_expert);
            else
                gguflm_moe_add_id(out, nd->out_stride, nd->n, (const float *)nd->w, nd->w_stride, nd->moe.offsets,
                                  nd->moe.n_expert);
            break;
        case GGUFLM_OP_MOE_SHARED_GATE:
            gguflm_moe_shared_gate(nd->y, nd->y_stride, nd->n_rows, nd->n, out, nd->out_stride);
            break;
        case GGUFLM_OP_RS_MOVES:
            if (gguflm_rs_moves((int32_t *)nd->i32, out, nd->n, (float *)nd->w, nd->aux64, nd->n_rows, nd->x_stride))
                return -1;
            break;
        case GGUFLM_OP_SSM_CONV:
            gguflm_ssm_conv(&nd->ssm, isa, arith, nd->n_threads);
            break;
        case GGUFLM_OP_SSM_SCAN:
            gguflm_ssm_scan(&nd->ssm, isa, nd->n_threads);
            break;
        case GGUFLM_OP_SSM_SCAN_GROUPED:
            gguflm_ssm_scan_grouped(&nd->ssm, isa, arith, nd->n_threads);
            break;
        case GGUFLM_OP_MUL:
            for (int64_t i = 0; i < nd->n_rows; i++)
                for (int64_t j = 0; j < nd->n; j++) out[i * nd->out_stride + j] *= nd->y[i * nd->y_stride + j];
            break;
        case GGUFLM_OP_GATED_DELTA_NET:
            gguflm_gated_delta_net(&nd->gdn, isa, arith, nd->n_threads);
            break;
        case GGUFLM_OP_GDN_GATES:
            gguflm_gdn_gates(nd->n_rows, nd->n, (float *)nd->x, nd->x_stride, (const float *)nd->w, nd->y, out,
                             nd->out_stride);
            break;
        case GGUFLM_OP_SIGMOID_MUL:
            gguflm_sigmoid_mul(nd->n_rows, nd->n, out, nd->out_stride, nd->y, nd->y_stride, nd->aux);
            break;
        case GGUFLM_OP_WKV:
            gguflm_wkv_run(&nd->wkv, arith, nd->n_threads);
            break;
        case GGUFLM_OP_SOFTCAP:
            for (int64_t i = 0; i < nd->n_rows; i++)
                for (int64_t j = 0; j < nd->n; j++) {
                    float *v = out + i * nd->out_stride + j;
                    *v = tanhf(*v * (1.0f / nd->f)) * nd->f;
                }
            break;
        case GGUFLM_OP_CLAMP:
            gguflm_clamp_rows(nd->n_rows, nd->n, nd->f, nd->f2, out, nd->out_stride);
            break;
        case GGUFLM_OP_ATTN_TEMP:
            gguflm_attn_temp_rows(nd->n_rows, nd->n, nd->i32, nd->f, nd->f2, (uint32_t)nd->aux64, out, nd->out_stride);
            break;
        case GGUFLM_OP_XIELU:
            gguflm_xielu_rows(nd->n_rows, nd->n, (const float *)nd->w, out, nd->out_stride);
            break;
        case GGUFLM_OP_ALTUP:
            gguflm_altup_run(&nd->altup, arith, nd->n_threads);
            break;
        }
        if (guards && (*bad_zone = gguflm_guards_damaged(guards, step)) >= 0) {
            *bad_node = step;
            return -2;
        }
    }
    return n_nodes;
}

#endif
