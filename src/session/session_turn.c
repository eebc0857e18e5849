/* session_turn.c - a turn's life (session.h, turn.h): made from a request
 * and checked against the context and the pool, stepped with other turns
 * through one forward pass (decode tokens first, then prefill chunks), the
 * sequence snapshotted on the way for recurrent layers, cancelled, and ended
 * into the session's conversation and the request's figures. Its other jobs:
 * turn_prepare.c (the match), turn_kv.c (its blocks), turn_reply.c (the
 * reply's text). */
#include "chat_template.h"
#include "sampler.h"
#include "turn.h"
#include "unicode.h"

#include <stdlib.h>
#include <string.h>

int turn_fail(kvc_turn *t, int rc)
{
    if (!t->rc)
        t->rc = rc;
    t->phase = KVC_TURN_DONE;
    return rc;
}

/* ----------------------------------------------------------------- new */

int kvc_turn_new(kvc_session *s, const int32_t *tokens, int64_t n_tokens, int kind,
                 const kvc_chat_params *params, kvc_turn_stream_fn stream, void *user,
                 int64_t t_start, kvc_turn **out, kvc_err *err)
{
    *out = NULL;
    kvc_context *c = s->ctx;
    kvc_turn *t = calloc(1, sizeof(*t));
    if (!t)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    t->s = s;
    t->p = params ? *params : kvc_chat_default_params();
    t->stream = stream;
    t->user = user;
    t->kind = kind;
    t->reply_end = -1;
    t->pub_lim = INT32_MAX;
    t->t_start = t_start;
    int rc = kvc_sampler_params_check(&t->p.sampling, err);
    if (!rc && t->p.max_tokens < 0)
        rc = kvc_fail(err, KVC_ERR_INVALID_ARG, "max_tokens %d is negative", t->p.max_tokens);
    if (!rc && n_tokens > 0 && kvc_tokbuf_reserve(&t->toks, n_tokens))
        rc = kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    if (!rc && n_tokens > 0) {
        memcpy(t->toks.v, tokens, (size_t)n_tokens * sizeof(int32_t));
        t->toks.n = n_tokens;
    }
    const int64_t n = t->n_prompt = t->toks.n, n_ctx = c->p.n_ctx;
    const int64_t B = kvc_kv_block_tokens(c->pool), pool_blocks = kvc_kv_n_blocks(c->pool);
    if (!rc && n == 0)
        rc = kvc_fail(err, KVC_ERR_INVALID_ARG, "the prompt has no tokens: it is empty and "
                      "this model's vocabulary adds no BOS token to begin from");
    const bool bg = kind == KVC_TURN_BACKGROUND;   /* it generates nothing */
    const int64_t room = n_ctx - n;                  /* reply tokens the context leaves */
    if (!rc && (bg ? room < 0 : room < 1 || (t->p.max_tokens > 0 && t->p.max_tokens > room)))
        rc = kvc_fail(err, KVC_ERR_CONTEXT_LENGTH,
                      "this model's maximum context length is %lld tokens; the messages have %lld "
                      "tokens and %d more were requested for the reply",
                      (long long)n_ctx, (long long)n, t->p.max_tokens > 0 ? t->p.max_tokens : 1);
    /* the pool must hold the whole sequence, and a block copied on write */
    int64_t max_out = bg ? 0 : t->p.max_tokens > 0 ? t->p.max_tokens
                                                   : KVC_MIN(room, (pool_blocks - 1) * B - n);
    if (!rc && ((!bg && max_out < 1) || (n + max_out + B - 1) / B + 1 > pool_blocks))
        rc = kvc_fail(err, KVC_ERR_KV_FULL,
                      "the KV cache holds %lld tokens (%lld blocks of %lld); the messages have "
                      "%lld tokens and %lld more were requested for the reply",
                      (long long)((pool_blocks - 1) * B), (long long)pool_blocks, (long long)B,
                      (long long)n, (long long)KVC_MAX(max_out, 1));
    if (!rc) {
        t->max_out = (int32_t)max_out;
        t->max_blocks = (n + max_out + B - 1) / B;
        t->n_fill = n;
        t->pend = malloc((size_t)(n / B + 1) * sizeof(kvc_pc_node *));
        t->smp = kvc_sampler_new(&t->p.sampling, c->model->hp.n_vocab);
        if (!t->pend || !t->smp)
            rc = kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
        else if (!bg)
            rc = turn_sample_init(&t->ts, c, &t->p, t->smp, err);
    }
    if (rc) {
        t->phase = KVC_TURN_DONE;
        kvc_turn_end(t, NULL, NULL, NULL);
        return rc;
    }
    for (int64_t i = 0; i < n; i++)
        kvc_sampler_accept(t->smp, t->toks.v[i]);
    static const char *const no_stops[] = { NULL };
    const bool chat = kind == KVC_TURN_CHAT;
    t->st = (stops){ chat ? kvc_chat_template_stop_list(s->tmpl) : no_stops, t->p.stop, t->p.n_stop };
    t->sep = chat ? kvc_chat_template_sep(s->tmpl) : "";
    t->phase = KVC_TURN_NEW;
    *out = t;
    return KVC_OK;
}

