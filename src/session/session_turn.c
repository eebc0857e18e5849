/* session_turn.c - one turn of a session as steps (session.h): matching the
 * prompt against the session and the prefix tree (and the tiers below it,
 * session_fetch.c), prefill in chunks, decoding with stop strings and
 * streaming, entering computed blocks in the tree, and the batched step that
 * runs many turns through one forward pass. */
#include "chat_template.h"
#include "sampler.h"
#include "session.h"
#include "snapshot.h"
#include "tokenizer.h"
#include "turn_sample.h"
#include "unicode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct stops {
    const char *const *tmpl;     /* NULL-terminated */
    const char *const *extra;
    int32_t            n_extra;
} stops;

struct kvc_turn {
    kvc_session    *s;
    kvc_chat_params p;              /* p.stop borrowed */
    kvc_turn_stream_fn stream;
    void           *user;
    int             kind;           /* enum kvc_turn_kind */
    int             phase;          /* enum kvc_turn_phase */
    int             rc;             /* the failure that ended it, KVC_OK */
    kvc_err         err;
    kvc_tokbuf      toks;           /* prompt, then the reply's tokens */
    kvc_tokbuf      marks;          /* where its messages' text begins (kvc_turn_set_marks) */
    int64_t         n_prompt;
    int32_t         max_out;        /* reply tokens at most */
    int64_t         matched;        /* prompt tokens found cached */
    int32_t         dropped;        /* prompt tokens a context shift removed */
    int64_t         moved;          /* of matched, K/V moved by the shift */
    int64_t         from_disk;      /* of matched, read from the disk tier */
    /* generation */
    kvc_sampler    *smp;
    turn_sample     ts;             /* grammar mask, logit_bias, logprobs */
    stops           st;
    const char     *sep;            /* the template's reply separator */
    size_t          sep_len;        /* of it, found at the reply's start */
    char           *gen;            /* generated text (the raw bytes of the pieces) */
    size_t          gen_len, gen_cap;
    size_t          sent;           /* bytes of gen passed to stream */
    size_t         *tok_end;        /* logprobs asked for: where each reply token's text
                                       ends in gen (n_tok_end of cap_tok_end) */
    size_t          n_tok_end, cap_tok_end;
    int32_t         lp_sent;        /* reply tokens whose logprobs went with a piece */
    int64_t         reply_end;      /* where the reply ends in gen (a stop string), -1 */
    int32_t         n_out;
    bool            cancelled;
    const char     *finish;         /* finish_reason */
    /* KV */
    int64_t         max_blocks;     /* blocks of the longest sequence the turn can reach */
    int64_t         n_fill;         /* tokens to prefill: the prompt; after a preemption,
                                       every token so far (they are computed again) */
    int32_t         n_preempted;    /* times it gave its blocks back (kvc_turn_preempt) */
    int64_t         promise;        /* of them, not yet allocated: part of ctx->promised */
    kvc_pc_node    *anchor;         /* pinned tree node of block n_pub - 1; NULL = root */
    int32_t         n_pub;          /* the sequence's blocks [0, n_pub) are anchor's path */
    int32_t         pub_lim;        /* blocks [pub_lim, ...) never enter the tree (shifted) */
    bool            pub_off;        /* enter no more blocks (cancelled, out of memory) */
    kvc_pc_node   **pend;           /* pending nodes entered: blocks [pend_first, +n_pend) */
    int32_t         pend_first, n_pend, n_pend_ready;
    /* times (kvc_time_us) */
    int64_t         t_start, t_prefill, t_prompt_done, t_first, t_end;
};

#define SEQ(t) (&(t)->s->ctx->seqs[(t)->s->seq])

/* ---------------------------------------------------------- stop strings */

