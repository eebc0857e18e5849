/* cmd_bench_sessions.c - kvchat bench sessions: many conversations at once
 * through the engine (DESIGN.md §4).
 *
 * N conversations (default 16) of T turns (default 8) share a system prompt;
 * one client thread per conversation submits its turns, each turn the whole
 * conversation so far, so the conversations interleave as a server's clients
 * would. The same workload runs twice on the same KV budget: with batching
 * (n_parallel = N: decode tokens and prefill chunks of every conversation in
 * one forward pass) and without (n_parallel = 1: one request at a time).
 * Reported per run: computed tokens / prompt tokens, time to first token
 * (p50, p99, queueing included), aggregate decode tokens/s (tokens generated
 * by all conversations / wall time), tokens per forward pass. Greedy, so the
 * two runs must give the same replies (checked). */
#include <ftw.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

int cmd_bench_sessions(int argc, char **argv);

static const char help[] =
    "usage: kvchat bench sessions [-m MODEL.gguf] [options]\n";

enum { OPT_CONVERSATIONS = CLI_OPT_CMD, OPT_TURNS, OPT_SYSTEM_TOKENS, OPT_TURN_TOKENS,
       OPT_REPLY_TOKENS, OPT_KV_BUDGET };

static const cli_option bench_sessions_opts[] = {
    { "conversations", 0, "N", OPT_CONVERSATIONS, 0,
      "conversations at once, one client thread each (default 16)" },
    { "turns", 0, "N", OPT_TURNS, 0, "turns per conversation (default 8)" },
    { "system-tokens", 0, "N", OPT_SYSTEM_TOKENS, 0,
      "tokens of the shared system prompt (default 500)" },
    { "turn-tokens", 0, "N", OPT_TURN_TOKENS, 0, "tokens of each user message (default 40)" },
    { "reply-tokens", 0, "N", OPT_REPLY_TOKENS, 0, "tokens per reply (default 32)" },
    { "kv-budget", 0, "MIB", OPT_KV_BUDGET, 0,
      "KV budget of both runs (default: every conversation's full\nlength)" },
    { "cache-disk", 0, "MIB", CLI_OPT_CACHE_DISK, 0,
      "a disk tier of that size for both runs (default: none; each\n"
      "run starts from an empty directory, --cache-dir or a temporary one)" },
    { "cache-dir", 0, "DIR", CLI_OPT_CACHE_DIR, 0, "the disk tier's directory" },
    { 0 }
};

static const cli_option *const groups[] = {
    cli_help_opts, cli_model_opts, bench_sessions_opts, cli_context_opts, NULL
};

/* Text of about n tokens (measured with the model's tokenizer), varied by seed. */
static char *text_of(kvc_model *m, int64_t n, uint32_t seed)
{
    size_t cap = 64 + (size_t)n * 16, len = 0;
    char *s = malloc(cap);
    int32_t *ids = malloc(((size_t)n + 64) * sizeof(int32_t));
    if (!s || !ids) {
        free(s);
        free(ids);
        return NULL;
    }
    len += (size_t)snprintf(s, cap, "Part %u: ", seed);
    uint32_t x = 2166136261u ^ seed;
    for (int k = 1; len + 20 < cap; k++) {
        x = x * 1664525u + 1013904223u;
        len += (size_t)snprintf(s + len, cap - len, "%s ",
                                cli_words[(x >> 8) % cli_n_words]);
        if (k % 4 == 0 && kvc_model_tokenize(m, s, len, false, false, ids, n + 64) >= n)
            break;
    }
    s[len - 1] = '.';
    free(ids);
    return s;
}

typedef struct workload {
    kvc_model  *m;
    int32_t     n_conv, turns, reply_tokens;
    char       *system;
    char      **user;          /* [n_conv * turns] */
    cli_cache   cache;         /* the disk tier (disk_mib 0: none) */
    const char *model_path;
} workload;

