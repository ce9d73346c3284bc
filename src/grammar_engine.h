/* The grammar matcher behind gguflm._ext.grammar: llama.cpp's pushdown stacks (src/llama-grammar.cpp),
 * hash-consed so that every stack and every set of stacks has a small integer id, and a token trie
 * walked against a set of stacks to mask a whole vocabulary at once.
 *
 * Semantics are llama.cpp's, step for step:
 *   - a stack is a list of element positions; its top is a terminal (char class or token) or it is
 *     empty (the grammar may end); advance() expands rule references as llama_grammar_advance_stack;
 *   - a token's piece is decoded as llama.cpp's decode_utf8 (continuations of the grammar's partial
 *     character are validated, later continuation bytes are not; a NUL ends the piece; an invalid
 *     lead byte rejects the token; a code point 0 ends the grammar check early);
 *   - a token is accepted when some path through the stacks consumes all its complete code points
 *     (a token-top stack accepts by id as soon as a code point is left), and its unfinished last
 *     character, if any, can still match (llama_grammar_match_partial_char);
 *   - accepting a token moves the stacks as llama_grammar_accept_token.
 *
 * Ids: stack 0 is the empty stack, set 0 is the empty set, token condition list 0 is empty. Stacks
 * are (top position, parent id) pairs; sets are sorted id lists in one pool. Everything is memoised:
 * advance(stack), next(stack) (pop the matched terminal, push what follows, advance), the step of a
 * set over a code point, and whole-vocabulary masks per (set, partial character).
 *
 * Bounds (a hostile grammar gets an error code, never a hang or unbounded memory): stacks in all,
 * stacks per set, work per advance() and work per mask.
 *
 * No function here takes the GIL; the caller serialises calls on one engine.
 */
#ifndef GGUFLM_GRAMMAR_ENGINE_H
#define GGUFLM_GRAMMAR_ENGINE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum {
    GT_END = 0, GT_ALT = 1, GT_REF = 2, GT_CHAR = 3, GT_CHAR_NOT = 4, GT_RNG = 5,
    GT_CHAR_ALT = 6, GT_ANY = 7, GT_TOKEN = 8, GT_TOKEN_NOT = 9,
};

enum {
    GE_OK = 0,
    GE_NOMEM = -1,
    GE_TOO_MANY_STACKS = -2,   /* more than GE_MAX_STACKS distinct stacks */
    GE_TOO_AMBIGUOUS = -3,     /* a set or an expansion larger than the bounds */
    GE_EMPTY = -4,             /* accepting the token leaves no stack */
    GE_TOO_MUCH_WORK = -5,     /* a mask would take more than GE_MAX_MASK_WORK steps */
};

#define GE_MAX_STACKS      (1 << 23)
#define GE_MAX_SET         4096
#define GE_MAX_ADVANCE     (1 << 20)
#define GE_MAX_MASK_WORK   ((int64_t)1 << 28)
#define GE_MASK_CACHE_BYTES ((int64_t)96 << 20)

/* ------------------------------------------------------------------------------------------- */
/* the token trie: pieces in sorted order, nodes in preorder                                    */

typedef struct {
    int32_t n_nodes;        /* node 0 is the root (no byte) */
    int32_t max_depth;
    uint8_t *byte;          /* [n_nodes] edge label of the node */
    uint16_t *depth;        /* [n_nodes] */
    int32_t *skip;          /* [n_nodes] first node after the subtree */
    int32_t *tok_lo;        /* [n_nodes] tokens ending at the node: order[tok_lo .. tok_hi) */
    int32_t *tok_hi;
    int32_t n_order;
    int32_t *order;         /* token ids by sorted piece */
} gtrie;

static void gtrie_free(gtrie *t) {
    free(t->byte); free(t->depth); free(t->skip); free(t->tok_lo); free(t->tok_hi); free(t->order);
    memset(t, 0, sizeof *t);
}

/* Build from pieces already sorted bytewise: piece k of length len[k] at data + off[k], token
 * order[k] (copied). Returns GE_OK or GE_NOMEM. */
static int gtrie_build(gtrie *t, const uint8_t *data, const int64_t *off, const int32_t *len,
                       const int32_t *order, int32_t n) {
    memset(t, 0, sizeof *t);
    int64_t cap = 1;
    for (int32_t k = 0; k < n; k++) cap += len[k];
    int32_t maxlen = 0;
    for (int32_t k = 0; k < n; k++) if (len[k] > maxlen) maxlen = len[k];
    if (cap > INT32_MAX || maxlen > 65535) return GE_NOMEM;
    t->byte = malloc(cap); t->depth = malloc(cap * sizeof(uint16_t));
    t->skip = malloc(cap * sizeof(int32_t)); t->tok_lo = malloc(cap * sizeof(int32_t));
    t->tok_hi = malloc(cap * sizeof(int32_t)); t->order = malloc((n ? n : 1) * sizeof(int32_t));
    int32_t *path = malloc((maxlen + 1) * sizeof(int32_t));  /* node at each depth of the path */
    if (!t->byte || !t->depth || !t->skip || !t->tok_lo || !t->tok_hi || !t->order || !path) {
        free(path); gtrie_free(t); return GE_NOMEM;
    }
    memcpy(t->order, order, n * sizeof(int32_t));
    t->n_order = n;
    int32_t nodes = 1;
    t->byte[0] = 0; t->depth[0] = 0; t->tok_lo[0] = t->tok_hi[0] = 0;
    path[0] = 0;
    int32_t path_len = 0;           /* depth of the deepest node on the current path */
    const uint8_t *prev = NULL;
    int32_t prev_len = 0;
    for (int32_t k = 0; k < n; k++) {
        const uint8_t *p = data + off[k];
        int32_t l = len[k];
        int32_t common = 0;         /* shared prefix with the previous piece */
        if (prev) {
            int32_t m = l < prev_len ? l : prev_len;
            while (common < m && p[common] == prev[common]) common++;
        }
        /* close the nodes below the shared prefix */
        for (int32_t d = path_len; d > common; d--) t->skip[path[d]] = nodes;
        path_len = common;
        for (int32_t d = common; d < l; d++) {
            int32_t node = nodes++;
            t->byte[node] = p[d];
            t->depth[node] = (uint16_t)(d + 1);
            t->tok_lo[node] = t->tok_hi[node] = k;
            path[d + 1] = node;
        }
        if (common == l) {
            t->tok_hi[path[l]] = k + 1;       /* the same piece again */
        } else {
            t->tok_lo[path[l]] = k;           /* a new end node (a prefix sorts first) */
            t->tok_hi[path[l]] = k + 1;
        }
        path_len = l;
        if (l > t->max_depth) t->max_depth = l;
        prev = p; prev_len = l;
    }
    for (int32_t d = path_len; d >= 1; d--) t->skip[path[d]] = nodes;
    t->skip[0] = nodes;
    t->n_nodes = nodes;
    free(path);
    return GE_OK;
}

