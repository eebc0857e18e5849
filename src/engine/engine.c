/* engine.c - the engine's public API: its lifetime, submission (the prompt
 * rendered and tokenized in the submitting thread) and metrics. The engine
 * thread, the sessions table and the scheduler are in engine_sched.c, the
 * canonicalization of finished replies in background.c, requests and their
 * event queues in request.c. */
#include "chat_template.h"
#include "engine.h"
#include "tool_calls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    kvc_engine *eng = calloc(1, sizeof(*eng));
    if (!eng) {
        snprintf(err, err_size, "out of memory");
        return KVC_ERR_NOMEM;
    }
    eng->model = model;
    eng->p = p;
    pthread_mutex_init(&eng->mu, NULL);
    pthread_cond_init(&eng->cv, NULL);
    pthread_cond_init(&eng->bg_cv, NULL);
    /* The pool is the budget: --kv-budget MiB of blocks of the KV type, or
     * n_parallel whole contexts (and a block for a copy-on-write). */
    const int64_t B = KVC_BLOCK_TOKENS;
    int rc = KVC_OK;
    eng->block_bytes = kvc_context_block_bytes(model, p.kv_type);
    /* sliding-window layers: their window chunks (for the running requests
     * and a background turn, and as many again for the tree) within it too */
    const int32_t n_run = p.n_parallel + 1;
    int64_t window_blocks = p.kv_window_blocks;
    /* recurrent layers: the live states of the n_parallel sequences that may
     * hold one at once (engine_sched.c) come out of the budget too */
    uint64_t states = 0, budget_bytes = (uint64_t)KVC_MAX(p.kv_budget_mib, 0) << 20;
    for (int32_t l = 0; l < model->hp.n_layer; l++)
        states += (uint64_t)model->layers[l].state_floats * sizeof(float) * (uint64_t)p.n_parallel;
    int64_t budget = p.kv_budget_mib > 0 && eng->block_bytes && budget_bytes > states
                   ? kvc_context_blocks_for(model, p.kv_type, n_run, p.n_batch,
                                            budget_bytes - states, &window_blocks) : 0;
    if (p.n_ctx <= 0)   /* the file's, within the budget (or n_parallel contexts in RAM) */
        eng->p.n_ctx = p.n_ctx = kvc_context_fit_n_ctx(model, p.kv_type, budget, p.n_parallel);
    int64_t blocks = (int64_t)p.n_parallel * ((p.n_ctx + B - 1) / B) + 1;
    if (p.overflow == KVC_OVERFLOW_SHIFT && kvc_model_recurrent(model))
        rc = kvc_fail(&e, KVC_ERR_UNSUPPORTED, "context shift (context overflow 'shift') not supported "
                      "for %s: its recurrent layers' state cannot be moved to other positions (use "
                      "'error')",
                      model->hp.arch_name);
    else if (eng->block_bytes == 0)
        rc = kvc_fail(&e, KVC_ERR_INVALID_ARG, "KV type %d not supported for this model (f16, "
                      "f32; q8_0 needs a head dim that is a multiple of 32, it is %d)",
                      p.kv_type, model->hp.head_dim);
    else if (p.kv_budget_mib > 0) {
        blocks = budget;
        if (blocks < 2)
            rc = kvc_fail(&e, KVC_ERR_INVALID_ARG, "a KV budget of %lld MiB holds %lld blocks "
                          "of %lld tokens (%zu bytes each, beside the sliding windows' chunks "
                          "and %.1f MiB of recurrent states for %d parallel sequences); "
                          "at least 2 are needed",
                          (long long)p.kv_budget_mib, (long long)blocks, (long long)B,
                          eng->block_bytes, (double)states / 1048576.0, p.n_parallel);
    }
    if (!rc) {
        kvc_context_params cp = kvc_context_default_params();
        cp.n_ctx = p.n_ctx;
        cp.n_batch = p.n_batch;
        cp.n_threads = p.n_threads;
        cp.n_seq = p.max_sessions + p.n_parallel;
        cp.kv_type = p.kv_type;
        cp.kv_blocks = blocks;
        cp.snapshot_interval = p.snapshot_interval;
        cp.n_run = n_run;
        cp.kv_window_blocks = window_blocks;
        char msg[sizeof(e.msg)];
        if ((rc = kvc_context_new(model, &cp, &eng->ctx, msg, sizeof(msg))))
            kvc_fail(&e, rc, "%s", msg);
    }
    if (!rc && p.chat_template_kwargs) {   /* validated once, merged into every request */
        char *merged = NULL;
        rc = kvc_chat_kwargs_merge(p.chat_template_kwargs, NULL, &merged, &e);
        free(merged);
    }
    /* no_cache: every request cold, nothing kept, so no tier is opened at all
     * (a disk tier's directory lock would keep a normal server out of it) */
    if (!rc && !p.no_cache && (p.cache_disk_mib > 0 || p.cache_redis)) {
        kvc_redis_store_params rp = { .url = p.cache_redis, .password = p.cache_redis_password,
                                      .timeout_ms = p.cache_redis_timeout_ms,
                                      .warn = p.cache_warn, .warn_user = p.cache_warn_user };
        rc = kvc_context_set_tiers(eng->ctx, p.model_path, p.cache_dir,
                                   KVC_MAX(p.cache_disk_mib, 0), &rp, &e);   /* url NULL: none */
    }
    if (!rc)
        rc = kvc_engine_sessions_new(eng, &e);
    if (!rc)
        eng->tmpl = eng->slots[0].s->tmpl;   /* every session has the engine's format */
    if (!rc)
        eng->tool_format = kvc_tool_format_detect(eng->tmpl);
    if (!rc) {
        kvc_engine_update_gauges(eng);
        if (pthread_create(&eng->thread, NULL, kvc_engine_main, eng) != 0)
            rc = kvc_fail(&e, KVC_ERR_NOMEM, "cannot start the engine thread");
        else
            eng->thread_started = true;
    }
    if (!rc) {
        if (pthread_create(&eng->bg_thread, NULL, kvc_engine_background_main, eng) != 0)
            rc = kvc_fail(&e, KVC_ERR_NOMEM, "cannot start the background thread");
        else
            eng->bg_thread_started = true;
    }
    if (rc) {
        snprintf(err, err_size, "%s", e.msg[0] ? e.msg : kvc_strerror(rc));
        kvc_engine_free(eng);
        return rc;
    }
    *out = eng;
    return KVC_OK;
}

