/* context.h - the inside of a kvc_context, for the parts built on it (session).
 *
 * A context is a model's forward-pass state (kvc_compute), a paged KV pool and
 * n_seq block tables into it. */
#ifndef KVC_CONTEXT_H
#define KVC_CONTEXT_H

#include "model.h"

struct kvc_context {
    kvc_model   *model;
    kvc_context_params p;
    kvc_kv_pool *pool;
    kvc_compute *compute;
    kvc_kv_seq  *seqs;          /* n_seq */
    kvc_batch_item *items;      /* n_batch */
    float       *logits;        /* logits_cap rows of n_vocab */
    int32_t      logits_cap;
    int32_t      n_logits;      /* rows held by the last decode */
};

#endif
