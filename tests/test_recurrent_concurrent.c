/* test_recurrent_concurrent.c - the live-state limit of hybrid recurrent
 * models under concurrent load (issue 32): a recurrent state is memory
 * beside the pool, so at most --parallel sequences hold one (engine_sched.c's
 * limit_live_states). Over HTTP, on generated qwen35 and lfm2 models: N_CONV
 * conversations (four times --parallel), each on a client thread of its own
 * with its own prompt_cache_key, N_TURN turns each (a turn: the last one,
 * its reply and new tokens), all at once, so that turns are admitted while
 * other sessions' states are live and idle ones must let go of theirs; with
 * the default budget and with one of 1 MiB (about 2,300 to 4,000 tokens of
 * K/V for the 8,000 of the conversations: evictions and waits). A
 * monitor thread reads /metrics throughout. Checked: every request completes
 * within a bound (no deadlock: a request waiting for a state no one gives
 * up would time out), kvchat_live_states never exceeds --parallel, and every
 * reply equals a cold run's (a server process of its own, cache_prompt
 * false: sharing nothing with the warm path).
 *
 * Needs $KVC_BIN (set by CTest); skips without it. */
#include <pthread.h>
#include <stdatomic.h>

#include "test.h"

#include "http_client.h"
#include "model_gen.h"
#include "reuse_http.h"

#define N_CONV    8
#define N_TURN    4
#define N_FIRST   600     /* a conversation's first prompt */
#define N_SHARED  400     /* of which all conversations share the first */
#define N_MORE    100     /* new tokens of each later turn */
#define TIMEOUT_S 120     /* a request, and the whole run, within this */
#define CAP       2048

static const char *bin;

typedef struct conv {
    int       id, port, n_vocab;
    int32_t   toks[N_TURN][CAP];
    int       len[N_TURN];
    char     *reply[N_TURN];
} conv;

/* One conversation's turns, one after another. */
static void *conv_main(void *arg)
{
    conv *cv = arg;
    char key[32];
    snprintf(key, sizeof(key), "conversation-%d", cv->id);
    for (int k = 0; k < N_TURN; k++) {
        int n = 0, n_r = 0;
        if (k > 0) {
            memcpy(cv->toks[k], cv->toks[k - 1], (size_t)cv->len[k - 1] * sizeof(int32_t));
            n = cv->len[k - 1];
            int32_t *rt = cv->reply[k - 1] ? tokenize(cv->port, cv->reply[k - 1], &n_r) : NULL;
            if (rt && n + n_r + N_MORE < CAP)
                memcpy(cv->toks[k] + n, rt, (size_t)n_r * sizeof(int32_t)), n += n_r;
            free(rt);
        }
        if (k == 0)   /* a system prompt all conversations share, then their own */
            n = fill(cv->toks[k], 0, N_SHARED, 7, cv->n_vocab);
        cv->len[k] = fill(cv->toks[k], n, k == 0 ? N_FIRST - N_SHARED : N_MORE,
                          10u * (uint32_t)cv->id + (uint32_t)k, cv->n_vocab);
        cv->reply[k] = complete_ex(cv->port, cv->toks[k], cv->len[k], key, true).text;
    }
    return NULL;
}

typedef struct monitor {
    int         port;
    atomic_bool stop;
    double      max_live, max_running, max_waiting, samples;
} monitor;

/* Read the live states, running and waiting requests from /metrics until
 * told to stop; keep the most of each. */
