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

/* an item: the key in the high word, the candidate's position in the low word */
static inline uint64_t gguflm_rank(float x, int64_t pos) {
    return ((uint64_t)gguflm_desc_key(x) << 32) | (uint32_t)pos;
}

static inline int32_t gguflm_item_position(uint64_t item) {
    return (int32_t)(uint32_t)item;
}

/* llama.cpp's comparator `a.logit > b.logit` on items: keys only, the position never breaks a
 * tie. (For NaN, where that comparator is no strict weak order and libstdc++'s unguarded loops
 * may run off the array, NaN ranks last instead.) */
static inline int gguflm_before(uint64_t a, uint64_t b) {
    return (uint32_t)(a >> 32) < (uint32_t)(b >> 32);
}

static inline void gguflm_swap_items(uint64_t *a, int64_t i, int64_t j) {
    uint64_t t = a[i];
    a[i] = a[j];
    a[j] = t;
}

/* ------------------------------------------------------------------------------------------ */
/* libstdc++'s std::sort and std::partial_sort, move for move                                 */
/*
 * The C++ standard leaves the order of equal elements to the implementation; llama.cpp sorts its
 * candidates with GCC's (bits/stl_algo.h, bits/stl_heap.h), so tied logits come out wherever
 * those algorithms happen to move them. The functions below make the same comparisons and the
 * same moves on items, indices standing for iterators; each is named after the libstdc++ helper
 * it follows.
 */

