/* grammar_match.c - the incremental matcher and token masks.
 *
 * The state of a match is a set of stacks. A stack says what may come next:
 * its top is a CHARS element (a position in elem[]) and below it the
 * positions to continue at when the rules around it finish. Stacks are linked
 * lists of immutable nodes (pos, parent) in one arena, so stacks share their
 * tails, a step allocates only the nodes it changes, and a state is just a
 * list of top nodes: keeping the states of earlier steps (rollback) and
 * trying bytes during a mask walk (then dropping what was allocated) are both
 * cheap. A reference followed by END pushes no continuation (a tail call), so
 * repetition x* does not deepen the stacks.
 *
 * Nodes are hash-consed: no two live nodes hold the same (pos, parent), so
 * two stacks are equal exactly when their top nodes are, a state's tops are
 * de-duplicated in O(1) each, and a state (its tops sorted) has one spelling.
 * That makes states cheap to compare, which the mask walk uses: the states it
 * reaches are interned and each (state, byte) transition is computed once per
 * walk (inside a JSON string nearly every byte leads back to the same state),
 * and whole masks are remembered per state across steps.
 *
 * Cost is bounded: every unit of work (a stack moved past a character, an
 * expansion step, a trie node tried) counts against a budget per call, and a
 * state may hold at most MAX_STACKS stacks. Past either, the call fails with
 * KVC_ERR_UNSUPPORTED and kvc_gmatch_error says which limit was hit. */
#include "grammar_internal.h"

#include <stdio.h>
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

static void ht_free(htab *t)
{
    free(t->s);
    memset(t, 0, sizeof(*t));
}

static void ht_clear(htab *t)
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
static hslot *ht_next(const htab *t, uint64_t key, size_t *i)
{
    for (;; *i = (*i + 1) & (t->cap - 1)) {
        hslot *s = &t->s[*i];
        if (s->stamp != t->now || s->key == key)
            return s;
    }
}

static size_t ht_start(const htab *t, uint64_t key)
{
    return (size_t)mix64(key) & (t->cap - 1);
}

/* Room for one more live slot (load at most 1/2), keeping the live ones for
 * which keep(ctx, slot) says so (NULL: all). false on OOM (nothing changed). */
static bool ht_reserve(htab *t, bool (*keep)(const void *, const hslot *), const void *ctx)
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
static void ht_fill(htab *t, hslot *s, uint64_t key, int32_t val)
{
    *s = (hslot){ key, val, t->now };
    t->used++;
}

/* ---------------------------------------------------------------- budget */

/* Count n units of work; false (with the reason in m->err) past the budget. */
static bool spend(kvc_gmatch *m, int64_t n)
{
    if ((m->work += n) <= m->budget)
        return true;
    kvc_fail(&m->err, KVC_ERR_UNSUPPORTED,
             "the grammar is too costly to match: one step needed more than %lld units of work "
             "(too many ways to parse the text so far)", (long long)m->budget);
    return false;
}

static int too_ambiguous(kvc_gmatch *m)
{
    return kvc_fail(&m->err, KVC_ERR_UNSUPPORTED,
                    "the grammar is too ambiguous to match: more than %d ways to parse the text "
                    "so far are open at once", MAX_STACKS);
}

/* ---------------------------------------------------------------- stacks */

static bool live_node(const void *ctx, const hslot *s)
{
    const kvc_gmatch *m = ctx;
    return (size_t)s->val < m->n_nodes && m->nodes[s->val].pos == (int32_t)(s->key >> 32) &&
           m->nodes[s->val].parent == (int32_t)(uint32_t)s->key;
}

/* The node (pos, parent): the live one when there is one, else a new one.
 * -1 on OOM. */
static int32_t new_node(kvc_gmatch *m, int32_t pos, int32_t parent)
{
    uint64_t key = (uint64_t)(uint32_t)pos << 32 | (uint32_t)parent;
    if (!ht_reserve(&m->cons, live_node, m))
        return -1;
    size_t i = ht_start(&m->cons, key);
    hslot *s = ht_next(&m->cons, key, &i);
    if (s->stamp == m->cons.now && live_node(m, s))
        return s->val;
    if (!kvc_grow((void **)&m->nodes, &m->cap_nodes, m->n_nodes, sizeof(*m->nodes)))
        return -1;
    if (m->cap_seen < m->cap_nodes) {
        uint32_t *p = realloc(m->seen, m->cap_nodes * sizeof(*p));
        if (!p)
            return -1;
        memset(p + m->cap_seen, 0, (m->cap_nodes - m->cap_seen) * sizeof(*p));
        m->seen = p;
        m->cap_seen = m->cap_nodes;
    }
    int32_t id = (int32_t)m->n_nodes++;
    m->nodes[id] = (gnode){ pos, parent };
    m->seen[id] = 0;
    if (s->stamp == m->cons.now)
        s->val = id;                         /* the key's entry named a freed node */
    else
        ht_fill(&m->cons, s, key, id);
    return id;
}

