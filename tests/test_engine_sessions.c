/* test_engine_sessions.c - many conversations at once through kvc_engine
 * (DESIGN.md §2, §4).
 *
 *  1. Sharing: 32 conversations with the same 1,000-token system prompt,
 *     submitted by 8 client threads, 3 turns each, interleaved (keyed and
 *     unkeyed). The KV in use is far below 32 separate copies (printed); the
 *     system prompt is computed once; every conversation's replies equal, byte
 *     for byte, its solo run (greedy), whatever ran beside it in the batches.
 *  2. In flight: two requests with the same long new prefix submitted at once:
 *     the prefix is computed once; the second waits and computes its tail.
 *  3. Cancellation: a request cancelled while generating ends DONE
 *     "cancelled" at the next step, and what it computed stays cached.
 *  4. Budget: a request larger than the whole budget fails with a clear
 *     error; requests that fit only one after another wait and all complete.
 * Run it under ThreadSanitizer too (-DKVC_TSAN=ON). */
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "kvchat.h"
#include "test.h"

static char tmpdir[256];

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
static kvc_model *model;
static char *system_prompt;          /* about 1,000 tokens */

static const char *const words[] = {
    "river", "stone", "garden", "lamp", "quiet", "market", "silver", "window", "bread", "north",
    "candle", "forest", "letter", "harbor", "violet", "engine", "paper", "summer", "clock", "salt",
};

/* Text of about n tokens, varied by seed. */
static char *text_of(int n, uint32_t seed)
{
    size_t cap = (size_t)n * 12 + 64, len = 0;
    char *s = malloc(cap);
    int32_t *ids = malloc((size_t)n * 4 + 4096);
    s[0] = 0;
    uint32_t x = seed * 2654435761u + 1;
    for (int k = 1; len + 16 < cap; k++) {
        x = x * 1664525u + 1013904223u;
        len += (size_t)snprintf(s + len, cap - len, "%s ", words[(x >> 8) % 20]);
        if (k % 8 == 0 && kvc_model_tokenize(model, s, len, false, false, ids, (int64_t)n + 1024) >= n)
            break;
    }
    free(ids);
    return s;
}

static kvc_engine *new_engine_ex(int32_t n_parallel, int64_t budget_mib, int32_t n_batch,
                                 int32_t n_ctx, int32_t kv_type)
{
    kvc_engine_params ep = kvc_engine_default_params();
    ep.n_ctx = n_ctx;
    ep.kv_type = kv_type;
    ep.n_parallel = n_parallel;
    ep.n_threads = 2;
    ep.n_batch = n_batch;
    ep.kv_budget_mib = budget_mib;
    ep.max_queue = 64;
    kvc_engine *e = NULL;
    char err[512];
    int rc = kvc_engine_new(model, &ep, &e, err, sizeof(err));
    CHECKF(rc == KVC_OK, "engine: %s", err);
    return e;
}

static kvc_engine *new_engine(int32_t n_parallel, int64_t budget_mib, int32_t n_batch)
{
    return new_engine_ex(n_parallel, budget_mib, n_batch, 2048, KVC_KV_F16);
}

typedef struct result {
    int            status;            /* KVC_OK or the ERROR event's */
    char          *reply;
    kvc_chat_stats stats;
    char           message[512];
    bool           stream_ok;         /* the TEXT pieces add up to the reply */
} result;

/* Read r's events to the end. No CHECK here: client threads call it (the
 * counters of test.h are not atomic); callers check the result. */
static result finish(kvc_request *r)
{
    result res = { .status = r ? KVC_OK : KVC_ERR_INVALID_ARG, .stream_ok = true };
    size_t cap = 256, len = 0;
    char *streamed = calloc(1, cap);
    kvc_event ev;
    while (r && kvc_request_next(r, &ev, -1)) {
        if (ev.type == KVC_EVENT_TEXT) {
            while (len + ev.len + 1 > cap)
                streamed = realloc(streamed, cap *= 2);
            memcpy(streamed + len, ev.text, ev.len);
            streamed[len += ev.len] = 0;
            kvc_event_clear(&ev);
            continue;
        }
        if (ev.type == KVC_EVENT_DONE) {
            res.reply = ev.text;
            res.stats = ev.stats;
            if (strcmp(ev.stats.finish_reason, "cancelled") != 0)
                res.stream_ok = strcmp(streamed, ev.text) == 0;
        } else {
            res.status = ev.status;
            snprintf(res.message, sizeof(res.message), "%s", ev.message);
        }
        break;
    }
    free(streamed);
    kvc_request_free(r);
    return res;
}

