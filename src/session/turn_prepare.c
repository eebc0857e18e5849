/* turn_prepare.c - a turn's NEW -> PREFILL step (turn.h, DESIGN.md §3):
 * its prompt matched against what is cached (the session's own K/V, the
 * prefix tree, the tiers below RAM through session_fetch.c, a recurrent
 * snapshot through session_snap.c), the session's K/V past the match cut
 * (or, after a context shift, moved to the kept turns' new positions), the
 * tree's blocks attached, the rest of the prompt's blocks reserved and
 * entered in the tree as pending. */
#include "snapshot.h"
#include "turn.h"

#include <stdlib.h>

/* ------------------------------------------------------- the tree's blocks */

/* Give the sequence (which holds `own` tokens of its own, all matching) the
 * tree's blocks of the match m, up to `len` tokens; its last block `tail` (a
 * tail read from the store, kvc_session_fetch_tail) when not -1, else m's
 * partial one. */
static int attach_tree(kvc_turn *t, const kvc_pc_match *m, int32_t tail, int64_t own, int64_t len,
                       kvc_err *err)
{
    kvc_context *c = t->s->ctx;
    kvc_kv_seq *seq = SEQ(t);
    const int64_t B = kvc_kv_block_tokens(c->pool);
    int32_t keep = (int32_t)(KVC_MIN(own, (int64_t)m->n_full * B) / B);
    /* a window group may keep fewer of its own (their window evicted): the
     * tree's blocks take their place */
    keep = (int32_t)(kvc_kv_seq_truncate(c->pool, seq, (int64_t)keep * B) / B);
    int32_t nb = m->n_full - keep + (m->partial || tail >= 0 ? 1 : 0);
    int32_t *blocks = malloc((size_t)KVC_MAX(nb, 1) * sizeof(int32_t));
    if (!blocks)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    for (const kvc_pc_node *n = m->last; n->depth >= keep; n = n->parent)
        blocks[n->depth - keep] = n->block;
    if (tail >= 0)
        blocks[nb - 1] = tail;
    else if (m->partial)
        blocks[nb - 1] = m->partial->block;
    int rc = kvc_kv_seq_append_blocks(c->pool, seq, blocks, nb, err);
    free(blocks);
    kvc_kv_seq_truncate(c->pool, seq, len);
    return rc;
}

/* ------------------------------------------------------- context shift */

/* Move the K/V of positions [a, a + k) of the session's sequence to [own,
 * own + k), K re-rotated by own - a, in place (a > own: every row is read
 * before it is overwritten), and cut the sequence at own + k. Blocks written
 * must be the sequence's alone: the tree's nodes of the old path past own that
 * nothing else uses are taken out of the tree first (their K/V will no longer
 * be what their tokens compute cold), and a block still shared is copied
 * (room may be asked for those). KVC_ERR_KV_FULL when no copy fits: nothing
 * is changed then. */
static int shift_kv(kvc_turn *t, int64_t own, int64_t a, int64_t k, kvc_room_fn room,
                    void *user, kvc_err *err)
{
    kvc_session *s = t->s;
    kvc_context *c = s->ctx;
    kvc_kv_pool *pool = c->pool;
    kvc_kv_seq *seq = SEQ(t);
    const int64_t B = kvc_kv_block_tokens(pool), kv_len = KVC_MIN(seq->n_tokens, s->toks.n);
    const int32_t first = (int32_t)(own / B), last = (int32_t)((own + k - 1) / B);
    kvc_pc_match mo;
    kvc_pc_lookup(c->pc, s->ns, s->toks.v, kv_len, &mo);
    for (kvc_pc_node *nd = mo.last; nd && nd != kvc_pc_root(c->pc) && nd->depth >= first;) {
        kvc_pc_node *parent = nd->parent;
        if (nd->n_children || nd->pins || nd->pending || nd->depth >= seq->n_blocks ||
            seq->blocks[nd->depth] != nd->block || kvc_kv_block_refcount(pool, nd->block) != 2)
            break;
        kvc_pc_remove(c->pc, nd);
        nd = parent;
    }
    /* window groups: the blocks rewritten keep (and the sequence holds)
     * their window chunks, else recompute */
    int rc = kvc_kv_seq_hold_back(pool, seq, own, err);
    if (rc)
        return rc;
    int64_t n_cow = 0;
    for (int32_t i = first; i <= last; i++)
        n_cow += kvc_kv_block_refcount(pool, seq->blocks[i]) > 1;
    if (n_cow && kvc_kv_n_free(pool) - c->promised < n_cow && room)
        room(c, c->promised + n_cow, user);
    if (kvc_kv_n_free(pool) - c->promised < n_cow)
        return kvc_fail(err, KVC_ERR_KV_FULL, "KV cache full during a context shift");
    rc = kvc_kv_seq_make_private(pool, seq, first, last + 1, err);   /* counted free above */
    if (rc)
        return rc;
    rc = kvc_compute_move_kv(c->compute, pool, seq->blocks, a, seq->blocks, own, k, err);
    kvc_kv_seq_truncate(pool, seq, rc ? own : own + k);
    return rc;
}

