/* test_window.c - the forward pass over a pool with a window group
 * (kvc_context_set_windows): the random tiny-qwen3 model (head dim 32) with every other layer
 * attending through a window of 24 positions. The logits of every position
 * are the same bits whether the window group keeps every chunk or just
 * enough for the running window (the rest evicted as the sequence goes),
 * whether the prompt runs in one batch, in chunks of 16, or token by token,
 * and for every KV type; without the window they differ (the window is in
 * effect). A truncation back into the evicted part keeps less, and the
 * positions recomputed from there give the same bits again. And a chat of
 * five turns (T2 and T3 extend, T4 diverges right after T1's prompt, T5 20
 * tokens earlier) reuses every token before each divergence, the window
 * chunks of T1's end long released, with replies equal to a fresh context's;
 * once a prompt has run, the chunks behind its window are no longer held. */
#include "context.h"
#include "kv.h"
#include "session.h"
#include "model_gen.h"
#include "test.h"

enum { N = 200, W = 24 };

static int32_t toks[N];

/* Logits of positions [0, N) of toks, decoded `chunk` tokens at a time
 * (0: no window). */
static float *run(kvc_model *m, int32_t kv_type, int32_t window, int64_t n_window, int32_t chunk)
{
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = N;
    cp.n_threads = 2;
    cp.kv_type = kv_type;
    kvc_context *c = NULL;
    char err[512];
    CHECKF(kvc_context_new(m, &cp, &c, err, sizeof(err)) == KVC_OK, "%s", err);
    if (!c)
        return NULL;
    const int32_t n_layer = m->hp.n_layer, n_vocab = m->hp.n_vocab;
    int32_t win[64];
    for (int32_t l = 0; l < n_layer; l++)
        win[l] = l % 2 == 0 ? window : 0;
    kvc_err e = { 0 };
    if (window)
        CHECKF(kvc_context_set_windows(c, win, n_window, &e) == KVC_OK, "%s", e.msg);
    float *out = malloc((size_t)N * n_vocab * sizeof(float));
    for (int32_t p = 0; p < N; p += chunk) {
        const int32_t k = KVC_MIN(chunk, N - p);
        CHECKF(kvc_context_decode(c, 0, toks + p, k, true, err, sizeof(err)) == KVC_OK, "at %d: %s", p, err);
        for (int32_t i = 0; i < k; i++)
            memcpy(out + (size_t)(p + i) * n_vocab, kvc_context_logits(c, i), (size_t)n_vocab * sizeof(float));
    }
    if (window && n_window) {
        /* evicted behind: truncating to 100 keeps less, and from there on
         * the same bits again */
        CHECK(kvc_kv_group_n_free(c->pool, 1) == 0);
        CHECK_EQ_INT(kvc_context_seq_truncate(c, 0, 100), KVC_OK);
        int32_t kept = kvc_context_seq_len(c, 0);
        CHECKF(kept < 100, "kept %d", kept);
        bool same = true;
        for (int32_t p = kept; p < N; p += chunk) {   /* a window's worth at a time: the slab's size */
            const int32_t k = KVC_MIN(chunk, N - p);
            CHECKF(kvc_context_decode(c, 0, toks + p, k, true, err, sizeof(err)) == KVC_OK, "%s", err);
            for (int32_t i = 0; i < k; i++)
                same = same && memcmp(out + (size_t)(p + i) * n_vocab, kvc_context_logits(c, i),
                                      (size_t)n_vocab * sizeof(float)) == 0;
        }
        CHECKF(same, "recomputed from %d: other bits", kept);
    }
    kvc_context_free(c);
    return out;
}

/* A context of m with layer 0 windowed (W), window chunks for every block. */
static kvc_context *window_ctx(kvc_model *m)
{
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 2048;
    cp.n_threads = 2;
    kvc_context *c = NULL;
    char err[512];
    CHECKF(kvc_context_new(m, &cp, &c, err, sizeof(err)) == KVC_OK, "%s", err);
    int32_t win[64] = { W };
    kvc_err e = { 0 };
    if (c)
        CHECKF(kvc_context_set_windows(c, win, 0, &e) == KVC_OK, "%s", e.msg);
    return c;
}

/* The window chunks the session's sequence holds when its reply's first
 * text comes (its prompt just run): -1 before. */
static int64_t held_first = -1;
static kvc_context *watched;   /* the context of the session chat() runs on */

