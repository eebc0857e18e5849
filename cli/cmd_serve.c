/* cmd_serve.c - `kvchat serve`: the OpenAI-compatible HTTP server (src/server.c)
 * over one engine. Runs until SIGINT or SIGTERM, then stops cleanly: open
 * streams end, their requests are cancelled, the engine thread is joined. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvc_version.h"
#include "server.h"

int cmd_serve(int argc, char **argv);

/* The server's lines (a line per request, notices), on stderr, each
 * written whole: lines of concurrent requests do not interleave. */
static void log_line(const char *line, void *user)
{
    (void)user;
    flockfile(stderr);
    fputs(line, stderr);
    fputc('\n', stderr);
    funlockfile(stderr);
}

/* A line of the server's life (listening, shutting down): as it is, or
 * with --log-format json as a JSON notice (which still holds the text). */
static void say(const kvc_server_params *sp, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void say(const kvc_server_params *sp, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    char *json = sp->log_format == KVC_SERVER_LOG_JSON ? srv_log_notice("info", msg, sp->log_format)
                                                      : NULL;
    log_line(json ? json : msg, NULL);
    free(json);
}

static const char serve_help[] =
    "usage: kvchat serve [options]\n\n"
    "Serve a chat page at GET / (open http://HOST:PORT/ in a browser) and\n"
    "the OpenAI API: POST /v1/chat/completions, POST /v1/completions,\n"
    "POST /v1/responses (stateless), Anthropic's POST /v1/messages and\n"
    "/v1/messages/count_tokens, and Ollama's POST /api/chat, /api/generate,\n"
    "/api/show, GET /api/tags, /api/ps, /api/version; GET /v1/models, GET /props,\n"
    "GET /health, GET /metrics (Prometheus), POST /tokenize, POST /detokenize,\n"
    "POST /apply-template (?api=responses, messages, ollama.chat: a request of\n"
    "that API). The sampling options set the defaults of requests that leave\n"
    "them out.\n\n"
    "Every finished request gets a line on stderr: time, client, method, path,\n"
    "status, duration and, for a generation, prompt / cached (of which from\n"
    "disk) / computed / generated tokens, time to first token, tokens/s, finish\n"
    "reason and the session key's hash (successful /health and /metrics probes\n"
    "are left out).\n";

enum { OPT_HOST = CLI_OPT_CMD, OPT_PORT, OPT_API_KEY, OPT_API_KEY_FILE, OPT_SHARE_KEYS,
       OPT_ALIAS, OPT_CORS, OPT_PARALLEL, OPT_KV_BUDGET, OPT_MAX_QUEUE, OPT_MAX_SESSIONS,
       OPT_OVERFLOW, OPT_NO_CACHE, OPT_SWA_FULL, OPT_SPECIAL, OPT_TIMEOUT, OPT_REQUEST_TIMEOUT,
       OPT_MAX_CONNECTIONS, OPT_MAX_CONNECTIONS_PER_IP, OPT_MAX_BODY, OPT_QUIET,
       OPT_STRICT_FIELDS, OPT_LOG_FORMAT, OPT_NO_WEBUI };

static const cli_option serve_opts[] = {
    { "host", 0, "ADDR", OPT_HOST, 0, "address to bind (default 127.0.0.1)" },
    { "port", 0, "N", OPT_PORT, 0, "port (default 8080; 0 = any free port)" },
    { "alias", 0, "NAME", OPT_ALIAS, 0,
      "the model name served (/v1/models, responses; default:\nthe GGUF's general.name)" },
    { "api-key", 0, "KEY", OPT_API_KEY, CLI_REPEAT,
      "require 'Authorization: Bearer KEY' (default: $KVCHAT_API_KEY,\n"
      "else none); /health stays open. Repeat it for several keys" },
    { "api-key-file", 0, "F", OPT_API_KEY_FILE, CLI_REPEAT,
      "more keys, one per line ('#' starts a comment)" },
    { "share-cache-across-keys", 0, NULL, OPT_SHARE_KEYS, 0,
      "one cache for every key (default: each key is its own\n"
      "cache namespace: no cached block or session is shared, so\n"
      "cached_tokens and timing tell nothing about other keys)" },
    { "cors-origins", 0, "LIST", OPT_CORS, 0,
      "browser origins allowed to call: '*' or a comma list\n"
      "(default none; OPTIONS preflights are answered 204)" },
    { "parallel", 0, "N", OPT_PARALLEL, 0, "conversations computed at once (default 8)" },
    { "kv-budget", 0, "MIB", OPT_KV_BUDGET, 0,
      "KV cache size in MiB (default: N parallel full contexts)" },
    { "swa-full", 0, NULL, OPT_SWA_FULL, 0,
      "sliding-window layers keep every cached block's K/V, not\n"
      "windows only (more memory; hits anywhere stay served)" },
    { "max-queue", 0, "N", OPT_MAX_QUEUE, 0,
      "requests waiting beyond the running ones (default 64);\nmore are answered 503" },
    { "max-sessions", 0, "N", OPT_MAX_SESSIONS, 0, "keyed conversations kept (default 256)" },
    { "context-overflow", 0, "error|shift", OPT_OVERFLOW, 0,
      "prompt + max_tokens over the context: a 400 error\n(default) or drop the oldest turns" },
    { "no-cache", 0, NULL, OPT_NO_CACHE, 0,
      "every request cold: reuse nothing, keep nothing (a\nreference server to compare against)" },
    { "allow-special-in-content", 0, NULL, OPT_SPECIAL, 0,
      "control-token text in messages becomes control tokens\n"
      "(default: message text is plain text; only the template's\n"
      "markup gives control tokens)" },
    { "strict-fields", 0, NULL, OPT_STRICT_FIELDS, 0,
      "a request field kvchat does not use is a 400 (default: hints\n"
      "such as metadata or return_progress are accepted, logged once\n"
      "and named in the X-Kvchat-Ignored-Fields header; fields that\n"
      "would change the answer are 400s either way)" },
    { "no-webui", 0, NULL, OPT_NO_WEBUI, 0,
      "no chat page (default: GET / serves one, built into the\n"
      "binary; it asks for the API key when the server wants one)" },
    { "timeout", 0, "S", OPT_TIMEOUT, 0, "close connections idle for S seconds (default 60)" },
    { "request-timeout", 0, "S", OPT_REQUEST_TIMEOUT, 0,
      "a request's headers and body must arrive within S seconds\n"
      "of the connection opening (or of the previous answer);\n"
      "bytes do not extend it (default 30)" },
    { "max-connections", 0, "N", OPT_MAX_CONNECTIONS, 0,
      "open connections (default: the file-descriptor limit - 64,\n"
      "at most 8192; the soft limit is raised to the hard one)" },
    { "max-connections-per-ip", 0, "N", OPT_MAX_CONNECTIONS_PER_IP, 0,
      "from one address (default: no limit on a loopback\n"
      "--host, as behind a reverse proxy; else 64; 0 = no limit)" },
    { "max-body", 0, "MIB", OPT_MAX_BODY, 0, "request body limit (default 8)" },
    { "quiet", 'q', NULL, 'q', 0,
      "no start summary, no loading progress and no request lines\n"
      "but failed ones (5xx, a stream cut by an error): only\n"
      "warnings, errors and the 'listening on' line" },
    { "log-format", 0, "text|json", OPT_LOG_FORMAT, 0,
      "request lines and notices as text (default) or one JSON\n"
      "object a line (the start summary stays text)" },
    { 0 }
};

static const cli_option *const groups[] = {
    cli_help_opts, cli_model_opts, serve_opts, cli_template_opts, cli_context_opts,
    cli_cache_opts, cli_sampling_opts, NULL
};

/* The API keys of --api-key and --api-key-file (the process's lifetime). */
#define MAX_KEYS 4096
static const char *keys[MAX_KEYS];
static int n_keys;

static bool add_key(const char *k)
{
    if (n_keys == MAX_KEYS) {
        fprintf(stderr, "kvchat: more than %d API keys\n", MAX_KEYS);
        return false;
    }
    keys[n_keys++] = k;
    return true;
}

/* One key per line; blank lines and '#' comments skipped. */
static bool read_keys(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "kvchat: --api-key-file %s: %s\n", path, strerror(errno));
        return false;
    }
    char line[4096];
    bool ok = true;
    int before = n_keys;
    while (ok && fgets(line, sizeof(line), f)) {
        char *p = line, *end;
        while (*p == ' ' || *p == '\t')
            p++;
        end = p + strcspn(p, "#\r\n");
        while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        *end = 0;
        if (*p) {
            char *k = strdup(p);
            ok = k && add_key(k);
        }
    }
    fclose(f);
    if (ok && n_keys == before) {
        fprintf(stderr, "kvchat: --api-key-file %s holds no key\n", path);
        ok = false;
    }
    return ok;
}