/* The first position in text[0, len) where a stop string starts, or -1. */
static int64_t find_stop(const stops *st, const char *text, size_t len)
{
    int64_t best = -1;
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t i = 0;; i++) {
            const char *w = pass == 0 ? st->tmpl[i] : (i < st->n_extra ? st->extra[i] : NULL);
            if (!w)
                break;
            if (!*w)
                continue;
            const char *hit = memmem(text, len, w, strlen(w));
            if (hit && (best < 0 || hit - text < best))
                best = hit - text;
        }
    }
    return best;
}

/* How many bytes at the end of text[0, len) could begin a stop string. */
static size_t stop_holdback(const stops *st, const char *text, size_t len)
{
    size_t hold = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int32_t i = 0;; i++) {
            const char *w = pass == 0 ? st->tmpl[i] : (i < st->n_extra ? st->extra[i] : NULL);
            if (!w)
                break;
            size_t wl = strlen(w);
            for (size_t k = KVC_MIN(wl - (wl > 0), len); k > hold; k--)
                if (memcmp(text + len - k, w, k) == 0) {
                    hold = k;
                    break;
                }
        }
    return hold;
}

/* text[0, len) made valid UTF-8 (unicode.h), passed to the stream callback
 * with the logprobs lp[0, n_lp) (on its last part, when it is cut in parts). */
static bool stream_repaired(kvc_turn *t, const char *text, size_t len,
                            const kvc_token_logprob *lp, int32_t n_lp)
{
    char buf[1024];
    size_t done = 0;
    while (done < len) {
        size_t k = len - done;
        if (k > sizeof(buf) / 3) {           /* a part, cut between characters */
            k = sizeof(buf) / 3;
            k -= kvc_utf8_incomplete_tail(text + done, k);
        }
        size_t m = kvc_utf8_repair(text + done, k, buf);
        bool last = done + k == len;
        if (!t->stream(buf, m, last ? lp : NULL, last ? n_lp : 0, t->user))
            return false;
        done += k;
    }
    return true;
}

/* ------------------------------------------------------------- helpers */

static int fail(kvc_turn *t, int rc)
{
    if (!t->rc)
        t->rc = rc;
    t->phase = KVC_TURN_DONE;
    return rc;
}

static int64_t common_prefix(const int32_t *a, int64_t na, const int32_t *b, int64_t nb)
{
    int64_t i = 0;
    while (i < na && i < nb && a[i] == b[i])
        i++;
    return i;
}

static int gen_append(kvc_turn *t, const char *piece, int n)
{
    if (t->gen_len + (size_t)n + 1 > t->gen_cap) {
        size_t cap = t->gen_cap ? t->gen_cap * 2 : 1024;
        while (cap < t->gen_len + (size_t)n + 1)
            cap *= 2;
        char *g = realloc(t->gen, cap);
        if (!g)
            return kvc_fail(&t->err, KVC_ERR_NOMEM, "out of memory");
        t->gen = g;
        t->gen_cap = cap;
    }
    memcpy(t->gen + t->gen_len, piece, (size_t)n);
    t->gen_len += (size_t)n;
    t->gen[t->gen_len] = 0;
    return KVC_OK;
}

/* With logprobs, a piece carries the logprobs of the tokens whose text it
 * holds, so text that may go out up to *end is cut back to where the last
 * token ending by then ends; the final piece takes every token it shows a
 * part of (one cut by a stop string too). Returns how many reply tokens'
 * logprobs go with text up to *end (0 without logprobs). */
static int32_t cut_at_token(const kvc_turn *t, size_t *end, bool final)
{
    int32_t k = t->lp_sent, n = (int32_t)KVC_MIN(t->n_tok_end, (size_t)t->ts.n_lp);
    if (final)
        while (k < n && (k == 0 ? 0 : t->tok_end[k - 1]) < *end)
            k++;
    else
        while (k < n && t->tok_end[k] <= *end)
            k++;
    if (!final && t->ts.top >= 0)
        *end = k > 0 ? KVC_MAX(t->tok_end[k - 1], t->sent) : t->sent;
    return k;
}

