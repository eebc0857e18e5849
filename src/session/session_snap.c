/* session_snap.c - a turn's side of the recurrent snapshots (snapshot.h):
 * which cached length a prompt can continue from, and where a prefill stops
 * to take one (session.h). */
#include "session.h"
#include "snapshot.h"
#include "tokenizer.h"

/* Message starts: a control token with no other within this many tokens
 * after it (the last of a run of template markup, "<|im_end|>\n<|im_start|>"
 * or "<|start_header_id|>user<|end_header_id|>", just before a message's
 * text). */
#define MARK_GAP 8

int64_t kvc_session_snap_match(kvc_session *s, const int32_t *tokens, int64_t n, int64_t own,
                               kvc_pc_match *m, bool need_logits, kvc_snap **snap)
{
    kvc_context *c = s->ctx;
    const kvc_kv_seq *seq = &c->seqs[s->seq];
    const int64_t B = kvc_kv_block_tokens(c->pool);
    *snap = NULL;
    /* the session's own state serves only the length it is at */
    int64_t kept = own == seq->n_tokens && (own < n || !need_logits) ? own : 0;
    /* a snapshot brings the K/V of its partial block with it (snapshot.h):
     * one up to B - 1 tokens past the tree's full blocks serves, whether or
     * not the tree has a partial match there (after a restart it has none) */
    int64_t limit = KVC_MIN(n, KVC_MAX(own, (int64_t)m->n_full * B + B - 1));
    kvc_snap *sn = limit > kept ? kvc_snaps_find(c->snaps, s->ns, m->last, tokens, limit,
                                                 need_logits ? n : -1) : NULL;
    int64_t best = KVC_MAX(kept, sn ? kvc_snap_pos(sn) : 0);
    if (c->tiers && limit > best) {          /* a longer one below RAM (after a restart) */
        kvc_pc_pin(m->last);                 /* kept through the room made for it */
        if (sn)
            kvc_snaps_pin(c->snaps, sn);
        int64_t cost = kvc_snaps_cost(c->snaps, 1, true);
        kvc_snap *disk = NULL;
        if (kvc_kv_n_free(c->pool) - c->promised >= cost ||
            kvc_context_make_room(c, c->promised + cost))
            disk = kvc_snaps_fetch(c->snaps, s->ns, m->last, tokens, limit,
                                   need_logits ? n : -1, best);
        if (sn)
            kvc_snaps_unpin(c->snaps, sn);
        if (disk)
            sn = disk;
        kvc_pc_unpin(m->last);
    }
    if (sn && kvc_snap_pos(sn) > kept) {
        kvc_snaps_pin(c->snaps, sn);
        *snap = sn;
        kept = kvc_snap_pos(sn);
        m->last = kvc_snap_node(sn);
        m->n_full = m->last->depth + 1;
    } else {   /* the tree's blocks beyond the own state serve nothing */
        while (m->last->parent && (int64_t)(m->last->depth + 1) * B > kept) {
            m->last = m->last->parent;
            m->n_full--;
        }
    }
    m->partial = NULL;
    m->partial_len = 0;
    return kept;
}

/* Whether the state after tokens[0, q) is to be kept: q a message start or a
 * multiple of the interval (the prompt's end is the caller's). Message starts
 * are marks[0, n_marks) when the turn has them (ascending, from the
 * template's rendering), else guessed from the template's markup. */
static bool snap_point(const kvc_context *c, const int32_t *tokens, int64_t n, int64_t q,
                       const int32_t *marks, int64_t n_marks)
{
    if (q <= 0 || q >= n)
        return false;
    if (c->snap_interval > 0 && q % c->snap_interval == 0)
        return true;
    if (q + MARK_GAP >= n)
        return false;                        /* the prompt's end serves: it is that close */
    if (n_marks > 0) {
        int64_t lo = 0, hi = n_marks;
        while (lo < hi) {
            int64_t mid = (lo + hi) / 2;
            if (marks[mid] < q)
                lo = mid + 1;
            else
                hi = mid;
        }
        return lo < n_marks && marks[lo] == q;
    }
    const kvc_tokenizer *tok = c->model->tok;
    if (kvc_tokenizer_token_type(tok, tokens[q]) != KVC_TOKEN_CONTROL)
        return false;
    for (int64_t i = q + 1; i < KVC_MIN(n, q + 1 + MARK_GAP); i++)
        if (kvc_tokenizer_token_type(tok, tokens[i]) == KVC_TOKEN_CONTROL)
            return false;
    return true;
}

int64_t kvc_session_snap_next(const kvc_context *c, const int32_t *tokens, int64_t n, int64_t from,
                              const int32_t *marks, int64_t n_marks)
{
    for (int64_t q = from + 1; q < n; q++)
        if (snap_point(c, tokens, n, q, marks, n_marks))
            return q;
    return n;
}

bool kvc_session_snap_due(const kvc_context *c, const int32_t *tokens, int64_t n, int64_t q,
                          const int32_t *marks, int64_t n_marks)
{
    return q == n || snap_point(c, tokens, n, q, marks, n_marks);
}

void kvc_session_snap_take(kvc_session *s, kvc_pc_node *anchor, const int32_t *tokens,
                           const float *logits)
{
    kvc_context *c = s->ctx;
    kvc_kv_seq *seq = &c->seqs[s->seq];
    const int64_t B = kvc_kv_block_tokens(c->pool), P = seq->n_tokens;
    kvc_pc_node *node = anchor ? anchor : kvc_pc_root(c->pc);
    if (P < 1 || (int64_t)(node->depth + 1) < P / B)
        return;                              /* its blocks are not all in the tree */
    while ((int64_t)(node->depth + 1) > P / B)
        node = node->parent;
    const int64_t cost = kvc_snaps_cost(c->snaps, P, logits != NULL);
    if (kvc_kv_n_free(c->pool) - c->promised < cost &&
        !kvc_context_make_room(c, c->promised + cost))
        return;                              /* no room: the cache goes without */
    kvc_err e = { 0 };
    kvc_snaps_take(c->snaps, s->ns, node, tokens, seq, logits, &e);
}
