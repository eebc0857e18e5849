/* session.c - one conversation: its tokens, the text they stand for, the
 * checkpoints where the two line up (DESIGN.md §3), and kvc_session_chat,
 * which runs one turn (session_turn.c) through the same steps the engine
 * interleaves, alone. */
#include "chat_template.h"
#include "sampler.h"
#include "session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ lifetime */

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
    kvc_chat_template *tmpl = NULL;
    if (seq < 0 || seq >= ctx->p.n_seq) {
        kvc_fail(&e, KVC_ERR_INVALID_ARG, "sequence %d outside [0, %d)", seq, ctx->p.n_seq);
        copy_err(&e, err, err_size);
        return NULL;
    }
    /* template_name: a built-in format name, or Jinja source (--chat-template-file) */
    bool source = template_name && (strstr(template_name, "{%") || strstr(template_name, "{{"));
    const kvc_tokenizer *tok = ctx->model->tok;
    int32_t bos = kvc_tokenizer_bos(tok), eos = kvc_tokenizer_eos(tok);
    kvc_chat_template_params tp = {
        .jinja = source ? template_name : ctx->model->chat_template,
        .jinja_tool_use = source ? NULL : ctx->model->chat_template_tool_use,
        .name = source ? NULL : template_name,
        .bos_text = bos >= 0 ? kvc_tokenizer_token_text(tok, bos) : "",
        .eos_text = eos >= 0 ? kvc_tokenizer_token_text(tok, eos) : "",
        .strip_bos = kvc_tokenizer_add_bos(tok),
        .origin = source ? "the given (--chat-template-file)" : NULL,
    };
    if (kvc_chat_template_new(&tp, &tmpl, &e)) {
        copy_err(&e, err, err_size);
        return NULL;
    }
    kvc_session *s = calloc(1, sizeof(*s));
    if (!s) {
        kvc_chat_template_free(tmpl);
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
    s->n_tokens = 0;
    free(s->text);
    s->text = NULL;
    s->text_len = 0;
    s->n_cps = 0;
}

void kvc_session_free(kvc_session *s)
{
    if (!s)
        return;
    kvc_session_reset(s);
    kvc_chat_template_free(s->tmpl);
    free(s->tokens);
    free(s->cps);
    free(s);
}

const char *kvc_session_template(const kvc_session *s) { return kvc_chat_template_describe(s->tmpl); }

/* ------------------------------------------------------------- tokens */

int kvc_tokbuf_reserve(kvc_tokbuf *b, int64_t need)
{
    if (need <= b->cap)
        return KVC_OK;
    int64_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    int32_t *v = realloc(b->v, (size_t)cap * sizeof(int32_t));
    if (!v)
        return KVC_ERR_NOMEM;
    b->v = v;
    b->cap = cap;
    return KVC_OK;
}

/* Append the tokens of text[0, len) to b. `start`: the text begins the
 * sequence (BOS as the vocabulary asks); otherwise it continues it. */
static int tb_tokenize(kvc_tokbuf *b, const kvc_tokenizer *tok, const char *text, size_t len,
                       bool start)
{
    int64_t n = kvc_tokenize_ex(tok, text, len, start, true, !start, NULL, 0);
    if (n < 0 || kvc_tokbuf_reserve(b, b->n + n))
        return KVC_ERR_NOMEM;
    kvc_tokenize_ex(tok, text, len, start, true, !start, b->v + b->n, n);
    b->n += n;
    return KVC_OK;
}

int kvc_session_prompt_tokens(const kvc_session *s, const char *prompt, size_t len,
                              kvc_tokbuf *out, int32_t *keep)
{
    const kvc_tokenizer *tok = s->ctx->model->tok;
    size_t common = 0;
    if (s->text)
        while (common < len && common < s->text_len && prompt[common] == s->text[common])
            common++;
    kvc_checkpoint best = { 0, 0 };
    *keep = 0;
    for (int32_t i = 0; i < s->n_cps; i++)
        if (s->cps[i].text_len <= common) {
            best = s->cps[i];
            *keep = i + 1;
        }
    if (kvc_tokbuf_reserve(out, best.n_tokens))
        return KVC_ERR_NOMEM;
    if (best.n_tokens)
        memcpy(out->v, s->tokens, (size_t)best.n_tokens * sizeof(int32_t));
    out->n = best.n_tokens;
    return tb_tokenize(out, tok, prompt + best.text_len, len - best.text_len, best.n_tokens == 0);
}

