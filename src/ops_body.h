/* The row kernels of the forward pass, compiled once per ISA variant: ops.h includes this file
 * with GGUFLM_FN(name) naming the variant's function and GGUFLM_TARGET its target attribute.
 * The arithmetic is the same in every variant (ops_math.h): the AVX2 variant lets the compiler use
 * 256-bit registers, FMA and F16C for the scalar expressions, and where it would not keep FMA
 * chains in registers (batch K·q, P·V) spells the same operations with intrinsics. */

GGUFLM_TARGET static void GGUFLM_FN(gguflm_swiglu_row)(int n, const float *gate, const float *up, float *y,
                                                       int arith) {
    if (gguflm_arith_avx512(arith))  /* constant arithmetic in each loop, so both vectorise */
        for (int i = 0; i < n; i++) y[i] = gguflm_silu(gate[i], GGUFLM_ARITH_AVX512) * up[i];
    else
        for (int i = 0; i < n; i++) y[i] = gguflm_silu(gate[i], GGUFLM_ARITH_AVX2) * up[i];
}

#if GGUFLM_VARIANT_AVX2
/* gguflm_gelu on 8 values: the fp16 index by F16C, the table entries gathered (4 bytes from each
 * entry: the table has one spare entry at its end), the saturation blended in */
GGUFLM_TARGET static inline __attribute__((always_inline)) __m256 GGUFLM_FN(gguflm_gelu8)(const ggml_half *table,
                                                                                        __m256 x) {
    const __m256i idx = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    const __m256i g = _mm256_and_si256(_mm256_i32gather_epi32((const int *)table, idx, 2), _mm256_set1_epi32(0xffff));
    __m256 y = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1)));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-10.0f), _CMP_LE_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, _mm256_set1_ps(10.0f), _CMP_GE_OQ));
}
#endif

GGUFLM_TARGET static void GGUFLM_FN(gguflm_geglu_row)(const ggml_half *table, int n, const float *gate,
                                                      const float *up, float *y) {
    int i = 0;
#if GGUFLM_VARIANT_AVX2
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(GGUFLM_FN(gguflm_gelu8)(table, _mm256_loadu_ps(gate + i)),
                                              _mm256_loadu_ps(up + i)));
#endif
    for (; i < n; i++) y[i] = gguflm_gelu(table, gate[i]) * up[i];
}

/* y[i] = x[i] as floats (fp16 -> fp32 is exact) */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_f16_row_to_f32)(int n, const ggml_half *x, float *y) {
    int i = 0;
#if GGUFLM_VARIANT_AVX2
    /* whole vectors only: y is exactly n floats (a head of 36 values must not spill into the
     * scratch that follows it) */
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
#endif
    for (; i < n; i++) y[i] = gguflm_fp16_to_fp32(x[i]);
}

/* x[i] = fp16(x[i] * scale) as floats, for i < n (scale 1 rounds exactly: x * 1 = x) */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_scale_round_f16)(int n, float scale, float *x) {
    int i = 0;
#if GGUFLM_VARIANT_AVX2
    const __m256 sv = _mm256_set1_ps(scale);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv),
                                                                _MM_FROUND_TO_NEAREST_INT)));
#endif
    for (; i < n; i++) x[i] = gguflm_fp16_to_fp32(gguflm_fp32_to_fp16(x[i] * scale));
}

/* acc[d] += x[d] * p for d < n: one cell's V values into its lane (fused, or with the product
 * rounded first when `fused` is 0, as ggml_vec_dot_f32's leftover loop does for most elements) */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_lane_axpy)(int n, float p, const float *restrict x, float *restrict acc) {
    for (int d = 0; d < n; d++) acc[d] = fmaf(x[d], p, acc[d]);
}

GGUFLM_TARGET static void GGUFLM_FN(gguflm_tail_axpy)(int n, float p, const float *restrict x, float *restrict acc,
                                                      int fused) {
    if (fused)
        for (int d = 0; d < n; d++) acc[d] = fmaf(x[d], p, acc[d]);
    else
        for (int d = 0; d < n; d++) acc[d] = acc[d] + x[d] * p;
}

/* out[d] = the sum of the n_lanes lanes of column d (lane l at acc[l * stride + d]) for d < n,
 * in the order of the dot that keeps that many lanes: llamafile sgemm's one vector (8 or 16),
 * vec_dot's four vectors (32 or 64); all columns at once, so that it vectorises. acc is consumed. */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_reduce_cols)(float *acc, int64_t stride, int n_lanes, int n, float *out) {
#define GGUFLM_LANE(l) acc[(int64_t)(l) * stride + d]
    int hadd = 0;
    if (n_lanes == 64) {         /* (acc0 + acc2) + (acc1 + acc3), 16-lane vectors: into lanes 0-15 */
        for (int l = 0; l < 16; l++)
            for (int d = 0; d < n; d++)
                GGUFLM_LANE(l) = (GGUFLM_LANE(l) + GGUFLM_LANE(32 + l)) + (GGUFLM_LANE(16 + l) + GGUFLM_LANE(48 + l));
        n_lanes = 16;
    } else if (n_lanes == 32) {  /* the same with 8-lane vectors, then hadd */
        for (int l = 0; l < 8; l++)
            for (int d = 0; d < n; d++)
                GGUFLM_LANE(l) = (GGUFLM_LANE(l) + GGUFLM_LANE(16 + l)) + (GGUFLM_LANE(8 + l) + GGUFLM_LANE(24 + l));
        n_lanes = 8;
        hadd = 1;
    }
    if (n_lanes == 16)           /* _mm512_reduce_add_ps: upper 8 lanes onto the lower */
        for (int l = 0; l < 8; l++)
            for (int d = 0; d < n; d++) GGUFLM_LANE(l) = GGUFLM_LANE(l) + GGUFLM_LANE(8 + l);
    for (int d = 0; d < n; d++) {
        const float t0 = GGUFLM_LANE(0) + GGUFLM_LANE(4), t1 = GGUFLM_LANE(1) + GGUFLM_LANE(5);
        const float t2 = GGUFLM_LANE(2) + GGUFLM_LANE(6), t3 = GGUFLM_LANE(3) + GGUFLM_LANE(7);
        out[d] = hadd ? (t0 + t1) + (t2 + t3) : (t0 + t2) + (t1 + t3);
    }
#undef GGUFLM_LANE
}

/* res[j * res_stride + i] = the dot of a[i] (n values, F16 when a_f16, else F32) and b[j] (F32),
 * for i < ma, j < nb, in the lane order of ggml's float dots: n_lanes 8 or 16 is llamafile's sgemm
 * (one chain of that many lanes, summed as gguflm_hsum_vec), 32 or 64 is ggml_vec_dot_f16/f32
 * (four accumulator vectors, reduced as gguflm_reduce_cols). n is a multiple of n_lanes. */