/* ------------------------------------------------------------------------------------------- */
/* the engine                                                                                   */

typedef struct {
    uint32_t value;     /* bits of the unfinished character so far */
    int32_t remain;     /* bytes still expected; -1: an invalid sequence was seen */
} gpartial;

typedef struct {
    int32_t set;        /* stacks after the complete code points so far */
    int32_t frozen;     /* after a code point 0: the stacks the check stopped at; else -1 */
    int32_t pend;       /* token conditions that accept by id (token-top stacks passed) */
    uint32_t value;
    int32_t remain;
    int32_t phase;      /* 0 while continuing the grammar's unfinished character */
} gstate;

typedef struct { int64_t key; int32_t a, b; int32_t val; } gslot4;   /* generic memo slot */

typedef struct {
    /* grammar */
    int32_t n_elem, n_rules;
    int32_t *rule_start;     /* [n_rules] position of each rule's first element */
    uint8_t *type;
    uint32_t *value;
    int32_t *after;          /* [n_elem] for a terminal: the position after it */
    uint64_t *ascii;         /* [2 * n_elem] for a char-class start: its ASCII matches */
    /* stacks */
    int32_t n_stk, cap_stk;
    int32_t *stk_pos, *stk_parent, *stk_adv, *stk_next;
    uint32_t *stk_seen;
    uint32_t seen_gen;
    int64_t *stk_hash; int64_t stk_hash_cap;      /* slots hold id + 1, 0 = free */
    /* sets */
    int32_t n_set, cap_set;
    int64_t *set_off; int32_t *set_len;
    int32_t *set_tokcond;     /* pend id of the token-top stacks, -1 = not computed */
    uint8_t *set_has_empty;
    int32_t *pool; int64_t pool_len, pool_cap;
    int32_t *set_hash; int64_t set_hash_cap;      /* slots hold id + 1 */
    /* token condition lists: (type << 32 | value) sorted, hash-consed like sets */
    int32_t n_pend, cap_pend;
    int64_t *pend_off; int32_t *pend_len;
    uint64_t *pend_pool; int64_t pend_pool_len, pend_pool_cap;
    int32_t *pend_hash; int64_t pend_hash_cap;
    /* memo of set steps: (set, matched-stack mask) -> set, and of pend unions */
    int64_t *step_key_set; uint64_t *step_key_mask; int32_t *step_val; int64_t step_cap, step_n;
    int64_t *pu_key; int32_t *pu_val; int64_t pu_cap, pu_n;
    /* scratch */
    int32_t *scratch; int64_t scratch_cap;
    int32_t *todo; int64_t todo_cap;
    /* vocabulary */
    const gtrie *trie;
    int32_t n_vocab;
    const uint8_t *eog;       /* [n_vocab] 1 = end-of-generation token */
    const uint8_t *in_trie;   /* [n_vocab] 1 = has a non-empty piece and is not EOG */
    /* mask cache: (set, partial) -> bitset of n_vocab bits */
    int64_t *mc_key; uint64_t **mc_bits; int64_t mc_cap, mc_n, mc_limit, mc_clock;
    int64_t work;             /* steps of the mask in progress */
    int64_t n_mask_computed, n_mask_cached;
} gengine;

static uint64_t ge_mix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
    return x;
}

static int ge_is_eos(const gengine *e, int32_t pos) {
    return e->type[pos] == GT_END || e->type[pos] == GT_ALT;
}

static int ge_grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return GE_OK;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return GE_NOMEM;
    *p = q; *cap = c;
    return GE_OK;
}

/* llama_grammar_match_char: does code point c satisfy the class starting at pos? */
static int ge_match_char(const gengine *e, int32_t pos, uint32_t c) {
    if (c < 128) return (int)((e->ascii[2 * pos + (c >> 6)] >> (c & 63)) & 1);
    int positive = e->type[pos] == GT_CHAR || e->type[pos] == GT_ANY;
    int found = 0;
    do {
        if (e->type[pos + 1] == GT_RNG) {
            found = found || (e->value[pos] <= c && c <= e->value[pos + 1]);
            pos += 2;
        } else if (e->type[pos] == GT_ANY) {
            found = 1;
            pos += 1;
        } else {
            found = found || e->value[pos] == c;
            pos += 1;
        }
    } while (e->type[pos] == GT_CHAR_ALT);
    return found == positive;
}

static int32_t ge_class_end(const gengine *e, int32_t pos) {
    do {
        pos += e->type[pos + 1] == GT_RNG ? 2 : 1;
    } while (e->type[pos] == GT_CHAR_ALT);
    return pos;
}

/* llama_grammar_match_partial_char */
static int ge_match_partial(const gengine *e, int32_t pos, uint32_t value, int32_t remain) {
    int positive = e->type[pos] == GT_CHAR || e->type[pos] == GT_ANY;
    if (remain < 0 || (remain == 1 && value < 2)) return 0;
    uint32_t low = value << (remain * 6);
    uint32_t high = low | ((1u << (remain * 6)) - 1);
    if (low == 0) {
        if (remain == 2) low = 1u << 11;
        else if (remain == 3) low = 1u << 16;
    }
    do {
        if (e->type[pos + 1] == GT_RNG) {
            if (e->value[pos] <= high && low <= e->value[pos + 1]) return positive;
            pos += 2;
        } else if (e->type[pos] == GT_ANY) {
            return 1;
        } else {
            if (low <= e->value[pos] && e->value[pos] <= high) return positive;
            pos += 1;
        }
    } while (e->type[pos] == GT_CHAR_ALT);
    return !positive;
}

static int ge_is_token(const gengine *e, int32_t pos) {
    return e->type[pos] == GT_TOKEN || e->type[pos] == GT_TOKEN_NOT;
}

/* -- stacks --------------------------------------------------------------------------------- */

static int ge_stk_rehash(gengine *e, int64_t cap) {
    int64_t *h = calloc((size_t)cap, sizeof(int64_t));
    if (!h) return GE_NOMEM;
    for (int32_t id = 1; id < e->n_stk; id++) {
        uint64_t key = ((uint64_t)(uint32_t)e->stk_pos[id] << 32) | (uint32_t)e->stk_parent[id];
        int64_t i = (int64_t)(ge_mix(key) & (uint64_t)(cap - 1));
        while (h[i]) i = (i + 1) & (cap - 1);
        h[i] = id + 1;
    }
    free(e->stk_hash);
    e->stk_hash = h; e->stk_hash_cap = cap;
    return GE_OK;
}

