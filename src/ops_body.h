/* The row kernels of the forward pass, compiled once per ISA variant: ops.h includes this file
 * with GGUFLM_FN(name) naming the variant's function and GGUFLM_TARGET its target attribute.
 * The arithmetic is the same scalar expression in every variant (ops_math.h); the AVX2 variant
 * only lets the compiler use 256-bit registers, FMA and F16C for it. */

GGUFLM_TARGET static void GGUFLM_FN(gguflm_swiglu_row)(int n, const float *gate, const float *up, float *y) {
    for (int i = 0; i < n; i++) y[i] = gguflm_silu(gate[i]) * up[i];
}

GGUFLM_TARGET static void GGUFLM_FN(gguflm_geglu_row)(const ggml_half *table, int n, const float *gate,
                                                      const float *up, float *y) {
    for (int i = 0; i < n; i++) y[i] = gguflm_gelu(table, gate[i]) * up[i];
}

/* acc[lane] += x[i] * y[i] for i < n (n a multiple of 32), lanes as ggml's AVX2 dot */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_lane_dot_f16)(int n, const ggml_half *x, const float *y, float *acc) {
#if GGUFLM_VARIANT_AVX2
    __m256 a0 = _mm256_loadu_ps(acc), a1 = _mm256_loadu_ps(acc + 8);
    __m256 a2 = _mm256_loadu_ps(acc + 16), a3 = _mm256_loadu_ps(acc + 24);
    for (int i = 0; i < n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i + 8))), _mm256_loadu_ps(y + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i + 16))), _mm256_loadu_ps(y + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i + 24))), _mm256_loadu_ps(y + i + 24), a3);
    }
    _mm256_storeu_ps(acc, a0); _mm256_storeu_ps(acc + 8, a1);
    _mm256_storeu_ps(acc + 16, a2); _mm256_storeu_ps(acc + 24, a3);
#else
    for (int i = 0; i < n; i += GGUFLM_DOT_LANES)
        for (int l = 0; l < GGUFLM_DOT_LANES; l++)
            acc[l] = fmaf(gguflm_fp16_to_fp32(x[i + l]), y[i + l], acc[l]);
#endif
}

GGUFLM_TARGET static void GGUFLM_FN(gguflm_lane_dot_f32)(int n, const float *x, const float *y, float *acc) {
    for (int i = 0; i < n; i += GGUFLM_DOT_LANES)
        for (int l = 0; l < GGUFLM_DOT_LANES; l++)
            acc[l] = fmaf(x[i + l], y[i + l], acc[l]);
}

/* acc[d] += p * x[d] for d < n: one cell's V row into its lane */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_lane_axpy_f16)(int n, float p, const ggml_half *x, float *acc) {
#if GGUFLM_VARIANT_AVX2
    const __m256 vp = _mm256_set1_ps(p);
    for (int d = 0; d < n; d += 8) {
        const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + d)));
        _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(v, vp, _mm256_loadu_ps(acc + d)));
    }
#else
    for (int d = 0; d < n; d++) acc[d] = fmaf(gguflm_fp16_to_fp32(x[d]), p, acc[d]);
#endif
}

GGUFLM_TARGET static void GGUFLM_FN(gguflm_lane_axpy_f32)(int n, float p, const float *x, float *acc) {
    for (int d = 0; d < n; d++) acc[d] = fmaf(x[d], p, acc[d]);
}

