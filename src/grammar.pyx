# cython: language_level=3
"""The grammar matcher: llama.cpp's grammar stacks over a token trie (see grammar_engine.h).

:class:`TokenTrie` holds a vocabulary's pieces (as llama.cpp's grammar sees them: the
``token_to_piece(special=true)`` text up to a NUL byte) in a trie, built once per vocabulary.
:class:`Engine` holds one grammar's element tables and every stack, set of stacks and mask met so
far. A grammar state is ``(set id, partial value, partial remain)``: three ints, so that cloning a
sampler copies three ints and identical states share their cached masks.

Calls on one engine are serialised by its lock and run without the GIL.
"""

from cpython.pythread cimport (PyThread_acquire_lock, PyThread_allocate_lock, PyThread_free_lock,
                               PyThread_release_lock, PyThread_type_lock, WAIT_LOCK)
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.math cimport INFINITY

import numpy as np

from gguflm.grammar.gbnf import GrammarError


cdef extern from "grammar_engine.h" nogil:
    ctypedef struct gtrie:
        int32_t n_nodes
        int32_t max_depth
        int32_t n_order
    ctypedef struct gpartial:
        uint32_t value
        int32_t remain
    ctypedef struct gengine:
        int32_t n_stk
        int32_t n_set
        uint8_t *set_has_empty
        int32_t *set_len
        int64_t n_mask_computed
        int64_t n_mask_cached
    int GE_OK, GE_NOMEM, GE_TOO_MANY_STACKS, GE_TOO_AMBIGUOUS, GE_EMPTY, GE_TOO_MUCH_WORK
    int GE_MAX_SET, GE_MAX_STACKS, GE_MAX_ADVANCE
    int gtrie_build(gtrie *t, const uint8_t *data, const int64_t *off, const int32_t *len,
                    const int32_t *order, int32_t n)
    void gtrie_free(gtrie *t)
    int ge_init(gengine *e, const uint8_t *type, const uint32_t *value, int32_t n_elem,
                const int32_t *rule_start, int32_t n_rules, const gtrie *trie, int32_t n_vocab,
                const uint8_t *eog)
    void ge_free(gengine *e)
    int32_t ge_initial(gengine *e, int32_t start_rule)
    int32_t ge_accept(gengine *e, int32_t set, gpartial p, int32_t token, const uint8_t *piece,
                      int32_t len, gpartial *p_out)
    int ge_check_token(gengine *e, int32_t set, gpartial p, int32_t token, const uint8_t *piece,
                       int32_t len)
    const uint64_t *ge_mask(gengine *e, int32_t set, gpartial p, int *err)


cdef object _error(int code, str what):
    if code == GE_NOMEM:
        return MemoryError(f"grammar {what}: out of memory")
    if code == GE_TOO_MANY_STACKS:
        return GrammarError(f"grammar {what}: more than {GE_MAX_STACKS} distinct parse stacks")
    if code == GE_TOO_AMBIGUOUS:
        return GrammarError(f"grammar {what}: too ambiguous (more than {GE_MAX_SET} parse stacks "
                            f"at once, or more than {GE_MAX_ADVANCE} expansions of one stack)")
    if code == GE_TOO_MUCH_WORK:
        return GrammarError(f"grammar {what}: masking the vocabulary takes too many steps "
                            f"(the grammar is too ambiguous)")
    return GrammarError(f"grammar {what}: error {code}")


cdef class TokenTrie:
    """The pieces of a vocabulary in a trie.

    Parameters
    ----------
    pieces : sequence of bytes
        ``pieces[t]`` is token t's text as llama.cpp's grammar reads it (bytes after a NUL are
        ignored); tokens marked in ``eog`` or with an empty piece stay out of the trie.
    eog : sequence of bool
        End-of-generation flags, one per token.
    """

    cdef gtrie t
    cdef readonly int32_t n_vocab
    cdef bytes data
    cdef int64_t[::1] off       # [n_vocab] piece of token t: data[off[t] : off[t] + length[t]]
    cdef int32_t[::1] length
    cdef uint8_t[::1] eog

    def __cinit__(self, pieces, eog):
        cdef Py_ssize_t n = len(pieces)
        if len(eog) != n:
            raise ValueError(f"{len(eog)} end-of-generation flags for {n} pieces")
        if n > 2**31 - 1:
            raise ValueError("too many tokens")
        self.n_vocab = <int32_t>n
        cut = [p.split(b"\0", 1)[0] for p in pieces]
        self.data = b"".join(cut)
        lengths = np.fromiter((len(p) for p in cut), dtype=np.int32, count=n)
        offsets = np.zeros(n, dtype=np.int64)
        if n:
            np.cumsum(lengths[:n - 1], out=offsets[1:])
        self.off = offsets
        self.length = lengths
        self.eog = np.asarray(eog, dtype=np.uint8).copy()
        keep = [t for t in range(n) if cut[t] and not self.eog[t]]
        keep.sort(key=cut.__getitem__)
        order = np.asarray(keep, dtype=np.int32)
        sorted_off = offsets[order] if len(order) else np.zeros(0, dtype=np.int64)
        sorted_len = lengths[order] if len(order) else np.zeros(0, dtype=np.int32)
        cdef const uint8_t[::1] data_view = self.data if self.data else b"\0"
        cdef int64_t[::1] so = np.ascontiguousarray(sorted_off, dtype=np.int64)
        cdef int32_t[::1] sl = np.ascontiguousarray(sorted_len, dtype=np.int32)
        cdef int32_t[::1] od = np.ascontiguousarray(order, dtype=np.int32)
        cdef int32_t m = <int32_t>len(order)
        cdef int rc
        with nogil:
            rc = gtrie_build(&self.t, &data_view[0], &so[0] if m else NULL,
                             &sl[0] if m else NULL, &od[0] if m else NULL, m)
        if rc != GE_OK:
            raise MemoryError("cannot build the token trie")

    def __dealloc__(self):
        gtrie_free(&self.t)

    @property
    def n_nodes(self) -> int:
        """Nodes of the trie (the root included)."""
        return self.t.n_nodes

    def piece(self, int32_t token) -> bytes:
        """Token ``token``'s piece as the grammar reads it."""
        if not 0 <= token < self.n_vocab:
            raise IndexError(token)
        return self.data[self.off[token]:self.off[token] + self.length[token]]


