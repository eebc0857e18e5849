/* cmd_serve.c - `kvchat serve`: the OpenAI-compatible HTTP server (src/server.c)
 * over one engine. Runs until SIGINT or SIGTERM, then stops cleanly: open
 * streams end, their requests are cancelled, the engine thread is joined. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "server.h"

int cmd_serve(int argc, char **argv);

/* The server's notices, on stderr. */
static void log_line(const char *line, void *user)
{
    (void)user;
    fprintf(stderr, "kvchat: %s\n", line);
}

static const char serve_help[] =
    "usage: kvchat serve [options]\n\n"
    "Serve the OpenAI API: POST /v1/chat/completions, POST /v1/completions,\n"
    "POST /v1/responses (stateless), and Anthropic's POST /v1/messages and\n"
    "/v1/messages/count_tokens; GET /v1/models, GET /health, GET /metrics\n"
    "(Prometheus), POST /tokenize, POST /detokenize, POST /apply-template\n"
    "(?api=responses or ?api=messages: a request of that API).\n\n"
    "      --alias NAME        the model name served (/v1/models, responses; default:\n"
    "                          the GGUF's general.name)\n"
    "      --cors-origins LIST browser origins allowed to call: '*' or a comma list\n"
    "                          (default none; OPTIONS preflights are answered 204)\n"
    "      --host ADDR         address to bind (default 127.0.0.1)\n"
    "      --port N            port (default 8080; 0 = any free port)\n"
    "      --api-key KEY       require 'Authorization: Bearer KEY' (default: $KVCHAT_API_KEY,\n"
    "                          else none); /health stays open. Repeat it for several keys\n"
    "      --api-key-file F    more keys, one per line ('#' starts a comment)\n"
    "      --share-cache-across-keys  one cache for every key (default: each key is its own\n"
    "                          cache namespace: no cached block or session is shared, so\n"
    "                          cached_tokens and timing tell nothing about other keys)\n"
    "      --parallel N        conversations computed at once (default 8)\n"
    "      --kv-budget MIB     KV cache size in MiB (default: N parallel full contexts)\n"
    "      --max-queue N       requests waiting beyond the running ones (default 64);\n"
    "                          more are answered 503\n"
    "      --max-sessions N    keyed conversations kept (default 256)\n"
    "      --chat-template NAME, --chat-template-file F, --chat-template-kwargs JSON:\n"
    "                          see below (default: the model's own template)\n"
    "      --context-overflow error|shift  prompt + max_tokens over the context: a 400\n"
    "                          error (default) or drop the oldest turns\n"
    "      --no-cache          every request cold: reuse nothing, keep nothing (a reference\n"
    "                          server to compare against)\n"
    "      --allow-special-in-content  control-token text in messages becomes control tokens\n"
    "                          (default: message text is plain text; only the template's\n"
    "                          markup gives control tokens)\n"
    "      --strict-fields     a request field kvchat does not use is a 400 (default: hints\n"
    "                          such as metadata or return_progress are accepted, logged once\n"
    "                          and named in the X-Kvchat-Ignored-Fields header; fields that\n"
    "                          would change the answer are 400s either way)\n"
    "      --timeout S         close connections idle for S seconds (default 60)\n"
    "      --request-timeout S a request's headers and body must arrive within S seconds\n"
    "                          of the connection opening (or of the previous answer);\n"
    "                          bytes do not extend it (default 30)\n"
    "      --max-connections N open connections (default: the file-descriptor limit - 64,\n"
    "                          at most 8192; the soft limit is raised to the hard one)\n"
    "      --max-connections-per-ip N  from one address (default: no limit on a loopback\n"
    "                          --host, as behind a reverse proxy; else 64; 0 = no limit)\n"
    "      --max-body MIB      request body limit (default 8)\n";

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

/* Options of serve beyond the shared ones. Same return as cli_parse_common. */
static int parse_serve(kvc_server_params *sp, kvc_engine_params *ep, int argc, char **argv,
                       int *i)
{
    static const char *const names[] = {
        "--host", "--api-key", "--api-key-file", "--context-overflow", "--port", "--parallel",
        "--max-queue", "--max-sessions", "--timeout", "--kv-budget", "--max-body",
        "--request-timeout", "--max-connections", "--max-connections-per-ip",
        "--alias", "--cors-origins",
    };
    const char *a = argv[*i];
    int64_t n = 0;
    size_t k = 0;
    while (k < sizeof(names) / sizeof(names[0]) && strcmp(a, names[k]))
        k++;
    if (k == sizeof(names) / sizeof(names[0]))
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "kvchat: %s needs a value\n", a);
        return -1;
    }
    const char *v = argv[*i + 1];
    if (!strcmp(a, "--host"))
        sp->host = v;
    else if (!strcmp(a, "--alias"))
        sp->model_name = v;
    else if (!strcmp(a, "--cors-origins"))
        sp->cors_origins = v;
    else if (!strcmp(a, "--api-key")) {
        if (!add_key(v))
            return -1;
    } else if (!strcmp(a, "--api-key-file")) {
        if (!read_keys(v))
            return -1;
    }
    else if (!strcmp(a, "--context-overflow")) {
        if (strcmp(v, "error") && strcmp(v, "shift")) {
            fprintf(stderr, "kvchat: --context-overflow must be error or shift, got '%s'\n", v);
            return -1;
        }
        ep->overflow = !strcmp(v, "shift") ? KVC_OVERFLOW_SHIFT : KVC_OVERFLOW_ERROR;
    } else if (!strcmp(a, "--port")) {
        if (!cli_int(a, v, 0, 65535, &n))
            return -1;
        sp->port = (int)n;
    } else if (!strcmp(a, "--parallel") || !strcmp(a, "--max-queue") ||
               !strcmp(a, "--max-sessions") || !strcmp(a, "--timeout")) {
        if (!cli_int(a, v, 1, 1 << 20, &n))
            return -1;
        int32_t *dst = !strcmp(a, "--parallel") ? &ep->n_parallel
                     : !strcmp(a, "--max-queue") ? &ep->max_queue
                     : !strcmp(a, "--max-sessions") ? &ep->max_sessions : NULL;
        if (dst)
            *dst = (int32_t)n;
        else
            sp->timeout_s = (int)n;
    } else if (!strcmp(a, "--request-timeout") || !strcmp(a, "--max-connections")) {
        if (!cli_int(a, v, 1, 1 << 20, &n))
            return -1;
        *(!strcmp(a, "--request-timeout") ? &sp->request_timeout_s : &sp->max_connections) =
            (int)n;
    } else if (!strcmp(a, "--max-connections-per-ip")) {
        if (!cli_int(a, v, 0, 1 << 20, &n))
            return -1;
        sp->max_connections_per_ip = n ? (int)n : -1;
    } else if (!strcmp(a, "--kv-budget")) {
        if (!cli_int(a, v, 1, INT64_MAX / (1 << 20), &n))
            return -1;
        ep->kv_budget_mib = n;
    } else if (!strcmp(a, "--max-body")) {
        if (!cli_int(a, v, 1, 1024, &n))
            return -1;
        sp->max_body = (size_t)n << 20;
    }
    ++*i;
    return 1;
}

