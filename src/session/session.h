/* session.h - the inside of a session, and the turn: one request on one
 * session, as steps a scheduler interleaves with other sessions' turns.
 *
 * A turn goes through these phases (DESIGN.md §3, §4):
 *
 *   NEW      kvc_turn_new: the prompt's tokens (prompt.h: a function of the
 *            request alone) are checked against the context and the KV pool.
 *            Nothing is changed yet.
 *   PREFILL  kvc_turn_prepare: the tokens are matched against the session's
 *            tokens and the context's prefix tree (the longest common token
 *            prefix); the sequence is truncated to the match and given the
 *            tree's blocks; blocks for the rest are reserved, and the prompt's
 *            full blocks entered in the tree as pending (another turn needing
 *            them waits for them). The scheduler then feeds the prompt through
 *            forward passes in chunks.
 *   DECODE   one token per step: sample, stop tokens and strings, stream.
 *   DONE     kvc_turn_end: the session keeps the conversation's tokens, the
 *            turn is freed.
 *
 * A BACKGROUND turn has no reply: it computes its tokens (the canonical form
 * of the conversation as the next request will carry it, prompt.h) and is
 * DONE. It may be cancelled at any step; what it computed stays. The engine
 * runs such turns only when no request is waiting or running.
 *
 * kvc_turns_step runs one forward pass over several turns: decode tokens
 * first, then prefill chunks in order, up to n_batch tokens. kvc_session_chat
 * runs one turn through these same steps alone; the engine runs many.
 *
 * Memory: a turn reserves at PREFILL the blocks of its prompt; what it has
 * not allocated yet is promised (ctx->promised) and kept free. Decoding grows
 * the sequence a block at a time (kvc_turns_grow makes room before a step,
 * preempting the newest turns when the pool runs dry); ctx->growth_reserve
 * blocks are kept free for that at admission. Each full block
 * computed enters the prefix tree (one reference), so what any turn computed
 * can be found by any other.
 *
 * One thread: the one that owns the context. */
#ifndef KVC_SESSION_H
#define KVC_SESSION_H

#include "context.h"
#include "prompt.h"

struct kvc_session {
    kvc_context    *ctx;
    int32_t         seq;           /* its sequence in ctx */
    const kvc_chat_template *tmpl; /* the chat template: the context's, or own_tmpl */
    kvc_chat_template *own_tmpl;   /* owned when it differs from the context's; else NULL */
    kvc_tokbuf      toks;          /* the conversation's tokens: the last prompt and the
                                      reply, or their canonical continuation. The
                                      sequence holds the K/V of a prefix of them */
    uint64_t        ns;            /* its cache namespace: every block it uses or publishes
                                      is of this namespace (set while it holds nothing) */
    int64_t         n_prompt;      /* tokens of its last request's prompt: a request
                                      that starts with them continues it */
    uint64_t        serial;        /* counts the session's turns and resets: work
                                      planned for one state is dropped in another */
    int64_t         shifted;       /* first position whose K/V a context shift moved (or
                                      that was computed after one): blocks from
                                      shifted / B on differ from a cold run and never
                                      enter the prefix tree; -1 = none */
    bool            cold;          /* its last turn was a cold run (no_cache): what it
                                      holds is published nowhere */
};

/* ------------------------------------------------------------ session.c */

/* Remember a finished turn: the conversation's tokens become toks (taken:
 * toks->v is NULL afterwards), of which n_prompt were its request's prompt;
 * a new serial number. */
void kvc_session_keep(kvc_session *s, kvc_tokbuf *toks, int64_t n_prompt);

/* Release the session's hold on its blocks (they stay in the prefix tree until
 * evicted) but keep its conversation: its next turn finds in the tree what is
 * still there. Returns the blocks freed. */
int64_t kvc_session_drop_kv(kvc_session *s);

/* Before its K/V goes (kvc_session_drop_kv, kvc_session_reset): send the
 * sequence's last, partial block down to the tiers below RAM, where the tree's
 * full blocks go too, so the conversation's next turn reads it back
 * (kvc_tiers_write_tail). Nothing without tiers, after a cold turn, or where a
 * context shift made the K/V differ from a cold run. */