static kvc_request *submit(kvc_engine *e, const kvc_chat_message *msgs, size_t n,
                           const char *prompt, const char *key, int32_t max_tokens)
{
    kvc_request_params rp = { .messages = msgs, .n_messages = n, .prompt = prompt,
                              .session_key = key, .chat = kvc_chat_default_params() };
    rp.chat.max_tokens = max_tokens;
    rp.chat.sampling.temperature = 0;
    char err[512];
    return kvc_engine_submit(e, &rp, NULL, err, sizeof(err));   /* NULL: finish reports it */
}

/* ====================================================== 32 conversations */

#define N_CONV   32
#define N_TURNS  3
#define N_CLIENT 8

typedef struct conversation {
    kvc_chat_message msgs[2 * N_TURNS + 1];
    char            *owned[2 * N_TURNS + 1];
    int              n;
    char             key[32];
    char            *replies[N_TURNS];
    kvc_chat_stats   stats[N_TURNS];
    result           failed;          /* the first failed turn (status != 0), checked by main */
} conversation;

static conversation convs[N_CONV];
static kvc_engine *shared_engine;
static pthread_barrier_t after_first, measured;

/* Client thread c: conversations c, c + 8, ...; one turn of each in turn.
 * After the first turns it waits while the main thread measures. */
static void *client(void *arg)
{
    int c = (int)(intptr_t)arg;
    for (int t = 0; t < N_TURNS; t++) {
        if (t == 1) {
            pthread_barrier_wait(&after_first);
            pthread_barrier_wait(&measured);
        }
        for (int i = c; i < N_CONV; i += N_CLIENT) {
            conversation *cv = &convs[i];
            cv->owned[cv->n] = text_of(6 + (i * 7 + t * 3) % 20, (uint32_t)(i * 100 + t));
            cv->msgs[cv->n] = (kvc_chat_message){ "user", cv->owned[cv->n] };
            cv->n++;
            result r = finish(submit(shared_engine, cv->msgs, (size_t)cv->n, NULL,
                                     cv->key[0] ? cv->key : NULL, 8));
            if ((r.status || !r.stream_ok) && !cv->failed.status) {
                cv->failed = r;
                cv->failed.status = r.status ? r.status : -100 - t;
            }
            cv->replies[t] = r.reply ? r.reply : strdup("");
            cv->stats[t] = r.stats;
            cv->owned[cv->n] = strdup(cv->replies[t]);
            cv->msgs[cv->n] = (kvc_chat_message){ "assistant", cv->owned[cv->n] };
            cv->n++;
        }
    }
    return NULL;
}

/* Blocks 32 separate copies of the conversations (as of turn t) would take,
 * and blocks of their own beyond the shared system prompt. */
static void copies_of(int t, int64_t sys_tokens, int64_t *copies, int64_t *tails)
{
    *copies = *tails = 0;
    for (int i = 0; i < N_CONV; i++) {
        const kvc_chat_stats *s = &convs[i].stats[t];
        int64_t n = s->prompt_tokens + s->output_tokens + 1;
        *copies += (n + 15) / 16;
        *tails += (n - sys_tokens / 16 * 16 + 15) / 16 + 1;   /* + a copied-on-write block */
    }
}