/* Parse argv into the three parameter sets. Returns -1 to go on, else the
 * exit code (0 after --help). */
static int parse_args(cli_common *c, cli_cache *cache, kvc_server_params *sp,
                      kvc_engine_params *ep, int argc, char **argv, char **tmpl_src)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            /* serve samples by default (OpenAI's temperature 1), unlike the CLI */
            const char *t = strstr(cli_sampling_help, "(default 0)");
            printf("%s%s%s%s", serve_help, cli_template_help, cli_cache_help, cli_common_help);
            if (t)
                printf("%.*s(default 1, OpenAI's)%s", (int)(t - cli_sampling_help),
                       cli_sampling_help, t + strlen("(default 0)"));
            else
                printf("%s", cli_sampling_help);
            printf("\nThe sampling options set the defaults for requests that leave them out.\n");
            return 0;
        }
        if (!strcmp(a, "--seed") || !strcmp(a, "-s"))
            sp->fixed_seed = true;
        if (!strcmp(a, "--no-cache")) {
            ep->no_cache = true;
            continue;
        }
        if (!strcmp(a, "--share-cache-across-keys")) {
            sp->share_cache_across_keys = true;
            continue;
        }
        if (!strcmp(a, "--allow-special-in-content")) {
            ep->special_in_content = true;
            continue;
        }
        if (!strcmp(a, "--strict-fields")) {
            sp->strict_fields = true;
            continue;
        }
        int r = cli_parse_template(argc, argv, &i, &ep->chat_template, &ep->chat_template_kwargs,
                                   tmpl_src);
        if (r == 0)
            r = parse_serve(sp, ep, argc, argv, &i);
        if (r == 0)
            r = cli_parse_cache(cache, argc, argv, &i);
        if (r == 0)
            r = cli_parse_common(c, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r == 0)
            return cli_bad_option("serve", a);
    }
    return -1;
}

/* Start engine and server; wait for SIGINT/SIGTERM (blocked in every thread
 * and taken here with sigwait); stop. */
static int serve(kvc_model *m, const kvc_engine_params *ep, kvc_server_params *sp)
{
    char err[512];
    kvc_engine *e = NULL;
    kvc_server *s = NULL;
    int rc = kvc_engine_new(m, ep, &e, err, sizeof(err));
    if (rc != KVC_OK && ep->cache_disk_mib > 0) {   /* say so, and serve from RAM */
        fprintf(stderr, "kvchat: the disk cache is off: %s\n", err);
        kvc_engine_params no_disk = *ep;
        no_disk.cache_disk_mib = 0;
        rc = kvc_engine_new(m, &no_disk, &e, err, sizeof(err));
    }
    if (rc != KVC_OK) {
        fprintf(stderr, "kvchat: %s\n", err);
        return 1;
    }
    cli_note_n_ctx(m, ep->n_ctx, kvc_engine_n_ctx(e));
    sp->log = log_line;
    if (kvc_server_start(e, sp, &s, err, sizeof(err)) != KVC_OK) {
        fprintf(stderr, "kvchat: %s\n", err);
        kvc_engine_free(e);
        return 1;
    }
    bool v6 = strchr(sp->host, ':') != NULL;
    fprintf(stderr, "kvchat: chat template: %s\n", kvc_engine_template(e));
    fprintf(stderr, "kvchat: model %s; %s; up to %d connections\nlistening on http://%s%s%s:%d\n",
            sp->model_name, sp->api_key || sp->n_api_keys ? "API key required" : "no API key",
            sp->max_connections > 0 ? sp->max_connections
                                    : kvc_server_default_max_connections(),
            v6 ? "[" : "", sp->host, v6 ? "]" : "", kvc_server_port(s));
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "kvchat: %s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
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
    char *tmpl_src = NULL;   /* --chat-template-file's text */
    int rc = parse_args(&c, &cache, &sp, &ep, argc, argv, &tmpl_src);
    if (rc >= 0) {
        free(tmpl_src);
        return rc;
    }
    ep.n_ctx = c.n_ctx;
    ep.n_batch = c.n_batch;
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
        free(tmpl_src);
        return 1;
    }
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    if (!sp.model_name)                         /* --alias wins */
        sp.model_name = info.name;
    rc = serve(m, &ep, &sp);
    kvc_model_free(m);
    free(tmpl_src);
    return rc;
}
