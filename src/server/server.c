/* server.c - the HTTP layer of the OpenAI-compatible server (libmicrohttpd).
 *
 * One thread per connection (MHD_USE_THREAD_PER_CONNECTION, poll-based), so
 * a request may block its own thread on the engine without stalling others.
 * A completion request goes: headers (route, method, API key, Content-Length
 * checked before any body byte is read) -> body (accumulated up to
 * max_body; beyond it the rest is discarded and 413 answered, and a body
 * that goes on past 4 x max_body closes the connection) -> parse and
 * validate (server_json.c) -> kvc_engine_submit -> wait for events.
 *
 * Waiting never blocks forever: kvc_request_next runs with a short tick, and
 * after every event and every tick the wait checks whether the client hung
 * up (POLLRDHUP on its socket: srv_peer_gone) and whether the server is
 * stopping; either ends the request, and releasing the kvc_request cancels
 * its generation - as promptly for a request answered whole as for a stream.
 *
 * Connections (a thread each) are limited in number, in total and per client
 * address, and each request must arrive whole within a deadline that bytes
 * do not extend (server_guard.c): slow senders cannot hold every slot. The
 * API key is checked before routing, so without it nothing about the routes
 * is told. Answers decided from the headers (GETs, errors) are given once the
 * request is complete, so that the connection is kept alive for the next one
 * (answering from the headers makes libmicrohttpd close it); only an error
 * with a body still to come that will not be read closes the connection.
 *
 * Several choices (n, a list of prompts) are submitted at once, streamed or
 * not: they share the prompt through the prefix tree.
 *
 * Streaming: the first event is awaited before any byte is sent, so an error
 * known by then (context length, queue full) is a plain JSON error with its
 * status. After that, an MHD callback response reads the stream
 * (server_stream.c: its reader blocks on the engine, which is fine in a
 * connection's own thread; with several choices it takes their events in
 * turns, so their chunks interleave) and its free callback frees it, which
 * releases - and so cancels - every choice's request: a client that
 * disconnects mid-stream stops its generation. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "sampler.h"
#include "server.h"
#include "tool_calls.h"

kvc_server_params kvc_server_default_params(void)
{
    kvc_server_params p = { 0 };
    p.host = "127.0.0.1";
    p.port = 8080;
    p.sampling = kvc_sampler_default_params();
    return p;
}

int kvc_server_default_max_connections(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 256;
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 8192 + 64)
        return 8192;
    /* 64 descriptors for the rest: the model file, the cache, the engine */
    return rl.rlim_cur < 128 ? 64 : (int)rl.rlim_cur - 64;
}

#if !__has_include(<microhttpd.h>)

int kvc_server_start(kvc_engine *engine, const kvc_server_params *params, kvc_server **out,
                     char *err, size_t err_size)
{
    *out = NULL;
    snprintf(err, err_size, "kvchat was built without libmicrohttpd: no HTTP server");
    return KVC_ERR_UNSUPPORTED;
}
int  kvc_server_port(const kvc_server *s) { return 0; }
void kvc_server_stop(kvc_server *s) { }

#else

#include <microhttpd.h>
#include <xxhash.h>

#include "server_http.h"
#include "server_webui.h"

#define MAX_LOGGED 256   /* distinct ignored field names logged (then no more) */

/* srv_limits.log_ignored: tell the log of an ignored field, once per name. */
static void log_ignored(const char *field, void *user)
{
    kvc_server *s = user;
    bool seen = false, full;
    pthread_mutex_lock(&s->logged_mu);
    for (size_t i = 0; i < s->n_logged && !seen; i++)
        seen = !strcmp(s->logged[i], field);
    full = s->n_logged >= MAX_LOGGED;
    char *copy = seen || full ? NULL : strdup(field);
    if (copy && kvc_grow((void **)&s->logged, &s->cap_logged, s->n_logged, sizeof(char *)))
        s->logged[s->n_logged++] = copy;
    else
        free(copy), copy = NULL;
    pthread_mutex_unlock(&s->logged_mu);
    if (copy && s->log) {
        char msg[200];
        snprintf(msg, sizeof(msg), "request field '%.100s' accepted and ignored (it changes "
                 "nothing kvchat does; told once)", field);
        char *line = srv_log_notice("warning", msg, s->log_format);
        if (line)
            s->log(line, s->log_user);
        free(line);
    }
}