#if GGUFLM_VARIANT_AVX2
GGUFLM_TARGET static inline __attribute__((always_inline)) __m256 GGUFLM_FN(gguflm_row8)(const void *p, int f16, int64_t k) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const ggml_half *)p + k)))
               : _mm256_loadu_ps((const float *)p + k);
}

/* a tile of RM rows of a by RN rows of b, NV 8-float vectors per step (n_lanes / 8); at most 12
 * accumulators, so that they stay in registers */
GGUFLM_TARGET static inline __attribute__((always_inline)) void GGUFLM_FN(gguflm_dots_tile)(
        int n, const void *const *a, int a_f16, int RM, const float *const *b, int RN, int NV, float *res,
        int64_t res_stride) {
    __m256 acc[3][4][8];
    for (int i = 0; i < RM; i++)
        for (int j = 0; j < RN; j++)
            for (int h = 0; h < NV; h++) acc[i][j][h] = _mm256_setzero_ps();
    for (int k = 0; k < n; k += 8 * NV)
        for (int h = 0; h < NV; h++) {
            __m256 av[3];
            for (int i = 0; i < RM; i++) av[i] = GGUFLM_FN(gguflm_row8)(a[i], a_f16, k + 8 * h);
            for (int j = 0; j < RN; j++) {
                const __m256 bv = _mm256_loadu_ps(b[j] + k + 8 * h);
                for (int i = 0; i < RM; i++) acc[i][j][h] = _mm256_fmadd_ps(av[i], bv, acc[i][j][h]);
            }
        }
    for (int i = 0; i < RM; i++)
        for (int j = 0; j < RN; j++) {
            const __m256 *x = acc[i][j];
            __m256 v;
            if (NV == 1) v = x[0];
            else if (NV == 2) v = _mm256_add_ps(x[0], x[1]);        /* 16 lanes: upper half onto lower */
            else if (NV == 4) v = _mm256_add_ps(_mm256_add_ps(x[0], x[2]), _mm256_add_ps(x[1], x[3]));
            else                                                     /* 16-lane vectors (x[2k], x[2k+1]) */
                v = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(x[0], x[4]), _mm256_add_ps(x[2], x[6])),
                                  _mm256_add_ps(_mm256_add_ps(x[1], x[5]), _mm256_add_ps(x[3], x[7])));
            __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            if (NV == 4) {  /* ggml's AVX2 dot ends with two hadds, everything else movehl, movehdup */
                r = _mm_hadd_ps(r, r);
                r = _mm_hadd_ps(r, r);
            } else {
                r = _mm_add_ps(r, _mm_movehl_ps(r, r));
                r = _mm_add_ss(r, _mm_movehdup_ps(r));
            }
            res[j * res_stride + i] = _mm_cvtss_f32(r);
        }
}

GGUFLM_TARGET static void GGUFLM_FN(gguflm_dots_block)(int n, const void *const *a, int a_f16, int ma,
                                                       const float *const *b, int nb, int n_lanes, float *res,
                                                       int64_t res_stride) {
    /* constant tile shapes per lane count: (rows of a, rows of b) = (3, 4), (3, 2), (3, 1), (1, 1) */
#define GGUFLM_DOTS_TILE(RM_, RN_, NV_) \
    GGUFLM_FN(gguflm_dots_tile)(n, a + i, a_f16, RM_, b + j, RN_, NV_, res + j * res_stride + i, res_stride)
#define GGUFLM_DOTS_TILES(RN_, NV_)                                              \
    for (int i = 0; i < ma; i += 3) {                                            \
        const int rm = ma - i < 3 ? ma - i : 3;                                  \
        int j = 0;                                                               \
        for (; j + RN_ <= nb; j += RN_) {                                        \
            if (rm == 3) GGUFLM_DOTS_TILE(3, RN_, NV_);                          \
            else if (rm == 2) GGUFLM_DOTS_TILE(2, RN_, NV_);                     \
            else GGUFLM_DOTS_TILE(1, RN_, NV_);                                  \
        }                                                                        \
        for (; j < nb; j++) {                                                    \
            if (rm == 3) GGUFLM_DOTS_TILE(3, 1, NV_);                            \
            else if (rm == 2) GGUFLM_DOTS_TILE(2, 1, NV_);                       \
            else GGUFLM_DOTS_TILE(1, 1, NV_);                                    \
        }                                                                        \
    }
    switch (n_lanes) {
    case 8: GGUFLM_DOTS_TILES(4, 1); break;
    case 16: GGUFLM_DOTS_TILES(2, 2); break;
    case 32: GGUFLM_DOTS_TILES(1, 4); break;
    default:
        for (int i = 0; i < ma; i++)
            for (int j = 0; j < nb; j++) GGUFLM_DOTS_TILE(1, 1, 8);
        break;
    }
#undef GGUFLM_DOTS_TILES
#undef GGUFLM_DOTS_TILE
}
#else
GGUFLM_TARGET static void GGUFLM_FN(gguflm_dots_block)(int n, const void *const *a, int a_f16, int ma,
                                                       const float *const *b, int nb, int n_lanes, float *res,
                                                       int64_t res_stride) {
    for (int i = 0; i < ma; i++)
        for (int j = 0; j < nb; j++) {
            float lanes[GGUFLM_MAX_LANES] = {0};
            for (int k = 0; k < n; k += n_lanes)
                for (int l = 0; l < n_lanes; l++) {
                    const float x = a_f16 ? gguflm_fp16_to_fp32(((const ggml_half *)a[i])[k + l]) : ((const float *)a[i])[k + l];
                    lanes[l] = fmaf(x, b[j][k + l], lanes[l]);
                }
            GGUFLM_FN(gguflm_reduce_cols)(lanes, 1, n_lanes, 1, res + j * res_stride + i);
        }
}
#endif

