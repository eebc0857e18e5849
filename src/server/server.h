/* server.h - the HTTP server over a kvc_engine (DESIGN.md §4, §6): one
 * internal request model, several API dialects (OpenAI chat completions,
 * completions and Responses, Anthropic Messages, Ollama's chat and generate)
 * as ops tables.
 *
 * The parts, one file each:
 *   server.c          the HTTP layer (libmicrohttpd, one thread per connection):
 *                     routing (which picks the dialect), API key, body limits,
 *                     answers, life cycle (server_http.h: what it shares);
 *   server_run.c      one generation request: parse, submit its choices,
 *                     wait on the engine, answer whole or start the stream;
 *   server_chat.c     the chat completions and completions dialects;
 *   server_responses.c the Responses dialect (POST /v1/responses);
 *   server_messages.c the Anthropic Messages dialect (POST /v1/messages);
 *   server_ollama.c   Ollama's dialects (POST /api/chat, /api/generate) and
 *                     its routes that describe the model (/api/tags, ...);
 *   server_model.c    the served model's description: /props, /v1/models;
 *   server_log.c      the log lines: one per finished request, text or JSON;
 *   server_fields.c   the field policy: used, ignored (hints), refused;
 *   server_json.c     request bodies -> kvc_request_params (validated, with
 *                     errors naming the field), and the JSON helpers the
 *                     dialects share;
 *   server_chat.c     the OpenAI chat completions and completions dialects:
 *                     their response, chunk and error JSON;
 *   server_agent.c    the agent API's fields (tools, response_format, logprobs,
 *                     n, ...) and their parts of a response;
 *   server_stream.c   a streamed response: its reader, taking its choices'
 *                     events in turns, and one choice's engine events -> SSE
 *                     chunks, text held back for tool calls, logprobs sent
 *                     with their text;
 *   server_bulk.c     the thread that parses and tokenizes large bodies;
 *   server_metrics.c  the server's own counters (TTFT histogram, decode speed)
 *                     and the Prometheus text of /metrics;
 *   server_guard.c    the deadline for receiving a request (a watchdog that
 *                     drops connections whose request has not arrived in time),
 *                     and whether a client hung up.
 *   server_webui.c    the chat page at GET / (server_webui.h): its files,
 *                     embedded at build time, with their security headers.
 *
 * Threads: every HTTP connection has its own thread; a request blocks that
 * thread only (kvc_request_next with a short tick, checking for a client that
 * went away and for shutdown). The engine thread is the engine's. */
#ifndef KVC_SERVER_H
#define KVC_SERVER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "common.h"
#include "kvchat.h"

/* ================================================================ server */

typedef struct kvc_server kvc_server;

typedef struct kvc_server_params {
    const char *host;            /* IPv4/IPv6 literal or name to bind; NULL = "127.0.0.1" */
    int         port;            /* 0 = an ephemeral port (see kvc_server_port) */
    const char *api_key;         /* NULL or "" = no authentication; else every path
                                  * but /health needs "Authorization: Bearer KEY" */
    const char *const *api_keys; /* more keys, n_api_keys of them (borrowed); any of them
                                  * (or api_key) is accepted */
    int         n_api_keys;
    bool        share_cache_across_keys; /* false: each key is its own cache namespace
                                  * (no cached block or session is shared between
                                  * keys); true: one namespace for all */
    const char *model_name;      /* listed by /v1/models, echoed when a request has
                                  * no "model"; NULL = "kvchat" */
    size_t      max_body;        /* request body limit in bytes; 0 = 8 MiB */
    int         max_messages;    /* messages per chat request; 0 = 4096 */
    int         max_connections; /* open connections (a thread each); 0 = sized to the
                                  * file-descriptor limit: RLIMIT_NOFILE - 64, within
                                  * [64, 8192]; more are refused (closed at once) */
    int         max_connections_per_ip; /* open connections from one address; 0 = none when
                                  * host is a loopback address (local clients and a
                                  * reverse proxy all share one), else 64; < 0 = none */
    int         timeout_s;       /* idle connection time-out; 0 = 60 */
    int         request_timeout_s; /* a request's headers and body must have arrived
                                  * within this many seconds of the connection opening
                                  * (or of the previous answer on it); bytes do not
                                  * extend it; the connection is closed; 0 = 30 */
    kvc_sampler_params sampling; /* defaults for fields a request leaves out */
    bool        fixed_seed;      /* a request without "seed" uses sampling.seed;
                                  * false: a random seed per request */
    bool        strict_fields;   /* a request field that is not used is a 400 (default:
                                  * hints are accepted and named in the answer's
                                  * X-Kvchat-Ignored-Fields header; fields that would
                                  * change the answer are 400s either way) */
    void      (*log)(const char *line, void *user);  /* the server's log lines, whole (no
                                  * newline): a line per request (see log_requests) and
                                  * notices (an ignored field, once per name); NULL =
                                  * none. Called from connection threads */
    void       *log_user;
    int         log_format;      /* enum kvc_server_log_format of every line given to log */
    int         log_requests;    /* enum kvc_server_log_requests: which requests get a line */
    const char *version;         /* kvchat's version (/props, /api/version); NULL = "?" */
    const char *model_path;      /* the GGUF served (/props, /api/show); NULL = unknown */
    const char *cors_origins;    /* origins allowed to call from a browser: "*" or a comma
                                  * list ("https://a.example,https://b.example"); NULL = none.
                                  * OPTIONS preflights are answered 204 either way */
    bool        no_webui;        /* no chat page: GET / and /webui/... answer 404
                                  * (default: the page of server_webui.h, open
                                  * without an API key) */
} kvc_server_params;

