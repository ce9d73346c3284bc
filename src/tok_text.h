/* Text primitives for the tokenizers: code point classes, llama.cpp's UTF-8 decoding, a string hash
 * map and a pair map, and the iteration order of libstdc++'s std::unordered_map (llama.cpp scans
 * its token map in that order when it looks special tokens up by their text). */
#ifndef GGUFLM_TOK_TEXT_H
#define GGUFLM_TOK_TEXT_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "unicode_tables.h"

/* ---- code point classes (the bits of llama.cpp's unicode_cpt_flags) ---- */

enum {
    UNI_UNDEFINED = 0x0001,
    UNI_NUMBER = 0x0002,
    UNI_LETTER = 0x0004,
    UNI_SEPARATOR = 0x0008,
    UNI_MARK = 0x0010,
    UNI_PUNCTUATION = 0x0020,
    UNI_SYMBOL = 0x0040,
    UNI_CONTROL = 0x0080,
    UNI_WHITESPACE = 0x0100,
    UNI_CATEGORY_MASK = 0x00FF,
};

#define UNI_MAX_CODEPOINT 0x110000u

/* one entry per code point, built once from the range table (2.2 MB, as llama.cpp keeps) */
static uint16_t *uni_flags_table = NULL;

static int uni_init(void) {
    if (uni_flags_table) return 0;
    uint16_t *t = (uint16_t *)malloc(UNI_MAX_CODEPOINT * sizeof(uint16_t));
    if (!t) return -1;
    for (int r = 0; r < UNI_N_FLAG_RANGES; r++) {
        uint32_t end = r + 1 < UNI_N_FLAG_RANGES ? uni_flag_range_start[r + 1] : UNI_MAX_CODEPOINT;
        for (uint32_t c = uni_flag_range_start[r]; c < end; c++) t[c] = uni_flag_range_flag[r];
    }
    for (int i = 0; i < UNI_N_WHITESPACE; i++) t[uni_whitespace[i]] |= UNI_WHITESPACE;
    uni_flags_table = t;
    return 0;
}

/* code points past U+10FFFF (which llama.cpp's decoder can produce) are "undefined" */
static inline uint16_t uni_flags(uint32_t cpt) {
    return cpt < UNI_MAX_CODEPOINT ? uni_flags_table[cpt] : UNI_UNDEFINED;
}

static uint32_t uni_tolower(uint32_t cpt) {
    int lo = 0, hi = UNI_N_LOWERCASE - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (uni_lowercase[mid][0] == cpt) return uni_lowercase[mid][1];
        if (uni_lowercase[mid][0] < cpt) lo = mid + 1; else hi = mid - 1;
    }
    return cpt;
}

/* llama.cpp's one-code-point NFD: the first code point of the canonical decomposition */
static uint32_t uni_nfd(uint32_t cpt) {
    int lo = 0, hi = UNI_N_NFD - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cpt < uni_nfd_ranges[mid][0]) hi = mid - 1;
        else if (cpt > uni_nfd_ranges[mid][1]) lo = mid + 1;
        else return uni_nfd_ranges[mid][2];
    }
    return cpt;
}

/* ---- UTF-8, the way llama.cpp reads and writes it ---- */