/* s->acc[g][lane][d] (DBLOCK apart) = the P·V lanes of head g for value dimensions d0 + d, d < db:
 * cell cells[i]'s V values times its probability s->score[g * n_vis + i] go into lane
 * cells[i] % v_lanes, in cell order, for the first n_use cells */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_pv_lanes_generic)(const gguflm_attn_args *a, const char *v_base,
                                                             const int32_t *cells, int n_use, int n_vis, int gqa,
                                                             int v_lanes, int d0, int db, gguflm_attn_scratch *s) {
    const int tv = a->cache_type_v, dv = a->head_dim_v;
    memset(s->acc, 0, sizeof(float) * v_lanes * GGUFLM_ATTN_DBLOCK * gqa);
    for (int i = 0; i < n_use; i++) {
        const int c = cells[i];
        const char *vrow = v_base + (int64_t)c * a->v_row_bytes;
        const float *vf;
        if (tv == GGUFLM_CACHE_F16) {
            GGUFLM_FN(gguflm_f16_row_to_f32)(db, (const ggml_half *)vrow + d0, s->row);
            vf = s->row;
        } else if (tv == GGUFLM_CACHE_Q8_0) {
            gguflm_dequantize_q8_0_row(dv, (const block_q8_0 *)vrow, s->row);
            vf = s->row + d0;
        } else {
            vf = (const float *)vrow + d0;
        }
        for (int g = 0; g < gqa; g++) {
            const float p = s->score[(int64_t)g * n_vis + i];
            if (p == 0.0f) continue;  /* adds nothing */
            float *lane = s->acc + ((int64_t)g * v_lanes + c % v_lanes) * GGUFLM_ATTN_DBLOCK;
            GGUFLM_FN(gguflm_lane_axpy)(db, p, vf, lane);
        }
    }
}

#if GGUFLM_VARIANT_AVX2
/* one pass of gguflm_pv_lanes: heads g0 .. g0+ng-1 (ng <= NH), NV vectors of dimensions from d0+dd */
GGUFLM_TARGET static inline __attribute__((always_inline)) void GGUFLM_FN(gguflm_pv_pass)(
        const gguflm_attn_args *a, const char *v_base, const int32_t *cells, int n_vis, const int *start,
        int v_lanes, int d0, int dd, int g0, int ng, int NH, int NV, int f16, gguflm_attn_scratch *s) {
    for (int l = 0; l < v_lanes; l++) {
        __m256 t[4][8];
        for (int g = 0; g < NH; g++)
            for (int h = 0; h < NV; h++) t[g][h] = _mm256_setzero_ps();
        for (int k = start[l]; k < start[l + 1]; k++) {
            const int i = s->order[k];
            const char *vrow = v_base + (int64_t)cells[i] * a->v_row_bytes;
            __m256 v[8];
            for (int h = 0; h < NV; h++)
                v[h] = f16
                           ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const ggml_half *)vrow + d0 + dd + 8 * h)))
                           : _mm256_loadu_ps((const float *)vrow + d0 + dd + 8 * h);
            for (int g = 0; g < NH && g < ng; g++) {
                const __m256 p = _mm256_set1_ps(s->score[(int64_t)(g0 + g) * n_vis + i]);
                for (int h = 0; h < NV; h++) t[g][h] = _mm256_fmadd_ps(v[h], p, t[g][h]);
            }
        }
        for (int g = 0; g < NH && g < ng; g++)
            for (int h = 0; h < NV; h++)
                _mm256_storeu_ps(s->acc + ((int64_t)(g0 + g) * v_lanes + l) * GGUFLM_ATTN_DBLOCK + dd + 8 * h, t[g][h]);
    }
}

/* The same for float V: cells bucketed by lane (start and s->order from gguflm_order_by_lane), then
 * per lane the lane's FMA chains
 * run in registers: 64 dimensions of one head, or 16 dimensions of up to 4 heads, at a time.
 * p = 0 adds an exact zero. */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_pv_lanes)(const gguflm_attn_args *a, const char *v_base,
                                                     const int32_t *cells, int n_use, int n_vis, const int *start,
                                                     int gqa, int v_lanes, int d0, int db, gguflm_attn_scratch *s) {
    if (a->cache_type_v == GGUFLM_CACHE_Q8_0 || db % 16) {
        GGUFLM_FN(gguflm_pv_lanes_generic)(a, v_base, cells, n_use, n_vis, gqa, v_lanes, d0, db, s);
        return;
    }
    /* constant shapes and V type per call, so that the accumulators stay in registers */
#define GGUFLM_PV_PASS(G0, NG, NH, NV)                                                                          \
    do {                                                                                                        \
        if (a->cache_type_v == GGUFLM_CACHE_F16)                                                                \
            GGUFLM_FN(gguflm_pv_pass)(a, v_base, cells, n_vis, start, v_lanes, d0, dd, G0, NG, NH, NV, 1, s);  \
        else                                                                                                    \
            GGUFLM_FN(gguflm_pv_pass)(a, v_base, cells, n_vis, start, v_lanes, d0, dd, G0, NG, NH, NV, 0, s);  \
    } while (0)
    for (int dd = 0; dd < db;) {
        if (gqa == 1 && db - dd >= 64) {
            GGUFLM_PV_PASS(0, 1, 1, 8);
            dd += 64;
            continue;
        }
        for (int g0 = 0; g0 < gqa; g0 += 4) GGUFLM_PV_PASS(g0, gqa - g0 < 4 ? gqa - g0 : 4, 4, 2);
        dd += 16;
    }
#undef GGUFLM_PV_PASS
}
#else
GGUFLM_TARGET static void GGUFLM_FN(gguflm_pv_lanes)(const gguflm_attn_args *a, const char *v_base,
                                                     const int32_t *cells, int n_use, int n_vis, const int *start,
                                                     int gqa, int v_lanes, int d0, int db, gguflm_attn_scratch *s) {
    (void)start;
    GGUFLM_FN(gguflm_pv_lanes_generic)(a, v_base, cells, n_use, n_vis, gqa, v_lanes, d0, db, s);
}
#endif