enum kvc_server_log_format {
    KVC_SERVER_LOG_TEXT = 0,     /* "2026-01-02T03:04:05.678Z 127.0.0.1 POST /v1/... 200 ..." */
    KVC_SERVER_LOG_JSON = 1,     /* one JSON object a line */
};

enum kvc_server_log_requests {
    KVC_SERVER_LOG_ALL    = 0,   /* every request but a successful /health or /metrics */
    KVC_SERVER_LOG_ERRORS = 1,   /* requests answered >= 500, or whose stream failed */
    KVC_SERVER_LOG_NONE   = 2,
};

kvc_server_params kvc_server_default_params(void);

/* Bind and start serving `engine` (borrowed: it must outlive the server).
 * Returns KVC_OK with *out set; KVC_ERR_IO when the address cannot be bound
 * (err says which), KVC_ERR_UNSUPPORTED when built without libmicrohttpd,
 * KVC_ERR_NOMEM. Strings in params are copied. */
int  kvc_server_start(kvc_engine *engine, const kvc_server_params *params, kvc_server **out,
                      char *err, size_t err_size);
/* The port actually bound (the ephemeral one when params.port was 0). */
int  kvc_server_port(const kvc_server *s);
/* Stop accepting, end every open connection (streams stop; their requests
 * are cancelled), join the threads and free. Does not free the engine. NULL ok. */
void kvc_server_stop(kvc_server *s);

/* The max_connections a 0 asks for, from the current RLIMIT_NOFILE. */
int kvc_server_default_max_connections(void);

/* =================================================== guard (server_guard.c) */

typedef struct srv_guard srv_guard;
typedef struct srv_conn srv_conn;     /* one open connection */

/* Start the watchdog: a registered connection whose deadline passes has its
 * socket shut down (libmicrohttpd then closes it). deadline_ms: for one
 * request to arrive. KVC_OK or KVC_ERR_NOMEM. */
int  srv_guard_new(int64_t deadline_ms, srv_guard **out);
/* Stop and join the watchdog, free what is left. NULL ok. */
void srv_guard_free(srv_guard *g);
/* Register a connection on socket fd, its first request's deadline running
 * from now. NULL when out of memory (the connection then has no deadline).
 * fd must stay open until srv_guard_close. */
srv_conn *srv_guard_open(srv_guard *g, int fd);
/* Unregister and free c (NULL ok), before its socket is closed. */
void srv_guard_close(srv_guard *g, srv_conn *c);
/* A request may start: its deadline runs from now (after an answer). NULL ok. */
void srv_guard_arm(srv_guard *g, srv_conn *c);
/* The request has arrived whole: no deadline while it is answered. NULL ok. */
void srv_guard_disarm(srv_conn *c);
/* Connections open, and dropped for their deadline since the start. */
void srv_guard_counts(srv_guard *g, int64_t *open, uint64_t *dropped);

#define SRV_TICK_MS 200   /* engine wait slice between hang-up checks */

/* Whether the client on socket fd closed its side (or the socket failed;
 * false for fd < 0). A client that half-closes after its request is taken as
 * gone; HTTP clients do not. A poll that does not wait. */
bool srv_peer_gone(int fd);

/* ==================================================== bulk (server_bulk.c) */

/* One thread of the lowest CPU priority (nice 19) that runs the heavy work
 * of large bodies (parse, render, tokenize) one job at a time, so that it
 * never takes a core the engine wants. */
typedef struct srv_bulk srv_bulk;

/* Start the thread. NULL when it cannot be started (srv_bulk_run then runs
 * jobs on the caller's thread). */
srv_bulk *srv_bulk_new(void);
/* Run fn(arg) on the bulk thread, after the jobs queued before it, and wait
 * until it is done. */
void srv_bulk_run(srv_bulk *b, void (*fn)(void *), void *arg);
/* Run what is queued, stop and join the thread, free. NULL ok. */
void srv_bulk_free(srv_bulk *b);

/* ============================================== requests (server_json.c) */

typedef struct srv_dialect srv_dialect;   /* an API's request and response shapes */

