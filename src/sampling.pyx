"""Hot loops of the sampler chain: ordering, softmax, truncation and the random draws.

Thin ``def`` entry points check sizes, then run C kernels (``sampling_kernels.h``) without the
GIL. Candidates are a structure of arrays: ``ids`` int32, ``logits`` float32, ``p`` float32.
Work per call is one row of at most a vocabulary, so every kernel runs on the calling thread.

Orderings reproduce llama.cpp's exactly, ties included: GCC's ``std::sort``/``std::partial_sort``
move for move, and llama.cpp's bucket sort. The partial sort's scan has scalar, AVX2 and AVX-512
variants; a call runs the ISA of the one switch, :mod:`gguflm.system`, unless it names one.
"""

import numpy as np

from libc.float cimport FLT_MAX
from libc.math cimport INFINITY, logf, pow, powf, sqrtf
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy
from dispatch cimport bind_dispatch, dispatch_names, gguflm_dispatch

from gguflm._ext import system as _system


cdef extern from "sampling_kernels.h" nogil:
    ctypedef struct gguflm_mt19937:
        uint32_t state[624]
        int32_t next
    void gguflm_mt_seed(gguflm_mt19937 *g, uint32_t seed)
    uint32_t gguflm_mt_next(gguflm_mt19937 *g)
    double gguflm_mt_uniform_double(gguflm_mt19937 *g)
    float gguflm_mt_uniform_float(gguflm_mt19937 *g)
    void gguflm_std_sort_positions(const float *keys, int64_t n, int32_t *out, uint64_t *scratch)
    ctypedef int64_t (*gguflm_scan_fn)(const float *logits, int64_t i, int64_t n, float thr)
    gguflm_scan_fn gguflm_scan_for_isa(int isa)
    void gguflm_llama_partial_sort(const float *logits, int64_t n, int64_t npartial,
                                   int32_t *out, uint64_t *scratch, gguflm_scan_fn scan)
    void gguflm_softmax(const float *logits, float *p, int64_t n, int is_sorted)
    int64_t gguflm_dist_select(const float *logits, float *p, int64_t n, int is_sorted, double rnd)
    int64_t gguflm_discrete_select(const float *p, int64_t n, double u)
    int64_t gguflm_argmax(const float *logits, int64_t n)
    void gguflm_keep_max_only(float *logits, int64_t n)
    int64_t gguflm_top_p_cut(const float *p, int64_t n, float target, int64_t min_keep)
    float gguflm_max_logit(const float *logits, int64_t n)


cdef const gguflm_dispatch *_switch = bind_dispatch()


def dispatch() -> dict:
    """The ISA and arithmetic this module's kernels would run now, read through its binding."""
    return dispatch_names(_switch)


def available_isas() -> tuple:
    """The top-k scan variants this machine runs, scalar first."""
    return tuple(_system.supported_isas())


def _isa_level(name) -> int:
    if name is None:
        return _switch.isa
    if name not in _system.ISAS:
        raise ValueError(f"unknown ISA {name!r}; expected one of {_system.ISAS}")
    if name not in available_isas():
        raise ValueError(f"this machine cannot run the {name} variant")
    return _system.ISAS.index(name)


