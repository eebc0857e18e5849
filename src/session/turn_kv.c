/* turn_kv.c - a turn's blocks (turn.h): the blocks it may still allocate,
 * promised (ctx->promised) so that admission keeps them free; each full block
 * entered in the prefix tree as it is computed (pending until then), so that
 * what any turn computed can be found by any other; and, when the pool runs
 * dry mid-decode, the newest turns preempted: their blocks given back (down
 * a tier) and read back or recomputed later (DESIGN.md §5). */
#include "turn.h"

#include <stdlib.h>

/* ------------------------------------------------------------- promises */

void turn_set_promise(kvc_turn *t, int64_t promise)
{
    t->s->ctx->promised += promise - t->promise;
    t->promise = promise;
    KVC_ASSERT(promise >= 0 && t->s->ctx->promised >= promise);
}

void turn_update_promise(kvc_turn *t)
{
    const int64_t B = kvc_kv_block_tokens(t->s->ctx->pool);
    turn_set_promise(t, KVC_MAX(0, (t->n_fill + B - 1) / B - SEQ(t)->n_blocks));
}

/* ------------------------------------------------- the prefix tree side */

bool turn_enter_block(kvc_turn *t, int32_t i, bool pending)
{
    kvc_context *c = t->s->ctx;
    const int32_t B = kvc_kv_block_tokens(c->pool);
    kvc_pc_node *parent = t->anchor ? t->anchor : kvc_pc_root(c->pc), *n = NULL;
    kvc_err e = { 0 };
    if (i >= t->pub_lim) {              /* K/V moved by a context shift: not a cold run's */
        t->pub_off = true;
        return false;
    }
    int rc = kvc_pc_insert(c->pc, t->s->ns, parent, t->toks.v + (int64_t)i * B,
                           SEQ(t)->blocks[i], pending, &n, &e);
    if (rc < 0)
        t->pub_off = true;
    if (rc < 0 || (rc == 0 && n->pending))
        return false;
    if (rc == 1 && pending) {
        if (t->n_pend == 0)
            t->pend_first = i;
        t->pend[t->n_pend++] = n;
    }
    kvc_pc_pin(n);
    kvc_pc_unpin(t->anchor);
    t->anchor = n;
    t->n_pub = i + 1;
    return true;
}

void turn_publish(kvc_turn *t)
{
    kvc_context *c = t->s->ctx;
    const int64_t B = kvc_kv_block_tokens(c->pool), done = SEQ(t)->n_tokens;
    while (t->n_pend_ready < t->n_pend && (t->pend_first + t->n_pend_ready + 1) * B <= done)
        kvc_pc_set_ready(c->pc, t->pend[t->n_pend_ready++]);
    while (!t->pub_off && (int64_t)(t->n_pub + 1) * B <= done &&
           turn_enter_block(t, t->n_pub, false))
        ;
}

void turn_drop_pending(kvc_turn *t)
{
    kvc_context *c = t->s->ctx;
    if (t->n_pend_ready == t->n_pend)
        return;
    kvc_pc_unpin(t->anchor);
    t->anchor = NULL;
    for (int32_t k = t->n_pend - 1; k >= t->n_pend_ready; k--)
        kvc_pc_remove(c->pc, t->pend[k]);
    t->n_pend = t->n_pend_ready;
    t->pub_off = true;
}

/* ------------------------------------------------------------ preemption */

int kvc_turn_preempt(kvc_turn *t)
{
    if (t->phase != KVC_TURN_PREFILL && t->phase != KVC_TURN_DECODE)
        return KVC_ERR_INVALID_ARG;
    kvc_context *c = t->s->ctx;
    const int64_t B = kvc_kv_block_tokens(c->pool);
    turn_publish(t);
    turn_drop_pending(t);                    /* blocks of the prompt not computed yet */
    if (c->tiers && t->anchor)               /* down a tier: read back, not recomputed */
        kvc_tiers_write_path(c->tiers, t->anchor);
    kvc_pc_unpin(t->anchor);
    t->anchor = NULL;
    t->n_pub = 0;
    t->n_pend = t->n_pend_ready = 0;
    kvc_kv_seq_truncate(c->pool, SEQ(t), 0);
    turn_set_promise(t, 0);
    if (t->phase == KVC_TURN_DECODE) {
        /* every token so far is prefilled again, the last one sampled too: its
         * logits give the next token, as a decode step would have */
        t->n_fill = t->toks.n;
        kvc_pc_node **pend = realloc(t->pend, (size_t)(t->n_fill / B + 1) * sizeof(*pend));
        if (!pend)
            return turn_fail(t, kvc_fail(&t->err, KVC_ERR_NOMEM, "out of memory"));
        t->pend = pend;
    }
    t->n_preempted++;
    t->phase = KVC_TURN_NEW;
    return KVC_OK;
}

/* Blocks turn t needs for its next step beyond what it holds. */
static int64_t next_step_blocks(const kvc_turn *t)
{
    if (t->phase != KVC_TURN_DECODE)
        return 0;                            /* a prefill's blocks were reserved at prepare */
    return kvc_kv_seq_reserve_need(t->s->ctx->pool, SEQ(t), t->toks.n);
}

int32_t kvc_turns_grow(kvc_context *c, kvc_turn **turns, int32_t n, kvc_room_fn room, void *user)
{
    for (;;) {
        int64_t need = 0;
        for (int32_t i = 0; i < n; i++)
            need += next_step_blocks(turns[i]);
        if (need <= kvc_kv_n_free(c->pool) - c->promised ||
            (room && room(c, c->promised + need, user)) || n <= 1)
            return n;
        kvc_turn_preempt(turns[--n]);        /* the newest gives way */
    }
}
