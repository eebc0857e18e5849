/* engine.c - the engine's public API: requests and their event queues,
 * submission, metrics, and the engine's lifetime. The engine thread, the
 * sessions table and the scheduler are in engine_sched.c. */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------- requests */

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
    for (size_t i = 0; i < r->n_messages; i++) {
        free((char *)r->messages[i].role);
        free((char *)r->messages[i].content);
        free((char *)r->messages[i].name);
        free((char *)r->messages[i].tool_call_id);
        free((char *)r->messages[i].tool_calls_json);
        free((char *)r->messages[i].reasoning_content);
    }
    for (int32_t i = 0; i < r->chat.n_stop; i++)
        free(r->stops[i]);
    free(r->stops);
    free(r->messages);
    free(r->prompt);
    free(r->session_key);
    free(r->tools_json);
    free(r->kwargs_json);
    free(r->text);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

void kvc_request_push(kvc_request *r, int type, const char *text, size_t len, int status,
                      const char *message, const kvc_chat_stats *stats)
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
    if (type != KVC_EVENT_TEXT)
        r->finished = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
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
    ev->text = NULL;
    ev->len = 0;
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

static kvc_request *request_copy(const kvc_request_params *p, const char *default_kwargs)
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
    r->chat.tools_json = r->tools_json = dup_or_null(p->chat.tools_json, &ok);
    kvc_err ke = { 0 };   /* both were validated (kvc_engine_new, the request parser) */
    if (kvc_chat_kwargs_merge(default_kwargs, p->chat.template_kwargs_json, &r->kwargs_json, &ke))
        ok = ok && ke.code != KVC_ERR_NOMEM;
    r->chat.template_kwargs_json = r->kwargs_json;
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

/* --------------------------------------------------------------- engine */

kvc_engine_params kvc_engine_default_params(void)
{
    kvc_engine_params p = { 0 };
    p.kv_type = KVC_KV_F16;
    return p;
}

int kvc_engine_new(kvc_model *model, const kvc_engine_params *params, kvc_engine **out,
                   char *err, size_t err_size)
{
    *out = NULL;
    kvc_err e = { 0 };
    kvc_engine_params p = params ? *params : kvc_engine_default_params();
    if (p.n_parallel <= 0)
        p.n_parallel = 8;
    if (p.max_queue <= 0)
        p.max_queue = 64;
    if (p.max_sessions <= 0)
        p.max_sessions = 256;
    if (p.n_ctx <= 0)
        p.n_ctx = model->hp.n_ctx_train;
    kvc_engine *eng = calloc(1, sizeof(*eng));
    if (!eng) {
        snprintf(err, err_size, "out of memory");
        return KVC_ERR_NOMEM;
    }
    eng->model = model;
    eng->p = p;
    pthread_mutex_init(&eng->mu, NULL);
    pthread_cond_init(&eng->cv, NULL);
    /* The pool is the budget: --kv-budget MiB of blocks of the KV type, or
     * n_parallel whole contexts (and a block for a copy-on-write). */
    const int64_t B = 16;
    int rc = KVC_OK;
    eng->block_bytes = kvc_context_block_bytes(model, p.kv_type);
    int64_t blocks = (int64_t)p.n_parallel * ((p.n_ctx + B - 1) / B) + 1;
    if (eng->block_bytes == 0)
        rc = kvc_fail(&e, KVC_ERR_INVALID_ARG, "KV type %d not supported for this model (f16, "
                      "f32; q8_0 needs a head dim that is a multiple of 32, it is %d)",
                      p.kv_type, model->hp.head_dim);
    else if (p.kv_budget_mib > 0) {
        blocks = (int64_t)(((uint64_t)p.kv_budget_mib << 20) / eng->block_bytes);
        if (blocks < 2)
            rc = kvc_fail(&e, KVC_ERR_INVALID_ARG, "a KV budget of %lld MiB holds %lld blocks "
                          "of %lld tokens (%zu bytes each); at least 2 are needed",
                          (long long)p.kv_budget_mib, (long long)blocks, (long long)B,
                          eng->block_bytes);
    }
    if (!rc) {
        kvc_context_params cp = kvc_context_default_params();
        cp.n_ctx = p.n_ctx;
        cp.n_batch = p.n_batch;
        cp.n_threads = p.n_threads;
        cp.n_seq = p.max_sessions + p.n_parallel;
        cp.kv_type = p.kv_type;
        cp.kv_blocks = blocks;
        char msg[sizeof(e.msg)];
        if ((rc = kvc_context_new(model, &cp, &eng->ctx, msg, sizeof(msg))))
            kvc_fail(&e, rc, "%s", msg);
    }
    if (!rc && p.chat_template_kwargs) {
        char *merged = NULL;
        rc = kvc_chat_kwargs_merge(p.chat_template_kwargs, NULL, &merged, &e);
        free(merged);
    }
    if (!rc)
        rc = kvc_engine_sessions_new(eng, &e);
    if (!rc) {
        kvc_engine_update_gauges(eng);
        if (pthread_create(&eng->thread, NULL, kvc_engine_main, eng) != 0)
            rc = kvc_fail(&e, KVC_ERR_NOMEM, "cannot start the engine thread");
        else
            eng->thread_started = true;
    }
    if (rc) {
        snprintf(err, err_size, "%s", e.msg[0] ? e.msg : kvc_strerror(rc));
        kvc_engine_free(eng);
        return rc;
    }
    *out = eng;
    return KVC_OK;
}

