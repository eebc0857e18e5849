/* engine.h - the inside of a kvc_engine, shared by engine.c (the public
 * API: requests, their event queues, submission, metrics) and engine_sched.c
 * (the engine thread: the sessions table and the scheduler).
 *
 * Threads: any thread submits requests and reads their events; one engine
 * thread owns the model, the context (KV pool, prefix tree, sequences), the
 * sessions and the turns. What both sides touch is under a mutex: the submit
 * queue and the counters (kvc_engine.mu), a request's events (kvc_request.mu);
 * a request's cancel flag is atomic. */
#ifndef KVC_ENGINE_H
#define KVC_ENGINE_H

#include "session.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct event_node {
    kvc_event          ev;
    struct event_node *next;
} event_node;

typedef struct session_slot session_slot;

struct kvc_request {
    /* owned copies of the parameters */
    kvc_chat_message *messages;
    size_t            n_messages;
    char             *prompt;
    char             *session_key;
    kvc_chat_params   chat;
    char            **stops;
    char             *tools_json;     /* chat.tools_json points here */
    char             *kwargs_json;    /* chat.template_kwargs_json points here */
    int64_t           t_submit;       /* kvc_time_us */

    pthread_mutex_t   mu;
    pthread_cond_t    cv;
    event_node       *head, *tail;    /* events not yet read */
    bool              finished;       /* DONE or ERROR queued */
    atomic_bool       cancelled;
    int               refs;           /* the engine's and the client's */
    struct kvc_request *next;         /* submit queue (under the engine's mu), then the
                                         engine thread's waiting list */
    /* engine thread only */
    char             *text;           /* the prompt text (rendered messages) */
    session_slot     *slot;           /* the session it holds, NULL before */
    kvc_turn         *turn;           /* NULL before a session is found */
};

/* A session of the table: keyed (prompt_cache_key, else user) or not. */
struct session_slot {
    kvc_session *s;
    char        *key;        /* NULL: an unkeyed conversation */
    int64_t      last_used;  /* a tick, for LRU */
    kvc_request *busy;       /* the request whose turn holds it, or NULL */
};

struct kvc_engine {
    kvc_model        *model;
    kvc_engine_params p;
    kvc_context      *ctx;
    size_t            block_bytes;

    /* engine thread only */
    session_slot     *slots;        /* n_slots = max_sessions + n_parallel */
    int32_t           n_slots;
    int64_t           tick;
    kvc_request      *waiting;      /* submitted, not running, in arrival order */
    kvc_request     **running;      /* n_running of n_parallel, in admission order */
    kvc_turn        **turns;        /* their turns, for kvc_turns_step */
    int32_t           n_running;
    uint64_t          dropped;      /* blocks freed by dropping idle sessions' holds */

    pthread_t         thread;
    bool              thread_started;
    pthread_mutex_t   mu;
    pthread_cond_t    cv;
    kvc_request      *queue_head, *queue_tail;   /* submitted, not yet taken (mu) */
    int32_t           queued;       /* waiting: in the queue or the waiting list (mu) */
    bool              stop;         /* (mu) */
    kvc_engine_metrics m;           /* counters (mu) */
};

/* Queue an event for the client; `text` (may be NULL) is copied. */
void kvc_request_push(kvc_request *r, int type, const char *text, size_t len, int status,
                      const char *message, const kvc_chat_stats *stats);

/* Drop one reference; the last frees the request. */
void kvc_request_unref(kvc_request *r);

/* The engine thread (engine_sched.c). */
void *kvc_engine_main(void *engine);

/* The sessions table and the gauges of the metrics, set up by kvc_engine_new
 * before the thread starts (engine_sched.c). */
int  kvc_engine_sessions_new(kvc_engine *e, kvc_err *err);
void kvc_engine_sessions_free(kvc_engine *e);
void kvc_engine_update_gauges(kvc_engine *e);

#endif