/* A state with no stacks yet, its tops to be appended after every top so far;
 * a new push stamp, so push_top knows what it holds. */
static gstate empty_after(kvc_gmatch *m)
{
    if (++m->push_stamp == 0) {
        if (m->seen)
            memset(m->seen, 0, m->cap_seen * sizeof(*m->seen));
        m->push_stamp = 1;
    }
    return (gstate){ .top_off = (int32_t)m->n_tops };
}

/* Add stack `top` to state `out` (the last one begun with empty_after)
 * unless it is there already. */
static int push_top(kvc_gmatch *m, int32_t top, gstate *out)
{
    if (m->seen[top] == m->push_stamp)
        return KVC_OK;
    if (out->n_tops >= MAX_STACKS)
        return too_ambiguous(m);
    if (!kvc_grow((void **)&m->tops, &m->cap_tops, m->n_tops, sizeof(*m->tops)))
        return KVC_ERR_NOMEM;
    m->seen[top] = m->push_stamp;
    m->tops[m->n_tops++] = top;
    out->n_tops++;
    return KVC_OK;
}

/* Add to `out` every stack that continues at element pos with `parent`
 * below: descend into references until each stack has a CHARS on top;
 * reaching the end of the bottom rule marks the state complete. A rule is
 * expanded once per (rule, continuation) in a closure (m->vis), which ends
 * the loops of nullable repetition (r ::= x r | "" with x nullable): the
 * parser refused the left recursion that would grow the stacks. */