typedef struct conv_run {
    const workload *w;
    kvc_engine     *e;
    int32_t         index;
    char          **replies;   /* [turns] */
    double         *ttft_ms;   /* [turns] */
    int64_t         prompt, cached, computed, output;
    int             failed;    /* 0, or the status of the first failure */
    char            message[512];
} conv_run;

/* One conversation: each turn sends everything so far and waits for the reply. */
static void *run_conversation(void *arg)
{
    conv_run *cr = arg;
    const workload *w = cr->w;
    int32_t n_msgs = 1 + 2 * w->turns;
    kvc_chat_message *msgs = calloc((size_t)n_msgs, sizeof(*msgs));
    char key[32];
    snprintf(key, sizeof(key), "bench-%d", cr->index);
    msgs[0] = (kvc_chat_message){ "system", w->system };
    size_t n = 1;
    for (int32_t t = 0; t < w->turns && !cr->failed; t++) {
        msgs[n++] = (kvc_chat_message){ "user", w->user[cr->index * w->turns + t] };
        kvc_request_params rp = { .messages = msgs, .n_messages = n, .session_key = key,
                                  .chat = kvc_chat_default_params() };
        rp.chat.max_tokens = w->reply_tokens;
        rp.chat.sampling.temperature = 0;
        int status = 0;
        kvc_request *r = kvc_engine_submit(cr->e, &rp, &status, cr->message, sizeof(cr->message));
        kvc_event ev = { 0 };
        while (r && kvc_request_next(r, &ev, -1) && ev.type == KVC_EVENT_TEXT)
            kvc_event_clear(&ev);
        if (!r || ev.type != KVC_EVENT_DONE) {
            cr->failed = r ? ev.status : status;
            if (r)
                snprintf(cr->message, sizeof(cr->message), "%s", ev.message);
        } else {
            cr->replies[t] = ev.text;
            cr->ttft_ms[t] = ev.stats.ttft_ms;
            cr->prompt += ev.stats.prompt_tokens;
            cr->cached += ev.stats.cached_tokens;
            cr->computed += ev.stats.computed_tokens;
            cr->output += ev.stats.output_tokens;
            msgs[n++] = (kvc_chat_message){ "assistant", ev.text };
        }
        kvc_request_free(r);
    }
    free(msgs);
    return NULL;
}

typedef struct run_result {
    double   wall_s, p50, p99;
    int64_t  prompt, cached, computed, output;
    uint64_t steps, step_tokens;
    uint64_t bg_tokens, bg_us, busy_us;   /* background canonicalization, engine time */
    char   **replies;          /* [n_conv * turns], owned */
    bool     ok;
} run_result;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *f)
{
    return remove(path);
}

