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
 * repetition x* does not deepen the stacks. */
#include "grammar_internal.h"

#include <stdlib.h>
#include <string.h>

enum { MAX_STACKS = 1024 };       /* distinct stacks in one state */

typedef struct gnode {
    int32_t pos;                  /* element to match next (or to continue at) */
    int32_t parent;               /* the node below, -1 at the bottom */
} gnode;

typedef struct gstate {
    int32_t  top_off, n_tops;     /* the stacks' top nodes: m->tops[top_off, +n_tops) */
    int32_t  node_end;            /* nodes the state uses are below this */
    uint32_t utf8_val;            /* bits of an open UTF-8 character */
    uint8_t  utf8_rem;            /* its continuation bytes still to come */
    uint8_t  utf8_len;            /* its total length */
    bool     complete;            /* an empty stack: the root rule finished */
    bool     done;                /* an end-of-generation token was accepted */
} gstate;

struct kvc_gmatch {
    const kvc_grammar *g;
    const kvc_gvocab  *v;
    gnode   *nodes;               /* the arena */
    size_t   n_nodes, cap_nodes;
    int32_t *tops;                /* the states' top lists, one after another */
    size_t   n_tops, cap_tops;
    gstate  *hist;                /* hist[k]: the state after k steps */
    size_t   n_hist, cap_hist;
    kvc_gmatch_stats stats;
};

/* ---------------------------------------------------------------- stacks */

static int32_t new_node(kvc_gmatch *m, int32_t pos, int32_t parent)
{
    if (!kvc_grow((void **)&m->nodes, &m->cap_nodes, m->n_nodes, sizeof(*m->nodes)))
        return -1;
    m->nodes[m->n_nodes] = (gnode){ pos, parent };
    return (int32_t)m->n_nodes++;
}

static bool same_stack(const kvc_gmatch *m, int32_t a, int32_t b)
{
    while (a != b) {
        if (a < 0 || b < 0 || m->nodes[a].pos != m->nodes[b].pos)
            return false;
        a = m->nodes[a].parent;
        b = m->nodes[b].parent;
    }
    return true;
}

/* Add stack `top` to state `out` (whose tops are the last ones in m->tops)
 * unless it is there already. */
static int push_top(kvc_gmatch *m, int32_t top, gstate *out)
{
    for (int32_t i = 0; i < out->n_tops; i++)
        if (same_stack(m, m->tops[out->top_off + i], top))
            return KVC_OK;
    if (out->n_tops >= MAX_STACKS)
        return KVC_ERR_UNSUPPORTED;
    if (!kvc_grow((void **)&m->tops, &m->cap_tops, m->n_tops, sizeof(*m->tops)))
        return KVC_ERR_NOMEM;
    m->tops[m->n_tops++] = top;
    out->n_tops++;
    return KVC_OK;
}

/* Add to `out` every stack that continues at element pos with `parent`
 * below: descend into references until each stack has a CHARS on top;
 * reaching the end of the bottom rule marks the state complete. Terminates
 * because the parser refused left recursion. */
static int expand(kvc_gmatch *m, int32_t pos, int32_t parent, gstate *out)
{
    const kvc_grammar *g = m->g;
    for (;;) {
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
        const grule *r = &g->rules[GE_ARG(e)];
        for (int32_t a = 0; a < r->n_alts; a++) {
            int rc = expand(m, g->alts[r->alt_first + a], cont, out);
            if (rc != KVC_OK)
                return rc;
        }
        return KVC_OK;
    }
}

/* ---------------------------------------------------------------- one byte */

static gstate empty_after(const kvc_gmatch *m)
{
    return (gstate){ .top_off = (int32_t)m->n_tops };
}