static int expand(kvc_gmatch *m, int32_t pos, int32_t parent, gstate *out)
{
    const kvc_grammar *g = m->g;
    for (;;) {
        if (!spend(m, 1))
            return KVC_ERR_UNSUPPORTED;
        int32_t e = g->elem[pos];
        if (GE_KIND(e) == GE_CHARS) {
            int32_t t = new_node(m, pos, parent);
            return t < 0 ? KVC_ERR_NOMEM : push_top(m, t, out);
        }
        if (GE_KIND(e) == GE_END) {
            if (parent < 0) {
                out->complete = true;
                return KVC_OK;
            }
            if (GE_KIND(g->elem[m->nodes[parent].pos]) == GE_CHARS)
                return push_top(m, parent, out);     /* reuse the node below */
            pos = m->nodes[parent].pos;
            parent = m->nodes[parent].parent;
            continue;
        }
        int32_t cont = parent;
        if (GE_KIND(g->elem[pos + 1]) != GE_END && (cont = new_node(m, pos + 1, parent)) < 0)
            return KVC_ERR_NOMEM;
        uint64_t key = (uint64_t)(uint32_t)GE_ARG(e) << 32 | (uint32_t)cont;
        if (!ht_reserve(&m->vis, NULL, NULL))
            return KVC_ERR_NOMEM;
        size_t i = ht_start(&m->vis, key);
        hslot *s = ht_next(&m->vis, key, &i);
        if (s->stamp == m->vis.now)
            return KVC_OK;                       /* expanded already */
        ht_fill(&m->vis, s, key, 0);
        if (m->depth >= MAX_DEPTH)
            return kvc_fail(&m->err, KVC_ERR_UNSUPPORTED,
                            "the grammar nests too deeply to match: more than %d rules open inside "
                            "each other at once", MAX_DEPTH);
        const grule *r = &g->rules[GE_ARG(e)];
        int rc = KVC_OK;
        m->depth++;
        for (int32_t a = 0; a < r->n_alts && rc == KVC_OK; a++)
            rc = expand(m, g->alts[r->alt_first + a], cont, out);
        m->depth--;
        return rc;
    }
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* Sort a state's tops: one spelling per set of stacks. */
static bool sort_tops(kvc_gmatch *m, gstate *s)
{
    if (s->n_tops < 2)
        return true;
    if (!spend(m, s->n_tops))
        return false;
    qsort(m->tops + s->top_off, (size_t)s->n_tops, sizeof(*m->tops), cmp_i32);
    return true;
}

/* ---------------------------------------------------------------- one byte */

/* The stacks of `in` that accept code point cp, moved past it, into *out
 * (tops sorted). */
static int advance_cp(kvc_gmatch *m, const gstate *in, uint32_t cp, gstate *out)
{
    const kvc_grammar *g = m->g;
    *out = empty_after(m);
    ht_clear(&m->vis);
    if (!spend(m, in->n_tops))
        return KVC_ERR_UNSUPPORTED;
    for (int32_t i = 0; i < in->n_tops; i++) {
        const gnode nd = m->nodes[m->tops[in->top_off + i]];
        if (!gclass_has(g, GE_ARG(g->elem[nd.pos]), cp))
            continue;
        int rc = expand(m, nd.pos + 1, nd.parent, out);
        if (rc != KVC_OK)
            return rc;
    }
    return sort_tops(m, out) ? KVC_OK : KVC_ERR_UNSUPPORTED;
}

/* Some stack of `in` accepts a code point in [lo, hi]. */
static bool any_meets(const kvc_gmatch *m, const gstate *in, uint32_t lo, uint32_t hi)
{
    const kvc_grammar *g = m->g;
    for (int32_t i = 0; i < in->n_tops; i++)
        if (gclass_meets(g, GE_ARG(g->elem[m->nodes[m->tops[in->top_off + i]].pos]), lo, hi))
            return true;
    return false;
}

/* The state after byte `byte` in *out. Returns 1 when the byte is allowed, 0
 * when not (out is then meaningless), or a negative status. New nodes and
 * tops are appended to the arenas; the caller drops them when done. */
static int advance(kvc_gmatch *m, const gstate *in, uint8_t byte, gstate *out)
{
    static const uint32_t min_cp[5] = { 0, 0, 0x80, 0x800, 0x10000 };
    if (in->done)
        return 0;
    uint32_t val;
    int rem, len;
    if (in->utf8_rem == 0) {
        if (byte < 0x80) {
            int rc = advance_cp(m, in, byte, out);
            return rc != KVC_OK ? rc : out->n_tops > 0 || out->complete;
        }
        len = byte >= 0xC2 && byte <= 0xDF ? 2 : byte >= 0xE0 && byte <= 0xEF ? 3
            : byte >= 0xF0 && byte <= 0xF4 ? 4 : 0;
        if (!len)
            return 0;
        rem = len - 1;
        val = byte & (0x7Fu >> len);
    } else {
        if ((byte & 0xC0) != 0x80)
            return 0;
        len = in->utf8_len;
        rem = in->utf8_rem - 1;
        val = in->utf8_val << 6 | (byte & 0x3Fu);
        if (rem == 0) {
            if (val < min_cp[len] || val > KVC_MAX_CP || (val >= 0xD800 && val <= 0xDFFF))
                return 0;
            int rc = advance_cp(m, in, val, out);
            return rc != KVC_OK ? rc : out->n_tops > 0 || out->complete;
        }
    }
    /* an open character: the code points it can still become */
    uint32_t lo = val << (6 * rem), hi = lo | ((1u << (6 * rem)) - 1);
    lo = KVC_MAX(lo, min_cp[len]);
    hi = KVC_MIN(hi, KVC_MAX_CP);
    if (!spend(m, in->n_tops))
        return KVC_ERR_UNSUPPORTED;
    if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF) || !any_meets(m, in, lo, hi))
        return 0;
    *out = *in;
    out->utf8_val = val;
    out->utf8_rem = (uint8_t)rem;
    out->utf8_len = (uint8_t)len;
    out->complete = false;
    return 1;
}

/* ---------------------------------------------------------------- life cycle */

static gstate *current(const kvc_gmatch *m)
{
    return &m->hist[m->n_hist - 1];
}

static bool push_state(kvc_gmatch *m, gstate s)
{
    if (!kvc_grow((void **)&m->hist, &m->cap_hist, m->n_hist, sizeof(*m->hist)))
        return false;
    s.node_end = (int32_t)m->n_nodes;
    m->hist[m->n_hist++] = s;
    return true;
}

kvc_gmatch *kvc_gmatch_new(const kvc_grammar *g, const kvc_gvocab *v)
{
    kvc_gmatch *m = kvc_gmatch_new_budget(g, v, KVC_GMATCH_BUDGET, NULL);
    return m;
}