void kvc_session_spill_tail(kvc_session *s);

/* Whether the session holds a conversation. */
bool kvc_session_in_use(const kvc_session *s);

/* The namespace id of a cache namespace name: 0 (the default) for NULL and
 * "", else a 64-bit hash of it that is never 0. */
uint64_t kvc_namespace_id(const char *name);

/* The length of the longest common prefix of a[0, na) and b[0, nb). */
int64_t kvc_tokens_common(const int32_t *a, int64_t na, const int32_t *b, int64_t nb);

/* How many of tokens[0, n) the session's conversation starts with. */
int64_t kvc_session_common(const kvc_session *s, const int32_t *tokens, int64_t n);

/* Where the kept turns of a shifted prompt nw[0, n_new) are in a session's
 * tokens old[0, n_old): the offset a > s where the longest run of nw[s, n_new)
 * starts in old; its length in *k (0 and -1: none). */
int64_t kvc_session_find_moved(const int32_t *nw, int64_t n_new, const int32_t *old,
                               int64_t n_old, int64_t s, int64_t *k);

/* Do tokens[0, n), which share `common` tokens with the session's (less than
 * its last prompt), continue its conversation after a context shift dropped
 * turns? Yes when the rest of its last prompt, from some point after the
 * common part on, follows the common part in tokens: the request is the
 * session's last prompt with a run of it taken out. */
bool kvc_session_continues_shifted(const kvc_session *s, const int32_t *tokens, int64_t n,
                                   int64_t common);

/* ----------------- session_turn.c, turn_prepare.c, turn_kv.c, turn_reply.c */

typedef struct kvc_turn kvc_turn;

enum kvc_turn_phase {
    KVC_TURN_NEW = 0,
    KVC_TURN_PREFILL,
    KVC_TURN_DECODE,
    KVC_TURN_DONE,
};

enum kvc_turn_kind {
    KVC_TURN_CHAT = 0,         /* a chat reply: the template's stop strings apply */
    KVC_TURN_COMPLETION,       /* a raw completion */
    KVC_TURN_BACKGROUND,       /* compute the tokens, generate nothing */
};

/* kvc_turn_prepare's answers besides KVC_OK and errors. */
enum {
    KVC_TURN_WAIT_PREFIX = 1,  /* another turn is computing a block of this prompt */
    KVC_TURN_WAIT_MEMORY = 2,  /* not enough free blocks yet (err says how many) */
};

/* Free blocks until n_free are free (evicting, dropping idle sessions' holds);
 * returns whether they are. */
typedef bool (*kvc_room_fn)(kvc_context *ctx, int64_t n_free, void *user);

/* A turn's stream: a piece of reply text and, when logprobs are asked for
 * (params->logprobs >= 0), the logprobs of the reply tokens the piece carries
 * (lp[0, n_lp), borrowed for the call; lp NULL when they are off). Such a
 * piece ends where a token ends, and carries the tokens that end in it; the
 * reply's last piece carries every token whose text it shows a part of. What
 * no piece carries (a stop string's tokens, a separator before any text) is
 * only in kvc_turn_take_logprobs's list, which has every token. Returns false
 * to stop generating. */
typedef bool (*kvc_turn_stream_fn)(const char *text, size_t len, const kvc_token_logprob *lp,
                                   int32_t n_lp, void *user);

/* A turn of session s on tokens[0, n) (copied). params are copied, but
 * params->stop is borrowed until kvc_turn_end. stream (may be NULL) gets the
 * reply text as it is generated, from kvc_turns_step, always valid UTF-8 (a
 * character split across tokens is held back; bytes that cannot form one
 * become U+FFFD). t_start: when the request arrived
 * (kvc_time_us). The session must have no other turn until kvc_turn_end.
 * Errors (nothing changed, *out NULL): KVC_ERR_INVALID_ARG (sampling, negative
 * max_tokens, no tokens), KVC_ERR_CONTEXT_LENGTH (prompt + max_tokens over the
 * context, with the sizes), KVC_ERR_KV_FULL (more than the whole KV pool could
 * ever hold), KVC_ERR_NOMEM. */
