/* turn_sample.c - constrained decoding, logit_bias and logprobs for a turn
 * (turn_sample.h). */
#include "turn_sample.h"
#include "model.h"

#include <stdlib.h>
#include <string.h>

/* Characters before the grammar's shortest end at which steering starts:
 * more than one token adds to it (an object's "{" opening required keys). */
enum { STEER_WINDOW = 64 };

int turn_sample_init(turn_sample *ts, kvc_context *c, const kvc_chat_params *p,
                     kvc_sampler *smp, kvc_err *err)
{
    memset(ts, 0, sizeof(*ts));
    ts->top = p->logprobs < 0 ? -1 : KVC_MIN(p->logprobs, KVC_MAX_TOP_LOGPROBS);
    int rc;
    if (p->n_logit_bias > 0 &&
        (rc = kvc_sampler_set_logit_bias(smp, p->logit_bias, p->n_logit_bias, err)))
        return rc;
    if (!p->grammar)
        return KVC_OK;
    if ((rc = kvc_grammar_parse(p->grammar, strlen(p->grammar), &ts->g, err))) {
        char msg[sizeof(err->msg)];
        memcpy(msg, err->msg, sizeof(msg));
        return rc == KVC_ERR_NOMEM ? rc : kvc_fail(err, KVC_ERR_INVALID_ARG, "grammar: %.400s", msg);
    }
    if (!c->gvocab && (rc = kvc_gvocab_new(c->model->tok, &c->gvocab, err)))
        return rc;
    kvc_err me = { 0 };
    if (!(ts->m = kvc_gmatch_new_budget(ts->g, c->gvocab, 0, &me)))
        return me.code == KVC_ERR_NOMEM ? kvc_fail(err, KVC_ERR_NOMEM, "out of memory")
                                        : kvc_fail(err, KVC_ERR_INVALID_ARG, "grammar: %.400s", me.msg);
    ts->n_mask = kvc_gvocab_n_vocab(c->gvocab);
    ts->mask = malloc(kvc_mask_words(ts->n_mask) * sizeof(uint32_t));
    if (!ts->mask)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    return KVC_OK;
}

void turn_sample_free(turn_sample *ts)
{
    kvc_gmatch_free(ts->m);
    kvc_grammar_free(ts->g);
    free(ts->mask);
    free(ts->lp);
    memset(ts, 0, sizeof(*ts));
}

/* Record token's logprob and the top ones (the raw logits). */
static void record(turn_sample *ts, const float *logits, int32_t n_vocab, int32_t token)
{
    if (!kvc_grow((void **)&ts->lp, &ts->cap_lp, (size_t)ts->n_lp, sizeof(*ts->lp)))
        return;                              /* out of memory: accept finds it missing */
    kvc_token_logprob *e = &ts->lp[ts->n_lp];
    kvc_logprob top[KVC_MAX_TOP_LOGPROBS];
    int32_t n_top = 0;
    e->token = token;
    e->logprob = kvc_logprobs(logits, n_vocab, token, top, ts->top, &n_top);
    e->n_top = n_top;
    for (int32_t i = 0; i < n_top; i++) {
        e->top_token[i] = top[i].token;
        e->top_logprob[i] = top[i].logprob;
    }
}

/* The matcher's failure rc as the turn's error: what the grammar's limits
 * refused, after how many tokens. */
static int matcher_failed(const turn_sample *ts, int rc, kvc_err *err)
{
    if (rc == KVC_ERR_NOMEM)
        return kvc_fail(err, rc, "out of memory");
    /* the request's grammar is at fault: an invalid request (HTTP 400) */
    return kvc_fail(err, KVC_ERR_INVALID_ARG, "constrained decoding stopped after %d tokens: %.400s",
                    kvc_gmatch_n_steps(ts->m), kvc_gmatch_error(ts->m));
}

int turn_sample_pick(turn_sample *ts, kvc_sampler *smp, const float *logits, int32_t n_vocab,
                     int32_t left, int32_t *id, kvc_err *err)
{
    *id = -1;
    if (ts->m) {
        /* when the tokens left come near what the grammar still needs, only
         * the tokens after which the rest still fits (one byte a token at
         * worst): a reply cut by max_tokens would not parse. If it already
         * cannot fit that way, the tokens that stride furthest to the end
         * (it may still fit in long tokens), then any (it ends "length"). */
        int32_t n = 0, need = kvc_gmatch_min_remaining(ts->m);
        if (left - 1 < need + STEER_WINDOW)
            n = kvc_gmatch_mask_within(ts->m, ts->mask, left - 1);
        if (n == 0 && left <= need + 1)
            n = kvc_gmatch_mask_nearest(ts->m, ts->mask);
        if (n == 0)
            n = kvc_gmatch_mask(ts->m, ts->mask);
        if (n < 0)
            return matcher_failed(ts, n, err);
        if (n == 0)
            return KVC_OK;                   /* an EOG was accepted: the grammar ended */
        kvc_sampler_set_mask(smp, ts->mask);
    }
    *id = kvc_sampler_sample(smp, logits);
    if (*id >= 0 && ts->top >= 0)
        record(ts, logits, n_vocab, *id);
    return KVC_OK;
}

int turn_sample_accept(turn_sample *ts, int32_t token, kvc_err *err)
{
    if (ts->top >= 0) {
        if ((size_t)ts->n_lp == ts->cap_lp || ts->lp[ts->n_lp].token != token)
            return kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
        ts->n_lp++;
    }
    /* the mask allowed it: only a cost limit or out of memory can refuse it */
    int rc = ts->m ? kvc_gmatch_accept_token(ts->m, token) : KVC_OK;
    return rc ? matcher_failed(ts, rc, err) : KVC_OK;
}

bool turn_sample_closed(const turn_sample *ts)
{
    return ts->m && kvc_gmatch_is_closed(ts->m);
}

void turn_sample_stats(const turn_sample *ts, int32_t *n_masks, double *mask_ms)
{
    kvc_gmatch_stats st = ts->m ? kvc_gmatch_get_stats(ts->m) : (kvc_gmatch_stats){ 0 };
    *n_masks = (int32_t)st.n_masks;
    *mask_ms = st.mask_us / 1e3;
}

void turn_sample_take_logprobs(turn_sample *ts, kvc_token_logprob **out, int32_t *n)
{
    *out = ts->n_lp ? ts->lp : NULL;
    *n = ts->n_lp;
    if (ts->n_lp) {
        ts->lp = NULL;
        ts->n_lp = ts->cap_lp = 0;
    }
}
