// The C++ standard library's own sorts, for tests/test_sampling_kernels.py: built with the
// machine's g++ (the compiler llama.cpp's samplers are built with), loaded through ctypes.
//
// Candidates are llama.cpp's llama_token_data and the comparator its `a.logit > b.logit`, so
// tied logits come out in the order GCC's std::sort / std::partial_sort leave them. Rows must
// hold no NaN (that comparator is then no strict weak ordering).

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

struct token_data {
    int32_t id;
    float logit;
    float p;
};

bool logit_greater(const token_data &a, const token_data &b) { return a.logit > b.logit; }

std::vector<token_data> candidates(const float *logits, int64_t n) {
    std::vector<token_data> row(n);
    for (int64_t i = 0; i < n; i++) {
        row[i] = {static_cast<int32_t>(i), logits[i], 0.0f};
    }
    return row;
}

// McIlroy's adversary ("A killer adversary for quicksort", 1999): values are decided only when a
// comparison needs them, always so as to make the sort's pivot a bad one.
struct adversary {
    std::vector<int32_t> value;
    int32_t gas;
    int32_t solid = 0;
    int32_t candidate = 0;

    explicit adversary(int64_t n)
        : value(n, static_cast<int32_t>(n)), gas(static_cast<int32_t>(n)) {}

    bool less(int32_t x, int32_t y) {
        if (value[x] == gas && value[y] == gas) {
            value[x == candidate ? x : y] = solid++;
        }
        if (value[x] == gas) {
            candidate = x;
        } else if (value[y] == gas) {
            candidate = y;
        }
        return value[x] < value[y];
    }
};

}  // namespace

extern "C" {

// std::sort of the row by descending logit: the ids in their final order.
void oracle_sort(const float *logits, int64_t n, int32_t *ids) {
    std::vector<token_data> row = candidates(logits, n);
    std::sort(row.begin(), row.end(), logit_greater);
    for (int64_t i = 0; i < n; i++) {
        ids[i] = row[i].id;
    }
}

// std::partial_sort(row, row + middle, row + n) by descending logit: the first `middle` ids.
void oracle_partial_sort(const float *logits, int64_t n, int64_t middle, int32_t *ids) {
    std::vector<token_data> row = candidates(logits, n);
    std::partial_sort(row.begin(), row.begin() + middle, row.end(), logit_greater);
    for (int64_t i = 0; i < middle; i++) {
        ids[i] = row[i].id;
    }
}

// A row of n logits on which std::sort's quicksort degenerates, so that introsort spends its
// depth limit and falls back to heapsort. Logits that the adversary never had to decide stay
// tied at the lowest value.
void oracle_killer_row(int64_t n, float *logits) {
    adversary adv(n);
    std::vector<int32_t> order(n);
    for (int64_t i = 0; i < n; i++) {
        order[i] = static_cast<int32_t>(i);
    }
    std::sort(order.begin(), order.end(), [&adv](int32_t x, int32_t y) { return adv.less(x, y); });
    for (int64_t i = 0; i < n; i++) {
        logits[i] = -static_cast<float>(adv.value[i]);  // best first = smallest value first
    }
}

}  // extern "C"