static void test_shared_prompt(void)
{
    shared_engine = new_engine(16, 0, 256);
    if (!shared_engine)
        return;
    for (int i = 0; i < N_CONV; i++) {
        convs[i].owned[0] = strdup(system_prompt);
        convs[i].msgs[0] = (kvc_chat_message){ "system", convs[i].owned[0] };
        convs[i].n = 1;
        if (i % 2 == 0)                      /* half keyed; the tree alone finds the rest */
            snprintf(convs[i].key, sizeof(convs[i].key), "conv-%d", i);
    }
    int32_t ids[4096];
    int64_t sys_tokens = kvc_model_tokenize(model, system_prompt, strlen(system_prompt), true,
                                            false, ids, 4096);
    int64_t sys_blocks = (sys_tokens + 15) / 16, copies, tails, first_computed = 0;
    double t0 = now_s();
    pthread_barrier_init(&after_first, NULL, N_CLIENT + 1);
    pthread_barrier_init(&measured, NULL, N_CLIENT + 1);
    pthread_t th[N_CLIENT];
    for (int c = 0; c < N_CLIENT; c++)
        pthread_create(&th[c], NULL, client, (void *)(intptr_t)c);
    /* after the first turns: 32 conversations, one system prompt */
    pthread_barrier_wait(&after_first);
    kvc_engine_metrics m;
    kvc_engine_get_metrics(shared_engine, &m);
    copies_of(0, sys_tokens, &copies, &tails);
    double mib = 1048576.0;
    printf("  32 conversations sharing a %lld-token system prompt, after their first turns:\n"
           "    KV in use %.2f MiB (%lld blocks of %lld bytes); 32 separate copies: %.2f MiB "
           "(%lld blocks), %.1fx more\n", (long long)sys_tokens,
           (double)m.blocks_used * (double)m.block_bytes / mib, (long long)m.blocks_used,
           (long long)m.block_bytes, (double)copies * (double)m.block_bytes / mib,
           (long long)copies, (double)copies / (double)(m.blocks_used ? m.blocks_used : 1));
    CHECKF(m.blocks_used * 8 < copies, "%lld blocks in use, 32 copies take %lld",
           (long long)m.blocks_used, (long long)copies);
    /* stored once: the system prompt's blocks plus each conversation's own */
    CHECKF(m.blocks_used <= sys_blocks + tails, "%lld blocks in use > %lld of the system prompt "
           "+ %lld of the conversations' own", (long long)m.blocks_used, (long long)sys_blocks,
           (long long)tails);
    CHECK(m.running == 0 && m.queue_depth == 0);
    pthread_barrier_wait(&measured);
    for (int c = 0; c < N_CLIENT; c++)
        pthread_join(th[c], NULL);
    pthread_barrier_destroy(&after_first);
    pthread_barrier_destroy(&measured);
    double secs = now_s() - t0;
    kvc_engine_get_metrics(shared_engine, &m);
    copies_of(N_TURNS - 1, sys_tokens, &copies, &tails);
    printf("    after %d turns each (8 client threads, %.1f s): KV in use %.2f MiB (%lld blocks) "
           "vs %.2f MiB for copies\n    prompt tokens %llu, cached %llu (%.1f%%), computed %llu; "
           "%llu steps, %.1f tokens per step\n", N_TURNS, secs,
           (double)m.blocks_used * (double)m.block_bytes / mib, (long long)m.blocks_used,
           (double)copies * (double)m.block_bytes / mib, (unsigned long long)m.prompt_tokens,
           (unsigned long long)m.cached_tokens, 100.0 * (double)m.cached_tokens /
           (double)(m.prompt_tokens ? m.prompt_tokens : 1), (unsigned long long)m.computed_tokens,
           (unsigned long long)m.steps, (double)m.step_tokens / (double)(m.steps ? m.steps : 1));
    CHECKF(m.blocks_used <= sys_blocks + tails, "%lld blocks in use > %lld of the system prompt "
           "+ %lld of the conversations' own", (long long)m.blocks_used, (long long)sys_blocks,
           (long long)tails);
    /* computed once: all first turns together computed the system prompt once
     * plus their own tails (each well under 100 tokens) */
    for (int i = 0; i < N_CONV; i++)
        first_computed += convs[i].stats[0].computed_tokens;
    CHECKF(first_computed < sys_tokens + N_CONV * 100, "first turns computed %lld tokens; the "
           "system prompt has %lld", (long long)first_computed, (long long)sys_tokens);
    for (int i = 0; i < N_CONV; i++)
        CHECKF(convs[i].failed.status == 0, "conversation %d: %d %s (stream %s)", i,
               convs[i].failed.status, convs[i].failed.message,
               convs[i].failed.stream_ok ? "ok" : "differs from the reply");
    CHECK_EQ_INT(m.requests, N_CONV * N_TURNS);
    CHECK_EQ_INT(m.requests_failed, 0);
    CHECK(m.running == 0 && m.queue_depth == 0);
    CHECKF(m.sessions >= N_CONV, "%d sessions", m.sessions);
    CHECKF(m.step_tokens > m.steps * 2, "no batching: %llu tokens in %llu steps",
           (unsigned long long)m.step_tokens, (unsigned long long)m.steps);
    for (int i = 0; i < N_CONV; i++)
        for (int t = 1; t < N_TURNS; t++) {
            const kvc_chat_stats *p = &convs[i].stats[t - 1], *s = &convs[i].stats[t];
            CHECKF(s->cached_tokens >= p->prompt_tokens + p->output_tokens - 16,
                   "conversation %d turn %d: cached %d of the previous %d + %d", i, t,
                   s->cached_tokens, p->prompt_tokens, p->output_tokens);
        }
    kvc_engine_free(shared_engine);

    /* every conversation alone (one session, one turn per batch) */
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 2048;
    cp.n_threads = 2;
    kvc_context *ctx = NULL;
    char err[512];
    CHECKF(kvc_context_new(model, &cp, &ctx, err, sizeof(err)) == KVC_OK, "%s", err);
    kvc_session *s = ctx ? kvc_session_new(ctx, 0, NULL, err, sizeof(err)) : NULL;
    int differ = 0;
    for (int i = 0; s && i < N_CONV; i++) {
        kvc_session_reset(s);
        for (int t = 0; t < N_TURNS; t++) {
            kvc_chat_params p = kvc_chat_default_params();
            p.max_tokens = 8;
            p.sampling.temperature = 0;
            char *reply = NULL;
            kvc_chat_stats st;
            int rc = kvc_session_chat(s, convs[i].msgs, (size_t)(2 + 2 * t), &p, NULL, NULL, &reply,
                                      &st, err, sizeof(err));
            CHECKF(rc == KVC_OK, "solo %d: %s", i, err);
            if (rc == KVC_OK && strcmp(reply, convs[i].replies[t]) != 0 && differ++ < 3)
                CHECKF(0, "conversation %d turn %d: engine '%s', solo '%s'", i, t,
                       convs[i].replies[t], reply);
            free(reply);
        }
    }
    printf("    all %d replies equal their solo runs: %s\n", N_CONV * N_TURNS,
           differ ? "NO" : "yes");
    kvc_session_free(s);
    kvc_context_free(ctx);
    for (int i = 0; i < N_CONV; i++) {
        for (int k = 0; k < convs[i].n; k++)
            free(convs[i].owned[k]);
        for (int t = 0; t < N_TURNS; t++)
            free(convs[i].replies[t]);
    }
}

