/* common.c - option parsing, model loading and the demo model, for every command. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

const char cli_common_help[] =
    "  -m, --model FILE        GGUF model (default: the generated demo model)\n"
    "  -t, --threads N         threads (default: all cores)\n"
    "  -c, --ctx-size N        context length (default: the model's)\n"
    "  -b, --batch-size N      tokens per forward pass (default 512)\n"
    "      --kv-type T         KV cache type: f16 (default), f32, q8_0\n"
    "      --json              machine-readable output\n";

const char cli_cache_help[] =
    "      --cache-dir DIR     the disk tier's directory (default: $KVCHAT_CACHE/kv, else\n"
    "                          $XDG_CACHE_HOME/kvchat/kv, else ~/.cache/kvchat/kv)\n"
    "      --cache-disk MIB    the disk tier's size in MiB (default 4096; 0 = off): the KV\n"
    "                          cache survives evictions and restarts\n"
    "      --cache-redis URL   a shared tier in Redis behind the disk tier, so that\n"
    "                          instances share their KV blocks:\n"
    "                          redis://[[user]:password@]host[:port][/db]\n"
    "      --cache-redis-password PW   Redis password (default: the URL's; env REDISCLI_AUTH)\n"
    "      --cache-redis-timeout MS    bound on each Redis connect and command (default 200)\n";

const char cli_sampling_help[] =
    "      --temp X            temperature; 0 = greedy (default 0)\n"
    "      --top-k N           keep the N most likely tokens (default 40; 0 = off)\n"
    "      --top-p X           nucleus sampling (default 0.95; 1 = off)\n"
    "      --min-p X           drop tokens below X times the top probability (default 0.05)\n"
    "      --repeat-penalty X  penalise repeated tokens (default 1 = off)\n"
    "      --repeat-last-n N   history the penalties look at (default 64)\n"
    "      --presence-penalty X, --frequency-penalty X   OpenAI-style penalties (default 0)\n"
    "      --seed N            random seed\n";

void cli_common_init(cli_common *c)
{
    memset(c, 0, sizeof(*c));
    c->kv_type = KVC_KV_F16;
    c->sampling = kvc_sampler_default_params();
    c->sampling.temperature = 0.0f;   /* the CLI is greedy unless asked */
}

bool cli_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "kvchat: %s needs an integer in [%lld, %lld], got '%s'\n", opt,
                (long long)lo, (long long)hi, s ? s : "");
        return false;
    }
    *out = v;
    return true;
}

bool cli_float(const char *opt, const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = s ? strtof(s, &end) : 0;
    if (!s || errno || end == s || *end || v != v) {
        fprintf(stderr, "kvchat: %s needs a number, got '%s'\n", opt, s ? s : "");
        return false;
    }
    *out = v;
    return true;
}

static bool is(const char *a, const char *s1, const char *s2)
{
    return !strcmp(a, s1) || (s2 && !strcmp(a, s2));
}

/* The value of option argv[*i]; NULL (after printing) when it is missing. */
static const char *value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "kvchat: %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

void cli_cache_init(cli_cache *c)
{
    c->dir = NULL;
    c->disk_mib = KVC_DISK_DEFAULT_MIB;
    c->redis = NULL;
    const char *pw = getenv("REDISCLI_AUTH");     /* redis-cli's variable: not on a command line */
    c->redis_password = pw && *pw ? pw : NULL;
    c->redis_timeout_ms = 0;
}

void cli_cache_warn(void *user, const char *msg)
{
    (void)user;
    fprintf(stderr, "kvchat: %s\n", msg);
}

int cli_parse_cache(cli_cache *c, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    int64_t n;
    if (is(a, "--cache-dir", NULL)) {
        if (!(v = value(argc, argv, i)))
            return -1;
        c->dir = v;
    } else if (is(a, "--cache-disk", NULL)) {
        if (!(v = value(argc, argv, i)) || !cli_int(a, v, 0, INT64_MAX / (1 << 20), &n))
            return -1;
        c->disk_mib = n;
    } else if (is(a, "--cache-redis", NULL)) {
        if (!(v = value(argc, argv, i)))
            return -1;
        c->redis = v;
    } else if (is(a, "--cache-redis-password", NULL)) {
        if (!(v = value(argc, argv, i)))
            return -1;
        c->redis_password = v;
    } else if (is(a, "--cache-redis-timeout", NULL)) {
        if (!(v = value(argc, argv, i)) || !cli_int(a, v, 1, 600000, &n))
            return -1;
        c->redis_timeout_ms = n;
    } else {
        return 0;
    }
    return 1;
}