static run_result run(const workload *w, const cli_common *c, int32_t n_parallel, int64_t budget)
{
    run_result res = { 0 };
    kvc_engine_params ep = kvc_engine_default_params();
    ep.n_ctx = c->n_ctx;
    ep.n_batch = c->n_batch;
    ep.n_threads = c->n_threads;
    ep.kv_type = c->kv_type;
    ep.kv_budget_mib = budget;
    char tmp[] = "/tmp/kvchat-bench-disk-XXXXXX";
    bool own_dir = false;
    if (w->cache.disk_mib > 0) {             /* an empty tier: nothing from earlier runs */
        ep.cache_disk_mib = w->cache.disk_mib;
        own_dir = !w->cache.dir && mkdtemp(tmp);
        ep.cache_dir = w->cache.dir ? w->cache.dir : own_dir ? tmp : NULL;
        ep.model_path = w->model_path;
    }
    ep.n_parallel = n_parallel;
    ep.max_queue = w->n_conv + 1;
    kvc_engine *e = NULL;
    char err[512];
    if (kvc_engine_new(w->m, &ep, &e, err, sizeof(err)) != KVC_OK) {
        fprintf(stderr, "kvchat bench sessions: %s\n", err);
        if (own_dir)
            nftw(tmp, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
        return res;
    }
    int32_t total = w->n_conv * w->turns;
    conv_run *cr = calloc((size_t)w->n_conv, sizeof(*cr));
    pthread_t *th = calloc((size_t)w->n_conv, sizeof(*th));
    res.replies = calloc((size_t)total, sizeof(char *));
    double *ttft = calloc((size_t)total, sizeof(double));
    double t0 = cli_now_s();
    for (int32_t i = 0; i < w->n_conv; i++) {
        cr[i] = (conv_run){ .w = w, .e = e, .index = i, .replies = res.replies + i * w->turns,
                            .ttft_ms = ttft + i * w->turns };
        pthread_create(&th[i], NULL, run_conversation, &cr[i]);
    }
    res.ok = true;
    for (int32_t i = 0; i < w->n_conv; i++) {
        pthread_join(th[i], NULL);
        if (cr[i].failed) {
            fprintf(stderr, "kvchat bench sessions: conversation %d: %s\n", i, cr[i].message);
            res.ok = false;
        }
        res.prompt += cr[i].prompt;
        res.cached += cr[i].cached;
        res.computed += cr[i].computed;
        res.output += cr[i].output;
    }
    res.wall_s = cli_now_s() - t0;
    kvc_engine_metrics m;
    kvc_engine_get_metrics(e, &m);
    res.steps = m.steps;
    res.step_tokens = m.step_tokens;
    res.bg_tokens = m.bg_tokens;
    res.bg_us = m.bg_us;
    res.busy_us = m.busy_us;
    qsort(ttft, (size_t)total, sizeof(double), cmp_double);
    res.p50 = ttft[(total - 1) / 2];
    res.p99 = ttft[(int32_t)((total - 1) * 0.99 + 0.5)];
    free(ttft);
    free(cr);
    free(th);
    kvc_engine_free(e);
    if (own_dir)
        nftw(tmp, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return res;
}

static void print_row(const char *mode, int32_t n_parallel, const run_result *r)
{
    printf("| %-13s | %8d | %7.2f | %9lld | %9lld | %7.1f%% | %8.1f | %8.1f | %11.1f | %12.1f |\n",
           mode, n_parallel, r->wall_s, (long long)r->prompt, (long long)r->computed,
           100.0 * (double)r->computed / (double)(r->prompt ? r->prompt : 1), r->p50, r->p99,
           (double)r->output / (r->wall_s > 0 ? r->wall_s : 1e-9),
           (double)r->step_tokens / (double)(r->steps ? r->steps : 1));
    fflush(stdout);
}

/* A budget holding every conversation whole, in MiB. */
static int64_t default_budget(kvc_model *m, const cli_common *c, const workload *w,
                              int64_t sys_tokens, int64_t turn_tokens)
{
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    double elem = c->kv_type == KVC_KV_F32 ? 4.0 : c->kv_type == KVC_KV_Q8_0 ? 34.0 / 32.0 : 2.0;
    double block = 2.0 * info.n_layer * info.n_head_kv * info.head_dim * 16 * elem;
    int64_t per_conv = (sys_tokens + (int64_t)w->turns * (turn_tokens + w->reply_tokens + 16) +
                        64) / 16 + 2;
    double bytes = (double)(per_conv * w->n_conv + 64) * block * 1.25;
    return (int64_t)(bytes / 1048576.0) + 1;
}

int cmd_bench_sessions(int argc, char **argv)
{
    cli_common c;
    cli_common_init(&c);
    cli_cache cache = { NULL, 0 };           /* no disk tier unless asked */
    int64_t n_conv = 16, turns = 8, sys_tokens = 500, turn_tokens = 40, reply_tokens = 32;
    int64_t budget = 0;
    cli_parser p;
    cli_parser_init(&p, "bench sessions", argc, argv, groups);
    const char *v;
    int id, r;
    while ((id = cli_next_opt(&p, &v, help)) >= 0) {
        if ((r = cli_cache_apply(&cache, id, v)) == 0)
            r = cli_common_apply(&c, id, v);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        int64_t *dst = id == OPT_CONVERSATIONS ? &n_conv : id == OPT_TURNS ? &turns
                     : id == OPT_SYSTEM_TOKENS ? &sys_tokens : id == OPT_TURN_TOKENS ? &turn_tokens
                     : id == OPT_REPLY_TOKENS ? &reply_tokens : &budget;
        if (!cli_int(cli_opt_name(&p), v, dst == &budget ? 0 : 1, 1 << 20, dst))
            return 2;
    }
    if (id != CLI_END)
        return cli_stop_code(id);
    if (cli_no_operands(&p))
        return 2;
    if (c.n_ctx == 0)
        c.n_ctx = (int32_t)(sys_tokens + turns * (turn_tokens + reply_tokens + 16) + 256);
    kvc_model *m = cli_load_model(&c);
    if (!m)
        return 1;
    workload w = { m, (int32_t)n_conv, (int32_t)turns, (int32_t)reply_tokens, NULL, NULL, cache,
                   cli_model_path(&c) };
    w.system = text_of(m, sys_tokens, 0);
    w.user = calloc((size_t)(n_conv * turns), sizeof(char *));
    for (int64_t i = 0; i < n_conv * turns; i++)
        w.user[i] = text_of(m, turn_tokens, (uint32_t)(i + 1));
    if (budget == 0)
        budget = default_budget(m, &c, &w, sys_tokens, turn_tokens);
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    printf("%s: %lld conversations x %lld turns, %lld-token system prompt, %lld-token messages, "
           "%lld-token replies (greedy); KV budget %lld MiB, %s threads\n\n", info.name,
           (long long)n_conv, (long long)turns, (long long)sys_tokens, (long long)turn_tokens,
           (long long)reply_tokens, (long long)budget, c.n_threads ? "set" : "all");
    printf("| %-13s | %8s | %7s | %9s | %9s | %8s | %8s | %8s | %11s | %12s |\n", "scheduler",
           "parallel", "wall s", "prompt", "computed", "comp/pr", "TTFT p50", "TTFT p99",
           "decode t/s", "tokens/step");
    printf("| ------------- | -------: | ------: | --------: | --------: | -------: | -------: | "
           "-------: | ----------: | -----------: |\n");
    run_result batched = run(&w, &c, (int32_t)n_conv, budget);
    if (batched.ok)
        print_row("batching", (int32_t)n_conv, &batched);
    run_result serial = batched.ok ? run(&w, &c, 1, budget) : (run_result){ 0 };
    if (serial.ok)
        print_row("one at a time", 1, &serial);
    int rc = batched.ok && serial.ok ? 0 : 1;
    if (!rc) {
        int64_t same = 0, total = n_conv * turns;
        for (int64_t i = 0; i < total; i++)
            same += batched.replies[i] && serial.replies[i] &&
                    strcmp(batched.replies[i], serial.replies[i]) == 0;
        printf("\nTTFT in ms from submission (queueing included); decode t/s = tokens generated "
               "by all conversations / wall time.\nbatching: %.2fx the decode throughput, p99 "
               "TTFT %.1fx lower; replies identical in both runs: %lld of %lld\n",
               serial.wall_s > 0 ? (double)batched.output / batched.wall_s /
                                   ((double)serial.output / serial.wall_s) : 0,
               batched.p99 > 0 ? serial.p99 / batched.p99 : 0, (long long)same, (long long)total);
        for (int k = 0; k < 2; k++) {
            const run_result *r = k ? &serial : &batched;
            printf("%s: background canonicalization computed %llu tokens, %.1f%% of the engine's "
                   "compute time\n", k ? "one at a time" : "batching",
                   (unsigned long long)r->bg_tokens,
                   100.0 * (double)r->bg_us / (double)(r->busy_us ? r->busy_us : 1));
        }
        if (same != total)
            rc = 1;
    }
    for (int64_t i = 0; i < n_conv * turns; i++) {
        free(w.user[i]);
        if (batched.replies)
            free(batched.replies[i]);
        if (serial.replies)
            free(serial.replies[i]);
    }
    free(batched.replies);
    free(serial.replies);
    free(w.user);
    free(w.system);
    kvc_model_free(m);
    return rc;
}