/* ================================================== in-flight prefixes */

static void test_in_flight(void)
{
    kvc_engine *e = new_engine(4, 0, 32);   /* 32-token steps: a long prefill */
    if (!e)
        return;
    char *prefix = text_of(600, 777);
    size_t pl = strlen(prefix);
    char *a = malloc(pl + 64), *b = malloc(pl + 64);
    snprintf(a, pl + 64, "%sthe first question", prefix);
    snprintf(b, pl + 64, "%sand now a rather different one", prefix);
    kvc_request *ra = submit(e, NULL, 0, a, NULL, 4), *rb = submit(e, NULL, 0, b, NULL, 4);
    result x = finish(ra), y = finish(rb);
    CHECKF(x.status == KVC_OK && y.status == KVC_OK, "%s %s", x.message, y.message);
    int32_t ids[4096];
    int64_t np = kvc_model_tokenize(model, prefix, pl, true, false, ids, 4096);
    int64_t both = x.stats.computed_tokens + y.stats.computed_tokens;
    int64_t tails = x.stats.prompt_tokens + y.stats.prompt_tokens - 2 * np;
    printf("  in flight: a %lld-token prefix, two requests at once: computed %d + %d tokens "
           "(prefix once + tails %lld); cached %d and %d\n", (long long)np,
           x.stats.computed_tokens, y.stats.computed_tokens, (long long)tails,
           x.stats.cached_tokens, y.stats.cached_tokens);
    /* the prefix's full blocks once; the block it ends in may be computed by both */
    CHECKF(both <= np + tails + 16, "the prefix was computed twice: %lld tokens", (long long)both);
    CHECKF(y.stats.cached_tokens >= np / 16 * 16, "the second request cached only %d of %lld",
           y.stats.cached_tokens, (long long)np);
    CHECKF(y.stats.computed_tokens <= y.stats.prompt_tokens - np + 16,
           "the second computed %d tokens, its tail has %lld", y.stats.computed_tokens,
           (long long)(y.stats.prompt_tokens - np));
    kvc_engine_metrics m;
    kvc_engine_get_metrics(e, &m);
    CHECK_EQ_INT(m.computed_tokens, (uint64_t)both);
    free(x.reply);
    free(y.reply);
    free(a);
    free(b);
    free(prefix);
    kvc_engine_free(e);
}

