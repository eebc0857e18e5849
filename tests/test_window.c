/* test_window.c - the forward pass over a pool with a window group
 * (kvc_context_set_windows): the random tiny-qwen3 model (head dim 32) with every other layer
 * attending through a window of 24 positions. The logits of every position
 * are the same bits whether the window group keeps every chunk or just
 * enough for the running window (the rest evicted as the sequence goes),
 * whether the prompt runs in one batch, in chunks of 16, or token by token,
 * and for every KV type; without the window they differ (the window is in
 * effect). A truncation back into the evicted part keeps less, and the
 * positions recomputed from there give the same bits again. */
#include "context.h"
#include "kv.h"
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
    kvc_model_release(m);
    unlink(path);
    rmdir(dir);
    return test_done("test_window");
}
