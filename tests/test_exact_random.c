/* test_exact_random.c - randomized: many conversations through one engine,
 * interleaved, with edits, regenerations, branches, sampling and a KV budget
 * small enough to evict; every reply must equal its cold run (a fresh
 * context given the same messages), and every streamed piece and every reply
 * must be valid UTF-8, the pieces joining to the reply.
 *
 * Rounds submit 1-4 requests of different conversations at once (they run
 * batched), sometimes wait for the background canonicalization to finish and
 * sometimes not (a request then stops it). Models: a random BPE model and a
 * random SPM model whose byte and control tokens are as likely as any other
 * (replies cut inside characters, stopped by control tokens). */
#include "test.h"

#include "model.h"
#include "unicode.h"

#include <unistd.h>

#define N_CONV   8
#define MAX_MSGS 16
#define ROUNDS   250

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static int rint_(int n) { return (int)(rnd() % (uint32_t)n); }

static const char *const WORDS[] = {
    "the", "dog", "ran", "über", "café", "日本", "🙂", "sky", "blue", "why", "story", "\n",
    "<|im_start|>", "system", "and", "a", "once", "upon", "time", "—", "x", "42", "  ",
};

static char *sentence(int words)
{
    char buf[1024] = "";
    for (int i = 0; i < words; i++) {
        if (i)
            strcat(buf, " ");
        strcat(buf, WORDS[rint_((int)KVC_ARRAY_LEN(WORDS))]);
    }
    return strdup(buf);
}

typedef struct conv {
    const char *role[MAX_MSGS];
    char       *content[MAX_MSGS];
    int         n;
    int         key_mode;      /* 0: prompt_cache_key, 1: none */
    char        key[32];
} conv;

static void conv_clear(conv *c)
{
    for (int i = 0; i < c->n; i++)
        free(c->content[i]);
    c->n = 0;
}

static void conv_push(conv *c, const char *role, char *content)
{
    c->role[c->n] = role;
    c->content[c->n++] = content;
}

static void conv_copy(conv *dst, const conv *src)
{
    conv_clear(dst);
    for (int i = 0; i < src->n; i++)
        conv_push(dst, src->role[i], strdup(src->content[i]));
}

/* Change conversation c for its next request: new, extend, edit,
 * regenerate (drop the last reply), or branch another's. */
static void mutate(conv *c, conv *all, int self)
{
    int op = rint_(100);
    bool ends_with_reply = c->n > 0 && c->role[c->n - 1][0] == 'a';
    if (c->n == 0 || op < 10 || c->n + 2 >= MAX_MSGS) {
        conv_clear(c);
        if (rint_(2))
            conv_push(c, "system", strdup("You are a helpful assistant who answers briefly."));
        conv_push(c, "user", sentence(2 + rint_(12)));
    } else if (op < 55 && ends_with_reply) {
        conv_push(c, "user", sentence(1 + rint_(15)));
    } else if (op < 70) {
        int at = rint_(c->n);
        while (c->n > at + 1)
            free(c->content[--c->n]);
        free(c->content[at]);
        c->content[at] = sentence(1 + rint_(10));
        c->role[at] = at == 0 && c->role[0][0] == 's' ? "system" : "user";
    } else if (op < 85) {
        int j = rint_(N_CONV);
        if (j != self && all[j].n > 0)
            conv_copy(c, &all[j]);
        if (c->n == 0 || c->role[c->n - 1][0] == 'a')
            conv_push(c, "user", sentence(1 + rint_(6)));
    } else if (ends_with_reply) {
        free(c->content[--c->n]);            /* regenerate the last reply */
    } else {
        conv_push(c, "user", sentence(3));
    }
    if (c->role[c->n - 1][0] != 'u')
        conv_push(c, "user", sentence(2));
}

typedef struct job {
    conv           *c;
    kvc_chat_params p;
    kvc_request    *r;
    char            text[8192];  /* the streamed pieces joined */
    size_t          len;
    bool            pieces_ok;
    char           *reply;
    kvc_chat_stats  st;
} job;

static char *cold_reply(kvc_model *m, const conv *c, const kvc_chat_params *p)
{
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 1024;
    cp.n_threads = 1;
    kvc_context *ctx = NULL;
    char err[512];
    char *reply = NULL;
    kvc_chat_message msgs[MAX_MSGS];
    for (int i = 0; i < c->n; i++)
        msgs[i] = (kvc_chat_message){ c->role[i], c->content[i] };
    if (kvc_context_new(m, &cp, &ctx, err, sizeof(err)) == KVC_OK) {
        kvc_session *s = kvc_session_new(ctx, 0, NULL, err, sizeof(err));
        if (s && kvc_session_chat(s, msgs, (size_t)c->n, p, NULL, NULL, &reply, NULL, err,
                                  sizeof(err)) != KVC_OK)
            fprintf(stderr, "cold: %s\n", err);
        kvc_session_free(s);
    }
    kvc_context_free(ctx);
    return reply;
}

typedef struct totals {
    int requests, equal, utf8_ok, bg_waits;
    uint64_t bg_jobs, bg_tokens;
} totals;

