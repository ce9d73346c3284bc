/* Sampling kernels: candidate ordering, softmax and the random draws of llama.cpp's samplers.
 *
 * Candidates are a structure of arrays (ids, logits, probabilities). Nothing here allocates:
 * callers pass scratch space. Float arithmetic follows llama.cpp's (float sums where it sums in
 * float, double where it uses double) so that probabilities agree to the last few ulps.
 */
#ifndef GGUFLM_SAMPLING_KERNELS_H
#define GGUFLM_SAMPLING_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_features.h"

#if GGUFLM_X86
#include <immintrin.h>
#endif

/* ------------------------------------------------------------------------------------------ */
/* mt19937: the same state, seeding and output stream as C++'s std::mt19937                    */

#define GGUFLM_MT_N 624
#define GGUFLM_MT_M 397

typedef struct {
    uint32_t state[GGUFLM_MT_N];
    int32_t next; /* index of the next state word to temper; N means "twist first" */
} gguflm_mt19937;

static void gguflm_mt_seed(gguflm_mt19937 *g, uint32_t seed) {
    g->state[0] = seed;
    for (int i = 1; i < GGUFLM_MT_N; i++) {
        uint32_t prev = g->state[i - 1];
        g->state[i] = 1812433253u * (prev ^ (prev >> 30)) + (uint32_t)i;
    }
    g->next = GGUFLM_MT_N;
}

static void gguflm_mt_twist(gguflm_mt19937 *g) {
    /* in place and in order: words past i already hold their new values, as in the reference */
    for (int i = 0; i < GGUFLM_MT_N; i++) {
        uint32_t y = (g->state[i] & 0x80000000u) | (g->state[(i + 1) % GGUFLM_MT_N] & 0x7fffffffu);
        uint32_t v = g->state[(i + GGUFLM_MT_M) % GGUFLM_MT_N] ^ (y >> 1);
        if (y & 1u) {
            v ^= 0x9908b0dfu;
        }
        g->state[i] = v;
    }
    g->next = 0;
}

static uint32_t gguflm_mt_next(gguflm_mt19937 *g) {
    if (g->next >= GGUFLM_MT_N) {
        gguflm_mt_twist(g);
    }
    uint32_t y = g->state[g->next++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

/* std::uniform_real_distribution<double>(0, 1) as libstdc++ computes it (generate_canonical with
 * 53 bits: two 32-bit draws, low word first, one rounding, results of 1.0 pulled just below). */
static double gguflm_mt_uniform_double(gguflm_mt19937 *g) {
    double sum = (double)gguflm_mt_next(g);
    sum += (double)gguflm_mt_next(g) * 4294967296.0;
    double r = sum / 18446744073709551616.0;
    return r >= 1.0 ? nextafter(1.0, 0.0) : r;
}

/* std::uniform_real_distribution<float>(0, 1) as libstdc++ computes it (one 32-bit draw). */
static float gguflm_mt_uniform_float(gguflm_mt19937 *g) {
    float r = (float)gguflm_mt_next(g) / 4294967296.0f;
    return r >= 1.0f ? nextafterf(1.0f, 0.0f) : r;
}

/* ------------------------------------------------------------------------------------------ */
/* ordering: a logit's rank as an unsigned key (smaller key = larger logit)                    */

/* -0 ranks as +0 and NaN below -inf, so the order is total and agrees with float `>`. */
static inline uint32_t gguflm_desc_key(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    uint32_t mag = b & 0x7fffffffu;
    if (mag > 0x7f800000u) {
        return 0xffffffffu;
    }
    if (mag == 0) {
        b = 0;
    }
    uint32_t ascending = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ~ascending;
}

/* key in the high word, position in the low word: ascending order = best first, ties by position */
static inline uint64_t gguflm_rank(float x, int64_t pos) {
    return ((uint64_t)gguflm_desc_key(x) << 32) | (uint32_t)pos;
}

static void gguflm_u64_sift_down(uint64_t *a, int64_t root, int64_t n) {
    for (;;) {
        int64_t child = 2 * root + 1;
        if (child >= n) {
            return;
        }
        if (child + 1 < n && a[child + 1] > a[child]) {
            child++;
        }
        if (a[root] >= a[child]) {
            return;
        }
        uint64_t t = a[root];
        a[root] = a[child];
        a[child] = t;
        root = child;
    }
}

/* ascending heapsort: O(n log n) whatever the input */
static void gguflm_u64_heapsort(uint64_t *a, int64_t n) {
    for (int64_t i = n / 2 - 1; i >= 0; i--) {
        gguflm_u64_sift_down(a, i, n);
    }
    for (int64_t end = n - 1; end > 0; end--) {
        uint64_t t = a[0];
        a[0] = a[end];
        a[end] = t;
        gguflm_u64_sift_down(a, 0, end);
    }
}

static void gguflm_u64_sort(uint64_t *a, int64_t n) {
    if (n <= 24) { /* insertion sort: the common case after a top-k selection */
        for (int64_t i = 1; i < n; i++) {
            uint64_t v = a[i];
            int64_t j = i - 1;
            while (j >= 0 && a[j] > v) {
                a[j + 1] = a[j];
                j--;
            }
            a[j + 1] = v;
        }
        return;
    }
    gguflm_u64_heapsort(a, n);
}

/* Rearrange distinct keys so that a[0..k) are the k smallest (in any order).
 * Quickselect with a median-of-three pivot; heapsort if it stops converging. */
static void gguflm_u64_select(uint64_t *a, int64_t n, int64_t k) {
    if (k <= 0 || k >= n) {
        return;
    }
    int64_t lo = 0, hi = n - 1, target = k - 1;
    int budget = 64;
    for (int64_t m = n; m > 1; m >>= 1) {
        budget += 2;
    }
    while (hi > lo) {
        if (--budget < 0) {
            gguflm_u64_heapsort(a + lo, hi - lo + 1);
            return;
        }
        int64_t mid = lo + (hi - lo) / 2;
        uint64_t x = a[lo], y = a[mid], z = a[hi];
        uint64_t pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot) {
                i++;
            }
            while (a[j] > pivot) {
                j--;
            }
            if (i <= j) {
                uint64_t t = a[i];
                a[i] = a[j];
                a[j] = t;
                i++;
                j--;
            }
        }
        /* now a[lo..j] <= pivot <= a[i..hi], and everything strictly between equals pivot */
        if (target <= j) {
            hi = j;
        } else if (target >= i) {
            lo = i;
        } else {
            return;
        }
    }
}

