/* session.c - one conversation: its tokens, the text they stand for, and the
 * matching rules of DESIGN.md §3 (text prefix, then token prefix, truncate,
 * compute only the rest). */
#include "chat_template.h"
#include "context.h"
#include "sampler.h"
#include "session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A place where the session's text and tokens line up exactly: text[0,
 * text_len) is what tokens[0, n_tokens) stand for. Kept at the end of every
 * prompt and every reply, so a request that shares only part of the text (a
 * regenerated reply, an edited message) still reuses the tokens before it. */
typedef struct checkpoint {
    size_t  text_len;
    int64_t n_tokens;
} checkpoint;

struct kvc_session {
    kvc_context *ctx;
    int32_t      seq;
    int          tmpl;          /* enum kvc_chat_tmpl */
    int32_t     *tokens;        /* the conversation's tokens so far (prompt + reply) */
    int64_t      n_tokens;
    int64_t      cap;
    char        *text;          /* the exact text tokens[0, n_tokens) stand for; NULL = unknown */
    size_t       text_len;
    checkpoint  *cps;           /* where text and tokens are known to line up */
    int32_t      n_cps, cap_cps;
};

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
    return s;
}

void kvc_session_reset(kvc_session *s)
{
    kvc_kv_seq_truncate(s->ctx->pool, &s->ctx->seqs[s->seq], 0);
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
    free(s->tokens);
    free(s->cps);
    free(s);
}

const char *kvc_session_template(const kvc_session *s) { return kvc_chat_template_name(s->tmpl); }

/* ------------------------------------------------------------- tokens */

typedef struct tokbuf {
    int32_t *v;
    int64_t  n, cap;
} tokbuf;

static int tb_reserve(tokbuf *b, int64_t need)
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
static int tb_tokenize(tokbuf *b, const kvc_tokenizer *tok, const char *text, size_t len, bool start)
{
    int64_t n = kvc_tokenize_ex(tok, text, len, start, true, !start, NULL, 0);
    if (n < 0 || tb_reserve(b, b->n + n))
        return KVC_ERR_NOMEM;
    kvc_tokenize_ex(tok, text, len, start, true, !start, b->v + b->n, n);
    b->n += n;
    return KVC_OK;
}

/* The prompt's tokens: those of the longest checkpoint whose text is a prefix
 * of the prompt, then the rest of the text tokenized as a continuation.
 * *keep gets the number of checkpoints still valid. */
static int prompt_tokens(kvc_session *s, const char *prompt, size_t len, tokbuf *out, int32_t *keep)
{
    const kvc_tokenizer *tok = s->ctx->model->tok;
    size_t common = 0;
    if (s->text)
        while (common < len && common < s->text_len && prompt[common] == s->text[common])
            common++;
    checkpoint best = { 0, 0 };
    *keep = 0;
    for (int32_t i = 0; i < s->n_cps; i++)
        if (s->cps[i].text_len <= common) {
            best = s->cps[i];
            *keep = i + 1;
        }
    if (tb_reserve(out, best.n_tokens))
        return KVC_ERR_NOMEM;
    if (best.n_tokens)
        memcpy(out->v, s->tokens, (size_t)best.n_tokens * sizeof(int32_t));
    out->n = best.n_tokens;
    return tb_tokenize(out, tok, prompt + best.text_len, len - best.text_len, best.n_tokens == 0);
}

/* ---------------------------------------------------------- stop strings */

typedef struct stops {
    const char *const *tmpl;     /* NULL-terminated */
    const char *const *extra;
    int32_t            n_extra;
} stops;

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

/* Bytes of text[0, len) that end on a whole UTF-8 character. */
static size_t utf8_whole(const char *text, size_t len)
{
    size_t i = len, back = 0;
    while (i > 0 && back < 4 && ((unsigned char)text[i - 1] & 0xC0) == 0x80) {
        i--;
        back++;
    }
    if (i == 0)
        return len;
    unsigned char c = (unsigned char)text[i - 1];
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return back + 1 >= need ? len : i - 1;
}

/* ------------------------------------------------------------- the turn */

typedef struct turn {
    kvc_session  *s;
    const kvc_chat_params *p;
    kvc_chat_stream_fn stream;
    void         *user;
    kvc_err      *err;
    tokbuf        toks;         /* prompt, then generated tokens */
    char         *gen;          /* generated text (raw pieces) */
    size_t        gen_len, gen_cap;
    size_t        sent;         /* bytes of gen passed to stream */
    int64_t       reply_end;    /* where the reply ends in gen (a stop string), -1 */
    bool          cancelled;
    bool          chat;         /* a chat turn: the template's stops and separator apply */
} turn;

