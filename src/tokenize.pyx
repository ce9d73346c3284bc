# cython: language_level=3
"""Tokenizer hot loops: special-token partitioning, pre-tokenizer splitting, BPE and SPM merging,
WordPiece matching. Each engine reproduces the corresponding llama.cpp session exactly; Python in
gguflm/tokenizers only configures them.

Text arrives as UTF-8 bytes. Token texts are bytes. Engines return ``list[int]``.

The engines keep scratch buffers and (BPE) a word cache between calls, so they run with the GIL
held: that makes one Vocab safe to share between threads, and tokenizing is a single-core job.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, qsort, realloc
from libc.string cimport memcpy

import numpy as np


cdef extern from "tok_text.h" nogil:
    enum:
        UNI_UNDEFINED
        UNI_NUMBER
        UNI_LETTER
        UNI_SEPARATOR
        UNI_MARK
        UNI_PUNCTUATION
        UNI_SYMBOL
        UNI_CONTROL
        UNI_WHITESPACE
        UNI_CATEGORY_MASK
    int uni_init()
    uint16_t uni_flags(uint32_t cpt)
    uint32_t uni_tolower(uint32_t cpt)
    uint32_t uni_nfd(uint32_t cpt)
    size_t utf8_seq_len(uint8_t lead)
    uint32_t utf8_next(const uint8_t *s, size_t n, size_t *pos)
    int utf8_encode(uint32_t cpt, uint8_t *out)
    uint64_t stdhash_bytes(const uint8_t *p, size_t len)

    ctypedef struct strmap_t:
        size_t n
        int32_t *val
    int strmap_init(strmap_t *m, size_t expected)
    void strmap_free(strmap_t *m)
    int64_t strmap_find(const strmap_t *m, const uint8_t *p, size_t len)
    int32_t strmap_get(const strmap_t *m, const uint8_t *p, size_t len, int32_t missing)
    int64_t strmap_insert(strmap_t *m, const uint8_t *p, size_t len, int32_t value, int *inserted)

    ctypedef struct pairmap_t:
        size_t n
    int pairmap_init(pairmap_t *m, size_t expected)
    void pairmap_free(pairmap_t *m)
    int64_t pairmap_get(const pairmap_t *m, int32_t a, int32_t b, int64_t missing)
    int pairmap_put_new(pairmap_t *m, int32_t a, int32_t b, int64_t value)

    int stdmap_iteration_order(const uint64_t *hashes, size_t n, int32_t *order)
    int array_grow(void **p, size_t *cap, size_t need, size_t elem)


if uni_init() != 0:
    raise MemoryError("cannot allocate the code point table")

# native pre-tokenizer splitters (BpeEngine steps); any other step is a Python callable
SPLIT_GPT2 = 1     # 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
SPLIT_LLAMA3 = 2   # (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|...
SPLIT_DIGITS = 3   # \p{N}: every number code point alone

FLAG_NUMBER = UNI_NUMBER
FLAG_LETTER = UNI_LETTER
FLAG_MARK = UNI_MARK
FLAG_PUNCTUATION = UNI_PUNCTUATION
FLAG_SYMBOL = UNI_SYMBOL
FLAG_CONTROL = UNI_CONTROL
FLAG_WHITESPACE = UNI_WHITESPACE

cdef uint32_t OUT_OF_RANGE = 0xFFFFFFFF
cdef bytes ESCAPED_SPACE = "\u2581".encode()


# ---------------------------------------------------------------------------------------------
# small growable arrays

cdef struct IntVec:
    int32_t *data
    size_t n
    size_t cap


cdef int ivec_reserve(IntVec *v, size_t need) except -1:
    return ivec_reserve_raw(&v.data, &v.cap, need)


cdef int ivec_reserve_raw(int32_t **data, size_t *cap, size_t need) except -1:
    if array_grow(<void **>data, cap, need, sizeof(int32_t)):
        raise MemoryError()
    return 0


cdef inline int ivec_push(IntVec *v, int32_t x) except -1:
    if v.n == v.cap:
        ivec_reserve(v, v.n + 1)
    v.data[v.n] = x
    v.n += 1
    return 0


cdef list ivec_list(IntVec *v):
    return [v.data[i] for i in range(v.n)]


cdef struct ByteVec:
    uint8_t *data
    size_t n
    size_t cap


cdef int bvec_reserve(ByteVec *v, size_t need) except -1:
    if array_grow(<void **>&v.data, &v.cap, need, 1):
        raise MemoryError()
    return 0


cdef int bvec_append(ByteVec *v, const uint8_t *p, size_t n) except -1:
    if n == 0:   # v.data and p may be NULL, which memcpy may not get even for 0 bytes
        return 0
    bvec_reserve(v, v.n + n)
    memcpy(v.data + v.n, p, n)
    v.n += n
    return 0


# ---------------------------------------------------------------------------------------------
# code points

def cpt_flags(uint32_t cpt) -> int:
    """llama.cpp's class bits of a code point (category | 0x100 when White_Space)."""
    return uni_flags(cpt)


def cpt_tolower(uint32_t cpt) -> int:
    """Simple lowercase mapping (the code point itself when it has none)."""
    return uni_tolower(cpt)


def cpt_nfd(uint32_t cpt) -> int:
    """First code point of the canonical decomposition (the code point itself when none)."""
    return uni_nfd(cpt)


cdef class CodepointText:
    """Text decoded to code points the way llama.cpp decodes it, with its re-encoded UTF-8.

    Invalid UTF-8 becomes U+FFFD one byte at a time, so ``utf8`` can differ from the input.
    """

    cdef uint32_t *cpt         # [n]
    cdef int64_t *byte_off     # [n + 1] offset of each code point in utf8
    cdef uint8_t *utf8         # [byte_off[n]]
    cdef readonly int64_t n
    cdef object _collapsed
    cdef object _wide

    def __cinit__(self, const uint8_t[::1] text):
        cdef size_t pos = 0, size = text.shape[0]
        cdef int64_t i, k
        cdef int w
        cdef uint8_t enc[4]
        self.cpt = <uint32_t *>malloc((size + 1) * sizeof(uint32_t))
        self.byte_off = <int64_t *>malloc((size + 1) * sizeof(int64_t))
        self.utf8 = <uint8_t *>malloc(3 * size + 1)
        if self.cpt == NULL or self.byte_off == NULL or self.utf8 == NULL:
            raise MemoryError()
        i = 0
        k = 0
        while pos < size:
            self.cpt[i] = utf8_next(&text[0], size, &pos)
            w = utf8_encode(self.cpt[i], enc)
            if w == 0:
                raise ValueError(f"text decodes to code point {self.cpt[i]:#x}, past U+10FFFF")
            self.byte_off[i] = k
            memcpy(self.utf8 + k, enc, w)
            k += w
            i += 1
        self.byte_off[i] = k
        self.n = i

    def __dealloc__(self):
        free(self.cpt)
        free(self.byte_off)
        free(self.utf8)

    def codepoints(self) -> list:
        return [self.cpt[i] for i in range(self.n)]

    def collapsed(self) -> bytes:
        """One byte per code point for byte regexes with \\p{..} classes rewritten (llama.cpp's
        trick): ASCII stays, other white space becomes 0x0B, other code points their category's
        byte (0xD1 number, 0xD2 letter, 0xD3 punctuation, 0xD4 mark, 0xD5 symbol, 0xD0 other)."""
        cdef bytearray out
        cdef int64_t i
        cdef uint32_t c
        cdef uint16_t f, cat
        if self._collapsed is None:
            out = bytearray(self.n)
            for i in range(self.n):
                c = self.cpt[i]
                if c < 128:
                    out[i] = c
                    continue
                f = uni_flags(c)
                cat = f & UNI_CATEGORY_MASK
                if f & UNI_WHITESPACE:
                    out[i] = 0x0B
                elif cat == UNI_NUMBER:
                    out[i] = 0xD1
                elif cat == UNI_LETTER:
                    out[i] = 0xD2
                elif cat == UNI_PUNCTUATION:
                    out[i] = 0xD3
                elif cat == UNI_MARK:
                    out[i] = 0xD4
                elif cat == UNI_SYMBOL:
                    out[i] = 0xD5
                else:
                    out[i] = 0xD0
            self._collapsed = bytes(out)
        return self._collapsed

    def wide(self) -> str:
        """The code points as a str for regexes without \\p{..}: non-ASCII white space becomes
        U+000B (llama.cpp's std::wregex stand-in), code points past U+10FFFF become U+FFFD."""
        cdef int64_t i
        cdef uint32_t c
        if self._wide is None:
            chars = []
            for i in range(self.n):
                c = self.cpt[i]
                if c > 0x7F and (uni_flags(c) & UNI_WHITESPACE):
                    c = 0x0B
                chars.append(chr(c) if c < 0x110000 else "\ufffd")
            self._wide = "".join(chars)
        return self._wide


