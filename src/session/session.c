/* session.c - one conversation's state: its tokens, the sequence holding
 * their K/V, and the serial number that tells its states apart. The turn's
 * steps (turn.h) and the single-session driver (session_chat.c) build
 * on it. */
#include "chat_template.h"
#include "sampler.h"
#include "session.h"

#include <stdio.h>
#include <xxhash.h>
#include <stdlib.h>
#include <string.h>

kvc_chat_params kvc_chat_default_params(void)
{
    kvc_chat_params p = { 0 };
    p.sampling = kvc_sampler_default_params();
    p.overflow = KVC_OVERFLOW_ERROR;
    p.logprobs = -1;
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
    const kvc_chat_template *tmpl = NULL;
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
    /* Compiled once per context: the sessions of an engine share it (it is
     * only read). A session asking for another template gets its own. */
    bool same = ctx->chat_tmpl && (template_name ? ctx->chat_tmpl_key &&
                                   !strcmp(ctx->chat_tmpl_key, template_name) : !ctx->chat_tmpl_key);
    kvc_chat_template *own = NULL;
    if (!same) {
        char *key = template_name ? strdup(template_name) : NULL;
        if ((template_name && !key) || kvc_chat_template_new(&tp, &own, &e)) {
            if (!e.code)
                kvc_fail(&e, KVC_ERR_NOMEM, "out of memory");
            free(key);
            copy_err(&e, err, err_size);
            return NULL;
        }
        if (!ctx->chat_tmpl) {
            ctx->chat_tmpl = own;
            ctx->chat_tmpl_key = key;
            own = NULL;
        } else {
            free(key);
        }
    }
    tmpl = own ? own : ctx->chat_tmpl;
    kvc_session *s = calloc(1, sizeof(*s));
    if (!s) {
        kvc_chat_template_free(own);
        kvc_fail(&e, KVC_ERR_NOMEM, "out of memory");
        copy_err(&e, err, err_size);
        return NULL;
    }
    s->ctx = ctx;
    s->seq = seq;
    s->tmpl = tmpl;
    s->own_tmpl = own;
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

void kvc_session_spill_tail(kvc_session *s)
{
    kvc_context *c = s->ctx;
    const kvc_kv_seq *seq = &c->seqs[s->seq];
    const int64_t B = kvc_kv_block_tokens(c->pool), kv_len = KVC_MIN(seq->n_tokens, s->toks.n);
    if (!c->tiers || s->cold || kv_len % B == 0 || (s->shifted >= 0 && s->shifted < kv_len))
        return;
    kvc_tiers_write_tail(c->tiers, s->ns, s->toks.v, kv_len, seq->blocks[kv_len / B]);
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
    kvc_chat_template_free(s->own_tmpl);
    free(s);
}

const char *kvc_session_template(const kvc_session *s) { return kvc_chat_template_describe(s->tmpl); }

int kvc_session_prompt(kvc_session *s, const kvc_chat_message *msgs, size_t n,
                       const kvc_chat_params *p, char **prompt, char *err, size_t err_size)
{
    kvc_err e = { 0 };
    int rc = kvc_prompt_render(s->tmpl, msgs, n, p, prompt, &e);
    if (rc)
        copy_err(&e, err, err_size);
    return rc;
}

void kvc_session_keep(kvc_session *s, kvc_tokbuf *toks, int64_t n_prompt)
{
    KVC_ASSERT(n_prompt >= 0 && n_prompt <= toks->n && s->ctx->seqs[s->seq].n_tokens <= toks->n);
    s->n_prompt = n_prompt;
    kvc_tokbuf_free(&s->toks);
    s->toks = *toks;
    *toks = (kvc_tokbuf){ 0 };
    s->serial++;
}

bool kvc_session_in_use(const kvc_session *s) { return s->toks.n > 0; }

uint64_t kvc_namespace_id(const char *name)
{
    if (!name || !*name)
        return 0;
    uint64_t h = XXH3_64bits(name, strlen(name));
    return h ? h : 1;
}

int64_t kvc_tokens_common(const int32_t *a, int64_t na, const int32_t *b, int64_t nb)
{
    int64_t i = 0;
    while (i < na && i < nb && a[i] == b[i])
        i++;
    return i;
}

int64_t kvc_session_common(const kvc_session *s, const int32_t *tokens, int64_t n)
{
    return kvc_tokens_common(tokens, n, s->toks.v, s->toks.n);
}

int64_t kvc_session_find_moved(const int32_t *nw, int64_t n_new, const int32_t *old,
                               int64_t n_old, int64_t s, int64_t *k)
{
    int64_t best_a = -1, best_k = 0;
    for (int64_t a = s + 1; a < n_old && n_old - a > best_k; a++) {
        int64_t j = 0;
        while (s + j < n_new && a + j < n_old && nw[s + j] == old[a + j])
            j++;
        if (j > best_k) {
            best_k = j;
            best_a = a;
        }
    }
    *k = best_k;
    return best_a;
}

bool kvc_session_continues_shifted(const kvc_session *s, const int32_t *tokens, int64_t n,
                                   int64_t common)
{
    if (s->n_prompt <= 0 || common >= s->n_prompt)
        return false;
    int64_t k, a = kvc_session_find_moved(tokens, n, s->toks.v, s->toks.n, common, &k);
    return a > common && k > 0 && a + k >= s->n_prompt;
}