void srv_log_request(const kvc_server *s, srv_reqlog *l)
{
    if (l && s->log && srv_reqlog_wanted(l, s->log_requests)) {
        char *line = srv_reqlog_line(l, s->log_format);
        if (line)
            s->log(line, s->log_user);
        free(line);
    }
    free(l);
}

/* The peer's address as text ("127.0.0.1", "::1"); "" when unknown. */
static void client_address(struct MHD_Connection *mc, char *buf, size_t size)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    buf[0] = 0;
    if (sa && sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, buf, (socklen_t)size);
    else if (sa && sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, buf, (socklen_t)size);
}


/* ============================================================ responses */

static const char oom_json[] =
    "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
    "\"code\":null}}";

/* Queue `body` (malloc'd, taken; NULL = out of memory: a static 500) with
 * status and content type, plus extra headers: name, value, ..., NULL. */
/* The CORS headers for the request's Origin when --cors-origins allows it. */
void srv_add_cors(const kvc_server *s, struct MHD_Connection *mc, struct MHD_Response *r)
{
    const char *origin = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Origin");
    if (!s->cors || !origin)
        return;
    bool any = !strcmp(s->cors, "*"), ok = any;
    size_t n = strlen(origin);
    for (const char *p = s->cors; !ok && *p;) {
        const char *e = strchr(p, ',');
        size_t k = e ? (size_t)(e - p) : strlen(p);
        ok = k == n && !strncmp(p, origin, n);
        p += k + (e != NULL);
    }
    if (!ok)
        return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", any ? "*" : origin);
    if (!any)
        MHD_add_response_header(r, "Vary", "Origin");
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers",
                            "Authorization, Content-Type, OpenAI-Organization, OpenAI-Project, "
                            "X-Stainless-Arch, X-Stainless-Lang, X-Stainless-OS, "
                            "X-Stainless-Package-Version, X-Stainless-Runtime, "
                            "X-Stainless-Runtime-Version, X-Stainless-Retry-Count, "
                            "X-Stainless-Timeout, x-api-key, anthropic-version, anthropic-beta, "
                            "anthropic-dangerous-direct-browser-access");
    MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    MHD_add_response_header(r, "Access-Control-Expose-Headers", "X-Kvchat-Ignored-Fields");
}

