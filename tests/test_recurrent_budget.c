/* test_recurrent_budget.c - a hybrid recurrent model's live states count in
 * the KV budget (issue 32): through kvc_engine, on a generated qwen35 model
 * whose states (about 0.8 MiB a sequence) are large beside its K/V blocks,
 * eight conversations one after another under --kv-budget 4 MiB. The pool
 * plus the states held must stay within the budget (before: every idle
 * session kept its state beside the pool, 8 states + the pool), and a
 * conversation whose state was let go continues from its snapshot with the
 * reply a cold run gives. */
#include "kvchat.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BUDGET_MIB 4
#define N_CONV     8

static kvc_model *model;

static char *run(kvc_engine *e, const kvc_chat_message *msgs, size_t n, const char *key,
                 bool cold, kvc_chat_stats *st)
{
    kvc_request_params rp = { .messages = msgs, .n_messages = n, .session_key = key,
                              .chat = kvc_chat_default_params() };
    rp.chat.max_tokens = 8;
    rp.chat.sampling.temperature = 0;
    rp.chat.no_cache = cold;
    char err[512];
    kvc_request *r = kvc_engine_submit(e, &rp, NULL, err, sizeof(err));
    CHECKF(r != NULL, "submit: %s", err);
    char *reply = NULL;
    kvc_event ev;
    while (r && kvc_request_next(r, &ev, -1)) {
        if (ev.type == KVC_EVENT_TEXT) {
            kvc_event_clear(&ev);
            continue;
        }
        CHECKF(ev.type == KVC_EVENT_DONE, "request failed: %s", ev.message);
        if (ev.type == KVC_EVENT_DONE) {
            reply = ev.text;
            if (st)
                *st = ev.stats;
        } else {
            kvc_event_clear(&ev);
        }
        break;
    }
    kvc_request_free(r);
    return reply ? reply : strdup("");
}

/* The reply of request r (events read as they come; NULL on failure). */
static char *reply_of(kvc_request *r, bool *done)
{
    kvc_event ev;
    while (kvc_request_next(r, &ev, 0)) {
        if (ev.type == KVC_EVENT_TEXT) {
            kvc_event_clear(&ev);
            continue;
        }
        CHECKF(ev.type == KVC_EVENT_DONE, "request failed: %s", ev.message);
        *done = true;
        if (ev.type == KVC_EVENT_DONE)
            return ev.text;
        kvc_event_clear(&ev);
        return NULL;
    }
    return NULL;
}

/* A turn that waits for a prefix another turn is computing keeps its
 * session's live state (kvc_turn_prepare has changed nothing yet), and
 * counts. With --parallel 2: conversation "a" has run a turn; then, in one
 * pass, "b" asks a's next turn (a fork: b computes the new message,
 * publishing its blocks as pending), "a" asks the same (it waits for b's
 * blocks, holding its state) and "c" starts: it must wait for a state to
 * be let go, not make a third (before: 3 live states while b computed).
 * Every reply equals a cold run's. */
static void test_waiting_turn_state(void)
{
    kvc_engine_params ep = kvc_engine_default_params();
    ep.n_ctx = 2048;
    ep.n_parallel = 2;
    ep.n_batch = 16;                         /* b's message takes many steps */
    ep.kv_budget_mib = 64;
    ep.n_threads = 1;
    ep.cache_disk_mib = 0;
    kvc_engine *e = NULL;
    char err[512];
    CHECKF(kvc_engine_new(model, &ep, &e, err, sizeof(err)) == KVC_OK, "engine: %s", err);
    if (!e)
        return;
    static char first[600], fork[4000], other[600];
    size_t len = 0;
    for (int w = 0; w < 60; w++)
        len += (size_t)snprintf(first + len, sizeof(first) - len, "w%d ", (w * 7) % 97);
    len = 0;
    for (int w = 0; w < 500; w++)
        len += (size_t)snprintf(fork + len, sizeof(fork) - len, "f%d ", (w * 11) % 89);
    len = 0;
    for (int w = 0; w < 60; w++)
        len += (size_t)snprintf(other + len, sizeof(other) - len, "o%d ", (w * 5) % 83);
    kvc_chat_message msgs[4] = { { .role = "system", .content = "You are terse." },
                                 { .role = "user", .content = first } };
    char *r1 = run(e, msgs, 2, "a", false, NULL);
    msgs[2] = (kvc_chat_message){ .role = "assistant", .content = r1 };
    msgs[3] = (kvc_chat_message){ .role = "user", .content = fork };
    const kvc_chat_message c_msgs[2] = { msgs[0], { .role = "user", .content = other } };
    kvc_request_params rp[3];
    const char *const keys[3] = { "b", "a", "c" };
    for (int i = 0; i < 3; i++) {
        rp[i] = (kvc_request_params){ .messages = i < 2 ? msgs : c_msgs, .n_messages = i < 2 ? 4 : 2,
                                      .session_key = keys[i], .chat = kvc_chat_default_params() };
        rp[i].chat.max_tokens = 8;
        rp[i].chat.sampling.temperature = 0;
    }
    kvc_request *rq[3] = { NULL };
    CHECKF(kvc_engine_submit_all(e, rp, 3, rq, err, sizeof(err)) == KVC_OK, "%s", err);
    char *got[3] = { NULL };
    bool done[3] = { false };
    int64_t most = 0, polls = 0;
    for (int left = rq[0] ? 3 : 0; left > 0 && polls < 200000; polls++) {
        kvc_engine_metrics m;
        kvc_engine_get_metrics(e, &m);
        most = m.live_states > most ? m.live_states : most;
        left = 0;
        for (int i = 0; i < 3; i++) {
            if (!done[i])
                got[i] = reply_of(rq[i], &done[i]);
            left += !done[i];
        }
        nanosleep(&(struct timespec){ 0, 100000 }, NULL);
    }
    printf("  a turn waiting for a prefix: at most %lld live states (--parallel %d) in %lld polls\n",
           (long long)most, ep.n_parallel, (long long)polls);
    CHECKF(most <= ep.n_parallel, "%lld live states, %d parallel", (long long)most, ep.n_parallel);
    for (int i = 0; i < 3; i++) {
        char *cold = run(e, rp[i].messages, rp[i].n_messages, NULL, true, NULL);
        CHECKF(got[i] && strcmp(got[i], cold) == 0, "request %s: warm \"%s\" != cold \"%s\"", keys[i],
               got[i] ? got[i] : "(none)", cold);
        free(cold);
        free(got[i]);
        kvc_request_free(rq[i]);
    }
    free(r1);
    kvc_engine_free(e);
}