static int gen_append(turn *t, const char *piece, int n)
{
    if (t->gen_len + (size_t)n + 1 > t->gen_cap) {
        size_t cap = t->gen_cap ? t->gen_cap * 2 : 1024;
        while (cap < t->gen_len + (size_t)n + 1)
            cap *= 2;
        char *g = realloc(t->gen, cap);
        if (!g)
            return kvc_fail(t->err, KVC_ERR_NOMEM, "out of memory");
        t->gen = g;
        t->gen_cap = cap;
    }
    memcpy(t->gen + t->gen_len, piece, (size_t)n);
    t->gen_len += (size_t)n;
    t->gen[t->gen_len] = 0;
    return KVC_OK;
}

/* Pass newly safe reply text to the stream callback. `final`: all of it. */
static void flush_stream(turn *t, const stops *st, size_t sep, bool final)
{
    size_t end = t->reply_end >= 0 ? (size_t)t->reply_end : t->gen_len;
    if (!final && t->reply_end < 0)
        end = utf8_whole(t->gen, t->gen_len - stop_holdback(st, t->gen, t->gen_len));
    size_t from = KVC_MAX(t->sent, sep);
    if (end > from && t->stream && !t->cancelled)
        if (!t->stream(t->gen + from, end - from, t->user))
            t->cancelled = true;
    if (end > t->sent)
        t->sent = end;
}

/* Compute toks[from, n) into the sequence, keeping the last logits. */
static int compute(turn *t, int64_t from)
{
    kvc_context *c = t->s->ctx;
    kvc_kv_seq *seq = &c->seqs[t->s->seq];
    kvc_kv_seq_truncate(c->pool, seq, from);
    char msg[sizeof(t->err->msg)];
    int rc = kvc_context_decode(c, t->s->seq, t->toks.v + from, (int32_t)(t->toks.n - from), false,
                                msg, sizeof(msg));
    if (rc)
        kvc_fail(t->err, rc, "%s", msg);
    return rc;
}

static int generate(turn *t, int32_t max_tokens, kvc_chat_stats *st_out, int64_t t_start)
{
    kvc_session *s = t->s;
    kvc_context *c = s->ctx;
    const kvc_tokenizer *tok = c->model->tok;
    kvc_sampler *smp = kvc_sampler_new(&t->p->sampling, c->model->hp.n_vocab);
    if (!smp)
        return kvc_fail(t->err, KVC_ERR_NOMEM, "out of memory for the sampler");
    for (int64_t i = 0; i < t->toks.n; i++)
        kvc_sampler_accept(smp, t->toks.v[i]);
    static const char *const no_stops[] = { NULL };
    stops st = { t->chat ? kvc_chat_template_stops(s->tmpl) : no_stops, t->p->stop, t->p->n_stop };
    const char *sep = t->chat ? kvc_chat_template_reply_sep(s->tmpl) : "";
    size_t sep_len = 0;
    int rc = KVC_OK;
    int32_t n_out = 0, eog = -1;
    int64_t t_first = 0;
    st_out->finish_reason = "length";
    char piece[1024];
    while (n_out < max_tokens) {
        int32_t id = kvc_sampler_sample(smp, kvc_context_logits(c, -1));
        if (n_out == 0)
            t_first = kvc_time_us();
        if (kvc_tokenizer_is_eog(tok, id)) {
            st_out->finish_reason = "stop";
            eog = id;
            break;
        }
        kvc_sampler_accept(smp, id);
        if ((rc = tb_reserve(&t->toks, t->toks.n + 1)))
            break;
        t->toks.v[t->toks.n++] = id;
        n_out++;
        int k = kvc_token_to_piece(tok, id, false, piece, sizeof(piece));
        if (k > 0 && k <= (int)sizeof(piece) && (rc = gen_append(t, piece, k)))
            break;
        if (n_out == 1 || t->gen_len <= strlen(sep))
            sep_len = strncmp(t->gen, sep, strlen(sep)) == 0 ? strlen(sep) : 0;
        int64_t at = find_stop(&st, t->gen + sep_len, t->gen_len - sep_len);
        if (at >= 0) {
            t->reply_end = (int64_t)sep_len + at;
            st_out->finish_reason = "stop";
        }
        flush_stream(t, &st, sep_len, false);
        if (t->reply_end >= 0)
            break;
        if (t->cancelled) {
            st_out->finish_reason = "cancelled";
            break;
        }
        if (n_out < max_tokens && (rc = compute(t, t->toks.n - 1)))
            break;
    }
    if (!rc)
        flush_stream(t, &st, sep_len, true);
    kvc_sampler_free(smp);
    int64_t t_end = kvc_time_us();
    if (t->reply_end < 0)
        t->reply_end = (int64_t)t->gen_len;
    /* The end-of-generation token stays in the history with its text, and the
     * last token is computed too: the next turn, which sends this reply back
     * followed by the template's end-of-turn text, then finds all of it cached. */
    if (!rc && eog >= 0 && !(rc = tb_reserve(&t->toks, t->toks.n + 1))) {
        t->toks.v[t->toks.n++] = eog;
        int k = kvc_token_to_piece(tok, eog, true, piece, sizeof(piece));
        if (k > 0 && k <= (int)sizeof(piece))
            rc = gen_append(t, piece, k);
    }
    if (!rc && c->seqs[s->seq].n_tokens < t->toks.n)
        rc = compute(t, c->seqs[s->seq].n_tokens);
    st_out->output_tokens = n_out;
    st_out->ttft_ms = ((t_first ? t_first : t_end) - t_start) / 1e3;
    st_out->decode_ms = t_first ? (t_end - t_first) / 1e3 : 0;
    st_out->decode_tps = n_out > 1 && t_end > t_first ? (n_out - 1) / ((t_end - t_first) / 1e6) : 0;
    /* the reply given back to the client starts after the separator */
    if ((size_t)t->reply_end < sep_len)
        t->reply_end = (int64_t)sep_len;
    t->sent = sep_len;
    return rc;
}