enum MHD_Result srv_respond(const kvc_server *s, struct MHD_Connection *mc, int status,
                               char *body, const char *ctype, const char *const *headers)
{
    struct MHD_Response *r;
    if (body) {
        r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    } else {
        status = 500;
        ctype = "application/json";
        r = MHD_create_response_from_buffer(sizeof(oom_json) - 1, (void *)oom_json,
                                            MHD_RESPMEM_PERSISTENT);
    }
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    for (; headers && headers[0]; headers += 2)
        MHD_add_response_header(r, headers[0], headers[1]);
    srv_add_cors(s, mc, r);
    enum MHD_Result ret = MHD_queue_response(mc, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result srv_respond_error(kvc_server *s, struct MHD_Connection *mc, const conn *c,
                                     const srv_error *e)
{
    const char *h[6] = { 0 }, **p = h;
    if (e->http_status == 401)
        *p++ = MHD_HTTP_HEADER_WWW_AUTHENTICATE, *p++ = "Bearer";
    else if (e->http_status == 405)
        *p++ = MHD_HTTP_HEADER_ALLOW, *p++ = c->post ? "POST" : "GET";
    else if (e->http_status == 503)
        *p++ = MHD_HTTP_HEADER_RETRY_AFTER, *p++ = "1";
    if (c->unread_body)   /* answered before the body: do not wait for it */
        *p++ = MHD_HTTP_HEADER_CONNECTION, *p++ = "close";
    if (c->post)
        srv_metrics_failed(s->metrics);
    srv_reqlog_error(c->log, e);
    return srv_respond(s, mc, e->http_status, c->dialect->error(e), "application/json", h);
}

enum MHD_Result srv_respond_json(const kvc_server *s, struct MHD_Connection *mc, char *json)
{
    return srv_respond(s, mc, 200, json, "application/json", NULL);
}

/* ============================================================== waiting */

int srv_conn_fd(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* The connection's entry in the guard (NULL when it could not be made). */
static srv_conn *conn_guard(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* MHD's connection notice: register a new connection with the guard, and
 * unregister it before its socket is closed. */
static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    kvc_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        *socket_context = srv_guard_open(s->guard, srv_conn_fd(mc));
    } else {
        srv_guard_close(s->guard, *socket_context);
        *socket_context = NULL;
    }
}

/* ================================================================ GETs */

/* /health, /v1/models, /v1/models/NAME, /props, /metrics, Ollama's /api/tags,
 * /api/ps, /api/version, the chat page. */
static enum MHD_Result handle_get(kvc_server *s, struct MHD_Connection *mc, const conn *c,
                                  const char *url)
{
    switch (c->route) {
    case ROUTE_HEALTH:
        return srv_respond_json(s, mc, strdup("{\"status\":\"ok\"}"));
    case ROUTE_WEBUI:
        return srv_webui_respond(mc, srv_webui_find(url));
    case ROUTE_MODELS:
        return srv_respond_json(s, mc, srv_models_desc_json(&s->desc, false));
    case ROUTE_PROPS:
        return srv_respond_json(s, mc, srv_props_json(&s->desc));
    case ROUTE_OLLAMA_TAGS:
    case ROUTE_OLLAMA_PS:
        return srv_respond_json(s, mc, srv_ollama_list_json(&s->desc, c->route == ROUTE_OLLAMA_PS));
    case ROUTE_OLLAMA_VERSION:
        return srv_respond_json(s, mc, srv_ollama_version_json(&s->desc));
    case ROUTE_MODEL: {
        const char *name = strrchr(url, '/') + 1;
        if (strcmp(name, s->model_name) != 0) {
            srv_error e;
            srv_error_set(&e, 404, "invalid_request_error", "model", "model_not_found",
                          "the model '%.200s' does not exist", name);
            return srv_respond_error(s, mc, c, &e);
        }
        return srv_respond_json(s, mc, srv_models_desc_json(&s->desc, true));
    }
    default: {
        kvc_engine_metrics em;
        int64_t open;
        uint64_t dropped;
        kvc_engine_get_metrics(s->engine, &em);
        srv_guard_counts(s->guard, &open, &dropped);
        srv_metrics_connections(s->metrics, open, dropped);
        return srv_respond(s, mc, 200, srv_metrics_text(s->metrics, &em),
                       "text/plain; version=0.0.4; charset=utf-8", NULL);
    }
    }
}

/* ============================================================ dispatch */

/* The dialect whose name is `name` ("chat.completions", "responses",
 * "messages", "ollama.chat", "ollama.generate"); NULL when none is. */
static const srv_dialect *dialect_named(const char *name)
{
    static const srv_dialect *const all[] = { &srv_dialect_chat, &srv_dialect_responses,
                                              &srv_dialect_messages, &srv_dialect_ollama_chat,
                                              &srv_dialect_ollama_generate };
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        if (!strcmp(name, all[i]->name))
            return all[i];
    return NULL;
}

/* c's route, its dialect and method, from the path (the query string is not
 * part of url: /v1/messages?beta=true is /v1/messages). */
static void find_route(conn *c, const char *url)
{
    static const struct {
        const char *path;
        int route;
        const srv_dialect *dialect;   /* NULL = chat's */
        bool post;
    } routes[] = {
        { "/v1/chat/completions", ROUTE_GENERATE, NULL, true },
        { "/chat/completions", ROUTE_GENERATE, NULL, true },
        { "/v1/completions", ROUTE_GENERATE, &srv_dialect_completions, true },
        { "/v1/responses", ROUTE_GENERATE, &srv_dialect_responses, true },
        { "/responses", ROUTE_GENERATE, &srv_dialect_responses, true },
        { "/v1/messages", ROUTE_GENERATE, &srv_dialect_messages, true },
        { "/v1/messages/count_tokens", ROUTE_COUNT_TOKENS, &srv_dialect_messages, true },
        { "/completions", ROUTE_GENERATE, &srv_dialect_completions, true },
        { "/v1/models", ROUTE_MODELS, NULL, false }, { "/models", ROUTE_MODELS, NULL, false },
        { "/apply-template", ROUTE_APPLY_TEMPLATE, NULL, true },
        { "/tokenize", ROUTE_TOKENIZE, NULL, true }, { "/detokenize", ROUTE_DETOKENIZE, NULL, true },
        { "/health", ROUTE_HEALTH, NULL, false }, { "/metrics", ROUTE_METRICS, NULL, false },
        { "/props", ROUTE_PROPS, NULL, false },
        { "/api/chat", ROUTE_GENERATE, &srv_dialect_ollama_chat, true },
        { "/api/generate", ROUTE_GENERATE, &srv_dialect_ollama_generate, true },
        { "/api/show", ROUTE_OLLAMA_SHOW, &srv_dialect_ollama_chat, true },
        { "/api/tags", ROUTE_OLLAMA_TAGS, &srv_dialect_ollama_chat, false },
        { "/api/ps", ROUTE_OLLAMA_PS, &srv_dialect_ollama_chat, false },
        { "/api/version", ROUTE_OLLAMA_VERSION, &srv_dialect_ollama_chat, false },
        { "/api/embed", ROUTE_OLLAMA_EMBED, &srv_dialect_ollama_chat, true },
        { "/api/embeddings", ROUTE_OLLAMA_EMBED, &srv_dialect_ollama_chat, true },
        { "/api/pull", ROUTE_OLLAMA_MANAGE, &srv_dialect_ollama_chat, true },
        { "/api/push", ROUTE_OLLAMA_MANAGE, &srv_dialect_ollama_chat, true },
        { "/api/create", ROUTE_OLLAMA_MANAGE, &srv_dialect_ollama_chat, true },
        { "/api/copy", ROUTE_OLLAMA_MANAGE, &srv_dialect_ollama_chat, true },
        { "/api/delete", ROUTE_OLLAMA_MANAGE, &srv_dialect_ollama_chat, true },
    };
    c->dialect = &srv_dialect_chat;
    c->route = ROUTE_NONE;
    c->post = false;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        if (!strcmp(url, routes[i].path)) {
            c->route = routes[i].route;
            c->dialect = routes[i].dialect ? routes[i].dialect : &srv_dialect_chat;
            c->post = routes[i].post;
            return;
        }
    if (!strncmp(url, "/v1/models/", 11) && url[11])
        c->route = ROUTE_MODEL;
    else if (!strncmp(url, "/api/", 5))       /* Ollama's clients read its error shape */
        c->dialect = &srv_dialect_ollama_chat;
}

/* Whether token equals key, in time that does not depend on where they
 * differ. */
static bool same_key(const char *token, const char *key)
{
    size_t n = strlen(token), k = strlen(key);
    unsigned char diff = n != k;
    for (size_t i = 0; i < k; i++)
        diff |= (unsigned char)key[i] ^ (unsigned char)(i < n ? token[i] : 0);
    return diff == 0;
}

/* Which API key the bearer token is (every key compared), into *key (-1:
 * none configured). Returns whether the request may go on. */
static bool authorized(const kvc_server *s, struct MHD_Connection *mc, int *key)
{
    *key = -1;
    if (s->n_api_keys == 0)
        return true;
    const char *h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    const char *x = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "x-api-key");
    if (h && strncasecmp(h, "Bearer ", 7) == 0)
        h += 7;
    else if (x)                       /* Anthropic's clients send the key so */
        h = x;
    else
        return false;
    while (*h == ' ')
        h++;
    for (int i = 0; i < s->n_api_keys; i++)
        if (same_key(h, s->api_keys[i]) && *key < 0)
            *key = i;
    return *key >= 0;
}


/* The first call for a request: what can be decided from the headers, in
 * this order: the API key (before routing: without it nothing about the
 * routes is told; /health and the chat page stay open), the route, the
 * method, a declared body over the limit. An error is kept in c->err and answered when the
 * request is complete (the connection stays open for the next one), or at
 * once when a body follows that will not be read (the connection then
 * closes). Returns true to go on reading the request, false when *ret is the
 * answer. */
static bool on_headers(kvc_server *s, struct MHD_Connection *mc, conn *c, const char *url,
                       const char *method, enum MHD_Result *ret)
{
    srv_error *e = &c->err;
    find_route(c, url);
    if (c->route == ROUTE_NONE && s->webui && srv_webui_find(url))
        c->route = ROUTE_WEBUI;
    const char *api = c->route == ROUTE_APPLY_TEMPLATE
                    ? MHD_lookup_connection_value(mc, MHD_GET_ARGUMENT_KIND, "api") : NULL;
    if (api && !(c->dialect = dialect_named(api))) {   /* the request in another API's shape */
        c->dialect = &srv_dialect_chat;
        srv_error_set(&c->err, 400, "invalid_request_error", "api", NULL,
                      "api '%.40s' is not one of chat.completions, responses, messages, "
                      "ollama.chat, ollama.generate", api);
    }
    if (!strcmp(method, "OPTIONS")) {        /* a CORS preflight: no API key is sent */
        c->preflight = true;
        return true;
    }
    bool post = c->post;
    if (post)
        srv_metrics_request(s->metrics);
    const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_LENGTH);
    unsigned long long n = cl ? strtoull(cl, NULL, 10) : 0;
    c->unread_body = n > 0 || MHD_lookup_connection_value(mc, MHD_HEADER_KIND,
                                                          MHD_HTTP_HEADER_TRANSFER_ENCODING);
    /* the page holds no secret: it asks for the key and sends it itself */
    bool head = c->route == ROUTE_WEBUI && !strcmp(method, "HEAD");   /* of a page file */
    bool open = (c->route == ROUTE_HEALTH || c->route == ROUTE_WEBUI) &&
                (!strcmp(method, "GET") || head);
    if (!open && !authorized(s, mc, &c->key))
        srv_error_set(e, 401, "invalid_request_error", NULL, "invalid_api_key",
                      "a valid API key is required: send the header 'Authorization: Bearer KEY' "
                      "(or 'x-api-key: KEY')");
    else if (c->route == ROUTE_NONE)
        srv_error_set(e, 404, "invalid_request_error", NULL, "not_found",
                      "Invalid URL (%.16s %.200s)", method, url);
    else if (c->route == ROUTE_OLLAMA_EMBED)
        srv_error_set(e, 501, "invalid_request_error", NULL, "not_implemented",
                      "%.40s: this model gives no embeddings (kvchat serves text generation; "
                      "use an embedding server for embeddings)", url);
    else if (c->route == ROUTE_OLLAMA_MANAGE)
        srv_error_set(e, 501, "invalid_request_error", NULL, "not_implemented",
                      "%.40s: kvchat serves the one model it was started with (-m MODEL.gguf); "
                      "it does not pull, push, create, copy or delete models", url);
    else if (strcmp(method, post ? "POST" : "GET") != 0 && !head)
        srv_error_set(e, 405, "invalid_request_error", NULL, "method_not_allowed",
                      "%.16s is not allowed on %.200s (use %s)", method, url, post ? "POST" : "GET");
    else if (post && n > s->max_body)
        srv_error_set(e, 413, "invalid_request_error", NULL, "request_too_large",
                      "the request body (%llu bytes) is larger than the limit of %zu bytes", n,
                      s->max_body);
    if (!e->http_status || !c->unread_body) {
        c->unread_body = false;   /* read (and for a GET or an error, ignored) */
        return true;
    }
    *ret = srv_respond_error(s, mc, c, e);
    return false;
}