cdef class MT19937:
    """The Mersenne Twister of C++'s ``std::mt19937``: same seeding, same 32-bit stream.

    ``uniform_double``/``uniform_float`` are libstdc++'s ``uniform_real_distribution(0, 1)`` on that
    stream, so seeded samplers draw the numbers llama.cpp (built with GCC) draws.
    """

    cdef gguflm_mt19937 gen

    def __init__(self, uint32_t seed=5489):
        gguflm_mt_seed(&self.gen, seed)

    def seed(self, uint32_t seed) -> None:
        """Restart the stream from ``seed`` (``std::mt19937::seed``)."""
        gguflm_mt_seed(&self.gen, seed)

    def next_u32(self) -> int:
        """The next raw 32-bit output."""
        return gguflm_mt_next(&self.gen)

    def random_raw(self, Py_ssize_t n):
        """The next ``n`` raw outputs as a uint32 array."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        out = np.empty(n, dtype=np.uint32)
        cdef uint32_t[::1] view = out
        cdef Py_ssize_t i
        with nogil:
            for i in range(n):
                view[i] = gguflm_mt_next(&self.gen)
        return out

    def uniform_double(self) -> float:
        """``std::uniform_real_distribution<double>(0, 1)``: two outputs, in [0, 1)."""
        return gguflm_mt_uniform_double(&self.gen)

    def uniform_float(self) -> float:
        """``std::uniform_real_distribution<float>(0, 1)``: one output, in [0, 1)."""
        return gguflm_mt_uniform_float(&self.gen)

    def copy(self) -> MT19937:
        """An independent generator in the same state."""
        cdef MT19937 twin = MT19937.__new__(MT19937)
        memcpy(&twin.gen, &self.gen, sizeof(gguflm_mt19937))
        return twin

    def get_state(self) -> tuple:
        """``(words, next)``: the 624 state words (uint32 array) and the next word's index."""
        words = np.empty(624, dtype=np.uint32)
        cdef uint32_t[::1] view = words
        memcpy(&view[0], &self.gen.state[0], sizeof(self.gen.state))
        return words, self.gen.next

    def set_state(self, state) -> None:
        """Restore a state from :meth:`get_state`."""
        words, position = state
        cdef const uint32_t[::1] view = np.ascontiguousarray(words, dtype=np.uint32)
        if view.shape[0] != 624 or not 0 <= position <= 624:
            raise ValueError("an mt19937 state is 624 words and a position in 0..624")
        memcpy(&self.gen.state[0], &view[0], sizeof(self.gen.state))
        self.gen.next = position

    def __reduce__(self):
        return _restore_mt19937, (self.get_state(),)

    def __deepcopy__(self, memo) -> MT19937:
        return self.copy()


def _restore_mt19937(state) -> MT19937:
    rng = MT19937()
    rng.set_state(state)
    return rng


cdef inline void _check_same_length(Py_ssize_t a, Py_ssize_t b, str what) except *:
    if a != b:
        raise ValueError(f"{what}: lengths differ ({a} != {b})")


def sort_positions(const float[::1] keys, int32_t[::1] out, uint64_t[::1] scratch) -> None:
    """Positions 0..n-1 ordered by descending ``keys`` as GCC's ``std::sort`` leaves them.

    This is llama.cpp's order for a sort by ``keys[a] > keys[b]``: equal keys end up wherever
    libstdc++'s introsort moves them (NaN ranks last). ``out`` needs ``len(keys)`` entries and
    ``scratch`` ``3 * len(keys)`` words.
    """
    cdef Py_ssize_t n = keys.shape[0]
    if out.shape[0] < n or scratch.shape[0] < 3 * n:
        raise ValueError(f"sort_positions: buffers too small for {n} keys")
    if n == 0:
        return
    with nogil:
        gguflm_std_sort_positions(&keys[0], n, &out[0], &scratch[0])


def partial_sort_positions(const float[::1] logits, Py_ssize_t k, int32_t[::1] out,
                           uint64_t[::1] scratch, isa=None) -> int:
    """Positions of the ``k`` largest logits in the order llama.cpp's in-place partial sort
    (``llama_token_data_array_partial_sort_inplace``) leaves them, best first.

    Up to 128 that is GCC's ``std::partial_sort`` over the whole row, above it llama.cpp's bucket
    sort; equal logits land where those algorithms move them (NaN ranks last). Returns how many
    were written (``min(k, len(logits))``, 0 for k <= 0). ``out`` needs that many entries and
    ``scratch`` ``3 * len(logits)`` words. ``isa`` names the scan variant (default: the ISA in
    force).
    """
    cdef Py_ssize_t n = logits.shape[0]
    cdef gguflm_scan_fn scan = gguflm_scan_for_isa(_isa_level(isa))
    k = min(k, n)
    if k <= 0:
        return 0
    if out.shape[0] < k or scratch.shape[0] < 3 * n:
        raise ValueError(f"partial_sort_positions: buffers too small for k={k} of {n}")
    with nogil:
        gguflm_llama_partial_sort(&logits[0], n, k, &out[0], &scratch[0], scan)
    return k