/* An OpenAI-style error: the HTTP status and the fields of {"error": {...}}. */
typedef struct srv_error {
    int  http_status;        /* 400, 401, ... */
    char type[32];           /* "invalid_request_error", "server_error", ... */
    char param[64];          /* the offending field ("temperature"), "" = null */
    char code[40];           /* "context_length_exceeded", ... "" = null */
    char message[600];
} srv_error;

/* Fill e (and return e->http_status). param and code may be NULL. */
int srv_error_set(srv_error *e, int http_status, const char *type, const char *param,
                  const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The error for an engine status (submit failure or ERROR event): 400
 * invalid_request_error for KVC_ERR_INVALID_ARG, 400 context_length_exceeded
 * for KVC_ERR_CONTEXT_LENGTH and for KVC_ERR_KV_FULL (the engine fails a
 * request so only when it is larger than the whole pool: a retry cannot
 * help), 503 server_busy for KVC_ERR_BUSY, 500 server_error otherwise. The
 * message is the engine's (or kvc_strerror's when empty). */
int srv_error_from_status(srv_error *e, int status, const char *message);

#define SRV_MAX_STOP 16

/* A parsed, validated request. `params` points into the storage below (and
 * into the parsed JSON tree), so it lives as long as the srv_request. */
typedef struct srv_request {
    const srv_dialect *dialect;         /* the API it came through */
    kvc_request_params params;          /* what is submitted to the engine */
    const char        *model;           /* "model" of the request, NULL when absent */
    const char        *cache_salt;      /* "cache_salt": a namespace of its own, NULL = none */
    bool               stream;
    bool               include_usage;   /* stream_options.include_usage */
    kvc_chat_message  *msgs;            /* [n_messages] */
    char             **owned;           /* strings made here (joined content parts) */
    size_t             n_owned;
    const char        *stop[SRV_MAX_STOP];
    void              *json;            /* the cJSON tree the strings point into */
    /* the agent API (server_agent.c) */
    int                n;               /* choices: n per prompt (>= 1) */
    int                n_prompts;       /* completions: prompts given (>= 1; chat: 1) */
    const char       **prompts;         /* [n_prompts] text, or NULL where ... */
    int32_t          **prompt_toks;     /* ... token ids were given ([n_prompts], owned) */
    int64_t           *n_prompt_toks;
    char              *grammar;         /* response_format / forced tool call (owned) */
    struct kvc_logit_bias *bias;        /* logit_bias (owned) */
    int                logprobs;        /* -1 = none, else the top_logprobs count */
    char               ignored[256];    /* fields accepted and not used: "a, b" (the
                                         * X-Kvchat-Ignored-Fields header); "" = none */
    bool               forced_calls;    /* tool_choice forces calls: the reply is only calls,
                                         * text besides them is a call cut short */
    bool               think;           /* split the reply's <think> block into reasoning
                                         * (a thinking template, reasoning_format not none) */
    int                think_open;      /* ... as enum kvc_think_mode (reasoning.h):
                                         * harmony, or <think> tags with the reply
                                         * beginning inside the block (the prompt
                                         * ended with <think>: server.c finds out) */
    bool               load_only;       /* nothing to generate (Ollama's generate with an
                                         * empty prompt): answered at once */
} srv_request;

typedef struct srv_limits {
    int                max_messages;    /* > 0 */
    kvc_sampler_params sampling;        /* defaults */
    bool               fixed_seed;      /* see kvc_server_params */
    const kvc_model   *model;           /* token ids are checked against it; NULL = not */
    int                tool_format;     /* enum kvc_tool_format of the template */
    struct srv_vocab  *vocab;           /* the trie grammars are checked against
                                         * (srv_vocab_get); NULL = not checked */
    bool               strict_fields;   /* a field not used is a 400 (server_fields.c) */
    bool               think_tags;      /* the template writes reasoning in <think> tags */
    bool               think_harmony;   /* ... or in harmony's analysis channel (gpt-oss) */
    int32_t            n_ctx;           /* the context per conversation; 0 = unknown */
    void             (*log_ignored)(const char *field, void *user); /* a request carried a
                                         * field accepted and not used; NULL = not told */
    void              *log_user;
} srv_limits;

/* The token trie of the server's model for admission checks of grammars
 * (kvc_grammar_check_cost), built on first use by a worker thread, never by
 * the engine's. srv_vocab_new: NULL on OOM; srv_vocab_free accepts NULL. */
typedef struct srv_vocab srv_vocab;
srv_vocab *srv_vocab_new(const kvc_model *model);
void       srv_vocab_free(srv_vocab *sv);
/* The trie (shared, immutable), or NULL with err saying why. Thread-safe. */
const struct kvc_gvocab *srv_vocab_get(srv_vocab *sv, kvc_err *err);

/* Parse and validate a request body of `len` bytes (not NUL-terminated; any
 * bytes). On success returns 0 and fills *out (free with srv_request_free).
 * On failure returns the HTTP status (400 for everything the client got
 * wrong) with *e filled - the message names the field and what it must be
 * ("temperature must be a number between 0 and 2") and e->param the field -
 * and *out needs no freeing (freeing it is harmless). */