/* Append a piece of the body; past max_body it is counted, not kept. false
 * to drop the connection (a body far past the limit, or out of memory). */
static bool on_body(kvc_server *s, conn *c, const char *data, size_t n)
{
    if (c->discarded || c->len + n > s->max_body) {
        c->discarded += n;
        return c->discarded <= 4 * s->max_body;
    }
    if (c->len + n > c->cap) {
        size_t cap = KVC_MAX(c->cap * 2, c->len + n);
        cap = KVC_MIN(KVC_MAX(cap, 4096), s->max_body);
        char *b = realloc(c->body, cap);
        if (!b)
            return false;
        c->body = b;
        c->cap = cap;
    }
    memcpy(c->body + c->len, data, n);
    c->len += n;
    return true;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version, const char *data,
                                  size_t *data_size, void **con_cls)
{
    kvc_server *s = cls;
    conn *c = *con_cls;
    enum MHD_Result ret = MHD_YES;
    if (!c) {
        if (!(c = calloc(1, sizeof(*c))))
            return MHD_NO;
        *con_cls = c;
        char client[64];
        client_address(mc, client, sizeof(client));
        c->log = srv_reqlog_new(method, url, client);   /* NULL: no line */
        return on_headers(s, mc, c, url, method, &ret) ? MHD_YES : ret;
    }
    if (*data_size) {
        bool ok = on_body(s, c, data, *data_size);
        *data_size = 0;
        return ok ? MHD_YES : MHD_NO;
    }
    srv_guard_disarm(conn_guard(mc));   /* the request is in: no deadline while answered */
    if (c->preflight)
        return srv_respond(s, mc, 204, strdup(""), "text/plain", NULL);
    if (c->err.http_status)
        return srv_respond_error(s, mc, c, &c->err);
    if (!c->post)
        return handle_get(s, mc, c, url);
    return srv_handle_completion(s, mc, c);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    kvc_server *s = cls;
    srv_guard_arm(s->guard, conn_guard(mc));   /* the next request on it, if any */
    conn *c = *con_cls;
    if (c) {
        if (c->log && !c->log->status) {
            const union MHD_ConnectionInfo *ci =
                MHD_get_connection_info(mc, MHD_CONNECTION_INFO_HTTP_STATUS);
            c->log->status = ci ? (int)ci->http_status : 0;
        }
        if (c->log && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !c->log->error[0])
            snprintf(c->log->error, sizeof(c->log->error), "%s",
                     toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED ? "the connection timed out"
                     : atomic_load(&s->stopping) ? "the server is stopping"
                                                 : "the client went away");
        if (c->log && !c->log->status)    /* ended before any answer: nginx's 499 */
            c->log->status = 499;
        srv_log_request(s, c->log);
        free(c->body);
        free(c);
        *con_cls = NULL;
    }
}