# ---------------------------------------------------------------------------------------------
# native pre-tokenizer splitters: word lengths (in code points) in, finer word lengths out

cdef inline uint32_t seg_cpt(CodepointText t, int64_t pos, int64_t ini, int64_t end):
    return t.cpt[pos] if ini <= pos < end else OUT_OF_RANGE


cdef inline uint16_t seg_flags(CodepointText t, int64_t pos, int64_t ini, int64_t end):
    return uni_flags(t.cpt[pos]) if ini <= pos < end else 0


cdef inline bint is_contraction(CodepointText t, int64_t pos, int64_t ini, int64_t end,
                                bint fold, int64_t *length):
    """'s 't 'm 'd (2 code points) or 're 've 'll (3) at pos; fold: case-insensitive."""
    cdef uint32_t a, b
    if t.cpt[pos] != 0x27 or pos + 1 >= end:
        return False
    a = seg_cpt(t, pos + 1, ini, end)
    if fold:
        a = uni_tolower(a)
    if a == 0x73 or a == 0x74 or a == 0x6D or a == 0x64:
        length[0] = 2
        return True
    if pos + 2 < end:
        b = seg_cpt(t, pos + 2, ini, end)
        if fold:
            b = uni_tolower(b)
        if (a == 0x72 and b == 0x65) or (a == 0x76 and b == 0x65) or (a == 0x6C and b == 0x6C):
            length[0] = 3
            return True
    return False


cdef int emit_word(IntVec *out, int64_t *prev_end, int64_t end) except -1:
    if end > prev_end[0]:
        ivec_push(out, <int32_t>(end - prev_end[0]))
    prev_end[0] = end
    return 0


cdef inline int64_t class_run_end(CodepointText t, int64_t pos, int64_t ini, int64_t end,
                                  uint16_t mask, bint outside):
    """First position from pos whose class is not (outside: is) in mask; outside also stops at
    the segment end."""
    cdef uint16_t f = seg_flags(t, pos, ini, end)
    while (f and not (f & mask)) if outside else (f & mask):
        pos += 1
        f = seg_flags(t, pos, ini, end)
    return pos


cdef int64_t whitespace_end(CodepointText t, int64_t pos, int64_t ini, int64_t end,
                            bint newline_runs) noexcept:
    """End of the white-space word at pos: \s*[\r\n]+ (with newline_runs), else \s+(?!\S)
    leaving the last space to the next word, else \s+; one code point when none applies."""
    cdef int64_t nws = 0, last_crlf = 0
    cdef uint32_t c
    while seg_flags(t, pos + nws, ini, end) & UNI_WHITESPACE:
        c = t.cpt[pos + nws]
        if newline_runs and (c == 0x0D or c == 0x0A):
            last_crlf = pos + nws + 1
        nws += 1
    if last_crlf > 0:
        return last_crlf
    if nws > 1 and pos + nws < end:
        return pos + nws - 1
    return pos + (nws if nws > 0 else 1)


# a splitter returns where the word starting at pos ends (it may emit words before it itself)
ctypedef int64_t (*next_word_fn)(CodepointText t, int64_t pos, int64_t ini, int64_t end,
                                 IntVec *out, int64_t *prev) except -1


cdef int split_segments(CodepointText t, IntVec *words, IntVec *out,
                        next_word_fn next_word) except -1:
    """Cut every word [ini, end) of the previous step with a splitter."""
    cdef int64_t ini = 0, end, pos, prev
    cdef size_t w
    for w in range(words.n):
        end = ini + words.data[w]
        pos = prev = ini
        while pos < end:
            pos = next_word(t, pos, ini, end, out, &prev)
            emit_word(out, &prev, pos)
        ini = end
    return 0


cdef int64_t gpt2_next(CodepointText t, int64_t pos, int64_t ini, int64_t end, IntVec *out,
                       int64_t *prev) except -1:
    """'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"""
    cdef int64_t clen = 0
    cdef uint32_t cpt = t.cpt[pos]
    cdef bint space = cpt == 0x20
    cdef uint16_t f2
    if is_contraction(t, pos, ini, end, False, &clen):
        return pos + clen
    f2 = seg_flags(t, pos + 1, ini, end) if space else uni_flags(cpt)
    if f2 & UNI_LETTER:
        return class_run_end(t, pos + space, ini, end, UNI_LETTER, False)
    if f2 & UNI_NUMBER:
        return class_run_end(t, pos + space, ini, end, UNI_NUMBER, False)
    if f2 and not (f2 & (UNI_WHITESPACE | UNI_LETTER | UNI_NUMBER)):
        return class_run_end(t, pos + space, ini, end, UNI_WHITESPACE | UNI_LETTER | UNI_NUMBER,
                             True)
    return whitespace_end(t, pos, ini, end, False)


cdef int64_t llama3_next(CodepointText t, int64_t pos, int64_t ini, int64_t end, IntVec *out,
                         int64_t *prev) except -1:
    """(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}
    | ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"""
    cdef int64_t clen = 0, start
    cdef uint32_t cpt = t.cpt[pos], c2
    cdef uint16_t f = uni_flags(cpt), f2
    if is_contraction(t, pos, ini, end, True, &clen):
        return pos + clen
    if not (cpt == 0x0D or cpt == 0x0A or (f & UNI_NUMBER)) and \
            ((f & UNI_LETTER) or (seg_flags(t, pos + 1, ini, end) & UNI_LETTER)):
        return class_run_end(t, pos + 1, ini, end, UNI_LETTER, False)
    if f & UNI_NUMBER:         # groups of three, the last one shorter
        start = pos
        while seg_flags(t, pos, ini, end) & UNI_NUMBER:
            pos += 1
            if pos - start >= 3:
                emit_word(out, prev, pos)
                start = pos
        return pos
    f2 = seg_flags(t, pos + 1, ini, end) if cpt == 0x20 else f
    if not (f2 & (UNI_WHITESPACE | UNI_LETTER | UNI_NUMBER)) and f:  # llama.cpp tests f, not f2
        pos = class_run_end(t, pos + (cpt == 0x20), ini, end,
                            UNI_WHITESPACE | UNI_LETTER | UNI_NUMBER, True)
        c2 = seg_cpt(t, pos, ini, end)
        while c2 == 0x0D or c2 == 0x0A:
            pos += 1
            c2 = seg_cpt(t, pos, ini, end)
        return pos
    return whitespace_end(t, pos, ini, end, True)


cdef inline bint is_regex_digit(uint32_t c) noexcept:
    """\\p{N} in llama.cpp's collapsed std::regex: ASCII 0-9, and non-ASCII numbers that are not
    white space (those collapse to 0x0B)."""
    cdef uint16_t f
    if c < 128:
        return 0x30 <= c <= 0x39
    f = uni_flags(c)
    return (f & UNI_CATEGORY_MASK) == UNI_NUMBER and not (f & UNI_WHITESPACE)