int kvc_turn_phase(const kvc_turn *t) { return t->phase; }
void kvc_turn_set_dropped(kvc_turn *t, int32_t dropped) { t->dropped = dropped; }

int kvc_turn_set_marks(kvc_turn *t, const int32_t *marks, int64_t n, kvc_err *err)
{
    t->marks.n = 0;
    if (n > 0 && kvc_tokbuf_reserve(&t->marks, n))
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    if (n > 0)
        memcpy(t->marks.v, marks, (size_t)n * sizeof(int32_t));
    t->marks.n = KVC_MAX(n, 0);
    return KVC_OK;
}
kvc_session *kvc_turn_session(const kvc_turn *t) { return t->s; }
void kvc_turn_take_logprobs(kvc_turn *t, kvc_token_logprob **out, int32_t *n)
{
    turn_sample_take_logprobs(&t->ts, out, n);
}

void kvc_turn_prompt_stats(const kvc_turn *t, kvc_chat_stats *stats)
{
    stats->prompt_tokens = (int32_t)t->n_prompt;
    stats->cached_tokens = (int32_t)t->matched;
    stats->cached_disk_tokens = (int32_t)t->from_disk;
}

const int32_t *kvc_turn_tokens(const kvc_turn *t, int64_t *n)
{
    *n = t->toks.n;
    return t->toks.v;
}

void kvc_turn_cancel(kvc_turn *t)
{
    switch (t->phase) {
    case KVC_TURN_NEW:
        t->finish = "cancelled";
        t->phase = KVC_TURN_DONE;
        break;
    case KVC_TURN_PREFILL:
        t->finish = "cancelled";
        t->t_end = kvc_time_us();
        turn_drop_pending(t);
        t->phase = KVC_TURN_DONE;
        break;
    case KVC_TURN_DECODE:
        t->cancelled = true;
        turn_finish(t, "cancelled");
        break;
    default:
        break;
    }
}

/* ---------------------------------------------------------------- step */

/* Add the turn's tokens for this step to items (at most cap). */
static int32_t turn_batch(kvc_turn *t, kvc_batch_item *items, int32_t cap)
{
    kvc_context *c = t->s->ctx;
    kvc_kv_seq *seq = SEQ(t);
    int64_t from = seq->n_tokens;
    int64_t to = t->phase == KVC_TURN_PREFILL ? t->n_fill : t->toks.n;
    KVC_ASSERT(from <= to);              /* the sequence holds a prefix of the turn's tokens */
    const bool logits = t->kind != KVC_TURN_BACKGROUND;
    if (t->phase != KVC_TURN_PREFILL) {
        /* a decode token may start a new block: the sequence grows (the
         * engine made room, kvc_turns_grow; alone, the tree gives way) */
        int64_t want = kvc_kv_seq_reserve_need(c->pool, seq, to);
        if (want > kvc_kv_n_free(c->pool) - c->promised)
            kvc_context_make_room(c, c->promised + want);
        int rc = kvc_kv_seq_reserve(c->pool, seq, to, &t->err);
        if (rc) {
            turn_fail(t, rc);
            return 0;
        }
        turn_update_promise(t);
    }
    const int64_t end = to;
    if (c->snaps && t->phase == KVC_TURN_PREFILL && !t->pub_off)
        to = kvc_session_snap_next(c, t->toks.v, to, from, t->marks.v, t->marks.n);
    int32_t k = (int32_t)KVC_MIN((int64_t)cap, to - from);
    for (int32_t i = 0; i < k; i++) {
        int64_t pos = from + i;
        items[i] = (kvc_batch_item){ t->toks.v[pos], (int32_t)pos, seq, pos == end - 1 && logits };
    }
    return k;
}