static bool on_text(const char *text, size_t len, void *user)
{
    (void)text;
    (void)len;
    (void)user;
    if (held_first < 0 && watched)
        held_first = kvc_kv_group_n_held(watched->pool, 1);
    return true;
}

static char *chat(kvc_session *s, const kvc_chat_message *msgs, size_t n, kvc_chat_stats *st)
{
    kvc_chat_params p = kvc_chat_default_params();
    p.max_tokens = 12;
    p.sampling.temperature = 0.0f;
    char err[512], *reply = NULL;
    held_first = -1;
    CHECKF(kvc_session_chat(s, msgs, n, &p, on_text, NULL, &reply, st, err,
                           sizeof(err)) == KVC_OK, "%s", err);
    return reply ? reply : strdup("");
}

/* Prompt tokens of msgs[0, n) (what a turn on them starts with). */
static int32_t prompt_len(kvc_session *s, const kvc_chat_message *msgs, size_t n)
{
    kvc_chat_stats st = { 0 };
    kvc_chat_params p = kvc_chat_default_params();
    p.max_tokens = 1;
    char err[512], *reply = NULL;
    kvc_session_chat(s, msgs, n, &p, NULL, NULL, &reply, &st, err, sizeof(err));
    free(reply);
    return st.prompt_tokens;
}

static void test_five_turns(kvc_model *m)
{
    static char long1[8000], long2[8000];
    size_t o1 = 0, o2 = 0;
    for (int i = 0; i < 140; i++) {
        o1 += (size_t)snprintf(long1 + o1, sizeof(long1) - o1, "w%d ", (i * 37) % 101);
        o2 += (size_t)snprintf(long2 + o2, sizeof(long2) - o2, "v%d ", (i * 53) % 97);
    }
    kvc_context *c = window_ctx(m);
    char err[512];
    kvc_session *s = c ? kvc_session_new(c, 0, NULL, err, sizeof(err)) : NULL;
    CHECKF(s, "%s", err);
    if (!s) {
        kvc_context_free(c);
        return;
    }
    kvc_chat_message msgs[8] = { { "user", long1 } };
    watched = c;
    kvc_chat_stats st[6] = { { 0 } };
    char *r1 = chat(s, msgs, 1, &st[1]);
    /* the prompt ran in one batch: behind its window nothing is held any
     * more once it has run (W positions: ceil(W / B) + 1 chunks at most) */
    CHECKF(held_first >= 1 && held_first <= (W + KVC_BLOCK_TOKENS - 1) / KVC_BLOCK_TOKENS + 1,
           "T1 (%d tokens): %lld window chunks held after its prompt ran", st[1].prompt_tokens,
           (long long)held_first);
    msgs[1] = (kvc_chat_message){ "assistant", r1 };
    msgs[2] = (kvc_chat_message){ "user", long2 };
    char *r2 = chat(s, msgs, 3, &st[2]);
    msgs[3] = (kvc_chat_message){ "assistant", r2 };
    msgs[4] = (kvc_chat_message){ "user", "and now?" };
    char *r3 = chat(s, msgs, 5, &st[3]);
    /* T4: T1's messages and another user message after it */
    kvc_chat_message t4[2] = { { "user", long1 }, { "assistant", "something else entirely" } };
    kvc_chat_message t4b[3] = { t4[0], t4[1], { "user", "go on" } };
    char *r4 = chat(s, t4b, 3, &st[4]);
    /* T5: the first message cut 20 words short */
    char cut[8000];
    memcpy(cut, long1, o1);
    size_t k = o1;
    for (int words = 0; words < 21 && k > 0; k--)
        words += cut[k - 1] == ' ';
    cut[k] = 0;
    kvc_chat_message t5[1] = { { "user", cut } };
    char *r5 = chat(s, t5, 1, &st[5]);
    CHECKF(st[2].cached_tokens >= st[1].prompt_tokens, "T2 reused %d of T1's %d", st[2].cached_tokens,
           st[1].prompt_tokens);
    CHECKF(st[3].cached_tokens >= st[2].prompt_tokens, "T3 reused %d of T2's %d", st[3].cached_tokens,
           st[2].prompt_tokens);
    printf("  five turns: prompt/cached %d/%d %d/%d %d/%d %d/%d %d/%d\n", st[1].prompt_tokens,
           st[1].cached_tokens, st[2].prompt_tokens, st[2].cached_tokens, st[3].prompt_tokens,
           st[3].cached_tokens, st[4].prompt_tokens, st[4].cached_tokens, st[5].prompt_tokens,
           st[5].cached_tokens);
    /* the divergence points, by the prompts a fresh session renders */
    kvc_context *f = window_ctx(m);
    kvc_session *fs = f ? kvc_session_new(f, 0, NULL, err, sizeof(err)) : NULL;
    if (fs) {
        const struct { const kvc_chat_message *m; size_t n; const char *r; int t; } turns[] = {
            { msgs, 1, r1, 1 }, { msgs, 3, r2, 2 }, { msgs, 5, r3, 3 }, { t4b, 3, r4, 4 }, { t5, 1, r5, 5 } };
        for (size_t i = 0; i < KVC_ARRAY_LEN(turns); i++) {
            kvc_session_reset(fs);
            kvc_chat_stats cs = { 0 };
            char *cold = chat(fs, turns[i].m, turns[i].n, &cs);
            CHECKF(strcmp(cold, turns[i].r) == 0, "T%d: warm reply differs from a fresh context's", turns[i].t);
            free(cold);
        }
        /* T4 shares T1's prompt but its last token (a generation prompt
         * rendered differently: at least all but the assistant header);
         * T5 shares T1's up to its cut */
        kvc_session_reset(fs);
        kvc_chat_message t1only[1] = { { "user", long1 } };
        const int32_t n1 = prompt_len(fs, t1only, 1);
        kvc_session_reset(fs);
        const int32_t n5 = prompt_len(fs, t5, 1);
        CHECKF(st[4].cached_tokens >= n1 - 8, "T4 reused %d, T1's prompt is %d", st[4].cached_tokens, n1);
        CHECKF(st[5].cached_tokens >= n5 - 8, "T5 reused %d of %d", st[5].cached_tokens, n5);
    }
    kvc_session_free(fs);
    kvc_context_free(f);
    free(r1); free(r2); free(r3); free(r4); free(r5);
    kvc_session_free(s);
    kvc_context_free(c);
}