/* ------------------------------------------------------------- history */

static int add_checkpoint(kvc_session *s, size_t text_len, int64_t n_tokens)
{
    if (s->n_cps && s->cps[s->n_cps - 1].text_len >= text_len)
        return KVC_OK;
    if (s->n_cps == s->cap_cps) {
        int32_t cap = s->cap_cps ? s->cap_cps * 2 : 16;
        kvc_checkpoint *c = realloc(s->cps, (size_t)cap * sizeof(*c));
        if (!c)
            return KVC_ERR_NOMEM;
        s->cps = c;
        s->cap_cps = cap;
    }
    s->cps[s->n_cps++] = (kvc_checkpoint){ text_len, n_tokens };
    return KVC_OK;
}

int kvc_session_keep(kvc_session *s, const char *prompt, size_t plen, const char *gen,
                     size_t gen_len, kvc_tokbuf *toks, int64_t n_prompt, int32_t keep)
{
    char *text = malloc(plen + gen_len + 1);
    if (!text)
        return KVC_ERR_NOMEM;
    memcpy(text, prompt, plen);
    if (gen_len)
        memcpy(text + plen, gen, gen_len);
    text[plen + gen_len] = 0;
    free(s->text);
    s->text = text;
    s->text_len = plen + gen_len;
    free(s->tokens);
    s->tokens = toks->v;
    s->n_tokens = toks->n;
    s->cap = toks->cap;
    toks->v = NULL;
    toks->n = toks->cap = 0;
    s->n_cps = keep;
    if (add_checkpoint(s, plen, n_prompt) || add_checkpoint(s, s->text_len, s->n_tokens)) {
        s->n_cps = 0;
        return KVC_ERR_NOMEM;
    }
    return KVC_OK;
}

const char *kvc_session_text(const kvc_session *s, size_t *len)
{
    *len = s->text_len;
    return s->text;
}

int kvc_session_render(const kvc_session *s, const kvc_chat_message *msgs, size_t n,
                       const kvc_chat_params *p, char **out, kvc_err *err)
{
    /* TODO(issue 11): tokenize r.content without special tokens; the spans are dropped here */
    kvc_rendered r;
    int rc = kvc_chat_template_apply(s->tmpl, msgs, n, p ? p->tools_json : NULL,
                                     p ? p->template_kwargs_json : NULL, true, &r, err);
    *out = rc ? NULL : r.text;
    r.text = NULL;
    kvc_rendered_free(&r);
    return rc;
}

int kvc_session_prompt(kvc_session *s, const kvc_chat_message *msgs, size_t n,
                       const kvc_chat_params *p, char **prompt, char *err, size_t err_size)
{
    kvc_err e = { 0 };
    int rc = kvc_session_render(s, msgs, n, p, prompt, &e);
    if (rc)
        copy_err(&e, err, err_size);
    return rc;
}

static int count_tokens(const kvc_session *s, const char *text, int64_t *n)
{
    kvc_tokbuf b = { 0 };
    int32_t keep;
    int rc = kvc_session_prompt_tokens(s, text, strlen(text), &b, &keep);
    *n = b.n;
    free(b.v);
    return rc;
}

static bool is_role(const kvc_chat_message *m, const char *role)
{
    return m->role && strcmp(m->role, role) == 0;
}

