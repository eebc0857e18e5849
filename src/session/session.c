/* session.c - one conversation's state: its tokens, the sequence holding
 * their K/V, and the serial number that tells its states apart. The turn's
 * steps (session_turn.c) and the single-session driver (session_chat.c) build
 * on it. */
#include "chat_template.h"
#include "sampler.h"
#include "session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvc_chat_params kvc_chat_default_params(void)
{
    kvc_chat_params p = { 0 };
    p.sampling = kvc_sampler_default_params();
    p.overflow = KVC_OVERFLOW_ERROR;
    return p;
}

static void copy_err(const kvc_err *e, char *err, size_t err_size)
{
    if (err && err_size)
        snprintf(err, err_size, "%s", e->msg[0] ? e->msg : kvc_strerror(e->code));
}

kvc_session *kvc_session_new(kvc_context *ctx, int32_t seq, const char *template_name,
                             char *err, size_t err_size)
{
    kvc_err e = { 0 };
    int tmpl;
    if (seq < 0 || seq >= ctx->p.n_seq) {
        kvc_fail(&e, KVC_ERR_INVALID_ARG, "sequence %d outside [0, %d)", seq, ctx->p.n_seq);
        copy_err(&e, err, err_size);
        return NULL;
    }
    if (template_name) {
        tmpl = kvc_chat_template_from_name(template_name);
        if (tmpl == KVC_TMPL_UNKNOWN) {
            kvc_fail(&e, KVC_ERR_INVALID_ARG, "unknown chat template '%s'", template_name);
            copy_err(&e, err, err_size);
            return NULL;
        }
    } else {
        tmpl = kvc_chat_template_detect(ctx->model->chat_template);
        if (tmpl == KVC_TMPL_UNKNOWN)
            tmpl = KVC_TMPL_CHATML;
    }
    kvc_session *s = calloc(1, sizeof(*s));
    if (!s) {
        kvc_fail(&e, KVC_ERR_NOMEM, "out of memory");
        copy_err(&e, err, err_size);
        return NULL;
    }
    s->ctx = ctx;
    s->seq = seq;
    s->tmpl = tmpl;
    s->shifted = -1;
    return s;
}

int64_t kvc_session_drop_kv(kvc_session *s)
{
    kvc_kv_pool *pool = s->ctx->pool;
    int64_t before = kvc_kv_n_free(pool);
    kvc_kv_seq_truncate(pool, &s->ctx->seqs[s->seq], 0);
    s->shifted = -1;
    return kvc_kv_n_free(pool) - before;
}

void kvc_session_reset(kvc_session *s)
{
    kvc_session_drop_kv(s);
    s->toks.n = 0;
    s->n_prompt = 0;
    s->serial++;
}

void kvc_session_free(kvc_session *s)
{
    if (!s)
        return;
    kvc_session_reset(s);
    kvc_tokbuf_free(&s->toks);
    free(s);
}

const char *kvc_session_template(const kvc_session *s) { return kvc_chat_template_name(s->tmpl); }

void kvc_session_keep(kvc_session *s, kvc_tokbuf *toks, int64_t n_prompt)
{
    s->n_prompt = n_prompt;
    kvc_tokbuf_free(&s->toks);
    s->toks = *toks;
    *toks = (kvc_tokbuf){ 0 };
    s->serial++;
}

bool kvc_session_in_use(const kvc_session *s) { return s->toks.n > 0; }

int64_t kvc_session_common(const kvc_session *s, const int32_t *tokens, int64_t n)
{
    int64_t i = 0;
    while (i < n && i < s->toks.n && tokens[i] == s->toks.v[i])
        i++;
    return i;
}