int main(void)
{
    char dir[] = "/tmp/kvc_recurrent_budget_XXXXXX", path[256], err[512];
    if (!mkdtemp(dir))
        return 1;
    snprintf(path, sizeof(path), "%s/q35.gguf", dir);
    kvc_gen_params g;
    CHECK(kvc_gen_preset("tiny-qwen35", &g) == KVC_OK);
    g.ssm_n_head = 16, g.ssm_d_state = 64;       /* 3 GDN layers of 16 x 64 x 64 floats */
    CHECKF(kvc_gen_write(&g, path, err, sizeof(err)) == KVC_OK, "%s", err);
    CHECKF(kvc_model_load(path, NULL, &model, err, sizeof(err)) == KVC_OK, "%s", err);
    if (!model)
        return test_done("test_recurrent_budget");

    kvc_engine_params ep = kvc_engine_default_params();
    ep.n_ctx = 1024;
    ep.n_parallel = 1;
    ep.n_threads = 1;
    ep.kv_budget_mib = BUDGET_MIB;
    ep.cache_disk_mib = 0;
    kvc_engine *e = NULL;
    CHECKF(kvc_engine_new(model, &ep, &e, err, sizeof(err)) == KVC_OK, "engine: %s", err);

    static char user[N_CONV][600], key[N_CONV][16];
    kvc_chat_message msgs[N_CONV][4];
    char *reply[N_CONV];
    for (int i = 0; i < N_CONV; i++) {
        size_t len = 0;
        for (int w = 0; w < 60; w++)
            len += (size_t)snprintf(user[i] + len, sizeof(user[i]) - len, "w%d ", (w * 7 + i * 13) % 97);
        snprintf(key[i], sizeof(key[i]), "conv%d", i);
        msgs[i][0] = (kvc_chat_message){ .role = "system", .content = "You are terse." };
        msgs[i][1] = (kvc_chat_message){ .role = "user", .content = user[i] };
        reply[i] = run(e, msgs[i], 2, key[i], false, NULL);
    }
    kvc_engine_metrics m;
    kvc_engine_get_metrics(e, &m);
    const int64_t pool = m.blocks_total * m.block_bytes;
    printf("  pool %.2f MiB + %lld live states (%.2f MiB) of a %d MiB budget; %lld snapshots\n",
           (double)pool / 1048576.0, (long long)m.live_states,
           (double)m.live_state_bytes / 1048576.0, BUDGET_MIB, (long long)m.snapshots);
    CHECK(m.live_states >= 1);
    CHECKF(m.live_states <= ep.n_parallel, "%lld live states, %d parallel",
           (long long)m.live_states, ep.n_parallel);
    CHECKF(pool + m.live_state_bytes <= (int64_t)BUDGET_MIB << 20,
           "pool %lld + states %lld bytes > budget %d MiB", (long long)pool,
           (long long)m.live_state_bytes, BUDGET_MIB);

    /* the conversation before the last goes on: its state was let go when
     * the last one ran; from its snapshot (still in the pool, which holds
     * about three), with a cold run's reply */
    const int c = N_CONV - 2;
    msgs[c][2] = (kvc_chat_message){ .role = "assistant", .content = reply[c] };
    msgs[c][3] = (kvc_chat_message){ .role = "user", .content = "and then?" };
    kvc_chat_stats st;
    char *warm = run(e, msgs[c], 4, key[c], false, &st);
    char *cold = run(e, msgs[c], 4, NULL, true, NULL);
    printf("  conversation %d, turn 2: %d of %d prompt tokens cached\n", c, st.cached_tokens,
           st.prompt_tokens);
    CHECK(st.cached_tokens > 60);
    CHECKF(strcmp(warm, cold) == 0, "warm \"%s\" != cold \"%s\"", warm, cold);
    free(warm);
    free(cold);
    for (int i = 0; i < N_CONV; i++)
        free(reply[i]);
    kvc_engine_free(e);
    test_waiting_turn_state();
    kvc_model_free(model);
    unlink(path);
    rmdir(dir);
    return test_done("test_recurrent_budget");
}