int  kvc_turn_new(kvc_session *s, const int32_t *tokens, int64_t n, int kind,
                  const kvc_chat_params *params, kvc_turn_stream_fn stream, void *user,
                  int64_t t_start, kvc_turn **out, kvc_err *err);

/* Match, attach, reserve (phase NEW -> PREFILL). KVC_OK; KVC_TURN_WAIT_PREFIX
 * or KVC_TURN_WAIT_MEMORY (nothing attached: call again later; room, which
 * may be NULL, was asked to free blocks first); or a negative status (the
 * turn is DONE and failed). A no-op returning KVC_OK in other phases. */
int  kvc_turn_prepare(kvc_turn *t, kvc_room_fn room, void *user, kvc_err *err);

int  kvc_turn_phase(const kvc_turn *t);

/* Preemption (DESIGN.md §5): give back every block of a turn in PREFILL or
 * DECODE and go back to NEW, keeping its tokens, sampler and reply so far.
 * Its full blocks stay in the prefix tree (and go through to the disk tier),
 * so the next kvc_turn_prepare finds them there or on disk and recomputes
 * only the rest; as the forward pass is batch-invariant, the reply goes on
 * bitwise as it would have. KVC_ERR_INVALID_ARG in other phases. */
int  kvc_turn_preempt(kvc_turn *t);

/* The turn's tokens so far (prompt, then the reply's): borrowed, valid until
 * the turn's next step or end. */
const int32_t *kvc_turn_tokens(const kvc_turn *t, int64_t *n);

/* Growth: a decoding turn takes a block when its next token starts one; the
 * pool may run dry mid-decode. Before a step over turns[0, n) (oldest
 * first), make sure their next tokens have blocks: ask room for them, and
 * while that fails preempt the newest (turns[n - 1], then n - 2, ...), never
 * the last one left. Returns how many remain (the first ones); the others
 * are preempted (phase NEW: prepare them again later). */
int32_t kvc_turns_grow(kvc_context *c, kvc_turn **turns, int32_t n, kvc_room_fn room,
                       void *user);

/* Stop the turn (a client went away): before PREFILL it becomes DONE with
 * nothing changed; in PREFILL or DECODE, DONE with what was computed kept.
 * finish_reason "cancelled". Idempotent. */
void kvc_turn_cancel(kvc_turn *t);

/* One forward pass over the turns in PREFILL and DECODE: decode tokens
 * first, then prefill chunks in array order, up to max_tokens (<= 0: n_batch)
 * tokens; then each turn consumes its logits (sampling, streaming). Returns
 * the number of tokens run (0: nothing to run). A failed pass fails the turns
 * in it (DONE) and returns the negative status, with the message in *err. */
int  kvc_turns_step(kvc_context *c, kvc_turn **turns, int32_t n, int32_t max_tokens,
                    kvc_err *err);

/* End the turn (any phase) and free it. A turn that got through PREFILL
 * becomes the session's conversation; *reply (may be NULL) gets the malloc'd
 * reply text ("" for a turn cancelled early), *stats (may be NULL) its stats.
 * A failed turn leaves the session's conversation as it was (its cache
 * consistent with it): returns the status and the message in *err. NULL ok. */
int  kvc_turn_end(kvc_turn *t, char **reply, kvc_chat_stats *stats, kvc_err *err);

/* The prompt tokens kvc_prompt_chat dropped for this turn (before
 * kvc_turn_prepare). With overflow KVC_OVERFLOW_SHIFT and dropped > 0, prepare
 * moves the session's cached K/V of the kept turns to their new positions
 * (re-rotating K) instead of recomputing them. */
void kvc_turn_set_dropped(kvc_turn *t, int32_t dropped);

/* Where the messages' text begins in the turn's tokens: marks[0, n) ascending
 * (kvc_prompt_chat's starts), copied: a model with recurrent layers snapshots
 * its state there, so that an edited message is recomputed from its start.
 * KVC_ERR_NOMEM. */
int  kvc_turn_set_marks(kvc_turn *t, const int32_t *marks, int64_t n, kvc_err *err);

