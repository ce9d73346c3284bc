"""The KV cache's cell search (gguflm.kv_cache.KVCache.find_slot), as a typed loop: a generation
step places one token per decode, and a numpy pass per step over the cells costs more than the
search itself.
"""

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint64_t

cnp.import_array()

cdef extern from *:
    int __builtin_ctzll(unsigned long long x) noexcept nogil


cdef inline bint _single(uint64_t q) noexcept nogil:
    """the cell belongs to exactly one sequence"""
    return q != 0 and (q & (q - 1)) == 0


cdef inline bint _reusable(int32_t p, uint64_t q, const int64_t *pos_max, int32_t n_swa, bint chunked) noexcept nogil:
    """free, or (a window) one sequence's and outside the window of that sequence's next position:
    at least n_swa behind it, or (chunked) before its chunk"""
    if p < 0:
        return True
    if n_swa <= 0 or not _single(q):
        return False
    cdef int64_t p1 = pos_max[__builtin_ctzll(q)] + 1
    return p < (p1 // n_swa) * n_swa if chunked else p1 - p >= n_swa


def find_cells(cnp.ndarray pos, cnp.ndarray seq, int64_t first, int64_t size, int64_t head, int32_t n_swa,
               cnp.ndarray out, bint chunked=False):
    """Fill ``out`` (int64 [n_tokens]) with the first ``n_tokens`` reusable cells of the region
    [first, first + size) of a cache's cells (``pos`` int32, ``seq`` uint64 bit masks), searched
    from ``head`` (relative to the region; from 0 when the head is past the region's used cells
    + 2 * n_tokens) and wrapping around. Reusable: free, or with a sliding window (``n_swa`` > 0)
    a cell of one sequence whose position is at least n_swa below the next position of that
    sequence (its newest among the cache's cells of one sequence, plus one), or with ``chunked``
    before that position's chunk of n_swa. Returns False, ``out`` unspecified, when fewer are."""
    if pos.dtype != np.int32 or seq.dtype != np.uint64 or out.dtype != np.int64 or \
            seq.shape[0] != pos.shape[0] or not (0 <= first and first + size <= pos.shape[0]) or \
            not (pos.flags.c_contiguous and seq.flags.c_contiguous and out.flags.c_contiguous):
        raise ValueError("not a cache's cells and a region of them")
    cdef const int32_t *P = <const int32_t *>cnp.PyArray_DATA(pos)
    cdef const uint64_t *Q = <const uint64_t *>cnp.PyArray_DATA(seq)
    cdef int64_t *O = <int64_t *>cnp.PyArray_DATA(out)
    cdef int64_t n_tokens = out.shape[0], n = pos.shape[0], i, c, used = 0, found = 0
    cdef int64_t pos_max[64]
    cdef int s
    if n_tokens > size:
        return False
    with nogil:
        if n_swa > 0:
            # each sequence's newest position among the cells of that sequence alone
            for s in range(64):
                pos_max[s] = -1
            for i in range(n):
                if P[i] >= 0 and _single(Q[i]):
                    s = __builtin_ctzll(Q[i])
                    if P[i] > pos_max[s]:
                        pos_max[s] = P[i]
        for i in range(first, first + size):
            if P[i] >= 0:
                used += 1
        if head > used + 2 * n_tokens:   # enough room before the head: refill from 0
            head = 0
        elif head > size:
            head = size
        for i in range(size):
            c = first + (head + i) % size
            if _reusable(P[c], Q[c], pos_max, n_swa, chunked):
                O[found] = c
                found += 1
                if found == n_tokens:
                    break
    return found == n_tokens


def used_max_p1(cnp.ndarray pos):
    """One past the highest occupied cell of ``pos`` (int32; -1 = free), 0 if none is."""
    if pos.dtype != np.int32 or not pos.flags.c_contiguous:
        raise ValueError("not a cache's cell positions")
    cdef const int32_t *P = <const int32_t *>cnp.PyArray_DATA(pos)
    cdef int64_t i = pos.shape[0] - 1
    with nogil:
        while i >= 0 and P[i] < 0:
            i -= 1
    return i + 1