/* The stack `parent` with `pos` pushed on top; returns its id or an error (< 0). */
static int32_t ge_push(gengine *e, int32_t parent, int32_t pos) {
    uint64_t key = ((uint64_t)(uint32_t)pos << 32) | (uint32_t)parent;
    int64_t mask = e->stk_hash_cap - 1;
    int64_t i = (int64_t)(ge_mix(key) & (uint64_t)mask);
    while (e->stk_hash[i]) {
        int32_t id = (int32_t)(e->stk_hash[i] - 1);
        if (e->stk_pos[id] == pos && e->stk_parent[id] == parent) return id;
        i = (i + 1) & mask;
    }
    if (e->n_stk >= GE_MAX_STACKS) return GE_TOO_MANY_STACKS;
    if (e->n_stk >= e->cap_stk) {
        int64_t cap = e->cap_stk;
        int64_t c1 = cap, c2 = cap, c3 = cap, c4 = cap, c5 = cap;
        if (ge_grow((void **)&e->stk_pos, &c1, cap * 2, sizeof(int32_t)) ||
            ge_grow((void **)&e->stk_parent, &c2, cap * 2, sizeof(int32_t)) ||
            ge_grow((void **)&e->stk_adv, &c3, cap * 2, sizeof(int32_t)) ||
            ge_grow((void **)&e->stk_next, &c4, cap * 2, sizeof(int32_t)) ||
            ge_grow((void **)&e->stk_seen, &c5, cap * 2, sizeof(uint32_t))) return GE_NOMEM;
        e->cap_stk = (int32_t)(cap * 2);
    }
    int32_t id = e->n_stk++;
    e->stk_pos[id] = pos; e->stk_parent[id] = parent;
    e->stk_adv[id] = -1; e->stk_next[id] = -1; e->stk_seen[id] = 0;
    e->stk_hash[i] = id + 1;
    if ((int64_t)e->n_stk * 2 > e->stk_hash_cap) {
        if (ge_stk_rehash(e, e->stk_hash_cap * 2)) return GE_NOMEM;
    }
    return id;
}

/* -- token condition lists (pend) ----------------------------------------------------------- */

static uint64_t ge_hash_u64s(const uint64_t *v, int32_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)n;
    for (int32_t i = 0; i < n; i++) h = ge_mix(h ^ v[i]) + 0x632be59bd9b4e019ULL;
    return h;
}

static int ge_pend_rehash(gengine *e, int64_t cap) {
    int32_t *h = calloc((size_t)cap, sizeof(int32_t));
    if (!h) return GE_NOMEM;
    for (int32_t id = 0; id < e->n_pend; id++) {
        int64_t i = (int64_t)(ge_hash_u64s(e->pend_pool + e->pend_off[id], e->pend_len[id]) & (uint64_t)(cap - 1));
        while (h[i]) i = (i + 1) & (cap - 1);
        h[i] = id + 1;
    }
    free(e->pend_hash);
    e->pend_hash = h; e->pend_hash_cap = cap;
    return GE_OK;
}

/* id of the sorted, distinct condition list v[0..n) */
static int32_t ge_pend_intern(gengine *e, const uint64_t *v, int32_t n) {
    int64_t mask = e->pend_hash_cap - 1;
    int64_t i = (int64_t)(ge_hash_u64s(v, n) & (uint64_t)mask);
    while (e->pend_hash[i]) {
        int32_t id = e->pend_hash[i] - 1;
        /* the empty list's pointers may be NULL, which memcmp/memcpy may not get even for 0 bytes */
        if (e->pend_len[id] == n && (n == 0 || memcmp(e->pend_pool + e->pend_off[id], v, n * sizeof(uint64_t)) == 0)) return id;
        i = (i + 1) & mask;
    }
    if (e->n_pend >= e->cap_pend) {
        int64_t c1 = e->cap_pend, c2 = e->cap_pend;
        if (ge_grow((void **)&e->pend_off, &c1, e->cap_pend * 2, sizeof(int64_t)) ||
            ge_grow((void **)&e->pend_len, &c2, e->cap_pend * 2, sizeof(int32_t))) return GE_NOMEM;
        e->cap_pend *= 2;
    }
    if (ge_grow((void **)&e->pend_pool, &e->pend_pool_cap, e->pend_pool_len + n, sizeof(uint64_t))) return GE_NOMEM;
    int32_t id = e->n_pend++;
    e->pend_off[id] = e->pend_pool_len; e->pend_len[id] = n;
    if (n) memcpy(e->pend_pool + e->pend_pool_len, v, n * sizeof(uint64_t));
    e->pend_pool_len += n;
    e->pend_hash[i] = id + 1;
    if ((int64_t)e->n_pend * 2 > e->pend_hash_cap && ge_pend_rehash(e, e->pend_hash_cap * 2)) return GE_NOMEM;
    return id;
}

static int ge_u64_cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int32_t ge_pend_union(gengine *e, int32_t a, int32_t b) {
    if (a == 0 || a == b) return b;
    if (b == 0) return a;
    if (a > b) { int32_t t = a; a = b; b = t; }
    int64_t key = ((int64_t)a << 32) | (uint32_t)b;
    int64_t mask = e->pu_cap - 1;
    int64_t i = (int64_t)(ge_mix((uint64_t)key) & (uint64_t)mask);
    while (e->pu_key[i] != -1) {
        if (e->pu_key[i] == key) return e->pu_val[i];
        i = (i + 1) & mask;
    }
    int32_t na = e->pend_len[a], nb = e->pend_len[b];
    uint64_t *v = malloc((size_t)(na + nb) * sizeof(uint64_t));
    if (!v) return GE_NOMEM;
    memcpy(v, e->pend_pool + e->pend_off[a], na * sizeof(uint64_t));
    memcpy(v + na, e->pend_pool + e->pend_off[b], nb * sizeof(uint64_t));
    qsort(v, na + nb, sizeof(uint64_t), ge_u64_cmp);
    int32_t n = 0;
    for (int32_t k = 0; k < na + nb; k++) if (n == 0 || v[n - 1] != v[k]) v[n++] = v[k];
    int32_t id = ge_pend_intern(e, v, n);
    free(v);
    if (id < 0) return id;
    if (e->pu_n * 2 >= e->pu_cap) return id;   /* full: stop memoising */
    e->pu_key[i] = key; e->pu_val[i] = id; e->pu_n++;
    return id;
}

