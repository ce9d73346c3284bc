/* The activation quantizers (ggml's CPU from_float for src1: quants_ref.h's gguflm_quantize_act_q8_0,
 * _q8_1 and gguflm_quantize_row_q8_K) with vector instructions, included by quants_simd_body.h
 * once per ISA. Every block gives quants_ref.h's bytes: the largest magnitude is exact in any
 * order, x * id is the same multiply, and vcvtps2dq rounds half to even as nearest_int does for
 * these magnitudes (|x * id| <= 127 and a bit); a block holding a NaN or an infinity, or whose
 * multiplier overflows, goes to the scalar code, whose comparisons decide those cases. No include
 * guard. */

/* lanes of the magnitudes a that are NaN or infinite, all ones */
static inline __m256 GGUFLM_SIMD(nonfinite8)(__m256 a) {
    return _mm256_cmp_ps(a, _mm256_set1_ps(FLT_MAX), _CMP_NLE_UQ);
}

static inline float GGUFLM_SIMD(hmax8)(__m256 a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* 32 int32 lanes (4 vectors, in order) -> 32 int8 with saturation */
static inline __m256i GGUFLM_SIMD(pack32_i8)(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* one 32-element block of Q8_0/Q8_1 activations; returns 0 (nothing written) for a block that is
 * not all finite */
static inline __attribute__((always_inline)) int GGUFLM_SIMD(q8_act_block)(const float *x, int8_t *qs, float *d_out,
                                                                          int *sum_out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], a[4];
    for (int k = 0; k < 4; ++k) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        a[k] = _mm256_andnot_ps(sign, v[k]);
    }
    const __m256 bad = _mm256_or_ps(_mm256_or_ps(GGUFLM_SIMD(nonfinite8)(a[0]), GGUFLM_SIMD(nonfinite8)(a[1])),
                                    _mm256_or_ps(GGUFLM_SIMD(nonfinite8)(a[2]), GGUFLM_SIMD(nonfinite8)(a[3])));
    if (_mm256_movemask_ps(bad)) return 0;
    const __m256 m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
    const float amax = GGUFLM_SIMD(hmax8)(m);
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    if (!(id <= FLT_MAX)) return 0;   /* a subnormal maximum: the multiplier overflows */
    __m256i q[4];
    for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], _mm256_set1_ps(id)));
    _mm256_storeu_si256((__m256i *)qs, GGUFLM_SIMD(pack32_i8)(q[0], q[1], q[2], q[3]));
    *sum_out = GGUFLM_SIMD(hsum_i32)(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    *d_out = amax / 127.f;
    return 1;
}

static void GGUFLM_SIMD(quantize_act_q8_0)(const float *x, void *vy, int64_t k) {
    block_q8_0 *y = (block_q8_0 *)vy;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        float d;
        int sum;
        if (GGUFLM_SIMD(q8_act_block)(x, y[i].qs, &d, &sum)) y[i].d = gguflm_fp32_to_fp16(d);
        else gguflm_quantize_act_q8_0(x, &y[i], QK8_0);
    }
}

static void GGUFLM_SIMD(quantize_act_q8_1)(const float *x, void *vy, int64_t k) {
    block_q8_1 *y = (block_q8_1 *)vy;
    for (int64_t i = 0; i < k / QK8_1; i++, x += QK8_1) {
        float d;
        int sum;
        if (GGUFLM_SIMD(q8_act_block)(x, y[i].qs, &d, &sum)) {
            y[i].d = gguflm_fp32_to_fp16(d);
            y[i].s = gguflm_fp32_to_fp16(d * sum);
        } else {
            gguflm_quantize_act_q8_1(x, &y[i], QK8_1);
        }
    }
}

/* Q8_K: scale -127 / (the first element of the largest magnitude), quants min(127, nearest),
 * sums of 16 */
static void GGUFLM_SIMD(quantize_row_q8_K)(const float *x, void *vy, int64_t k) {
    block_q8_K *y = (block_q8_K *)vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        __m256 m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8) {
            const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j));
            m = _mm256_max_ps(m, a);
            bad = _mm256_or_ps(bad, GGUFLM_SIMD(nonfinite8)(a));
        }
        if (_mm256_movemask_ps(bad)) {
            gguflm_quantize_row_q8_K(x, &y[i], QK_K);
            continue;
        }
        const float amax = GGUFLM_SIMD(hmax8)(m);
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(block_q8_K));
            continue;
        }
        /* the first element of that magnitude gives the sign */
        float max = 0.0f;
        for (int j = 0; j < QK_K; j += 8) {
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)),
                                                             _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (hit) {
                max = x[j + __builtin_ctz((unsigned)hit)];
                break;
            }
        }
        const float iscale = -127.f / max;
        if (!(fabsf(iscale) <= FLT_MAX)) {
            gguflm_quantize_row_q8_K(x, &y[i], QK_K);
            continue;
        }
        const __m256 is = _mm256_set1_ps(iscale);
        for (int j = 0; j < QK_K; j += 32) {
            __m256i q[4];
            for (int k4 = 0; k4 < 4; ++k4)
                q[k4] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(is, _mm256_loadu_ps(x + j + 8 * k4))),
                                         _mm256_set1_epi32(127));
            _mm256_storeu_si256((__m256i *)(y[i].qs + j), GGUFLM_SIMD(pack32_i8)(q[0], q[1], q[2], q[3]));
            y[i].bsums[j / 16] = (int16_t)GGUFLM_SIMD(hsum_i32)(_mm256_add_epi32(q[0], q[1]));
            y[i].bsums[j / 16 + 1] = (int16_t)GGUFLM_SIMD(hsum_i32)(_mm256_add_epi32(q[2], q[3]));
        }
        y[i].d = 1 / iscale;
    }
}