kvc_gmatch *kvc_gmatch_new_budget(const kvc_grammar *g, const kvc_gvocab *v, int64_t budget,
                                  kvc_err *err)
{
    if (!g) {
        kvc_fail(err, KVC_ERR_INVALID_ARG, "no grammar");
        return NULL;
    }
    kvc_gmatch *m = calloc(1, sizeof(*m));
    if (!m) {
        kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
        return NULL;
    }
    m->g = g;
    m->v = v;
    m->budget = budget > 0 ? budget : KVC_GMATCH_BUDGET;
    /* the start: a stack for each alternative of the root */
    gstate s = empty_after(m);
    ht_clear(&m->vis);
    const grule *r = &g->rules[g->root];
    int rc = KVC_OK;
    for (int32_t a = 0; a < r->n_alts && rc == KVC_OK; a++)
        rc = expand(m, g->alts[r->alt_first + a], -1, &s);
    if (rc == KVC_OK && !sort_tops(m, &s))
        rc = KVC_ERR_UNSUPPORTED;
    if (rc == KVC_OK && !push_state(m, s))
        rc = KVC_ERR_NOMEM;
    if (rc != KVC_OK) {
        if (rc == KVC_ERR_NOMEM)
            kvc_fail(&m->err, rc, "out of memory");
        if (err)
            *err = m->err;
        kvc_gmatch_free(m);
        return NULL;
    }
    return m;
}

static void cache_drop(mcache *c)
{
    free(c->tops);
    free(c->mask);
    memset(c, 0, sizeof(*c));
}

void kvc_gmatch_free(kvc_gmatch *m)
{
    if (!m)
        return;
    free(m->nodes);
    free(m->seen);
    free(m->tops);
    free(m->hist);
    free(m->ws);
    free(m->ws_rem);
    ht_free(&m->cons);
    ht_free(&m->vis);
    ht_free(&m->ws_ix);
    ht_free(&m->trans);
    for (int i = 0; i < MASK_CACHE; i++)
        cache_drop(&m->cache[i]);
    free(m);
}

static void *dup_array(const void *p, size_t n, size_t elsize, size_t *cap)
{
    *cap = n ? n : 1;
    void *q = malloc(*cap * elsize);
    if (q && n)
        memcpy(q, p, n * elsize);
    return q;
}

kvc_gmatch *kvc_gmatch_clone(const kvc_gmatch *m)
{
    if (!m)
        return NULL;
    kvc_gmatch *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->g = m->g;
    c->v = m->v;
    c->budget = m->budget;
    c->stats = m->stats;
    c->push_stamp = m->push_stamp;
    c->n_nodes = m->n_nodes;
    c->n_tops = m->n_tops;
    c->n_hist = m->n_hist;
    c->nodes = dup_array(m->nodes, m->n_nodes, sizeof(*m->nodes), &c->cap_nodes);
    c->seen = dup_array(m->seen, m->n_nodes, sizeof(*m->seen), &c->cap_seen);
    c->tops = dup_array(m->tops, m->n_tops, sizeof(*m->tops), &c->cap_tops);
    c->hist = dup_array(m->hist, m->n_hist, sizeof(*m->hist), &c->cap_hist);
    size_t cap;
    c->cons = m->cons;
    c->cons.s = dup_array(m->cons.s, m->cons.cap, sizeof(*m->cons.s), &cap);
    if (!c->nodes || !c->seen || !c->tops || !c->hist || !c->cons.s) {
        kvc_gmatch_free(c);
        return NULL;
    }
    if (c->cap_seen < c->cap_nodes) {        /* new_node keeps seen as long as nodes */
        uint32_t *p = realloc(c->seen, c->cap_nodes * sizeof(*p));
        if (!p) {
            kvc_gmatch_free(c);
            return NULL;
        }
        c->seen = p;
        c->cap_seen = c->cap_nodes;
    }
    return c;
}

const char *kvc_gmatch_error(const kvc_gmatch *m)
{
    return m ? m->err.msg : "";
}

/* ---------------------------------------------------------------- steps */

/* Drop what a failed or tried step appended after the current state. */
static void drop_after_current(kvc_gmatch *m)
{
    const gstate *s = current(m);
    m->n_nodes = (size_t)s->node_end;
    m->n_tops = (size_t)(s->top_off + s->n_tops);
}

/* Run bytes from the current state; on success push the result as one step,
 * its tops moved down next to the current state's (the intermediate states'
 * tops are garbage). All or nothing. */