/* One head's scores sc[i] of the visible cells cells[i] (ascending) become probabilities, as ggml
 * computes them: every score scaled (and soft-capped, or given its ALiBi bias), the max taken, then
 * exp summed one vector of cells at a time (float), the vectors in double; masked cells contribute
 * exact zeros, so grouping by cell index reproduces its partial sums. Without a cache, the cells
 * past the last whole vector take libm's expf and are summed one by one, as ggml's tail loop. The
 * probabilities are then rounded to the V type, as ggml's P·V matmul takes them. t is the token,
 * h the query head. */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_softmax_cells)(const gguflm_attn_args *a, int t, int h, const int32_t *cells,
                                                          int n_vis, float *sc) {
    const int vec = gguflm_vec_lanes(a->arith);
    const int n_main = gguflm_cells_before(cells, n_vis, gguflm_tail_start(a, vec));
    const float slope = a->max_bias > 0.0f ? gguflm_alibi_slope(a->max_bias, a->n_head, h) : 0.0f;
    float max = -INFINITY;
    for (int i = 0; i < n_vis; i++) {
        float kq = sc[i];
        if (a->softcap > 0.0f) kq = tanhf(kq * (1.0f / a->softcap)) * a->softcap;
        kq = kq * a->kq_scale;
        if (a->max_bias > 0.0f)  /* the mask holds -|p0 - p1|; GCC fuses ggml's wp += slope*mask */
            kq = fmaf(slope, (float)-abs(a->cell_pos[cells[i]] - a->tok_pos[t]), kq);
        sc[i] = kq;
        max = kq > max ? kq : max;
    }
    if (a->sinks) max = max > a->sinks[h] ? max : a->sinks[h];
    if (gguflm_arith_avx512(a->arith))
        for (int i = 0; i < n_main; i++) sc[i] = gguflm_expf_avx512(sc[i] - max);
    else
        for (int i = 0; i < n_main; i++) sc[i] = gguflm_expf(sc[i] - max);
    double sum = 0.0;
    if (n_main > 0) {
        float group[16] = {0};
        int group_id = cells[0] / vec;
        for (int i = 0; i < n_main; i++) {
            const int c = cells[i];
            if (c / vec != group_id) {
                sum += (double)gguflm_hsum_vec(group, vec);
                memset(group, 0, sizeof(group));
                group_id = c / vec;
            }
            group[c % vec] = sc[i];
        }
        sum += (double)gguflm_hsum_vec(group, vec);
    }
    for (int i = n_main; i < n_vis; i++) {
        sc[i] = expf(sc[i] - max);
        sum += (double)sc[i];
    }
    if (a->sinks) sum += (double)expf(a->sinks[h] - max);
    const float inv_sum = (float)(1.0 / sum);
    for (int i = 0; i < n_vis; i++) {
        const float p = sc[i] * inv_sum;
        sc[i] = a->cache_type_v == GGUFLM_CACHE_F16 ? gguflm_fp16_to_fp32(gguflm_fp32_to_fp16(p)) : p;
    }
}

/* out = P·V of token t, query heads h0 .. h0+nh-1 (probabilities s->score[g * n_vis + i]), a block of
 * value dimensions at a time so that every head's lanes stay in cache: the first n_vis_v cells go
 * into their lanes (start and s->order from gguflm_order_by_lane), the lanes are reduced, then the
 * cells of a tail (only F32 V has them) follow one by one, those from cell v_fused on fused */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_pv_out)(const gguflm_attn_args *a, int t, int h0, int nh, const char *v_base,
                                                   const int32_t *cells, int n_vis, int n_vis_v, int v_fused,
                                                   const int *start, int v_lanes, gguflm_attn_scratch *s) {
    const int dv = a->head_dim_v;
    for (int d0 = 0; d0 < dv; d0 += GGUFLM_ATTN_DBLOCK) {
        const int db = dv - d0 < GGUFLM_ATTN_DBLOCK ? dv - d0 : GGUFLM_ATTN_DBLOCK;
        GGUFLM_FN(gguflm_pv_lanes)(a, v_base, cells, n_vis_v, n_vis, start, nh, v_lanes, d0, db, s);
        for (int g = 0; g < nh; g++) {
            float *out = a->out + (int64_t)t * a->out_stride + (int64_t)(h0 + g) * dv + d0;
            GGUFLM_FN(gguflm_reduce_cols)(s->acc + (int64_t)g * v_lanes * GGUFLM_ATTN_DBLOCK, GGUFLM_ATTN_DBLOCK, v_lanes,
                                          db, out);
            for (int i = n_vis_v; i < n_vis; i++) {
                const float *vr = (const float *)(v_base + (int64_t)cells[i] * a->v_row_bytes) + d0;
                GGUFLM_FN(gguflm_tail_axpy)(db, s->score[(int64_t)g * n_vis + i], vr, out, cells[i] >= v_fused);
            }
        }
    }
}

/* The tail of F32 dots (after k_main elements of dk) of nq queries qrows against m K rows, whose
 * tail is kt transposed ([dk - k_main][m]): one chain per score, the cells' chains side by side so
 * that they vectorise; sc[g * sc_stride + i] holds the main part and gets the whole score */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_dots_f32_tail)(int k_main, int dk, const float *restrict kt, int m,
                                                          const float *const *qrows, int nq, float *restrict sc,
                                                          int64_t sc_stride, int arith) {
    const int nt = dk - k_main, split = gguflm_dot_f32_unfused(nt, arith);
    for (int g = 0; g < nq; g++) {
        float *restrict acc = sc + g * sc_stride;
        const float *qg = qrows[g] + k_main;
        for (int d = 0; d < split; d++) {
            const float *restrict kd = kt + (int64_t)d * m;
            const float qd = qg[d];
            for (int i = 0; i < m; i++) acc[i] = acc[i] + kd[i] * qd;
        }
        for (int d = split; d < nt; d++) {
            const float *restrict kd = kt + (int64_t)d * m;
            const float qd = qg[d];
            for (int i = 0; i < m; i++) acc[i] = fmaf(kd[i], qd, acc[i]);
        }
    }
}