int  srv_request_parse(const srv_dialect *d, const char *body, size_t len, const srv_limits *lim,
                       srv_request *out, srv_error *e);
void srv_request_free(srv_request *r);

/* Parse a JSON body of `len` bytes (any bytes) into a cJSON tree (a cJSON *,
 * the caller's to cJSON_Delete), or NULL with *e a 400: not JSON, trailing
 * data, or a string (value or member name) with invalid UTF-8 or a \u0000,
 * the message naming where ("messages[0].content"). Every dialect's parser
 * starts here, so what reaches the engine is a valid C string. */
void *srv_json_parse(const char *body, size_t len, srv_error *e);

/* Identity of one response: id (the dialect's prefix + 16 hex digits),
 * creation time and the model name to echo. */
typedef struct srv_reply_id {
    char        id[48];
    time_t      created;
    const char *model;
} srv_reply_id;

/* What every chunk of one streamed choice repeats. */
typedef struct srv_chunk_head {
    const srv_dialect  *dialect;
    const srv_reply_id *id;             /* borrowed */
    int                 index;          /* the choice's */
    bool                include_usage;  /* "usage": null in every chunk */
} srv_chunk_head;

/* A growing text (SSE events): [len] bytes of [cap], NUL-terminated; oom
 * once an append failed (later appends do nothing). */
typedef struct srv_buf {
    char  *p;
    size_t len, cap;
    bool   oom;
} srv_buf;

/* Append s (malloc'd, taken; NULL = out of memory) to b. false when memory
 * ran out now or before. */
bool srv_buf_put(srv_buf *b, char *s);

/* ============================================ dialects (server_chat.c, ...) */

/* The channels of a reply's text. */
enum srv_channel {
    SRV_CONTENT   = 0,
    SRV_REASONING = 1,   /* the model's thinking (<think>...</think>) */
};

/* One finished choice as the dialects format it: its DONE event, the text
 * split into reasoning, content and tool calls. */
typedef struct srv_reply {
    const kvc_event *done;        /* stats, logprobs, the whole reply text */
    const char      *reasoning;   /* [n_reasoning] bytes; NULL = none */
    size_t           n_reasoning;
    const char      *content;     /* [n_content] bytes: the text besides the rest */
    size_t           n_content;
    const char      *tool_calls;  /* the OpenAI tool_calls JSON array text; NULL = none */
    const char      *stop_sequence; /* the stop string that ended it (one of the
                                     request's, borrowed); NULL = none or not known */
} srv_reply;

/* One choice of a stream as a dialect writes it: the head, and the state of
 * dialects that open and close blocks (Responses' output items, Messages'
 * content blocks). Zeroed (but open -1) by srv_stream_choice_init. */
typedef struct srv_emit {
    srv_chunk_head head;
    int            seq;           /* events written (Responses' sequence_number) */
    int            blocks;        /* blocks begun */
    int            open;          /* enum srv_channel of the open block, -1 = none */
    srv_buf        acc;           /* the open block's text so far */
    kvc_chat_stats prompt;        /* the prompt's figures, from the stream's first event
                                     (kvc_event.stats), for sse_begin */
} srv_emit;

/* An API's shapes, chosen by the route (server.c) and used everywhere a
 * request is parsed or an answer written: a new API is a new table, not a
 * branch in each place. Every function returning char * returns malloc'd
 * text (NULL when memory ran out); the sse_* ones append to *out and return
 * false when memory ran out. */
struct srv_dialect {
    const char *name;             /* "chat.completions", "completions", "responses", "messages" */
    const char *id_prefix;        /* of response ids: "chatcmpl-", "cmpl-", "resp_", "msg_" */
    const struct srv_field *fields; /* its request's fields (server_fields.c) */
    const char *stream_type;      /* a stream's Content-Type; NULL = "text/event-stream" */
    /* The dialect's fields of root (a JSON object; it may be replaced: the
     * request keeps r->json) into r, whose common defaults are set. 0 or the
     * HTTP status with *e filled. */
    int   (*parse)(srv_request *r, void *root_json, const srv_limits *lim, srv_error *e);
    /* The whole answer of replies rp[0, n) (per_prompt choices per prompt). */
    char *(*response)(const srv_reply_id *id, const srv_request *rq, const srv_reply *rp, int n,
                      int per_prompt, const kvc_model *model, bool logprobs);
    char *(*error)(const srv_error *e);               /* an error body */
    /* The logprobs object of lp[0, n) (server_agent.c's shapes). */
    void *(*logprobs)(const kvc_token_logprob *lp, int32_t n, const kvc_model *model,
                      size_t *text_offset);
    /* A stream: its first events (before any choice's text), ... */
    bool  (*sse_begin)(srv_emit *h, srv_buf *out);
    /* ... a piece of a choice's text in a channel, with its logprobs (a
     * logprobs object, taken; NULL = none) ... */
    bool  (*sse_text)(srv_emit *h, int channel, const char *text, size_t len, void *logprobs,
                      srv_buf *out);
    /* ... the choice's end: its tool calls (rp->tool_calls, when parsed) and
     * its finish, with the logprobs no text carried (taken) ... */
    bool  (*sse_finish)(srv_emit *h, const srv_reply *rp, void *logprobs, srv_buf *out);
    /* ... and after every choice's end: the usage of stats[0, n) (chat:
     * include_usage) and the terminator. */
    bool  (*sse_end)(const srv_reply_id *id, bool include_usage, const kvc_chat_stats *stats,
                     int n, int per_prompt, srv_buf *out);
    char *(*sse_error)(const srv_error *e);           /* a failure after the stream began */
    /* ... or, where the dialect has one, that failure told in choice h's
     * terms (Responses: response.failed with the response's id); NULL =
     * sse_error */
    bool  (*sse_fail)(srv_emit *h, const srv_error *e, srv_buf *out);
};

