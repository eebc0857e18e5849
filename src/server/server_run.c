/* server_run.c - running one generation request of any dialect (server.h):
 * parse it (a large body on the bulk thread), submit its choices to the
 * engine together, and answer - a stream (server_stream.c) or the whole
 * answer once every choice is done; and the requests that render or count
 * a prompt (/apply-template, /v1/messages/count_tokens).
 *
 * Waiting never blocks forever: kvc_request_next runs with a short tick,
 * and after every event and every tick the wait checks whether the client
 * hung up and whether the server is stopping; either ends the request, and
 * releasing the kvc_request cancels its generation. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "reasoning.h"
#include "sampler.h"

#if __has_include(<microhttpd.h>)

#include "server_http.h"

/* The end of r (DONE or ERROR) into *ev, its TEXT events dropped. false
 * when the client went away or the server is stopping (nothing in *ev). */
static bool wait_end(kvc_server *s, int fd, kvc_request *r, kvc_event *ev)
{
    for (;;) {
        if (kvc_request_next(r, ev, SRV_TICK_MS)) {
            if (ev->type != KVC_EVENT_TEXT)
                return true;
            kvc_event_clear(ev);
        }
        /* after a dropped event too: a request answered whole gets an event
         * per token and would otherwise never look (a poll is a microsecond) */
        if (atomic_load(&s->stopping) || srv_peer_gone(fd))
            return false;
    }
}

/* ========================================================== completions */

static void make_id(kvc_server *s, const srv_dialect *d, srv_reply_id *id, const char *model)
{
    uint64_t x = atomic_fetch_add(&s->next_id, 1) * 0x9E3779B97F4A7C15ull ^ s->id_salt;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    snprintf(id->id, sizeof(id->id), "%s%016llx", d->id_prefix, (unsigned long long)x);
    id->created = time(NULL);
    id->model = model;
}

/* The seed of the k-th choice of a prompt whose request gave `seed`: seed + k
 * modulo 2^64 - 1, so a fixed seed never becomes KVC_SEED_RANDOM (all ones,
 * what -1 asks for) and each choice k is deterministic (seed -2, k 1: 0). */
static uint64_t choice_seed(uint64_t seed, int k)
{
    if (seed == KVC_SEED_RANDOM)
        return seed;
    uint64_t room = KVC_SEED_RANDOM - 1 - seed;    /* steps before all ones */
    return (uint64_t)k <= room ? seed + (uint64_t)k : (uint64_t)k - room - 1;
}

/* The parameters of choice i: its prompt (a completion's list: n choices
 * each), its own seed (choice_seed), and only the first keeps the session key
 * (the others find the prompt in the prefix tree: it is computed once). */
static kvc_request_params choice_params(const srv_request *rq, int i)
{
    kvc_request_params p = rq->params;
    int k = i % rq->n, j = i / rq->n;
    if (rq->prompts) {                      /* completions */
        p.prompt = rq->prompts[j];
        p.prompt_tokens = rq->prompt_toks[j];
        p.n_prompt_tokens = rq->n_prompt_toks[j];
    }
    p.chat.sampling.seed = choice_seed(p.chat.sampling.seed, k);
    if (i > 0)
        p.session_key = NULL;
    return p;
}

typedef struct submit_job {
    kvc_server               *s;
    const kvc_request_params *p;
    int                       n;
    kvc_request             **r;
    int                       status;
    char                      err[512];
} submit_job;

static void submit_now(void *arg)
{
    submit_job *j = arg;
    j->status = kvc_engine_submit_all(j->s->engine, j->p, j->n, j->r, j->err, sizeof(j->err));
}

/* Run fn(arg), the heavy work of c's body (parsing, rendering, tokenizing):
 * a large body's on the bulk thread, whose work never takes a core the
 * engine wants (a running stream's tokens would stall), others' here. */