static void run(kvc_model *m, const char *name, totals *t)
{
    kvc_engine_params ep = kvc_engine_default_params();
    ep.n_ctx = 1024;
    ep.n_parallel = 4;
    ep.n_threads = 2;
    ep.kv_budget_mib = 1;                    /* a few hundred blocks: evictions happen */
    ep.max_sessions = 6;                     /* fewer than the conversations: sessions recycle */
    kvc_engine *e = NULL;
    char err[512];
    CHECKF(kvc_engine_new(m, &ep, &e, err, sizeof(err)) == KVC_OK, "%s: %s", name, err);
    if (!e)
        return;
    conv c[N_CONV];
    memset(c, 0, sizeof(c));
    for (int i = 0; i < N_CONV; i++) {
        c[i].key_mode = i % 2;
        snprintf(c[i].key, sizeof(c[i].key), "conv-%d", i);
    }
    totals before = *t;
    for (int round = 0; round < ROUNDS; round++) {
        job jobs[4];
        int n = 1 + rint_(4), used[N_CONV] = { 0 };
        for (int k = 0; k < n; k++) {
            int i;
            do
                i = rint_(N_CONV);
            while (used[i]);
            used[i] = 1;
            mutate(&c[i], c, i);
            job *j = &jobs[k];
            memset(j, 0, sizeof(*j));
            j->c = &c[i];
            j->pieces_ok = true;
            j->p = kvc_chat_default_params();
            j->p.max_tokens = 1 + rint_(24);
            if (rint_(2)) {
                j->p.sampling.temperature = 1.0f;
                j->p.sampling.seed = rnd();
            }
            kvc_chat_message msgs[MAX_MSGS];
            for (int q = 0; q < c[i].n; q++)
                msgs[q] = (kvc_chat_message){ c[i].role[q], c[i].content[q] };
            kvc_request_params rp = { .messages = msgs, .n_messages = (size_t)c[i].n,
                                      .session_key = c[i].key_mode == 0 ? c[i].key : NULL,
                                      .chat = j->p };
            j->r = kvc_engine_submit(e, &rp, NULL, err, sizeof(err));
            CHECKF(j->r != NULL, "%s: submit: %s", name, err);
        }
        for (int k = 0; k < n; k++) {
            job *j = &jobs[k];
            kvc_event ev;
            while (j->r && kvc_request_next(j->r, &ev, -1)) {
                if (ev.type == KVC_EVENT_TEXT) {
                    j->pieces_ok = j->pieces_ok && kvc_utf8_valid(ev.text, ev.len);
                    if (j->len + ev.len < sizeof(j->text)) {
                        memcpy(j->text + j->len, ev.text, ev.len);
                        j->len += ev.len;
                    }
                    kvc_event_clear(&ev);
                    continue;
                }
                CHECKF(ev.type == KVC_EVENT_DONE, "%s: %s", name, ev.message);
                if (ev.type == KVC_EVENT_DONE) {
                    j->reply = ev.text;
                    j->st = ev.stats;
                    ev.text = NULL;
                }
                kvc_event_clear(&ev);
                break;
            }
            kvc_request_free(j->r);
        }
        for (int k = 0; k < n; k++) {
            job *j = &jobs[k];
            t->requests++;
            j->text[j->len] = 0;
            bool utf8 = j->reply && kvc_utf8_valid(j->reply, strlen(j->reply)) && j->pieces_ok &&
                        strcmp(j->text, j->reply) == 0;
            t->utf8_ok += utf8;
            CHECKF(utf8, "%s round %d: reply or pieces not valid UTF-8, or they differ", name,
                   round);
            char *cold = cold_reply(m, j->c, &j->p);
            bool eq = j->reply && cold && strcmp(j->reply, cold) == 0;
            t->equal += eq;
            CHECKF(eq, "%s round %d: engine \"%s\" != cold \"%s\"", name, round,
                   j->reply ? j->reply : "(null)", cold ? cold : "(null)");
            free(cold);
            if (j->c->n + 1 < MAX_MSGS)
                conv_push(j->c, "assistant", j->reply ? j->reply : strdup(""));
            else
                free(j->reply);
        }
        if (rint_(3)) {
            t->bg_waits++;
            CHECKF(test_wait_background(e), "%s: background work never finished", name);
        }
    }
    kvc_engine_metrics mt;
    kvc_engine_get_metrics(e, &mt);
    t->bg_jobs += mt.bg_jobs;
    t->bg_tokens += mt.bg_tokens;
    printf("  %s: %d/%d replies equal cold runs, %d/%d valid UTF-8; %llu blocks evicted, "
           "%llu background jobs computed %llu tokens\n", name, t->equal - before.equal,
           t->requests - before.requests, t->utf8_ok - before.utf8_ok,
           t->requests - before.requests, (unsigned long long)mt.blocks_evicted,
           (unsigned long long)mt.bg_jobs, (unsigned long long)mt.bg_tokens);
    CHECKF(mt.blocks_evicted > 0, "%s: nothing was evicted: the budget is too large to test it",
           name);
    for (int i = 0; i < N_CONV; i++)
        conv_clear(&c[i]);
    kvc_engine_free(e);
}

int main(void)
{
    char dir[] = "/tmp/kvc_exact_random_XXXXXX", path[4200];
    if (!mkdtemp(dir))
        return 1;
    const char *presets[] = { "tiny", "tiny-llama" };
    totals t = { 0 };
    for (size_t k = 0; k < KVC_ARRAY_LEN(presets); k++) {
        kvc_gen_params g;
        char err[512];
        kvc_gen_preset(presets[k], &g);
        g.all_tokens = true;
        g.n_threads = 2;
        snprintf(path, sizeof(path), "%s/%s.gguf", dir, presets[k]);
        CHECKF(kvc_gen_write(&g, path, err, sizeof(err)) == KVC_OK, "%s", err);
        kvc_model *m = NULL;
        CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "%s", err);
        unlink(path);
        if (m)
            run(m, presets[k], &t);
        kvc_model_free(m);
    }
    rmdir(dir);
    CHECK(t.bg_jobs > 0 && t.bg_tokens > 0);
    printf("  all: %d/%d equal, %d/%d valid UTF-8, %d waits for the background\n", t.equal,
           t.requests, t.utf8_ok, t.requests, t.bg_waits);
    return test_done("test_exact_random");
}