/* ================================================= fields (server_fields.c) */

enum srv_field_use {
    SRV_FIELD_USED    = 0,   /* honoured */
    SRV_FIELD_IGNORED = 1,   /* a hint or bookkeeping: accepted, logged, named in a header */
    SRV_FIELD_REFUSED = 2,   /* would change the answer and cannot be done: a 400 */
};

/* One row of a dialect's field policy. */
typedef struct srv_field {
    const char *name;
    int         use;         /* enum srv_field_use */
    const char *noop;        /* REFUSED: the JSON of the value that changes nothing
                                (accepted), NULL = none */
} srv_field;

extern const srv_field srv_fields_chat[], srv_fields_completions[], srv_fields_responses[],
                       srv_fields_messages[];

/* Check every member of root (a JSON object) against the dialect's table
 * and the extensions every route knows: 0, with the fields accepted and not
 * used in r->ignored (and told to lim->log_ignored), or 400 naming a refused
 * field (any field not used, with lim->strict_fields). */
int srv_fields_check(srv_request *r, const void *root_json, const srv_field *table,
                     const srv_limits *lim, srv_error *e);
/* Add name to the fields accepted and not used, r->ignored. */
void srv_note_ignored(srv_request *r, const char *name);
/* The enum srv_field_use of name in table (or the extensions); -1 = none. */
int srv_field_use(const srv_field *table, const char *name);

extern const srv_dialect srv_dialect_chat;          /* POST /v1/chat/completions */
extern const srv_dialect srv_dialect_completions;   /* POST /v1/completions */
extern const srv_dialect srv_dialect_responses;     /* POST /v1/responses (server_responses.c) */
extern const srv_dialect srv_dialect_messages;      /* POST /v1/messages (server_messages.c) */

/* ======================================= the agent API (server_agent.c) */

#define SRV_MAX_CHOICES 16

/* The fields of the agent API (issue 13): response_format, tools,
 * tool_choice, parallel_tool_calls, logit_bias, logprobs, top_logprobs, n,
 * completions' prompt lists and token ids (completion: the completions API's
 * set, else chat's); and every field not known is a 400 naming it. 0 or the
 * HTTP status with *e filled. */
int srv_agent_parse(srv_request *r, const void *root_json, const srv_limits *lim, bool completion,
                    srv_error *e);
void srv_agent_free(srv_request *r);

/* The logprobs objects of the tokens lp[0, n) as cJSON: chat's
 * {"content": [...]}, and the completions' {tokens, token_logprobs,
 * top_logprobs, text_offset}, whose offsets start at *text_offset, advanced
 * past the tokens' text (a stream's chunks count on from the one before). */
void *srv_logprobs_chat_json(const kvc_token_logprob *lp, int32_t n, const kvc_model *model,
                             size_t *text_offset);
void *srv_logprobs_completion_json(const kvc_token_logprob *lp, int32_t n,
                                   const kvc_model *model, size_t *text_offset);

/* POST /tokenize {"content", "add_special"?, "with_pieces"?} -> {"tokens": [...]}
 * and POST /detokenize {"tokens": [...]} -> {"content"}, as llama-server.
 * Returns the JSON body (malloc'd) or NULL with *e set (400). */
char *srv_tokenize(const kvc_model *model, const char *body, size_t len, srv_error *e);
char *srv_detokenize(const kvc_model *model, const char *body, size_t len, srv_error *e);

/* ========================================= JSON helpers (server_json.c) */

/* The parsers of the chat and completions requests (their fields, the
 * agent API's), which the other dialects reuse. 0 or the HTTP status. */
int srv_parse_chat(srv_request *r, void *root_json, const srv_limits *lim, srv_error *e);
int srv_parse_completion(srv_request *r, void *root_json, const srv_limits *lim, srv_error *e);

/* A dialect that is a chat request in other words: `translate` writes the
 * chat request the body means into a new tree, which the request adopts
 * (r->json: what its fields borrow), and srv_parse_chat parses it. 0 or the
 * HTTP status. */
