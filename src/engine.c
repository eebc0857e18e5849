/* engine.c - the engine thread, its request queue and the sessions table.
 *
 * Threads submit requests; one engine thread owns the model, the context (its
 * KV pool and sequences) and the sessions, and runs the requests; each request
 * has its own event queue that the submitting thread reads.
 *
 * Sessions: a request with a key (prompt_cache_key, else user) uses that key's
 * session; one without uses the session whose cached text is the longest
 * prefix of its prompt, so a client that sends no key still continues its
 * conversation. Sessions beyond max_sessions are dropped least recently used
 * first. */
#include "context.h"
#include "session.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------- requests */

typedef struct event_node {
    kvc_event          ev;
    struct event_node *next;
} event_node;

struct kvc_request {
    /* owned copies of the parameters */
    kvc_chat_message *messages;
    size_t            n_messages;
    char             *prompt;
    char             *session_key;
    kvc_chat_params   chat;
    char            **stops;
    int64_t           t_submit;       /* kvc_time_us */

    pthread_mutex_t   mu;
    pthread_cond_t    cv;
    event_node       *head, *tail;    /* events not yet read */
    bool              finished;       /* DONE or ERROR queued */
    atomic_bool       cancelled;
    int               refs;           /* the engine's and the client's */
    struct kvc_request *next_queued;
};

static void request_unref(kvc_request *r)
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
    }
    for (int32_t i = 0; i < r->chat.n_stop; i++)
        free(r->stops[i]);
    free(r->stops);
    free(r->messages);
    free(r->prompt);
    free(r->session_key);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* Queue an event for the client; `text` (may be NULL) is copied. */