const char *cli_model_path(const cli_common *c)
{
    return c->model ? c->model : cli_demo_model_path();
}

int cli_parse_common(cli_common *c, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    int64_t n;
    if (is(a, "-m", "--model")) {
        if (!(v = value(argc, argv, i)))
            return -1;
        c->model = v;
    } else if (is(a, "-t", "--threads")) {
        if (!(v = value(argc, argv, i)) || !cli_int(a, v, 1, 1024, &n))
            return -1;
        c->n_threads = (int32_t)n;
    } else if (is(a, "-c", "--ctx-size")) {
        if (!(v = value(argc, argv, i)) || !cli_int(a, v, 0, INT32_MAX, &n))
            return -1;
        c->n_ctx = (int32_t)n;
    } else if (is(a, "-b", "--batch-size")) {
        if (!(v = value(argc, argv, i)) || !cli_int(a, v, 1, 1 << 16, &n))
            return -1;
        c->n_batch = (int32_t)n;
    } else if (is(a, "--kv-type", NULL)) {
        if (!(v = value(argc, argv, i)))
            return -1;
        if (!strcmp(v, "f16"))
            c->kv_type = KVC_KV_F16;
        else if (!strcmp(v, "f32"))
            c->kv_type = KVC_KV_F32;
        else if (!strcmp(v, "q8_0"))
            c->kv_type = KVC_KV_Q8_0;
        else {
            fprintf(stderr, "kvchat: --kv-type must be f16, f32 or q8_0, got '%s'\n", v);
            return -1;
        }
    } else if (is(a, "--json", NULL)) {
        c->json = true;
    } else {
        return cli_parse_sampling(&c->sampling, argc, argv, i);
    }
    return 1;
}

int cli_parse_sampling(kvc_sampler_params *s, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    int64_t n;
    float *f = NULL;
    if (is(a, "--temp", "--temperature"))
        f = &s->temperature;
    else if (is(a, "--top-p", NULL))
        f = &s->top_p;
    else if (is(a, "--min-p", NULL))
        f = &s->min_p;
    else if (is(a, "--repeat-penalty", NULL))
        f = &s->repeat_penalty;
    else if (is(a, "--presence-penalty", NULL))
        f = &s->presence_penalty;
    else if (is(a, "--frequency-penalty", NULL))
        f = &s->frequency_penalty;
    if (f)
        return (v = value(argc, argv, i)) && cli_float(a, v, f) ? 1 : -1;
    if (is(a, "--top-k", NULL)) {
        if (!(v = value(argc, argv, i)) || !cli_int(a, v, 0, INT32_MAX, &n))
            return -1;
        s->top_k = (int32_t)n;
        return 1;
    }
    if (is(a, "--repeat-last-n", NULL)) {
        if (!(v = value(argc, argv, i)) || !cli_int(a, v, 0, INT32_MAX, &n))
            return -1;
        s->repeat_last_n = (int32_t)n;
        return 1;
    }
    if (is(a, "--seed", "-s")) {
        if (!(v = value(argc, argv, i)) || !cli_int(a, v, 0, INT64_MAX, &n))
            return -1;
        s->seed = (uint64_t)n;
        return 1;
    }
    return 0;
}

int cli_bad_option(const char *cmd, const char *opt)
{
    fprintf(stderr, "kvchat %s: unknown option '%s' (see kvchat %s --help)\n", cmd, opt, cmd);
    return 2;
}

/* ----------------------------------------------------------- loading */

static void progress_bar(float f, void *user)
{
    int *last = user;
    int pct = (int)(f * 100.0f);
    if (pct != *last) {
        *last = pct;
        fprintf(stderr, "\rloading model: %3d%%", pct);
        if (pct >= 100)
            fputc('\n', stderr);
    }
}

static int mkdir_p(const char *path)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