struct cJSON;
typedef int (*srv_translate_fn)(srv_request *r, struct cJSON *chat, const struct cJSON *root,
                                srv_error *e);
int srv_parse_translated(srv_request *r, void *root_json, srv_translate_fn translate,
                         const srv_limits *lim, srv_error *e);

/* The member `name` of object o, NULL when absent or JSON null. */
const struct cJSON *srv_json_get(const struct cJSON *o, const char *name);
/* Copy from_obj's member `from` (a deep copy; nothing when absent or null)
 * into to_obj as `to`. */
void srv_json_copy_as(struct cJSON *to_obj, const struct cJSON *from_obj, const char *from,
                      const char *to);
/* Append to the array tools the function tool t ({name, description?,
 * <params>?}, t's member `params` its JSON schema) in chat's shape:
 * {"type": "function", "function": {name, description, parameters}}. */
void srv_json_add_function(struct cJSON *tools, const struct cJSON *t, const char *params);

/* Print and free a cJSON tree (NULL ok): valid UTF-8 JSON text whatever its
 * strings held, malloc'd; NULL when o is NULL or memory ran out. */
char *srv_json_print(void *cjson);
/* An SSE event of the tree (printed and freed as srv_json_print): "data:
 * JSON\n\n", or with a name "event: NAME\ndata: JSON\n\n". */
char *srv_sse_data(void *cjson);
char *srv_sse_event(const char *name, void *cjson);
/* A cJSON string of s[0, n) (s need not be NUL-terminated there); NULL
 * when memory ran out. */
void *srv_json_string_n(const char *s, size_t n);
/* OpenAI's error object {"error": {"message", "type", "param", "code"}},
 * and its text. */
void *srv_error_object(const srv_error *e);
char *srv_error_json(const srv_error *e);
/* llama-server's "timings" object of st, added to the cJSON object o. */
void srv_add_timings(void *o, const kvc_chat_stats *st);
/* The usage totals of choices stats[0, n) (per_prompt choices per prompt,
 * whose prompt counts once). */
kvc_chat_stats srv_stats_sum(const kvc_chat_stats *stats, int n, int per_prompt);

/* {"prompt": prompt}, the answer of POST /apply-template. */
char *srv_prompt_json(const char *prompt);
/* {"object": "list", "data": [{"id": model, "object": "model", ...}]}; and
 * the one model object when `one`. */
char *srv_models_json(const char *model, time_t created, bool one);

/* The chat dialect's pieces (server_chat.c), for its tests and fuzzing:
 *   srv_sse_text       a chunk with a piece of text (len bytes);
 *   srv_sse_finish     the empty delta / text with finish_reason;
 * logprobs: a logprobs object (taken), NULL for "logprobs": null. */
char *srv_sse_text(const srv_chunk_head *h, const char *text, size_t len, void *logprobs);
char *srv_sse_finish(const srv_chunk_head *h, const char *finish_reason, void *logprobs);
/* A reply of the DONE event done, not split (content = its text). */
srv_reply srv_reply_whole(const kvc_event *done, bool tool_calls);
/* The same, with the stop string of stop[0, n_stop) that ended it found
 * from its tokens (done->logprobs, which name every generated token: the
 * text after the reply's begins with the stop string) when model is given. */
srv_reply srv_reply_make(const kvc_event *done, bool tool_calls, const char *const *stop,
                         int n_stop, const kvc_model *model);
/* A reply whose tool calls were forced (tool_choice required or named): the
 * grammar allows nothing but calls, so text besides the parsed calls is a
 * further call cut short by the token limit (e.g. "</tool_ca"): it is
 * dropped, not shown as content. */
void srv_reply_only_calls(srv_reply *rp);
/* Split rp's content into reasoning and content where its reasoning is
 * written in `mode` (enum kvc_think_mode, reasoning.h). */
void srv_reply_think(srv_reply *rp, int mode);
/* {"input_tokens": n}, the answer of /v1/messages/count_tokens. */
char *srv_count_tokens_json(int64_t n);

/* ======================================== metrics (server_metrics.c) */

#define SRV_TTFT_BUCKETS 14

/* The server's own counters; thread-safe (a mutex inside). */
typedef struct srv_metrics srv_metrics;

srv_metrics *srv_metrics_new(void);                 /* NULL: out of memory */
void srv_metrics_free(srv_metrics *m);              /* NULL ok */
/* A completion request arrived (counted in kvchat_requests_total). */
void srv_metrics_request(srv_metrics *m);
/* A completion request was answered with an error (HTTP status >= 400, or
 * an error event in a stream). */
void srv_metrics_failed(srv_metrics *m);
/* A request finished: its TTFT and decode speed enter the histogram. */
void srv_metrics_done(srv_metrics *m, const kvc_chat_stats *stats);
/* The Prometheus text exposition (version 0.0.4) of the server counters and
 * the engine's (e may be NULL: engine gauges are then left out). Malloc'd;
 * NULL when memory ran out. */
