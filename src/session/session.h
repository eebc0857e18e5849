/* session.h - the inside of a session, and the turn: one request on one
 * session, as steps a scheduler interleaves with other sessions' turns.
 *
 * A turn goes through these phases (DESIGN.md §3, §4):
 *
 *   NEW      kvc_turn_new: the prompt is tokenized (text prefix first: the
 *            session's checkpoints), its size checked against the context and
 *            the KV pool. Nothing is changed yet.
 *   PREFILL  kvc_turn_prepare: the prompt is matched against the session's
 *            tokens and the context's prefix tree; the sequence is truncated to
 *            the match and given the tree's blocks; blocks for the rest are
 *            reserved, and the prompt's full blocks entered in the tree as
 *            pending (another turn needing them waits for them). The scheduler
 *            then feeds the prompt through forward passes in chunks.
 *   DECODE   one token per step: sample, stop strings, stream.
 *   FINISH   the last tokens of the reply (and the end-of-generation token,
 *            which stays in the cache) are computed, no logits needed.
 *   DONE     kvc_turn_end: the session keeps the conversation (tokens, text,
 *            checkpoints), the turn is freed.
 *
 * kvc_turns_step runs one forward pass over several turns: decode tokens
 * first, then prefill chunks in order, up to n_batch tokens. kvc_session_chat
 * runs one turn through these same steps alone; the engine runs many.
 *
 * Memory: a turn reserves at PREFILL every block it can ever need (prompt
 * plus max_tokens); what it has not allocated yet is promised (ctx->promised)
 * and kept free, so a running turn never runs out of blocks. Each full block
 * computed enters the prefix tree (one reference), so what any turn computed
 * can be found by any other.
 *
 * One thread: the one that owns the context. */
#ifndef KVC_SESSION_H
#define KVC_SESSION_H

#include "chat_template.h"
#include "context.h"

/* A place where the session's text and tokens line up exactly: text[0,
 * text_len) is what tokens[0, n_tokens) stand for. Kept at the end of every
 * prompt and every reply, so a request that shares only part of the text (a
 * regenerated reply, an edited message) still reuses the tokens before it. */
typedef struct kvc_checkpoint {
    size_t  text_len;
    int64_t n_tokens;
} kvc_checkpoint;

struct kvc_session {
    kvc_context    *ctx;
    int32_t         seq;           /* its sequence in ctx */
    kvc_chat_template *tmpl;       /* the chat template (owned) */
    int32_t        *tokens;        /* the conversation's tokens so far (prompt + reply) */
    int64_t         n_tokens;
    int64_t         cap;
    char           *text;          /* the exact text tokens[0, n_tokens) stand for; NULL = unknown */
    size_t          text_len;
    kvc_checkpoint *cps;           /* where text and tokens are known to line up */
    int32_t         n_cps, cap_cps;
    int64_t         shifted;       /* first position whose K/V a context shift moved (or
                                      that was computed after one): blocks from
                                      shifted / B on differ from a cold run and never
                                      enter the prefix tree; -1 = none */
};

/* A growable token array. */
typedef struct kvc_tokbuf {
    int32_t *v;
    int64_t  n, cap;
} kvc_tokbuf;

int kvc_tokbuf_reserve(kvc_tokbuf *b, int64_t need);   /* KVC_ERR_NOMEM */

/* ------------------------------------------------------------ session.c */

/* The prompt's tokens into *out (empty): those of the session's longest
 * checkpoint whose text is a prefix of the prompt, then the rest of the text
 * tokenized as a continuation. *keep gets the number of checkpoints still
 * valid. KVC_ERR_NOMEM. */
int kvc_session_prompt_tokens(const kvc_session *s, const char *prompt, size_t len,
                              kvc_tokbuf *out, int32_t *keep);

/* Remember a finished turn: the conversation's tokens become toks (taken:
 * toks->v is NULL afterwards), its text prompt + gen, its checkpoints the
 * `keep` still valid plus the prompt's end (n_prompt tokens) and the reply's
 * end. KVC_ERR_NOMEM (the checkpoints are then dropped). */
int kvc_session_keep(kvc_session *s, const char *prompt, size_t plen, const char *gen,
                     size_t gen_len, kvc_tokbuf *toks, int64_t n_prompt, int32_t keep);

/* Release the session's hold on its blocks (they stay in the prefix tree until
 * evicted) but keep its conversation: its next turn tokenizes as before and
 * finds in the tree what is still there. Returns the blocks freed. */
int64_t kvc_session_drop_kv(kvc_session *s);

/* The exact text the session's cached tokens stand for (NULL when unknown),
 * and its length. */
const char *kvc_session_text(const kvc_session *s, size_t *len);

/* Render msgs with the session's chat template into a malloc'd string, with
 * p's tools and template kwargs (p may be NULL). */
int kvc_session_render(const kvc_session *s, const kvc_chat_message *msgs, size_t n,
                       const kvc_chat_params *p, char **out, kvc_err *err);