cdef int64_t digits_next(CodepointText t, int64_t pos, int64_t ini, int64_t end, IntVec *out,
                         int64_t *prev) except -1:
    """\\p{N}: each number code point alone; the stretches between them are words too."""
    if is_regex_digit(t.cpt[pos]):
        return pos + 1
    while pos < end and not is_regex_digit(t.cpt[pos]):
        pos += 1
    return pos


cdef int run_steps(CodepointText t, list steps, IntVec *words) except -1:
    """Apply the pre-tokenizer steps in order; words holds the word lengths, in and out."""
    cdef IntVec nxt
    cdef size_t i
    words.n = 0
    if t.n == 0:
        return 0
    ivec_push(words, <int32_t>t.n)
    for step in steps:
        nxt.data = NULL
        nxt.n = nxt.cap = 0
        try:
            if step == SPLIT_GPT2:
                split_segments(t, words, &nxt, gpt2_next)
            elif step == SPLIT_LLAMA3:
                split_segments(t, words, &nxt, llama3_next)
            elif step == SPLIT_DIGITS:
                split_segments(t, words, &nxt, digits_next)
            else:
                for length in step(t, ivec_list(words)):
                    ivec_push(&nxt, length)
        except BaseException:
            free(nxt.data)
            raise
        free(words.data)
        words[0] = nxt
    return 0


def split_lengths(const uint8_t[::1] text, list steps) -> list:
    """Lengths in code points of the words a pre-tokenizer cuts ``text`` into (for tests)."""
    cdef CodepointText t = CodepointText(text)
    cdef IntVec words
    words.data = NULL
    words.n = words.cap = 0
    try:
        run_steps(t, steps, &words)
        return ivec_list(&words)
    finally:
        free(words.data)


# ---------------------------------------------------------------------------------------------
# a min-heap of merge candidates, shared by BPE (rank, left) and SPM (-score, left)

cdef struct Candidate:
    uint64_t key       # priority, lowest first; the low 32 bits are the left symbol
    int32_t right
    int32_t size       # byte length of left + right when the candidate was made
    int32_t merged     # BPE: symbol id of the merge result


cdef struct Heap:
    Candidate *item
    size_t n
    size_t cap


cdef int heap_push(Heap *h, Candidate c) except -1:
    cdef size_t i, parent
    if array_grow(<void **>&h.item, &h.cap, h.n + 1, sizeof(Candidate)):
        raise MemoryError()
    i = h.n
    h.n += 1
    while i > 0:
        parent = (i - 1) // 2
        if h.item[parent].key <= c.key:
            break
        h.item[i] = h.item[parent]
        i = parent
    h.item[i] = c
    return 0


cdef Candidate heap_pop(Heap *h) noexcept:
    cdef Candidate top = h.item[0]
    cdef Candidate last
    cdef size_t i = 0, child
    h.n -= 1
    if h.n == 0:
        return top
    last = h.item[h.n]
    while True:
        child = 2 * i + 1
        if child >= h.n:
            break
        if child + 1 < h.n and h.item[child + 1].key < h.item[child].key:
            child += 1
        if h.item[child].key >= last.key:
            break
        h.item[i] = h.item[child]
        i = child
    h.item[i] = last
    return top


cdef inline uint64_t score_priority(float score, int32_t left):
    """Order by score descending, then left ascending, as SPM's comparator does."""
    cdef uint32_t u
    if score == 0.0:
        score = 0.0    # -0.0 ties with 0.0
    memcpy(&u, &score, 4)
    u = ~u if u & 0x80000000u else u | 0x80000000u
    return (<uint64_t>(~u) << 32) | <uint32_t>left


# symbols of one merge run: a linked list over byte ranges of the text
cdef struct Symbols:
    int64_t *start
    int32_t *length    # 0 once merged into its left neighbour
    int32_t *prev
    int32_t *next
    int32_t *sym       # BPE: symbol id (-1: cannot merge)
    int32_t n
    int32_t cap


cdef int symbols_reserve(Symbols *s, int32_t need) except -1:
    cdef int32_t cap
    if need <= s.cap:
        return 0
    cap = max(need, 2 * s.cap, 64)
    s.start = <int64_t *>realloc(s.start, cap * sizeof(int64_t))
    s.length = <int32_t *>realloc(s.length, cap * sizeof(int32_t))
    s.prev = <int32_t *>realloc(s.prev, cap * sizeof(int32_t))
    s.next = <int32_t *>realloc(s.next, cap * sizeof(int32_t))
    s.sym = <int32_t *>realloc(s.sym, cap * sizeof(int32_t))
    if not (s.start and s.length and s.prev and s.next and s.sym):
        raise MemoryError()
    s.cap = cap
    return 0


cdef void symbols_free(Symbols *s) noexcept:
    free(s.start)
    free(s.length)
    free(s.prev)
    free(s.next)
    free(s.sym)


cdef int symbols_split(Symbols *s, const uint8_t *text, int64_t n, bint by_byte) except -1:
    """One symbol per byte, or per UTF-8 sequence (lead-byte length, cut at the end)."""
    cdef int64_t off = 0
    cdef int64_t k
    cdef int32_t i = 0
    symbols_reserve(s, <int32_t>n)
    while off < n:
        k = 1 if by_byte else min(<int64_t>utf8_seq_len(text[off]), n - off)
        s.start[i] = off
        s.length[i] = <int32_t>k
        s.prev[i] = i - 1
        off += k
        s.next[i] = i + 1 if off < n else -1
        i += 1
    s.n = i
    return 0


cdef inline void symbols_merge(Symbols *s, int32_t left, int32_t right) noexcept:
    s.length[left] += s.length[right]
    s.length[right] = 0
    s.next[left] = s.next[right]
    if s.next[right] >= 0:
        s.prev[s.next[right]] = left


# ---------------------------------------------------------------------------------------------
# special-token partitioning (llama.cpp's tokenizer_st_partition)

cdef inline bint c_isspace(uint8_t c) noexcept:
    return c == 0x20 or (0x09 <= c <= 0x0D)