int kvc_session_render_fit(const kvc_session *s, const kvc_chat_message *msgs, size_t n,
                           const kvc_chat_params *p, char **out, int32_t *dropped, kvc_err *err)
{
    *out = NULL;
    *dropped = 0;
    char *text = NULL;
    int rc = kvc_session_render(s, msgs, n, p, &text, err);
    if (rc || !p || p->overflow != KVC_OVERFLOW_SHIFT) {
        *out = text;
        return rc;
    }
    const int64_t n_ctx = s->ctx->p.n_ctx, want = p->max_tokens > 0 ? p->max_tokens : 1;
    int64_t n0 = 0, nt = 0;
    if (count_tokens(s, text, &n0)) {
        free(text);
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory tokenizing the prompt");
    }
    nt = n0;
    const size_t sys = n > 0 && is_role(&msgs[0], "system") ? 1 : 0;
    size_t from = sys;
    kvc_chat_message *kept = NULL;
    while (nt + want > n_ctx) {
        size_t j = from + 1;                 /* the next turn: its user message */
        while (j < n && !is_role(&msgs[j], "user"))
            j++;
        if (j >= n) {
            rc = kvc_fail(err, KVC_ERR_CONTEXT_LENGTH,
                          "this model's maximum context length is %lld tokens; the system prompt "
                          "and the last user message alone have %lld tokens and %lld more were "
                          "requested for the reply", (long long)n_ctx, (long long)nt,
                          (long long)want);
            break;
        }
        from = j;
        if (!kept && !(kept = malloc((n + 1) * sizeof(*kept)))) {
            rc = kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
            break;
        }
        size_t m = 0;
        if (sys)
            kept[m++] = msgs[0];
        for (size_t i = from; i < n; i++)
            kept[m++] = msgs[i];
        free(text);
        text = NULL;
        if ((rc = kvc_session_render(s, kept, m, p, &text, err)))
            break;
        if (count_tokens(s, text, &nt)) {
            rc = kvc_fail(err, KVC_ERR_NOMEM, "out of memory tokenizing the prompt");
            break;
        }
    }
    free(kept);
    if (rc) {
        free(text);
        return rc;
    }
    *out = text;
    *dropped = (int32_t)(n0 - nt);
    return KVC_OK;
}

/* ------------------------------------------------------------ one turn */

static bool evict_only(kvc_context *c, int64_t n_free, void *user)
{
    return kvc_context_make_room(c, n_free);
}

/* A turn alone: the engine's steps with one turn in every batch. */
static int run_alone(kvc_session *s, const char *prompt, int32_t dropped,
                     const kvc_chat_params *p, kvc_chat_stream_fn stream, void *user,
                     char **reply, kvc_chat_stats *stats, int64_t t_start, kvc_err *e)
{
    kvc_turn *t = NULL;
    int rc = kvc_turn_new(s, prompt, true, p, stream, user, t_start, &t, e);
    if (!rc) {
        kvc_turn_set_dropped(t, dropped);
        rc = kvc_turn_prepare(t, evict_only, NULL, e);
        if (rc == KVC_TURN_WAIT_MEMORY)      /* nothing else runs: it never will fit */
            rc = KVC_ERR_KV_FULL;
        else if (rc == KVC_TURN_WAIT_PREFIX) /* only another running turn makes these */
            rc = kvc_fail(e, KVC_ERR_INVALID_ARG, "a prefix of this prompt is being computed "
                          "by another turn on this context");
    }
    while (!rc && kvc_turn_phase(t) != KVC_TURN_DONE) {
        rc = kvc_turns_step(s->ctx, &t, 1, e);
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

int kvc_session_chat(kvc_session *s, const kvc_chat_message *msgs, size_t n,
                     const kvc_chat_params *params, kvc_chat_stream_fn stream, void *user,
                     char **reply, kvc_chat_stats *stats, char *err, size_t err_size)
{
    int64_t t_start = kvc_time_us();
    kvc_err e = { 0 };
    char *prompt = NULL;
    if (reply)
        *reply = NULL;
    if (stats)
        memset(stats, 0, sizeof(*stats));
    int32_t dropped = 0;
    int rc = kvc_session_render_fit(s, msgs, n, params, &prompt, &dropped, &e);
    if (!rc)
        rc = run_alone(s, prompt, dropped, params, stream, user, reply, stats, t_start, &e);
    if (rc) {
        if (reply) {
            free(*reply);
            *reply = NULL;
        }
        copy_err(&e, err, err_size);
    }
    free(prompt);
    return rc;
}
