/* prompt.c - a request's prompt tokens and the canonical next-turn tokens
 * (prompt.h). */
#include "prompt.h"
#include "chat_template.h"
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- tokbuf */

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

int kvc_tokbuf_push(kvc_tokbuf *b, int32_t token)
{
    if (kvc_tokbuf_reserve(b, b->n + 1))
        return KVC_ERR_NOMEM;
    b->v[b->n++] = token;
    return KVC_OK;
}

void kvc_tokbuf_free(kvc_tokbuf *b)
{
    free(b->v);
    *b = (kvc_tokbuf){ 0 };
}

/* ------------------------------------------------------------ prompts */

int kvc_prompt_render(const kvc_chat_template *tmpl, const kvc_chat_message *msgs, size_t n,
                      const kvc_chat_params *p, char **out, kvc_err *err)
{
    kvc_rendered r;
    int rc = kvc_chat_template_apply(tmpl, msgs, n, p ? p->tools_json : NULL,
                                     p ? p->template_kwargs_json : NULL, true, &r, err);
    *out = rc ? NULL : r.text;
    r.text = NULL;
    kvc_rendered_free(&r);
    return rc;
}

int kvc_prompt_tokenize(const kvc_model *m, const char *text, size_t len, kvc_tokbuf *out,
                        kvc_err *err)
{
    int64_t k = kvc_tokenize(m->tok, text, len, true, true, NULL, 0);
    if (k < 0 || kvc_tokbuf_reserve(out, out->n + k))
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory tokenizing the prompt");
    kvc_tokenize(m->tok, text, len, true, true, out->v + out->n, k);
    out->n += k;
    return KVC_OK;
}

/* Append the tokens of r->text[0, len) as a cold run has them (DESIGN.md §3
 * step 3): BOS as the vocabulary asks; the text cut only at control tokens of
 * the template's own text (message content, the caller's data, is never
 * matched for them, unless special_in_content); each piece between two such
 * tokens tokenized whole, so a merge or SentencePiece's space prefix crosses
 * from template text into content as llama.cpp's and transformers' do. */
static int tokenize_rendered(const kvc_model *m, const kvc_rendered *r, size_t len,
                             bool special_in_content, kvc_tokbuf *out, kvc_err *err)
{
    size_t n_data = 0;                       /* the content spans inside [0, len) */
    while (!special_in_content && n_data < r->n_content && r->content[n_data].off < len)
        n_data++;
    const kvc_text_span *data = n_data ? r->content : NULL;
    int64_t k = kvc_tokenize_data(m->tok, r->text, len, true, data, n_data, NULL, 0);
    if (k < 0 || kvc_tokbuf_reserve(out, out->n + k))
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory tokenizing the prompt");
    kvc_tokenize_data(m->tok, r->text, len, true, data, n_data, out->v + out->n, k);
    out->n += k;
    return KVC_OK;
}

static int render_tokens(const kvc_model *m, const kvc_chat_template *tmpl,
                         const kvc_chat_params *p, const kvc_chat_message *msgs, size_t n,
                         kvc_tokbuf *out, kvc_err *err)
{
    kvc_rendered r;
    int rc = kvc_chat_template_apply(tmpl, msgs, n, p ? p->tools_json : NULL,
                                     p ? p->template_kwargs_json : NULL, true, &r, err);
    out->n = 0;
    if (!rc)
        rc = tokenize_rendered(m, &r, r.len, p && p->special_in_content, out, err);
    kvc_rendered_free(&r);
    return rc;
}

static bool is_role(const kvc_chat_message *m, const char *role)
{
    return m->role && strcmp(m->role, role) == 0;
}