/* ------------------------------------------------------------- admission */

/* Sliding-window layers: the windows of the points where a later request
 * is likely to diverge, each message start and the prompt's end, are evicted
 * last (kvc_kv_seq_keep), so an edit or a branch deep in a long conversation
 * still hits. */
static void keep_points(kvc_turn *t)
{
    kvc_context *c = t->s->ctx;
    if (kvc_kv_n_groups(c->pool) == 1)
        return;
    for (int64_t i = 0; i < t->marks.n; i++)
        if (t->marks.v[i] < t->n_prompt)
            kvc_kv_seq_keep(c->pool, SEQ(t), t->marks.v[i]);
    kvc_kv_seq_keep(c->pool, SEQ(t), t->n_prompt);
}

/* Admission, per window group (kv.h): the first group whose chunks held by
 * other sequences leave fewer than a running sequence holds
 * (kvc_kv_window_need), or 0. Chunks no sequence holds are evicted as
 * needed, so those are all a turn can lack. */
static int32_t window_short(const kvc_context *c, const kvc_kv_seq *seq)
{
    for (int32_t g = 1; g < kvc_kv_n_groups(c->pool); g++) {
        const int64_t others = kvc_kv_group_n_held(c->pool, g) - (seq->to[g] - seq->from[g]);
        if (others + kvc_kv_window_need(c->pool, g, c->p.n_batch) > kvc_kv_group_of(c->pool, g)->n_blocks)
            return g;
    }
    return 0;
}

/* ------------------------------------------------------------- prepare */