static int step_bytes(kvc_gmatch *m, const uint8_t *p, size_t n, bool done)
{
    gstate s = *current(m);
    m->work = 0;
    for (size_t i = 0; i < n; i++) {
        gstate next;
        int rc = advance(m, &s, p[i], &next);
        if (rc <= 0) {
            drop_after_current(m);
            return rc < 0 ? rc : KVC_ERR_INVALID_ARG;
        }
        s = next;
    }
    const gstate *cur = current(m);
    int32_t base = cur->top_off + cur->n_tops;
    if (s.top_off > base) {
        memmove(m->tops + base, m->tops + s.top_off, (size_t)s.n_tops * sizeof(*m->tops));
        s.top_off = base;
    }
    m->n_tops = (size_t)(s.top_off + s.n_tops);
    if (done) {
        s.done = true;
        s.n_tops = 0;
    }
    if (!push_state(m, s)) {
        drop_after_current(m);
        return KVC_ERR_NOMEM;
    }
    return KVC_OK;
}

int kvc_gmatch_accept_bytes(kvc_gmatch *m, const void *bytes, size_t n)
{
    if (!m || (!bytes && n))
        return KVC_ERR_INVALID_ARG;
    return step_bytes(m, bytes, n, false);
}

bool kvc_gmatch_is_complete(const kvc_gmatch *m)
{
    const gstate *s = current(m);
    return s->complete && s->utf8_rem == 0 && !s->done;
}

bool kvc_gmatch_is_done(const kvc_gmatch *m)
{
    return current(m)->done;
}

bool kvc_gmatch_is_closed(const kvc_gmatch *m)
{
    return kvc_gmatch_is_complete(m) && current(m)->n_tops == 0;   /* every top is a CHARS */
}

int kvc_gmatch_accept_token(kvc_gmatch *m, int32_t token)
{
    const kvc_gvocab *v = m ? m->v : NULL;
    if (!v || token < 0 || token >= v->n_vocab)
        return KVC_ERR_INVALID_ARG;
    if (v->kind[token] == GTOK_EOG)
        return kvc_gmatch_is_complete(m) ? step_bytes(m, NULL, 0, true) : KVC_ERR_INVALID_ARG;
    if (v->kind[token] != GTOK_TEXT)
        return KVC_ERR_INVALID_ARG;
    return step_bytes(m, (const uint8_t *)v->pieces + v->piece_off[token],
                      v->piece_off[token + 1] - v->piece_off[token], false);
}

int32_t kvc_gmatch_n_steps(const kvc_gmatch *m)
{
    return m ? (int32_t)m->n_hist - 1 : 0;
}

int kvc_gmatch_rollback(kvc_gmatch *m, int32_t n)
{
    if (!m || n < 0 || (size_t)n >= m->n_hist)
        return KVC_ERR_INVALID_ARG;
    m->n_hist -= (size_t)n;
    drop_after_current(m);
    for (int i = 0; i < MASK_CACHE; i++)     /* their nodes may be freed and reused */
        if (m->cache[i].tops && m->cache[i].max_top >= current(m)->node_end)
            cache_drop(&m->cache[i]);
    return KVC_OK;
}

/* The fewest characters that complete the grammar from state s's stacks
 * (0 when s is complete). */
static int32_t stacks_remaining(const kvc_gmatch *m, const gstate *s)
{
    if (s->done || (s->complete && s->utf8_rem == 0))
        return 0;
    int64_t best = INT32_MAX;
    for (int32_t i = 0; i < s->n_tops; i++) {
        int64_t len = 0;
        for (int32_t k = m->tops[s->top_off + i]; k >= 0; k = m->nodes[k].parent)
            len += m->g->suffix[m->nodes[k].pos];
        best = KVC_MIN(best, len);
    }
    return (int32_t)best;
}

int32_t kvc_gmatch_min_remaining(const kvc_gmatch *m)
{
    return stacks_remaining(m, current(m));
}

/* ---------------------------------------------------------------- masks */

/* A state's content hash (its sorted tops and UTF-8 part). */
static uint64_t state_hash(const kvc_gmatch *m, const gstate *s)
{
    uint64_t h = mix64((uint64_t)s->utf8_val << 16 | (uint64_t)s->utf8_rem << 8 |
                       (uint64_t)s->utf8_len << 1 | s->complete);
    for (int32_t i = 0; i < s->n_tops; i++)
        h = mix64(h ^ (uint32_t)m->tops[s->top_off + i]) + (uint64_t)i;
    return h;
}