char *srv_metrics_text(srv_metrics *m, const kvc_engine_metrics *e);
/* Connection gauges for the next srv_metrics_text: open now, and dropped for
 * missing the request deadline. */
void srv_metrics_connections(srv_metrics *m, int64_t open, uint64_t dropped);

/* ==================================== the model told (server_model.c) */

/* What the routes that describe the model say (/props, /v1/models,
 * Ollama's /api/tags, /api/show, /api/ps), made once at start. */
typedef struct srv_model_desc {
    const char        *name;          /* served name (borrowed: the server's) */
    const char        *path;          /* the GGUF file; NULL = unknown (borrowed) */
    const char        *version;       /* kvchat's (borrowed) */
    const char        *chat_template; /* Jinja source or built-in name; NULL = chatml */
    kvc_model_info     info;
    char               weight_type[16]; /* the largest share of the weights: "Q8_0"; "" = ? */
    char               digest[65];    /* 64 hex digits naming the model file */
    uint64_t           file_bytes;
    time_t             modified;      /* the file's mtime */
    time_t             started;
    int32_t            n_ctx;         /* per conversation */
    int32_t            n_parallel;
    kvc_sampler_params sampling;      /* the defaults */
    char              *bos, *eos;     /* the tokens' text (owned; "" = none) */
} srv_model_desc;

/* Fill d (the strings are borrowed but bos/eos). KVC_OK or KVC_ERR_NOMEM. */
int  srv_model_desc_init(srv_model_desc *d, kvc_engine *engine, const char *name,
                         const char *path, const char *version, time_t started,
                         const kvc_sampler_params *sampling);
void srv_model_desc_free(srv_model_desc *d);
/* GET /props (llama-server's shape). Malloc'd JSON. */
char *srv_props_json(const srv_model_desc *d);
/* GET /v1/models (one: /v1/models/NAME): entries with the context length
 * and llama-server's meta. Malloc'd JSON. */
char *srv_models_desc_json(const srv_model_desc *d, bool one);
/* "494.03M", "7.62B": a parameter count as Ollama writes it. */
void srv_param_size(uint64_t n, char *buf, size_t size);

/* ======================================= Ollama's API (server_ollama.c) */

extern const srv_dialect srv_dialect_ollama_chat;      /* POST /api/chat */
extern const srv_dialect srv_dialect_ollama_generate;  /* POST /api/generate */
extern const srv_field srv_fields_ollama_chat[], srv_fields_ollama_generate[];

/* GET /api/tags (running false) and /api/ps (true): the one model. */
char *srv_ollama_list_json(const srv_model_desc *d, bool running);
/* POST /api/show {"model"} of body[0, len): the model's details, template,
 * model_info, capabilities; NULL with *e set (400) for a bad body. */
char *srv_ollama_show_json(const srv_model_desc *d, const char *body, size_t len,
                           srv_error *e);
/* GET /api/version. */
char *srv_ollama_version_json(const srv_model_desc *d);
/* The answer to a request of Ollama's dialect d with nothing to generate
 * (an empty prompt or no messages: Ollama's way to load a model): done,
 * done_reason "load", an empty response or message. */
char *srv_ollama_load_json(const srv_dialect *d, const char *model);

/* ================================================= request log (server_log.c) */

/* What one request's log line says, filled as the request goes: who asked
 * what, the status, and for a generation its figures (the choices' stats
 * summed as the usage is). */
typedef struct srv_reqlog {
    struct timespec start;       /* CLOCK_MONOTONIC when the headers came */
    struct timespec wall;        /* CLOCK_REALTIME then */
    char            method[12];
    char            path[200];
    char            client[64];  /* the peer's address */
    char            api[24];     /* the dialect's name for a generation; "" = none */
    char            session[17]; /* 16 hex digits of a hash of the session key; "" = none */
    int             status;      /* HTTP status; 0 = not yet known */
    bool            has_stats;   /* a generation ran: stats hold its figures */
    kvc_chat_stats  stats;
    char            error[640];  /* an error's message; "" = none */
} srv_reqlog;

/* A new record (malloc'd; NULL when out of memory) started now. */
srv_reqlog *srv_reqlog_new(const char *method, const char *path, const char *client);
/* The session key's hash (key NULL or "": none). */
void srv_reqlog_session(srv_reqlog *l, const char *key);
/* The error's status and message. */
void srv_reqlog_error(srv_reqlog *l, const srv_error *e);
/* The line of l (no newline), as of now: enum kvc_server_log_format format.
 * Malloc'd; NULL when out of memory. */
char *srv_reqlog_line(const srv_reqlog *l, int format);
/* Whether l gets a line under enum kvc_server_log_requests policy. */
bool srv_reqlog_wanted(const srv_reqlog *l, int policy);
/* A notice (not a request) as a line of the format, at level "info",
 * "warning" or "error". Malloc'd; NULL when out of memory. */
char *srv_log_notice(const char *level, const char *message, int format);

/* =========================================== streams (server_stream.c) */