/* One (token, head) of attention: scores of visible cells, softmax, P·V into out. */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_attn_one)(const gguflm_attn_args *a, int t, int h,
                                                     gguflm_attn_scratch *s) {
    const int dk = a->head_dim_k, dv = a->head_dim_v;
    const int hkv = h / (a->n_head / a->n_head_kv);
    const float *q = a->q + (int64_t)t * a->q_stride + (int64_t)h * dk;
    const int tk = a->cache_type_k, tv = a->cache_type_v;
    const char *k_base = (const char *)a->k + gguflm_cache_head_offset(tk, hkv, dk);
    const char *v_base = (const char *)a->v + gguflm_cache_head_offset(tv, hkv, dv);
    float *out = a->out + (int64_t)t * a->out_stride + (int64_t)h * dv;

    /* the query enters the K·q product in the K type's precision */
    if (tk == GGUFLM_CACHE_Q8_0) {
        gguflm_quantize_q8_0_act(dk, q, s->qq);
    } else if (tk == GGUFLM_CACHE_F16) {
        for (int d = 0; d < dk; d++) s->q[d] = gguflm_fp16_to_fp32(gguflm_fp32_to_fp16(q[d]));
    } else {
        for (int d = 0; d < dk; d++) s->q[d] = q[d];
    }

    /* scores of visible cells; ggml scales (and soft-caps) every cell, then adds the mask */
    int n_vis = 0;
    float max = -INFINITY;
    for (int c = 0; c < a->n_kv; c++) {
        if (!gguflm_attn_visible(a, t, c)) continue;
        const char *krow = k_base + (int64_t)c * a->k_row_bytes;
        float kq;
        if (tk == GGUFLM_CACHE_Q8_0) {
            kq = gguflm_dot_q8_0_lanes(dk, (const block_q8_0 *)krow, s->qq);
        } else {
            float lanes[GGUFLM_DOT_LANES] = {0};
            if (tk == GGUFLM_CACHE_F16) GGUFLM_FN(gguflm_lane_dot_f16)(dk, (const ggml_half *)krow, s->q, lanes);
            else GGUFLM_FN(gguflm_lane_dot_f32)(dk, (const float *)krow, s->q, lanes);
            kq = gguflm_reduce_lanes(lanes);
        }
        if (a->softcap > 0.0f) kq = tanhf(kq * (1.0f / a->softcap)) * a->softcap;
        kq = kq * a->kq_scale;
        s->cells[n_vis] = c;
        s->score[n_vis++] = kq;
        max = kq > max ? kq : max;
    }
    if (n_vis == 0) {  /* a token that sees nothing gets zeros (ggml would produce NaN) */
        memset(out, 0, sizeof(float) * dv);
        return;
    }

    /* softmax: ggml sums exp in groups of 8 cells (float), the groups in double; masked cells
     * contribute exact zeros, so grouping by cell index reproduces its partial sums */
    for (int i = 0; i < n_vis; i++) s->score[i] = gguflm_expf(s->score[i] - max);
    double sum = 0.0;
    float group[8] = {0};
    int group_id = s->cells[0] / 8;
    for (int i = 0; i < n_vis; i++) {
        const int c = s->cells[i];
        if (c / 8 != group_id) {
            sum += (double)gguflm_hsum8_movehl(group);
            memset(group, 0, sizeof(group));
            group_id = c / 8;
        }
        group[c % 8] = s->score[i];
    }
    sum += (double)gguflm_hsum8_movehl(group);
    const float inv_sum = (float)(1.0 / sum);

    /* P·V: each cell's probability, rounded to the V type, weights its V row into the lane that
     * ggml's dot over cells would have used */
    memset(s->acc, 0, sizeof(float) * GGUFLM_DOT_LANES * dv);
    for (int i = 0; i < n_vis; i++) {
        const int c = s->cells[i];
        float p = s->score[i] * inv_sum;
        if (tv == GGUFLM_CACHE_F16) p = gguflm_fp16_to_fp32(gguflm_fp32_to_fp16(p));
        if (p == 0.0f) continue;
        const char *vrow = v_base + (int64_t)c * a->v_row_bytes;
        float *lane = s->acc + (int64_t)(c % GGUFLM_DOT_LANES) * dv;
        if (tv == GGUFLM_CACHE_Q8_0) {
            gguflm_dequantize_q8_0_row(dv, (const block_q8_0 *)vrow, s->vrow);
            GGUFLM_FN(gguflm_lane_axpy_f32)(dv, p, s->vrow, lane);
        } else if (tv == GGUFLM_CACHE_F16) {
            GGUFLM_FN(gguflm_lane_axpy_f16)(dv, p, (const ggml_half *)vrow, lane);
        } else {
            GGUFLM_FN(gguflm_lane_axpy_f32)(dv, p, (const float *)vrow, lane);
        }
    }
    for (int d = 0; d < dv; d++) {
        float lanes[GGUFLM_DOT_LANES];
        for (int l = 0; l < GGUFLM_DOT_LANES; l++) lanes[l] = s->acc[(int64_t)l * dv + d];
        out[d] = gguflm_reduce_lanes(lanes);
    }
}