int main(void)
{
    char dir[] = "/tmp/kvc_window_XXXXXX", path[4200];
    if (!mkdtemp(dir))
        return 1;
    snprintf(path, sizeof(path), "%s/tiny.gguf", dir);
    kvc_gen_params g;
    char err[512];
    CHECK(kvc_gen_preset("tiny-qwen3", &g) == KVC_OK);
    g.n_threads = 2;
    CHECKF(kvc_gen_write(&g, path, err, sizeof(err)) == KVC_OK, "%s", err);
    kvc_model *m = NULL;
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "%s", err);
    if (!m)
        return test_done("test_window");
    for (int32_t i = 0; i < N; i++)
        toks[i] = (int32_t)((i * 7919u + 13u) % (uint32_t)m->hp.n_vocab);
    const size_t bytes = (size_t)N * m->hp.n_vocab * sizeof(float);
    /* the running window: W positions, a chunk of 16 and a block either side */
    const int64_t tight = (W + 16 + KVC_BLOCK_TOKENS - 1) / KVC_BLOCK_TOKENS + 2;
    const int32_t types[] = { KVC_KV_F16, KVC_KV_F32, KVC_KV_Q8_0 };
    for (size_t t = 0; t < KVC_ARRAY_LEN(types); t++) {
        float *ref = run(m, types[t], W, 0, N);
        float *evict = run(m, types[t], W, tight, 16);
        float *one = run(m, types[t], W, 0, 1);
        float *full = run(m, types[t], 0, 0, N);
        if (ref && evict && one && full) {
            CHECKF(memcmp(ref, evict, bytes) == 0, "type %d: chunks of 16, window chunks evicted: other bits",
                   types[t]);
            CHECKF(memcmp(ref, one, bytes) == 0, "type %d: token by token: other bits", types[t]);
            const size_t early = (size_t)W * m->hp.n_vocab * sizeof(float);
            CHECKF(memcmp(ref, full, early) == 0, "type %d: positions inside the window differ", types[t]);
            CHECKF(memcmp(ref, full, bytes) != 0, "type %d: the window changes nothing", types[t]);
        }
        free(ref);
        free(evict);
        free(one);
        free(full);
    }
    test_five_turns(m);
    kvc_model_release(m);
    unlink(path);
    rmdir(dir);
    return test_done("test_window");
}