/* length of a sequence from its lead byte (continuation bytes count as 1) */
static inline size_t utf8_seq_len(uint8_t lead) {
    static const uint8_t lut[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lut[lead >> 4];
}

/* Decode one code point at s[*pos]; an invalid sequence yields U+FFFD and consumes one byte.
 * Overlong forms and surrogates are accepted, as llama.cpp accepts them. */
static inline uint32_t utf8_next(const uint8_t *s, size_t n, size_t *pos) {
    size_t i = *pos;
    uint8_t b0 = s[i];
    if (!(b0 & 0x80)) { *pos = i + 1; return b0; }
    if (!(b0 & 0x40)) goto invalid;
    if (!(b0 & 0x20)) {
        if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) goto invalid;
        *pos = i + 2;
        return ((uint32_t)(b0 & 0x1F) << 6) | (s[i + 1] & 0x3F);
    }
    if (!(b0 & 0x10)) {
        if (i + 2 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) goto invalid;
        *pos = i + 3;
        return ((uint32_t)(b0 & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    }
    if (!(b0 & 0x08)) {
        if (i + 3 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 ||
            (s[i + 3] & 0xC0) != 0x80) goto invalid;
        *pos = i + 4;
        return ((uint32_t)(b0 & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) |
               ((uint32_t)(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
    }
invalid:
    *pos = i + 1;
    return 0xFFFD;
}

/* Encode; returns the byte count, or 0 for code points past U+10FFFF (llama.cpp throws there). */
static inline int utf8_encode(uint32_t cpt, uint8_t *out) {
    if (cpt <= 0x7F) { out[0] = (uint8_t)cpt; return 1; }
    if (cpt <= 0x7FF) {
        out[0] = 0xC0 | (cpt >> 6); out[1] = 0x80 | (cpt & 0x3F); return 2;
    }
    if (cpt <= 0xFFFF) {
        out[0] = 0xE0 | (cpt >> 12); out[1] = 0x80 | ((cpt >> 6) & 0x3F); out[2] = 0x80 | (cpt & 0x3F);
        return 3;
    }
    if (cpt <= 0x10FFFF) {
        out[0] = 0xF0 | (cpt >> 18); out[1] = 0x80 | ((cpt >> 12) & 0x3F);
        out[2] = 0x80 | ((cpt >> 6) & 0x3F); out[3] = 0x80 | (cpt & 0x3F);
        return 4;
    }
    return 0;
}

/* ---- hashing: libstdc++'s std::hash<std::string> (_Hash_bytes, 64-bit, seed 0xc70f6907) ---- */

static inline uint64_t stdhash_shift_mix(uint64_t v) { return v ^ (v >> 47); }

static uint64_t stdhash_bytes(const uint8_t *p, size_t len) {
    const uint64_t mul = 0xC6A4A7935BD1E995ULL;
    const size_t aligned = len & ~(size_t)7;
    uint64_t h = 0xC70F6907ULL ^ ((uint64_t)len * mul);
    for (size_t i = 0; i < aligned; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h ^= stdhash_shift_mix(w * mul) * mul;
        h *= mul;
    }
    if (len & 7) {
        uint64_t w = 0;
        for (size_t i = len; i-- > aligned;) w = (w << 8) + p[i];
        h ^= w;
        h *= mul;
    }
    h = stdhash_shift_mix(h) * mul;
    return stdhash_shift_mix(h);
}

/* ---- strmap: byte string -> int32, open addressing; keys live in one arena ---- */

typedef struct {
    uint8_t *arena;      /* [arena_len] all keys back to back */
    size_t arena_len, arena_cap;
    uint64_t *hash;      /* [n] per entry */
    uint32_t *off, *len; /* [n] key location in the arena */
    int32_t *val;        /* [n] */
    size_t n, cap;
    int32_t *slot;       /* [n_slot] entry index or -1; n_slot is a power of two */
    size_t n_slot;
} strmap_t;

static void strmap_free(strmap_t *m) {
    free(m->arena); free(m->hash); free(m->off); free(m->len); free(m->val); free(m->slot);
    memset(m, 0, sizeof(*m));
}

static int strmap_reslot(strmap_t *m, size_t n_slot) {
    int32_t *slot = (int32_t *)malloc(n_slot * sizeof(int32_t));
    if (!slot) return -1;
    memset(slot, 0xFF, n_slot * sizeof(int32_t));
    for (size_t e = 0; e < m->n; e++) {
        size_t s = (size_t)m->hash[e] & (n_slot - 1);
        while (slot[s] >= 0) s = (s + 1) & (n_slot - 1);
        slot[s] = (int32_t)e;
    }
    free(m->slot);
    m->slot = slot;
    m->n_slot = n_slot;
    return 0;
}

static int strmap_init(strmap_t *m, size_t expected) {
    memset(m, 0, sizeof(*m));
    size_t n_slot = 16;
    while (n_slot < 2 * expected) n_slot *= 2;
    return strmap_reslot(m, n_slot);
}

/* entry index of the key, or -1 */
static inline int64_t strmap_find_h(const strmap_t *m, const uint8_t *p, size_t len, uint64_t h) {
    size_t s = (size_t)h & (m->n_slot - 1);
    for (;;) {
        int32_t e = m->slot[s];
        if (e < 0) return -1;
        if (m->hash[e] == h && m->len[e] == len && memcmp(m->arena + m->off[e], p, len) == 0) return e;
        s = (s + 1) & (m->n_slot - 1);
    }
}

static inline int64_t strmap_find(const strmap_t *m, const uint8_t *p, size_t len) {
    return strmap_find_h(m, p, len, stdhash_bytes(p, len));
}

/* value of the key, or `missing` */
static inline int32_t strmap_get(const strmap_t *m, const uint8_t *p, size_t len, int32_t missing) {
    int64_t e = strmap_find(m, p, len);
    return e < 0 ? missing : m->val[e];
}

/* Grow *p (of *cap elements of elem bytes) to hold need, doubling; 0 ok, -1 out of memory. */
static int array_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* Insert the key if absent. Returns the entry index (new or existing), -2 when out of memory.
 * *inserted says whether the key was new; an existing entry keeps its value. */
static int64_t strmap_insert(strmap_t *m, const uint8_t *p, size_t len, int32_t value, int *inserted) {
    uint64_t h = stdhash_bytes(p, len);
    int64_t e = strmap_find_h(m, p, len, h);
    *inserted = 0;
    if (e >= 0) return e;
    if (2 * (m->n + 1) > m->n_slot && strmap_reslot(m, m->n_slot * 2)) return -2;
    size_t cap = m->cap;
    if (m->n + 1 > cap) {
        size_t c = cap;
        if (array_grow((void **)&m->hash, &c, m->n + 1, sizeof(uint64_t))) return -2;
        c = cap;
        if (array_grow((void **)&m->off, &c, m->n + 1, sizeof(uint32_t))) return -2;
        c = cap;
        if (array_grow((void **)&m->len, &c, m->n + 1, sizeof(uint32_t))) return -2;
        c = cap;
        if (array_grow((void **)&m->val, &c, m->n + 1, sizeof(int32_t))) return -2;
        m->cap = c;
    }
    if (array_grow((void **)&m->arena, &m->arena_cap, m->arena_len + len + 1, 1)) return -2;
    memcpy(m->arena + m->arena_len, p, len);
    e = (int64_t)m->n++;
    m->hash[e] = h;
    m->off[e] = (uint32_t)m->arena_len;
    m->len[e] = (uint32_t)len;
    m->val[e] = value;
    m->arena_len += len;
    size_t s = (size_t)h & (m->n_slot - 1);
    while (m->slot[s] >= 0) s = (s + 1) & (m->n_slot - 1);
    m->slot[s] = (int32_t)e;
    *inserted = 1;
    return e;
}

/* ---- pairmap: (int32, int32) -> int64, open addressing ---- */

#define PAIRMAP_EMPTY UINT64_MAX

typedef struct {
    uint64_t *key; /* [cap] (left << 32) | right, or PAIRMAP_EMPTY */
    int64_t *val;  /* [cap] */
    size_t n, cap; /* cap is a power of two */
} pairmap_t;

static inline uint64_t pairmap_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

static inline size_t pairmap_slot(uint64_t key, size_t cap) {
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 17) & (cap - 1);
}

static int pairmap_init(pairmap_t *m, size_t expected) {
    size_t cap = 16;
    while (cap < 2 * expected) cap *= 2;
    m->key = (uint64_t *)malloc(cap * sizeof(uint64_t));
    m->val = (int64_t *)malloc(cap * sizeof(int64_t));
    m->n = 0;
    m->cap = cap;
    if (!m->key || !m->val) return -1;
    memset(m->key, 0xFF, cap * sizeof(uint64_t));
    return 0;
}

static void pairmap_free(pairmap_t *m) {
    free(m->key); free(m->val);
    memset(m, 0, sizeof(*m));
}

static inline int64_t pairmap_get(const pairmap_t *m, int32_t a, int32_t b, int64_t missing) {
    uint64_t k = pairmap_key(a, b);
    size_t s = pairmap_slot(k, m->cap);
    for (;;) {
        if (m->key[s] == k) return m->val[s];
        if (m->key[s] == PAIRMAP_EMPTY) return missing;
        s = (s + 1) & (m->cap - 1);
    }
}

/* Insert if absent (the first value for a key wins). Returns 1 inserted, 0 present, -1 no memory. */
static int pairmap_put_new(pairmap_t *m, int32_t a, int32_t b, int64_t value) {
    if (2 * (m->n + 1) > m->cap) {
        pairmap_t g;
        if (pairmap_init(&g, m->cap)) { pairmap_free(&g); return -1; }
        for (size_t i = 0; i < m->cap; i++) {
            if (m->key[i] == PAIRMAP_EMPTY) continue;
            size_t s = pairmap_slot(m->key[i], g.cap);
            while (g.key[s] != PAIRMAP_EMPTY) s = (s + 1) & (g.cap - 1);
            g.key[s] = m->key[i];
            g.val[s] = m->val[i];
        }
        g.n = m->n;
        pairmap_free(m);
        *m = g;
    }
    uint64_t k = pairmap_key(a, b);
    size_t s = pairmap_slot(k, m->cap);
    while (m->key[s] != PAIRMAP_EMPTY) {
        if (m->key[s] == k) return 0;
        s = (s + 1) & (m->cap - 1);
    }
    m->key[s] = k;
    m->val[s] = value;
    m->n++;
    return 1;
}

/* ---- iteration order of libstdc++'s std::unordered_map<std::string, int> ----
 * llama.cpp emplaces every token text, in id order, into a default-constructed unordered_map and
 * later walks it front to back; which token wins a "find the EOT token by its text" search depends
 * on that walk. This replays libstdc++'s _Hashtable: the prime rehash policy (max load factor 1,
 * growth factor 2), insertion at the front of a bucket (or of the whole list when the bucket is
 * empty), and the unique-key rehash that relinks nodes in list order. */

static const uint64_t stdmap_primes[] = {
    2ul, 3ul, 5ul, 7ul, 11ul, 13ul, 17ul, 19ul, 23ul, 29ul, 31ul, 37ul, 41ul, 43ul, 47ul, 53ul,
    59ul, 61ul, 67ul, 71ul, 73ul, 79ul, 83ul, 89ul, 97ul, 103ul, 109ul, 113ul, 127ul, 137ul, 139ul,
    149ul, 157ul, 167ul, 179ul, 193ul, 199ul, 211ul, 227ul, 241ul, 257ul, 277ul, 293ul, 313ul,
    337ul, 359ul, 383ul, 409ul, 439ul, 467ul, 503ul, 541ul, 577ul, 619ul, 661ul, 709ul, 761ul,
    823ul, 887ul, 953ul, 1031ul, 1109ul, 1193ul, 1289ul, 1381ul, 1493ul, 1613ul, 1741ul, 1879ul,
    2029ul, 2179ul, 2357ul, 2549ul, 2753ul, 2971ul, 3209ul, 3469ul, 3739ul, 4027ul, 4349ul, 4703ul,
    5087ul, 5503ul, 5953ul, 6427ul, 6949ul, 7517ul, 8123ul, 8783ul, 9497ul, 10273ul, 11113ul,
    12011ul, 12983ul, 14033ul, 15173ul, 16411ul, 17749ul, 19183ul, 20753ul, 22447ul, 24281ul,
    26267ul, 28411ul, 30727ul, 33223ul, 35933ul, 38873ul, 42043ul, 45481ul, 49201ul, 53201ul,
    57557ul, 62233ul, 67307ul, 72817ul, 78779ul, 85229ul, 92203ul, 99733ul, 107897ul, 116731ul,
    126271ul, 136607ul, 147793ul, 159871ul, 172933ul, 187091ul, 202409ul, 218971ul, 236897ul,
    256279ul, 277261ul, 299951ul, 324503ul, 351061ul, 379787ul, 410857ul, 444487ul, 480881ul,
    520241ul, 562841ul, 608903ul, 658753ul, 712697ul, 771049ul, 834181ul, 902483ul, 976369ul,
    1056323ul, 1142821ul, 1236397ul, 1337629ul, 1447153ul, 1565659ul, 1693859ul, 1832561ul,
    1982627ul, 2144977ul, 2320627ul, 2510653ul, 2716249ul, 2938679ul, 3179303ul, 3439651ul,
    3721303ul, 4026031ul, 4355707ul, 4712381ul, 5098259ul, 5515729ul, 5967347ul, 6456007ul,
    6984629ul, 7556579ul, 8175383ul, 8844859ul, 9569143ul, 10352717ul, 11200489ul, 12117689ul,
    13109983ul, 14183539ul, 15345007ul, 16601593ul, 17961079ul, 19431899ul, 21023161ul,
    22744717ul, 24607243ul, 26622317ul, 28802401ul, 31160981ul, 33712729ul,
};

/* _Prime_rehash_policy::_M_next_bkt: smallest listed prime >= n (a small-n table first) */
static uint64_t stdmap_next_bucket_count(uint64_t n, uint64_t *next_resize) {
    static const uint8_t fast[14] = {2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13};
    if (n < 14) {
        if (n == 0) return 1;
        *next_resize = fast[n];
        return fast[n];
    }
    const size_t n_primes = sizeof(stdmap_primes) / sizeof(stdmap_primes[0]);
    size_t lo = 6, hi = n_primes - 1; /* the last prime is never searched: past it, it is the answer */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (stdmap_primes[mid] < n) lo = mid + 1; else hi = mid;
    }
    *next_resize = lo == n_primes - 1 ? UINT64_MAX : stdmap_primes[lo];
    return stdmap_primes[lo];
}

/* order[0..n) receives the node indices in iteration order after emplacing hashes[0..n) in order
 * (all keys distinct). Returns 0, or -1 when out of memory. */
static int stdmap_iteration_order(const uint64_t *hashes, size_t n, int32_t *order) {
    /* before[b] = node preceding bucket b's first node: -1 for the list head, -2 for an empty bucket */
    int32_t *next = (int32_t *)malloc((n ? n : 1) * sizeof(int32_t));
    int32_t *before = NULL;
    uint64_t n_bkt = 1, next_resize = 0;
    int32_t head = -1;
    if (!next) return -1;
    for (size_t i = 0; i < n; i++) {
        /* _M_need_rehash(n_bkt, n_elt = i, n_ins = 1) */
        if (i + 1 > next_resize) {
            uint64_t min_bkts = i + 1 > (next_resize ? 0 : 11) ? i + 1 : 11;
            if (min_bkts >= n_bkt) {
                uint64_t want = min_bkts + 1 > n_bkt * 2 ? min_bkts + 1 : n_bkt * 2;
                uint64_t new_bkt = stdmap_next_bucket_count(want, &next_resize);
                int32_t *nb = (int32_t *)malloc(new_bkt * sizeof(int32_t));
                if (!nb) { free(next); free(before); return -1; }
                for (uint64_t b = 0; b < new_bkt; b++) nb[b] = -2;
                /* _M_rehash_aux(unique): relink nodes in their current list order */
                int32_t p = head;
                uint64_t bbegin_bkt = 0;
                head = -1;
                while (p >= 0) {
                    int32_t after = next[p];
                    uint64_t b = hashes[p] % new_bkt;
                    if (nb[b] == -2) {
                        next[p] = head;
                        head = p;
                        nb[b] = -1;
                        if (next[p] >= 0) nb[bbegin_bkt] = p;
                        bbegin_bkt = b;
                    } else if (nb[b] == -1) { /* the bucket starts the list */
                        next[p] = head;
                        head = p;
                    } else {
                        next[p] = next[nb[b]];
                        next[nb[b]] = p;
                    }
                    p = after;
                }
                free(before);
                before = nb;
                n_bkt = new_bkt;
            } else {
                next_resize = n_bkt;
            }
        }
        /* _M_insert_bucket_begin */
        uint64_t b = hashes[i] % n_bkt;
        int32_t node = (int32_t)i;
        if (before[b] == -2) {
            next[node] = head;
            head = node;
            if (next[node] >= 0) before[hashes[next[node]] % n_bkt] = node;
            before[b] = -1;
        } else if (before[b] == -1) {
            next[node] = head;
            head = node;
        } else {
            next[node] = next[before[b]];
            next[before[b]] = node;
        }
    }
    size_t k = 0;
    for (int32_t p = head; p >= 0; p = next[p]) order[k++] = p;
    free(next);
    free(before);
    return 0;
}

#endif