/* Stable LSD radix sort of all n positions by logit, best first (ties keep position order).
 * scratch: 2*n words. */
static void gguflm_sort_positions(const float *logits, int64_t n, int32_t *out, uint64_t *scratch) {
    enum { BITS = 11, BUCKETS = 1 << BITS, PASSES = 3 };
    static const int shift[PASSES] = {32, 32 + BITS, 32 + 2 * BITS};
    uint32_t hist[PASSES][BUCKETS];
    uint64_t *a = scratch, *b = scratch + n;
    memset(hist, 0, sizeof hist);
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = gguflm_rank(logits[i], i);
        a[i] = r;
        for (int p = 0; p < PASSES; p++) {
            hist[p][(r >> shift[p]) & (BUCKETS - 1)]++;
        }
    }
    for (int p = 0; p < PASSES; p++) {
        uint32_t *h = hist[p];
        int single_bucket = 0;
        uint32_t offset = 0;
        for (int d = 0; d < BUCKETS; d++) {
            if (h[d] == (uint32_t)n) {
                single_bucket = 1; /* this digit is the same everywhere: nothing to reorder */
            }
            uint32_t count = h[d];
            h[d] = offset;
            offset += count;
        }
        if (single_bucket) {
            continue;
        }
        for (int64_t i = 0; i < n; i++) {
            b[h[(a[i] >> shift[p]) & (BUCKETS - 1)]++] = a[i];
        }
        uint64_t *t = a;
        a = b;
        b = t;
    }
    for (int64_t i = 0; i < n; i++) {
        out[i] = (int32_t)(uint32_t)a[i];
    }
}

/* ------------------------------------------------------------------------------------------ */
/* the top-k scan: find the next 16-logit block holding a value above a threshold               */

/* Start of the first 16-logit block from i on (blocks counted from i) with a logit > thr, or n.
 * A short tail block is returned as is for the caller to check. One scalar reference and SIMD
 * variants with the same signature, picked at run time. */
typedef int64_t (*gguflm_scan_fn)(const float *logits, int64_t i, int64_t n, float thr);

