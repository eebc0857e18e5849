/* turn.h - the inside of a turn (session.h), shared by the files that run
 * one, each a job of it:
 *
 *   session_turn.c  its life: made (kvc_turn_new), stepped through forward
 *                   passes with other turns (kvc_turns_step), cancelled, ended
 *   turn_prepare.c  NEW -> PREFILL: the prompt matched against the session,
 *                   the prefix tree and the tiers, the cached K/V attached
 *                   (moved, after a context shift), blocks reserved
 *   turn_kv.c       its blocks: promised, entered in the prefix tree as they
 *                   are computed, given back by a preemption, grown by decoding
 *   turn_reply.c    the reply's text: each token sampled, stop strings,
 *                   streaming (whole UTF-8 characters, logprobs per piece)
 *
 * Nothing outside src/session/ includes it. One thread: the context's. */
#ifndef KVC_TURN_H
#define KVC_TURN_H

#include "session.h"
#include "turn_sample.h"

/* A turn's stop strings: the template's (a chat's) and the request's. */
typedef struct stops {
    const char *const *tmpl;     /* NULL-terminated */
    const char *const *extra;
    int32_t            n_extra;
} stops;

struct kvc_turn {
    kvc_session    *s;
    kvc_chat_params p;              /* p.stop borrowed */
    kvc_turn_stream_fn stream;
    void           *user;
    int             kind;           /* enum kvc_turn_kind */
    int             phase;          /* enum kvc_turn_phase */
    int             rc;             /* the failure that ended it, KVC_OK */
    kvc_err         err;
    kvc_tokbuf      toks;           /* prompt, then the reply's tokens */
    kvc_tokbuf      marks;          /* where its messages' text begins (kvc_turn_set_marks) */
    int64_t         n_prompt;
    int32_t         max_out;        /* reply tokens at most */
    int64_t         matched;        /* prompt tokens found cached */
    int32_t         dropped;        /* prompt tokens a context shift removed */
    int64_t         moved;          /* of matched, K/V moved by the shift */
    int64_t         from_disk;      /* of matched, read from the disk tier */
    /* generation */
    kvc_sampler    *smp;
    turn_sample     ts;             /* grammar mask, logit_bias, logprobs */
    stops           st;
    const char     *sep;            /* the template's reply separator */
    size_t          sep_len;        /* of it, found at the reply's start */
    char           *gen;            /* generated text (the raw bytes of the pieces) */
    size_t          gen_len, gen_cap;
    size_t          sent;           /* bytes of gen passed to stream */
    size_t         *tok_end;        /* logprobs asked for: where each reply token's text
                                       ends in gen (n_tok_end of cap_tok_end) */
    size_t          n_tok_end, cap_tok_end;
    int32_t         lp_sent;        /* reply tokens whose logprobs went with a piece */
    int64_t         reply_end;      /* where the reply ends in gen (a stop string), -1 */
    int32_t         n_out;
    bool            cancelled;
    const char     *finish;         /* finish_reason */
    /* KV */
    int64_t         max_blocks;     /* blocks of the longest sequence the turn can reach */
    int64_t         n_fill;         /* tokens to prefill: the prompt; after a preemption,
                                       every token so far (they are computed again) */
    int32_t         n_preempted;    /* times it gave its blocks back (kvc_turn_preempt) */
    int64_t         promise;        /* of them, not yet allocated: part of ctx->promised */
    kvc_pc_node    *anchor;         /* pinned tree node of block n_pub - 1; NULL = root */
    int32_t         n_pub;          /* the sequence's blocks [0, n_pub) are anchor's path */
    int32_t         pub_lim;        /* blocks [pub_lim, ...) never enter the tree (shifted) */
    bool            pub_off;        /* enter no more blocks (cancelled, out of memory) */
    kvc_pc_node   **pend;           /* pending nodes entered: blocks [pend_first, +n_pend) */
    int32_t         pend_first, n_pend, n_pend_ready;
    /* times (kvc_time_us) */
    int64_t         t_start, t_prefill, t_prompt_done, t_first, t_end;
};

/* The turn's sequence in the context's pool. */
#define SEQ(t) (&(t)->s->ctx->seqs[(t)->s->seq])

/* ------------------------------------------------------- session_turn.c */

/* End turn t with status rc (the first failure is kept in t->rc): DONE.
 * Returns rc. */
int  turn_fail(kvc_turn *t, int rc);

/* ------------------------------------------------------------ turn_kv.c */

/* Set the turn's promise (blocks it may still allocate), keeping
 * ctx->promised the sum of the running turns' promises. */
void turn_set_promise(kvc_turn *t, int64_t promise);

/* The promise of a turn as it stands: the blocks to the end of its prefill
 * not allocated yet (decoding grows block by block, kvc_turns_grow: it is
 * not promised up front). */
void turn_update_promise(kvc_turn *t);

/* Enter block i of the sequence (tokens toks[i*B, i*B+B)) under the anchor;
 * pending: its K/V are still to be computed. A node of the same content that
 * is there already is followed instead. Returns false when it could not: a
 * node another turn is computing is in the way (try again later), memory
 * ran out, or the block is past pub_lim (then no more blocks are entered). */
bool turn_enter_block(kvc_turn *t, int32_t i, bool pending);

/* After a forward pass: the turn's pending blocks now computed become ready,
 * and newly full blocks (the reply's) enter the tree. */
void turn_publish(kvc_turn *t);

/* Take the pending blocks not computed out of the tree (cancel, failure,
 * preemption): turns waiting for them then compute them themselves. No more
 * blocks are entered afterwards. */
void turn_drop_pending(kvc_turn *t);

/* --------------------------------------------------------- turn_reply.c */

/* Logits for the next token are here: sample it, stream its text, decide
 * (DECODE, or DONE with a finish reason; a failure fails the turn). */
void turn_on_logits(kvc_turn *t, const float *logits);

/* The reply ends with finish_reason `reason`: the stream is flushed, the
 * turn DONE. The last token sampled stays in the turn's tokens, its K/V not
 * computed: a stop token never enters the reply's tokens. The background
 * turn that follows a chat reply computes the conversation's end of turn as
 * the next request will carry it. */
void turn_finish(kvc_turn *t, const char *reason);

#endif