/* ======================================================= cancellation */

static void test_cancel(void)
{
    kvc_engine *e = new_engine(2, 0, 64);
    if (!e)
        return;
    char *prompt = text_of(200, 4242);
    kvc_request *r = submit(e, NULL, 0, prompt, "cancel-me", 1500);
    kvc_event ev;
    int texts = 0;
    while (kvc_request_next(r, &ev, -1) && ev.type == KVC_EVENT_TEXT) {
        kvc_event_clear(&ev);
        if (++texts == 3)
            kvc_request_cancel(r);
    }
    CHECK_EQ_INT(ev.type, KVC_EVENT_DONE);
    if (ev.type == KVC_EVENT_DONE) {
        CHECKF(strcmp(ev.stats.finish_reason, "cancelled") == 0, "finish %s",
               ev.stats.finish_reason);
        /* not a count that depends on how fast the client read its events:
         * the engine may run ahead of a slow reader; it must not finish */
        CHECKF(ev.stats.output_tokens < 1500, "a cancelled request generated all %d tokens",
               ev.stats.output_tokens);
    }
    kvc_event_clear(&ev);
    kvc_request_free(r);
    /* what it computed stays: the same prompt again, same session, is all
     * cached (the reply's partial last block is the session's: the tree
     * holds full blocks) */
    result again = finish(submit(e, NULL, 0, prompt, "cancel-me", 2));
    CHECK(again.status == KVC_OK);
    CHECKF(again.stats.cached_tokens == again.stats.prompt_tokens - 1,
           "after a cancel: cached %d of %d", again.stats.cached_tokens, again.stats.prompt_tokens);
    free(again.reply);
    free(prompt);
    kvc_engine_free(e);
}

/* ============================================================= budget */

static void test_budget(void)
{
    /* tiny (2 layers, 2 KV heads of 16) in f32: 16 tokens x 2 layers x 2 (K, V)
     * x 2 heads x 16 x 4 bytes = 8 KiB a block; 1 MiB holds 128 blocks */
    kvc_engine *e = new_engine_ex(4, 1, 64, 4096, KVC_KV_F32);
    if (!e)
        return;
    kvc_engine_metrics m;
    kvc_engine_get_metrics(e, &m);
    CHECK_EQ_INT(m.block_bytes, 8192);
    CHECK_EQ_INT(m.blocks_total, 128);
    char *big = text_of(1900, 5);
    result r = finish(submit(e, NULL, 0, big, NULL, 200));
    CHECK_EQ_INT(r.status, KVC_ERR_KV_FULL);
    CHECKF(strstr(r.message, "KV cache holds 2032 tokens"), "message: %s", r.message);
    free(r.reply);
    /* four requests of ~700 tokens (47 blocks with their replies): two fit at
     * once; the others wait for room, then run */
    kvc_request *q[4];
    char *p[4];
    for (int i = 0; i < 4; i++) {
        p[i] = text_of(700, (uint32_t)(900 + i));
        q[i] = submit(e, NULL, 0, p[i], NULL, 40);
    }
    int max_running = 0;
    for (int i = 0; i < 50; i++) {
        kvc_engine_get_metrics(e, &m);
        if (m.running > max_running)
            max_running = m.running;
        CHECKF(m.blocks_used <= m.blocks_total, "%lld blocks used of %lld",
               (long long)m.blocks_used, (long long)m.blocks_total);
        usleep(2000);
    }
    for (int i = 0; i < 4; i++) {
        result x = finish(q[i]);
        CHECKF(x.status == KVC_OK, "request %d: %s", i, x.message);
        free(x.reply);
        free(p[i]);
    }
    kvc_engine_get_metrics(e, &m);
    CHECKF(max_running <= 2, "%d requests ran at once in a budget for two", max_running);
    CHECKF(m.blocks_evicted > 0, "nothing evicted (%lld of %lld blocks used)",
           (long long)m.blocks_used, (long long)m.blocks_total);
    CHECK_EQ_INT(m.requests, 4);
    CHECK_EQ_INT(m.requests_failed, 1);
    free(big);
    kvc_engine_free(e);
}