/* ============================================================ life cycle */

/* A listening TCP socket on host:port; -1 with err set. */
static int listen_on(const char *host, int port, char *err, size_t err_size)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_PASSIVE | AI_NUMERICSERV }, *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc != 0) {
        snprintf(err, err_size, "cannot resolve '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1, e = 0;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            e = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
            e = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0)
        snprintf(err, err_size, "cannot listen on %s:%d: %s", host, port, strerror(e));
    return fd;
}

/* Whether listening socket fd is bound to a loopback address. */
static bool bound_loopback(int fd)
{
    struct sockaddr_storage ss;
    socklen_t n = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &n) != 0)
        return false;
    if (ss.ss_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)&ss)->sin6_addr);
    return (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
}

static int bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t n = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &n) != 0)
        return -1;
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static void server_free(kvc_server *s)
{
    srv_guard_free(s->guard);
    srv_metrics_free(s->metrics);
    for (int i = 0; i < s->n_api_keys; i++) {
        free(s->api_keys[i]);
        free(s->key_ns[i]);
    }
    free(s->api_keys);
    free(s->key_ns);
    free(s->model_name);
    free(s->cors);
    free(s->version);
    free(s->model_path);
    srv_model_desc_free(&s->desc);
    srv_bulk_free(s->bulk);
    srv_vocab_free(s->lim.vocab);
    for (size_t i = 0; i < s->n_logged; i++)
        free(s->logged[i]);
    free(s->logged);
    pthread_mutex_destroy(&s->logged_mu);
    free(s);
}

