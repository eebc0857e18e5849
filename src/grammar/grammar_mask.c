/* grammar_mask.c - token masks: which tokens of the vocabulary the grammar
 * allows next. A walk down the vocabulary trie from the current state, with
 * the states it reaches interned and each (state, byte) transition computed
 * once per walk; whole masks are remembered per state (an LRU of
 * MASK_CACHE). Also the admission check (kvc_grammar_check_cost), which
 * runs masks over a greedy path. The matcher itself is grammar_match.c. */
#include "grammar_match_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- mask cache */

void gm_cache_drop(mcache *c)
{
    free(c->tops);
    free(c->mask);
    memset(c, 0, sizeof(*c));
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
    int rc = gm_advance(m, &in, byte, &next);
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
        if (!gm_spend(m, m->ws[id].n_tops)) {
            w->status = KVC_ERR_UNSUPPORTED;
            return false;
        }
        m->ws_rem[id] = gm_stacks_remaining(m, &m->ws[id]);
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
        if (!gm_spend(m, 1)) {
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
    gm_cache_drop(c);
    size_t words = kvc_mask_words(m->v->n_vocab);
    c->tops = malloc(((size_t)s->n_tops + 1) * sizeof(*c->tops));
    c->mask = malloc(words * sizeof(*c->mask));
    if (!c->tops || !c->mask) {
        gm_cache_drop(c);
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
    const gstate s = *gm_current(m);
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
        gm_drop_after_current(m);
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
