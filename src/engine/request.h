/* request.h - a request and its mailbox: the owned copy of what a client
 * submitted, and the queue of events (text, DONE, ERROR) the engine thread
 * pushes and the client reads (kvc_request_next). Needs nothing from the
 * scheduler.
 *
 * Threads: the client thread and the engine thread share a request; the
 * events are under r->mu, the cancel flag is atomic, and two references (the
 * engine's and the client's) decide who frees it. Everything else is written
 * before the request is queued and only read afterwards, except the fields
 * marked "engine thread only". */
#ifndef KVC_REQUEST_H
#define KVC_REQUEST_H

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
    kvc_chat_message *messages;       /* chat: the conversation (NULL for a completion) */
    size_t            n_messages;
    char             *prompt;         /* a raw completion prompt */
    char             *session_key;
    uint64_t          ns;             /* the cache namespace (its hash; 0 = the default) */
    char             *tools_json;     /* chat.tools_json points here */
    char             *kwargs_json;    /* chat.template_kwargs_json points here */
    char             *grammar;        /* chat.grammar points here */
    struct kvc_logit_bias *logit_bias; /* chat.logit_bias points here */
    kvc_chat_params   chat;
    char            **stops;
    int64_t           t_submit;       /* kvc_time_us */
    /* made at submission, in the submitting thread */
    int               kind;           /* KVC_TURN_CHAT or KVC_TURN_COMPLETION */
    kvc_tokbuf        toks;           /* the prompt's tokens: a function of the request */
    kvc_tokbuf        starts;         /* chat: where its messages' text begins in toks */
    int32_t           dropped;        /* prompt tokens a context shift removed */

    pthread_mutex_t   mu;
    pthread_cond_t    cv;
    event_node       *head, *tail;    /* events not yet read */
    bool              finished;       /* DONE or ERROR queued */
    atomic_bool       cancelled;
    int               refs;           /* the engine's and the client's */
    struct kvc_request *next;         /* submit queue (under the engine's mu), then the
                                         engine thread's waiting list */
    /* engine thread only */
    session_slot     *slot;           /* the session it holds, NULL before */
    kvc_turn         *turn;           /* NULL before a session is found */
    bool              told_prompt;    /* a TEXT event carried the prompt's figures */
};

/* A copy of p (strings and messages duplicated, stop strings too) with two
 * references; tokens are not made here. NULL when out of memory. */
kvc_request *kvc_request_new(const kvc_request_params *p);

/* Queue an event for the client; `text` (may be NULL) is copied. */
void kvc_request_push(kvc_request *r, int type, const char *text, size_t len, int status,
                      const char *message, const kvc_chat_stats *stats);

/* A TEXT event: the piece text[0, len), a copy of the logprobs lp[0, n_lp)
 * of the tokens it carries (none when out of memory: DONE has them all) and
 * stats (NULL = zeros). */
void kvc_request_push_text(kvc_request *r, const char *text, size_t len,
                           const kvc_token_logprob *lp, int32_t n_lp, const kvc_chat_stats *stats);

/* kvc_request_push whose event also takes done's logprobs, tool_calls and
 * content (done may be NULL; its pointers are taken, or freed when out of
 * memory). */
void kvc_request_push_done(kvc_request *r, int type, const char *text, size_t len, int status,
                           const char *message, const kvc_chat_stats *stats, kvc_event *done);

/* Drop one reference; the last frees the request. */
void kvc_request_unref(kvc_request *r);

/* Free messages[0, n) and their strings (a request's or a background job's). */
void kvc_messages_free(kvc_chat_message *messages, size_t n);

#endif