/* Copy the API keys (empty ones skipped) and name each key's namespace by a
 * hash of the key: the key itself is never a cache or file name. false when
 * out of memory. */
static bool add_keys(kvc_server *s, const kvc_server_params *p)
{
    int n = (p->api_key && *p->api_key) + (p->n_api_keys > 0 ? p->n_api_keys : 0);
    s->api_keys = calloc((size_t)n + 1, sizeof(char *));
    s->key_ns = calloc((size_t)n + 1, sizeof(char *));
    if (!s->api_keys || !s->key_ns)
        return false;
    for (int i = -1; i < p->n_api_keys; i++) {
        const char *k = i < 0 ? p->api_key : p->api_keys[i];
        if (!k || !*k)
            continue;
        char ns[40];
        snprintf(ns, sizeof(ns), "key:%016llx", (unsigned long long)XXH3_64bits(k, strlen(k)));
        s->api_keys[s->n_api_keys] = strdup(k);
        s->key_ns[s->n_api_keys] = strdup(ns);
        if (!s->api_keys[s->n_api_keys] || !s->key_ns[s->n_api_keys++])
            return false;
    }
    return true;
}

/* Whether the engine's template writes reasoning in <think> tags: in a
 * past turn's reasoning_content or in its generation prompt; *harmony:
 * it writes harmony's channels (gpt-oss) instead. */