static void run_for_body(kvc_server *s, const conn *c, void (*fn)(void *), void *arg)
{
    if (c->len > LARGE_BODY)
        srv_bulk_run(s->bulk, fn, arg);
    else
        fn(arg);
}

/* Submit every choice of rq into r[0, n) at once: the engine renders and
 * tokenizes their prompts in the calling thread (run_for_body) and queues
 * them together, so that they start together and share the prompt through
 * the prefix tree. false with *e set when one could not be (none queued). */
static bool submit_choices(kvc_server *s, const conn *c, const srv_request *rq,
                           kvc_request **r, int n, srv_error *e)
{
    kvc_request_params p[SRV_MAX_CHOICES];
    for (int i = 0; i < n; i++)
        p[i] = choice_params(rq, i);
    submit_job j = { .s = s, .p = p, .n = n, .r = r, .status = KVC_ERR_NOMEM };
    run_for_body(s, c, submit_now, &j);
    if (j.status)
        srv_error_from_status(e, j.status, j.err);
    return !j.status;
}

/* ============================================================ streaming */

/* A response being streamed: the stream, and the request's log record,
 * whose line is given when the response is done with (stream_free): the
 * stream's figures are whole then, or as far as it came. */
typedef struct streaming {
    const kvc_server *s;
    srv_stream       *st;
    srv_reqlog       *log;   /* NULL = none */
} streaming;

/* MHD's content reader and free callback over the stream (server_stream.c). */
static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max)
{
    ssize_t n = srv_stream_read(((streaming *)cls)->st, out, max);
    return n == SRV_STREAM_END     ? MHD_CONTENT_READER_END_OF_STREAM
           : n == SRV_STREAM_ERROR ? MHD_CONTENT_READER_END_WITH_ERROR
                                   : n;
}

static void stream_free(void *cls)
{
    streaming *sg = cls;
    if (sg->log) {
        srv_error e;
        sg->log->status = 200;
        sg->log->has_stats = srv_stream_result(sg->st, &sg->log->stats, &e);
        if (e.http_status)
            snprintf(sg->log->error, sizeof(sg->log->error), "%d: %s", e.http_status, e.message);
        else if (!sg->log->has_stats)
            snprintf(sg->log->error, sizeof(sg->log->error), "the stream was cut (the client "
                     "went away or the server is stopping)");
    }
    srv_log_request(sg->s, sg->log);
    srv_stream_free(sg->st);
    free(sg);
}

/* Start the SSE response (taking st) with the first event, of choice i; the
 * request's log record goes with it. */