cdef class Fragments:
    """Text split into raw pieces and special tokens: (token or -1, byte offset, byte length)."""

    cdef int32_t *tok
    cdef int64_t *off
    cdef int64_t *len
    cdef readonly Py_ssize_t n
    cdef Py_ssize_t cap

    cdef int push(self, int32_t tok, int64_t off, int64_t length) except -1:
        cdef Py_ssize_t cap
        if self.n == self.cap:
            cap = self.cap * 2 if self.cap else 16
            self.tok = <int32_t *>realloc(self.tok, cap * sizeof(int32_t))
            self.off = <int64_t *>realloc(self.off, cap * sizeof(int64_t))
            self.len = <int64_t *>realloc(self.len, cap * sizeof(int64_t))
            if not (self.tok and self.off and self.len):
                raise MemoryError()
            self.cap = cap
        self.tok[self.n] = tok
        self.off[self.n] = off
        self.len[self.n] = length
        self.n += 1
        return 0

    def __dealloc__(self):
        free(self.tok)
        free(self.off)
        free(self.len)

    def __len__(self):
        return self.n

    def __getitem__(self, Py_ssize_t i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return (self.tok[i], self.off[i], self.len[i])


cdef int cmp_u64(const void *a, const void *b) noexcept nogil:
    cdef uint64_t x = (<const uint64_t *>a)[0]
    cdef uint64_t y = (<const uint64_t *>b)[0]
    return (x > y) - (x < y)


cdef class ByteTrie:
    """A trie over byte strings: node 0 is the root, each node may hold a value (-1: none)."""

    cdef pairmap_t edges        # (node, byte) -> child node
    cdef int32_t root[256]      # the root's children, looked up most often
    cdef int32_t *value         # [n_nodes]
    cdef size_t n_nodes, cap

    def __cinit__(self, Py_ssize_t expected_bytes):
        cdef int i
        if pairmap_init(&self.edges, expected_bytes) != 0:
            raise MemoryError()
        for i in range(256):
            self.root[i] = -1
        self.n_nodes = 1
        ivec_reserve_raw(&self.value, &self.cap, 1)
        self.value[0] = -1

    def __dealloc__(self):
        pairmap_free(&self.edges)
        free(self.value)

    cdef inline int32_t child(self, int32_t node, uint8_t b) noexcept:
        return self.root[b] if node == 0 else <int32_t>pairmap_get(&self.edges, node, b, -1)

    cdef int32_t insert(self, const uint8_t *p, size_t n) except -1:
        """The node spelling p[0..n), created as needed."""
        cdef int32_t node = 0, nxt
        cdef size_t k
        for k in range(n):
            nxt = self.child(node, p[k])
            if nxt < 0:
                nxt = <int32_t>self.n_nodes
                ivec_reserve_raw(&self.value, &self.cap, self.n_nodes + 1)
                self.value[nxt] = -1
                self.n_nodes += 1
                if node == 0:
                    self.root[p[k]] = nxt
                elif pairmap_put_new(&self.edges, node, p[k], nxt) < 0:
                    raise MemoryError()
            node = nxt
        return node


cdef class SpecialMatcher:
    """Finds special-token texts and splits text around them in llama.cpp's order: token by token
    in the given priority order, each one left to right through the raw fragments left so far,
    trimming white space beside a match for tokens with lstrip/rstrip."""

    cdef ByteTrie trie          # node value: priority index of the token ending there
    cdef int32_t *tok_id        # [n_tok]
    cdef int32_t *tok_len       # [n_tok]
    cdef uint8_t *tok_strip     # [n_tok] bit 0 lstrip, bit 1 rstrip
    cdef int32_t n_tok

    def __cinit__(self, list texts, list ids, list lstrip, list rstrip):
        cdef int32_t node, r
        cdef const uint8_t *p
        self.trie = ByteTrie(sum(len(t) for t in texts) + 1)
        self.n_tok = len(texts)
        self.tok_id = <int32_t *>malloc((self.n_tok + 1) * sizeof(int32_t))
        self.tok_len = <int32_t *>malloc((self.n_tok + 1) * sizeof(int32_t))
        self.tok_strip = <uint8_t *>malloc(self.n_tok + 1)
        if not (self.tok_id and self.tok_len and self.tok_strip):
            raise MemoryError()
        for r in range(self.n_tok):
            text = texts[r]
            p = text
            self.tok_id[r] = ids[r]
            self.tok_len[r] = len(text)
            self.tok_strip[r] = (1 if lstrip[r] else 0) | (2 if rstrip[r] else 0)
            if len(text) == 0:
                continue
            node = self.trie.insert(p, len(text))
            if self.trie.value[node] < 0:   # a duplicate text keeps its first (higher) priority
                self.trie.value[node] = r

    def __dealloc__(self):
        free(self.tok_id)
        free(self.tok_len)
        free(self.tok_strip)

    cdef int find_all(self, const uint8_t *s, int64_t n, IntVec *hits_lo,
                      IntVec *hits_hi) except -1:
        """Every occurrence of every token as (rank << 32 | start), split into two int32 lists."""
        cdef int64_t start, k
        cdef int32_t node
        for start in range(n):
            node = self.trie.root[s[start]]
            k = start + 1
            while node >= 0:
                if self.trie.value[node] >= 0:
                    ivec_push(hits_hi, self.trie.value[node])
                    ivec_push(hits_lo, <int32_t>start)
                if k >= n:
                    break
                node = self.trie.child(node, s[k])
                k += 1
        return 0

    def partition(self, const uint8_t[::1] text) -> Fragments:
        """Split ``text`` (bytes) into raw fragments and special tokens."""
        cdef int64_t n = text.shape[0]
        cdef Fragments cur = Fragments(), nxt
        cdef IntVec lo, hi
        cdef uint64_t *hits = NULL
        cdef size_t n_hits, h, g
        cdef int32_t rank, tlen
        cdef int64_t pos, fend, left, match, right_off, f
        cdef uint8_t strip
        cdef const uint8_t *s
        if n == 0:
            return cur
        s = &text[0]
        cur.push(-1, 0, n)
        lo.data = hi.data = NULL
        lo.n = lo.cap = hi.n = hi.cap = 0
        try:
            self.find_all(s, n, &lo, &hi)
            n_hits = lo.n
            if n_hits == 0:
                return cur
            hits = <uint64_t *>malloc(n_hits * sizeof(uint64_t))
            if hits == NULL:
                raise MemoryError()
            for h in range(n_hits):
                hits[h] = (<uint64_t>hi.data[h] << 32) | <uint32_t>lo.data[h]
            qsort(hits, n_hits, sizeof(uint64_t), cmp_u64)
            g = 0
            while g < n_hits:       # one group of hits per token, in priority order
                rank = <int32_t>(hits[g] >> 32)
                tlen = self.tok_len[rank]
                strip = self.tok_strip[rank]
                nxt = Fragments()
                h = g
                for f in range(cur.n):
                    if cur.tok[f] >= 0:
                        nxt.push(cur.tok[f], cur.off[f], cur.len[f])
                        continue
                    pos = cur.off[f]
                    fend = pos + cur.len[f]
                    while True:
                        while h < n_hits and (hits[h] >> 32) == <uint64_t>rank and \
                                <int64_t>(hits[h] & 0xFFFFFFFFu) < pos:
                            h += 1
                        if h >= n_hits or (hits[h] >> 32) != <uint64_t>rank or \
                                <int64_t>(hits[h] & 0xFFFFFFFFu) + tlen > fend:
                            break
                        left = <int64_t>(hits[h] & 0xFFFFFFFFu)
                        match = left
                        if strip & 1:
                            while left > pos and c_isspace(s[left - 1]):
                                left -= 1
                        if left > pos:
                            nxt.push(-1, pos, left - pos)
                        nxt.push(self.tok_id[rank], match, tlen)
                        right_off = match + tlen
                        if strip & 2:
                            while right_off < fend and c_isspace(s[right_off]):
                                right_off += 1
                        pos = right_off
                        if pos >= fend:
                            break
                    if pos < fend:
                        nxt.push(-1, pos, fend - pos)
                while g < n_hits and (hits[g] >> 32) == <uint64_t>rank:
                    g += 1
                cur = nxt
            return cur
        finally:
            free(lo.data)
            free(hi.data)
            free(hits)


# ---------------------------------------------------------------------------------------------
# vocabulary lookups shared by the engines

cdef class TokenTable:
    """Token text (bytes) -> id."""

    cdef strmap_t map
    cdef readonly int32_t n_tokens

    def __cinit__(self, list texts):
        cdef int inserted
        cdef int32_t i
        cdef const uint8_t *p
        if strmap_init(&self.map, len(texts)) != 0:
            raise MemoryError()
        self.n_tokens = len(texts)
        for i in range(self.n_tokens):
            t = texts[i]
            p = t
            if strmap_insert(&self.map, p, len(t), i, &inserted) == -2:
                raise MemoryError()

    def __dealloc__(self):
        strmap_free(&self.map)

    @property
    def n_distinct(self) -> int:
        """How many different texts the table holds (fewer than n_tokens: duplicates)."""
        return self.map.n

    def get(self, const uint8_t[::1] text, default=None):
        cdef int32_t v
        if text.shape[0] == 0:
            return default
        v = strmap_get(&self.map, &text[0], text.shape[0], -1)
        return default if v < 0 else v

    cdef inline int32_t lookup(self, const uint8_t *p, size_t n) noexcept:
        return strmap_get(&self.map, p, n, -1)


# ---------------------------------------------------------------------------------------------
# the engines share one fragment loop: special-token fragments pass through as they are

cdef class Engine:
    cdef int encode_piece(self, bytes piece, bint after_special, IntVec *out) except -1:
        raise NotImplementedError

    def encode(self, const uint8_t[::1] text, Fragments frags) -> list:
        """Token ids of ``text`` split into ``frags`` (SpecialMatcher.partition)."""
        cdef IntVec out
        cdef Py_ssize_t f
        cdef bint after_special = True
        out.data = NULL
        out.n = out.cap = 0
        try:
            for f in range(frags.n):
                if frags.tok[f] >= 0:
                    ivec_push(&out, frags.tok[f])
                    after_special = True
                else:
                    self.encode_piece(bytes(text[frags.off[f]:frags.off[f] + frags.len[f]]),
                                      after_special, &out)
                    after_special = False
            return ivec_list(&out)
        finally:
            free(out.data)


# ---------------------------------------------------------------------------------------------

cdef class MergeEngine(Engine):
    """The merge loop SPM and BPE share: symbols over a text, candidate pairs in a heap, the best
    valid pair merged and its new neighbours offered, until no candidate is left. Symbols that
    end up as no token fall back to per-byte tokens."""

    cdef Symbols sy
    cdef Heap heap
    cdef const uint8_t *text        # the text the symbols index while a merge runs
    cdef int32_t n_tokens
    cdef int32_t fallback[256][2]   # token ids a leftover byte becomes (-1: none)
    cdef bint strict_bytes          # a byte without a token is an error (SPM) or vanishes (BPE)

    def __dealloc__(self):
        symbols_free(&self.sy)
        free(self.heap.item)

    cdef void set_fallback(self, list fallback):
        for i in range(256):
            ids = fallback[i]
            self.fallback[i][0] = ids[0] if len(ids) > 0 else -1
            self.fallback[i][1] = ids[1] if len(ids) > 1 else -1

    cdef int try_pair(self, int32_t left, int32_t right) except -1:
        raise NotImplementedError

    cdef int merge(self, const uint8_t *text, IntVec *out) except -1:
        """Run the merges over self.sy (split and given symbol ids) and emit the tokens."""
        cdef int32_t i, left, right, s
        cdef int64_t j
        cdef Candidate c
        self.text = text
        self.heap.n = 0
        for i in range(1, self.sy.n):
            self.try_pair(i - 1, i)
        while self.heap.n:
            c = heap_pop(&self.heap)
            left = <int32_t>(c.key & 0xFFFFFFFFu)
            right = c.right
            if self.sy.length[left] == 0 or self.sy.length[right] == 0 or \
                    self.sy.length[left] + self.sy.length[right] != c.size:
                continue    # stale: one side has merged since
            symbols_merge(&self.sy, left, right)
            self.sy.sym[left] = c.merged
            self.try_pair(self.sy.prev[left], left)
            self.try_pair(left, self.sy.next[left])
        i = 0 if self.sy.n else -1
        while i >= 0:
            s = self.sy.sym[i]
            if 0 <= s < self.n_tokens:
                ivec_push(out, s)
            else:
                for j in range(self.sy.start[i], self.sy.start[i] + self.sy.length[i]):
                    if self.fallback[text[j]][0] >= 0:
                        ivec_push(out, self.fallback[text[j]][0])
                    elif self.strict_bytes:
                        raise ValueError(f"the vocabulary has no token for byte {text[j]:#04x}")
                    if self.fallback[text[j]][1] >= 0:
                        ivec_push(out, self.fallback[text[j]][1])
            i = self.sy.next[i]
        return 0


# ---------------------------------------------------------------------------------------------
# SPM (llm_tokenizer_spm_session): merge the adjacent pair whose concatenation is the
# highest-scoring token, leftmost first, until none is left; leftovers become byte tokens

cdef class SpmEngine(MergeEngine):
    cdef TokenTable table
    cdef float *score           # [n_tokens]
    cdef bint add_space_prefix

    def __cinit__(self, TokenTable table, scores, list byte_tokens, bint add_space_prefix):
        cdef const float[::1] sc = np.ascontiguousarray(scores, dtype=np.float32)
        cdef int i
        self.table = table
        self.n_tokens = table.n_tokens
        self.score = <float *>malloc(max(1, sc.shape[0]) * sizeof(float))
        if self.score == NULL:
            raise MemoryError()
        for i in range(sc.shape[0]):
            self.score[i] = sc[i]
        self.set_fallback([[t] if t >= 0 else [] for t in byte_tokens])
        self.strict_bytes = True
        self.add_space_prefix = add_space_prefix

    def __dealloc__(self):
        free(self.score)

    cdef int try_pair(self, int32_t left, int32_t right) except -1:
        cdef Candidate c
        cdef int32_t tok
        if left < 0 or right < 0:
            return 0
        c.size = self.sy.length[left] + self.sy.length[right]
        tok = self.table.lookup(self.text + self.sy.start[left], c.size)
        if tok < 0:
            return 0
        c.key = score_priority(self.score[tok], left)
        c.right = right
        c.merged = tok
        heap_push(&self.heap, c)
        return 0

    cdef int encode_text(self, const uint8_t *text, int64_t n, IntVec *out) except -1:
        cdef int32_t i
        symbols_split(&self.sy, text, n, False)
        for i in range(self.sy.n):
            self.sy.sym[i] = self.table.lookup(text + self.sy.start[i], self.sy.length[i])
        return self.merge(text, out)

    cdef int encode_piece(self, bytes piece, bint after_special, IntVec *out) except -1:
        """Spaces escaped as U+2581, one prefixed at the start and after a special token when
        add_space_prefix (llama.cpp's rule)."""
        if self.add_space_prefix and after_special:
            piece = b" " + piece
        piece = piece.replace(b" ", ESCAPED_SPACE)
        return self.encode_text(piece, len(piece), out)


# ---------------------------------------------------------------------------------------------
# BPE (llm_tokenizer_bpe_session): pre-tokenize into words, then per word merge the adjacent pair
# with the lowest merge rank, leftmost first. Words are cached: their tokens depend on nothing else.

cdef int32_t GPT2_BYTE_CPT[256]      # byte -> code point of the GPT-2 byte-to-unicode map
cdef int32_t GPT2_CPT_BYTE[0x144]    # code point -> byte, or -1


cdef void gpt2_tables_init() noexcept:
    cdef int b, n = 0
    for b in range(0x144):
        GPT2_CPT_BYTE[b] = -1
    for b in range(256):
        if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF:
            GPT2_BYTE_CPT[b] = b
        else:
            GPT2_BYTE_CPT[b] = 256 + n
            n += 1
        GPT2_CPT_BYTE[GPT2_BYTE_CPT[b]] = b


gpt2_tables_init()


def gpt2_byte_to_text(uint8_t b) -> bytes:
    """The UTF-8 text that stands for byte ``b`` in byte-level BPE vocabularies."""
    cdef uint8_t enc[4]
    cdef int w = utf8_encode(GPT2_BYTE_CPT[b], enc)
    return (<char *>enc)[:w]


cdef int gpt2_decode(const uint8_t *p, size_t n, ByteVec *out) except -2:
    """Append the raw bytes behind byte-level BPE text; -1 (nothing appended) when a code point
    is outside the byte map."""
    cdef size_t pos = 0, start = out.n
    cdef uint32_t c
    bvec_reserve(out, out.n + n)
    while pos < n:
        c = utf8_next(p, n, &pos)
        if c >= 0x144 or GPT2_CPT_BYTE[c] < 0:
            out.n = start
            return -1
        out.data[out.n] = <uint8_t>GPT2_CPT_BYTE[c]
        out.n += 1
    return 0


def gpt2_text_to_bytes(const uint8_t[::1] text, bint strict):
    """Raw bytes behind a byte-level BPE token text. A code point outside the byte map gives None
    when ``strict``, else llama.cpp's marker ``[UNK_BYTE_0x<utf8 hex><text>]`` in its place."""
    cdef size_t pos = 0, n = text.shape[0]
    cdef uint32_t c
    cdef uint8_t enc[4]
    cdef int w
    out = bytearray()
    while pos < n:
        c = utf8_next(&text[0], n, &pos)
        if c < 0x144 and GPT2_CPT_BYTE[c] >= 0:
            out.append(GPT2_CPT_BYTE[c])
        elif strict:
            return None
        else:
            w = utf8_encode(c, enc)
            out += b"[UNK_BYTE_0x" + (<char *>enc)[:w].hex().encode() + bytes(text) + b"]"
    return bytes(out)


cdef class BpeEngine(MergeEngine):
    cdef strmap_t symtab        # symbol text -> symbol id (token id, or >= n_tokens for merge-only)
    cdef pairmap_t merges       # (left symbol, right symbol) -> rank << 32 | merged symbol
    cdef int32_t byte_sym[256]
    cdef bint byte_encode, ignore_merges, whole_newlines, escape_spaces
    cdef list steps
    cdef strmap_t cache         # word -> index into cache_pool of (start, count)
    cdef IntVec cache_pool

    def __cinit__(self, list tokens, list merges, list fallback, list steps, bint byte_encode,
                  bint ignore_merges, bint whole_newlines, bint escape_spaces):
        """tokens: token texts as in the file; merges: merge lines "left right" in rank order;
        fallback: per byte, the token ids a leftover byte becomes. With ``byte_encode`` merges
        work on raw bytes (texts go through the GPT-2 byte map), else on UTF-8 characters."""
        cdef int inserted
        cdef int32_t i, rank
        cdef int32_t ids[3]
        cdef int64_t e, pos, n
        cdef const uint8_t *p
        cdef ByteVec buf
        cdef size_t cut
        cdef uint8_t one
        buf.data = NULL
        buf.n = buf.cap = 0
        if strmap_init(&self.symtab, len(tokens) + 2 * len(merges)) != 0 or \
                pairmap_init(&self.merges, len(merges)) != 0 or strmap_init(&self.cache, 1024) != 0:
            raise MemoryError()
        self.n_tokens = len(tokens)
        try:
            for i in range(self.n_tokens):
                t = tokens[i]
                p = t
                buf.n = 0
                self.intern_text(p, len(t), byte_encode, &buf, i)
            for rank in range(len(merges)):
                line = merges[rank]
                p = line
                n = len(line)
                pos = 1
                while pos < n and p[pos] != 0x20:   # split at the first space after byte 0
                    pos += 1
                if pos + 1 >= n:
                    continue        # no right part: never matches, its rank stays taken
                # left and right back to back in buf (decoded under the byte map)
                buf.n = 0
                if byte_encode:
                    if gpt2_decode(p, pos, &buf):
                        continue
                    cut = buf.n
                    if gpt2_decode(p + pos + 1, n - pos - 1, &buf):
                        continue
                else:
                    bvec_append(&buf, p, pos)
                    cut = buf.n
                    bvec_append(&buf, p + pos + 1, n - pos - 1)
                ids[0] = self.intern(buf.data, cut)
                ids[1] = self.intern(buf.data + cut, buf.n - cut)
                ids[2] = self.intern(buf.data, buf.n)
                if pairmap_put_new(&self.merges, ids[0], ids[1],
                                   (<int64_t>rank << 32) | <uint32_t>ids[2]) < 0:
                    raise MemoryError()
        finally:
            free(buf.data)
        for i in range(256):
            one = i
            self.byte_sym[i] = strmap_get(&self.symtab, &one, 1, -1)
        self.set_fallback(fallback)
        self.steps = steps
        self.byte_encode = byte_encode
        self.ignore_merges = ignore_merges
        self.whole_newlines = whole_newlines
        self.escape_spaces = escape_spaces

    cdef int32_t intern(self, const uint8_t *p, size_t n) except -2:
        """Symbol id of a text, adding merge-only texts with ids from n_tokens up."""
        cdef int inserted
        cdef int64_t e = strmap_insert(&self.symtab, p, n,
                                       <int32_t>(self.n_tokens + self.symtab.n), &inserted)
        if e == -2:
            raise MemoryError()
        return self.symtab.val[e]

    cdef int intern_text(self, const uint8_t *p, size_t n, bint byte_encode, ByteVec *buf,
                         int32_t tok) except -2:
        """Add a token text under its id; -1 when it cannot be a symbol (outside the byte map)."""
        cdef int inserted
        if n == 0:
            return -1
        if byte_encode:
            if gpt2_decode(p, n, buf):
                return -1
            p = buf.data
            n = buf.n
        if strmap_insert(&self.symtab, p, n, tok, &inserted) == -2:
            raise MemoryError()
        return 0

    def __dealloc__(self):
        strmap_free(&self.symtab)
        pairmap_free(&self.merges)
        strmap_free(&self.cache)
        free(self.cache_pool.data)

    cdef int try_pair(self, int32_t left, int32_t right) except -1:
        cdef Candidate c
        cdef int64_t v
        if left < 0 or right < 0 or self.sy.sym[left] < 0 or self.sy.sym[right] < 0:
            return 0
        v = pairmap_get(&self.merges, self.sy.sym[left], self.sy.sym[right], -1)
        if v < 0:
            return 0
        c.key = (<uint64_t>(v >> 32) << 32) | <uint32_t>left
        c.right = right
        c.size = self.sy.length[left] + self.sy.length[right]
        c.merged = <int32_t>(v & 0xFFFFFFFF)
        heap_push(&self.heap, c)
        return 0

    cdef int merge_word(self, const uint8_t *w, int64_t n, IntVec *out) except -1:
        cdef int32_t i, s
        cdef int64_t j
        cdef bint newlines
        s = strmap_get(&self.symtab, w, n, -1)
        if 0 <= s < self.n_tokens:
            newlines = self.whole_newlines
            j = 0
            while newlines and j < n:
                newlines = w[j] == 0x0A
                j += 1
            if self.ignore_merges or newlines:  # the whole word is a token: kept as it is
                ivec_push(out, s)
                return 0
        symbols_split(&self.sy, w, n, self.byte_encode)
        for i in range(self.sy.n):
            if self.byte_encode:
                self.sy.sym[i] = self.byte_sym[w[self.sy.start[i]]]
            else:
                self.sy.sym[i] = strmap_get(&self.symtab, w + self.sy.start[i],
                                            self.sy.length[i], -1)
        return self.merge(w, out)

    cdef int encode_word(self, const uint8_t *w, int64_t n, IntVec *out) except -1:
        cdef int inserted
        cdef int64_t e
        cdef size_t first = out.n, k, slot
        e = strmap_find(&self.cache, w, n)
        if e >= 0:
            slot = <size_t>self.cache.val[e]
            if self.cache_pool.data[slot + 1]:   # an empty word: out.data may still be NULL
                ivec_reserve(out, out.n + self.cache_pool.data[slot + 1])
                memcpy(out.data + out.n, self.cache_pool.data + self.cache_pool.data[slot],
                       self.cache_pool.data[slot + 1] * sizeof(int32_t))
                out.n += self.cache_pool.data[slot + 1]
            return 0
        self.merge_word(w, n, out)
        if self.cache.n > 1 << 20 or self.cache_pool.n > 1 << 24:
            strmap_free(&self.cache)        # keep memory bounded on endless streams
            if strmap_init(&self.cache, 1024) != 0:
                raise MemoryError()
            self.cache_pool.n = 0
        slot = self.cache_pool.n
        ivec_push(&self.cache_pool, <int32_t>(slot + 2))
        ivec_push(&self.cache_pool, <int32_t>(out.n - first))
        for k in range(first, out.n):
            ivec_push(&self.cache_pool, out.data[k])
        if strmap_insert(&self.cache, w, n, <int32_t>slot, &inserted) == -2:
            raise MemoryError()
        return 0

    cdef int encode_text(self, bytes piece, IntVec *out) except -1:
        cdef CodepointText t = CodepointText(piece)
        cdef IntVec words
        cdef int64_t a = 0
        cdef size_t i
        words.data = NULL
        words.n = words.cap = 0
        try:
            run_steps(t, self.steps, &words)
            for i in range(words.n):
                self.encode_word(t.utf8 + t.byte_off[a],
                                 t.byte_off[a + words.data[i]] - t.byte_off[a], out)
                a += words.data[i]
        finally:
            free(words.data)
        return 0

    cdef int encode_piece(self, bytes piece, bint after_special, IntVec *out) except -1:
        if self.escape_spaces:
            piece = piece.replace(b" ", ESCAPED_SPACE)
        return self.encode_text(piece, out)


# ---------------------------------------------------------------------------------------------
# WPM (llm_tokenizer_wpm_session): normalize and split into words, then greedy longest match of
# "\u2581" + word; a word with any unmatched rest becomes the unknown token

cdef inline bint is_chinese_char(uint32_t c) noexcept:
    return (0x4E00 <= c <= 0x9FFF or 0x3400 <= c <= 0x4DBF or 0x20000 <= c <= 0x2A6DF or
            0x2A700 <= c <= 0x2B73F or 0x2B740 <= c <= 0x2B81F or
            0x2B920 <= c <= 0x2CEAF or   # llama.cpp follows HF here (0x2B820 in Unicode)
            0xF900 <= c <= 0xFAFF or 0x2F800 <= c <= 0x2FA1F)


cdef class WpmEngine(Engine):
    cdef TokenTable table
    cdef int32_t unk
    cdef int32_t max_token_len
    cdef bint lowercase, strip_accents

    def __cinit__(self, TokenTable table, int32_t unk, int32_t max_token_len, bint lowercase,
                  bint strip_accents):
        self.table = table
        self.unk = unk
        self.max_token_len = max_token_len
        self.lowercase = lowercase
        self.strip_accents = strip_accents

    def words(self, const uint8_t[::1] text) -> list:
        """The normalized words of ``text`` (BertNormalizer + BertPreTokenizer, llama.cpp's way)."""
        cdef CodepointText t = CodepointText(text)
        cdef int64_t i
        cdef uint32_t c
        cdef uint16_t f
        cdef uint8_t enc[4]
        cdef int w
        words = []
        cur = bytearray()
        for i in range(t.n):
            c = uni_nfd(t.cpt[i]) if self.strip_accents else t.cpt[i]
            f = uni_flags(c)
            if f & UNI_WHITESPACE:
                if cur:
                    words.append(bytes(cur))
                    cur = bytearray()
                continue
            if c == 0 or c == 0xFFFD or (f & UNI_CONTROL):
                continue
            if self.strip_accents and (f & UNI_MARK):
                continue
            w = utf8_encode(uni_tolower(c) if self.lowercase else c, enc)
            if (f & UNI_PUNCTUATION) or (c < 0x7F and (f & UNI_SYMBOL)) or is_chinese_char(c):
                if cur:
                    words.append(bytes(cur))
                words.append((<char *>enc)[:w])
                cur = bytearray()
            else:
                cur += (<char *>enc)[:w]
        if cur:
            words.append(bytes(cur))
        return words

    cdef int encode_word(self, bytes word, IntVec *out) except -1:
        cdef bytes w1 = ESCAPED_SPACE + word
        cdef const uint8_t *p = w1
        cdef int64_t n = len(w1), i = 0, j
        cdef size_t first = out.n
        cdef int32_t tok
        while i < n:
            j = min(n, i + self.max_token_len + 1)
            tok = -1
            while j > i:
                tok = self.table.lookup(p + i, j - i)
                if tok >= 0:
                    break
                j -= 1
            if tok < 0:
                out.n = first       # discard the whole word
                break
            ivec_push(out, tok)
            i = j
        if out.n == first:
            ivec_push(out, self.unk)
        return 0

    cdef int encode_piece(self, bytes piece, bint after_special, IntVec *out) except -1:
        for word in self.words(piece):
            self.encode_word(word, out)
        return 0


# ---------------------------------------------------------------------------------------------
# UGM (llm_tokenizer_ugm_session): normalize (user-defined texts kept, the precompiled charsmap's
# replacements, spaces escaped), then the best-scoring segmentation by Viterbi over byte offsets;
# a code point no token covers alone is the unknown token, runs of those merged into one

cdef extern from *:
    """
    #include <float.h>
    """
    double DBL_MAX
    float FLT_MAX


cdef class UgmEngine(Engine):
    cdef ByteTrie tokens            # value: token id (normal, user-defined and unused tokens)
    cdef ByteTrie user_defined      # user-defined texts, matched as paths (llama.cpp's way)
    cdef double *score              # [n_tokens] user-defined tokens score 0
    cdef double unknown_score
    cdef public int32_t unk         # read when tokenizing, as llama.cpp reads token_unk()
    cdef bytes charsmap             # keeps xcda and replacements alive
    cdef const uint32_t *xcda
    cdef size_t xcda_size
    cdef const uint8_t *replacements
    cdef size_t replacements_size
    cdef bint prepend_space, merge_spaces

    def __cinit__(self, list texts, list load_attrs, list attrs, scores, int32_t unk,
                  bytes charsmap, bint add_space_prefix, bint remove_extra_whitespaces):
        """load_attrs: token attributes when llama.cpp builds the tokenizer (straight from the
        token types); attrs: the final ones, which decide user-defined scores."""
        cdef const float[::1] sc = np.ascontiguousarray(scores, dtype=np.float32)
        cdef float min_score = FLT_MAX
        cdef int32_t i, node
        cdef const uint8_t *p
        cdef uint32_t blob
        n = len(texts)
        self.tokens = ByteTrie(sum(len(t) for t in texts) + 1)
        self.user_defined = ByteTrie(64)
        self.score = <double *>malloc(max(1, n) * sizeof(double))
        if self.score == NULL:
            raise MemoryError()
        for i in range(n):
            t = texts[i]
            p = t
            if load_attrs[i] & 4:       # normal
                min_score = min(min_score, sc[i])
            if load_attrs[i] & (4 | 16 | 2):    # normal, user-defined, unused
                node = self.tokens.insert(p, len(t))
                self.tokens.value[node] = i
            if load_attrs[i] & 16:
                self.user_defined.insert(p, len(t))
            self.score[i] = 0.0 if attrs[i] & 16 else sc[i]
        self.unknown_score = <float>(min_score - <float>10.0)
        self.unk = unk
        self.charsmap = charsmap
        if len(charsmap) >= 4:
            p = charsmap
            memcpy(&blob, p, 4)
            self.xcda = <const uint32_t *>(p + 4)
            self.xcda_size = blob // 4
            self.replacements = p + 4 + blob
            self.replacements_size = len(charsmap) - 4 - blob
        self.prepend_space = add_space_prefix
        self.merge_spaces = remove_extra_whitespaces

    def __dealloc__(self):
        free(self.score)

    cdef uint32_t xcda_node(self, size_t index) except? 0:
        if index >= self.xcda_size:
            raise ValueError("index out of array bounds in the XCDA array of the charsmap")
        return self.xcda[index]

    cdef inline uint32_t xcda_base(self, size_t index) except? 0:
        cdef uint32_t node = self.xcda_node(index)
        return (node >> 10) << ((node & (1u << 9)) >> 6)

    cdef size_t normalize_prefix(self, const uint8_t *s, size_t n, size_t off,
                                 const uint8_t **out, size_t *out_len) except? 0:
        """Normalize the text at s[off]: sets the replacement, returns how many bytes it eats."""
        cdef int32_t node = 0
        cdef size_t k = off, best_len = 0, best_off = 0, r
        cdef uint32_t index, packed
        cdef bint leaf
        # a user-defined token's path through the trie stays as it is
        while k < n:
            node = self.user_defined.child(node, s[k])
            if node < 0:
                break
            k += 1
        if k > off:
            out[0] = s + off
            out_len[0] = k - off
            return k - off
        # longest match in the charsmap's double array
        if self.xcda_size > 0:
            index = self.xcda_base(0)
            for k in range(off, n):
                if s[k] == 0:
                    break
                index ^= s[k]
                packed = self.xcda_node(index)
                if packed & ((1u << 31) | 0xFF) != s[k]:
                    break
                leaf = (packed >> 8) & 1
                index ^= self.xcda_base(index)
                if leaf:
                    best_len = k - off + 1
                    best_off = self.xcda_node(index) & ((1u << 31) - 1)
        if best_len > 0:
            if best_off >= self.replacements_size:
                raise ValueError("index out of array bounds in the charsmap replacements")
            r = 0
            while best_off + r < self.replacements_size and self.replacements[best_off + r] != 0:
                r += 1
            if best_off + r == self.replacements_size:
                raise ValueError("unterminated string in the charsmap replacements")
            out[0] = self.replacements + best_off
            out_len[0] = r
            return best_len
        # one code point as it is, or U+FFFD for one invalid byte
        k = off
        if utf8_next(s, n, &k) == 0xFFFD and k == off + 1:
            out[0] = <const uint8_t *>b"\xef\xbf\xbd"
            out_len[0] = 3
            return 1
        out[0] = s + off
        out_len[0] = k - off
        return k - off

    cdef int normalize(self, const uint8_t *s, size_t n, ByteVec *out) except -1:
        cdef size_t off = 0, i, r_len
        cdef const uint8_t *r
        cdef bint in_word = False, prepended = False
        while off < n:
            off += self.normalize_prefix(s, n, off, &r, &r_len)
            for i in range(r_len):
                if r[i] != 0x20:
                    if not in_word:
                        in_word = True
                        if (self.prepend_space and not prepended) or self.merge_spaces:
                            bvec_append(out, ESCAPED_SPACE, 3)
                            prepended = True
                    bvec_append(out, r + i, 1)
                else:
                    in_word = False
                    if not self.merge_spaces:
                        bvec_append(out, ESCAPED_SPACE, 3)
        return 0

    cdef int encode_piece(self, bytes piece, bint after_special, IntVec *out) except -1:
        cdef ByteVec norm
        cdef size_t n, off, po, units, i, first
        cdef int32_t node, tok
        cdef int32_t *best_tok = NULL
        cdef size_t *best_from = NULL
        cdef double *best = NULL
        cdef double challenger
        cdef bint single, unknown, prev_unknown
        norm.data = NULL
        norm.n = norm.cap = 0
        try:
            self.normalize(piece, len(piece), &norm)
            n = norm.n
            if n == 0:
                return 0
            best_tok = <int32_t *>malloc((n + 1) * sizeof(int32_t))
            best_from = <size_t *>malloc((n + 1) * sizeof(size_t))
            best = <double *>malloc((n + 1) * sizeof(double))
            if not (best_tok and best_from and best):
                raise MemoryError()
            for i in range(n + 1):
                best_tok[i] = self.unk
                best_from[i] = 0
                best[i] = -DBL_MAX
            best[0] = 0.0
            off = 0
            while off < n:
                units = min(utf8_seq_len(norm.data[off]), n - off)
                single = False
                node = self.tokens.child(0, norm.data[off])
                po = off + 1
                while node >= 0:
                    tok = self.tokens.value[node]
                    if tok >= 0:
                        single = single or po - off == units
                        challenger = best[off] + self.score[tok]
                        if challenger > best[po]:
                            best[po] = challenger
                            best_tok[po] = tok
                            best_from[po] = off
                    if po >= n:
                        break
                    node = self.tokens.child(node, norm.data[po])
                    po += 1
                if not single:
                    challenger = best[off] + self.unknown_score
                    if challenger > best[off + units]:
                        best[off + units] = challenger
                        best_tok[off + units] = self.unk
                        best_from[off + units] = off
                off += units
            # walk back from the end; consecutive unknown tokens become one
            first = out.n
            po = n
            prev_unknown = False
            while True:
                unknown = best_tok[po] == self.unk
                if not (prev_unknown and unknown):
                    ivec_push(out, best_tok[po])
                if best_from[po] == 0:
                    break
                prev_unknown = unknown
                po = best_from[po]
            i = first
            off = out.n - 1
            while i < off:
                out.data[i], out.data[off] = out.data[off], out.data[i]
                i += 1
                off -= 1
            return 0
        finally:
            free(norm.data)
            free(best_tok)
            free(best_from)
            free(best)


# ---------------------------------------------------------------------------------------------

def stdmap_order(list keys) -> list:
    """Indices of ``keys`` (distinct bytes) in the order a libstdc++ std::unordered_map<std::string,
    ...> filled with them in list order iterates them."""
    cdef Py_ssize_t n = len(keys), i
    cdef uint64_t *hashes = <uint64_t *>malloc(max(n, 1) * sizeof(uint64_t))
    cdef int32_t *order = <int32_t *>malloc(max(n, 1) * sizeof(int32_t))
    cdef const uint8_t *p
    try:
        if hashes == NULL or order == NULL:
            raise MemoryError()
        for i in range(n):
            k = keys[i]
            p = k
            hashes[i] = stdhash_bytes(p, len(k))
        if stdmap_iteration_order(hashes, n, order) != 0:
            raise MemoryError()
        return [order[i] for i in range(n)]
    finally:
        free(hashes)
        free(order)


cdef class RwkvEngine(Engine):
    """llama.cpp's ``llm_tokenizer_rwkv_session``: from each position the longest token that the
    text continues with (its trie walk), one byte as the unknown token where none does."""

    cdef strmap_t map
    cdef public int32_t unk
    cdef int32_t max_len

    def __cinit__(self, list texts, int32_t unk):
        """``texts``: the tokens' unescaped bytes by id; a text given twice means the later id
        (the trie's insert overwrites); empty ones match nothing."""
        cdef int inserted
        cdef int64_t e
        cdef int32_t i
        cdef const uint8_t *p
        if strmap_init(&self.map, len(texts)) != 0:
            raise MemoryError()
        self.unk = unk
        self.max_len = 0
        for i in range(len(texts)):
            t = texts[i]
            if not t:
                continue
            p = t
            e = strmap_insert(&self.map, p, len(t), i, &inserted)
            if e == -2:
                raise MemoryError()
            self.map.val[e] = i
            self.max_len = max(self.max_len, <int32_t>len(t))

    def __dealloc__(self):
        strmap_free(&self.map)

    cdef int encode_piece(self, bytes piece, bint after_special, IntVec *out) except -1:
        cdef const uint8_t *s = piece
        cdef int64_t n = len(piece), pos = 0, length
        cdef int32_t tok
        while pos < n:
            length = min(<int64_t>self.max_len, n - pos)
            tok = -1
            while length > 0:
                tok = strmap_get(&self.map, s + pos, length, -1)
                if tok >= 0:
                    break
                length -= 1
            if tok < 0:
                # llama.cpp pushes its unknown token (none: -1) for a byte no token starts with;
                # a byte that starts only longer tokens would make its loop restart (never in a
                # vocabulary with every byte): here it is unknown too
                ivec_push(out, self.unk)
                pos += 1
            else:
                ivec_push(out, tok)
                pos += length
        return 0