/* The session a turn runs on. */
kvc_session *kvc_turn_session(const kvc_turn *t);

/* The prompt's figures once the turn is prepared: stats's prompt_tokens,
 * cached_tokens and cached_disk_tokens (the rest untouched). */
void kvc_turn_prompt_stats(const kvc_turn *t, kvc_chat_stats *stats);

/* The reply tokens' logprobs (chat params logprobs >= 0), taken: *out is
 * malloc'd (NULL when none), call before kvc_turn_end. */
void kvc_turn_take_logprobs(kvc_turn *t, kvc_token_logprob **out, int32_t *n);

/* ------------------------------------------------------- session_snap.c */

struct kvc_snap;

/* Models with recurrent layers (ctx->snaps): a state serves only the length
 * it was taken at. Of session s's prompt tokens[0, n), sharing `own` tokens
 * with what its sequence holds, and matched in the tree as *m: the longest
 * length a turn can continue from, either the sequence's own state (own ==
 * its length) or a snapshot (*snap, pinned: kvc_snaps_restore it, then
 * kvc_snaps_unpin). need_logits: a length of n needs a snapshot with logits
 * (the turn samples from them). *m is cut to the blocks under that length
 * (m->last: the snapshot's node; no partial). */
int64_t kvc_session_snap_match(kvc_session *s, const int32_t *tokens, int64_t n, int64_t own,
                               kvc_pc_match *m, bool need_logits, struct kvc_snap **snap);

/* Where a prefill of tokens[0, n) from `from` stops next to take a snapshot:
 * the first message start or multiple of ctx->snap_interval after from, else
 * n. Message starts: marks[0, n_marks) (kvc_turn_set_marks) when there are
 * any, else the last control token of each run of markup. */
int64_t kvc_session_snap_next(const kvc_context *c, const int32_t *tokens, int64_t n, int64_t from,
                              const int32_t *marks, int64_t n_marks);

/* Whether a prefill of tokens[0, n) takes a snapshot at length q: at n (the
 * prompt's end), message starts, multiples of the interval. */
bool kvc_session_snap_due(const kvc_context *c, const int32_t *tokens, int64_t n, int64_t q,
                          const int32_t *marks, int64_t n_marks);

/* Snapshot session s's sequence at its length, whose tokens are tokens[...]
 * and whose full blocks are in the tree up to `anchor` (NULL: the root) or
 * beyond; `logits` (may be NULL) the row computed there. Room is made as for
 * any block (kvc_context_make_room); without room, or with the blocks not in
 * the tree yet, nothing is taken. */
void kvc_session_snap_take(kvc_session *s, kvc_pc_node *anchor, const int32_t *tokens,
                           const float *logits);

/* ------------------------------------------------------ session_fetch.c */

/* kvc_turn_prepare's reads from the tiers below RAM (DESIGN.md §5), for
 * session s's prompt tokens[0, n) whose match in the prefix tree is *m, of
 * which s's sequence holds `own` tokens itself. s->ctx->tiers must be set.
 * room (may be NULL) is asked for the blocks to be read first, m's nodes
 * pinned meanwhile. */

/* Continue the match *m into the disk tier: the run of following blocks the
 * store holds is read into the pool (as much of it as there is room for) and
 * entered in the tree, *m moved to its end (kvc_tiers_fetch), so the longest
 * prefix across both tiers is used and never recomputed. Only when the run
 * reaches past `own`. Returns the blocks read. */
int64_t kvc_session_fetch_disk(kvc_session *s, const int32_t *tokens, int64_t n, kvc_pc_match *m,
                               int64_t own, kvc_room_fn room, void *user);

/* The conversation's tail, where it went down with its session's K/V
 * (kvc_tiers_write_tail): read into a block of its own when it is longer than
 * both the session's own match and m's partial one (m->partial is then
 * cleared: the tail is the longer). Returns its length, its block in *block
 * (a reference the caller owns; -1 when none). */
int32_t kvc_session_fetch_tail(kvc_session *s, const int32_t *tokens, int64_t n, kvc_pc_match *m,
                               int64_t own, kvc_room_fn room, void *user, int32_t *block);

#endif
