/* server_http.h - what the HTTP layer's files share (server.c: routing,
 * answers, life cycle; server_run.c: running a generation request): the
 * server's and a request's state, and the functions that answer. Private to
 * src/server; only with libmicrohttpd. */
#ifndef KVC_SERVER_HTTP_H
#define KVC_SERVER_HTTP_H

#include <microhttpd.h>
#include <pthread.h>

#include "server.h"

struct kvc_server {
    struct MHD_Daemon *daemon;
    kvc_engine        *engine;       /* borrowed */
    srv_metrics       *metrics;
    srv_guard         *guard;        /* the request deadline */
    srv_limits         lim;
    char             **api_keys;     /* [n_api_keys]; none = no authentication */
    int                n_api_keys;
    char             **key_ns;       /* [n_api_keys]: each key's cache namespace */
    bool               share_keys;   /* one cache namespace for every key */
    char              *model_name;
    char              *cors;         /* allowed origins ("*" or a comma list); NULL = none */
    bool               webui;        /* GET / serves the chat page (server_webui.c) */
    size_t             max_body;
    int                port;
    time_t             started;
    atomic_bool        stopping;
    atomic_uint_least64_t next_id;   /* response ids: a counter, mixed with id_salt */
    uint64_t           id_salt;
    srv_bulk          *bulk;         /* where large bodies are parsed and tokenized */
    void             (*log)(const char *line, void *user);   /* params.log */
    void              *log_user;
    int                log_format;   /* params' */
    int                log_requests;
    char              *version;      /* params.version ("?" when none) */
    char              *model_path;   /* params.model_path; NULL = unknown */
    srv_model_desc     desc;         /* what /props, /v1/models and /api/... tell */
    pthread_mutex_t    logged_mu;    /* guards logged */
    char             **logged;       /* ignored field names already logged [n_logged] */
    size_t             n_logged, cap_logged;
};

#define MAX_NAMESPACE 640         /* "key:<16 hex>|salt:<cache_salt, at most 512 bytes>" */
#define LARGE_BODY    (1u << 20)  /* bytes: a body this large is parsed and tokenized on the
                                     bulk thread (server_bulk.c) */

enum route {
    ROUTE_NONE = 0, ROUTE_GENERATE, ROUTE_MODELS, ROUTE_MODEL, ROUTE_HEALTH,
    ROUTE_METRICS, ROUTE_APPLY_TEMPLATE, ROUTE_TOKENIZE, ROUTE_DETOKENIZE, ROUTE_COUNT_TOKENS,
    ROUTE_PROPS, ROUTE_OLLAMA_TAGS, ROUTE_OLLAMA_PS, ROUTE_OLLAMA_VERSION, ROUTE_OLLAMA_SHOW,
    ROUTE_OLLAMA_EMBED,      /* 501: no embeddings (any method) */
    ROUTE_OLLAMA_MANAGE,     /* 501: pull, push, create, copy, delete (any method) */
    ROUTE_WEBUI,      /* a file of the chat page (server_webui.h) */
};

/* One HTTP request (MHD's con_cls): its route and the body read so far. */
typedef struct conn {
    int    route;        /* enum route */
    const srv_dialect *dialect;   /* the API of the route (errors are in its shape);
                                     chat's for routes of no API */
    bool   post;         /* the route takes POST (else GET) */
    srv_error err;       /* decided from the headers; http_status 0 = none */
    char  *body;         /* [len] bytes of [cap] */
    size_t len, cap;
    size_t discarded;    /* bytes dropped past max_body (413 follows) */
    bool   unread_body;  /* answering from the headers while a body may follow */
    bool   preflight;    /* an OPTIONS request: answered 204 with the CORS headers */
    int    key;          /* the API key it authenticated with, -1 = none */
    srv_reqlog *log;     /* its log line's record (a stream takes it); NULL = none */
} conn;

/* ================================================ answers (server.c) */

/* Queue `body` (malloc'd, taken; NULL = out of memory: a static 500) with
 * status and content type, plus extra headers: name, value, ..., NULL; and
 * the CORS headers. */
enum MHD_Result srv_respond(const kvc_server *s, struct MHD_Connection *mc, int status,
                            char *body, const char *ctype, const char *const *headers);
/* An error in the shape of c's dialect (and its metrics). */
enum MHD_Result srv_respond_error(kvc_server *s, struct MHD_Connection *mc, const conn *c,
                                  const srv_error *e);
/* 200 with a JSON body (taken). */
enum MHD_Result srv_respond_json(const kvc_server *s, struct MHD_Connection *mc, char *json);
/* The CORS headers for the request's Origin when --cors-origins allows it. */
void srv_add_cors(const kvc_server *s, struct MHD_Connection *mc, struct MHD_Response *r);
/* The client's socket, -1 when unknown. */
int srv_conn_fd(struct MHD_Connection *mc);
/* Give l's line to the log when the policy wants it, and free l (NULL ok). */
void srv_log_request(const kvc_server *s, srv_reqlog *l);
/* 200 with the chat page's file f (or 304 when the request's If-None-Match
 * names its ETag), with its security headers (server_webui.c). */
struct srv_webui_file;
enum MHD_Result srv_webui_respond(struct MHD_Connection *mc, const struct srv_webui_file *f);

/* ==================================== generation requests (server_run.c) */

/* The last call for a POST of a generation route or /apply-template,
 * /count_tokens, /tokenize, /detokenize (the whole body is in c): 413 when
 * it went past the limit, 400 when it does not validate, else run it. */
enum MHD_Result srv_handle_completion(kvc_server *s, struct MHD_Connection *mc, conn *c);

#endif
