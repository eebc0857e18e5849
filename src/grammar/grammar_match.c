/* grammar_match.c - the incremental matcher: stacks, steps and rollback
 * (the token masks are in grammar_mask.c, the shared state in
 * grammar_match_internal.h).
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
#include "grammar_match_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- budget */

bool gm_over_budget(kvc_gmatch *m)
{
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
        if (!gm_spend(m, 1))
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
    if (!gm_spend(m, s->n_tops))
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
    if (!gm_spend(m, in->n_tops))
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
int gm_advance(kvc_gmatch *m, const gstate *in, uint8_t byte, gstate *out)
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
    if (!gm_spend(m, in->n_tops))
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
        gm_cache_drop(&m->cache[i]);
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
void gm_drop_after_current(kvc_gmatch *m)
{
    const gstate *s = gm_current(m);
    m->n_nodes = (size_t)s->node_end;
    m->n_tops = (size_t)(s->top_off + s->n_tops);
}

/* Run bytes from the current state; on success push the result as one step,
 * its tops moved down next to the current state's (the intermediate states'
 * tops are garbage). All or nothing. */
static int step_bytes(kvc_gmatch *m, const uint8_t *p, size_t n, bool done)
{
    gstate s = *gm_current(m);
    m->work = 0;
    for (size_t i = 0; i < n; i++) {
        gstate next;
        int rc = gm_advance(m, &s, p[i], &next);
        if (rc <= 0) {
            gm_drop_after_current(m);
            return rc < 0 ? rc : KVC_ERR_INVALID_ARG;
        }
        s = next;
    }
    const gstate *cur = gm_current(m);
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
        gm_drop_after_current(m);
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
    const gstate *s = gm_current(m);
    return s->complete && s->utf8_rem == 0 && !s->done;
}

bool kvc_gmatch_is_done(const kvc_gmatch *m)
{
    return gm_current(m)->done;
}

bool kvc_gmatch_is_closed(const kvc_gmatch *m)
{
    return kvc_gmatch_is_complete(m) && gm_current(m)->n_tops == 0;   /* every top is a CHARS */
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
    gm_drop_after_current(m);
    for (int i = 0; i < MASK_CACHE; i++)     /* their nodes may be freed and reused */
        if (m->cache[i].tops && m->cache[i].max_top >= gm_current(m)->node_end)
            gm_cache_drop(&m->cache[i]);
    return KVC_OK;
}

/* The fewest characters that complete the grammar from state s's stacks
 * (0 when s is complete). */
int32_t gm_stacks_remaining(const kvc_gmatch *m, const gstate *s)
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
    return gm_stacks_remaining(m, gm_current(m));
}