static bool same_state(const kvc_gmatch *m, const gstate *a, const gstate *b)
{
    return a->n_tops == b->n_tops && a->utf8_val == b->utf8_val && a->utf8_rem == b->utf8_rem &&
           a->utf8_len == b->utf8_len && a->complete == b->complete &&
           (a->n_tops == 0 || memcmp(m->tops + a->top_off, m->tops + b->top_off,
                                     (size_t)a->n_tops * sizeof(*m->tops)) == 0);
}

/* The walk's id of state s: an equal state's id, or a new id. When s owns
 * its tops (the last ones appended, not shared with another state) and an
 * equal state exists, they are dropped. -1 on OOM. */
static int32_t intern(kvc_gmatch *m, const gstate *s, bool owned)
{
    uint64_t h = state_hash(m, s);
    if (!ht_reserve(&m->ws_ix, NULL, NULL))
        return -1;
    size_t i = ht_start(&m->ws_ix, h);
    hslot *slot;
    for (;; i = (i + 1) & (m->ws_ix.cap - 1)) {
        slot = ht_next(&m->ws_ix, h, &i);
        if (slot->stamp != m->ws_ix.now)
            break;
        if (same_state(m, &m->ws[slot->val], s)) {
            if (owned)
                m->n_tops = (size_t)s->top_off;
            return slot->val;
        }
    }
    if (!kvc_grow((void **)&m->ws, &m->cap_ws, m->n_ws, sizeof(*m->ws)))
        return -1;
    m->ws[m->n_ws] = *s;
    ht_fill(&m->ws_ix, slot, h, (int32_t)m->n_ws);
    return (int32_t)m->n_ws++;
}

typedef struct walk {
    kvc_gmatch *m;
    uint32_t   *mask;
    int32_t     count;
    int64_t     visited;
    int         status;
    int32_t     need;        /* >= 0: allow only tokens leaving fewer characters to the end */
    bool        best;        /* ... and of those only the ones leaving the fewest */
    int32_t     best_rem;    /* (the fewest so far) */
} walk;

static void allow_tokens(walk *w, const gtrie_node *nd)
{
    const int32_t *t = w->m->v->toks + nd->tok_first;
    for (int i = 0; i < nd->n_toks; i++)
        w->mask[t[i] >> 5] |= 1u << (t[i] & 31);
    w->count += nd->n_toks;
}

/* The walk state after byte from walk state id: its id, -1 when the byte is
 * refused, or -2 with w->status set. Each (id, byte) is computed once. */
static int32_t transition(walk *w, int32_t id, uint8_t byte)
{
    kvc_gmatch *m = w->m;
    uint64_t key = (uint64_t)id << 8 | byte;
    const bool keep = m->trans.used < MAX_TRANS;
    if (keep && !ht_reserve(&m->trans, NULL, NULL)) {
        w->status = KVC_ERR_NOMEM;
        return -2;
    }
    hslot *s = NULL;
    if (m->trans.cap) {
        size_t i = ht_start(&m->trans, key);
        s = ht_next(&m->trans, key, &i);
        if (s->stamp == m->trans.now)
            return s->val;
    }
    const gstate in = m->ws[id];
    const size_t before = m->n_tops;
    gstate next;
    int rc = advance(m, &in, byte, &next);
    int32_t to = rc > 0 ? intern(m, &next, (size_t)next.top_off >= before) : -1;
    if (rc < 0 || (rc > 0 && to < 0)) {
        w->status = rc < 0 ? rc : KVC_ERR_NOMEM;
        return -2;
    }
    if (rc == 0)
        m->n_tops = before;                  /* a refused byte's tops */
    /* advance and intern grow other tables, never this one: s is still valid */
    if (keep)
        ht_fill(&m->trans, s, key, to);
    return to;
}

/* Walk state id leaves fewer than w->need characters to the end (each
 * state's count computed once per walk, in m->ws_rem). */