def take_prefix(int32_t[::1] ids, float[::1] logits, float[::1] p,
                const int32_t[::1] positions, uint64_t[::1] scratch,
                bint ids_are_positions=False, bint p_is_zero=False) -> None:
    """Rewrite the first ``len(positions)`` candidates as the candidates at ``positions``.

    Positions must lie inside the arrays; ``scratch`` needs ``2 * len(positions)`` words.
    ``ids_are_positions``/``p_is_zero`` say that ``ids``/``p`` hold nothing yet and stand for
    ids 0..n-1 and zero probabilities (then they are only written, never read).
    """
    cdef Py_ssize_t n = ids.shape[0], m = positions.shape[0], j
    cdef int32_t pos
    cdef uint32_t logit_bits, p_bits
    _check_same_length(n, logits.shape[0], "take_prefix")
    _check_same_length(n, p.shape[0], "take_prefix")
    if m > n or scratch.shape[0] < 2 * m:
        raise ValueError(f"take_prefix: {m} positions for {n} candidates")
    for j in range(m):
        if positions[j] < 0 or positions[j] >= n:
            raise ValueError(f"take_prefix: position {positions[j]} outside 0..{n - 1}")
    with nogil:
        for j in range(m):
            pos = positions[j]
            memcpy(&logit_bits, &logits[pos], 4)
            p_bits = 0
            if not p_is_zero:
                memcpy(&p_bits, &p[pos], 4)
            scratch[2 * j] = (<uint64_t>logit_bits << 32) | <uint32_t>(
                pos if ids_are_positions else ids[pos])
            scratch[2 * j + 1] = p_bits
        for j in range(m):
            ids[j] = <int32_t>(<uint32_t>scratch[2 * j])
            logit_bits = <uint32_t>(scratch[2 * j] >> 32)
            p_bits = <uint32_t>scratch[2 * j + 1]
            memcpy(&logits[j], &logit_bits, 4)
            memcpy(&p[j], &p_bits, 4)


def softmax(const float[::1] logits, float[::1] p, bint is_sorted) -> None:
    """``p = softmax(logits)`` summed in float (llama.cpp's softmax); sorted rows start at the max."""
    cdef Py_ssize_t n = logits.shape[0]
    _check_same_length(n, p.shape[0], "softmax")
    if n == 0:
        return
    with nogil:
        gguflm_softmax(&logits[0], &p[0], n, is_sorted)


def dist_select(const float[::1] logits, float[::1] p, bint is_sorted, double rnd) -> int:
    """llama.cpp's dist: softmax into ``p`` and the position where the running sum reaches rnd."""
    cdef Py_ssize_t n = logits.shape[0]
    cdef int64_t selected
    _check_same_length(n, p.shape[0], "dist_select")
    if n < 2:
        raise ValueError("dist_select needs at least two candidates")
    with nogil:
        selected = gguflm_dist_select(&logits[0], &p[0], n, is_sorted, rnd)
    return selected


def discrete_select(const float[::1] p, double u) -> int:
    """``std::discrete_distribution`` over weights ``p`` for the uniform draw ``u`` (n >= 2)."""
    cdef Py_ssize_t n = p.shape[0]
    cdef int64_t selected
    if n < 2:
        raise ValueError("discrete_select needs at least two weights")
    with nogil:
        selected = gguflm_discrete_select(&p[0], n, u)
    return selected