static bool template_thinks(kvc_engine *engine, bool *harmony)
{
    *harmony = false;
    kvc_chat_message m[2] = { { .role = "user", .content = "Hi" },
                              { .role = "assistant", .content = "Hello",
                                .reasoning_content = "kvchat-probe" } };
    bool found = false;
    for (size_t n = 1; n <= 2 && !found; n++) {
        kvc_request_params p = { .messages = m, .n_messages = n,
                                 .chat = kvc_chat_default_params() };
        char *prompt = NULL, err[8];
        if (kvc_engine_render(engine, &p, &prompt, err, sizeof(err)) == KVC_OK)
            found = strstr(prompt, "<think>") || strstr(prompt, "</think>");
        *harmony = *harmony || (prompt && strstr(prompt, "<|channel|>"));
        free(prompt);
    }
    return found;
}

static kvc_server *server_new(kvc_engine *engine, const kvc_server_params *p)
{
    kvc_server *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    pthread_mutex_init(&s->logged_mu, NULL);
    s->engine = engine;
    s->metrics = srv_metrics_new();
    s->model_name = strdup(p->model_name && *p->model_name ? p->model_name : "kvchat");
    s->bulk = srv_bulk_new();                /* NULL: large bodies on their own threads */
    s->share_keys = p->share_cache_across_keys;
    s->webui = !p->no_webui;
    bool keys_ok = add_keys(s, p);
    int64_t deadline_ms = (int64_t)(p->request_timeout_s > 0 ? p->request_timeout_s : 30) * 1000;
    if (!s->metrics || !s->model_name || !keys_ok ||
        srv_guard_new(deadline_ms, &s->guard) != KVC_OK) {
        server_free(s);
        return NULL;
    }
    s->max_body = p->max_body ? p->max_body : 8u << 20;
    s->lim.max_messages = p->max_messages > 0 ? p->max_messages : 4096;
    s->lim.sampling = p->sampling;
    s->lim.fixed_seed = p->fixed_seed;
    s->lim.model = kvc_engine_model(engine);
    s->lim.tool_format = kvc_tool_format_from_name(kvc_engine_tool_format(engine));
    if (!(s->lim.vocab = srv_vocab_new(s->lim.model))) {
        server_free(s);
        return NULL;
    }
    s->lim.strict_fields = p->strict_fields;
    s->lim.n_ctx = kvc_engine_n_ctx(engine);
    s->lim.think_tags = template_thinks(engine, &s->lim.think_harmony);
    s->lim.log_ignored = log_ignored;
    s->lim.log_user = s;
    s->log = p->log;
    s->log_user = p->log_user;
    s->log_format = p->log_format;
    s->log_requests = p->log_requests;
    s->version = strdup(p->version ? p->version : "?");
    s->model_path = p->model_path ? strdup(p->model_path) : NULL;
    kvc_sampler_params defaults = p->sampling;
    if (!p->fixed_seed)
        defaults.seed = KVC_SEED_RANDOM;     /* what a request without a seed gets */
    if (!s->version || (p->model_path && !s->model_path) ||
        srv_model_desc_init(&s->desc, engine, s->model_name, s->model_path, s->version,
                            time(NULL), &defaults) != KVC_OK) {
        server_free(s);
        return NULL;
    }
    if (p->cors_origins && *p->cors_origins && !(s->cors = strdup(p->cors_origins))) {
        server_free(s);
        return NULL;
    }
    s->started = time(NULL);
    s->id_salt = (uint64_t)s->started * 0x2545F4914F6CDD1Dull ^ (uint64_t)getpid() ^
                 (uint64_t)(uintptr_t)s;
    atomic_init(&s->stopping, false);
    atomic_init(&s->next_id, 1);
    return s;
}