static bool closer(walk *w, int32_t id)
{
    kvc_gmatch *m = w->m;
    if (m->cap_ws_rem < m->cap_ws) {
        int32_t *p = realloc(m->ws_rem, m->cap_ws * sizeof(*p));
        if (!p) {
            w->status = KVC_ERR_NOMEM;
            return false;
        }
        m->ws_rem = p;
        m->cap_ws_rem = m->cap_ws;
    }
    while (m->n_ws_rem < m->n_ws)
        m->ws_rem[m->n_ws_rem++] = -1;
    if (m->ws_rem[id] < 0) {
        if (!spend(m, m->ws[id].n_tops)) {
            w->status = KVC_ERR_UNSUPPORTED;
            return false;
        }
        m->ws_rem[id] = stacks_remaining(m, &m->ws[id]);
    }
    if (m->ws_rem[id] >= w->need)
        return false;
    if (w->best && m->ws_rem[id] > w->best_rem)
        return false;
    if (w->best && m->ws_rem[id] < w->best_rem) {     /* a better one: drop the others */
        memset(w->mask, 0, kvc_mask_words(m->v->n_vocab) * sizeof(*w->mask));
        w->count = 0;
        w->best_rem = m->ws_rem[id];
    }
    return true;
}

/* Try each child of trie node k from walk state id; recurse where a byte is
 * allowed. */
static void walk_node(walk *w, int32_t k, int32_t id)
{
    kvc_gmatch *m = w->m;
    const gtrie_node *nodes = m->v->nodes;
    const gtrie_node *nd = &nodes[k];
    for (int32_t c = nd->first_child; c < nd->first_child + nd->n_children && w->status == KVC_OK; c++) {
        w->visited++;
        if (!spend(m, 1)) {
            w->status = KVC_ERR_UNSUPPORTED;
            return;
        }
        int32_t to = transition(w, id, nodes[c].byte);
        if (to < 0)
            continue;
        if (w->need < 0)
            allow_tokens(w, &nodes[c]);
        else if (nodes[c].n_toks && closer(w, to))
            allow_tokens(w, &nodes[c]);
        if (nodes[c].n_children && (m->ws[to].n_tops > 0 || m->ws[to].utf8_rem))
            walk_node(w, c, to);
    }
}

/* The cached mask of state s, or NULL. */
static mcache *cache_find(kvc_gmatch *m, const gstate *s)
{
    for (int i = 0; i < MASK_CACHE; i++) {
        mcache *c = &m->cache[i];
        if (c->tops && c->n_tops == s->n_tops && c->utf8_val == s->utf8_val &&
            c->utf8_rem == s->utf8_rem && c->utf8_len == s->utf8_len && c->complete == s->complete &&
            (s->n_tops == 0 ||
             memcmp(c->tops, m->tops + s->top_off, (size_t)s->n_tops * sizeof(*c->tops)) == 0)) {
            c->last_use = ++m->cache_clock;
            return c;
        }
    }
    return NULL;
}

/* Remember mask (count tokens) for state s in the least recently used slot;
 * out of memory just skips it. */
static void cache_put(kvc_gmatch *m, const gstate *s, const uint32_t *mask, int32_t count)
{
    mcache *c = &m->cache[0];
    for (int i = 1; i < MASK_CACHE; i++)
        if (m->cache[i].last_use < c->last_use)
            c = &m->cache[i];
    cache_drop(c);
    size_t words = kvc_mask_words(m->v->n_vocab);
    c->tops = malloc(((size_t)s->n_tops + 1) * sizeof(*c->tops));
    c->mask = malloc(words * sizeof(*c->mask));
    if (!c->tops || !c->mask) {
        cache_drop(c);
        return;
    }
    if (s->n_tops > 0)
        memcpy(c->tops, m->tops + s->top_off, (size_t)s->n_tops * sizeof(*c->tops));
    memcpy(c->mask, mask, words * sizeof(*mask));
    c->n_tops = s->n_tops;
    c->max_top = -1;
    for (int32_t i = 0; i < s->n_tops; i++)
        c->max_top = KVC_MAX(c->max_top, c->tops[i]);
    c->utf8_val = s->utf8_val;
    c->utf8_rem = s->utf8_rem;
    c->utf8_len = s->utf8_len;
    c->complete = s->complete;
    c->count = count;
    c->last_use = ++m->cache_clock;
}

/* The mask of the current state (need < 0), or only its tokens that leave
 * fewer than need characters to the end (and the EOG); the plain masks are
 * cached per state. */