/* Apply option id of serve_opts. Same return as cli_common_apply. */
static int serve_apply(kvc_server_params *sp, kvc_engine_params *ep, int id, const char *opt,
                       const char *v)
{
    int64_t n = 0;
    switch (id) {
    case OPT_HOST: sp->host = v; return 1;
    case OPT_ALIAS: sp->model_name = v; return 1;
    case OPT_CORS: sp->cors_origins = v; return 1;
    case OPT_API_KEY: return add_key(v) ? 1 : -1;
    case OPT_API_KEY_FILE: return read_keys(v) ? 1 : -1;
    case OPT_SHARE_KEYS: sp->share_cache_across_keys = true; return 1;
    case OPT_NO_CACHE: ep->no_cache = true; return 1;
    case OPT_SWA_FULL: ep->kv_window_blocks = -1; return 1;
    case OPT_SPECIAL: ep->special_in_content = true; return 1;
    case OPT_STRICT_FIELDS: sp->strict_fields = true; return 1;
    case OPT_LOG_FORMAT:
        if (strcmp(v, "text") && strcmp(v, "json")) {
            fprintf(stderr, "kvchat: --log-format must be text or json, got '%s'\n", v);
            return -1;
        }
        sp->log_format = !strcmp(v, "json") ? KVC_SERVER_LOG_JSON : KVC_SERVER_LOG_TEXT;
        return 1;
    case OPT_NO_WEBUI: sp->no_webui = true; return 1;
    case OPT_OVERFLOW:
        if (strcmp(v, "error") && strcmp(v, "shift")) {
            fprintf(stderr, "kvchat: --context-overflow must be error or shift, got '%s'\n", v);
            return -1;
        }
        ep->overflow = !strcmp(v, "shift") ? KVC_OVERFLOW_SHIFT : KVC_OVERFLOW_ERROR;
        return 1;
    case OPT_PORT:
        if (!cli_int(opt, v, 0, 65535, &n))
            return -1;
        sp->port = (int)n;
        return 1;
    case OPT_PARALLEL: case OPT_MAX_QUEUE: case OPT_MAX_SESSIONS: case OPT_TIMEOUT:
    case OPT_REQUEST_TIMEOUT: case OPT_MAX_CONNECTIONS:
        if (!cli_int(opt, v, 1, 1 << 20, &n))
            return -1;
        if (id == OPT_PARALLEL) ep->n_parallel = (int32_t)n;
        else if (id == OPT_MAX_QUEUE) ep->max_queue = (int32_t)n;
        else if (id == OPT_MAX_SESSIONS) ep->max_sessions = (int32_t)n;
        else if (id == OPT_TIMEOUT) sp->timeout_s = (int)n;
        else if (id == OPT_REQUEST_TIMEOUT) sp->request_timeout_s = (int)n;
        else sp->max_connections = (int)n;
        return 1;
    case OPT_MAX_CONNECTIONS_PER_IP:
        if (!cli_int(opt, v, 0, 1 << 20, &n))
            return -1;
        sp->max_connections_per_ip = n ? (int)n : -1;
        return 1;
    case OPT_KV_BUDGET:
        if (!cli_int(opt, v, 1, INT64_MAX / (1 << 20), &n))
            return -1;
        ep->kv_budget_mib = n;
        return 1;
    case OPT_MAX_BODY:
        if (!cli_int(opt, v, 1, 1024, &n))
            return -1;
        sp->max_body = (size_t)n << 20;
        return 1;
    default:
        return 0;
    }
}

