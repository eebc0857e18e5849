/* turn_sample.h - what a turn adds to plain sampling for the agent API
 * (issue 13): constrained decoding (a grammar's token mask every step),
 * logit_bias, and the log-probabilities of the reply's tokens.
 *
 * A turn (turn.h) owns one turn_sample: made with the turn, asked
 * for each reply token (turn_sample_pick), told which token was kept
 * (turn_sample_accept), freed with the turn. One thread: the context's. */
#ifndef KVC_TURN_SAMPLE_H
#define KVC_TURN_SAMPLE_H

#include "context.h"
#include "grammar.h"
#include "sampler.h"

typedef struct turn_sample {
    kvc_grammar       *g;          /* owned; NULL = no grammar */
    kvc_gmatch        *m;          /* owned; the matcher of g over ctx->gvocab */
    uint32_t          *mask;       /* kvc_mask_words(n_mask) words */
    int32_t            n_mask;     /* the vocabulary's size */
    int32_t            top;        /* logprobs: -1 = none, else the top count */
    kvc_token_logprob *lp;         /* one per reply token kept (n_lp of cap_lp) */
    int32_t            n_lp;
    size_t             cap_lp;
} turn_sample;

/* Set up ts for params p on context c: the grammar parsed (c->gvocab made on
 * first use), the logit biases given to smp. KVC_ERR_INVALID_ARG naming what
 * was wrong (a bad grammar, a bias id out of range), KVC_ERR_NOMEM. ts is
 * zeroed first and may be freed whatever the result. */
int  turn_sample_init(turn_sample *ts, kvc_context *c, const kvc_chat_params *p,
                      kvc_sampler *smp, kvc_err *err);
void turn_sample_free(turn_sample *ts);

/* The next token from logits in *id: masked by the grammar when there is
 * one, and steered to the grammar's end when only `left` tokens remain for
 * it; -1 when the grammar allows nothing more (it has ended). Records the
 * token's log-probability when asked for (see turn_sample_accept). KVC_OK,
 * or the matcher's failure with err saying why: KVC_ERR_UNSUPPORTED when the
 * grammar is too costly to match here (a cost limit of grammar.h), which
 * ends the reply as an error, never as a finished one; KVC_ERR_NOMEM. */
int  turn_sample_pick(turn_sample *ts, kvc_sampler *smp, const float *logits, int32_t n_vocab,
                      int32_t left, int32_t *id, kvc_err *err);

/* The token picked is kept in the reply (the grammar advances; its logprob
 * stays recorded). A token that ends the reply is not accepted. KVC_OK,
 * KVC_ERR_NOMEM, or the matcher's KVC_ERR_UNSUPPORTED (err says why). */
int  turn_sample_accept(turn_sample *ts, int32_t token, kvc_err *err);

/* Whether there is a grammar and it is closed (kvc_gmatch_is_closed): only
 * the end may follow, so a reply cut here by max_tokens is whole ("stop"). */
bool turn_sample_closed(const turn_sample *ts);

/* Masks computed and their time, for the stats. */
void turn_sample_stats(const turn_sample *ts, int32_t *n_masks, double *mask_ms);

/* Give the recorded logprobs away (*out malloc'd, NULL when none). */
void turn_sample_take_logprobs(turn_sample *ts, kvc_token_logprob **out, int32_t *n);

#endif
