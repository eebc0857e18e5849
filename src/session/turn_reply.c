/* turn_reply.c - the reply's text (turn.h): each token sampled from the
 * logits a forward pass gave (turn_sample.h: grammar, logit_bias, logprobs),
 * its text appended, stop strings found, and the text streamed in pieces cut
 * between whole characters (and, with logprobs, whole tokens), so that the
 * pieces repaired one by one are the whole reply repaired. */
#include "tokenizer.h"
#include "turn.h"
#include "unicode.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------- stop strings */

/* Stop string i of list `pass` (0: the template's, 1: the request's); NULL
 * past the list's end. */
static const char *stop_word(const stops *st, int pass, int32_t i)
{
    return pass == 0 ? st->tmpl[i] : i < st->n_extra ? st->extra[i] : NULL;
}

/* The first position in text[0, len) where a stop string starts, or -1. */
static int64_t find_stop(const stops *st, const char *text, size_t len)
{
    int64_t best = -1;
    const char *w;
    for (int pass = 0; pass < 2; pass++)
        for (int32_t i = 0; (w = stop_word(st, pass, i)); i++) {
            const char *hit = *w ? memmem(text, len, w, strlen(w)) : NULL;
            if (hit && (best < 0 || hit - text < best))
                best = hit - text;
        }
    return best;
}

/* How many bytes at the end of text[0, len) could begin a stop string. */
static size_t stop_holdback(const stops *st, const char *text, size_t len)
{
    size_t hold = 0;
    const char *w;
    for (int pass = 0; pass < 2; pass++)
        for (int32_t i = 0; (w = stop_word(st, pass, i)); i++) {
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

/* ------------------------------------------------------- the reply's text */

/* Append a token's text piece[0, n) to the reply's text (NUL-terminated). */
static int gen_append(kvc_turn *t, const char *piece, int n)
{
    bool oom = false;
    kvc_text_append(&t->gen, &t->gen_len, &t->gen_cap, &oom, piece, (size_t)n);
    return oom ? kvc_fail(&t->err, KVC_ERR_NOMEM, "out of memory") : KVC_OK;
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

/* ---------------------------------------------------------------- decode */

void turn_finish(kvc_turn *t, const char *reason)
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

void turn_on_logits(kvc_turn *t, const float *logits)
{
    const kvc_tokenizer *tok = t->s->ctx->model->tok;
    int32_t id;
    int rc = turn_sample_pick(&t->ts, t->smp, logits, t->s->ctx->model->hp.n_vocab,
                              t->max_out - t->n_out, &id, &t->err);
    if (t->n_out == 0)
        t->t_first = kvc_time_us();
    if (rc) {                                /* an error, never a "stop" on a cut reply */
        turn_fail(t, rc);
        return;
    }
    if (id < 0 || ends_reply(tok, id)) {     /* -1: the grammar has ended */
        turn_finish(t, "stop");
        return;
    }
    if ((rc = turn_sample_accept(&t->ts, id, &t->err))) {
        turn_fail(t, rc);
        return;
    }
    kvc_sampler_accept(t->smp, id);
    if (kvc_tokbuf_reserve(&t->toks, t->toks.n + 1)) {
        turn_fail(t, kvc_fail(&t->err, KVC_ERR_NOMEM, "out of memory"));
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
        turn_fail(t, KVC_ERR_NOMEM);
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
        turn_finish(t, "stop");
    else if (t->cancelled)
        turn_finish(t, "cancelled");
    else if (t->n_out >= t->max_out)        /* a grammar closed on the last token: only the
                                               end could follow (as an EOG would have) */
        turn_finish(t, turn_sample_closed(&t->ts) ? "stop" : "length");
    else
        t->phase = KVC_TURN_DECODE;
}
