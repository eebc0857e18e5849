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

/* --------------------------------------------------------------- the match */

/* What kvc_turn_prepare found cached for the turn's tokens [0, n), step by
 * step, and what it holds meanwhile (match_release gives it back). */
typedef struct match {
    kvc_pc_match     m;           /* the tree's blocks (and those the disk tier added) */
    int64_t          kv_len;      /* tokens of the session's that its sequence holds */
    int64_t          own;         /* of them, those the prompt starts with */
    int64_t          tree;        /* tokens the tree, the tail or a snapshot serve */
    int64_t          matched;     /* where the turn goes on from */
    int64_t          ram_end;     /* tokens of the tree's full blocks found in RAM */
    int64_t          disk;        /* blocks read from the disk tier */
    int32_t          tail;        /* a tail block read back (a reference we hold), -1 */
    int32_t          tail_len;    /* its tokens */
    struct kvc_snap *snap;        /* recurrent layers: the snapshot to restore (pinned) */
    float           *snap_logits; /* its logits when it serves the whole prompt (owned) */
    int64_t          moved;       /* tokens a context shift moved into place (0: none) */
} match;

/* The longest prefix of the turn's tokens that is cached (cache: the turn
 * may use the cache at all): the session's own K/V, the tree's blocks with
 * those the disk tier holds after them and the conversation's tail, or, for
 * recurrent layers, a state kept at exactly that length. KVC_OK;
 * KVC_TURN_WAIT_PREFIX when another turn is computing a block of the prompt;
 * KVC_ERR_NOMEM (t->err). Nothing is held but on KVC_OK. */
static int find_match(kvc_turn *t, bool cache, kvc_room_fn room, void *user, match *mt)
{
    kvc_session *s = t->s;
    kvc_context *c = s->ctx;
    kvc_kv_seq *seq = SEQ(t);
    const int64_t B = kvc_kv_block_tokens(c->pool), n = t->n_fill;
    *mt = (match){ .m = { .last = kvc_pc_root(c->pc) }, .tail = -1 };
    /* what is cached: the session's own tokens (as far as its sequence holds
     * them), and the tree's blocks, whoever computed them */
    mt->kv_len = KVC_MIN(seq->n_tokens, s->toks.n);
    mt->own = cache ? kvc_tokens_common(t->toks.v, n, s->toks.v, mt->kv_len) : 0;
    if (kvc_kv_n_groups(c->pool) > 1)        /* its window may be evicted (kv.h) */
        mt->own = kvc_kv_servable(c->pool, seq->blocks, mt->own);
    if (cache) {
        kvc_pc_lookup(c->pc, s->ns, t->toks.v, n, &mt->m);
        /* a block of the prompt in the works: wait for it, so that the tree
         * never has another turn's pending block on a running turn's path */
        if (mt->m.pending)
            return KVC_TURN_WAIT_PREFIX;
    }
    s->cold = !cache;                        /* what it will hold is not to be spilled */
    mt->ram_end = (int64_t)mt->m.n_full * B;
    if (cache && c->tiers) {
        mt->disk = kvc_session_fetch_disk(s, t->toks.v, n, &mt->m, mt->own, room, user);
        if (!c->snaps)                       /* a snapshot carries its own partial block */
            mt->tail_len = kvc_session_fetch_tail(s, t->toks.v, n, &mt->m, mt->own, room, user,
                                                  &mt->tail);
    }
    mt->tree = (int64_t)mt->m.n_full * B + KVC_MAX(mt->m.partial_len, mt->tail_len);
    mt->matched = KVC_MAX(mt->own, mt->tree);
    if (mt->matched >= n && t->kind != KVC_TURN_BACKGROUND)
        mt->matched = n - 1;                 /* logits are needed: run the last token again */
    mt->matched = KVC_MIN(mt->matched, n);
    /* recurrent layers: only where a state is kept (the session's own, or a
     * snapshot; with its logits, a whole prompt is served) */
    if (c->snaps && cache) {
        const bool logits = t->kind != KVC_TURN_BACKGROUND;
        mt->matched = kvc_session_snap_match(s, t->toks.v, n, mt->own, &mt->m, logits, &mt->snap);
        mt->own = mt->snap ? 0 : mt->matched;
        mt->tree = mt->snap ? mt->matched : 0;
        if (mt->matched == n && logits &&
            !(mt->snap_logits = malloc((size_t)c->model->hp.n_vocab * sizeof(float)))) {
            if (mt->snap)
                kvc_snaps_unpin(c->snaps, mt->snap);
            mt->snap = NULL;
            return kvc_fail(&t->err, KVC_ERR_NOMEM, "out of memory");
        }
    }
    return KVC_OK;
}