/* Parse argv into the parameter sets. Returns -1 to go on, else the exit
 * code (0 after --help). */
static int parse_args(cli_common *c, cli_cache *cache, kvc_server_params *sp,
                      kvc_engine_params *ep, int argc, char **argv, cli_template *tmpl)
{
    cli_parser p;
    cli_parser_init(&p, "serve", argc, argv, groups);
    const char *v;
    int id, r;
    while ((id = cli_next_opt(&p, &v, serve_help)) >= 0) {
        if (id == 's')
            sp->fixed_seed = true;
        if (id == 'q') {
            c->quiet = true;
            sp->log_requests = KVC_SERVER_LOG_ERRORS;
            continue;
        }
        if ((r = serve_apply(sp, ep, id, cli_opt_name(&p), v)) == 0 &&
            (r = cli_template_apply(tmpl, id, v)) == 0 && (r = cli_cache_apply(cache, id, v)) == 0)
            r = cli_common_apply(c, id, v);
        if (r < 0)
            return 2;
    }
    if (id != CLI_END)
        return cli_stop_code(id);
    ep->chat_template = tmpl->tmpl;
    ep->chat_template_kwargs = tmpl->kwargs;
    return cli_no_operands(&p) ? 2 : -1;
}

/* Start engine and server, say what runs (unless quiet) and where; wait for
 * SIGINT/SIGTERM (blocked in every thread and taken here with sigwait); stop. */