static int ge_pend_match(const gengine *e, int32_t pend, int32_t token) {
    const uint64_t *v = e->pend_pool + e->pend_off[pend];
    for (int32_t k = 0; k < e->pend_len[pend]; k++) {
        uint32_t type = (uint32_t)(v[k] >> 32), value = (uint32_t)v[k];
        if (type == GT_TOKEN ? value == (uint32_t)token : value != (uint32_t)token) return 1;
    }
    return 0;
}

/* -- sets ------------------------------------------------------------------------------------- */

static uint64_t ge_hash_ids(const int32_t *v, int32_t n) {
    uint64_t h = 0x84222325cbf29ce4ULL ^ (uint64_t)n;
    for (int32_t i = 0; i < n; i++) h = ge_mix(h ^ (uint32_t)v[i]) + 0x9e3779b97f4a7c15ULL;
    return h;
}

static int ge_set_rehash(gengine *e, int64_t cap) {
    int32_t *h = calloc((size_t)cap, sizeof(int32_t));
    if (!h) return GE_NOMEM;
    for (int32_t id = 0; id < e->n_set; id++) {
        int64_t i = (int64_t)(ge_hash_ids(e->pool + e->set_off[id], e->set_len[id]) & (uint64_t)(cap - 1));
        while (h[i]) i = (i + 1) & (cap - 1);
        h[i] = id + 1;
    }
    free(e->set_hash);
    e->set_hash = h; e->set_hash_cap = cap;
    return GE_OK;
}

static void ge_sort_ids(int32_t *v, int32_t n) {
    for (int32_t i = 1; i < n; i++) {   /* sets are small and mostly sorted already */
        int32_t x = v[i], j = i - 1;
        while (j >= 0 && v[j] > x) { v[j + 1] = v[j]; j--; }
        v[j + 1] = x;
    }
}

/* id of the set of stack ids v[0..n) (sorted and deduplicated in place) */
static int32_t ge_set_intern(gengine *e, int32_t *v, int32_t n) {
    ge_sort_ids(v, n);
    int32_t m = 0;
    for (int32_t k = 0; k < n; k++) if (m == 0 || v[m - 1] != v[k]) v[m++] = v[k];
    n = m;
    if (n > GE_MAX_SET) return GE_TOO_AMBIGUOUS;
    int64_t mask = e->set_hash_cap - 1;
    int64_t i = (int64_t)(ge_hash_ids(v, n) & (uint64_t)mask);
    while (e->set_hash[i]) {
        int32_t id = e->set_hash[i] - 1;
        /* the empty set's pointers may be NULL, which memcmp/memcpy may not get even for 0 bytes */
        if (e->set_len[id] == n && (n == 0 || memcmp(e->pool + e->set_off[id], v, n * sizeof(int32_t)) == 0)) return id;
        i = (i + 1) & mask;
    }
    if (e->n_set >= e->cap_set) {
        int64_t c1 = e->cap_set, c2 = e->cap_set, c3 = e->cap_set, c4 = e->cap_set;
        if (ge_grow((void **)&e->set_off, &c1, e->cap_set * 2, sizeof(int64_t)) ||
            ge_grow((void **)&e->set_len, &c2, e->cap_set * 2, sizeof(int32_t)) ||
            ge_grow((void **)&e->set_tokcond, &c3, e->cap_set * 2, sizeof(int32_t)) ||
            ge_grow((void **)&e->set_has_empty, &c4, e->cap_set * 2, sizeof(uint8_t))) return GE_NOMEM;
        e->cap_set *= 2;
    }
    if (ge_grow((void **)&e->pool, &e->pool_cap, e->pool_len + n, sizeof(int32_t))) return GE_NOMEM;
    int32_t id = e->n_set++;
    e->set_off[id] = e->pool_len; e->set_len[id] = n;
    if (n) memcpy(e->pool + e->pool_len, v, n * sizeof(int32_t));
    e->pool_len += n;
    e->set_tokcond[id] = -1;
    e->set_has_empty[id] = (uint8_t)(n > 0 && v[0] == 0);
    e->set_hash[i] = id + 1;
    if ((int64_t)e->n_set * 2 > e->set_hash_cap && ge_set_rehash(e, e->set_hash_cap * 2)) return GE_NOMEM;
    return id;
}

static int ge_scratch(gengine *e, int64_t need) {
    return ge_grow((void **)&e->scratch, &e->scratch_cap, need, sizeof(int32_t));
}

/* -- advance ----------------------------------------------------------------------------------- */

static int ge_todo_push(gengine *e, int64_t *n, int32_t v) {
    if (ge_grow((void **)&e->todo, &e->todo_cap, *n + 1, sizeof(int32_t))) return GE_NOMEM;
    e->todo[(*n)++] = v;
    return GE_OK;
}

/* llama_grammar_advance_stack(stack) as a set id: every stack reachable by expanding rule
 * references at the top, down to a terminal or the empty stack (memoised per stack). */
static int32_t ge_advance(gengine *e, int32_t sid) {
    if (sid > 0 && e->stk_adv[sid] >= 0) return e->stk_adv[sid];
    uint32_t gen = ++e->seen_gen;
    if (gen == 0) {   /* wrapped: clear the marks */
        memset(e->stk_seen, 0, (size_t)e->n_stk * sizeof(uint32_t));
        gen = ++e->seen_gen;
    }
    int64_t n_todo = 0, n_out = 0, work = 0;
    int have_empty = 0;
    if (ge_todo_push(e, &n_todo, sid)) return GE_NOMEM;
    while (n_todo > 0) {
        int32_t cur = e->todo[--n_todo];
        if (cur == 0) {
            if (!have_empty) {
                have_empty = 1;
                if (ge_scratch(e, n_out + 1)) return GE_NOMEM;
                e->scratch[n_out++] = 0;
            }
            continue;
        }
        if (e->stk_seen[cur] == gen) continue;
        e->stk_seen[cur] = gen;
        if (++work > GE_MAX_ADVANCE) return GE_TOO_AMBIGUOUS;
        int32_t pos = e->stk_pos[cur];
        if (e->type[pos] != GT_REF) {
            if (ge_scratch(e, n_out + 1)) return GE_NOMEM;
            e->scratch[n_out++] = cur;
            if (n_out > GE_MAX_SET) return GE_TOO_AMBIGUOUS;
            continue;
        }
        /* replace the reference by each alternative of its rule, the rest of the sequence under it */
        int32_t base = e->stk_parent[cur];
        if (!ge_is_eos(e, pos + 1)) {
            base = ge_push(e, base, pos + 1);
            if (base < 0) return base;
        }
        int32_t sub = e->rule_start[e->value[pos]];
        for (;;) {
            int32_t next = base;
            if (!ge_is_eos(e, sub)) {
                next = ge_push(e, base, sub);
                if (next < 0) return next;
            }
            if (ge_todo_push(e, &n_todo, next)) return GE_NOMEM;
            while (!ge_is_eos(e, sub)) sub++;
            if (e->type[sub] != GT_ALT) break;
            sub++;
        }
    }
    int32_t r = ge_set_intern(e, e->scratch, (int32_t)n_out);
    if (r >= 0 && sid > 0) e->stk_adv[sid] = r;
    return r;
}

