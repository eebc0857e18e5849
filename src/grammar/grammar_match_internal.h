/* grammar_match_internal.h - the matcher's state, shared by grammar_match.c
 * (stacks, steps, rollback) and grammar_mask.c (token masks and their
 * cache). Private to src/grammar/; how stacks and states work is told at the
 * top of grammar_match.c. */
#ifndef KVC_GRAMMAR_MATCH_INTERNAL_H
#define KVC_GRAMMAR_MATCH_INTERNAL_H

#include "grammar_internal.h"

#include <stdlib.h>
#include <string.h>

enum {
    MAX_STACKS = 4096,            /* distinct stacks in one state */
    MAX_DEPTH = 16384,            /* rules expanded inside each other in one closure
                                   * (expand's recursion: a few MB of stack at most) */
    MASK_CACHE = 8,               /* masks remembered per matcher (LRU) */
    MAX_TRANS = 1 << 18,          /* transitions remembered per walk (8 MB of table at
                                   * most; past it they are computed, not kept) */
};

typedef struct gnode {
    int32_t pos;                  /* element to match next (or to continue at) */
    int32_t parent;               /* the node below, -1 at the bottom */
} gnode;

typedef struct gstate {
    int32_t  top_off, n_tops;     /* the stacks' top nodes, sorted: m->tops[top_off, +n_tops) */
    int32_t  node_end;            /* nodes the state uses are below this */
    uint32_t utf8_val;            /* bits of an open UTF-8 character */
    uint8_t  utf8_rem;            /* its continuation bytes still to come */
    uint8_t  utf8_len;            /* its total length */
    bool     complete;            /* an empty stack: the root rule finished */
    bool     done;                /* an end-of-generation token was accepted */
} gstate;

/* An open-addressing table of 64-bit keys to int32 values whose slots carry
 * a stamp: a slot is live when its stamp is the table's, so clearing is O(1). */
typedef struct hslot {
    uint64_t key;
    int32_t  val;
    uint32_t stamp;
} hslot;

typedef struct htab {
    hslot   *s;                   /* (cap) slots, cap a power of two or 0 */
    size_t   cap, used;           /* used: live slots */
    uint32_t now;                 /* the live stamp (never 0 once used) */
} htab;

/* A mask remembered for one state (its content: sorted tops and UTF-8 part). */
typedef struct mcache {
    int32_t  *tops;               /* (n_tops) copy of the state's tops; NULL = empty slot */
    int32_t   n_tops, max_top;    /* max_top: the highest node id (rollback may free it) */
    uint32_t  utf8_val;
    uint8_t   utf8_rem, utf8_len;
    bool      complete;
    uint32_t *mask;               /* kvc_mask_words(n_vocab) words */
    int32_t   count;              /* what kvc_gmatch_mask returned */
    uint64_t  last_use;
} mcache;

struct kvc_gmatch {
    const kvc_grammar *g;
    const kvc_gvocab  *v;
    gnode    *nodes;              /* the arena */
    size_t    n_nodes, cap_nodes;
    uint32_t *seen;               /* (cap_seen) per node: push_stamp of the last state it joined */
    size_t    cap_seen;
    uint32_t  push_stamp;
    htab      cons;               /* (pos, parent) -> node id (hash-consing; may hold stale ids) */
    htab      vis;                /* (rule, continuation) expanded in the current closure */
    int32_t  *tops;               /* the states' top lists, one after another */
    size_t    n_tops, cap_tops;
    gstate   *hist;               /* hist[k]: the state after k steps */
    size_t    n_hist, cap_hist;
    /* the mask walk's memo (cleared per walk) */
    gstate   *ws;                 /* states interned by the walk, by id */
    size_t    n_ws, cap_ws;
    htab      ws_ix;              /* content hash -> id (several ids may share a hash) */
    htab      trans;              /* (id << 8 | byte) -> next id, -1 when refused */
    int32_t  *ws_rem;             /* (n_ws_rem) per walk state: characters left, -1 unknown */
    size_t    n_ws_rem, cap_ws_rem;
    mcache    cache[MASK_CACHE];
    uint64_t  cache_clock;
    int64_t   work, budget;       /* work units of the current call, and the limit */
    int32_t   depth;              /* expand's recursion depth */
    kvc_err   err;                /* why the last call failed */
    kvc_gmatch_stats stats;
};

/* ---------------------------------------------------------------- hash tables */

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static inline void ht_free(htab *t)
{
    free(t->s);
    memset(t, 0, sizeof(*t));
}

static inline void ht_clear(htab *t)
{
    t->used = 0;
    if (++t->now == 0) {                     /* wrapped: forget every stamp */
        for (size_t i = 0; i < t->cap; i++)
            t->s[i].stamp = 0;
        t->now = 1;
    }
}

/* Starting at probe *i, the first slot that is empty or holds key; *i is
 * left at it. */
static inline hslot *ht_next(const htab *t, uint64_t key, size_t *i)
{
    for (;; *i = (*i + 1) & (t->cap - 1)) {
        hslot *s = &t->s[*i];
        if (s->stamp != t->now || s->key == key)
            return s;
    }
}

static inline size_t ht_start(const htab *t, uint64_t key)
{
    return (size_t)mix64(key) & (t->cap - 1);
}

/* Room for one more live slot (load at most 1/2), keeping the live ones for
 * which keep(ctx, slot) says so (NULL: all). false on OOM (nothing changed). */
static inline bool ht_reserve(htab *t, bool (*keep)(const void *, const hslot *), const void *ctx)
{
    if (t->now == 0)
        t->now = 1;
    if ((t->used + 1) * 2 <= t->cap)
        return true;
    size_t cap = t->cap ? t->cap * 2 : 256;
    hslot *s = calloc(cap, sizeof(*s));
    if (!s)
        return false;
    htab n = { s, cap, 0, 1 };
    for (size_t i = 0; i < t->cap; i++) {
        const hslot *o = &t->s[i];
        if (o->stamp != t->now || (keep && !keep(ctx, o)))
            continue;
        size_t j = ht_start(&n, o->key);
        hslot *d = ht_next(&n, o->key, &j);
        *d = (hslot){ o->key, o->val, 1 };
        n.used++;
    }
    free(t->s);
    *t = n;
    return true;
}

/* Insert (key, val) at the empty slot ht_next stopped at. */
static inline void ht_fill(htab *t, hslot *s, uint64_t key, int32_t val)
{
    *s = (hslot){ key, val, t->now };
    t->used++;
}

/* ---------------------------------------------------------------- shared by the two files */

/* The state after the last step (there is always one). */
static inline gstate *gm_current(const kvc_gmatch *m)
{
    return &m->hist[m->n_hist - 1];
}

/* grammar_match.c: false, with the reason in m->err, once the work passed
 * the budget; the state after one byte (1 allowed, 0 refused, < 0 a
 * status); drop what was appended after the current state; the fewest
 * characters that complete the grammar from state s. */
bool    gm_over_budget(kvc_gmatch *m);
int     gm_advance(kvc_gmatch *m, const gstate *in, uint8_t byte, gstate *out);
void    gm_drop_after_current(kvc_gmatch *m);
int32_t gm_stacks_remaining(const kvc_gmatch *m, const gstate *s);

/* Count n units of work; false (with the reason in m->err) past the budget.
 * Inline: the mask walk spends once per trie node it tries. */
static inline bool gm_spend(kvc_gmatch *m, int64_t n)
{
    return (m->work += n) <= m->budget || gm_over_budget(m);
}

/* grammar_mask.c: free a cached mask's arrays and empty its slot. */
void    gm_cache_drop(mcache *c);

#endif