void kvc_engine_free(kvc_engine *e)
{
    if (!e)
        return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    /* requests never taken by the engine thread end as cancelled */
    for (kvc_request *r = e->queue_head, *nx; r; r = nx) {
        nx = r->next;
        kvc_chat_stats st = { 0 };
        st.finish_reason = "cancelled";
        kvc_request_push(r, KVC_EVENT_DONE, "", 0, 0, NULL, &st);
        kvc_request_unref(r);
    }
    kvc_engine_sessions_free(e);
    kvc_context_free(e->ctx);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

kvc_request *kvc_engine_submit(kvc_engine *e, const kvc_request_params *p, int *status,
                               char *err, size_t err_size)
{
    int rc = KVC_OK;
    if (!p->messages && !p->prompt) {
        snprintf(err, err_size, "a request needs messages or a prompt");
        rc = KVC_ERR_INVALID_ARG;
    } else if (p->messages && p->n_messages == 0) {
        snprintf(err, err_size, "messages is empty");
        rc = KVC_ERR_INVALID_ARG;
    }
    kvc_request *r = rc ? NULL : request_copy(p, e->p.chat_template_kwargs);
    if (!rc && !r) {
        snprintf(err, err_size, "out of memory");
        rc = KVC_ERR_NOMEM;
    }
    if (!rc) {
        pthread_mutex_lock(&e->mu);
        if (e->queued >= e->p.max_queue || e->stop) {
            rc = KVC_ERR_BUSY;
            snprintf(err, err_size, "the server is busy: %d requests are waiting", e->queued);
        } else {
            if (e->queue_tail)
                e->queue_tail->next = r;
            else
                e->queue_head = r;
            e->queue_tail = r;
            e->queued++;
            pthread_cond_signal(&e->cv);
        }
        pthread_mutex_unlock(&e->mu);
        if (rc) {
            r->refs = 1;
            kvc_request_unref(r);
            r = NULL;
        }
    }
    if (status)
        *status = rc;
    return r;
}

const char *kvc_engine_template(const kvc_engine *e) { return kvc_session_template(e->slots[0].s); }

int kvc_engine_render(kvc_engine *e, const kvc_request_params *p, char **prompt, char *err,
                      size_t err_size)
{
    *prompt = NULL;
    kvc_err ke = { 0 };
    char *kwargs = NULL;
    kvc_chat_params cp = p->chat;
    int rc = kvc_chat_kwargs_merge(e->p.chat_template_kwargs, p->chat.template_kwargs_json,
                                   &kwargs, &ke);
    cp.template_kwargs_json = kwargs;
    /* the template object is only read: any thread may render with it */
    if (!rc)
        rc = kvc_session_render(e->slots[0].s, p->messages, p->n_messages, &cp, prompt, &ke);
    free(kwargs);
    if (rc)
        snprintf(err, err_size, "%s", ke.msg[0] ? ke.msg : kvc_strerror(rc));
    return rc;
}

void kvc_engine_get_metrics(kvc_engine *e, kvc_engine_metrics *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->m;
    out->queue_depth = e->queued;
    pthread_mutex_unlock(&e->mu);
}