/* Pass newly safe reply text to the stream callback. `final`: all of it.
 * Not final, text that may begin a stop string and an incomplete character
 * are held back, and with logprobs a token's text that is not whole; pieces
 * are cut only between whole characters, so repairing each (a byte that
 * cannot be part of a character becomes U+FFFD) gives the repaired whole
 * reply. */
static void flush_stream(kvc_turn *t, bool final)
{
    size_t end = t->reply_end >= 0 ? (size_t)t->reply_end : t->gen_len;
    if (!final && t->reply_end < 0) {
        end = t->gen_len - stop_holdback(&t->st, t->gen, t->gen_len);
        end -= kvc_utf8_incomplete_tail(t->gen, end);
    }
    int32_t upto = cut_at_token(t, &end, final);
    size_t from = KVC_MAX(t->sent, t->sep_len);
    if (end > from && t->stream && !t->cancelled) {
        const kvc_token_logprob *lp = t->ts.lp ? t->ts.lp + t->lp_sent : NULL;
        if (!stream_repaired(t, t->gen + from, end - from, lp, upto - t->lp_sent))
            t->cancelled = true;
        t->lp_sent = upto;
    }
    if (end > t->sent)
        t->sent = end;
}

/* Keep ctx->promised equal to what the running turns may still allocate. */
static void set_promise(kvc_turn *t, int64_t promise)
{
    t->s->ctx->promised += promise - t->promise;
    t->promise = promise;
    KVC_ASSERT(promise >= 0 && t->s->ctx->promised >= promise);
}

static void update_promise(kvc_turn *t)
{
    /* the blocks to the end of the prefill; decoding grows block by block
     * (kvc_turns_grow), it is not promised up front */
    const int64_t B = kvc_kv_block_tokens(t->s->ctx->pool);
    set_promise(t, KVC_MAX(0, (t->n_fill + B - 1) / B - SEQ(t)->n_blocks));
}

/* ------------------------------------------------- the prefix tree side */

/* Enter block i of the sequence (tokens toks[i*B, i*B+B)) under the anchor;
 * pending: its K/V are still to be computed. A node of the same content that
 * is there already is followed instead. Returns false when it could not: a
 * node another turn is computing is in the way (try again later), or memory
 * ran out (then no more blocks are entered). */
static bool enter_block(kvc_turn *t, int32_t i, bool pending)
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

/* After a forward pass: our pending blocks now computed become ready, and
 * newly full blocks (the reply's) enter the tree. */
static void publish(kvc_turn *t)
{
    kvc_context *c = t->s->ctx;
    const int64_t B = kvc_kv_block_tokens(c->pool), done = SEQ(t)->n_tokens;
    while (t->n_pend_ready < t->n_pend && (t->pend_first + t->n_pend_ready + 1) * B <= done)
        kvc_pc_set_ready(c->pc, t->pend[t->n_pend_ready++]);
    while (!t->pub_off && (int64_t)(t->n_pub + 1) * B <= done && enter_block(t, t->n_pub, false))
        ;
}

/* Take the pending blocks not computed out of the tree (cancel, failure):
 * turns waiting for them then compute them themselves. */
static void drop_pending(kvc_turn *t)
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

/* ----------------------------------------------------------------- new */

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

/* ------------------------------------------------------------- prepare */