/* The stacks of `in` that accept code point cp, moved past it, into *out. */
static int advance_cp(kvc_gmatch *m, const gstate *in, uint32_t cp, gstate *out)
{
    const kvc_grammar *g = m->g;
    *out = empty_after(m);
    for (int32_t i = 0; i < in->n_tops; i++) {
        const gnode nd = m->nodes[m->tops[in->top_off + i]];
        if (!gclass_has(g, GE_ARG(g->elem[nd.pos]), cp))
            continue;
        int rc = expand(m, nd.pos + 1, nd.parent, out);
        if (rc != KVC_OK)
            return rc;
    }
    return KVC_OK;
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
 * tops are appended to the arenas; the caller drops them on rejection. */
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
    if (!g)
        return NULL;
    kvc_gmatch *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->g = g;
    m->v = v;
    /* the start: a stack for each alternative of the root */
    gstate s = empty_after(m);
    const grule *r = &g->rules[g->root];
    int rc = KVC_OK;
    for (int32_t a = 0; a < r->n_alts && rc == KVC_OK; a++)
        rc = expand(m, g->alts[r->alt_first + a], -1, &s);
    if (rc != KVC_OK || !push_state(m, s)) {
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
    free(m->tops);
    free(m->hist);
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
    *c = *m;
    c->nodes = dup_array(m->nodes, m->n_nodes, sizeof(*m->nodes), &c->cap_nodes);
    c->tops = dup_array(m->tops, m->n_tops, sizeof(*m->tops), &c->cap_tops);
    c->hist = dup_array(m->hist, m->n_hist, sizeof(*m->hist), &c->cap_hist);
    if (!c->nodes || !c->tops || !c->hist) {
        kvc_gmatch_free(c);
        return NULL;
    }
    return c;
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
    return KVC_OK;
}

int32_t kvc_gmatch_min_remaining(const kvc_gmatch *m)
{
    const gstate *s = current(m);
    if (s->done || kvc_gmatch_is_complete(m))
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

/* ---------------------------------------------------------------- masks */

typedef struct walk {
    kvc_gmatch *m;
    uint32_t   *mask;
    int32_t     count;
    int64_t     visited;
    int         status;
} walk;

static void allow_tokens(walk *w, const gtrie_node *nd)
{
    const int32_t *t = w->m->v->toks + nd->tok_first;
    for (int i = 0; i < nd->n_toks; i++)
        w->mask[t[i] >> 5] |= 1u << (t[i] & 31);
    w->count += nd->n_toks;
}

/* The stacks of `in` picked by bit i of `subset` (i < 64), moved past the
 * character they accept, into *out. */
static int advance_subset(kvc_gmatch *m, const gstate *in, uint64_t subset, gstate *out)
{
    *out = empty_after(m);
    for (int32_t i = 0; i < in->n_tops && subset; i++, subset >>= 1) {
        if (!(subset & 1))
            continue;
        const gnode nd = m->nodes[m->tops[in->top_off + i]];
        int rc = expand(m, nd.pos + 1, nd.parent, out);
        if (rc != KVC_OK)
            return rc;
    }
    return KVC_OK;
}

enum { MEMO = 8 };

/* Try each child of trie node k from state s; recurse where a byte is
 * allowed. The state after an ASCII byte depends only on which stacks accept
 * it, so siblings with the same set share one state (in a JSON string nearly
 * all printable bytes do): it is built once, kept until the loop ends, and
 * each child's subtree allocates above it and drops what it allocated. */
static void walk_node(walk *w, int32_t k, const gstate *s)
{
    kvc_gmatch *m = w->m;
    const kvc_grammar *g = m->g;
    const gtrie_node *nodes = m->v->nodes;
    const gtrie_node *nd = &nodes[k];
    const bool by_set = s->utf8_rem == 0 && s->n_tops <= 64;
    uint64_t memo_set[MEMO];
    gstate memo_state[MEMO];
    int memo_rc[MEMO], n_memo = 0;
    size_t mark_nodes = m->n_nodes, mark_tops = m->n_tops;
    for (int32_t c = nd->first_child; c < nd->first_child + nd->n_children && w->status == KVC_OK; c++) {
        uint8_t byte = nodes[c].byte;
        gstate next;
        int rc;
        if (by_set && byte < 0x80) {
            uint64_t set = 0;
            for (int32_t i = 0; i < s->n_tops; i++)
                if (gclass_has(g, GE_ARG(g->elem[m->nodes[m->tops[s->top_off + i]].pos]), byte))
                    set |= 1ull << i;
            if (!set)
                continue;
            w->visited++;
            int j = 0;
            while (j < n_memo && memo_set[j] != set)
                j++;
            if (j < n_memo) {
                next = memo_state[j];
                rc = memo_rc[j];
            } else {
                rc = advance_subset(m, s, set, &next);
                rc = rc != KVC_OK ? rc : next.n_tops > 0 || next.complete;
                if (rc >= 0 && n_memo < MEMO) {      /* keep it: later siblings reuse it */
                    memo_set[n_memo] = set;
                    memo_rc[n_memo] = rc;
                    memo_state[n_memo++] = next;
                    mark_nodes = m->n_nodes;
                    mark_tops = m->n_tops;
                }
            }
        } else {
            w->visited++;
            rc = advance(m, s, byte, &next);
        }
        if (rc < 0) {
            w->status = rc;
        } else if (rc > 0) {
            allow_tokens(w, &nodes[c]);
            if (nodes[c].n_children && (next.n_tops > 0 || next.utf8_rem))
                walk_node(w, c, &next);
        }
        m->n_nodes = mark_nodes;
        m->n_tops = mark_tops;
    }
}

int32_t kvc_gmatch_mask(kvc_gmatch *m, uint32_t *mask)
{
    if (!m || !m->v || !mask)
        return KVC_ERR_INVALID_ARG;
    int64_t t0 = kvc_time_us();
    const kvc_gvocab *v = m->v;
    memset(mask, 0, kvc_mask_words(v->n_vocab) * sizeof(*mask));
    walk w = { .m = m, .mask = mask };
    const gstate s = *current(m);
    if (!s.done) {
        if (kvc_gmatch_is_complete(m))
            for (int32_t i = 0; i < v->n_eog; i++) {
                mask[v->eog[i] >> 5] |= 1u << (v->eog[i] & 31);
                w.count++;
            }
        walk_node(&w, 0, &s);
        drop_after_current(m);
    }
    m->stats.n_masks++;
    m->stats.nodes_visited += w.visited;
    m->stats.mask_us += kvc_time_us() - t0;
    return w.status != KVC_OK ? w.status : w.count;
}

kvc_gmatch_stats kvc_gmatch_get_stats(const kvc_gmatch *m)
{
    return m ? m->stats : (kvc_gmatch_stats){ 0 };
}