/* The forward pass wrote the turn's tokens; `logits` (or NULL) are those of
 * its last one. */
static void turn_forwarded(kvc_turn *t, const float *logits)
{
    kvc_kv_seq_slide(t->s->ctx->pool, SEQ(t));   /* hold no chunk behind the window now */
    turn_publish(t);
    int64_t done = SEQ(t)->n_tokens;
    kvc_context *c = t->s->ctx;
    if (c->snaps && t->phase == KVC_TURN_PREFILL && !t->pub_off &&
        kvc_session_snap_due(c, t->toks.v, t->n_fill, done, t->marks.v, t->marks.n))
        kvc_session_snap_take(t->s, t->anchor, t->toks.v, done == t->n_fill ? logits : NULL);
    switch (t->phase) {
    case KVC_TURN_PREFILL:
        if (done < t->n_fill)
            break;
        if (!t->t_prompt_done)
            t->t_prompt_done = kvc_time_us();
        if (t->kind == KVC_TURN_BACKGROUND) {
            t->t_end = t->t_prompt_done;
            t->phase = KVC_TURN_DONE;
        } else
            turn_on_logits(t, logits);
        break;
    case KVC_TURN_DECODE:
        turn_on_logits(t, logits);
        break;
    default:
        break;
    }
    if (t->phase == KVC_TURN_DONE)
        turn_set_promise(t, 0);
}

int kvc_turns_step(kvc_context *c, kvc_turn **turns, int32_t n, int32_t max_tokens,
                   kvc_err *err)
{
    const int32_t V = c->model->hp.n_vocab;
    const int32_t cap = max_tokens > 0 ? KVC_MIN(max_tokens, c->p.n_batch) : c->p.n_batch;
    int32_t cnt = 0, rows = 0;
    int32_t count[n > 0 ? n : 1], row[n > 0 ? n : 1];
    int rc = kvc_context_logits_reserve(c, n, err);
    for (int32_t i = 0; i < n; i++) {
        count[i] = 0;
        if (rc) {
            turns[i]->err = *err;
            turn_fail(turns[i], rc);
        }
    }
    if (rc)
        return rc;
    /* decoding turns first, so a long prompt never starves them */
    for (int pass = 0; pass < 2; pass++)
        for (int32_t i = 0; i < n && cnt < cap; i++) {
            int ph = turns[i]->phase;
            bool now = pass == 0 ? ph == KVC_TURN_DECODE : ph == KVC_TURN_PREFILL;
            if (!now)
                continue;
            int32_t k = turn_batch(turns[i], c->items + cnt, cap - cnt);
            if (k == 0)
                continue;
            count[i] = k;
            row[i] = c->items[cnt + k - 1].want_logits ? rows++ : -1;
            cnt += k;
        }
    if (cnt == 0)
        return KVC_OK;
    rc = kvc_compute_forward(c->compute, c->pool, c->items, cnt, c->logits, err);
    for (int32_t i = 0; i < n; i++) {
        if (!count[i])
            continue;
        if (rc) {
            turns[i]->err = *err;
            turn_fail(turns[i], rc);
            continue;
        }
        turn_forwarded(turns[i], row[i] >= 0 ? c->logits + (size_t)row[i] * (size_t)V : NULL);
    }
    return rc ? rc : cnt;
}

/* ----------------------------------------------------------------- end */