static void push_event(kvc_request *r, int type, const char *text, size_t len, int status,
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
    request_unref(r);
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

static kvc_request *request_copy(const kvc_request_params *p)
{
    kvc_request *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->refs = 2;
    r->t_submit = kvc_time_us();
    bool ok = true;
    r->chat = p->chat;
    r->prompt = dup_or_null(p->prompt, &ok);
    r->session_key = dup_or_null(p->session_key, &ok);
    if (p->n_messages) {
        r->messages = calloc(p->n_messages, sizeof(kvc_chat_message));
        ok = ok && r->messages;
        for (size_t i = 0; ok && i < p->n_messages; i++) {
            r->n_messages = i + 1;
            r->messages[i].role = dup_or_null(p->messages[i].role ? p->messages[i].role : "", &ok);
            r->messages[i].content = dup_or_null(p->messages[i].content ? p->messages[i].content : "", &ok);
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
        request_unref(r);
        return NULL;
    }
    return r;
}

/* --------------------------------------------------------------- engine */

typedef struct session_slot {
    kvc_session *s;
    char        *key;        /* NULL: an unkeyed conversation */
    int64_t      last_used;  /* a tick, for LRU */
} session_slot;

struct kvc_engine {
    kvc_model        *model;
    kvc_engine_params p;
    kvc_context      *ctx;
    session_slot     *slots;        /* max_sessions */
    int64_t           tick;

    pthread_t         thread;
    pthread_mutex_t   mu;
    pthread_cond_t    cv;
    kvc_request      *queue_head, *queue_tail;
    int32_t           queued;
    int32_t           running;
    bool              stop;
    kvc_engine_metrics m;           /* counters, under mu */
};

kvc_engine_params kvc_engine_default_params(void)
{
    kvc_engine_params p = { 0 };
    p.kv_type = KVC_KV_F16;
    return p;
}

/* The slot for a request: its key's, else the unkeyed one whose text is the
 * longest prefix of the prompt, else the least recently used (reset). */
static session_slot *pick_slot(kvc_engine *e, const char *key, const char *prompt)
{
    session_slot *best = NULL, *lru = NULL;
    size_t best_len = 0;
    for (int32_t i = 0; i < e->p.max_sessions; i++) {
        session_slot *sl = &e->slots[i];
        if (!lru || sl->last_used < lru->last_used)
            lru = sl;
        if (key) {
            if (sl->key && strcmp(sl->key, key) == 0)
                return sl;
            continue;
        }
        size_t len;
        const char *text = kvc_session_text(sl->s, &len);
        if (!sl->key && text && prompt && len > best_len && strncmp(prompt, text, len) == 0) {
            best = sl;
            best_len = len;
        }
    }
    if (best)
        return best;
    kvc_session_reset(lru->s);
    free(lru->key);
    lru->key = key ? strdup(key) : NULL;
    return lru;
}

/* Free blocks for a turn of at most `tokens` more tokens by dropping the least
 * recently used other sessions' caches. */
static void make_room(kvc_engine *e, const session_slot *keep, int64_t tokens)
{
    int64_t B = kvc_kv_block_tokens(e->ctx->pool);
    int64_t need = KVC_MIN(tokens, (int64_t)e->p.n_ctx) / B + 2;
    while (kvc_kv_n_free(e->ctx->pool) < need) {
        session_slot *lru = NULL;
        for (int32_t i = 0; i < e->p.max_sessions; i++) {
            session_slot *sl = &e->slots[i];
            if (sl != keep && e->ctx->seqs[i].n_blocks > 0 && (!lru || sl->last_used < lru->last_used))
                lru = sl;
        }
        if (!lru)
            return;
        int64_t before = kvc_kv_n_free(e->ctx->pool);
        kvc_session_reset(lru->s);
        e->m.blocks_evicted += (uint64_t)(kvc_kv_n_free(e->ctx->pool) - before);
    }
}

/* Gauges for the metrics, read by other threads under mu. */
static void update_gauges(kvc_engine *e)
{
    int32_t sessions = 0;
    for (int32_t i = 0; i < e->p.max_sessions; i++) {
        size_t len;
        sessions += kvc_session_text(e->slots[i].s, &len) != NULL;
    }
    pthread_mutex_lock(&e->mu);
    e->m.sessions = sessions;
    e->m.blocks_total = kvc_kv_n_blocks(e->ctx->pool);
    e->m.blocks_free = kvc_kv_n_free(e->ctx->pool);
    e->m.blocks_used = e->m.blocks_total - e->m.blocks_free;
    e->m.block_tokens = kvc_kv_block_tokens(e->ctx->pool);
    pthread_mutex_unlock(&e->mu);
}

static bool on_text(const char *text, size_t len, void *user)
{
    kvc_request *r = user;
    if (atomic_load(&r->cancelled))
        return false;
    push_event(r, KVC_EVENT_TEXT, text, len, 0, NULL, NULL);
    return true;
}

static void run_request(kvc_engine *e, kvc_request *r)
{
    kvc_err err = { 0 };
    char *prompt = NULL;
    int rc = KVC_OK;
    if (r->messages) {
        /* render with any session: the template is the engine's */
        rc = kvc_session_render(e->slots[0].s, r->messages, r->n_messages, &prompt, &err);
    } else {
        prompt = strdup(r->prompt ? r->prompt : "");
        if (!prompt)
            rc = kvc_fail(&err, KVC_ERR_NOMEM, "out of memory");
    }
    kvc_chat_stats st = { 0 };
    char *reply = NULL;
    if (!rc) {
        session_slot *sl = pick_slot(e, r->session_key, prompt);
        sl->last_used = ++e->tick;
        pthread_mutex_lock(&e->mu);
        make_room(e, sl, (int64_t)strlen(prompt) + 2 +
                         (r->chat.max_tokens > 0 ? r->chat.max_tokens : e->p.n_ctx));
        pthread_mutex_unlock(&e->mu);
        rc = kvc_session_run(sl->s, prompt, r->messages != NULL, &r->chat, on_text, r, &reply, &st,
                             r->t_submit, &err);
    }
    if (!rc && atomic_load(&r->cancelled))
        st.finish_reason = "cancelled";
    pthread_mutex_lock(&e->mu);
    if (rc) {
        e->m.requests_failed++;
    } else {
        e->m.requests++;
        e->m.prompt_tokens += (uint64_t)st.prompt_tokens;
        e->m.cached_tokens += (uint64_t)st.cached_tokens;
        e->m.computed_tokens += (uint64_t)st.computed_tokens;
        e->m.output_tokens += (uint64_t)st.output_tokens;
    }
    pthread_mutex_unlock(&e->mu);
    if (rc)
        push_event(r, KVC_EVENT_ERROR, NULL, 0, rc, err.msg[0] ? err.msg : kvc_strerror(rc), NULL);
    else
        push_event(r, KVC_EVENT_DONE, reply ? reply : "", reply ? strlen(reply) : 0, 0, NULL, &st);
    free(reply);
    free(prompt);
}

static void *engine_main(void *arg)
{
    kvc_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->queue_head && !e->stop)
            pthread_cond_wait(&e->cv, &e->mu);
        kvc_request *r = e->queue_head;
        if (r) {
            e->queue_head = r->next_queued;
            if (!e->queue_head)
                e->queue_tail = NULL;
            e->queued--;
            e->running++;
        }
        bool stop = e->stop;
        pthread_mutex_unlock(&e->mu);
        if (!r)
            break;
        if (stop || atomic_load(&r->cancelled)) {
            kvc_chat_stats st = { 0 };
            st.finish_reason = "cancelled";
            push_event(r, KVC_EVENT_DONE, "", 0, 0, NULL, &st);
        } else {
            run_request(e, r);
            update_gauges(e);
        }
        pthread_mutex_lock(&e->mu);
        e->running--;
        pthread_mutex_unlock(&e->mu);
        request_unref(r);
    }
    return NULL;
}