int32_t kvc_engine_n_ctx(const kvc_engine *e)
{
    return e->p.n_ctx;
}

int32_t kvc_engine_n_threads(const kvc_engine *e)
{
    return kvc_context_n_threads(e->ctx);
}

void kvc_engine_free(kvc_engine *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_cond_broadcast(&e->cv);
    pthread_cond_broadcast(&e->bg_cv);
    pthread_mutex_unlock(&e->mu);
    if (e->bg_thread_started)
        pthread_join(e->bg_thread, NULL);
    if (e->thread_started)
        pthread_join(e->thread, NULL);
    for (bg_job *j = e->bg_head, *nx; j; j = nx) {
        nx = j->next;
        kvc_bg_job_free(j);
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
    pthread_cond_destroy(&e->bg_cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* The request's tokens, in the submitting thread: render (chat) and tokenize.
 * Errors found here (a bad role, a prompt over the context) are the
 * submission's. */
static int make_tokens(kvc_engine *e, kvc_request *r, kvc_err *err)
{
    if (r->messages) {
        r->kind = KVC_TURN_CHAT;
        if (e->p.overflow == KVC_OVERFLOW_SHIFT)
            r->chat.overflow = KVC_OVERFLOW_SHIFT;
        return kvc_prompt_chat(e->model, e->tmpl, r->messages, r->n_messages, &r->chat,
                               e->p.n_ctx, &r->toks, &r->dropped, &r->starts, err);
    }
    r->kind = KVC_TURN_COMPLETION;
    if (!r->prompt)                          /* given as token ids (copied by request_new) */
        return KVC_OK;
    return kvc_prompt_tokenize(e->model, r->prompt, strlen(r->prompt), &r->toks, err);
}

/* Free a request that was never queued: only the caller's reference is left
 * to drop (kvc_request_new gives two, the other the engine's). */
static void drop_unqueued(kvc_request *r)
{
    r->refs = 1;
    kvc_request_unref(r);
}

/* A request from params with its tokens made (NULL with *rc and ke set). */
static kvc_request *make_request(kvc_engine *e, const kvc_request_params *p, int *rc,
                                 kvc_err *ke)
{
    *rc = KVC_OK;
    if (!p->messages && !p->prompt && p->n_prompt_tokens <= 0)
        *rc = kvc_fail(ke, KVC_ERR_INVALID_ARG, "a request needs messages or a prompt");
    else if (p->messages && p->n_messages == 0)
        *rc = kvc_fail(ke, KVC_ERR_INVALID_ARG, "messages is empty");
    kvc_request *r = *rc ? NULL : kvc_request_new(p);
    if (!*rc && !r)
        *rc = kvc_fail(ke, KVC_ERR_NOMEM, "out of memory");
    if (!*rc && e->p.no_cache)
        r->chat.no_cache = true;
    if (!*rc)
        r->chat.special_in_content = e->p.special_in_content;
    if (!*rc && e->p.chat_template_kwargs) {  /* --chat-template-kwargs under the request's */
        char *merged = NULL;
        *rc = kvc_chat_kwargs_merge(e->p.chat_template_kwargs, r->kwargs_json, &merged, ke);
        if (!*rc) {
            free(r->kwargs_json);
            r->chat.template_kwargs_json = r->kwargs_json = merged;
        }
    }
    if (!*rc)
        *rc = make_tokens(e, r, ke);
    if (*rc && r) {
        drop_unqueued(r);
        r = NULL;
    }
    return r;
}

int kvc_engine_submit_all(kvc_engine *e, const kvc_request_params *params, int n,
                          kvc_request **out, char *err, size_t err_size)
{
    int rc = KVC_OK;
    kvc_err ke = { 0 };
    for (int i = 0; i < n; i++)
        out[i] = NULL;
    for (int i = 0; !rc && i < n; i++)
        out[i] = make_request(e, &params[i], &rc, &ke);
    if (!rc) {                               /* all of them queued, or none */
        pthread_mutex_lock(&e->mu);
        if (e->queued + n > e->p.max_queue || e->stop) {
            rc = kvc_fail(&ke, KVC_ERR_BUSY, "the server is busy: %d requests are waiting",
                          e->queued);
        } else {
            for (int i = 0; i < n; i++) {
                if (e->queue_tail)
                    e->queue_tail->next = out[i];
                else
                    e->queue_head = out[i];
                e->queue_tail = out[i];
            }
            e->queued += n;
            pthread_cond_signal(&e->cv);
        }
        pthread_mutex_unlock(&e->mu);
    }
    if (rc) {
        for (int i = 0; i < n; i++) {
            if (out[i])
                drop_unqueued(out[i]);
            out[i] = NULL;
        }
        snprintf(err, err_size, "%s", ke.msg[0] ? ke.msg : kvc_strerror(rc));
    }
    return rc;
}

kvc_request *kvc_engine_submit(kvc_engine *e, const kvc_request_params *p, int *status,
                               char *err, size_t err_size)
{
    kvc_request *r = NULL;
    int rc = kvc_engine_submit_all(e, p, 1, &r, err, err_size);
    if (status)
        *status = rc;
    return r;
}

void kvc_engine_get_metrics(kvc_engine *e, kvc_engine_metrics *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->m;
    out->queue_depth = e->queued;
    pthread_mutex_unlock(&e->mu);
    kvc_engine_tier_gauges(e, out);
}

const char *kvc_engine_template(const kvc_engine *e) { return kvc_chat_template_describe(e->tmpl); }
const char *kvc_engine_tool_format(const kvc_engine *e) { return kvc_tool_format_name(e->tool_format); }
const kvc_model *kvc_engine_model(const kvc_engine *e) { return e->model; }
int32_t kvc_engine_n_parallel(const kvc_engine *e) { return e->p.n_parallel; }

const char *kvc_engine_chat_template(const kvc_engine *e)
{
    return e->p.chat_template ? e->p.chat_template : kvc_model_chat_template(e->model);
}

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
    if (!rc)   /* the template is only read: any thread renders with it */
        rc = kvc_prompt_render(e->tmpl, p->messages, p->n_messages, &cp, prompt, &ke);
    free(kwargs);
    if (rc)
        snprintf(err, err_size, "%s", ke.msg[0] ? ke.msg : kvc_strerror(rc));
    return rc;
}