static int add_checkpoint(kvc_session *s, size_t text_len, int64_t n_tokens)
{
    if (s->n_cps && s->cps[s->n_cps - 1].text_len >= text_len)
        return KVC_OK;
    if (s->n_cps == s->cap_cps) {
        int32_t cap = s->cap_cps ? s->cap_cps * 2 : 16;
        checkpoint *c = realloc(s->cps, (size_t)cap * sizeof(*c));
        if (!c)
            return KVC_ERR_NOMEM;
        s->cps = c;
        s->cap_cps = cap;
    }
    s->cps[s->n_cps++] = (checkpoint){ text_len, n_tokens };
    return KVC_OK;
}

/* Remember the conversation: its tokens, the text they stand for, and the
 * checkpoints: the `keep` still valid, the prompt's end, the reply's end. */
static int keep_history(kvc_session *s, turn *t, const char *prompt, size_t plen,
                        int64_t n_prompt, int32_t keep)
{
    char *text = malloc(plen + t->gen_len + 1);
    if (!text)
        return KVC_ERR_NOMEM;
    memcpy(text, prompt, plen);
    if (t->gen_len)
        memcpy(text + plen, t->gen, t->gen_len);
    text[plen + t->gen_len] = 0;
    free(s->text);
    s->text = text;
    s->text_len = plen + t->gen_len;
    free(s->tokens);
    s->tokens = t->toks.v;
    s->n_tokens = t->toks.n;
    s->cap = t->toks.cap;
    t->toks.v = NULL;
    s->n_cps = keep;
    if (add_checkpoint(s, plen, n_prompt) || add_checkpoint(s, s->text_len, s->n_tokens)) {
        s->n_cps = 0;
        return KVC_ERR_NOMEM;
    }
    return KVC_OK;
}

static int64_t common_prefix(const int32_t *a, int64_t na, const int32_t *b, int64_t nb)
{
    int64_t i = 0;
    while (i < na && i < nb && a[i] == b[i])
        i++;
    return i;
}

int kvc_session_chat(kvc_session *s, const kvc_chat_message *msgs, size_t n,
                     const kvc_chat_params *params, kvc_chat_stream_fn stream, void *user,
                     char **reply, kvc_chat_stats *stats, char *err, size_t err_size)
{
    int64_t t_start = kvc_time_us();
    kvc_err e = { 0 };
    char *prompt = NULL;
    _Static_assert(sizeof(kvc_chat_msg) == sizeof(kvc_chat_message), "message layouts");
    int rc = kvc_chat_render(s->tmpl, (const kvc_chat_msg *)msgs, n, true, &prompt, &e);
    if (rc) {
        if (reply)
            *reply = NULL;
        if (stats)
            memset(stats, 0, sizeof(*stats));
        copy_err(&e, err, err_size);
        return rc;
    }
    rc = kvc_session_run(s, prompt, true, params, stream, user, reply, stats, t_start, &e);
    if (rc)
        copy_err(&e, err, err_size);
    free(prompt);
    return rc;
}