int kvc_server_start(kvc_engine *engine, const kvc_server_params *params, kvc_server **out,
                     char *err, size_t err_size)
{
    kvc_server_params p = params ? *params : kvc_server_default_params();
    *out = NULL;
    if (!engine || p.port < 0 || p.port > 65535) {
        snprintf(err, err_size, "kvc_server_start: %s", !engine ? "no engine" : "bad port");
        return KVC_ERR_INVALID_ARG;
    }
    kvc_server *s = server_new(engine, &p);
    if (!s) {
        snprintf(err, err_size, "kvc_server_start: out of memory");
        return KVC_ERR_NOMEM;
    }
    int fd = listen_on(p.host ? p.host : "127.0.0.1", p.port, err, err_size);
    if (fd < 0) {
        server_free(s);
        return KVC_ERR_IO;
    }
    s->port = bound_port(fd);
    int max_conn = p.max_connections > 0 ? p.max_connections
                                         : kvc_server_default_max_connections();
    int per_ip = p.max_connections_per_ip != 0 ? p.max_connections_per_ip
               : bound_loopback(fd) ? -1 : 64;
    s->daemon = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD, 0, NULL, NULL,
        on_request, s, MHD_OPTION_LISTEN_SOCKET, fd,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_conn,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)(per_ip > 0 ? per_ip : 0),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(p.timeout_s > 0 ? p.timeout_s : 60),
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
    if (!s->daemon) {
        snprintf(err, err_size, "cannot start the HTTP daemon on port %d", s->port);
        close(fd);
        server_free(s);
        return KVC_ERR_IO;
    }
    *out = s;
    return KVC_OK;
}

int kvc_server_port(const kvc_server *s)
{
    return s ? s->port : 0;
}

void kvc_server_stop(kvc_server *s)
{
    if (!s)
        return;
    atomic_store(&s->stopping, true);   /* waits end within SRV_TICK_MS */
    MHD_stop_daemon(s->daemon);         /* closes the sockets, joins the threads */
    server_free(s);                     /* the guard's watchdog last: no socket is left */
}

#endif
