/* common.c - model loading, the demo model and the tiers' defaults, for every command. */
#include <errno.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

void cli_common_init(cli_common *c)
{
    memset(c, 0, sizeof(*c));
    c->kv_type = KVC_KV_F16;
    c->sampling = kvc_sampler_default_params();
    c->sampling.temperature = 0.0f;   /* the CLI is greedy unless asked */
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

const char *cli_model_path(const cli_common *c)
{
    return c->model ? c->model : cli_demo_model_path();
}

/* ----------------------------------------------------------- loading */

/* Loading progress on stderr: a bar redrawn in place on a terminal, a line
 * every 25% in a log. */
typedef struct load_progress {
    int  last;                  /* percent (terminal) or quarter (log) shown last */
    bool tty;
} load_progress;

static void progress_bar(float f, void *user)
{
    load_progress *p = user;
    int pct = (int)(f * 100.0f);
    if (p->tty && pct != p->last) {
        p->last = pct;
        fprintf(stderr, "\rkvchat: loading model: %3d%%", pct);
        if (pct >= 100)
            fputc('\n', stderr);
    } else if (!p->tty && pct / 25 != p->last) {
        p->last = pct / 25;
        fprintf(stderr, "kvchat: loading model: %d%%\n", p->last * 25);
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
    load_progress progress = { -1, isatty(2) };
    kvc_model_params mp = kvc_model_default_params();
    if (stat(path, &st) == 0 && st.st_size > (64 << 20) && !c->quiet) {
        fprintf(stderr, "kvchat: loading %s (%.2f GiB)\n", path, st.st_size / 1073741824.0);
        mp.progress = progress_bar;
        mp.progress_user = &progress;
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
    p.snapshot_interval = c->snap_interval;
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

/* ------------------------------------------------------------ benchmarks */

double cli_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

const char *const cli_words[] = {
    "the", "river", "carried", "small", "boats", "past", "old", "stone", "houses", "while",
    "children", "watched", "from", "bridges", "and", "merchants", "counted", "their", "coins",
    "under", "bright", "summer", "skies", "near", "quiet", "gardens", "full", "of", "roses",
};
const size_t cli_n_words = sizeof(cli_words) / sizeof(cli_words[0]);