/* next(stack): the terminal on top matched; pop it, push what follows it, advance */
static int32_t ge_next(gengine *e, int32_t sid) {
    if (e->stk_next[sid] >= 0) return e->stk_next[sid];
    int32_t pos = e->stk_pos[sid];
    int32_t after = e->after[pos];
    int32_t base = e->stk_parent[sid];
    if (!ge_is_eos(e, after)) {
        base = ge_push(e, base, after);
        if (base < 0) return base;
    }
    int32_t r = ge_advance(e, base);
    if (r >= 0) e->stk_next[sid] = r;
    return r;
}

/* union of the sets ids[0..n) */
static int32_t ge_union(gengine *e, const int32_t *ids, int32_t n) {
    if (n == 0) return 0;
    if (n == 1) return ids[0];
    int64_t total = 0;
    for (int32_t k = 0; k < n; k++) total += e->set_len[ids[k]];
    if (total > 8 * (int64_t)GE_MAX_SET) return GE_TOO_AMBIGUOUS;
    int32_t *v = malloc((size_t)(total ? total : 1) * sizeof(int32_t));
    if (!v) return GE_NOMEM;
    int64_t m = 0;
    for (int32_t k = 0; k < n; k++) {
        memcpy(v + m, e->pool + e->set_off[ids[k]], (size_t)e->set_len[ids[k]] * sizeof(int32_t));
        m += e->set_len[ids[k]];
    }
    int32_t r = ge_set_intern(e, v, (int32_t)m);
    free(v);
    return r;
}

/* the token conditions of a set's token-top stacks */
static int32_t ge_tokcond(gengine *e, int32_t set) {
    if (e->set_tokcond[set] >= 0) return e->set_tokcond[set];
    int32_t n = e->set_len[set];
    uint64_t *v = malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
    if (!v) return GE_NOMEM;
    int32_t m = 0;
    for (int32_t k = 0; k < n; k++) {
        int32_t sid = e->pool[e->set_off[set] + k];
        if (sid > 0 && ge_is_token(e, e->stk_pos[sid])) {
            int32_t pos = e->stk_pos[sid];
            v[m++] = ((uint64_t)e->type[pos] << 32) | e->value[pos];
        }
    }
    qsort(v, m, sizeof(uint64_t), ge_u64_cmp);
    int32_t d = 0;
    for (int32_t k = 0; k < m; k++) if (d == 0 || v[d - 1] != v[k]) v[d++] = v[k];
    int32_t r = ge_pend_intern(e, v, d);
    free(v);
    if (r >= 0) e->set_tokcond[set] = r;
    return r;
}

/* the stacks after code point c (c != 0) from the char-top stacks of `set` */
static int32_t ge_step(gengine *e, int32_t set, uint32_t c) {
    int32_t n = e->set_len[set];
    const int32_t *ids = e->pool + e->set_off[set];
    if (n == 1) {
        int32_t sid = ids[0];
        if (sid == 0 || ge_is_token(e, e->stk_pos[sid]) || !ge_match_char(e, e->stk_pos[sid], c)) return 0;
        return ge_next(e, sid);
    }
    e->work += n;
    if (n <= 64) {
        uint64_t matched = 0;
        int32_t first = -1, count = 0;
        for (int32_t k = 0; k < n; k++) {
            int32_t sid = ids[k];
            if (sid > 0 && !ge_is_token(e, e->stk_pos[sid]) && ge_match_char(e, e->stk_pos[sid], c)) {
                matched |= 1ULL << k;
                if (first < 0) first = sid;
                count++;
            }
        }
        if (count == 0) return 0;
        if (count == 1) return ge_next(e, first);
        int64_t mask = e->step_cap - 1;
        int64_t i = (int64_t)(ge_mix(((uint64_t)set << 20) ^ ge_mix(matched)) & (uint64_t)mask);
        while (e->step_key_set[i] != -1) {
            if (e->step_key_set[i] == set && e->step_key_mask[i] == matched) return e->step_val[i];
            i = (i + 1) & mask;
        }
        int32_t parts[64];
        int32_t np = 0;
        for (int32_t k = 0; k < n; k++) {
            if (matched >> k & 1) {   /* ge_next may grow the pool: read ids afresh */
                int32_t r = ge_next(e, e->pool[e->set_off[set] + k]);
                if (r < 0) return r;
                parts[np++] = r;
            }
        }
        int32_t r = ge_union(e, parts, np);
        if (r < 0) return r;
        /* the union may have grown the step table's neighbours: search the slot again */
        if (e->step_n * 2 < e->step_cap) {
            i = (int64_t)(ge_mix(((uint64_t)set << 20) ^ ge_mix(matched)) & (uint64_t)mask);
            while (e->step_key_set[i] != -1) i = (i + 1) & mask;
            e->step_key_set[i] = set; e->step_key_mask[i] = matched; e->step_val[i] = r;
            e->step_n++;
        }
        return r;
    }
    int32_t *parts = malloc((size_t)n * sizeof(int32_t));
    if (!parts) return GE_NOMEM;
    int32_t np = 0;
    for (int32_t k = 0; k < n; k++) {
        int32_t sid = e->pool[e->set_off[set] + k];
        if (sid > 0 && !ge_is_token(e, e->stk_pos[sid]) && ge_match_char(e, e->stk_pos[sid], c)) {
            int32_t r = ge_next(e, sid);
            if (r < 0) { free(parts); return r; }
            parts[np++] = r;
        }
    }
    int32_t r = ge_union(e, parts, np);
    free(parts);
    return r;
}

/* -- the state machine over a piece's bytes --------------------------------------------------- */

static const int8_t GE_UTF8_REMAIN[16] = {0, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1, 1, 1, 2, 3};