int kvc_turn_end(kvc_turn *t, char **reply, kvc_chat_stats *stats, kvc_err *err)
{
    if (reply)
        *reply = NULL;
    if (stats)
        memset(stats, 0, sizeof(*stats));
    if (!t)
        return KVC_OK;
    kvc_session *s = t->s;
    kvc_context *c = s->ctx;
    kvc_kv_seq *seq = SEQ(t);
    if (!t->rc && t->phase != KVC_TURN_DONE)
        kvc_turn_cancel(t);                  /* ended early: as if cancelled */
    int rc = t->rc;
    bool ran = t->t_prefill != 0;
    turn_drop_pending(t);
    if (ran && !rc) {
        if (t->reply_end < 0)
            t->reply_end = (int64_t)t->gen_len;
        /* the reply given back to the client starts after the separator */
        if ((size_t)t->reply_end < t->sep_len)
            t->reply_end = (int64_t)t->sep_len;
        size_t from = KVC_MIN(t->sep_len, (size_t)t->reply_end);
        if (reply) {                         /* valid UTF-8: the streamed pieces' bytes */
            size_t rl = (size_t)t->reply_end - from;
            *reply = malloc(3 * rl + 1);
            if (*reply)
                (*reply)[kvc_utf8_repair(t->gen + from, rl, *reply)] = 0;
            else
                rc = kvc_fail(&t->err, KVC_ERR_NOMEM, "out of memory");
        }
    } else if (!rc && reply) {
        *reply = calloc(1, 1);
        if (!*reply)
            rc = kvc_fail(&t->err, KVC_ERR_NOMEM, "out of memory");
    }
    if (stats) {
        int64_t now = kvc_time_us(), t_end = t->t_end ? t->t_end : now;
        int64_t prompt_end = t->t_prompt_done ? t->t_prompt_done : t_end;
        kvc_turn_prompt_stats(t, stats);
        stats->computed_tokens = ran ? (int32_t)(KVC_MIN(seq->n_tokens, t->n_prompt) - t->matched) : 0;
        stats->output_tokens = t->n_out;
        stats->dropped_tokens = t->dropped;
        stats->prompt_ms = ran ? (prompt_end - t->t_prefill) / 1e3 : 0;
        stats->prompt_tps = stats->prompt_ms > 0 ? stats->computed_tokens / (stats->prompt_ms / 1e3) : 0;
        stats->ttft_ms = ((t->t_first ? t->t_first : t_end) - t->t_start) / 1e3;
        stats->decode_ms = t->t_first ? (t_end - t->t_first) / 1e3 : 0;
        stats->decode_tps = t->n_out > 1 && t_end > t->t_first
                          ? (t->n_out - 1) / ((t_end - t->t_first) / 1e6) : 0;
        stats->total_ms = (now - t->t_start) / 1e3;
        stats->finish_reason = t->finish ? t->finish : "length";
        turn_sample_stats(&t->ts, &stats->grammar_masks, &stats->grammar_mask_ms);
    }
    if (ran && !rc) {
        turn_publish(t);                     /* blocks that had to wait for another turn's */
        if (c->snaps && t->kind == KVC_TURN_COMPLETION && !t->pub_off)
            kvc_session_snap_take(s, t->anchor, t->toks.v, NULL);   /* the reply's end (a
                                                  chat's canonical end is its background turn's) */
        /* a background turn continues the last request's conversation */
        int64_t n_prompt = t->kind != KVC_TURN_BACKGROUND ? t->n_prompt
                         : KVC_MIN(s->n_prompt, kvc_session_common(s, t->toks.v, t->toks.n));
        kvc_session_keep(s, &t->toks, n_prompt);
    } else if (ran) {
        /* a failed turn leaves no half-known state behind: what the cache
         * holds stays consistent with the session's tokens */
        kvc_kv_seq_truncate(c->pool, seq, KVC_MIN(seq->n_tokens, kvc_tokens_common(
            s->toks.v, s->toks.n, t->toks.v, t->toks.n)));
    }
    kvc_kv_seq_truncate(c->pool, seq, seq->n_tokens);   /* blocks reserved, not written */
    kvc_kv_seq_keep(c->pool, seq, seq->n_tokens);       /* where its next turn goes on */
    kvc_kv_seq_rest(c->pool, seq);           /* its window chunks evictable till its next turn */
    turn_set_promise(t, 0);
    if (ran && !rc && c->tiers && t->anchor)
        kvc_tiers_write_path(c->tiers, t->anchor);      /* through to disk, in the background */
    kvc_pc_unpin(t->anchor);
    if (rc && err)
        *err = t->err;
    kvc_sampler_free(t->smp);
    turn_sample_free(&t->ts);
    free(t->pend);
    kvc_tokbuf_free(&t->toks);
    kvc_tokbuf_free(&t->marks);
    free(t->gen);
    free(t->tok_end);
    free(t);
    return rc;
}