/* One token t, the query heads h0 .. h0+nh-1 (all sharing one KV head), over the n_vis cells `cells`
 * the token sees (ascending): K and V rows are read once for all those heads; every head keeps
 * ggml's lane order. */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_attn_heads)(const gguflm_attn_args *a, int t, int h0, int nh,
                                                       const int32_t *cells, int n_vis, gguflm_attn_scratch *s) {
    const int dk = a->head_dim_k, dv = a->head_dim_v, hkv = h0 / (a->n_head / a->n_head_kv);
    const int tk = a->cache_type_k, tv = a->cache_type_v;
    const char *k_base = (const char *)a->k + gguflm_cache_head_offset(tk, hkv, dk);
    const char *v_base = (const char *)a->v + gguflm_cache_head_offset(tv, hkv, dv);
    const int64_t q8_blocks = dk / QK8_0;
    /* ggml hands batches of float K/V to llamafile's sgemm, single tokens to vec_dot; an F32 K
     * misses sgemm because the permuted queries are not contiguous and need no conversion */
    const int batch = gguflm_attn_batched(a, t), vec = gguflm_vec_lanes(a->arith), dot = gguflm_dot_lanes(a->arith);
    const int k_lanes = batch && tk == GGUFLM_CACHE_F16 ? vec : dot;
    /* sgemm also needs whole vectors of cells, which a padded cache always has */
    const int v_lanes = batch && tv != GGUFLM_CACHE_Q8_0 && dv % 4 == 0 && a->n_cols % vec == 0 ? vec : dot;
    /* a vec_dot leaves the elements after its last whole step to a scalar sum (in double for F16,
     * an FMA chain for F32) */
    const int k_main = dk - dk % k_lanes;
    /* without a cache, P·V's vec_dot leaves the cells after its last whole step to a scalar loop */
    const int v_main = gguflm_tail_start(a, v_lanes);
    const int n_vis_v = gguflm_cells_before(cells, n_vis, v_main);
    const int v_fused = n_vis_v < n_vis ? v_main + gguflm_dot_f32_unfused(a->n_cols - v_main, a->arith) : 0;

    if (n_vis == 0) {  /* a token that sees nothing gets zeros (ggml would produce NaN) */
        for (int g = 0; g < nh; g++) memset(a->out + (int64_t)t * a->out_stride + (int64_t)(h0 + g) * dv, 0, sizeof(float) * dv);
        return;
    }

    /* the queries enter the K·q product in the K type's precision */
    for (int g = 0; g < nh; g++) {
        const float *q = a->q + (int64_t)t * a->q_stride + (int64_t)(h0 + g) * dk;
        float *qg = s->q + (int64_t)g * dk;
        if (tk == GGUFLM_CACHE_Q8_0) gguflm_quantize_q8_0_act(dk, q, s->qq + g * q8_blocks);
        else if (tk == GGUFLM_CACHE_F16) for (int d = 0; d < dk; d++) qg[d] = gguflm_fp16_to_fp32(gguflm_fp32_to_fp16(q[d]));
        else for (int d = 0; d < dk; d++) qg[d] = q[d];
    }

    /* scores, GGUFLM_ATTN_CBLOCK cells at a time, every head together */
    const float *qrows[GGUFLM_MAX_GQA];
    for (int g = 0; g < nh; g++) qrows[g] = s->q + (int64_t)g * dk;
    for (int i0 = 0; i0 < n_vis; i0 += GGUFLM_ATTN_CBLOCK) {
        const int nc = n_vis - i0 < GGUFLM_ATTN_CBLOCK ? n_vis - i0 : GGUFLM_ATTN_CBLOCK;
        const void *krows[GGUFLM_ATTN_CBLOCK];
        for (int ci = 0; ci < nc; ci++) krows[ci] = k_base + (int64_t)cells[i0 + ci] * a->k_row_bytes;
        if (tk == GGUFLM_CACHE_Q8_0) {
            for (int ci = 0; ci < nc; ci++)
                for (int g = 0; g < nh; g++)
                    s->score[(int64_t)g * n_vis + i0 + ci] =
                        gguflm_dot_q8_0_lanes(dk, (const block_q8_0 *)krows[ci], s->qq + g * q8_blocks);
            continue;
        }
        const int k_f16 = tk == GGUFLM_CACHE_F16;
        GGUFLM_FN(gguflm_dots_block)(k_main, krows, k_f16, nc, qrows, nh, k_lanes, s->score + i0, n_vis);
        if (k_main < dk && tk == GGUFLM_CACHE_F32) {
            float kt[GGUFLM_MAX_LANES * GGUFLM_ATTN_CBLOCK];
            for (int ci = 0; ci < nc; ci++)
                for (int d = k_main; d < dk; d++) kt[(d - k_main) * nc + ci] = ((const float *)krows[ci])[d];
            GGUFLM_FN(gguflm_dots_f32_tail)(k_main, dk, kt, nc, qrows, nh, s->score + i0, n_vis, a->arith);
        }
        else if (k_main < dk)
            for (int g = 0; g < nh; g++)
                for (int ci = 0; ci < nc; ci++) {
                    double rest = 0.0;
                    for (int d = k_main; d < dk; d++) {
                        const float kv = k_f16 ? gguflm_fp16_to_fp32(((const ggml_half *)krows[ci])[d])
                                               : ((const float *)krows[ci])[d];
                        rest += (double)(kv * qrows[g][d]);
                    }
                    float *sc = s->score + (int64_t)g * n_vis + i0 + ci;
                    *sc = (float)((double)*sc + rest);
                }
    }
    for (int g = 0; g < nh; g++)
        GGUFLM_FN(gguflm_softmax_cells)(a, t, h0 + g, cells, n_vis, s->score + (int64_t)g * n_vis);

    /* P·V: each cell's V values go into the lane that ggml's dot over cells would have used */
    int start[GGUFLM_MAX_LANES + 1];
    gguflm_order_by_lane(cells, n_vis_v, v_lanes, start, s->order);
    GGUFLM_FN(gguflm_pv_out)(a, t, h0, nh, v_base, cells, n_vis, n_vis_v, v_fused, start, v_lanes, s);
}


/* gguflm_reduce_cols for lanes of which only those in `present` hold values (the others would be
 * zeros): the same tree, with a branch that has no value skipped, which x + 0 = x makes exact (a
 * lane holding -0, where ggml's + 0 would give +0, needs products cancelling to an exact zero).
 * The sums go into the lanes' own buffers; acc is consumed. */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_reduce_cols_sparse)(float *acc, int64_t stride, int n_lanes, int n,
                                                              uint64_t present, float *out) {
    float *node[GGUFLM_MAX_LANES];
    for (int l = 0; l < n_lanes; l++) node[l] = (present >> l) & 1u ? acc + (int64_t)l * stride : NULL;
#define GGUFLM_ADD(dst, a, b)                                                        \
    do {                                                                            \
        float *x_ = node[a], *y_ = node[b];                                         \
        if (x_ && y_)                                                               \
            for (int d = 0; d < n; d++) x_[d] = x_[d] + y_[d];                      \
        node[dst] = x_ ? x_ : y_;                                                   \
    } while (0)
    int hadd = 0;
    if (n_lanes == 64) {         /* (acc0 + acc2) + (acc1 + acc3) of 16-lane vectors, into lanes 0-15 */
        for (int l = 0; l < 16; l++) {
            GGUFLM_ADD(32 + l, l, 32 + l);
            GGUFLM_ADD(48 + l, 16 + l, 48 + l);
            GGUFLM_ADD(l, 32 + l, 48 + l);
        }
        n_lanes = 16;
    } else if (n_lanes == 32) {
        for (int l = 0; l < 8; l++) {
            GGUFLM_ADD(16 + l, l, 16 + l);
            GGUFLM_ADD(24 + l, 8 + l, 24 + l);
            GGUFLM_ADD(l, 16 + l, 24 + l);
        }
        hadd = 1;
    }
    if (n_lanes == 16)
        for (int l = 0; l < 8; l++) GGUFLM_ADD(l, l, 8 + l);
    for (int l = 0; l < 4; l++) GGUFLM_ADD(l, l, 4 + l);               /* t0 .. t3 */
    if (hadd) {
        GGUFLM_ADD(0, 0, 1);
        GGUFLM_ADD(2, 2, 3);
        GGUFLM_ADD(0, 0, 2);
    } else {
        GGUFLM_ADD(0, 0, 2);
        GGUFLM_ADD(1, 1, 3);
        GGUFLM_ADD(0, 0, 1);
    }
#undef GGUFLM_ADD
    if (node[0])
        memcpy(out, node[0], sizeof(float) * n);
    else
        memset(out, 0, sizeof(float) * n);
}