static int64_t gguflm_scan_above_scalar(const float *logits, int64_t i, int64_t n, float thr) {
    for (; i + 16 <= n; i += 16) {
        int any = 0;
        for (int j = 0; j < 16; j++) {
            any |= logits[i + j] > thr;
        }
        if (any) {
            return i;
        }
    }
    return i;
}

#if GGUFLM_X86
__attribute__((target("avx2")))
static int64_t gguflm_scan_above_avx2(const float *logits, int64_t i, int64_t n, float thr) {
    const __m256 t = _mm256_set1_ps(thr);
    for (; i + 64 <= n; i += 64) {
        int m[4];
        for (int b = 0; b < 4; b++) {
            __m256 lo = _mm256_cmp_ps(_mm256_loadu_ps(logits + i + 16 * b), t, _CMP_GT_OQ);
            __m256 hi = _mm256_cmp_ps(_mm256_loadu_ps(logits + i + 16 * b + 8), t, _CMP_GT_OQ);
            m[b] = _mm256_movemask_ps(_mm256_or_ps(lo, hi));
        }
        if (m[0] | m[1] | m[2] | m[3]) {
            return i + (m[0] ? 0 : m[1] ? 16 : m[2] ? 32 : 48);
        }
    }
    return gguflm_scan_above_scalar(logits, i, n, thr);
}

__attribute__((target("avx512f")))
static int64_t gguflm_scan_above_avx512(const float *logits, int64_t i, int64_t n, float thr) {
    const __m512 t = _mm512_set1_ps(thr);
    for (; i + 64 <= n; i += 64) {
        __mmask16 m0 = _mm512_cmp_ps_mask(_mm512_loadu_ps(logits + i), t, _CMP_GT_OQ);
        __mmask16 m1 = _mm512_cmp_ps_mask(_mm512_loadu_ps(logits + i + 16), t, _CMP_GT_OQ);
        __mmask16 m2 = _mm512_cmp_ps_mask(_mm512_loadu_ps(logits + i + 32), t, _CMP_GT_OQ);
        __mmask16 m3 = _mm512_cmp_ps_mask(_mm512_loadu_ps(logits + i + 48), t, _CMP_GT_OQ);
        if (m0 | m1 | m2 | m3) {
            return i + (m0 ? 0 : m1 ? 16 : m2 ? 32 : 48);
        }
    }
    return gguflm_scan_above_scalar(logits, i, n, thr);
}
#endif

/* isa's scan (GGUFLM_ISA_*, dispatch.h); the avx512 ISA's CPUs run the AVX-512F one */
static gguflm_scan_fn gguflm_scan_for_isa(int isa) {
#if GGUFLM_X86
    if (isa >= GGUFLM_ISA_AVX512) {
        return gguflm_scan_above_avx512;
    }
    if (isa >= GGUFLM_ISA_AVX2) {
        return gguflm_scan_above_avx2;
    }
#endif
    (void)isa;
    return gguflm_scan_above_scalar;
}

/* Cut a buffer of ranks down to its k best; returns the logit of the worst one kept. */
static float gguflm_keep_best(const float *logits, uint64_t *buf, int64_t m, int64_t k) {
    gguflm_u64_select(buf, m, k);
    uint64_t worst = buf[0];
    for (int64_t j = 1; j < k; j++) {
        worst = buf[j] > worst ? buf[j] : worst;
    }
    return logits[(uint32_t)worst];
}

/* Positions of the k largest logits, best first, ties to the lower position.
 * scratch: 2*n words. Small k on a long row (the usual top-k of 40 out of 262,144) takes one
 * streaming pass: a buffer keeps every position that beats the current k-th best and is cut
 * back to k whenever it fills, so almost every logit costs one comparison. */
static void gguflm_top_k_positions(const float *logits, int64_t n, int64_t k, int32_t *out,
                                   uint64_t *scratch, gguflm_scan_fn scan) {
    if (k > n) {
        k = n;
    }
    if (k <= 0) {
        return;
    }
    if (n > 4096 && 4 * k >= n) {
        gguflm_sort_positions(logits, n, out, scratch);
        return;
    }
    uint64_t *buf = scratch;
    int64_t cap = n <= 4096 ? n : 2 * k + 64;
    int64_t m = 0, i = 0;
    for (; i < cap; i++) {
        buf[m++] = gguflm_rank(logits[i], i);
    }
    /* a later position must beat the k-th best strictly (it loses ties); NaN ranks last */
    float thr = gguflm_keep_best(logits, buf, m, k);
    m = k;
    while (i < n) {
        if (thr == thr) { /* a NaN threshold: every number beats it, so check them all */
            i = scan(logits, i, n, thr);
        }
        int64_t block_end = i + 16 <= n ? i + 16 : n;
        for (; i < block_end; i++) {
            float v = logits[i];
            if (v > thr || (thr != thr && v == v)) {
                buf[m++] = gguflm_rank(v, i);
                if (m == cap) {
                    thr = gguflm_keep_best(logits, buf, m, k);
                    m = k;
                }
            }
        }
    }
    gguflm_u64_select(buf, m, k);
    gguflm_u64_sort(buf, k);
    for (int64_t j = 0; j < k; j++) {
        out[j] = (int32_t)(uint32_t)buf[j];
    }
}

