/* test_preempt.c - sequences that grow, and preemption when the pool runs dry
 * mid-decode (DESIGN.md §5), on a tiny generated model.
 *
 * Six conversations whose prompts and replies together need about twice the
 * blocks of the pool run at once, scheduled as the engine does: admit in
 * order (a request that does not fit waits while others run), make room for
 * the running ones' next tokens before each step (kvc_turns_grow: the newest
 * gives its blocks back and waits), step. Every reply, greedy or seeded, must
 * equal bitwise the reply of the same request run alone on a pool of its own;
 * preemptions must have happened. Then the same with the disk tier under the
 * tree: the preempted blocks go down and come back from disk. */
#include <unistd.h>

#include "session.h"
#include "test.h"

static char tmpdir[256], model_path[512];

#define N_REQ 6
#define MAX_OUT 48

typedef struct req {
    int32_t         prompt[64];
    int32_t         n_prompt;
    kvc_chat_params p;
    kvc_session    *s;
    kvc_turn       *t;
    int64_t         reply_n;           /* tokens after the prompt, at the end */
    int32_t         reply[MAX_OUT + 1];
    bool            done;
} req;

static void make_requests(req *r, const kvc_model *m)
{
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (int i = 0; i < N_REQ; i++) {
        r[i] = (req){ .n_prompt = 20 + 7 * i };
        for (int k = 0; k < r[i].n_prompt; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            /* a shared start (blocks in common), then each its own */
            r[i].prompt[k] = k < 16 ? 100 + k
                                    : (int32_t)(x % (uint64_t)(m->hp.n_vocab - 300)) + 260;
        }
        r[i].p = kvc_chat_default_params();
        r[i].p.max_tokens = MAX_OUT;
        r[i].p.sampling.temperature = i % 2 ? 0.9f : 0.0f;
        r[i].p.sampling.seed = 1000 + (uint64_t)i;
    }
}

static void finish(req *r)
{
    kvc_chat_stats st;
    kvc_err e = { 0 };
    CHECKF(kvc_turn_end(r->t, NULL, &st, &e) == KVC_OK, "%s", e.msg);
    r->t = NULL;
    const int32_t *v = r->s->toks.v;
    r->reply_n = KVC_MIN(r->s->toks.n - r->n_prompt, MAX_OUT + 1);
    memcpy(r->reply, v + r->n_prompt, (size_t)r->reply_n * sizeof(int32_t));
    r->done = true;
}

/* As the engine's: evict, then let finished conversations' sessions go. */
static req *reqs;
static int n_reqs;

static bool room(kvc_context *c, int64_t n_free, void *user)
{
    for (int i = 0; !kvc_context_make_room(c, n_free); i++) {
        if (i == n_reqs)
            return false;
        if (reqs[i].done)
            kvc_session_drop_kv(reqs[i].s);
    }
    return true;
}

/* Run every request to its end on c, as the engine schedules. Returns the
 * preemptions. */
static int run_all(kvc_context *c, req *r, int n)
{
    kvc_turn *running[N_REQ];
    int order[N_REQ], n_wait = n, n_run = 0, preempted = 0;
    reqs = r;
    n_reqs = n;
    for (int i = 0; i < n; i++) {
        kvc_err e = { 0 };
        CHECKF(kvc_turn_new(r[i].s, r[i].prompt, r[i].n_prompt, KVC_TURN_COMPLETION, &r[i].p, NULL,
                            NULL, kvc_time_us(), &r[i].t, &e) == KVC_OK, "%s", e.msg);
        order[i] = i;
    }
    for (int guard = 0; (n_wait > 0 || n_run > 0) && guard < 100000; guard++) {
        c->growth_reserve = n_run;
        while (n_wait > 0) {                                  /* admit, first come first served */
            req *x = &r[order[0]];
            kvc_err e = { 0 };
            int rc = kvc_turn_prepare(x->t, room, NULL, &e);
            CHECKF(rc >= 0, "prepare: %d %s", rc, e.msg);
            if (rc == KVC_TURN_WAIT_PREFIX && n_run > 0)
                break;                                        /* a running one computes it */
            if (rc != KVC_OK) {
                CHECKF(n_run > 0, "nothing runs and request %d does not fit: %s", order[0], e.msg);
                if (n_run == 0)
                    return preempted;
                break;
            }
            running[n_run++] = x->t;
            memmove(order, order + 1, (size_t)--n_wait * sizeof(int));
        }
        int32_t kept = kvc_turns_grow(c, running, n_run, room, NULL);
        for (int i = n_run - 1; i >= kept; i--) {             /* back to the front, in order */
            for (int j = 0; j < n; j++)
                if (r[j].t == running[i]) {
                    memmove(order + 1, order, (size_t)n_wait++ * sizeof(int));
                    order[0] = j;
                }
            preempted++;
        }
        n_run = kept;
        if (n_run == 0)
            continue;
        kvc_err e = { 0 };
        int k = kvc_turns_step(c, running, n_run, 0, &e);
        CHECKF(k > 0, "step: %d %s", k, e.msg);
        if (k <= 0)
            break;
        int32_t still = 0;
        for (int32_t i = 0; i < n_run; i++) {
            if (kvc_turn_phase(running[i]) != KVC_TURN_DONE) {
                running[still++] = running[i];
                continue;
            }
            for (int j = 0; j < n; j++)
                if (r[j].t == running[i])
                    finish(&r[j]);
        }
        n_run = still;
    }
    return preempted;
}