/* ================================================= context shift (engine) */

/* kvc_engine_params.overflow = KVC_OVERFLOW_SHIFT: a conversation that
 * outgrows a 256-token context keeps going; the oldest turns are dropped, the
 * system prompt kept, and the kept turns' K/V moved rather than recomputed.
 * Keyed, and unkeyed (key NULL: its session is found by the tokens, which no
 * longer begin with the session's last prompt once a turn is dropped). */
static void test_overflow_shift(const char *key)
{
    kvc_engine_params ep = kvc_engine_default_params();
    ep.n_ctx = 256;
    ep.n_parallel = 2;
    ep.n_threads = 2;
    ep.n_batch = 64;
    ep.overflow = KVC_OVERFLOW_SHIFT;
    kvc_engine *e = NULL;
    char err[512];
    CHECKF(kvc_engine_new(model, &ep, &e, err, sizeof(err)) == KVC_OK, "engine: %s", err);
    if (!e)
        return;
    kvc_chat_message msgs[64];
    char *owned[64] = { 0 };
    int n = 0, shifted = 0, moved = 0;
    msgs[n++] = (kvc_chat_message){ "system", "You are a helpful assistant." };
    for (int t = 0; t < 14; t++) {
        owned[n] = text_of(20, 100 + (uint32_t)t);
        msgs[n] = (kvc_chat_message){ "user", owned[n] };
        n++;
        result r = finish(submit(e, msgs, (size_t)n, NULL, key, 16));
        CHECKF(r.status == KVC_OK, "turn %d: %s", t, r.message);
        if (r.status) {
            free(r.reply);
            break;
        }
        CHECK(r.stats.prompt_tokens + 16 <= 256);
        if (r.stats.dropped_tokens > 0) {
            shifted++;
            moved += r.stats.computed_tokens < r.stats.prompt_tokens / 3;
        }
        owned[n] = r.reply;
        msgs[n] = (kvc_chat_message){ "assistant", owned[n] };
        n++;
    }
    printf("  context shift, %s: %d turns shifted, %d of them computing a third of the prompt or "
           "less\n", key ? "keyed" : "unkeyed", shifted, moved);
    CHECKF(shifted >= 4, "only %d turns overflowed", shifted);
    CHECKF(moved >= shifted - 1, "%d of %d shifted turns reused the moved KV", moved, shifted);
    for (int i = 0; i < n; i++)
        free(owned[i]);
    kvc_engine_free(e);
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvc_test_engine_sessions_XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    char path[512], err[512];
    snprintf(path, sizeof(path), "%s/tiny.gguf", tmpdir);
    kvc_gen_params g;
    CHECK(kvc_gen_preset("tiny", &g) == KVC_OK);
    g.ftype = "f16";
    CHECKF(kvc_gen_write(&g, path, err, sizeof(err)) == KVC_OK, "%s", err);
    CHECKF(kvc_model_load(path, NULL, &model, err, sizeof(err)) == KVC_OK, "%s", err);
    if (model) {
        system_prompt = text_of(1000, 1);
        test_shared_prompt();
        test_in_flight();
        test_cancel();
        test_budget();
        test_overflow_shift("shift-conv");
        test_overflow_shift(NULL);
        free(system_prompt);
    }
    kvc_model_free(model);
    unlink(path);
    rmdir(tmpdir);
    return test_done("test_engine_sessions");
}