static int32_t mask_of(kvc_gmatch *m, uint32_t *mask, int32_t need, bool best)
{
    int64_t t0 = kvc_time_us();
    const kvc_gvocab *v = m->v;
    const size_t words = kvc_mask_words(v->n_vocab);
    walk w = { .m = m, .mask = mask, .need = need, .best = best, .best_rem = INT32_MAX };
    const gstate s = *current(m);
    mcache *hit = s.done || need >= 0 ? NULL : cache_find(m, &s);
    m->work = 0;
    if (hit) {
        memcpy(mask, hit->mask, words * sizeof(*mask));
        w.count = hit->count;
    } else {
        memset(mask, 0, words * sizeof(*mask));
    }
    if (!s.done && !hit) {
        if (kvc_gmatch_is_complete(m))
            for (int32_t i = 0; i < v->n_eog; i++) {
                mask[v->eog[i] >> 5] |= 1u << (v->eog[i] & 31);
                w.count++;
            }
        m->n_ws = 0;
        m->n_ws_rem = 0;
        ht_clear(&m->ws_ix);
        ht_clear(&m->trans);
        int32_t root = intern(m, &s, false);
        if (root < 0)
            w.status = KVC_ERR_NOMEM;
        else
            walk_node(&w, 0, root);
        drop_after_current(m);
        if (w.status == KVC_OK && need < 0)
            cache_put(m, &s, mask, w.count);
    }
    m->stats.n_masks++;
    m->stats.nodes_visited += w.visited;
    m->stats.mask_us += kvc_time_us() - t0;
    if (w.status == KVC_ERR_NOMEM)
        kvc_fail(&m->err, KVC_ERR_NOMEM, "out of memory");
    return w.status != KVC_OK ? w.status : w.count;
}

int32_t kvc_gmatch_mask(kvc_gmatch *m, uint32_t *mask)
{
    if (!m || !m->v || !mask)
        return KVC_ERR_INVALID_ARG;
    return mask_of(m, mask, -1, false);
}

int32_t kvc_gmatch_mask_closer(kvc_gmatch *m, uint32_t *mask)
{
    if (!m || !m->v || !mask)
        return KVC_ERR_INVALID_ARG;
    return mask_of(m, mask, kvc_gmatch_min_remaining(m), false);
}

int32_t kvc_gmatch_mask_nearest(kvc_gmatch *m, uint32_t *mask)
{
    if (!m || !m->v || !mask)
        return KVC_ERR_INVALID_ARG;
    return mask_of(m, mask, kvc_gmatch_min_remaining(m), true);
}

int32_t kvc_gmatch_mask_within(kvc_gmatch *m, uint32_t *mask, int32_t budget)
{
    if (!m || !m->v || !mask || budget < 0)
        return KVC_ERR_INVALID_ARG;
    return mask_of(m, mask, budget == INT32_MAX ? budget : budget + 1, false);
}

kvc_gmatch_stats kvc_gmatch_get_stats(const kvc_gmatch *m)
{
    return m ? m->stats : (kvc_gmatch_stats){ 0 };
}

/* ---------------------------------------------------------------- admission */

int kvc_grammar_check_cost(const kvc_grammar *g, const kvc_gvocab *v, int32_t n_steps,
                           int64_t budget, kvc_err *err)
{
    if (!g || !v)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "no grammar or vocabulary");
    kvc_gmatch *m = kvc_gmatch_new_budget(g, v, budget, err);
    if (!m)
        return err ? err->code : KVC_ERR_UNSUPPORTED;
    uint32_t *mask = malloc(kvc_mask_words(v->n_vocab) * sizeof(*mask));
    int rc = mask ? KVC_OK : kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    for (int32_t step = 0; rc == KVC_OK && step <= n_steps; step++) {
        int32_t n = kvc_gmatch_mask(m, mask);
        if (n < 0) {
            rc = n == KVC_ERR_NOMEM ? kvc_fail(err, n, "out of memory")
                                    : kvc_fail(err, n, "%s", kvc_gmatch_error(m));
            break;
        }
        int32_t best = -1;
        uint32_t best_len = 0;
        for (int32_t id = 0; id < v->n_vocab && step < n_steps; id++) {
            uint32_t len = v->piece_off[id + 1] - v->piece_off[id];
            if (kvc_mask_test(mask, id) && v->kind[id] == GTOK_TEXT && len > best_len)
                best = id, best_len = len;
        }
        if (best < 0)
            break;                           /* only the end is left, or the last step */
        int arc = kvc_gmatch_accept_token(m, best);
        if (arc != KVC_OK)
            rc = arc == KVC_ERR_NOMEM ? kvc_fail(err, arc, "out of memory")
                                      : kvc_fail(err, arc, "%s", kvc_gmatch_error(m));
    }
    free(mask);
    kvc_gmatch_free(m);
    return rc;
}