static void *monitor_main(void *arg)
{
    monitor *mo = arg;
    while (!atomic_load(&mo->stop)) {
        http_resp r = http_request(mo->port, "GET", "/metrics", NULL, 10);
        if (r.status == 200 && r.body) {
            mo->max_live = KVC_MAX(mo->max_live, http_prom(r.body, "kvchat_live_states"));
            mo->max_running = KVC_MAX(mo->max_running, http_prom(r.body, "kvchat_requests_running"));
            mo->max_waiting = KVC_MAX(mo->max_waiting, http_prom(r.body, "kvchat_queue_depth"));
            mo->samples++;
        }
        http_resp_free(&r);
        nanosleep(&(struct timespec){ 0, 2000000 }, NULL);
    }
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One model's run with --parallel `parallel`, under --kv-budget `budget`
 * MiB (NULL: the default). */
static void run(const char *path, const char *name, int n_vocab, const char *parallel,
                const char *budget)
{
    const char *const args[] = { "-m", path, "-t", "1", "--parallel", parallel, "-c", "4096",
                                 "--cache-disk", "0", budget ? "--kv-budget" : NULL, budget, NULL };
    http_server warm;
    CHECKF(http_server_start(&warm, bin, args, 30), "%s: warm server", name);
    if (!warm.pid)
        return;
    static conv cv[N_CONV];
    pthread_t th[N_CONV], mth;
    monitor mo = { .port = warm.port };
    atomic_init(&mo.stop, false);
    const double t0 = now_s();
    CHECK(pthread_create(&mth, NULL, monitor_main, &mo) == 0);
    for (int i = 0; i < N_CONV; i++) {
        memset(&cv[i], 0, sizeof(cv[i]));
        cv[i] = (conv){ .id = i, .port = warm.port, .n_vocab = n_vocab };
        CHECK(pthread_create(&th[i], NULL, conv_main, &cv[i]) == 0);
    }
    for (int i = 0; i < N_CONV; i++)
        pthread_join(th[i], NULL);
    const double secs = now_s() - t0;
    atomic_store(&mo.stop, true);
    pthread_join(mth, NULL);
    http_server_stop(&warm);
    printf("  %s: %d conversations x %d turns at once, --parallel %s, --kv-budget %s: %.1f s; in "
           "%.0f samples of /metrics at most %.0f live states, %.0f requests running, %.0f waiting\n",
           name, N_CONV, N_TURN, parallel, budget ? budget : "default", secs, mo.samples, mo.max_live,
           mo.max_running, mo.max_waiting);
    CHECKF(secs < TIMEOUT_S, "%s: %.1f s", name, secs);
    CHECKF(mo.samples > 0 && mo.max_live <= atof(parallel), "%s: %.0f live states (--parallel %s)",
           name, mo.max_live, parallel);
    /* the cold runs: a process of its own, nothing cached */
    const char *const cold_args[] = { "-m", path, "-t", "1", "-c", "4096", "--cache-disk", "0", NULL };
    http_server cold;
    CHECKF(http_server_start(&cold, bin, cold_args, 30), "%s: cold server", name);
    for (int i = 0; i < N_CONV; i++)
        for (int k = 0; k < N_TURN; k++) {
            char *want = cold.pid ? complete_ex(cold.port, cv[i].toks[k], cv[i].len[k], NULL, false).text
                                  : NULL;
            CHECKF(cv[i].reply[k] && want && strcmp(cv[i].reply[k], want) == 0,
                   "%s conversation %d turn %d (%d tokens): warm \"%s\" != cold \"%s\"", name, i, k + 1,
                   cv[i].len[k], cv[i].reply[k] ? cv[i].reply[k] : "(failed)", want ? want : "(failed)");
            free(want);
            free(cv[i].reply[k]);
        }
    http_server_stop(&cold);
}

int main(void)
{
    bin = getenv("KVC_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        printf("test_recurrent_concurrent: skipped ($KVC_BIN not set)\n");
        return TEST_SKIP;
    }
    char dir[] = "/tmp/kvc_recurrent_concurrent_XXXXXX", path[256], err[512];
    if (!mkdtemp(dir))
        return 1;
    const char *const presets[] = { "tiny-qwen35", "tiny-lfm2" };
    for (size_t k = 0; k < KVC_ARRAY_LEN(presets); k++) {
        kvc_gen_params g;
        CHECK_EQ_INT(kvc_gen_preset(presets[k], &g), KVC_OK);
        g.n_threads = 2;
        snprintf(path, sizeof(path), "%s/%s.gguf", dir, presets[k]);
        CHECKF(kvc_gen_write(&g, path, err, sizeof(err)) == KVC_OK, "%s", err);
        kvc_model *m = NULL;
        CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "%s", err);
        if (!m)
            continue;
        kvc_model_info info;
        kvc_model_get_info(m, &info);
        kvc_model_free(m);
        run(path, presets[k], info.n_vocab, "2", NULL);
        run(path, presets[k], info.n_vocab, "3", "1");   /* K/V, snapshots and states under pressure */
        unlink(path);
    }
    rmdir(dir);
    return test_done("test_recurrent_concurrent");
}