static int serve(kvc_model *m, const char *model_path, const kvc_engine_params *ep,
                 kvc_server_params *sp, bool quiet)
{
    char err[512];
    kvc_engine *e = NULL;
    kvc_server *s = NULL;
    kvc_engine_params used = *ep;
    int rc = kvc_engine_new(m, &used, &e, err, sizeof(err));
    if (rc != KVC_OK && used.cache_disk_mib > 0) {   /* say so, and serve from RAM */
        fprintf(stderr, "kvchat: the disk cache is off: %s\n", err);
        used.cache_disk_mib = 0;
        rc = kvc_engine_new(m, &used, &e, err, sizeof(err));
    }
    if (rc != KVC_OK) {
        fprintf(stderr, "kvchat: %s\n", err);
        return 1;
    }
    sp->log = log_line;
    sp->model_path = model_path;
    sp->version = KVC_VERSION;
    if (kvc_server_start(e, sp, &s, err, sizeof(err)) != KVC_OK) {
        fprintf(stderr, "kvchat: %s\n", err);
        kvc_engine_free(e);
        return 1;
    }
    if (!quiet) {
        cli_serve_info info = { m, model_path, sp->model_name, e, &used, sp,
                                sp->n_api_keys + (sp->api_key != NULL) };
        cli_serve_summary(stderr, &info);
    }
    bool v6 = strchr(sp->host, ':') != NULL;
    say(sp, "listening on http://%s%s%s:%d (up to %d connections)", v6 ? "[" : "", sp->host,
        v6 ? "]" : "", kvc_server_port(s),
        sp->max_connections > 0 ? sp->max_connections : kvc_server_default_max_connections());
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    int sig = 0;
    sigwait(&set, &sig);
    say(sp, "%s%s: shutting down", sp->log_format == KVC_SERVER_LOG_JSON ? "" : "kvchat: ",
        sig == SIGINT ? "SIGINT" : "SIGTERM");
    kvc_server_stop(s);
    kvc_engine_free(e);
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    cli_common c;
    cli_common_init(&c);
    c.sampling = kvc_sampler_default_params();   /* OpenAI clients expect sampling */
    c.sampling.temperature = 1.0f;               /* OpenAI's default, as --help says */
    kvc_server_params sp = kvc_server_default_params();
    kvc_engine_params ep = kvc_engine_default_params();
    cli_cache cache;
    cli_cache_init(&cache);
    const char *env_key = getenv("KVCHAT_API_KEY");
    sp.api_key = env_key && *env_key ? env_key : NULL;
    cli_template tmpl = { 0 };
    int rc = parse_args(&c, &cache, &sp, &ep, argc, argv, &tmpl);
    if (rc >= 0) {
        free(tmpl.owned);
        return rc;
    }
    ep.n_ctx = c.n_ctx;
    ep.n_batch = c.n_batch;
    ep.snapshot_interval = c.snap_interval;
    ep.n_threads = c.n_threads;
    ep.kv_type = c.kv_type;
    ep.cache_disk_mib = cache.disk_mib;
    ep.cache_dir = cache.dir;
    ep.cache_redis = cache.redis;
    ep.cache_redis_password = cache.redis_password;
    ep.cache_redis_timeout_ms = (int32_t)cache.redis_timeout_ms;
    ep.cache_warn = cli_cache_warn;
    ep.model_path = cli_model_path(&c);
    sp.sampling = c.sampling;
    if (n_keys > 0)                          /* given keys replace $KVCHAT_API_KEY */
        sp.api_key = NULL;
    sp.api_keys = keys;
    sp.n_api_keys = n_keys;
    if (sp.api_key && !*sp.api_key)
        sp.api_key = NULL;

    /* Block the stop signals before any thread exists, so that all inherit
     * the mask and only sigwait in this thread receives them. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* A connection is a descriptor: take what the hard limit allows, and
     * size the default connection limit to it. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    kvc_model *m = cli_load_model(&c);
    if (!m) {
        free(tmpl.owned);
        return 1;
    }
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    if (!sp.model_name)                         /* --alias wins */
        sp.model_name = info.name;
    rc = serve(m, ep.model_path, &ep, &sp, c.quiet);
    kvc_model_free(m);
    free(tmpl.owned);
    return rc;
}