static void test_preemption(kvc_model *m, bool disk)
{
    req solo[N_REQ], all[N_REQ];
    make_requests(solo, m);
    make_requests(all, m);
    char err[512];
    for (int i = 0; i < N_REQ; i++) {                         /* alone, on a pool of its own */
        kvc_context *c = test_new_context(m, 256, 32, 1, 64);
        solo[i].s = c ? kvc_session_new(c, 0, NULL, err, sizeof(err)) : NULL;
        if (!solo[i].s)
            return;
        run_all(c, &solo[i], 1);
        kvc_session_free(solo[i].s);
        kvc_context_free(c);
    }
    /* together: 6 prompts of 2-4 blocks and replies of up to 3 more, on 14 */
    kvc_context *c = test_new_context(m, 256, 32, N_REQ, 14);
    if (!c)
        return;
    if (disk) {
        char dir[600];
        snprintf(dir, sizeof(dir), "%s/kv", tmpdir);
        CHECKF(kvc_context_enable_disk(c, model_path, dir, 64, err, sizeof(err)) == KVC_OK, "%s",
               err);
    }
    for (int i = 0; i < N_REQ; i++)
        all[i].s = kvc_session_new(c, i, NULL, err, sizeof(err));
    int preempted = run_all(c, all, N_REQ);
    int same = 0, long_replies = 0;
    for (int i = 0; i < N_REQ; i++) {
        CHECK(all[i].done);
        bool eq = all[i].reply_n == solo[i].reply_n &&
                  memcmp(all[i].reply, solo[i].reply, (size_t)solo[i].reply_n * 4) == 0;
        CHECKF(eq, "%s: request %d: its reply (%lld tokens) differs from its solo run's (%lld)",
               disk ? "disk" : "RAM", i, (long long)all[i].reply_n, (long long)solo[i].reply_n);
        same += eq;
        long_replies += solo[i].reply_n > 16;
    }
    kvc_tiers_stats ts = { 0 };
    if (c->tiers)
        kvc_tiers_stats_get(c->tiers, &ts);
    printf("  %s: %d requests on a pool of 14 blocks, %d preemptions, %d replies longer than a "
           "block; %d of %d equal their solo runs; %llu blocks read back from disk\n",
           disk ? "with the disk tier" : "RAM only", N_REQ, preempted, long_replies, same, N_REQ,
           (unsigned long long)ts.blocks_fetched);
    CHECKF(preempted > 0 && long_replies >= 2, "preemption was not exercised");
    if (disk)
        CHECK(ts.blocks_fetched > 0);
    for (int i = 0; i < N_REQ; i++)
        kvc_session_free(all[i].s);
    kvc_context_free(c);
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvc_test_preempt_XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    kvc_model *m = test_gen_model(tmpdir, "tiny", model_path, sizeof(model_path));
    if (m) {
        test_preemption(m, false);
        test_preemption(m, true);
    }
    kvc_model_free(m);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_done("test_preempt");
}