/* A context shift dropped turns (t->dropped): the kept ones are further on
 * in the session's cache; move their K/V into place (re-rotating K) rather
 * than compute them again, when that serves more than the match. Then
 * mt->moved is set, the match ends after them, and the tree's partial block
 * and the tail are of no use (let go); else nothing changes. */
static void shift_match(kvc_turn *t, match *mt, kvc_room_fn room, void *user)
{
    kvc_session *s = t->s;
    kvc_context *c = s->ctx;
    const int64_t n = t->n_fill, own = mt->own;
    int64_t k;
    const int64_t a = kvc_session_find_moved(t->toks.v, n, s->toks.v, mt->kv_len, own, &k);
    k = KVC_MIN(k, n - 1 - own);
    if (a < 0 || k < 1 || own + k <= mt->matched)
        return;
    kvc_pc_pin(mt->m.last);                  /* kept through the room shift_kv may make */
    kvc_pc_pin(mt->m.partial);
    kvc_err e2 = { 0 };
    const int rc = shift_kv(t, own, a, k, room, user, &e2);
    kvc_pc_unpin(mt->m.last);
    kvc_pc_unpin(mt->m.partial);
    if (rc)
        return;                              /* no room to copy a shared block: compute */
    mt->moved = k;
    mt->matched = own + k;
    mt->m.partial = NULL;                    /* the tree's partial block is of no use now */
    mt->m.partial_len = 0;
    if (mt->tail >= 0)                       /* nor the tail */
        kvc_kv_block_unref(c->pool, mt->tail);
    mt->tail = -1;
    mt->tail_len = 0;
    /* what was shifted differs from a cold run: kept from the tree */
    s->shifted = s->shifted >= 0 && s->shifted < own ? s->shifted : own;
}

/* What the session holds past its match is of no use to this conversation:
 * cut it (after a shift, the sequence was cut where the moved turns end).
 * The pool may keep less than asked (a recurrent state cannot be cut back):
 * the match shrinks to what is kept. */
static void cut_to_match(kvc_turn *t, match *mt)
{
    kvc_session *s = t->s;
    kvc_kv_seq *seq = SEQ(t);
    if (!mt->moved) {
        const int64_t kept = kvc_kv_seq_truncate(s->ctx->pool, seq, mt->own);
        if (kept < mt->own) {
            mt->own = kept;
            mt->matched = KVC_MIN(mt->matched, KVC_MAX(mt->own, mt->tree));
        }
    }
    if (s->shifted >= seq->n_tokens)         /* shifted positions are kept only where held */
        s->shifted = -1;
}

/* Let go of the tail block's reference and the snapshot's pin the match
 * holds (the sequence holds what it took of them). */
static void match_let_go(kvc_context *c, match *mt)
{
    if (mt->tail >= 0)
        kvc_kv_block_unref(c->pool, mt->tail);
    mt->tail = -1;
    if (mt->snap)
        kvc_snaps_unpin(c->snaps, mt->snap);
    mt->snap = NULL;
}

/* Give back all the match holds: match_let_go, and the logits freed. */
static void match_release(kvc_context *c, match *mt)
{
    match_let_go(c, mt);
    free(mt->snap_logits);
    mt->snap_logits = NULL;
}

/* Room for the blocks the turn still has to allocate (a partial block
 * matched may need a copy; a shifted sequence owns all of its blocks), and
 * for the running replies' next ones (ctx->growth_reserve), asking room
 * first (the match's tree nodes pinned meanwhile: they stay pinned on
 * success). Without it: false, with err saying what is short, and the match
 * given back (a shift undone: the session's tokens do not say shifted). */
static bool room_for(kvc_turn *t, match *mt, kvc_room_fn room, void *user, kvc_err *err)
{
    kvc_session *s = t->s;
    kvc_context *c = s->ctx;
    kvc_kv_seq *seq = SEQ(t);
    const int64_t B = kvc_kv_block_tokens(c->pool), n = t->n_fill;
    const int64_t fill_blocks = (n + B - 1) / B;
    int64_t need = mt->moved ? fill_blocks - seq->n_blocks
                             : fill_blocks - (mt->matched + B - 1) / B + (mt->matched % B != 0);
    need += c->growth_reserve;
    kvc_pc_pin(mt->m.last);
    kvc_pc_pin(mt->m.partial);
    if (kvc_kv_n_free(c->pool) - c->promised < need && room)
        room(c, c->promised + need, user);
    const int32_t win_short = window_short(c, seq);
    if (kvc_kv_n_free(c->pool) - c->promised >= need && !win_short)
        return true;
    kvc_pc_unpin(mt->m.last);
    kvc_pc_unpin(mt->m.partial);
    if (mt->moved) {
        kvc_kv_seq_truncate(c->pool, seq, mt->own);
        if (s->shifted >= mt->own)
            s->shifted = -1;
    }
    match_release(c, mt);                    /* the tail is still in the store for the next try */
    if (win_short)
        kvc_fail(err, KVC_ERR_KV_FULL, "KV cache full: the window chunks of memory group %d "
                 "are held by running requests", win_short);
    else
        kvc_fail(err, KVC_ERR_KV_FULL, "KV cache full: this request needs %lld more blocks of "
                 "%lld tokens; %lld are free, %lld promised to running requests",
                 (long long)need, (long long)B, (long long)kvc_kv_n_free(c->pool),
                 (long long)c->promised);
    return false;
}

