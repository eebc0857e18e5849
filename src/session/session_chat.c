/* session_chat.c - kvc_session_chat: one request on one session, alone. It
 * runs the same steps the engine interleaves for many sessions: the prompt's
 * tokens (prompt.h), a turn through kvc_turns_step, and afterwards the
 * background turn that computes the conversation's canonical continuation, so
 * that the next call finds the whole of this one cached. */
#include "session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool evict_only(kvc_context *c, int64_t n_free, void *user)
{
    return kvc_context_make_room(c, n_free);
}

/* The caller's stream callback: the public one takes the text alone. */
typedef struct text_stream {
    kvc_chat_stream_fn fn;
    void              *user;
} text_stream;

static bool stream_text(const char *text, size_t len, const kvc_token_logprob *lp, int32_t n_lp,
                        void *user)
{
    const text_stream *ts = user;
    return ts->fn(text, len, ts->user);
}

/* A turn alone: the engine's steps with one turn in every batch. */
static int run_alone(kvc_session *s, const kvc_tokbuf *toks, const kvc_tokbuf *starts, int kind,
                     int32_t dropped,
                     const kvc_chat_params *p, kvc_chat_stream_fn stream, void *user,
                     char **reply, kvc_chat_stats *stats, int64_t t_start, kvc_err *e)
{
    kvc_turn *t = NULL;
    text_stream ts = { stream, user };
    int rc = kvc_turn_new(s, toks->v, toks->n, kind, p, stream ? stream_text : NULL, &ts,
                          t_start, &t, e);
    if (!rc) {
        kvc_turn_set_dropped(t, dropped);
        rc = starts ? kvc_turn_set_marks(t, starts->v, starts->n, e) : KVC_OK;
    }
    if (!rc) {
        rc = kvc_turn_prepare(t, evict_only, NULL, e);
        if (rc == KVC_TURN_WAIT_MEMORY)      /* nothing else runs: it never will fit */
            rc = KVC_ERR_KV_FULL;
        else if (rc == KVC_TURN_WAIT_PREFIX) /* only another running turn makes these */
            rc = kvc_fail(e, KVC_ERR_INVALID_ARG, "a prefix of this prompt is being computed "
                          "by another turn on this context");
    }
    while (!rc && kvc_turn_phase(t) != KVC_TURN_DONE) {
        rc = kvc_turns_step(s->ctx, &t, 1, 0, e);
        if (rc == 0)                         /* cannot happen: a live turn has a token to run */
            rc = kvc_fail(e, KVC_ERR_INVALID_ARG, "turn stalled in phase %d", kvc_turn_phase(t));
        else if (rc > 0)
            rc = KVC_OK;
    }
    if (t) {
        kvc_err e2 = { 0 };
        int rc2 = kvc_turn_end(t, reply, stats, &e2);
        if (!rc && rc2) {
            rc = rc2;
            *e = e2;
        }
    }
    return rc;
}

/* Compute the conversation's canonical continuation now (DESIGN.md §3): the
 * reply and the template's end of turn as the next request will carry them.
 * Best effort: a failure (no room) only means the next turn computes them. */
static void canonicalize(kvc_session *s, const kvc_chat_message *msgs, size_t n,
                         const kvc_chat_params *req, const char *reply)
{
    kvc_tokbuf canon = { 0 };
    kvc_err e = { 0 };
    kvc_chat_params p = kvc_chat_default_params();
    if (!kvc_prompt_next_turn(s->ctx->model, s->tmpl, msgs, n, req, reply, &canon, &e) &&
        canon.n > kvc_session_common(s, canon.v, canon.n))
        run_alone(s, &canon, NULL, KVC_TURN_BACKGROUND, 0, &p, NULL, NULL, NULL, NULL, kvc_time_us(),
                  &e);
    kvc_tokbuf_free(&canon);
}

int kvc_session_chat(kvc_session *s, const kvc_chat_message *msgs, size_t n,
                     const kvc_chat_params *params, kvc_chat_stream_fn stream, void *user,
                     char **reply, kvc_chat_stats *stats, char *err, size_t err_size)
{
    int64_t t_start = kvc_time_us();
    kvc_err e = { 0 };
    char *text = NULL;
    if (reply)
        *reply = NULL;
    if (stats)
        memset(stats, 0, sizeof(*stats));
    kvc_chat_params p = params ? *params : kvc_chat_default_params();
    kvc_tokbuf toks = { 0 }, starts = { 0 };
    int32_t dropped = 0;
    int rc = kvc_prompt_chat(s->ctx->model, s->tmpl, msgs, n, &p, s->ctx->p.n_ctx, &toks,
                             &dropped, &starts, &e);
    if (!rc)
        rc = run_alone(s, &toks, &starts, KVC_TURN_CHAT, dropped, &p, stream, user, &text, stats, t_start,
                       &e);
    if (!rc && !p.no_cache && dropped == 0)
        canonicalize(s, msgs, n, &p, text);
    kvc_tokbuf_free(&toks);
    kvc_tokbuf_free(&starts);
    if (rc) {
        free(text);
        text = NULL;
        if (err && err_size)
            snprintf(err, err_size, "%s", e.msg[0] ? e.msg : kvc_strerror(rc));
    }
    if (reply)
        *reply = text;
    else
        free(text);
    return rc;
}