/* P·V of token t, query heads h0 .. h0+nh-1, F32 V, over the m cells seq (ascending; probabilities
 * s->score[g * ms + i]): only the lanes cells fall in are accumulated and reduced (few cells of many
 * lanes: an encoder's sequence in a long ubatch), then the tail cells from m_v on follow one by
 * one, those from cell v_fused on fused */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_pv_sparse)(const gguflm_attn_args *a, int t, int h0, int nh,
                                                      const char *v_base, const int32_t *seq, int m, int ms, int m_v,
                                                      int v_fused, int v_lanes, gguflm_attn_scratch *s) {
    const int dv = a->head_dim_v;
    for (int g = 0; g < nh; g++) {
        const float *p = s->score + (int64_t)g * ms;
        float *out = a->out + (int64_t)t * a->out_stride + (int64_t)(h0 + g) * dv;
        for (int d0 = 0; d0 < dv; d0 += GGUFLM_ATTN_DBLOCK) {
            const int db = dv - d0 < GGUFLM_ATTN_DBLOCK ? dv - d0 : GGUFLM_ATTN_DBLOCK;
            uint64_t present = 0;
            for (int i = 0; i < m_v; i++) {
                if (p[i] == 0.0f) continue;  /* adds nothing */
                const int l = seq[i] % v_lanes;
                float *lane = s->acc + (int64_t)l * GGUFLM_ATTN_DBLOCK;
                const float *vr = (const float *)(v_base + (int64_t)seq[i] * a->v_row_bytes) + d0;
                const float pi = p[i];
                if ((present >> l) & 1u) {
                    GGUFLM_FN(gguflm_lane_axpy)(db, pi, vr, lane);
                } else {  /* the lane's first cell: onto zero */
                    for (int d = 0; d < db; d++) lane[d] = fmaf(vr[d], pi, 0.0f);
                    present |= 1ull << l;
                }
            }
            GGUFLM_FN(gguflm_reduce_cols_sparse)(s->acc, GGUFLM_ATTN_DBLOCK, v_lanes, db, present, out + d0);
            for (int i = m_v; i < m; i++) {
                const float *vr = (const float *)(v_base + (int64_t)seq[i] * a->v_row_bytes) + d0;
                const float pi = p[i];
                GGUFLM_FN(gguflm_tail_axpy)(db, pi, vr, out + d0, seq[i] >= v_fused);
            }
        }
    }
}

/* ---- without a cache: a sequence's tokens at a time ---- */

/* Tokens cells[0 .. nt) of a sequence whose cells are seq[0 .. m) (ascending), KV head hkv, every
 * query head of its group: F32 K and V without a cache, no causal mask and no window, so that each
 * token sees exactly its sequence's cells. K's tail is transposed once for all of them; every score
 * and output then follows gguflm_attn_heads' arithmetic.
 * kt: [64 * (m + 15)] floats and kptr: [m] pointers of scratch; s->score holds gqa rows of m + 15. */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_attn_seq)(const gguflm_attn_args *a, int hkv, const int32_t *seq, int m,
                                                     const int32_t *cells, int nt, float *kt, const void **kptr,
                                                     gguflm_attn_scratch *s) {
    const int dk = a->head_dim_k, dv = a->head_dim_v, gqa = a->n_head / a->n_head_kv, h0 = hkv * gqa;
    const char *k_base = (const char *)a->k + gguflm_cache_head_offset(GGUFLM_CACHE_F32, hkv, dk);
    const char *v_base = (const char *)a->v + gguflm_cache_head_offset(GGUFLM_CACHE_F32, hkv, dv);
    const int batch = a->n_tok >= 2, vec = gguflm_vec_lanes(a->arith), dot = gguflm_dot_lanes(a->arith);
    const int k_main = dk - dk % dot;   /* F32 K: vec_dot's lanes */
    const int v_lanes = batch && dv % 4 == 0 && a->n_cols % vec == 0 ? vec : dot;
    const int v_main = gguflm_tail_start(a, v_lanes);
    const int m_v = gguflm_cells_before(seq, m, v_main);
    const int v_fused = m_v < m ? v_main + gguflm_dot_f32_unfused(a->n_cols - v_main, a->arith) : 0;

    /* scores and K's transposed tail in rows of ms >= m (whole vectors, so that the tail
     * vectorises without a remainder; the padding is computed and never read) */
    const int ms = (m + 15) / 16 * 16;
    for (int i = 0; i < m; i++) kptr[i] = k_base + (int64_t)seq[i] * a->k_row_bytes;
    for (int d = k_main; d < dk; d++) {
        float *row = kt + (int64_t)(d - k_main) * ms;
        for (int i = 0; i < m; i++) row[i] = ((const float *)kptr[i])[d];
        for (int i = m; i < ms; i++) row[i] = 0.0f;
    }

    for (int ti = 0; ti < nt; ti++) {
        const int t = cells[ti];
        const float *qrows[GGUFLM_MAX_GQA];
        for (int g = 0; g < gqa; g++) qrows[g] = a->q + (int64_t)t * a->q_stride + (int64_t)(h0 + g) * dk;
        for (int i0 = 0; i0 < m; i0 += GGUFLM_ATTN_CBLOCK) {
            const int nc = m - i0 < GGUFLM_ATTN_CBLOCK ? m - i0 : GGUFLM_ATTN_CBLOCK;
            GGUFLM_FN(gguflm_dots_block)(k_main, kptr + i0, 0, nc, qrows, gqa, dot, s->score + i0, ms);
        }
        if (k_main < dk) GGUFLM_FN(gguflm_dots_f32_tail)(k_main, dk, kt, ms, qrows, gqa, s->score, ms, a->arith);
        for (int g = 0; g < gqa; g++) GGUFLM_FN(gguflm_softmax_cells)(a, t, h0 + g, seq, m, s->score + (int64_t)g * ms);
        GGUFLM_FN(gguflm_pv_sparse)(a, t, h0, gqa, v_base, seq, m, ms, m_v, v_fused, v_lanes, s);
    }
}

/* ---- batches with F16 K and V: a block of tokens at a time, as llamafile's sgemm tiles them ---- */

/* vis[c] = whether token t sees cell c, for c < n_kv (a cache's cells: cell_seq bits), branch-free
 * so that it vectorises, and 0 for n_kv <= c < n_vis (padding); returns how many cells it sees */