static void on_logits(kvc_turn *t, const float *logits);

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
        return fail(t, KVC_ERR_CONTEXT_LENGTH);
    }

    /* what is cached: the session's own tokens (as far as its sequence holds
     * them), and the tree's blocks, whoever computed them */
    int64_t kv_len = KVC_MIN(seq->n_tokens, s->toks.n);
    int64_t own = cache ? common_prefix(t->toks.v, n, s->toks.v, kv_len) : 0;
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
            return fail(t, KVC_ERR_NOMEM);
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
        return fail(t, rc);
    }
    publish(t);                              /* the session's own full blocks */
    if ((rc = kvc_kv_seq_reserve(c->pool, seq, n, &t->err))) {
        *err = t->err;
        return fail(t, rc);
    }
    for (int32_t i = t->n_pub; !t->pub_off && i < n / B && enter_block(t, i, true); i++)
        ;
    keep_points(t);
    update_promise(t);
    if (snap_logits && t->phase == KVC_TURN_DONE) {   /* the whole prompt, with its logits */
        t->t_prompt_done = kvc_time_us();
        on_logits(t, snap_logits);
    }
    free(snap_logits);
    if (t->phase == KVC_TURN_DONE)
        set_promise(t, 0);
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

/* ----------------------------------------------------- decode and finish */

/* The reply ends: flush the stream. The last token sampled stays in the
 * turn's tokens, its K/V not computed: a stop token never enters the reply's
 * tokens. The background turn that follows a chat reply computes the
 * conversation's end of turn as the next request will carry it. */
static void to_finish(kvc_turn *t, const char *reason)
{
    t->finish = reason;
    flush_stream(t, true);
    t->t_end = kvc_time_us();
    if (t->reply_end < 0)
        t->reply_end = (int64_t)t->gen_len;
    t->phase = KVC_TURN_DONE;
}

/* With logprobs, remember where the reply token just added ends in gen: the
 * stream cuts its pieces there (cut_at_token). */
static int note_token_end(kvc_turn *t)
{
    if (!kvc_grow((void **)&t->tok_end, &t->cap_tok_end, t->n_tok_end, sizeof(*t->tok_end)))
        return KVC_ERR_NOMEM;
    t->tok_end[t->n_tok_end++] = t->gen_len;
    return KVC_OK;
}

/* A token that ends the reply: end of generation, or any control token (the
 * template's markup, "<|im_start|>"): its text is not shown in a reply.
 * Markup a reply keeps (harmony's channels, kvc_tokenizer_is_markup) goes
 * on: its text enters the reply for the server's parsers. */
static bool ends_reply(const kvc_tokenizer *tok, int32_t id)
{
    return kvc_tokenizer_is_eog(tok, id) || (kvc_tokenizer_token_type(tok, id) == KVC_TOKEN_CONTROL &&
                                             !kvc_tokenizer_is_markup(tok, id));
}

/* Logits for the next token are here: sample it, stream its text, decide. */
static void on_logits(kvc_turn *t, const float *logits)
{
    const kvc_tokenizer *tok = t->s->ctx->model->tok;
    int32_t id;
    int rc = turn_sample_pick(&t->ts, t->smp, logits, t->s->ctx->model->hp.n_vocab,
                              t->max_out - t->n_out, &id, &t->err);
    if (t->n_out == 0)
        t->t_first = kvc_time_us();
    if (rc) {                                /* an error, never a "stop" on a cut reply */
        fail(t, rc);
        return;
    }
    if (id < 0 || ends_reply(tok, id)) {     /* -1: the grammar has ended */
        to_finish(t, "stop");
        return;
    }
    if ((rc = turn_sample_accept(&t->ts, id, &t->err))) {
        fail(t, rc);
        return;
    }
    kvc_sampler_accept(t->smp, id);
    if (kvc_tokbuf_reserve(&t->toks, t->toks.n + 1)) {
        fail(t, kvc_fail(&t->err, KVC_ERR_NOMEM, "out of memory"));
        return;
    }
    t->toks.v[t->toks.n++] = id;
    t->n_out++;
    char piece[1024], *big = NULL;
    int k = kvc_token_to_piece(tok, id, false, piece, sizeof(piece));
    if (k > (int)sizeof(piece) && (big = malloc((size_t)k)))   /* a long token */
        k = kvc_token_to_piece(tok, id, false, big, k);
    rc = k > 0 && (k <= (int)sizeof(piece) || big) ? gen_append(t, big ? big : piece, k)
                                                   : k > 0 ? KVC_ERR_NOMEM : KVC_OK;
    free(big);
    if (!rc && t->ts.top >= 0)
        rc = note_token_end(t);
    if (rc) {
        fail(t, KVC_ERR_NOMEM);
        return;
    }
    size_t sl = strlen(t->sep);
    if (t->n_out == 1 || t->gen_len <= sl)
        t->sep_len = strncmp(t->gen, t->sep, sl) == 0 ? sl : 0;
    int64_t at = find_stop(&t->st, t->gen + t->sep_len, t->gen_len - t->sep_len);
    if (at >= 0)
        t->reply_end = (int64_t)t->sep_len + at;
    flush_stream(t, false);
    if (t->reply_end >= 0)
        to_finish(t, "stop");
    else if (t->cancelled)
        to_finish(t, "cancelled");
    else if (t->n_out >= t->max_out)        /* a grammar closed on the last token: only the
                                               end could follow (as an EOG would have) */
        to_finish(t, turn_sample_closed(&t->ts) ? "stop" : "length");
    else
        t->phase = KVC_TURN_DECODE;
}