const char *cli_demo_model_path(void)
{
    static char path[PATH_MAX];
    char dir[PATH_MAX - 32];
    const char *env = getenv("KVCHAT_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (env && *env)
        snprintf(dir, sizeof(dir), "%s", env);
    else if (xdg && *xdg)
        snprintf(dir, sizeof(dir), "%s/kvchat", xdg);
    else
        snprintf(dir, sizeof(dir), "%s/.cache/kvchat", home && *home ? home : "/tmp");
    snprintf(path, sizeof(path), "%s/demo-v1.gguf", dir);
    struct stat st;
    if (stat(path, &st) == 0)
        return path;
    if (mkdir_p(dir) != 0) {
        fprintf(stderr, "kvchat: cannot create %s: %s\n", dir, strerror(errno));
        return NULL;
    }
    char tmp[PATH_MAX + 16], err[512];
    snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
    fprintf(stderr, "kvchat: no model given; generating the demo model (random weights) at %s\n", path);
    kvc_gen_params g = kvc_gen_default_params();
    if (kvc_gen_write(&g, tmp, err, sizeof(err)) != KVC_OK) {
        fprintf(stderr, "kvchat: generating the demo model: %s\n", err);
        unlink(tmp);
        return NULL;
    }
    if (rename(tmp, path) != 0) {
        fprintf(stderr, "kvchat: rename to %s: %s\n", path, strerror(errno));
        unlink(tmp);
        return NULL;
    }
    return path;
}

kvc_model *cli_load_model(const cli_common *c)
{
    const char *path = c->model ? c->model : cli_demo_model_path();
    if (!path)
        return NULL;
    struct stat st;
    int last = -1;
    kvc_model_params mp = kvc_model_default_params();
    if (stat(path, &st) == 0 && st.st_size > (64 << 20) && isatty(2)) {
        mp.progress = progress_bar;
        mp.progress_user = &last;
    }
    kvc_model *m = NULL;
    char err[512];
    if (kvc_model_load(path, &mp, &m, err, sizeof(err)) != KVC_OK) {
        fprintf(stderr, "kvchat: %s\n", err);
        return NULL;
    }
    return m;
}

kvc_context *cli_new_context(const cli_common *c, kvc_model *m, int32_t n_seq)
{
    kvc_context_params p = kvc_context_default_params();
    p.n_ctx = c->n_ctx;
    p.n_batch = c->n_batch;
    p.n_threads = c->n_threads;
    p.n_seq = n_seq;
    p.kv_type = c->kv_type;
    kvc_context *ctx = NULL;
    char err[512];
    if (kvc_context_new(m, &p, &ctx, err, sizeof(err)) != KVC_OK) {
        fprintf(stderr, "kvchat: %s\n", err);
        return NULL;
    }
    cli_note_n_ctx(m, c->n_ctx, kvc_context_n_ctx(ctx));
    return ctx;
}

void cli_note_n_ctx(const kvc_model *m, int32_t asked, int32_t used)
{
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    if (asked <= 0 && used < info.n_ctx_train)
        fprintf(stderr, "kvchat: notice: the model says its context is %d tokens; using %d, "
                "what the KV cache can hold (set --kv-budget or -c to choose)\n",
                info.n_ctx_train, used);
}

/* ------------------------------------------------------------ chat templates */

const char cli_template_help[] =
    "  --chat-template NAME     a built-in format instead of the model's own template:\n"
    "                           chatml, llama3, llama2, mistral-v7, phi3, gemma, zephyr, deepseek, ...\n"
    "  --chat-template-file F   a Jinja chat template to use instead of the model's\n"
    "  --chat-template-kwargs J a JSON object of template variables, e.g. '{\"enable_thinking\": false}'\n";

int cli_parse_template(int argc, char **argv, int *i, const char **tmpl, const char **kwargs,
                       char **owned)
{
    const char *a = argv[*i];
    if (strcmp(a, "--chat-template") && strcmp(a, "--chat-template-file") &&
        strcmp(a, "--chat-template-kwargs"))
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "kvchat: %s needs a value\n", a);
        return -1;
    }
    const char *v = argv[++*i];
    if (!strcmp(a, "--chat-template")) {
        *tmpl = v;
    } else if (!strcmp(a, "--chat-template-kwargs")) {
        cJSON *o = cJSON_Parse(v);
        bool ok = cJSON_IsObject(o);
        cJSON_Delete(o);
        if (!ok) {
            fprintf(stderr, "kvchat: --chat-template-kwargs must be a JSON object, got '%s'\n", v);
            return -1;
        }
        *kwargs = v;
    } else {
        FILE *fp = fopen(v, "rb");
        char *buf = NULL;
        long n = -1;
        if (fp && fseek(fp, 0, SEEK_END) == 0 && (n = ftell(fp)) >= 0 && fseek(fp, 0, SEEK_SET) == 0 &&
            (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, fp) == (size_t)n) {
            buf[n] = 0;
        } else {
            free(buf);
            buf = NULL;
        }
        if (fp)
            fclose(fp);
        if (!buf || (!strstr(buf, "{%") && !strstr(buf, "{{"))) {
            fprintf(stderr, "kvchat: --chat-template-file %s: %s\n", v,
                    buf ? "not a Jinja template (no {% or {{)" : "cannot read it");
            free(buf);
            return -1;
        }
        free(*owned);
        *owned = buf;
        *tmpl = buf;
    }
    return 1;
}