int kvc_engine_new(kvc_model *model, const kvc_engine_params *params, kvc_engine **out,
                   char *err, size_t err_size)
{
    *out = NULL;
    kvc_engine_params p = params ? *params : kvc_engine_default_params();
    if (p.n_parallel <= 0)
        p.n_parallel = 8;
    if (p.max_queue <= 0)
        p.max_queue = 64;
    if (p.max_sessions <= 0)
        p.max_sessions = 256;
    if (p.n_ctx <= 0)
        p.n_ctx = model->hp.n_ctx_train;
    kvc_engine *e = calloc(1, sizeof(*e));
    if (!e) {
        snprintf(err, err_size, "out of memory");
        return KVC_ERR_NOMEM;
    }
    e->model = model;
    e->p = p;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = p.n_ctx;
    cp.n_batch = p.n_batch;
    cp.n_threads = p.n_threads;
    cp.n_seq = p.max_sessions;
    cp.kv_type = p.kv_type;
    int64_t B = 16;
    size_t per_block = 2 * (size_t)model->hp.n_layer * (size_t)model->hp.n_head_kv *
                       (size_t)model->hp.head_dim * (size_t)B * (p.kv_type == KVC_KV_F32 ? 4 : 2);
    cp.kv_blocks = p.kv_budget_mib > 0 ? (int64_t)(((uint64_t)p.kv_budget_mib << 20) / per_block)
                                       : (int64_t)p.n_parallel * ((p.n_ctx + B - 1) / B);
    int rc = kvc_context_new(model, &cp, &e->ctx, err, err_size);
    if (!rc) {
        e->slots = calloc((size_t)p.max_sessions, sizeof(session_slot));
        if (!e->slots)
            rc = KVC_ERR_NOMEM;
    }
    for (int32_t i = 0; !rc && i < p.max_sessions; i++) {
        e->slots[i].s = kvc_session_new(e->ctx, i, p.chat_template, err, err_size);
        if (!e->slots[i].s)
            rc = KVC_ERR_INVALID_ARG;
    }
    if (!rc)
        update_gauges(e);
    if (!rc && pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        snprintf(err, err_size, "cannot start the engine thread");
        rc = KVC_ERR_NOMEM;
    }
    if (rc) {
        e->thread = 0;
        kvc_engine_free(e);
        return rc;
    }
    *out = e;
    return KVC_OK;
}

void kvc_engine_free(kvc_engine *e)
{
    if (!e)
        return;
    if (e->thread) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    /* requests never started end as cancelled */
    for (kvc_request *r = e->queue_head, *nx; r; r = nx) {
        nx = r->next_queued;
        kvc_chat_stats st = { 0 };
        st.finish_reason = "cancelled";
        push_event(r, KVC_EVENT_DONE, "", 0, 0, NULL, &st);
        request_unref(r);
    }
    if (e->slots) {
        for (int32_t i = 0; i < e->p.max_sessions; i++) {
            kvc_session_free(e->slots[i].s);
            free(e->slots[i].key);
        }
        free(e->slots);
    }
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
    kvc_request *r = rc ? NULL : request_copy(p);
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
                e->queue_tail->next_queued = r;
            else
                e->queue_head = r;
            e->queue_tail = r;
            e->queued++;
            pthread_cond_signal(&e->cv);
        }
        pthread_mutex_unlock(&e->mu);
        if (rc) {
            r->refs = 1;
            request_unref(r);
            r = NULL;
        }
    }
    if (status)
        *status = rc;
    return r;
}

void kvc_engine_get_metrics(kvc_engine *e, kvc_engine_metrics *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->m;
    out->queue_depth = e->queued;
    out->running = e->running;
    pthread_mutex_unlock(&e->mu);
}