int kvc_prompt_chat(const kvc_model *m, const kvc_chat_template *tmpl,
                    const kvc_chat_message *msgs, size_t n,
                    const kvc_chat_params *p, int64_t n_ctx, kvc_tokbuf *out, int32_t *dropped,
                    kvc_err *err)
{
    *dropped = 0;
    int rc = render_tokens(m, tmpl, p, msgs, n, out, err);
    if (rc || !p || p->overflow != KVC_OVERFLOW_SHIFT)
        return rc;
    const int64_t want = p->max_tokens > 0 ? p->max_tokens : 1, n0 = out->n;
    const size_t sys = n > 0 && is_role(&msgs[0], "system") ? 1 : 0;
    size_t from = sys;
    kvc_chat_message *kept = NULL;
    if (out->n + want > n_ctx && kvc_model_has_recurrent(m))
        return kvc_fail(err, KVC_ERR_UNSUPPORTED, "this model's maximum context length is %lld tokens "
                        "and the request needs %lld; a context shift is not supported for %s (its "
                        "recurrent layers' state cannot be moved to new positions)", (long long)n_ctx,
                        (long long)(out->n + want), m->hp.arch_name);
    while (!rc && out->n + want > n_ctx) {
        size_t j = from + 1;                 /* the next turn: its user message */
        while (j < n && !is_role(&msgs[j], "user"))
            j++;
        if (j >= n) {
            rc = kvc_fail(err, KVC_ERR_CONTEXT_LENGTH,
                          "this model's maximum context length is %lld tokens; the system prompt "
                          "and the last user message alone have %lld tokens and %lld more were "
                          "requested for the reply", (long long)n_ctx, (long long)out->n,
                          (long long)want);
            break;
        }
        from = j;
        if (!kept && !(kept = malloc((n + 1) * sizeof(*kept)))) {
            rc = kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
            break;
        }
        size_t k = 0;
        if (sys)
            kept[k++] = msgs[0];
        for (size_t i = from; i < n; i++)
            kept[k++] = msgs[i];
        rc = render_tokens(m, tmpl, p, kept, k, out, err);
    }
    free(kept);
    if (!rc)
        *dropped = (int32_t)(n0 - out->n);
    return rc;
}

/* ------------------------------------------------------- the next turn */

/* A user message no real one contains: where its content begins in the
 * rendering, the next request's own text begins. */
static const char SENTINEL[] = "\x01kvchat-next-turn\x02";

int kvc_prompt_next_turn(const kvc_model *m, const kvc_chat_template *tmpl,
                         const kvc_chat_message *msgs, size_t n, const kvc_chat_params *p,
                         const char *reply, kvc_tokbuf *out, kvc_err *err)
{
    out->n = 0;
    kvc_chat_message *all = malloc((n + 2) * sizeof(*all));
    if (!all)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    memcpy(all, msgs, n * sizeof(*all));
    size_t k = n;
    if (reply)                               /* NULL: msgs[n - 1] is the reply already */
        all[k++] = (kvc_chat_message){ "assistant", reply };
    all[k++] = (kvc_chat_message){ "user", SENTINEL };
    kvc_rendered r;
    int rc = kvc_chat_template_apply(tmpl, all, k, p ? p->tools_json : NULL,
                                     p ? p->template_kwargs_json : NULL, true, &r, err);
    free(all);
    if (rc)
        return rc;
    /* cut where the next user message's content begins (or, when the template
     * hides it, keep the whole: the tokens are cut at a control token below) */
    char *at = strstr(r.text, SENTINEL);
    size_t len = at ? (size_t)(at - r.text) : r.len;
    rc = tokenize_rendered(m, &r, len, p && p->special_in_content, out, err);
    kvc_rendered_free(&r);
    if (rc)
        return rc;
    /* the last control token ends a run of text: what follows cannot change
     * the tokens up to it. Past it, a token that begins with white space
     * begins a word: tokenizers do not merge across that in practice (a
     * guess, not a proof; it only decides what is computed ahead of time,
     * never what a request's tokens are) */
    int64_t keep = 0;
    for (int64_t i = out->n; i > 0 && keep == 0; i--) {
        int32_t id = out->v[i - 1];
        char piece[64];
        int k;
        if (kvc_tokenizer_token_type(m->tok, id) == KVC_TOKEN_CONTROL)
            keep = i;
        else if ((k = kvc_token_to_piece(m->tok, id, false, piece, sizeof(piece))) > 0 &&
                 k <= (int)sizeof(piece) && piece[0] && strchr(" \t\r\n", piece[0]))
            keep = i - 1;
    }
    out->n = keep;
    return KVC_OK;
}