/* __push_heap: move the hole up past parents that rank before value, then fill it */
static void gguflm_push_heap(uint64_t *a, int64_t hole, int64_t top, uint64_t value) {
    int64_t parent = (hole - 1) / 2;
    while (hole > top && gguflm_before(a[parent], value)) {
        a[hole] = a[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    a[hole] = value;
}

/* __adjust_heap: walk the hole down to a leaf along the later-ranked children (the right one
 * unless the left ranks after it), then push value up from there */
static void gguflm_adjust_heap(uint64_t *a, int64_t hole, int64_t len, uint64_t value) {
    const int64_t top = hole;
    int64_t child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (gguflm_before(a[child], a[child - 1])) {
            child--;
        }
        a[hole] = a[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) { /* a last parent with only a left child */
        child = 2 * (child + 1);
        a[hole] = a[child - 1];
        hole = child - 1;
    }
    gguflm_push_heap(a, hole, top, value);
}

/* __make_heap: the top ranks last of all */
static void gguflm_make_heap(uint64_t *a, int64_t len) {
    if (len < 2) {
        return;
    }
    for (int64_t parent = (len - 2) / 2;; parent--) {
        gguflm_adjust_heap(a, parent, len, a[parent]);
        if (parent == 0) {
            return;
        }
    }
}

/* __pop_heap: the top moves to a[result] and the item that was there sifts in from the top */
static void gguflm_pop_heap(uint64_t *a, int64_t len, int64_t result) {
    uint64_t value = a[result];
    a[result] = a[0];
    gguflm_adjust_heap(a, 0, len, value);
}

/* __sort_heap */
static void gguflm_sort_heap(uint64_t *a, int64_t len) {
    while (len > 1) {
        len--;
        gguflm_pop_heap(a, len, len);
    }
}

/* std::partial_sort(a, a + middle, a + n): __heap_select, then __sort_heap */
static void gguflm_std_partial_sort(uint64_t *a, int64_t middle, int64_t n) {
    gguflm_make_heap(a, middle);
    for (int64_t i = middle; i < n; i++) {
        if (gguflm_before(a[i], a[0])) {
            gguflm_pop_heap(a, middle, i);
        }
    }
    gguflm_sort_heap(a, middle);
}

/* __unguarded_linear_insert: a[last] moves down past the items it ranks before */
static void gguflm_unguarded_linear_insert(uint64_t *a, int64_t last) {
    uint64_t value = a[last];
    int64_t next = last - 1;
    while (gguflm_before(value, a[next])) {
        a[last] = a[next];
        last = next;
        next--;
    }
    a[last] = value;
}

/* __insertion_sort on a[first..last) */
static void gguflm_insertion_sort(uint64_t *a, int64_t first, int64_t last) {
    if (first == last) {
        return;
    }
    for (int64_t i = first + 1; i != last; i++) {
        if (gguflm_before(a[i], a[first])) {
            uint64_t value = a[i];
            memmove(a + first + 1, a + first, (size_t)(i - first) * sizeof *a);
            a[first] = value;
        } else {
            gguflm_unguarded_linear_insert(a, i);
        }
    }
}

/* libstdc++'s _S_threshold: introsort leaves runs this short to the final insertion sort */
enum { GGUFLM_STD_SORT_THRESHOLD = 16 };

/* __final_insertion_sort */
static void gguflm_final_insertion_sort(uint64_t *a, int64_t n) {
    if (n > GGUFLM_STD_SORT_THRESHOLD) {
        gguflm_insertion_sort(a, 0, GGUFLM_STD_SORT_THRESHOLD);
        for (int64_t i = GGUFLM_STD_SORT_THRESHOLD; i < n; i++) {
            gguflm_unguarded_linear_insert(a, i);
        }
    } else {
        gguflm_insertion_sort(a, 0, n);
    }
}

/* __move_median_to_first: swap the median of a[x], a[y], a[z] into a[result] */
static void gguflm_move_median_to_first(uint64_t *a, int64_t result, int64_t x, int64_t y,
                                        int64_t z) {
    int64_t median;
    if (gguflm_before(a[x], a[y])) {
        if (gguflm_before(a[y], a[z])) {
            median = y;
        } else if (gguflm_before(a[x], a[z])) {
            median = z;
        } else {
            median = x;
        }
    } else if (gguflm_before(a[x], a[z])) {
        median = x;
    } else if (gguflm_before(a[y], a[z])) {
        median = z;
    } else {
        median = y;
    }
    gguflm_swap_items(a, result, median);
}

/* __unguarded_partition around the pivot item a[pivot] (which lies outside [first, last)).
 *
 * Its k-th swap exchanges the k-th item from the left that does not rank before the pivot with
 * the k-th from the right that the pivot does not rank before, for as long as the two have not
 * crossed; which items those are depends on the input alone. So while a block of 64 from each
 * end cannot reach the other, the blocks' stoppers are found without branches and swapped in
 * pairs (as BlockQuicksort does, avoiding the mispredicted scans); the scalar loop then goes on
 * from the last pair swapped, exactly where libstdc++'s would be. */
static int64_t gguflm_unguarded_partition(uint64_t *a, int64_t first, int64_t last,
                                          int64_t pivot) {
    enum { BLOCK = 64 };
    const uint64_t p = a[pivot];
    uint8_t stop_left[BLOCK], stop_right[BLOCK]; /* offsets into the blocks in hand */
    int n_left = 0, n_right = 0, next_left = 0, next_right = 0;
    int64_t l = first, r = last; /* the left block starts at l, the right one ends at r */
    while (r - l > 2 * BLOCK) {
        if (n_left == 0) {
            next_left = 0;
            for (int j = 0; j < BLOCK; j++) {
                stop_left[n_left] = (uint8_t)j;
                n_left += !gguflm_before(a[l + j], p);
            }
        }
        if (n_right == 0) {
            next_right = 0;
            for (int j = 0; j < BLOCK; j++) {
                stop_right[n_right] = (uint8_t)j;
                n_right += !gguflm_before(p, a[r - 1 - j]);
            }
        }
        int pairs = n_left < n_right ? n_left : n_right;
        for (int j = 0; j < pairs; j++) {
            gguflm_swap_items(a, l + stop_left[next_left + j], r - 1 - stop_right[next_right + j]);
        }
        if (pairs > 0) { /* where the scalar loop stands after that swap and its first++ */
            first = l + stop_left[next_left + pairs - 1] + 1;
            last = r - 1 - stop_right[next_right + pairs - 1];
        }
        n_left -= pairs;
        n_right -= pairs;
        next_left += pairs;
        next_right += pairs;
        if (n_left == 0) {
            l += BLOCK;
        }
        if (n_right == 0) {
            r -= BLOCK;
        }
    }
    for (;;) {
        while (gguflm_before(a[first], a[pivot])) {
            first++;
        }
        last--;
        while (gguflm_before(a[pivot], a[last])) {
            last--;
        }
        if (!(first < last)) {
            return first;
        }
        gguflm_swap_items(a, first, last);
        first++;
    }
}

/* __introsort_loop: median-of-three quicksort on the right part, loop on the left, heapsort
 * (partial_sort over the whole range) once depth_limit partitions have been spent */
static void gguflm_introsort_loop(uint64_t *a, int64_t first, int64_t last, int64_t depth_limit) {
    while (last - first > GGUFLM_STD_SORT_THRESHOLD) {
        if (depth_limit == 0) {
            gguflm_std_partial_sort(a + first, last - first, last - first);
            return;
        }
        depth_limit--;
        int64_t mid = first + (last - first) / 2;
        gguflm_move_median_to_first(a, first, first + 1, mid, last - 1);
        int64_t cut = gguflm_unguarded_partition(a, first + 1, last, first);
        gguflm_introsort_loop(a, cut, last, depth_limit);
        last = cut;
    }
}

/* std::sort(a, a + n): introsort to depth 2 * floor(log2 n), then the final insertion sort */
static void gguflm_std_sort(uint64_t *a, int64_t n) {
    if (n <= 0) {
        return;
    }
    int64_t floor_log2 = 63 - __builtin_clzll((unsigned long long)n);
    gguflm_introsort_loop(a, 0, n, 2 * floor_log2);
    gguflm_final_insertion_sort(a, n);
}

/* ------------------------------------------------------------------------------------------ */
/* the same orders sooner where no keys tie                                                     */
/*
 * Where no two items share a key there is one sorted order only, whatever moves led to it: the
 * emulation above matters for ties alone. Long runs take an LSD radix sort of a copy first (real
 * logits seldom tie), kept when the keys that decide the result come out distinct.
 */

enum { GGUFLM_RADIX_MIN = 256 };

/* Radix-sort a copy of a[0..n) by key. When the first `decided` items come out with distinct
 * keys, and (decided < n) the last of them ranks strictly before the next, that copy is the
 * order any sort leaves there: it replaces a and 1 is returned. Otherwise a is left as it was
 * and 0 returned. spare: 2*n words. */
static int gguflm_radix_sort_if_distinct(uint64_t *a, int64_t n, int64_t decided,
                                         uint64_t *spare) {
    enum { BITS = 11, BUCKETS = 1 << BITS, PASSES = 3 };
    static const int shift[PASSES] = {32, 32 + BITS, 32 + 2 * BITS};
    uint32_t hist[PASSES][BUCKETS];
    memset(hist, 0, sizeof hist);
    for (int64_t i = 0; i < n; i++) {
        for (int p = 0; p < PASSES; p++) {
            hist[p][(a[i] >> shift[p]) & (BUCKETS - 1)]++;
        }
    }
    const uint64_t *src = a; /* a itself is only read */
    uint64_t *dst = spare;
    for (int p = 0; p < PASSES; p++) {
        uint32_t *h = hist[p];
        int single_bucket = 0;
        uint32_t offset = 0;
        for (int d = 0; d < BUCKETS; d++) {
            single_bucket |= h[d] == (uint32_t)n; /* this digit is the same everywhere */
            uint32_t count = h[d];
            h[d] = offset;
            offset += count;
        }
        if (single_bucket) {
            continue;
        }
        for (int64_t i = 0; i < n; i++) {
            dst[h[(src[i] >> shift[p]) & (BUCKETS - 1)]++] = src[i];
        }
        src = dst;
        dst = dst == spare ? spare + n : spare;
    }
    int64_t last = decided < n ? decided : n - 1;
    for (int64_t i = 1; i <= last; i++) {
        if (!gguflm_before(src[i - 1], src[i])) {
            return 0;
        }
    }
    if (src != a) {
        memcpy(a, src, (size_t)n * sizeof *a);
    }
    return 1;
}

/* the order std::sort(a, a + n) leaves. spare: 2*n words */
static void gguflm_sort_as_std(uint64_t *a, int64_t n, uint64_t *spare) {
    if (n < GGUFLM_RADIX_MIN || !gguflm_radix_sort_if_distinct(a, n, n, spare)) {
        gguflm_std_sort(a, n);
    }
}

/* a[0..middle) as std::partial_sort(a, a + middle, a + n) leaves it; what follows is in no
 * particular order. spare: 2*n words */
static void gguflm_partial_sort_as_std(uint64_t *a, int64_t middle, int64_t n, uint64_t *spare) {
    if (middle < GGUFLM_RADIX_MIN || !gguflm_radix_sort_if_distinct(a, n, middle, spare)) {
        gguflm_std_partial_sort(a, middle, n);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* the partial sort's scan: find the next 16-logit block holding a value above a threshold     */

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

/* ------------------------------------------------------------------------------------------ */
/* llama.cpp's orderings of a row of candidates                                                 */

/* std::partial_sort(data, data + k, data + n) on a row's logits (llama.cpp's in-place partial
 * sort for k <= 128), as positions, best first: the heap of the first k items takes each later
 * item that ranks before its top, in row order, then is sorted. The scan skips blocks of 16 with
 * no logit above the top's: heap_select compares those and leaves them. __pop_heap also writes
 * the old top over the incoming item's slot, past the heap; nothing reads that slot again, so
 * it is left out. heap: k words. */
static void gguflm_heap_select_row(const float *logits, int64_t n, int64_t k, int32_t *out,
                                   uint64_t *heap, gguflm_scan_fn scan) {
    for (int64_t i = 0; i < k; i++) {
        heap[i] = gguflm_rank(logits[i], i);
    }
    gguflm_make_heap(heap, k);
    float thr = logits[gguflm_item_position(heap[0])];
    int64_t i = k;
    while (i < n) {
        if (thr == thr) { /* below a NaN top every number ranks first: check them all */
            i = scan(logits, i, n, thr);
        }
        int64_t block_end = i + 16 <= n ? i + 16 : n;
        for (; i < block_end; i++) {
            uint64_t item = gguflm_rank(logits[i], i);
            if (gguflm_before(item, heap[0])) {
                gguflm_adjust_heap(heap, 0, k, item);
                thr = logits[gguflm_item_position(heap[0])];
            }
        }
    }
    gguflm_sort_heap(heap, k);
    for (int64_t j = 0; j < k; j++) {
        out[j] = gguflm_item_position(heap[j]);
    }
}

/* llama.cpp's buckets: 128 over logits in [-10, 10), computed in float as it does. Its
 * int(bucket_scale * logit + bucket_inter) is x86's truncating conversion, which turns NaN and
 * anything at or beyond 2^31 (so +inf, and logits above ~3.4e8) into INT_MIN: bucket 0. */
enum { GGUFLM_LLAMA_BUCKETS = 128 };

static inline int gguflm_llama_bucket(float logit) {
    const float low = -10.0f, high = 10.0f;
    const float scale = GGUFLM_LLAMA_BUCKETS / (high - low);
    const float inter = -low * scale;
    float x = scale * logit + inter;
    if (!(x < 2147483648.0f) || x < 1.0f) {
        return 0;
    }
    return x >= (float)GGUFLM_LLAMA_BUCKETS ? GGUFLM_LLAMA_BUCKETS - 1 : (int)x;
}

/* llama.cpp's llama_token_data_array_partial_sort, as positions: candidates are dealt into the
 * buckets, best bucket first and each in row order, until the buckets taken hold npartial; those
 * wholly inside are std::sort-ed, the last one std::partial_sort-ed up to npartial.
 * 0 < npartial <= n; scratch: 3*n words. */
static void gguflm_bucket_partial_sort(const float *logits, int64_t n, int64_t npartial,
                                       int32_t *out, uint64_t *scratch) {
    uint64_t *items = scratch;                     /* [n] */
    uint64_t *spare = scratch + n;                 /* [2*n], for the sorts */
    uint8_t *bucket_of = (uint8_t *)(scratch + n); /* [n], in spare until the sorts start */
    int64_t histo[GGUFLM_LLAMA_BUCKETS] = {0};
    for (int64_t i = 0; i < n; i++) {
        int b = gguflm_llama_bucket(logits[i]);
        bucket_of[i] = (uint8_t)b;
        histo[b]++;
    }
    int64_t nhave = 0;
    int last = GGUFLM_LLAMA_BUCKETS - 1;
    for (;; last--) {
        nhave += histo[last];
        if (nhave >= npartial || last == 0) {
            break;
        }
    }
    int64_t next[GGUFLM_LLAMA_BUCKETS]; /* where each bucket taken writes its next item */
    int64_t offset = 0;
    for (int b = GGUFLM_LLAMA_BUCKETS - 1; b >= last; b--) {
        next[b] = offset;
        offset += histo[b];
    }
    for (int64_t i = 0; i < n; i++) {
        int b = bucket_of[i];
        if (b >= last) {
            items[next[b]++] = gguflm_rank(logits[i], i);
        }
    }
    int64_t done = 0;
    for (int b = GGUFLM_LLAMA_BUCKETS - 1; b > last; b--) {
        gguflm_sort_as_std(items + done, histo[b], spare);
        done += histo[b];
    }
    gguflm_partial_sort_as_std(items + done, npartial - done, histo[last], spare);
    for (int64_t j = 0; j < npartial; j++) {
        out[j] = gguflm_item_position(items[j]);
    }
}

/* llama.cpp's llama_token_data_array_partial_sort_inplace, as positions: the npartial best of
 * the row, in the order it leaves them (std::partial_sort up to 128, buckets above).
 * 0 < npartial <= n; scratch: 3*n words. */
static void gguflm_llama_partial_sort(const float *logits, int64_t n, int64_t npartial,
                                      int32_t *out, uint64_t *scratch, gguflm_scan_fn scan) {
    if (npartial <= 128) {
        gguflm_heap_select_row(logits, n, npartial, out, scratch, scan);
    } else {
        gguflm_bucket_partial_sort(logits, n, npartial, out, scratch);
    }
}

/* std::sort of positions 0..n-1, best key first (llama.cpp's typical sorts its indices so).
 * scratch: 3*n words. */
static void gguflm_std_sort_positions(const float *keys, int64_t n, int32_t *out,
                                      uint64_t *scratch) {
    for (int64_t i = 0; i < n; i++) {
        scratch[i] = gguflm_rank(keys[i], i);
    }
    gguflm_sort_as_std(scratch, n, scratch + n);
    for (int64_t i = 0; i < n; i++) {
        out[i] = gguflm_item_position(scratch[i]);
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