static gstate ge_start(int32_t set, gpartial p) {
    gstate s;
    s.set = set; s.frozen = -1; s.pend = 0;
    s.value = p.value;
    s.remain = p.remain > 0 ? p.remain : 0;
    s.phase = p.remain > 0 ? 0 : 1;
    return s;
}

/* a state no token below it can be accepted from */
static int ge_dead(const gstate *s) {
    return s->set == 0 && s->frozen < 0 && s->pend == 0;
}

/* one byte of a piece; returns 1 when the token (and every token sharing this prefix) is rejected
 * by the decoder, -k (k > 0) for an engine error k, else 0 */
static int ge_feed(gengine *e, const gstate *s, uint8_t b, gstate *t) {
    *t = *s;
    int complete = 0;
    if (s->phase == 0) {
        if ((b >> 6) != 2) return 1;                 /* not a continuation: invalid */
        t->value = (s->value << 6) + (b & 0x3F);
        t->remain = s->remain - 1;
        if (t->remain == 0) { t->phase = 1; complete = 1; }
    } else if (s->remain == 0) {
        int n = GE_UTF8_REMAIN[b >> 4];
        if (n < 0) return 1;                         /* a continuation byte cannot start one */
        t->value = b & ((1u << (7 - n)) - 1);
        t->remain = n;
        complete = n == 0;
    } else {
        t->value = (s->value << 6) + (b & 0x3F);     /* not validated, as llama.cpp */
        t->remain = s->remain - 1;
        complete = t->remain == 0;
    }
    if (!complete || t->frozen >= 0) return 0;
    uint32_t c = t->value;
    if (c == 0) {                                    /* llama.cpp's terminator: the check stops */
        t->frozen = s->set;
        t->set = 0;
        return 0;
    }
    if (s->set == 0) return 0;
    int32_t tc = ge_tokcond(e, s->set);
    if (tc < 0) return -1 + tc;
    if (tc > 0) {
        int32_t p = ge_pend_union(e, s->pend, tc);
        if (p < 0) return -1 + p;
        t->pend = p;
    }
    int32_t x = ge_step(e, s->set, c);
    if (x < 0) return -1 + x;
    t->set = x;
    return 0;
}

/* whether a token that ends in state s (not rejected by the decoder) is accepted, apart from its id */
static int ge_end_ok(const gengine *e, const gstate *s) {
    int32_t set = s->frozen >= 0 ? s->frozen : s->set;
    if (set == 0) return 0;
    if (s->remain == 0) return 1;
    const int32_t *ids = e->pool + e->set_off[set];
    for (int32_t k = 0; k < e->set_len[set]; k++) {
        int32_t sid = ids[k];
        if (sid > 0 && !ge_is_token(e, e->stk_pos[sid]) &&
            ge_match_partial(e, e->stk_pos[sid], s->value, s->remain)) return 1;
    }
    return 0;
}

/* the pieces the grammar sees stop at a NUL byte */
static int32_t ge_piece_len(const uint8_t *piece, int32_t len) {
    const uint8_t *z = memchr(piece, 0, (size_t)len);
    return z ? (int32_t)(z - piece) : len;
}

/* Is one token accepted in (set, partial)? 1/0, or an error (< 0). llama_grammar_apply_impl for a
 * single candidate. */
static int ge_check_token(gengine *e, int32_t set, gpartial p, int32_t token, const uint8_t *piece,
                          int32_t len) {
    if (e->eog && token >= 0 && token < e->n_vocab && e->eog[token]) return e->set_has_empty[set];
    len = ge_piece_len(piece, len);
    if (len == 0) return 0;
    gstate s = ge_start(set, p), t;
    for (int32_t i = 0; i < len; i++) {
        int r = ge_feed(e, &s, piece[i], &t);
        if (r == 1) return 0;
        if (r < 0) return r + 1;
        s = t;
        if (ge_dead(&s)) return 0;
    }
    return ge_end_ok(e, &s) || (s.pend && ge_pend_match(e, s.pend, token));
}

/* -- accepting a token ------------------------------------------------------------------------ */

/* llama.cpp's decode_utf8(piece, partial): code points (0-terminated list semantics: a code point
 * 0 is kept, the caller stops before the final terminator) and the partial state after */
static int32_t ge_decode(const uint8_t *piece, int32_t len, gpartial start, uint32_t *out, gpartial *end) {
    int32_t n = 0, i = 0;
    uint32_t value = start.value;
    int32_t remain = start.remain;
    while (i < len && piece[i] != 0 && remain > 0) {
        uint8_t b = piece[i];
        if ((b >> 6) != 2) { end->value = 0; end->remain = -1; return 0; }
        value = (value << 6) + (b & 0x3F);
        i++; remain--;
    }
    if (start.remain > 0 && remain == 0) out[n++] = value;
    while (i < len && piece[i] != 0) {
        uint8_t b = piece[i];
        remain = GE_UTF8_REMAIN[b >> 4];
        if (remain < 0) { end->value = 0; end->remain = remain; return 0; }
        value = b & ((1u << (7 - remain)) - 1);
        i++;
        while (i < len && piece[i] != 0 && remain > 0) {
            value = (value << 6) + (piece[i] & 0x3F);
            i++; remain--;
        }
        if (remain == 0) out[n++] = value;
    }
    end->value = value; end->remain = remain;
    return n;
}

/* llama_grammar_accept_token: the set after `token` with `piece` (stacks and partial character).
 * Token-top stacks move by the token's id; char-top stacks through every code point of the piece
 * (a code point 0 included, as llama.cpp feeds it to llama_grammar_match_char). Returns the new set
 * id, GE_EMPTY when no stack survives, or another error. */
static int32_t ge_accept(gengine *e, int32_t set, gpartial p, int32_t token, const uint8_t *piece,
                         int32_t len, gpartial *p_out) {
    uint32_t *cps = malloc((size_t)(len + 1) * sizeof(uint32_t));
    int32_t n = e->set_len[set];
    int32_t *parts = malloc((size_t)(n + 1) * sizeof(int32_t));
    int32_t *chars = malloc((size_t)(n + 1) * sizeof(int32_t));
    if (!cps || !parts || !chars) { free(cps); free(parts); free(chars); return GE_NOMEM; }
    int32_t n_cp = ge_decode(piece, len, p, cps, p_out);
    int32_t np = 0, nc = 0, r = 0;
    for (int32_t k = 0; k < n && r >= 0; k++) {
        int32_t sid = e->pool[e->set_off[set] + k];
        if (sid == 0) continue;
        int32_t pos = e->stk_pos[sid];
        if (!ge_is_token(e, pos)) {
            chars[nc++] = sid;
        } else if (e->type[pos] == GT_TOKEN ? e->value[pos] == (uint32_t)token
                                            : e->value[pos] != (uint32_t)token) {
            r = ge_next(e, sid);
            if (r >= 0) parts[np++] = r;
        }
    }
    if (r >= 0 && nc > 0) {
        int32_t cur = ge_set_intern(e, chars, nc);
        for (int32_t i = 0; i < n_cp && cur > 0; i++) cur = ge_step(e, cur, cps[i]);
        if (cur < 0) r = cur;
        else if (cur > 0) parts[np++] = cur;
    }
    free(cps); free(chars);
    if (r >= 0) r = ge_union(e, parts, np);
    free(parts);
    if (r < 0) return r;
    if (r == 0) return GE_EMPTY;
    return r;
}

