/* request.c - a request and its mailbox (request.h). */
#include "request.h"
#include "sampler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void kvc_messages_free(kvc_chat_message *messages, size_t n)
{
    for (size_t i = 0; messages && i < n; i++) {
        free((char *)messages[i].role);
        free((char *)messages[i].content);
        free((char *)messages[i].name);
        free((char *)messages[i].tool_call_id);
        free((char *)messages[i].tool_calls_json);
        free((char *)messages[i].reasoning_content);
    }
    free(messages);
}


void kvc_request_unref(kvc_request *r)
{
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0)
        return;
    for (event_node *n = r->head, *nx; n; n = nx) {
        nx = n->next;
        kvc_event_clear(&n->ev);
        free(n);
    }
    kvc_messages_free(r->messages, r->n_messages);
    for (int32_t i = 0; i < r->chat.n_stop; i++)
        free(r->stops[i]);
    free(r->stops);
    free(r->prompt);
    free(r->session_key);
    free(r->tools_json);
    free(r->kwargs_json);
    free(r->grammar);
    free(r->logit_bias);
    kvc_tokbuf_free(&r->toks);
    kvc_tokbuf_free(&r->starts);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

void kvc_request_push(kvc_request *r, int type, const char *text, size_t len, int status,
                      const char *message, const kvc_chat_stats *stats)
{
    kvc_request_push_done(r, type, text, len, status, message, stats, NULL);
}

void kvc_request_push_done(kvc_request *r, int type, const char *text, size_t len, int status,
                           const char *message, const kvc_chat_stats *stats, kvc_event *done)
{
    event_node *n = calloc(1, sizeof(*n));
    if (n && text) {
        n->ev.text = malloc(len + 1);
        if (n->ev.text) {
            memcpy(n->ev.text, text, len);
            n->ev.text[len] = 0;
            n->ev.len = len;
        }
    }
    pthread_mutex_lock(&r->mu);
    if (n) {
        n->ev.type = type;
        n->ev.status = status;
        if (message)
            snprintf(n->ev.message, sizeof(n->ev.message), "%s", message);
        if (stats)
            n->ev.stats = *stats;
        if (r->tail)
            r->tail->next = n;
        else
            r->head = n;
        r->tail = n;
    }
    if (n && done) {                         /* the DONE event takes these */
        n->ev.logprobs = done->logprobs;
        n->ev.n_logprobs = done->n_logprobs;
        n->ev.tool_calls = done->tool_calls;
        n->ev.content = done->content;
    } else if (done) {
        kvc_event_clear(done);
    }
    if (type != KVC_EVENT_TEXT)
        r->finished = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void kvc_request_push_text(kvc_request *r, const char *text, size_t len,
                           const kvc_token_logprob *lp, int32_t n_lp, const kvc_chat_stats *stats)
{
    kvc_event piece = { 0 };
    if (n_lp > 0 && (piece.logprobs = malloc((size_t)n_lp * sizeof(*lp)))) {
        memcpy(piece.logprobs, lp, (size_t)n_lp * sizeof(*lp));
        piece.n_logprobs = n_lp;
    }
    kvc_request_push_done(r, KVC_EVENT_TEXT, text, len, 0, NULL, stats, &piece);
}

bool kvc_request_next(kvc_request *r, kvc_event *ev, int timeout_ms)
{
    memset(ev, 0, sizeof(*ev));
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    if (timeout_ms > 0) {
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&r->mu);
    while (!r->head && timeout_ms != 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&r->cv, &r->mu);
        else if (pthread_cond_timedwait(&r->cv, &r->mu, &deadline) != 0)
            break;
    }
    event_node *n = r->head;
    if (n) {
        r->head = n->next;
        if (!r->head)
            r->tail = NULL;
    }
    pthread_mutex_unlock(&r->mu);
    if (!n)
        return false;
    *ev = n->ev;
    free(n);
    return true;
}

void kvc_event_clear(kvc_event *ev)
{
    free(ev->text);
    free(ev->logprobs);
    free(ev->tool_calls);
    free(ev->content);
    ev->text = ev->tool_calls = ev->content = NULL;
    ev->logprobs = NULL;
    ev->len = 0;
    ev->n_logprobs = 0;
}

void kvc_request_cancel(kvc_request *r) { atomic_store(&r->cancelled, true); }

void kvc_request_free(kvc_request *r)
{
    if (!r)
        return;
    kvc_request_cancel(r);
    kvc_request_unref(r);
}

static char *dup_or_null(const char *s, bool *ok)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *ok = false;
    return d;
}

kvc_request *kvc_request_new(const kvc_request_params *p)
{
    kvc_request *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->cancelled, false);
    r->refs = 2;
    r->t_submit = kvc_time_us();
    bool ok = true;
    r->chat = p->chat;
    r->prompt = dup_or_null(p->prompt, &ok);
    r->session_key = dup_or_null(p->session_key, &ok);
    r->ns = kvc_namespace_id(p->cache_namespace);
    r->chat.tools_json = r->tools_json = dup_or_null(p->chat.tools_json, &ok);
    r->chat.template_kwargs_json = r->kwargs_json = dup_or_null(p->chat.template_kwargs_json, &ok);
    r->chat.grammar = r->grammar = dup_or_null(p->chat.grammar, &ok);
    r->chat.logit_bias = NULL;
    if (ok && !p->prompt && !p->messages && p->n_prompt_tokens > 0) {
        ok = !kvc_tokbuf_reserve(&r->toks, p->n_prompt_tokens);
        if (ok) {
            memcpy(r->toks.v, p->prompt_tokens, (size_t)p->n_prompt_tokens * sizeof(int32_t));
            r->toks.n = p->n_prompt_tokens;
        }
    }
    if (ok && p->chat.n_logit_bias > 0) {
        size_t sz = (size_t)p->chat.n_logit_bias * sizeof(*r->logit_bias);
        ok = (r->logit_bias = malloc(sz)) != NULL;
        if (ok)
            memcpy(r->logit_bias, p->chat.logit_bias, sz);
        r->chat.logit_bias = r->logit_bias;
    }
    if (p->n_messages) {
        r->messages = calloc(p->n_messages, sizeof(kvc_chat_message));
        ok = ok && r->messages;
        for (size_t i = 0; ok && i < p->n_messages; i++) {
            r->n_messages = i + 1;
            r->messages[i].role = dup_or_null(p->messages[i].role ? p->messages[i].role : "", &ok);
            r->messages[i].content = dup_or_null(p->messages[i].content ? p->messages[i].content : "", &ok);
            r->messages[i].name = dup_or_null(p->messages[i].name, &ok);
            r->messages[i].tool_call_id = dup_or_null(p->messages[i].tool_call_id, &ok);
            r->messages[i].tool_calls_json = dup_or_null(p->messages[i].tool_calls_json, &ok);
            r->messages[i].reasoning_content = dup_or_null(p->messages[i].reasoning_content, &ok);
        }
    }
    r->chat.n_stop = 0;
    if (ok && p->chat.n_stop > 0) {
        r->stops = calloc((size_t)p->chat.n_stop, sizeof(char *));
        ok = r->stops != NULL;
        for (int32_t i = 0; ok && i < p->chat.n_stop; i++) {
            r->stops[i] = dup_or_null(p->chat.stop[i] ? p->chat.stop[i] : "", &ok);
            r->chat.n_stop = i + 1;
        }
    }
    r->chat.stop = (const char *const *)r->stops;
    if (!ok) {
        r->refs = 1;
        kvc_request_unref(r);
        return NULL;
    }
    return r;
}
