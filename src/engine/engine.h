/* engine.h - the inside of a kvc_engine, shared by engine.c (lifetime,
 * submission, metrics), engine_sched.c (the engine thread: the sessions table
 * and the scheduler) and background.c (canonicalizing finished replies).
 *
 * Threads: any thread submits requests (rendering and tokenizing them there)
 * and reads their events; one engine thread owns the model's compute, the
 * context (KV pool, prefix tree, sequences), the sessions and the turns, and
 * only computes; one background thread renders and tokenizes finished
 * conversations as their next request will carry them. What they share is
 * under the engine's mutex: the submit queue, the background queues and the
 * counters (kvc_engine.mu). */
#ifndef KVC_ENGINE_H
#define KVC_ENGINE_H

#include "request.h"

/* A session of the table: keyed (prompt_cache_key, else user) or not. */
struct session_slot {
    kvc_session *s;
    char        *key;        /* NULL: an unkeyed conversation */
    int64_t      last_used;  /* a tick, for LRU */
    kvc_request *busy;       /* the request whose turn holds it, or NULL */
};

/* Background work for one finished chat reply (DESIGN.md §3): the background
 * thread turns the conversation and its reply into the canonical tokens of
 * the next request; the engine thread computes what of them its session lacks,
 * in idle time, unless the session has moved on (serial). */
typedef struct bg_job {
    kvc_chat_message *messages;   /* the request's conversation (taken from it) and the
                                     reply as the next request carries it */
    size_t            n_messages;
    kvc_chat_params   chat;       /* its tools and template kwargs (owned: the two below) */
    char             *tools_json, *kwargs_json;
    kvc_tokbuf        toks;       /* the canonical tokens, made by the background thread */
    int32_t           slot;       /* the session that holds the conversation */
    uint64_t          serial;     /* its serial number after the reply */
    struct bg_job    *next;
} bg_job;

struct kvc_engine {
    kvc_model        *model;
    kvc_engine_params p;
    kvc_context      *ctx;
    size_t            block_bytes;
    const kvc_chat_template *tmpl;  /* the chat template (slot 0's session owns it) */
    int               tool_format;  /* enum kvc_tool_format of tmpl */

    /* engine thread only */
    session_slot     *slots;        /* n_slots = max_sessions + n_parallel */
    int32_t           n_slots;
    int64_t           tick;
    kvc_request      *waiting;      /* submitted, not running, in arrival order */
    kvc_request     **running;      /* n_running of n_parallel, in admission order */
    kvc_turn        **turns;        /* their turns, for kvc_turns_step */
    int32_t           n_running;
    uint64_t          dropped;      /* blocks freed by dropping idle sessions' holds */
    bg_job           *bg_job_run;   /* the background job whose turn runs, or NULL */
    kvc_turn         *bg_turn;

    pthread_t         thread;
    bool              thread_started;
    pthread_t         bg_thread;
    bool              bg_thread_started;
    pthread_mutex_t   mu;
    pthread_cond_t    cv;           /* the engine thread waits here */
    pthread_cond_t    bg_cv;        /* the background thread waits here */
    kvc_request      *queue_head, *queue_tail;   /* submitted, not yet taken (mu) */
    int32_t           queued;       /* waiting: in the queue or the waiting list (mu) */
    bg_job           *prep_head, *prep_tail;     /* replies to canonicalize (mu) */
    bg_job           *bg_head, *bg_tail;         /* canonical tokens to compute (mu) */
    bool              stop;         /* (mu) */
    kvc_engine_metrics m;           /* counters (mu) */
};

/* The engine thread (engine_sched.c). */
void *kvc_engine_main(void *engine);

/* The sessions table and the gauges of the metrics, set up by kvc_engine_new
 * before the thread starts (engine_sched.c). */
int  kvc_engine_sessions_new(kvc_engine *e, kvc_err *err);
void kvc_engine_sessions_free(kvc_engine *e);
void kvc_engine_update_gauges(kvc_engine *e);
/* The tiers' counters and gauges (disk, Redis) into m, read now: the tiers'
 * writer moves them while the engine thread sleeps. Any thread. */
void kvc_engine_tier_gauges(kvc_engine *e, kvc_engine_metrics *m);

/* ------------------------------------------------------- background.c */

/* The background thread: canonical tokens for the jobs of prep_head, then
 * queued on bg_head for the engine thread. */
void *kvc_engine_background_main(void *engine);

/* Queue the canonicalization of request r's finished reply (engine thread;
 * takes r's messages). Nothing when it does not apply: not a chat request, a
 * cold one (no_cache), a context shift, a failure, or no memory. done: the
 * reply's parsed tool calls (done->tool_calls, content), which the next
 * request carries as the assistant message instead of the text. */
void kvc_engine_background_queue(kvc_engine *e, kvc_request *r, const char *reply,
                                 const kvc_chat_stats *st, const kvc_event *done);

/* The next job with canonical tokens (NULL: none), taken off bg_head. */
bg_job *kvc_engine_background_take(kvc_engine *e);

void kvc_bg_job_free(bg_job *j);   /* NULL ok */

#endif