/* -- whole-vocabulary masks ------------------------------------------------------------------- */

/* the mask of (set, partial) into bits (n_vocab bits, bit t = token t accepted) */
static int ge_mask_compute(gengine *e, int32_t set, gpartial p, uint64_t *bits) {
    const gtrie *t = e->trie;
    int64_t words = ((int64_t)e->n_vocab + 63) / 64;
    memset(bits, 0, (size_t)words * sizeof(uint64_t));
    /* end-of-generation tokens: allowed when a stack is empty */
    if (e->set_has_empty[set]) {
        for (int32_t tok = 0; tok < e->n_vocab; tok++) if (e->eog[tok]) bits[tok >> 6] |= 1ULL << (tok & 63);
    }
    gstate *st = malloc((size_t)(t->max_depth + 1) * sizeof(gstate));
    if (!st) return GE_NOMEM;
    st[0] = ge_start(set, p);
    e->work = 0;
    int32_t n = 1;
    while (n < t->n_nodes) {
        int32_t d = t->depth[n];
        int r = ge_feed(e, &st[d - 1], t->byte[n], &st[d]);
        if (r < 0) { free(st); return r + 1; }
        if (r == 1 || ge_dead(&st[d])) { n = t->skip[n]; continue; }
        if (++e->work > GE_MAX_MASK_WORK) { free(st); return GE_TOO_MUCH_WORK; }
        int32_t lo = t->tok_lo[n], hi = t->tok_hi[n];
        if (lo < hi) {
            int ok = ge_end_ok(e, &st[d]);
            for (int32_t k = lo; k < hi; k++) {
                int32_t tok = t->order[k];
                if (ok || (st[d].pend && ge_pend_match(e, st[d].pend, tok))) bits[tok >> 6] |= 1ULL << (tok & 63);
            }
        }
        n++;
    }
    free(st);
    return GE_OK;
}

static int64_t ge_mc_key(int32_t set, gpartial p) {
    int32_t remain = p.remain > 0 ? p.remain : 0;
    uint32_t value = p.remain > 0 ? p.value : 0;
    return ((int64_t)set << 26) ^ ((int64_t)value << 2) ^ remain;
}

/* the cached mask of (set, partial), computing it on a miss; NULL with *err set on failure */
static const uint64_t *ge_mask(gengine *e, int32_t set, gpartial p, int *err) {
    int64_t key = ge_mc_key(set, p);
    int64_t mask = e->mc_cap - 1;
    int64_t i = (int64_t)(ge_mix((uint64_t)key) & (uint64_t)mask);
    while (e->mc_key[i] != -1) {
        if (e->mc_key[i] == key) { e->n_mask_cached++; return e->mc_bits[i]; }
        i = (i + 1) & mask;
    }
    int64_t words = ((int64_t)e->n_vocab + 63) / 64;
    if (e->mc_n >= e->mc_limit) {   /* full: forget every mask (a new state space, most likely) */
        for (int64_t k = 0; k < e->mc_cap; k++) {
            if (e->mc_key[k] != -1) { free(e->mc_bits[k]); e->mc_bits[k] = NULL; e->mc_key[k] = -1; }
        }
        e->mc_n = 0;
        i = (int64_t)(ge_mix((uint64_t)key) & (uint64_t)mask);
    }
    uint64_t *bits = malloc((size_t)words * sizeof(uint64_t));
    if (!bits) { *err = GE_NOMEM; return NULL; }
    int r = ge_mask_compute(e, set, p, bits);
    if (r) { free(bits); *err = r; return NULL; }
    e->n_mask_computed++;
    e->mc_key[i] = key; e->mc_bits[i] = bits; e->mc_n++;
    return bits;
}

/* -- lifetime --------------------------------------------------------------------------------- */

static void ge_free(gengine *e) {
    free(e->rule_start); free(e->type); free(e->value); free(e->after); free(e->ascii);
    free(e->stk_pos); free(e->stk_parent); free(e->stk_adv); free(e->stk_next); free(e->stk_seen);
    free(e->stk_hash);
    free(e->set_off); free(e->set_len); free(e->set_tokcond); free(e->set_has_empty); free(e->pool);
    free(e->set_hash);
    free(e->pend_off); free(e->pend_len); free(e->pend_pool); free(e->pend_hash);
    free(e->step_key_set); free(e->step_key_mask); free(e->step_val);
    free(e->pu_key); free(e->pu_val);
    free(e->scratch); free(e->todo);
    if (e->mc_bits) {
        for (int64_t k = 0; k < e->mc_cap; k++) free(e->mc_bits[k]);
    }
    free(e->mc_key); free(e->mc_bits);
    memset(e, 0, sizeof *e);
}

/* Set up an engine over a grammar (elements type/value, rules starting at rule_start) and,
 * optionally, a vocabulary (trie, eog flags; may be NULL for matching text only). */