GGUFLM_TARGET static int GGUFLM_FN(gguflm_visible_row)(const gguflm_attn_args *a, int t, uint8_t *vis, int64_t n_vis) {
    /* locals: the byte stores could alias a's fields */
    const int32_t pt = a->tok_pos[t], n_swa = a->n_swa, n_kv = a->n_kv;
    const int sq = a->tok_seq[t], causal = a->causal;
    const int32_t *restrict pos = a->cell_pos;
    const uint64_t *restrict seq = a->cell_seq;
    int n = 0;
    for (int c = 0; c < n_kv; c++) {
        const int32_t pc = pos[c];
        const int v = (pc >= 0) & (int)((seq[c] >> sq) & 1u) & (!causal | (pc <= pt)) &
                      ((n_swa <= 0) | (pt - pc < n_swa));
        vis[c] = (uint8_t)v;
        n += v;
    }
    memset(vis + n_kv, 0, n_vis - n_kv);
    return n;
}

/* One query's scores sc[0 .. nc) of cells lo .. lo+nc (lo and nc whole vectors of the arithmetic's
 * lanes) become probabilities in place, exactly as gguflm_softmax_cells computes those of the
 * cells vis marks (vis indexed by cell, 0 past the cache's cells, whose scores are not read), while the row keeps its cell layout: ggml's own score
 * row, whose masked cells are -inf and whose exp sums run one aligned vector of cells at a time
 * (vectors of masked cells add exact zeros). Masked cells get probability 0. The probabilities
 * are rounded to F16 (the V type of this path). t is the token, h the query head. */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_softmax_row)(const gguflm_attn_args *a, int t, int h, int lo, int nc,
                                                        const uint8_t *vis, float *sc) {
    const int vec = gguflm_vec_lanes(a->arith);
    const uint8_t *v = vis + lo;
    float max = -INFINITY;
    if (a->softcap > 0.0f || a->max_bias > 0.0f) {
        const float slope = a->max_bias > 0.0f ? gguflm_alibi_slope(a->max_bias, a->n_head, h) : 0.0f;
        for (int i = 0; i < nc; i++) {
            float kq = sc[i];
            if (a->softcap > 0.0f) kq = tanhf(kq * (1.0f / a->softcap)) * a->softcap;
            kq = kq * a->kq_scale;
            if (a->max_bias > 0.0f && v[i])
                kq = fmaf(slope, (float)-abs(a->cell_pos[lo + i] - a->tok_pos[t]), kq);
            sc[i] = v[i] ? kq : -INFINITY;
            max = sc[i] > max ? sc[i] : max;
        }
    } else {
        const float scale = a->kq_scale;
        int i = 0;
#if GGUFLM_VARIANT_AVX2
        /* max is exact in any order */
        __m256 mx = _mm256_set1_ps(-INFINITY);
        const __m256 sv = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
        for (; i + 8 <= nc; i += 8) {
            const __m256i vi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(v + i)));
            const __m256 seen = _mm256_castsi256_ps(_mm256_cmpgt_epi32(vi, _mm256_setzero_si256()));
            const __m256 kq = _mm256_blendv_ps(ninf, _mm256_mul_ps(_mm256_loadu_ps(sc + i), sv), seen);
            _mm256_storeu_ps(sc + i, kq);
            mx = _mm256_max_ps(mx, kq);
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, mx);
        for (int l = 0; l < 8; l++) max = lanes[l] > max ? lanes[l] : max;
#endif
        for (; i < nc; i++) {
            const float kq = v[i] ? sc[i] * scale : -INFINITY;
            sc[i] = kq;
            max = kq > max ? kq : max;
        }
    }
    if (a->sinks) max = max > a->sinks[h] ? max : a->sinks[h];
    if (gguflm_arith_avx512(a->arith))
        for (int i = 0; i < nc; i++) {
            const float e = gguflm_expf_avx512(sc[i] - max);
            sc[i] = v[i] ? e : 0.0f;
        }
    else
        for (int i = 0; i < nc; i++) {
            const float e = gguflm_expf(sc[i] - max);
            sc[i] = v[i] ? e : 0.0f;
        }
    double sum = 0.0;
    for (int i = 0; i < nc; i += vec) sum += (double)gguflm_hsum_vec(sc + i, vec);
    if (a->sinks) sum += (double)expf(a->sinks[h] - max);
    const float inv_sum = (float)(1.0 / sum);
    GGUFLM_FN(gguflm_scale_round_f16)(nc, inv_sum, sc);
}