cdef class Engine:
    """One grammar's matcher.

    Parameters
    ----------
    types, values : arrays
        The grammar's elements, all rules one after another (llama.cpp's ``llama_gretype`` and
        values; every rule ends with END).
    rule_start : array of int32
        Position of each rule's first element.
    trie : TokenTrie, optional
        The vocabulary to mask; without one only :meth:`accept` and :meth:`initial` work.
    """

    cdef gengine e
    cdef PyThread_type_lock lock
    cdef readonly TokenTrie trie
    cdef bint ready

    def __cinit__(self, types, values, rule_start, TokenTrie trie=None):
        self.lock = PyThread_allocate_lock()
        if self.lock == NULL:
            raise MemoryError()
        cdef const uint8_t[::1] ty = np.ascontiguousarray(types, dtype=np.uint8)
        cdef const uint32_t[::1] va = np.ascontiguousarray(values, dtype=np.uint32)
        cdef const int32_t[::1] rs = np.ascontiguousarray(rule_start, dtype=np.int32)
        if len(ty) != len(va) or len(ty) == 0 or len(rs) == 0:
            raise ValueError("a grammar needs elements and rules")
        self.trie = trie
        cdef const gtrie *t = &trie.t if trie is not None else NULL
        cdef int32_t n_vocab = trie.n_vocab if trie is not None else 0
        cdef const uint8_t *eog = &trie.eog[0] if trie is not None and trie.n_vocab else NULL
        rc = ge_init(&self.e, &ty[0], &va[0], <int32_t>len(ty), &rs[0], <int32_t>len(rs), t,
                     n_vocab, eog)
        if rc != GE_OK:
            raise MemoryError("cannot set up the grammar matcher")
        self.ready = True

    def __dealloc__(self):
        if self.ready:
            ge_free(&self.e)
        if self.lock != NULL:
            PyThread_free_lock(self.lock)

    cdef inline void _lock(self) noexcept nogil:
        PyThread_acquire_lock(self.lock, WAIT_LOCK)

    cdef inline void _unlock(self) noexcept nogil:
        PyThread_release_lock(self.lock)

    def initial(self, int32_t start_rule) -> int:
        """The set of stacks llama.cpp starts from (each alternative of ``start_rule``,
        advanced)."""
        cdef int32_t r
        with nogil:
            self._lock()
            r = ge_initial(&self.e, start_rule)
            self._unlock()
        if r < 0:
            raise _error(r, "initialisation")
        return r

    def accept(self, int32_t state_set, uint32_t value, int32_t remain, int32_t token,
               const uint8_t[::1] piece):
        """``llama_grammar_accept_token``: ``(set, value, remain)`` after ``token`` with
        ``piece``; ``set`` is 0 when no stack survives (llama.cpp throws)."""
        self._check_set(state_set)
        cdef gpartial p, out
        p.value = value
        p.remain = remain
        cdef int32_t r
        cdef const uint8_t *data = &piece[0] if piece.shape[0] else <const uint8_t *>b""
        cdef int32_t n = <int32_t>piece.shape[0]
        with nogil:
            self._lock()
            r = ge_accept(&self.e, state_set, p, token, data, n, &out)
            self._unlock()
        if r == GE_EMPTY:
            return 0, out.value, out.remain
        if r < 0:
            raise _error(r, "accept")
        return r, out.value, out.remain

    def has_empty_stack(self, int32_t state_set) -> bool:
        """Whether the grammar may end here (end-of-generation tokens are allowed)."""
        self._check_set(state_set)
        cdef uint8_t r
        with nogil:
            self._lock()
            r = self.e.set_has_empty[state_set]
            self._unlock()
        return r != 0

    def set_size(self, int32_t state_set) -> int:
        """How many parse stacks a state holds (llama.cpp's ``stacks.size()``)."""
        self._check_set(state_set)
        cdef int32_t r
        with nogil:
            self._lock()
            r = self.e.set_len[state_set]
            self._unlock()
        return r

    cdef int _check_set(self, int32_t state_set) except -1:
        if not 0 <= state_set < self.e.n_set:
            raise ValueError(f"no grammar state {state_set}")
        return 0

    def apply(self, int32_t state_set, uint32_t value, int32_t remain, int32_t[::1] ids,
              float[::1] logits, bint ids_are_positions=False, Py_ssize_t full_mask_from=-1):
        """llama.cpp's ``llama_grammar_apply_impl`` on candidates: rejected tokens' logits become
        -inf.

        ``ids_are_positions``: candidate i is token i (``ids`` is not read). Candidates are
        checked one by one when there are fewer than ``full_mask_from`` (default: 1/16 of the
        vocabulary), else through the whole-vocabulary mask, which is cached per state.
        """
        self._check_set(state_set)
        if self.trie is None:
            raise ValueError("this grammar matcher has no vocabulary")
        cdef Py_ssize_t n = logits.shape[0]
        if not ids_are_positions and ids.shape[0] < n:
            raise ValueError("fewer ids than logits")
        cdef int32_t n_vocab = self.trie.n_vocab
        if full_mask_from < 0:
            full_mask_from = max(64, n_vocab // 16)
        cdef gpartial p
        p.value = value
        p.remain = remain
        cdef int err = 0
        cdef int ok
        cdef Py_ssize_t i
        cdef int32_t tok
        cdef const uint64_t *bits
        cdef const uint8_t *data = <const uint8_t *>self.trie.data
        cdef int64_t[::1] off = self.trie.off
        cdef int32_t[::1] length = self.trie.length
        with nogil:
            self._lock()
            if n >= full_mask_from:
                bits = ge_mask(&self.e, state_set, p, &err)
                if bits != NULL:
                    for i in range(n):
                        tok = <int32_t>i if ids_are_positions else ids[i]
                        if tok < 0 or tok >= n_vocab or not (bits[tok >> 6] >> (tok & 63)) & 1:
                            logits[i] = -INFINITY
            else:
                for i in range(n):
                    tok = <int32_t>i if ids_are_positions else ids[i]
                    if tok < 0 or tok >= n_vocab:
                        logits[i] = -INFINITY
                        continue
                    ok = ge_check_token(&self.e, state_set, p, tok, data + off[tok], length[tok])
                    if ok < 0:
                        err = ok
                        break
                    if not ok:
                        logits[i] = -INFINITY
            self._unlock()
        if err:
            raise _error(err, "mask")

    def check(self, int32_t state_set, uint32_t value, int32_t remain, int32_t token) -> bool:
        """Whether ``token`` is accepted in this state (one candidate, no mask)."""
        self._check_set(state_set)
        if self.trie is None:
            raise ValueError("this grammar matcher has no vocabulary")
        if not 0 <= token < self.trie.n_vocab:
            return False
        cdef gpartial p
        p.value = value
        p.remain = remain
        cdef int r
        cdef const uint8_t *data = <const uint8_t *>self.trie.data
        cdef int64_t o = self.trie.off[token]
        cdef int32_t l = self.trie.length[token]
        with nogil:
            self._lock()
            r = ge_check_token(&self.e, state_set, p, token, data + o, l)
            self._unlock()
        if r < 0:
            raise _error(r, "check")
        return r == 1

    def mask(self, int32_t state_set, uint32_t value, int32_t remain):
        """The whole-vocabulary mask of a state: a bool array, True = accepted."""
        self._check_set(state_set)
        if self.trie is None:
            raise ValueError("this grammar matcher has no vocabulary")
        cdef gpartial p
        p.value = value
        p.remain = remain
        cdef int err = 0
        cdef const uint64_t *bits
        cdef int32_t n_vocab = self.trie.n_vocab
        out = np.zeros(((n_vocab + 63) // 64) * 64 // 8, dtype=np.uint8)
        cdef uint8_t[::1] o = out
        cdef Py_ssize_t nbytes = o.shape[0]
        with nogil:
            self._lock()
            bits = ge_mask(&self.e, state_set, p, &err)
            if bits != NULL and nbytes:
                memcpy_bits(&o[0], bits, nbytes)
            self._unlock()
        if bits == NULL:
            raise _error(err, "mask")
        return np.unpackbits(out, bitorder="little")[:n_vocab].astype(bool)

    def stats(self) -> dict:
        """Sizes of the memo tables: stacks, sets, masks computed and served from the cache."""
        return {"stacks": self.e.n_stk, "sets": self.e.n_set,
                "masks_computed": self.e.n_mask_computed, "masks_cached": self.e.n_mask_cached}


cdef extern from "string.h" nogil:
    void *memcpy(void *dst, const void *src, size_t n)


cdef inline void memcpy_bits(uint8_t *dst, const uint64_t *src, Py_ssize_t nbytes) noexcept nogil:
    memcpy(dst, src, nbytes)