/* Render msgs like kvc_session_render; with p->overflow KVC_OVERFLOW_SHIFT,
 * when the prompt's tokens plus max_tokens (at least 1) exceed the context,
 * drop the oldest whole turns (a user message and what follows it up to the
 * next user message), keeping a leading system message, until it fits.
 * *dropped gets the prompt tokens removed (0 when nothing was).
 * KVC_ERR_CONTEXT_LENGTH (with the sizes) when even the system prompt and the
 * last user message do not fit; KVC_ERR_NOMEM. */
int kvc_session_render_fit(const kvc_session *s, const kvc_chat_message *msgs, size_t n,
                           const kvc_chat_params *p, char **out, int32_t *dropped, kvc_err *err);

/* ------------------------------------------------------- session_turn.c */

typedef struct kvc_turn kvc_turn;

enum kvc_turn_phase {
    KVC_TURN_NEW = 0,
    KVC_TURN_PREFILL,
    KVC_TURN_DECODE,
    KVC_TURN_FINISH,
    KVC_TURN_DONE,
};

/* kvc_turn_prepare's answers besides KVC_OK and errors. */
enum {
    KVC_TURN_WAIT_PREFIX = 1,  /* another turn is computing a block of this prompt */
    KVC_TURN_WAIT_MEMORY = 2,  /* not enough free blocks yet (err says how many) */
};

/* Free blocks until n_free are free (evicting, dropping idle sessions' holds);
 * returns whether they are. */
typedef bool (*kvc_room_fn)(kvc_context *ctx, int64_t n_free, void *user);

/* A turn of session s on prompt text (copied). chat: the chat template's stop
 * strings and reply separator apply (false: a raw completion). params are
 * copied, but params->stop is borrowed until kvc_turn_end. stream (may be
 * NULL) gets the reply text as it is generated, from kvc_turns_step; it
 * returns false to stop. t_start: when the request arrived (kvc_time_us).
 * The session must have no other turn until kvc_turn_end.
 * Errors (nothing changed, *out NULL): KVC_ERR_INVALID_ARG (sampling, negative
 * max_tokens, an empty prompt), KVC_ERR_CONTEXT_LENGTH (prompt + max_tokens
 * over the context, with the sizes), KVC_ERR_KV_FULL (more than the whole KV
 * pool could ever hold), KVC_ERR_NOMEM. */
int  kvc_turn_new(kvc_session *s, const char *prompt, bool chat, const kvc_chat_params *params,
                  kvc_chat_stream_fn stream, void *user, int64_t t_start, kvc_turn **out,
                  kvc_err *err);

/* Match, attach, reserve (phase NEW -> PREFILL). KVC_OK; KVC_TURN_WAIT_PREFIX
 * or KVC_TURN_WAIT_MEMORY (nothing attached: call again later; room, which
 * may be NULL, was asked to free blocks first); or a negative status (the
 * turn is DONE and failed). A no-op returning KVC_OK in other phases. */
int  kvc_turn_prepare(kvc_turn *t, kvc_room_fn room, void *user, kvc_err *err);

int  kvc_turn_phase(const kvc_turn *t);

/* Stop the turn (a client went away): before PREFILL it becomes DONE with
 * nothing changed; in PREFILL, DONE with what was computed kept; in DECODE it
 * computes its last token in the next step and is DONE. finish_reason
 * "cancelled". Idempotent. */
void kvc_turn_cancel(kvc_turn *t);

/* One forward pass over the turns in PREFILL, DECODE and FINISH: decode and
 * finishing tokens first, then prefill chunks in array order, up to n_batch
 * tokens; then each turn consumes its logits (sampling, streaming). Returns
 * the number of tokens run (0: nothing to run). A failed pass fails the turns
 * in it (DONE) and returns the negative status, with the message in *err. */
int  kvc_turns_step(kvc_context *c, kvc_turn **turns, int32_t n, kvc_err *err);

/* End the turn (any phase) and free it. A turn that got through PREFILL
 * becomes the session's conversation; *reply (may be NULL) gets the malloc'd
 * reply text ("" for a turn cancelled early), *stats (may be NULL) its stats.
 * A failed turn leaves the session's conversation as it was (its cache
 * consistent with it): returns the status and the message in *err. NULL ok. */
int  kvc_turn_end(kvc_turn *t, char **reply, kvc_chat_stats *stats, kvc_err *err);

/* The prompt tokens kvc_session_render_fit dropped for this turn (before
 * kvc_turn_prepare). With overflow KVC_OVERFLOW_SHIFT and dropped > 0, prepare
 * moves the session's cached K/V of the kept turns to their new positions
 * (re-rotating K) instead of recomputing them. */
void kvc_turn_set_dropped(kvc_turn *t, int32_t dropped);

/* The session a turn runs on. */
kvc_session *kvc_turn_session(const kvc_turn *t);

#endif