def argmax(const float[::1] logits) -> int:
    """The first position of the largest logit (0 for a row that starts with NaN)."""
    cdef Py_ssize_t n = logits.shape[0]
    cdef int64_t best
    if n == 0:
        raise ValueError("argmax of no candidates")
    with nogil:
        best = gguflm_argmax(&logits[0], n)
    return best


def keep_max_only(float[::1] logits) -> None:
    """Set every logit but the first maximum to -inf (temperature <= 0)."""
    cdef Py_ssize_t n = logits.shape[0]
    if n == 0:
        return
    with nogil:
        gguflm_keep_max_only(&logits[0], n)


def top_p_cut(const float[::1] p, float target, Py_ssize_t min_keep) -> int:
    """Length of the shortest prefix of best-first ``p`` reaching ``target`` with at least
    ``min_keep`` entries (float running sum, as llama.cpp); -1 if no prefix does."""
    cdef Py_ssize_t n = p.shape[0]
    cdef int64_t cut
    if n == 0:
        return -1
    with nogil:
        cut = gguflm_top_p_cut(&p[0], n, target, min_keep)
    return cut


def min_p_filter(int32_t[::1] ids, float[::1] logits, float[::1] p, float min_p,
                 Py_ssize_t min_keep) -> int:
    """min-p on unsorted candidates: keep, in order, those with logit >= max + logf(min_p).

    The max starts from -FLT_MAX, as llama.cpp's does: in a row of -inf nothing stays. Compacts
    in place and returns the new size, or -1 (nothing changed) when fewer than
    ``max(min_keep, 1)`` would stay.
    """
    cdef Py_ssize_t n = ids.shape[0], i, kept = 0
    cdef float min_logit
    _check_same_length(n, logits.shape[0], "min_p_filter")
    _check_same_length(n, p.shape[0], "min_p_filter")
    if n == 0:
        return -1
    with nogil:
        min_logit = -FLT_MAX
        for i in range(n):
            min_logit = logits[i] if min_logit < logits[i] else min_logit
        min_logit = min_logit + logf(min_p)
        for i in range(n):
            if logits[i] >= min_logit:
                kept += 1
        if kept == 0 or kept < min_keep:
            kept = -1
        else:
            kept = 0
            for i in range(n):
                if logits[i] >= min_logit:
                    ids[kept] = ids[i]
                    logits[kept] = logits[i]
                    p[kept] = p[i]
                    kept += 1
    return kept


def min_p_cut_sorted(const float[::1] logits, float min_p, Py_ssize_t min_keep) -> int:
    """min-p on best-first candidates: how many stay (at least one, at least ``min_keep``)."""
    cdef Py_ssize_t n = logits.shape[0], i = 1
    cdef float min_logit
    if n == 0:
        return 0
    with nogil:
        min_logit = logits[0] + logf(min_p)
        while i < n:
            if logits[i] < min_logit and i >= min_keep:
                break
            i += 1
    return i


def top_n_sigma_mask(float[::1] logits, float n_sigma) -> None:
    """Set to -inf every logit below ``max - n_sigma * std`` (mean and std over the logits that
    are not -inf, accumulated in float as llama.cpp does)."""
    cdef Py_ssize_t n = logits.shape[0], i, valid = 0
    cdef float max_l, total = 0.0, mean = 0.0, acc = 0.0, spread = 0.0
    if n == 0:
        return
    with nogil:
        max_l = logits[0]
        for i in range(n):
            if logits[i] != -INFINITY:
                if logits[i] > max_l:
                    max_l = logits[i]
                total += logits[i]
                valid += 1
        if valid > 0:
            mean = total / valid
            for i in range(n):
                if logits[i] != -INFINITY:
                    acc = <float>(<double>acc + pow(<double>(logits[i] - mean), 2.0))
            spread = sqrtf(acc / valid)
        for i in range(n):
            if logits[i] < max_l - n_sigma * spread:
                logits[i] = -INFINITY