int kvc_turn_prepare(kvc_turn *t, kvc_room_fn room, void *user, kvc_err *err)
{
    if (t->phase != KVC_TURN_NEW)
        return KVC_OK;
    kvc_session *s = t->s;
    kvc_context *c = s->ctx;
    kvc_kv_seq *seq = SEQ(t);
    const int64_t B = kvc_kv_block_tokens(c->pool), n = t->n_fill;
    /* no_cache: a cold run, sharing nothing with the warm path: it neither
     * reuses nor publishes a block */
    const bool cache = !t->p.no_cache;
    if (c->snaps && t->dropped > 0) {
        kvc_fail(&t->err, KVC_ERR_CONTEXT_LENGTH, "the messages have %lld tokens more than this "
                 "model's context of %lld holds, and a context shift (--context-overflow=shift) "
                 "cannot drop turns for a model with recurrent layers: their state summarises "
                 "every token and cannot be moved", (long long)t->dropped, (long long)c->p.n_ctx);
        *err = t->err;
        return turn_fail(t, KVC_ERR_CONTEXT_LENGTH);
    }

    /* what is cached: the session's own tokens (as far as its sequence holds
     * them), and the tree's blocks, whoever computed them */
    int64_t kv_len = KVC_MIN(seq->n_tokens, s->toks.n);
    int64_t own = cache ? kvc_tokens_common(t->toks.v, n, s->toks.v, kv_len) : 0;
    if (kvc_kv_n_groups(c->pool) > 1)        /* its window may be evicted (kv.h) */
        own = kvc_kv_servable(c->pool, seq->blocks, own);
    kvc_pc_match m = { .last = kvc_pc_root(c->pc) };
    if (cache) {
        kvc_pc_lookup(c->pc, t->s->ns, t->toks.v, n, &m);
        /* a block of the prompt in the works: wait for it, so that the tree
         * never has another turn's pending block on a running turn's path */
        if (m.pending)
            return KVC_TURN_WAIT_PREFIX;
    }
    s->cold = !cache;                        /* what it will hold is not to be spilled */
    int64_t ram_end = (int64_t)m.n_full * B, disk = 0;
    int32_t tail = -1, tail_len = 0;
    if (cache && c->tiers) {
        disk = kvc_session_fetch_disk(s, t->toks.v, n, &m, own, room, user);
        if (!c->snaps)                       /* a snapshot carries its own partial block */
            tail_len = kvc_session_fetch_tail(s, t->toks.v, n, &m, own, room, user, &tail);
    }
    int64_t tree = (int64_t)m.n_full * B + KVC_MAX(m.partial_len, tail_len);
    int64_t matched = KVC_MAX(own, tree);
    if (matched >= n && t->kind != KVC_TURN_BACKGROUND)
        matched = n - 1;                     /* logits are needed: run the last token again */
    matched = KVC_MIN(matched, n);
    /* recurrent layers: only where a state is kept (the session's own, or a
     * snapshot; with its logits, a whole prompt is served) */
    struct kvc_snap *snap = NULL;
    float *snap_logits = NULL;
    if (c->snaps && cache) {
        const bool logits = t->kind != KVC_TURN_BACKGROUND;
        matched = kvc_session_snap_match(s, t->toks.v, n, own, &m, logits, &snap);
        own = snap ? 0 : matched;
        tree = snap ? matched : 0;
        if (matched == n && logits &&
            !(snap_logits = malloc((size_t)c->model->hp.n_vocab * sizeof(float)))) {
            if (snap)
                kvc_snaps_unpin(c->snaps, snap);
            kvc_fail(&t->err, KVC_ERR_NOMEM, "out of memory");
            *err = t->err;
            return turn_fail(t, KVC_ERR_NOMEM);
        }
    }

    /* a context shift: the kept turns are further on in the session's cache;
     * move them (re-rotating K) rather than compute them again */
    int64_t sh_a = -1, sh_k = 0;
    if (cache && t->dropped > 0 && t->p.overflow == KVC_OVERFLOW_SHIFT && own < n - 1) {
        sh_a = kvc_session_find_moved(t->toks.v, n, s->toks.v, kv_len, own, &sh_k);
        sh_k = KVC_MIN(sh_k, n - 1 - own);
        if (sh_a < 0 || sh_k < 1 || own + sh_k <= matched)
            sh_k = 0;
        else {
            kvc_pc_pin(m.last);              /* kept through the room shift_kv may make */
            kvc_pc_pin(m.partial);
            kvc_err e2 = { 0 };
            if (shift_kv(t, own, sh_a, sh_k, room, user, &e2))
                sh_k = 0;                    /* no room to copy a shared block: compute */
            kvc_pc_unpin(m.last);
            kvc_pc_unpin(m.partial);
        }
        if (sh_k) {
            matched = own + sh_k;
            m.partial = NULL;                /* the tree's partial block is of no use now */
            m.partial_len = 0;
            if (tail >= 0)                   /* nor the tail */
                kvc_kv_block_unref(c->pool, tail);
            tail = -1;
            tail_len = 0;
            /* what was shifted differs from a cold run: kept from the tree */
            s->shifted = s->shifted >= 0 && s->shifted < own ? s->shifted : own;
        }
    }
    /* what the session holds past its match is of no use to this conversation;
     * the pool may keep less than asked (a recurrent state cannot be cut back) */
    if (!sh_k) {
        const int64_t kept = kvc_kv_seq_truncate(c->pool, seq, own);
        if (kept < own) {
            own = kept;
            matched = KVC_MIN(matched, KVC_MAX(own, tree));
        }
    }
    if (s->shifted >= seq->n_tokens)         /* shifted positions are kept only where held */
        s->shifted = -1;
    /* blocks still to allocate (a partial block matched may need a copy; the
     * shifted sequence owns all of its blocks) */
    const int64_t fill_blocks = (n + B - 1) / B;
    int64_t need = sh_k ? fill_blocks - seq->n_blocks
                        : fill_blocks - (matched + B - 1) / B + (matched % B != 0);
    need += c->growth_reserve;               /* running replies' next blocks stay free */
    kvc_pc_pin(m.last);
    kvc_pc_pin(m.partial);
    if (kvc_kv_n_free(c->pool) - c->promised < need && room)
        room(c, c->promised + need, user);
    const int32_t win_short = window_short(c, seq);
    if (kvc_kv_n_free(c->pool) - c->promised < need || win_short) {
        kvc_pc_unpin(m.last);
        kvc_pc_unpin(m.partial);
        if (sh_k) {                          /* the session's tokens do not say shifted */
            kvc_kv_seq_truncate(c->pool, seq, own);
            if (s->shifted >= own)
                s->shifted = -1;
        }
        if (tail >= 0)                       /* still in the store for the next try */
            kvc_kv_block_unref(c->pool, tail);
        if (snap)
            kvc_snaps_unpin(c->snaps, snap);
        free(snap_logits);
        if (win_short)
            kvc_fail(err, KVC_ERR_KV_FULL, "KV cache full: the window chunks of memory group %d "
                     "are held by running requests", win_short);
        else
            kvc_fail(err, KVC_ERR_KV_FULL, "KV cache full: this request needs %lld more blocks of "
                     "%lld tokens; %lld are free, %lld promised to running requests",
                     (long long)need, (long long)B, (long long)kvc_kv_n_free(c->pool),
                     (long long)c->promised);
        return KVC_TURN_WAIT_MEMORY;
    }
    int rc = KVC_OK;
    int64_t kept_own;                        /* positions still the session's own K/V */
    if (sh_k) {
        t->moved = sh_k;
        kept_own = seq->n_tokens;
    } else if (snap) {
        rc = kvc_snaps_restore(c->snaps, snap, seq, snap_logits, &t->err);
        kvc_snaps_unpin(c->snaps, snap);
        kept_own = 0;
    } else if (tree > own) {
        rc = attach_tree(t, &m, tail, own, matched, &t->err);
        kept_own = KVC_MIN(own, (int64_t)m.n_full * B) / B * B;
    } else {
        kvc_kv_seq_truncate(c->pool, seq, matched);
        kept_own = matched;
    }
    if (tail >= 0)                           /* the sequence holds it now, or let it go */
        kvc_kv_block_unref(c->pool, tail);
    if (s->shifted >= kept_own)
        s->shifted = -1;
    if (s->shifted >= 0)
        t->pub_lim = (int32_t)(s->shifted / B);
    kvc_pc_unpin(m.partial);
    t->anchor = m.last == kvc_pc_root(c->pc) ? NULL : m.last;   /* keeps its pin */
    t->n_pub = m.n_full;
    if (t->n_preempted == 0)                 /* a resumed turn's stats are its first match's */
        t->matched = matched;
    /* what of the match the disk gave: past the session's own and RAM's */
    if ((disk > 0 || tail_len > 0) && !sh_k && t->n_preempted == 0)
        t->from_disk = KVC_MAX(0, KVC_MIN(matched, (int64_t)m.n_full * B + tail_len) -
                                  KVC_MAX(own, ram_end));
    t->pub_off = !cache;
    t->phase = matched < n ? KVC_TURN_PREFILL : KVC_TURN_DONE;   /* DONE: a background
                                                                  turn with nothing to do */
    if (!t->t_prefill)
        t->t_prefill = kvc_time_us();
    if (rc) {
        *err = t->err;
        return turn_fail(t, rc);
    }
    turn_publish(t);                         /* the session's own full blocks */
    if ((rc = kvc_kv_seq_reserve(c->pool, seq, n, &t->err))) {
        *err = t->err;
        return turn_fail(t, rc);
    }
    for (int32_t i = t->n_pub; !t->pub_off && i < n / B && turn_enter_block(t, i, true); i++)
        ;
    keep_points(t);
    turn_update_promise(t);
    if (snap_logits && t->phase == KVC_TURN_DONE) {   /* the whole prompt, with its logits */
        t->t_prompt_done = kvc_time_us();
        turn_on_logits(t, snap_logits);
    }
    free(snap_logits);
    if (t->phase == KVC_TURN_DONE)
        turn_set_promise(t, 0);
    return KVC_OK;
}