/* Tokens t0 .. t0+nt-1 and KV head hkv, F16 K and V, as ggml computes a batch: K·q for every cell
 * of the block's visible range (chains over the head dimension), the softmax of gguflm_attn_heads,
 * then P·V with V transposed (vt: [head_dim_v][vt_stride] F16 for this head, zero past n_kv):
 * chains over cells, lane = cell % lanes, masked cells adding exact zeros. The scratch holds one
 * score row per query of the block (O(block × n_kv), never O(n_tokens × n_kv)); with s->wide the
 * 16-lane dots run on AVX-512 registers (the same chains). */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_attn_block)(const gguflm_attn_args *a, int t0, int nt, int hkv,
                                                       const ggml_half *vt, int64_t vt_stride,
                                                       gguflm_attn_scratch *s) {
    const int dk = a->head_dim_k, dv = a->head_dim_v;
    const int gqa = a->n_head / a->n_head_kv, h0 = hkv * gqa, nq = nt * gqa;
    const int lanes = gguflm_vec_lanes(a->arith);
    const char *k_base = (const char *)a->k + gguflm_cache_head_offset(GGUFLM_CACHE_F16, hkv, dk);

    /* which cells each token sees, and the range any of them sees, widened to whole lane groups */
    int lo = a->n_kv, hi = 0, n_vis[GGUFLM_ATTN_TBLOCK];
    for (int t = t0; t < t0 + nt; t++) {
        uint8_t *vis = s->vis + (int64_t)(t - t0) * vt_stride;
        n_vis[t - t0] = GGUFLM_FN(gguflm_visible_row)(a, t, vis, vt_stride);
        if (!n_vis[t - t0]) continue;
        int c = 0;
        while (!vis[c]) c++;
        lo = c < lo ? c : lo;
        c = a->n_kv;
        while (!vis[c - 1]) c--;
        hi = c > hi ? c : hi;
    }
    if (hi == 0) {
        for (int t = t0; t < t0 + nt; t++) memset(a->out + (int64_t)t * a->out_stride + (int64_t)h0 * dv, 0, sizeof(float) * gqa * dv);
        return;
    }
    lo -= lo % lanes;
    hi += (lanes - hi % lanes) % lanes;
    const int nc = hi - lo, nk = (hi < a->n_kv ? hi : a->n_kv) - lo;

    /* queries (token-major, then head) in the K type's precision; scores [nq][nc] */
    const float *qrows[GGUFLM_ATTN_TBLOCK * GGUFLM_MAX_GQA];
    const float *prows[GGUFLM_ATTN_TBLOCK * GGUFLM_MAX_GQA];
    for (int qi = 0; qi < nq; qi++) {
        const float *q = a->q + (int64_t)(t0 + qi / gqa) * a->q_stride + (int64_t)(h0 + qi % gqa) * dk;
        float *qf = s->q + (int64_t)qi * dk;
        for (int d = 0; d < dk; d++) qf[d] = q[d];
        GGUFLM_FN(gguflm_scale_round_f16)(dk, 1.0f, qf);
        qrows[qi] = qf;
        prows[qi] = s->score + (int64_t)qi * nc;
    }
    for (int c0 = 0; c0 < nk; c0 += GGUFLM_ATTN_CBLOCK) {
        const int m = nk - c0 < GGUFLM_ATTN_CBLOCK ? nk - c0 : GGUFLM_ATTN_CBLOCK;
        const void *krows[GGUFLM_ATTN_CBLOCK];
        for (int i = 0; i < m; i++) krows[i] = k_base + (int64_t)(lo + c0 + i) * a->k_row_bytes;
#if GGUFLM_OPS_X86
        if (s->wide)
            gguflm_dots16_block_avx512(dk, krows, m, qrows, nq, s->score + c0, nc);
        else
#endif
            GGUFLM_FN(gguflm_dots_block)(dk, krows, 1, m, qrows, nq, lanes, s->score + c0, nc);
    }

    /* softmax per query over the cells its token sees, in the row's cell layout (a token that sees
     * nothing gets zeros, where ggml would produce NaN) */
    for (int qi = 0; qi < nq; qi++) {
        if (n_vis[qi / gqa])
            GGUFLM_FN(gguflm_softmax_row)(a, t0 + qi / gqa, h0 + qi % gqa, lo, nc,
                                          s->vis + (int64_t)(qi / gqa) * vt_stride, s->score + (int64_t)qi * nc);
        else
            memset(s->score + (int64_t)qi * nc, 0, sizeof(float) * nc);
    }

    /* P·V, a block of value dimensions at a time */
    for (int d0 = 0; d0 < dv; d0 += GGUFLM_ATTN_CBLOCK) {
        const int m = dv - d0 < GGUFLM_ATTN_CBLOCK ? dv - d0 : GGUFLM_ATTN_CBLOCK;
        const void *vrows[GGUFLM_ATTN_CBLOCK];
        float res[GGUFLM_ATTN_TBLOCK * GGUFLM_MAX_GQA * GGUFLM_ATTN_CBLOCK];
        for (int i = 0; i < m; i++) vrows[i] = vt + (int64_t)(d0 + i) * vt_stride + lo;
#if GGUFLM_OPS_X86
        if (s->wide)
            gguflm_dots16_block_avx512(nc, vrows, m, prows, nq, res, GGUFLM_ATTN_CBLOCK);
        else
#endif
            GGUFLM_FN(gguflm_dots_block)(nc, vrows, 1, m, prows, nq, lanes, res, GGUFLM_ATTN_CBLOCK);
        for (int qi = 0; qi < nq; qi++)
            memcpy(a->out + (int64_t)(t0 + qi / gqa) * a->out_stride + (int64_t)(h0 + qi % gqa) * dv + d0,
                   res + (int64_t)qi * GGUFLM_ATTN_CBLOCK, sizeof(float) * m);
    }
}

/* ---- encoders: LayerNorm, unary activations, mean pooling ---- */

/* ggml_norm of one row, then * w, then + b (three ggml ops, so no FMA between them): the mean
 * from a double sum; the squares of (x - mean) summed one vector at a time in float, the vectors
 * and the leftover squares in double, as ggml_vec_cvar_f32 */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_layer_norm_row)(int n, const float *x, const float *w, const float *b,
                                                           float eps, float *y, int arith) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)x[i];
    const float mean = (float)sum / (float)n;
    const int vec = gguflm_vec_lanes(arith);
    double var = 0.0;
    int i = 0;
    for (; i + vec <= n; i += vec) {
        float sq[16];
        for (int l = 0; l < vec; l++) {
            const float d = x[i + l] - mean;
            y[i + l] = d;
            sq[l] = d * d;
        }
        var += (double)gguflm_hsum_vec(sq, vec);
    }
    for (; i < n; i++) {
        const float d = x[i] - mean;
        y[i] = d;
        var += (double)(d * d);
    }
    const float scale = 1.0f / sqrtf((float)(var / n) + eps);
    for (i = 0; i < n; i++) y[i] = y[i] * scale;
    if (w)
        for (i = 0; i < n; i++) y[i] = y[i] * w[i];
    if (b)
        for (i = 0; i < n; i++) y[i] = y[i] + b[i];
}

/* y = act(x) for one row: GELU through ggml's fp16 table, or libm's tanhf (ggml_vec_tanh_f32) */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_unary_row)(int kind, const ggml_half *table, int n, const float *x, float *y) {
    int i = 0;
    if (kind == GGUFLM_UNARY_GELU) {
#if GGUFLM_VARIANT_AVX2
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, GGUFLM_FN(gguflm_gelu8)(table, _mm256_loadu_ps(x + i)));
#endif
        for (; i < n; i++) y[i] = gguflm_gelu(table, x[i]);
    } else {
        for (; i < n; i++) y[i] = tanhf(x[i]);
    }
}

/* out[d] = the sum over tokens t of x[t][d] * m[t] for d < n, as ggml's F32 mul_mat of the
 * transposed hidden states by the mean matrix rounds it: token t's products go into lane t % lanes
 * for the tokens before `main` (acc: [lanes][n], zeroed here), the lanes are reduced as the dot
 * keeping that many lanes does, then the tokens from `main` on follow one by one (vec_dot's
 * leftover loop, see gguflm_dot_f32_unfused). Zero weights (other sequences' tokens) add nothing
 * and are skipped. */
GGUFLM_TARGET static void GGUFLM_FN(gguflm_pool_mean_row)(int n_tok, int n, const float *x, int64_t x_stride,
                                                          const float *m, int lanes, int main, float *acc, float *out,
                                                          int arith) {
    memset(acc, 0, sizeof(float) * lanes * n);
    for (int t = 0; t < main; t++)
        if (m[t] != 0.0f) GGUFLM_FN(gguflm_lane_axpy)(n, m[t], x + t * x_stride, acc + (int64_t)(t % lanes) * n);
    GGUFLM_FN(gguflm_reduce_cols)(acc, n, lanes, n, out);
    const int fused = main + gguflm_dot_f32_unfused(n_tok - main, arith);
    for (int t = main; t < n_tok; t++)
        if (m[t] != 0.0f) GGUFLM_FN(gguflm_tail_axpy)(n, m[t], x + t * x_stride, out, t >= fused);
}