def find_token_positions(const int32_t[::1] ids, const int32_t[::1] tokens,
                         int32_t[::1] out) -> None:
    """Where each of ``tokens`` (sorted, distinct) sits in ``ids``: ``out[j]`` = position or -1.

    A token t found at position t (an untouched row from ``from_logits``) costs one check; the
    rest take one pass over ``ids`` with a 4096-bit filter in front of a binary search.
    """
    cdef Py_ssize_t n = ids.shape[0], m = tokens.shape[0], i, j, missing = 0
    cdef int32_t t, lo, hi, mid
    cdef uint64_t seen[64]
    _check_same_length(m, out.shape[0], "find_token_positions")
    for j in range(1, m):
        if tokens[j] <= tokens[j - 1]:
            raise ValueError("find_token_positions: tokens must be sorted and distinct")
    with nogil:
        for j in range(64):
            seen[j] = 0
        for j in range(m):
            t = tokens[j]
            if 0 <= t < n and ids[t] == t:
                out[j] = t
            else:
                out[j] = -1
                missing += 1
                seen[(t >> 6) & 63] |= (<uint64_t>1) << (t & 63)
        if missing > 0:
            for i in range(n):
                t = ids[i]
                if not (seen[(t >> 6) & 63] >> (t & 63)) & 1:
                    continue
                lo = 0
                hi = <int32_t>m - 1
                while lo <= hi:
                    mid = (lo + hi) >> 1
                    if tokens[mid] < t:
                        lo = mid + 1
                    elif tokens[mid] > t:
                        hi = mid - 1
                    else:
                        if out[mid] < 0:
                            out[mid] = <int32_t>i
                        break


def dry_repeat_counts(const int32_t[::1] recent, int rep_limit, int32_t[::1] out) -> None:
    """DRY step 2 (llama.cpp's reverse Z-algorithm) over the last tokens, most recent first.

    ``out[len - 1 - k]`` receives how many tokens before (and ending at) ``recent[k]`` repeat the
    context's tail, capped at ``rep_limit``; ``out`` has ``len(recent)`` entries.
    """
    cdef Py_ssize_t n = recent.shape[0]
    cdef int k, lt = 0, rt = 0, run, pair, right_len, i, last = <int>n - 1
    _check_same_length(n, out.shape[0], "dry_repeat_counts")
    with nogil:
        for k in range(<int>n):
            out[k] = 0
        for k in range(1, <int>n):
            if k > rt:
                # outside the current Z-box: compare directly
                run = 0
                while run + k < n and recent[run] == recent[run + k]:
                    run += 1
                out[last - k] = run if run < rep_limit else rep_limit
                if run > 0:
                    lt = k
                    rt = k + run - 1
            else:
                # inside the Z-box: reuse the mirrored value unless it reaches the box's edge
                pair = k - lt
                right_len = rt - k + 1
                if out[last - pair] < right_len:
                    run = out[last - pair]
                    out[last - k] = run if run < rep_limit else rep_limit
                else:
                    i = rt + 1
                    while i < n and recent[i] == recent[i - k]:
                        i += 1
                    run = i - k
                    out[last - k] = run if run < rep_limit else rep_limit
                    lt = k
                    rt = i - 1


def powf_scalar(float x, float y) -> float:
    """C's ``powf(x, y)``, as llama.cpp's samplers take it (numpy's float32 power rounds
    differently in about one case in five)."""
    return powf(x, y)


def logf_array(const float[::1] x, float[::1] out) -> None:
    """``out[i] = logf(x[i])``: C's float log, as llama.cpp's samplers take it (numpy's float32
    log is a different approximation and differs from it by an ulp at times)."""
    if out.shape[0] != x.shape[0]:
        raise ValueError("out must have x's length")
    cdef Py_ssize_t i
    with nogil:
        for i in range(x.shape[0]):
            out[i] = logf(x[i])