static int ge_init(gengine *e, const uint8_t *type, const uint32_t *value, int32_t n_elem,
                   const int32_t *rule_start, int32_t n_rules, const gtrie *trie, int32_t n_vocab,
                   const uint8_t *eog) {
    memset(e, 0, sizeof *e);
    e->n_elem = n_elem; e->n_rules = n_rules;
    e->type = malloc((size_t)n_elem + 2); e->value = malloc(((size_t)n_elem + 2) * sizeof(uint32_t));
    e->after = malloc(((size_t)n_elem + 2) * sizeof(int32_t));
    e->ascii = calloc(2 * ((size_t)n_elem + 2), sizeof(uint64_t));
    e->rule_start = malloc(((size_t)n_rules + 1) * sizeof(int32_t));
    e->cap_stk = 1024;
    e->stk_pos = malloc(e->cap_stk * sizeof(int32_t)); e->stk_parent = malloc(e->cap_stk * sizeof(int32_t));
    e->stk_adv = malloc(e->cap_stk * sizeof(int32_t)); e->stk_next = malloc(e->cap_stk * sizeof(int32_t));
    e->stk_seen = calloc(e->cap_stk, sizeof(uint32_t));
    e->stk_hash_cap = 4096; e->stk_hash = calloc(e->stk_hash_cap, sizeof(int64_t));
    e->cap_set = 1024;
    e->set_off = malloc(e->cap_set * sizeof(int64_t)); e->set_len = malloc(e->cap_set * sizeof(int32_t));
    e->set_tokcond = malloc(e->cap_set * sizeof(int32_t)); e->set_has_empty = malloc(e->cap_set);
    e->set_hash_cap = 4096; e->set_hash = calloc(e->set_hash_cap, sizeof(int32_t));
    e->cap_pend = 64;
    e->pend_off = malloc(e->cap_pend * sizeof(int64_t)); e->pend_len = malloc(e->cap_pend * sizeof(int32_t));
    e->pend_hash_cap = 256; e->pend_hash = calloc(e->pend_hash_cap, sizeof(int32_t));
    e->step_cap = 1 << 14;
    e->step_key_set = malloc(e->step_cap * sizeof(int64_t)); e->step_key_mask = malloc(e->step_cap * sizeof(uint64_t));
    e->step_val = malloc(e->step_cap * sizeof(int32_t));
    e->pu_cap = 1 << 10;
    e->pu_key = malloc(e->pu_cap * sizeof(int64_t)); e->pu_val = malloc(e->pu_cap * sizeof(int32_t));
    if (!e->type || !e->value || !e->after || !e->ascii || !e->rule_start || !e->stk_pos || !e->stk_parent ||
        !e->stk_adv || !e->stk_next || !e->stk_seen || !e->stk_hash || !e->set_off || !e->set_len ||
        !e->set_tokcond || !e->set_has_empty || !e->set_hash || !e->pend_off || !e->pend_len ||
        !e->pend_hash || !e->step_key_set || !e->step_key_mask || !e->step_val || !e->pu_key || !e->pu_val) {
        ge_free(e);
        return GE_NOMEM;
    }
    memcpy(e->type, type, (size_t)n_elem);
    memcpy(e->value, value, (size_t)n_elem * sizeof(uint32_t));
    e->type[n_elem] = e->type[n_elem + 1] = GT_END;   /* guards for pos + 1 reads */
    e->value[n_elem] = e->value[n_elem + 1] = 0;
    memcpy(e->rule_start, rule_start, (size_t)n_rules * sizeof(int32_t));
    for (int64_t k = 0; k < e->step_cap; k++) e->step_key_set[k] = -1;
    for (int64_t k = 0; k < e->pu_cap; k++) e->pu_key[k] = -1;
    /* terminals: where each ends, and the ASCII code points each class matches */
    for (int32_t pos = 0; pos < n_elem; pos++) {
        uint8_t ty = e->type[pos];
        e->after[pos] = pos + 1;
        if (ty == GT_CHAR || ty == GT_CHAR_NOT || ty == GT_ANY) {
            e->after[pos] = ge_class_end(e, pos);
            uint64_t lo = 0, hi = 0;
            int positive = ty != GT_CHAR_NOT;
            for (uint32_t c = 0; c < 128; c++) {
                int found = 0;
                int32_t q = pos;
                do {
                    if (e->type[q + 1] == GT_RNG) { found = found || (e->value[q] <= c && c <= e->value[q + 1]); q += 2; }
                    else if (e->type[q] == GT_ANY) { found = 1; q += 1; }
                    else { found = found || e->value[q] == c; q += 1; }
                } while (e->type[q] == GT_CHAR_ALT);
                if (found == positive) {
                    if (c < 64) lo |= 1ULL << c; else hi |= 1ULL << (c - 64);
                }
            }
            e->ascii[2 * pos] = lo; e->ascii[2 * pos + 1] = hi;
        }
    }
    /* stack 0 = empty, set 0 = {} , pend 0 = [] */
    e->stk_pos[0] = -1; e->stk_parent[0] = -1; e->stk_adv[0] = -1; e->stk_next[0] = -1;
    e->n_stk = 1;
    if (ge_set_intern(e, NULL, 0) != 0 || ge_pend_intern(e, NULL, 0) != 0) { ge_free(e); return GE_NOMEM; }
    e->set_tokcond[0] = 0;
    /* vocabulary */
    e->trie = trie; e->n_vocab = n_vocab; e->eog = eog;
    e->mc_cap = 1024;
    e->mc_key = malloc(e->mc_cap * sizeof(int64_t)); e->mc_bits = calloc(e->mc_cap, sizeof(uint64_t *));
    if (!e->mc_key || !e->mc_bits) { ge_free(e); return GE_NOMEM; }
    for (int64_t k = 0; k < e->mc_cap; k++) e->mc_key[k] = -1;
    int64_t per_mask = ((int64_t)n_vocab + 63) / 64 * 8;
    e->mc_limit = per_mask ? GE_MASK_CACHE_BYTES / per_mask : 0;
    if (e->mc_limit > e->mc_cap / 2) e->mc_limit = e->mc_cap / 2;
    if (e->mc_limit < 4) e->mc_limit = 4;
    return GE_OK;
}

/* llama_grammar_init_impl's initial stacks: each alternative of the start rule, advanced */
static int32_t ge_initial(gengine *e, int32_t start_rule) {
    int32_t pos = e->rule_start[start_rule];
    int32_t parts[256];
    int32_t *many = NULL, np = 0, cap = 256;
    int32_t *dst = parts;
    for (;;) {
        int32_t sid = 0;
        if (!ge_is_eos(e, pos)) {
            sid = ge_push(e, 0, pos);
            if (sid < 0) { free(many); return sid; }
        }
        int32_t r = ge_advance(e, sid);
        if (r < 0) { free(many); return r; }
        if (np == cap) {
            int32_t *grown = realloc(many, (size_t)cap * 2 * sizeof(int32_t));
            if (!grown) { free(many); return GE_NOMEM; }
            if (!many) memcpy(grown, parts, sizeof parts);
            many = grown; dst = many; cap *= 2;
        }
        dst[np++] = r;
        while (!ge_is_eos(e, pos)) pos++;
        if (e->type[pos] != GT_ALT) break;
        pos++;
    }
    int32_t r = ge_union(e, dst, np);
    free(many);
    return r;
}

#endif