/* Make the session's sequence the match: the moved K/V, the snapshot
 * restored, the tree's blocks attached, or its own cut to the match; the
 * tree's path up to it becomes the turn's anchor (m.last's pin passes to
 * it) and the turn's match figures are set. Returns the status of the
 * restore or attach (t->err); the match's holds are given back. */
static int take_match(kvc_turn *t, match *mt)
{
    kvc_session *s = t->s;
    kvc_context *c = s->ctx;
    kvc_kv_seq *seq = SEQ(t);
    const int64_t B = kvc_kv_block_tokens(c->pool);
    int rc = KVC_OK;
    int64_t kept_own;                        /* positions still the session's own K/V */
    if (mt->moved) {
        t->moved = mt->moved;
        kept_own = seq->n_tokens;
    } else if (mt->snap) {
        rc = kvc_snaps_restore(c->snaps, mt->snap, seq, mt->snap_logits, &t->err);
        kept_own = 0;
    } else if (mt->tree > mt->own) {
        rc = attach_tree(t, &mt->m, mt->tail, mt->own, mt->matched, &t->err);
        kept_own = KVC_MIN(mt->own, (int64_t)mt->m.n_full * B) / B * B;
    } else {
        kvc_kv_seq_truncate(c->pool, seq, mt->matched);
        kept_own = mt->matched;
    }
    match_let_go(c, mt);                     /* the sequence holds the tail now, or not */
    if (s->shifted >= kept_own)
        s->shifted = -1;
    if (s->shifted >= 0)
        t->pub_lim = (int32_t)(s->shifted / B);
    kvc_pc_unpin(mt->m.partial);
    t->anchor = mt->m.last == kvc_pc_root(c->pc) ? NULL : mt->m.last;   /* keeps its pin */
    t->n_pub = mt->m.n_full;
    if (t->n_preempted == 0)                 /* a resumed turn's stats are its first match's */
        t->matched = mt->matched;
    /* what of the match the disk gave: past the session's own and RAM's */
    if ((mt->disk > 0 || mt->tail_len > 0) && !mt->moved && t->n_preempted == 0)
        t->from_disk = KVC_MAX(0, KVC_MIN(mt->matched, (int64_t)mt->m.n_full * B + mt->tail_len) -
                                  KVC_MAX(mt->own, mt->ram_end));
    return rc;
}

/* ------------------------------------------------------------- prepare */

int kvc_turn_prepare(kvc_turn *t, kvc_room_fn room, void *user, kvc_err *err)
{
    if (t->phase != KVC_TURN_NEW)
        return KVC_OK;
    kvc_context *c = t->s->ctx;
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
    match mt;
    int rc = find_match(t, cache, room, user, &mt);
    if (rc == KVC_TURN_WAIT_PREFIX)
        return rc;
    if (rc) {
        *err = t->err;
        return turn_fail(t, rc);
    }
    if (cache && t->dropped > 0 && t->p.overflow == KVC_OVERFLOW_SHIFT && mt.own < n - 1)
        shift_match(t, &mt, room, user);
    cut_to_match(t, &mt);
    if (!room_for(t, &mt, room, user, err))
        return KVC_TURN_WAIT_MEMORY;
    rc = take_match(t, &mt);
    t->pub_off = !cache;
    t->phase = mt.matched < n ? KVC_TURN_PREFILL : KVC_TURN_DONE;   /* DONE: a background
                                                                     turn with nothing to do */
    if (!t->t_prefill)
        t->t_prefill = kvc_time_us();
    if (!rc) {
        turn_publish(t);                     /* the session's own full blocks */
        rc = kvc_kv_seq_reserve(c->pool, SEQ(t), n, &t->err);
    }
    if (rc) {
        match_release(c, &mt);
        *err = t->err;
        return turn_fail(t, rc);
    }
    for (int32_t i = t->n_pub; !t->pub_off && i < n / B && turn_enter_block(t, i, true); i++)
        ;
    keep_points(t);
    turn_update_promise(t);
    if (mt.snap_logits && t->phase == KVC_TURN_DONE) {   /* the whole prompt, with its logits */
        t->t_prompt_done = kvc_time_us();
        turn_on_logits(t, mt.snap_logits);
    }
    match_release(c, &mt);
    if (t->phase == KVC_TURN_DONE)
        turn_set_promise(t, 0);
    return KVC_OK;
}