int kvc_session_run(kvc_session *s, const char *prompt, bool chat, const kvc_chat_params *params,
                    kvc_chat_stream_fn stream, void *user, char **reply, kvc_chat_stats *stats,
                    int64_t t_start, kvc_err *err)
{
    kvc_err e = { 0 };
    kvc_chat_params p = params ? *params : kvc_chat_default_params();
    kvc_chat_stats st = { 0 };
    turn t = { .s = s, .p = &p, .stream = stream, .user = user, .err = &e, .reply_end = -1,
               .chat = chat };
    if (reply)
        *reply = NULL;
    kvc_context *c = s->ctx;
    kvc_kv_seq *seq = &c->seqs[s->seq];
    int rc = kvc_sampler_params_check(&p.sampling, &e);
    if (!rc && p.max_tokens < 0)
        rc = kvc_fail(&e, KVC_ERR_INVALID_ARG, "max_tokens %d is negative", p.max_tokens);
    size_t plen = strlen(prompt);
    int32_t keep = 0;
    if (!rc && (rc = prompt_tokens(s, prompt, plen, &t.toks, &keep)))
        kvc_fail(&e, rc, "out of memory tokenizing the prompt");
    int64_t n_prompt = t.toks.n;
    int32_t n_ctx = c->p.n_ctx;
    if (!rc && n_prompt == 0)
        rc = kvc_fail(&e, KVC_ERR_INVALID_ARG, "the prompt is empty");
    int64_t room = n_ctx - n_prompt;
    if (!rc && (room < 1 || (p.max_tokens > 0 && p.max_tokens > room)))
        rc = kvc_fail(&e, KVC_ERR_CONTEXT_LENGTH,
                      "this model's maximum context length is %d tokens; the messages have %lld "
                      "tokens and %d more were requested for the reply",
                      n_ctx, (long long)n_prompt, p.max_tokens > 0 ? p.max_tokens : 1);
    if (!rc) {
        /* what the cache holds: the session's tokens up to the sequence's length */
        int64_t kv_len = KVC_MIN(seq->n_tokens, s->n_tokens);
        int64_t matched = p.no_cache ? 0 : common_prefix(t.toks.v, n_prompt, s->tokens, kv_len);
        if (matched == n_prompt)
            matched--;                       /* logits are needed: run the last token again */
        st.prompt_tokens = (int32_t)n_prompt;
        st.cached_tokens = (int32_t)matched;
        st.computed_tokens = (int32_t)(n_prompt - matched);
        int64_t t0 = kvc_time_us();
        rc = compute(&t, matched);
        st.prompt_ms = (kvc_time_us() - t0) / 1e3;
        st.prompt_tps = st.prompt_ms > 0 ? st.computed_tokens / (st.prompt_ms / 1e3) : 0;
    }
    if (!rc) {
        int32_t max_out = p.max_tokens > 0 ? p.max_tokens : (int32_t)room;
        rc = generate(&t, max_out, &st, t_start);
    }
    if (!rc && (rc = keep_history(s, &t, prompt, plen, n_prompt, keep)))
        kvc_fail(&e, rc, "out of memory");
    if (!rc && reply) {
        size_t rl = (size_t)t.reply_end - t.sent;
        *reply = malloc(rl + 1);
        if (*reply) {
            memcpy(*reply, t.gen + t.sent, rl);
            (*reply)[rl] = 0;
        } else
            rc = kvc_fail(&e, KVC_ERR_NOMEM, "out of memory");
    }
    if (rc) {
        /* a failed turn leaves no half-known state behind: keep what the cache
         * holds consistent with the session's tokens, and forget the text */
        kvc_kv_seq_truncate(c->pool, seq, KVC_MIN(seq->n_tokens, common_prefix(
            s->tokens, s->n_tokens, t.toks.v ? t.toks.v : s->tokens, t.toks.v ? t.toks.n : s->n_tokens)));
        if (err)
            *err = e;
    }
    st.total_ms = (kvc_time_us() - t_start) / 1e3;
    if (stats)
        *stats = st;
    free(t.toks.v);
    free(t.gen);
    return rc;
}

const char *kvc_session_text(const kvc_session *s, size_t *len)
{
    *len = s->text_len;
    return s->text;
}

int kvc_session_render(const kvc_session *s, const kvc_chat_message *msgs, size_t n,
                       char **out, kvc_err *err)
{
    return kvc_chat_render(s->tmpl, (const kvc_chat_msg *)msgs, n, true, out, err);
}