/* ------------------------------------------------------------------------------------------ */
/* softmax and selection                                                                        */

/* std::max(a, b) keeps a unless a < b (a NaN b never wins) */
static inline float gguflm_max_logit(const float *logits, int64_t n) {
    float m = logits[0];
    for (int64_t i = 1; i < n; i++) {
        m = m < logits[i] ? logits[i] : m;
    }
    return m;
}

/* p = expf(logits - max) (a sorted row starts at its max). Returns the sum in double, as dist
 * adds; *float_sum gets it added in float, as llama_sampler_softmax_impl adds. */
static double gguflm_exp_shifted(const float *logits, float *p, int64_t n, int is_sorted,
                                 float *float_sum) {
    float max_l = is_sorted ? logits[0] : gguflm_max_logit(logits, n);
    float sum = 0.0f;
    double total = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float e = expf(logits[i] - max_l);
        p[i] = e;
        sum += e;
        total += e;
    }
    *float_sum = sum;
    return total;
}

/* p = softmax(logits), llama_sampler_softmax_impl's float arithmetic */
static void gguflm_softmax(const float *logits, float *p, int64_t n, int is_sorted) {
    float sum;
    gguflm_exp_shifted(logits, p, n, is_sorted, &sum);
    for (int64_t i = 0; i < n; i++) {
        p[i] /= sum;
    }
}

/* llama.cpp's dist sampler for n >= 2: probabilities summed in double, the first position whose
 * running sum reaches rnd * total is selected, and p is normalised in the same pass. */
static int64_t gguflm_dist_select(const float *logits, float *p, int64_t n, int is_sorted,
                                  double rnd) {
    float unused;
    double total = gguflm_exp_shifted(logits, p, n, is_sorted, &unused);
    double target = total * rnd, running = 0.0;
    int64_t selected = -1;
    for (int64_t i = 0; i < n; i++) {
        if (selected < 0) {
            running += p[i];
            if (running >= target) {
                selected = i;
            }
        }
        p[i] = (float)(p[i] / total);
    }
    return selected < 0 ? n - 1 : selected;
}

/* std::discrete_distribution<int> over p as libstdc++ draws it: weights normalised in double,
 * cumulative sums with the last forced to 1, the first cumulative sum >= u wins. n >= 2. */
static int64_t gguflm_discrete_select(const float *p, int64_t n, double u) {
    double total = 0.0;
    for (int64_t i = 0; i < n; i++) {
        total += (double)p[i];
    }
    double cumulative = 0.0;
    for (int64_t i = 0; i + 1 < n; i++) {
        cumulative += (double)p[i] / total;
        if (cumulative >= u) {
            return i;
        }
    }
    return n - 1;
}

/* greedy: the first position holding the largest logit */
static int64_t gguflm_argmax(const float *logits, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

/* temperature <= 0: the first maximum stays, every other logit becomes -inf */
static void gguflm_keep_max_only(float *logits, int64_t n) {
    int64_t best = 0;
    float best_logit = logits[0];
    for (int64_t i = 1; i < n; i++) {
        if (logits[i] > best_logit) {
            logits[best] = -INFINITY;
            best = i;
            best_logit = logits[i];
        } else {
            logits[i] = -INFINITY;
        }
    }
}

/* top-p on probabilities sorted best first: the shortest prefix whose float running sum reaches
 * target and holds at least min_keep entries; -1 when no prefix of these n does */
static int64_t gguflm_top_p_cut(const float *p, int64_t n, float target, int64_t min_keep) {
    float cum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        cum += p[i];
        if (cum >= target && i + 1 >= min_keep) {
            return i + 1;
        }
    }
    return -1;
}

#endif