static enum MHD_Result start_stream(kvc_server *s, struct MHD_Connection *mc, conn *c,
                                    srv_stream *st, int i, const kvc_event *first,
                                    const srv_request *rq)
{
    streaming *sg = malloc(sizeof(*sg));
    struct MHD_Response *resp = sg && srv_stream_begin(st, i, first)
        ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, sg, stream_free)
        : NULL;
    if (!resp) {
        free(sg);
        srv_stream_free(st);
        return srv_respond(s, mc, 500, NULL, NULL, NULL);
    }
    *sg = (streaming){ s, st, c->log };
    c->log = NULL;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                            rq->dialect->stream_type ? rq->dialect->stream_type
                                                     : "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    if (rq->ignored[0])
        MHD_add_response_header(resp, "X-Kvchat-Ignored-Fields", rq->ignored);
    srv_add_cors(s, mc, resp);
    enum MHD_Result ret = MHD_queue_response(mc, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* stream: true. Every choice is submitted at once; the first event of any
 * is awaited before a byte is sent, so an error known by then is a plain
 * JSON error. MHD_NO when the client left or the server is stopping. */
static enum MHD_Result run_stream(kvc_server *s, struct MHD_Connection *mc, conn *c,
                                  const srv_request *rq)
{
    srv_reply_id id;
    make_id(s, rq->dialect, &id, rq->model ? rq->model : s->model_name);
    srv_stream *st = srv_stream_new(rq, &id, &s->lim, s->metrics, &s->stopping, srv_conn_fd(mc));
    if (!st)
        return srv_respond(s, mc, 500, NULL, NULL, NULL);
    int n;
    kvc_request **req = srv_stream_requests(st, &n);
    srv_error e = { 0 };
    kvc_event ev;
    int i = -1;
    if (submit_choices(s, c, rq, req, n, &e) && (i = srv_stream_next(st, &ev, true)) >= 0 &&
        ev.type == KVC_EVENT_ERROR)
        srv_error_from_status(&e, ev.status, ev.message);
    enum MHD_Result ret = MHD_NO;             /* gone or stopping: no answer */
    if (e.http_status) {
        srv_stream_free(st);                  /* cancels the others */
        ret = srv_respond_error(s, mc, c, &e);
    } else if (i >= 0) {
        ret = start_stream(s, mc, c, st, i, &ev, rq);
    } else {
        srv_stream_free(st);
    }
    if (i >= 0)
        kvc_event_clear(&ev);
    return ret;
}

/* ======================================================= whole answers */

/* The complete (non-streamed) answer, from the DONE events of its choices. */
static enum MHD_Result respond_done(kvc_server *s, struct MHD_Connection *mc, const conn *c,
                                    const srv_request *rq, const kvc_event *done, int n)
{
    srv_reply_id id;
    make_id(s, rq->dialect, &id, rq->model ? rq->model : s->model_name);
    srv_reply rp[SRV_MAX_CHOICES];
    kvc_chat_stats stats[SRV_MAX_CHOICES];
    for (int i = 0; i < n; i++) {
        stats[i] = done[i].stats;
        srv_metrics_done(s->metrics, &done[i].stats);
        rp[i] = srv_reply_make(&done[i], true, rq->params.chat.stop, rq->params.chat.n_stop,
                               s->lim.model);
        if (rq->forced_calls)
            srv_reply_only_calls(&rp[i]);
        if (rq->think)
            srv_reply_think(&rp[i], rq->think_open);
    }
    if (c->log) {
        c->log->stats = srv_stats_sum(stats, n, rq->n);
        c->log->has_stats = true;
    }
    const char *h[] = { "X-Kvchat-Ignored-Fields", rq->ignored, NULL };
    return srv_respond(s, mc, 200, rq->dialect->response(&id, rq, rp, n, rq->n, s->lim.model,
                                                     rq->logprobs >= 0),
                   "application/json", rq->ignored[0] ? h : NULL);
}

/* Every choice submitted at once (they share the prompt through the prefix
 * tree), answered whole. MHD_NO when the client left or the server is
 * stopping. */
static enum MHD_Result run_choices(kvc_server *s, struct MHD_Connection *mc, const conn *c,
                                   const srv_request *rq)
{
    int n = rq->n * rq->n_prompts, got = 0, fd = srv_conn_fd(mc);
    kvc_request *r[SRV_MAX_CHOICES] = { 0 };
    kvc_event ev[SRV_MAX_CHOICES];
    memset(ev, 0, sizeof(ev));
    srv_error e = { 0 };
    enum MHD_Result ret = MHD_NO;
    submit_choices(s, c, rq, r, n, &e);
    for (; got < n && !e.http_status; got++) {
        if (!wait_end(s, fd, r[got], &ev[got]))
            break;                             /* gone or stopping: MHD_NO */
        if (ev[got].type == KVC_EVENT_ERROR)
            srv_error_from_status(&e, ev[got].status, ev[got].message);
    }
    for (int i = 0; i < n; i++)
        kvc_request_free(r[i]);
    if (e.http_status)
        ret = srv_respond_error(s, mc, c, &e);
    else if (got == n)
        ret = respond_done(s, mc, c, rq, ev, n);
    for (int i = 0; i < n; i++)
        kvc_event_clear(&ev[i]);
    return ret;
}

/* Submit a parsed request and answer it, streamed or whole. */
static enum MHD_Result run_request(kvc_server *s, struct MHD_Connection *mc, conn *c,
                                   const srv_request *rq)
{
    if (rq->load_only)        /* Ollama's "load the model": it is */
        return srv_respond_json(s, mc, srv_ollama_load_json(rq->dialect, rq->model ? rq->model
                                                                                  : s->model_name));
    return rq->stream ? run_stream(s, mc, c, rq) : run_choices(s, mc, c, rq);
}

/* The prompt the chat request rq renders to (malloc'd), exactly as it will be
 * tokenized; NULL after answering the error (a failing template is a 400)
 * with *ret the answer's result. */
static char *render_or_answer(kvc_server *s, struct MHD_Connection *mc, const conn *c,
                              const srv_request *rq, enum MHD_Result *ret)
{
    char err[512] = "", *prompt = NULL;
    int rc = kvc_engine_render(s->engine, &rq->params, &prompt, err, sizeof(err));
    if (rc || !prompt) {
        srv_error e;
        srv_error_from_status(&e, rc ? rc : KVC_ERR_NOMEM, err);
        *ret = srv_respond_error(s, mc, c, &e);
        return NULL;
    }
    return prompt;
}

/* POST /apply-template (as llama-server has it): the prompt a chat request
 * renders to. */
static enum MHD_Result handle_apply_template(kvc_server *s, struct MHD_Connection *mc,
                                             const conn *c, const srv_request *rq)
{
    enum MHD_Result ret;
    char *prompt = render_or_answer(s, mc, c, rq, &ret);
    if (!prompt)
        return ret;
    char *json = srv_prompt_json(prompt);
    free(prompt);
    return srv_respond_json(s, mc, json);
}

/* POST /v1/messages/count_tokens: the tokens the request's prompt has. */
static enum MHD_Result handle_count_tokens(kvc_server *s, struct MHD_Connection *mc,
                                           const conn *c, const srv_request *rq)
{
    srv_error e;
    enum MHD_Result ret;
    char *prompt = render_or_answer(s, mc, c, rq, &ret);
    if (!prompt)
        return ret;
    size_t n = strlen(prompt);
    int32_t *t = malloc((n + 8) * sizeof(int32_t));
    int64_t k = t ? kvc_model_tokenize(s->lim.model, prompt, n, true, true, t, (int64_t)n + 8)
                  : -1;
    free(t);
    free(prompt);
    if (k < 0) {
        srv_error_set(&e, 500, "server_error", NULL, NULL, "tokenization failed");
        return srv_respond_error(s, mc, c, &e);
    }
    return srv_respond_json(s, mc, srv_count_tokens_json(k));
}

/* The request's cache namespace (DESIGN.md §5): its API key's, unless keys
 * share the cache, and its cache_salt. Into buf; NULL for the default. */
static const char *namespace_of(const kvc_server *s, const conn *c, const srv_request *rq,
                                char *buf, size_t cap)
{
    const char *key = c->key >= 0 && !s->share_keys ? s->key_ns[c->key] : "";
    if (!*key && !rq->cache_salt)
        return NULL;
    snprintf(buf, cap, "%s|salt:%s", key, rq->cache_salt ? rq->cache_salt : "");
    return buf;
}

typedef struct parse_job {
    kvc_server  *s;
    const conn  *c;
    const srv_dialect *dialect;
    srv_request *rq;
    srv_error   *e;
    int          rc;
} parse_job;

/* Whether the reply to p begins inside a <think> block: whether the prompt
 * ends with "<think>". The end of a prompt is the generation prompt, which
 * depends on the template's variables, not on the conversation before: the
 * last message alone is rendered (microseconds, where a coding agent's whole
 * prompt takes tens of milliseconds), and the whole one only when that
 * fails (a template that wants a user turn first). */
static bool reply_opens_thinking(kvc_engine *engine, const kvc_request_params *p)
{
    kvc_request_params last = *p;
    last.messages = p->messages + p->n_messages - 1;
    last.n_messages = 1;
    last.chat.tools_json = NULL;
    char *prompt = NULL, err[8];
    bool open = false;
    if (kvc_engine_render(engine, &last, &prompt, err, sizeof(err)) == KVC_OK ||
        kvc_engine_render(engine, p, &prompt, err, sizeof(err)) == KVC_OK)
        open = kvc_think_prompt_open(prompt);
    free(prompt);
    return open;
}

static void parse_now(void *arg)
{
    parse_job *j = arg;
    j->rc = srv_request_parse(j->dialect, j->c->body ? j->c->body : "", j->c->len, &j->s->lim,
                              j->rq, j->e);
    if (!j->rc && j->rq->think)
        j->rq->think_open = j->s->lim.think_harmony ? KVC_THINK_HARMONY
                          : reply_opens_thinking(j->s->engine, &j->rq->params) ? KVC_THINK_INSIDE
                                                                               : KVC_THINK_TAGS;
    j->rq->params.chat.split_reasoning = !j->rc && j->rq->think;
    j->rq->params.chat.reasoning_mode = j->rc ? 0 : j->rq->think_open;
}

/* The last call for a completion POST (the whole body is in c): 413 when it
 * went past the limit, 400 when it does not validate, else run it. Parsed
 * through run_for_body. */
enum MHD_Result srv_handle_completion(kvc_server *s, struct MHD_Connection *mc, conn *c)
{
    srv_error e;
    if (c->discarded) {
        srv_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                      "the request body is larger than the limit of %zu bytes", s->max_body);
        return srv_respond_error(s, mc, c, &e);
    }
    if (c->route == ROUTE_TOKENIZE || c->route == ROUTE_DETOKENIZE ||
        c->route == ROUTE_OLLAMA_SHOW) {
        memset(&e, 0, sizeof(e));
        const char *body = c->body ? c->body : "";
        char *json = c->route == ROUTE_TOKENIZE ? srv_tokenize(s->lim.model, body, c->len, &e)
                   : c->route == ROUTE_DETOKENIZE ? srv_detokenize(s->lim.model, body, c->len, &e)
                                                  : srv_ollama_show_json(&s->desc, body, c->len, &e);
        e.http_status = json ? 0 : e.http_status ? e.http_status : 500;
        return json ? srv_respond_json(s, mc, json) : srv_respond_error(s, mc, c, &e);
    }
    srv_request rq;
    parse_job pj = { s, c, c->dialect, &rq, &e, 0 };
    run_for_body(s, c, parse_now, &pj);
    if (pj.rc != 0)
        return srv_respond_error(s, mc, c, &e);
    free(c->body);   /* the parsed tree holds what is needed */
    c->body = NULL;
    char ns[MAX_NAMESPACE];
    rq.params.cache_namespace = namespace_of(s, c, &rq, ns, sizeof(ns));
    if (c->log) {
        srv_reqlog_session(c->log, rq.params.session_key);
        snprintf(c->log->api, sizeof(c->log->api), "%s", rq.dialect->name);
    }
    if (rq.load_only && c->route != ROUTE_GENERATE) {   /* an Ollama load: nothing to render */
        srv_request_free(&rq);
        srv_error_set(&e, 400, "invalid_request_error", NULL, NULL,
                      "the request has no prompt and no messages: nothing to render");
        return srv_respond_error(s, mc, c, &e);
    }
    enum MHD_Result ret = c->route == ROUTE_APPLY_TEMPLATE ? handle_apply_template(s, mc, c, &rq)
                        : c->route == ROUTE_COUNT_TOKENS   ? handle_count_tokens(s, mc, c, &rq)
                                                           : run_request(s, mc, c, &rq);
    srv_request_free(&rq);
    return ret;
}

#endif