/* One choice of a streamed response: its engine events turned into SSE
 * chunks. With tools, text that is or may begin a tool call is held back
 * (content only if no call follows). With logprobs, each text chunk carries
 * those of the tokens its text shows (the engine's TEXT events end where a
 * token ends and carry them), and the finish chunk those no text showed (a
 * stop string's, a tool call's): every token's once, in order, as the whole
 * response lists them. */
typedef struct srv_stream_choice {   /* the fields are private to server_stream.c */
    srv_emit           em;             /* the dialect's writer of this choice */
    const kvc_model   *model;          /* logprobs asked for (the tokens' text); NULL = not */
    bool               tools;          /* parse tool calls ... */
    int                tool_format;    /* ... in this enum kvc_tool_format */
    char              *text;           /* the reply so far: [0, len) of cap ... */
    size_t             len, cap, sent; /* ... of which [0, sent) went out as content */
    kvc_token_logprob *lp;             /* logprobs that came with the text ... */
    size_t            *lp_at;          /* ... and len when each one's piece had come */
    size_t             n_lp, cap_lp, cap_at, lp_sent;   /* [0, lp_sent) went out */
    size_t             text_offset;    /* completions: the text_offset of token lp_sent */
    kvc_chat_stats     stats;          /* DONE's */
    bool               done;           /* DONE came */
    const char *const *stop;           /* the request's stop strings [n_stop] (borrowed) ... */
    int                n_stop;
    const kvc_model   *vocab;          /* ... and the model: which one ended the reply */
    bool               forced_calls;   /* srv_request's */
    bool               think;          /* split reasoning (srv_request's) ... */
    int                think_open;     /* ... written so (srv_request's) ... */
    size_t             r_sent;         /* ... text[0, r_sent) looked at for it */
    bool               content_begun;  /* content went out: its start is fixed */
    size_t             c_end;          /* with think: where the content may go up to
                                        * (harmony: its final message's end) */
} srv_stream_choice;

/* Set c up (zeroed first) for the choice head names. */
void srv_stream_choice_init(srv_stream_choice *c, srv_chunk_head head, const kvc_model *model,
                            bool tools, int tool_format);
/* The chunks of event ev (TEXT or DONE) of c, appended to out. false when
 * memory ran out. */
bool srv_stream_choice_event(srv_stream_choice *c, const kvc_event *ev, srv_buf *out);
void srv_stream_choice_free(srv_stream_choice *c);   /* what c holds; NULL ok */

/* A streamed response: the requests of its choices (n per prompt, at most
 * SRV_MAX_CHOICES), a srv_stream_choice each, and the SSE text not yet read.
 * Its reader waits on the engine (in the connection's own thread) and takes
 * the choices' events in turns, so that their chunks interleave as they come.
 * Freeing it releases - and so cancels - every choice's request. */
typedef struct srv_stream srv_stream;

/* A stream for the choices of rq, their requests not yet submitted (see
 * srv_stream_requests). id is copied (its model too); lim gives the model
 * (logprobs' text) and tool format; metrics count each choice's end and an
 * error. A wait for an event ends when *stopping is set or the client on
 * socket fd hung up. lim, metrics and stopping are borrowed: they outlive the
 * stream. NULL when out of memory. */
srv_stream *srv_stream_new(const srv_request *rq, const srv_reply_id *id, const srv_limits *lim,
                           srv_metrics *metrics, const atomic_bool *stopping, int fd);
/* The stream's requests [*n], NULL each, to submit the choices into (the
 * stream frees those it holds). */
kvc_request **srv_stream_requests(srv_stream *st, int *n);
/* The next event of any choice still open into *ev; its index. With none
 * ready: -1 at once unless `wait`, else wait until one is, or -1 when the
 * client went away or the server is stopping (nothing in *ev). */
int  srv_stream_next(srv_stream *st, kvc_event *ev, bool wait);
/* The first chunks: chat's role chunk of every choice, then event `first`
 * (of choice i; not taken). false when out of memory. */
bool srv_stream_begin(srv_stream *st, int i, const kvc_event *first);

#define SRV_STREAM_END   (-1)   /* srv_stream_read: the stream is over */
#define SRV_STREAM_ERROR (-2)   /* ... it was cut: client gone, stopping, out of memory */

/* Copy up to max bytes of SSE text into out: what is pending, or when nothing
 * is, what the next event makes (waiting for it; then the events already
 * there are gathered too). Returns the bytes copied (> 0), SRV_STREAM_END or
 * SRV_STREAM_ERROR. */
ssize_t srv_stream_read(srv_stream *st, char *out, size_t max);
void srv_stream_free(srv_stream *st);   /* NULL ok */
/* The usage of the choices that finished so far (srv_stats_sum) into *sum
 * (false when none did), and the error a choice failed with into *e
 * (http_status 0 = none). */
bool srv_stream_result(const srv_stream *st, kvc_chat_stats *sum, srv_error *e);

#endif