/* ------------------------------------------------------------ preemption */

int kvc_turn_preempt(kvc_turn *t)
{
    if (t->phase != KVC_TURN_PREFILL && t->phase != KVC_TURN_DECODE)
        return KVC_ERR_INVALID_ARG;
    kvc_context *c = t->s->ctx;
    const int64_t B = kvc_kv_block_tokens(c->pool);
    publish(t);
    drop_pending(t);                         /* blocks of the prompt not computed yet */
    if (c->tiers && t->anchor)               /* down a tier: read back, not recomputed */
        kvc_tiers_write_path(c->tiers, t->anchor);
    kvc_pc_unpin(t->anchor);
    t->anchor = NULL;
    t->n_pub = 0;
    t->n_pend = t->n_pend_ready = 0;
    kvc_kv_seq_truncate(c->pool, SEQ(t), 0);
    set_promise(t, 0);
    if (t->phase == KVC_TURN_DECODE) {
        /* every token so far is prefilled again, the last one sampled too: its
         * logits give the next token, as a decode step would have */
        t->n_fill = t->toks.n;
        kvc_pc_node **pend = realloc(t->pend, (size_t)(t->n_fill / B + 1) * sizeof(*pend));
        if (!pend)
            return fail(t, kvc_fail(&t->err, KVC_ERR_NOMEM, "out of memory"));
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
        drop_pending(t);
        t->phase = KVC_TURN_DONE;
        break;
    case KVC_TURN_DECODE:
        t->cancelled = true;
        to_finish(t, "cancelled");
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
            fail(t, rc);
            return 0;
        }
        update_promise(t);
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
    publish(t);
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
            on_logits(t, logits);
        break;
    case KVC_TURN_DECODE:
        on_logits(t, logits);
        break;
    default:
        break;
    }
    if (t->phase == KVC_TURN_DONE)
        set_promise(t, 0);
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
            fail(turns[i], rc);
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
            fail(turns[i], rc);
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
    drop_pending(t);
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
        stats->prompt_tokens = (int32_t)t->n_prompt;
        stats->cached_tokens = (int32_t)t->matched;
        stats->cached_disk_tokens = (int32_t)t->from_disk;
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
        publish(t);                          /* blocks that had to wait for another turn's */
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
        kvc_kv_seq_truncate(c->pool, seq, KVC_MIN(seq->n_tokens, common_prefix(
            s->toks.v, s->toks.n, t->toks.v, t->toks.n)));
    }
    kvc_kv_seq_truncate(c->pool, seq, seq->n_tokens);   /* blocks reserved, not written */
    kvc_kv_seq_keep(c->pool, seq, seq->n_tokens);       /* where its next turn goes on */
    kvc_kv_seq_rest(c->pool, seq);           /* its window chunks evictable till its next turn */
    set_promise(t, 0);
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
