/* test_kv_memory.c - issue 31's memory figure on the pool of a context for
 * the Gemma-3-4B, gpt-oss-20b and Gemma-4-26B-A4B shapes (make-model presets,
 * their KV layout
 * kept: KV heads, head dims, windows, pattern; layers cut and everything the
 * KV does not depend on made small). A conversation of 16k tokens goes
 * through the pool as a turn runs it: its prompt reserved at once, written
 * in batches of 512 (kvc_kv_seq_window, as the forward pass does), then 100
 * tokens decoded one at a time. Checked: the window chunks it holds stay
 * within a running window (ceil((w + batch) / B) + 2) while it prefills and
 * one window and a block or two once it decodes; so it holds the full
 * layers' K/V plus that, not every layer's; at rest it holds none, and its
 * next turn keeps the whole conversation. Printed: what it holds with memory
 * groups and with every block keeping its window part (--swa-full), and the
 * pool each takes. A window slab smaller than the running sequences need is
 * refused. Gemma 4 E4B's KV-shared layers take no bytes of a block, a
 * chunk or the budget. The forward pass is not run (its writes are the pool's
 * layout: test_window and test_kernels_batch cover them). */
#include "context.h"
#include "kv.h"
#include "model_gen.h"
#include "test.h"

enum { N_CONV = 16000, N_DEC = 100, BATCH = 512 };

static char tmpdir[64];

/* The preset's model with its KV layout, n_layer layers (the last n_shared
 * of them KV-shared), small elsewhere. */
static kvc_model *shaped(const char *preset, int32_t n_layer, int32_t n_shared)
{
    kvc_gen_params g;
    char path[256], err[512];
    CHECK(kvc_gen_preset(preset, &g) == KVC_OK);
    g.n_layer = n_layer;
    g.n_kv_shared = n_shared;
    g.n_embd = 64;
    g.n_ff = 64;
    g.n_ff_exp = 64;
    g.n_expert = g.n_expert ? 4 : 0;
    g.n_expert_used = KVC_MIN(g.n_expert_used, g.n_expert);
    g.n_vocab = 1024;
    g.ftype = "f32";
    g.n_threads = 1;
    snprintf(path, sizeof(path), "%s/%s.gguf", tmpdir, preset);
    CHECKF(kvc_gen_write(&g, path, err, sizeof(err)) == KVC_OK, "%s", err);
    kvc_model *m = NULL;
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "%s", err);
    return m;
}

/* Bytes of the pool's blocks in use, and of its window chunks held by a
 * sequence (held) or in use at all (kept for the tree's hits: !held). */
static double used_bytes(const kvc_kv_pool *pool, bool held)
{
    double b = (double)(kvc_kv_n_blocks(pool) - kvc_kv_n_free(pool)) * (double)kvc_kv_group_chunk_bytes(pool, 0);
    for (int32_t g = 1; g < kvc_kv_n_groups(pool); g++)
        b += (double)(held ? kvc_kv_group_n_held(pool, g)
                           : kvc_kv_group_of(pool, g)->n_blocks - kvc_kv_group_n_free(pool, g)) *
             (double)kvc_kv_group_chunk_bytes(pool, g);
    return b;
}

static double pool_bytes(const kvc_kv_pool *pool)
{
    double b = 0;
    for (int32_t g = 0; g < kvc_kv_n_groups(pool); g++)
        b += (double)kvc_kv_group_of(pool, g)->n_blocks * (double)kvc_kv_group_chunk_bytes(pool, g);
    return b;
}

/* The conversation through a context of m (kv_window_blocks as given);
 * returns the bytes its K/V takes after it (blocks and window chunks in
 * use), what the sequence holds in *held_out, its pool's size in *pool_out. */
static double converse(kvc_model *m, const char *label, int64_t window_blocks, double *held_out,
                       double *pool_out)
{
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = N_CONV + N_DEC + BATCH;
    cp.n_batch = BATCH;
    cp.n_threads = 1;
    cp.n_seq = 2;                            /* as an engine of 1 parallel request and a background turn */
    cp.kv_blocks = (cp.n_ctx + KVC_BLOCK_TOKENS - 1) / KVC_BLOCK_TOKENS + 1;
    cp.kv_window_blocks = window_blocks;
    kvc_context *c = NULL;
    char err[512];
    CHECKF(kvc_context_new(m, &cp, &c, err, sizeof(err)) == KVC_OK, "%s", err);
    if (!c)
        return 0;
    kvc_kv_pool *pool = c->pool;
    kvc_kv_seq *s = &c->seqs[0];
    const int32_t n_groups = kvc_kv_n_groups(pool);
    const int64_t B = KVC_BLOCK_TOKENS;
    kvc_err e = { 0 };
    CHECK(kvc_kv_seq_reserve(pool, s, N_CONV, &e) == KVC_OK);
    int64_t max_prefill[KVC_KV_MAX_GROUPS] = { 0 }, max_decode[KVC_KV_MAX_GROUPS] = { 0 };
    for (int64_t p = 0; p < N_CONV; p += BATCH) {
        const int64_t to = KVC_MIN(p + BATCH, (int64_t)N_CONV);
        CHECKF(kvc_kv_seq_window(pool, s, to, &e) == KVC_OK, "%s: %s", label, e.msg);
        s->n_tokens = to;
        for (int32_t g = 1; g < n_groups; g++)
            max_prefill[g] = KVC_MAX(max_prefill[g], kvc_kv_group_n_held(pool, g));
    }
    for (int64_t p = N_CONV; p < N_CONV + N_DEC; p++) {
        CHECK(kvc_kv_seq_reserve(pool, s, p + 1, &e) == KVC_OK);
        CHECKF(kvc_kv_seq_window(pool, s, p + 1, &e) == KVC_OK, "%s: %s", label, e.msg);
        s->n_tokens = p + 1;
        for (int32_t g = 1; g < n_groups; g++)
            max_decode[g] = KVC_MAX(max_decode[g], kvc_kv_group_n_held(pool, g));
    }
    const double used = used_bytes(pool, false);
    *held_out = used_bytes(pool, true);
    const int64_t n = s->n_tokens;
    CHECK_EQ_INT(kvc_kv_group_n_held(pool, 0), (n + B - 1) / B);
    for (int32_t g = 1; g < n_groups; g++) {
        const int32_t w = kvc_kv_group_of(pool, g)->window;
        const bool full = kvc_kv_group_of(pool, g)->n_blocks >= kvc_kv_n_blocks(pool);
        CHECKF(max_prefill[g] <= kvc_kv_window_need(pool, g, BATCH), "%s group %d: held %lld prefilling",
               label, g, (long long)max_prefill[g]);
        CHECKF(max_decode[g] <= (w + B - 1) / B + 2, "%s group %d: held %lld decoding", label, g,
               (long long)max_decode[g]);
        printf("  %s: window %d: %lld chunks held at most prefilling, %lld decoding (%lld in the slab%s)\n",
               label, w, (long long)max_prefill[g], (long long)max_decode[g],
               (long long)kvc_kv_group_of(pool, g)->n_blocks, full ? ", every block's" : "");
    }
    /* at rest nothing of the windows is held; the next turn keeps all of it */
    kvc_kv_seq_rest(pool, s);
    for (int32_t g = 1; g < n_groups; g++)
        CHECK_EQ_INT(kvc_kv_group_n_held(pool, g), 0);
    CHECK_EQ_INT(kvc_kv_seq_truncate(pool, s, n), n);
    *pool_out = pool_bytes(pool);
    kvc_context_free(c);
    return used;
}

static void shape(const char *preset, int32_t n_layer)
{
    kvc_model *m = shaped(preset, n_layer, 0);
    if (!m)
        return;
    char label[96];
    double pool_g = 0, pool_f = 0, held_g = 0, held_f = 0;
    snprintf(label, sizeof(label), "%s, %d layers", preset, n_layer);
    const double with = converse(m, label, 0, &held_g, &pool_g);
    snprintf(label, sizeof(label), "%s, %d layers, --swa-full", preset, n_layer);
    const double without = converse(m, label, -1, &held_f, &pool_f);
    const double mib = 1048576.0;
    printf("  %s (%d layers), %d tokens: the sequence holds %.1f MiB; the cache takes %.1f MiB "
           "with memory groups, %.1f MiB with every block's window part (%.2fx); pools %.1f vs "
           "%.1f MiB (%.2fx)\n", preset, n_layer, N_CONV + N_DEC, held_g / mib, with / mib,
           without / mib, with > 0 ? without / with : 0.0, pool_g / mib, pool_f / mib,
           pool_g > 0 ? pool_f / pool_g : 0.0);
    CHECKF(held_g == held_f, "%s: the running sequence holds %.0f vs %.0f bytes", preset, held_g, held_f);
    CHECKF(with > 0 && with < without && pool_g < pool_f, "%s: groups save nothing", preset);
    /* a window slab smaller than the running sequences hold is refused */
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 4096;
    cp.n_seq = 2;
    cp.kv_window_blocks = 3;
    kvc_context *c = NULL;
    char err[512] = "";
    CHECK(kvc_context_new(m, &cp, &c, err, sizeof(err)) == KVC_ERR_INVALID_ARG && !c);
    CHECKF(strstr(err, "too small") && strstr(err, "2 running sequences"), "%s", err);
    kvc_model_release(m);
}

/* Gemma 4 E4B's shape (42 layers, the last 18 KV-shared): a shared layer
 * holds no bytes in any group's chunk (what blocks, window chunks, records
 * and the budget are made of), against a layout where each kept its own;
 * the conversation above runs in it as in any. */
static void shared_shape(void)
{
    enum { N_LAYER = 42, N_SHARED = 18 };
    kvc_model *m = shaped("gemma4-e4b", N_LAYER, N_SHARED);
    if (!m)
        return;
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 4096;
    cp.n_threads = 1;
    kvc_context *c = NULL;
    char err[512];
    CHECKF(kvc_context_new(m, &cp, &c, err, sizeof(err)) == KVC_OK, "%s", err);
    if (!c) {
        kvc_model_release(m);
        return;
    }
    /* each group's chunk: 2 (K, V) x B x KV heads x head dim x 2 bytes (F16)
     * per layer that keeps its own K/V, from the model's layers */
    const kvc_kv_pool *pool = c->pool;
    size_t want[KVC_KV_MAX_GROUPS] = { 0 }, own[KVC_KV_MAX_GROUPS] = { 0 };
    int32_t n_shared = 0;
    for (int32_t l = 0; l < N_LAYER; l++) {
        const kvc_layer *L = &m->layers[l];
        const size_t bytes = 2 * KVC_BLOCK_TOKENS * (size_t)L->n_head_kv * (size_t)L->head_dim * 2;
        const int32_t g = kvc_kv_layer_group(pool, l);
        want[g] += L->kv_layer == l ? bytes : 0;
        own[g] += bytes;
        n_shared += L->kv_layer != l;
        CHECK_EQ_INT(kvc_kv_layer_kv_of(pool, l), L->kv_layer);
    }
    CHECK_EQ_INT(n_shared, N_SHARED);
    size_t block = 0, block_own = 0;
    for (int32_t g = 0; g < kvc_kv_n_groups(pool); g++) {
        CHECKF(kvc_kv_group_chunk_bytes(pool, g) == want[g], "group %d: a chunk of %zu bytes, its "
               "layers that keep their K/V take %zu", g, kvc_kv_group_chunk_bytes(pool, g), want[g]);
        block += want[g];
        block_own += own[g];
    }
    CHECK_EQ_INT(kvc_context_block_bytes(m, KVC_KV_F16), want[0]);
    /* tokens a budget of 1 GiB holds, with the running windows of 1 sequence */
    int64_t wb = 0, wb_all = -1;
    const int64_t blocks = kvc_context_blocks_for(m, KVC_KV_F16, 1, 512, 1ull << 30, &wb);
    const int64_t blocks_all = kvc_context_blocks_for(m, KVC_KV_F16, 1, 512, 1ull << 30, &wb_all);
    const int64_t own_blocks = (int64_t)((1ull << 30) / block_own);
    CHECK(blocks_all == (int64_t)((1ull << 30) / block));
    printf("  gemma4-e4b (%d layers, %d KV-shared): a block of %d tokens takes %.1f KiB of full "
           "layers (%.1f KiB if the shared layers kept K/V of their own), %.1f KiB with its window "
           "parts (%.1f KiB); a budget of 1 GiB holds %lld tokens, %lld with every block's window "
           "part (%lld)\n", N_LAYER, N_SHARED, KVC_BLOCK_TOKENS, (double)want[0] / 1024,
           (double)own[0] / 1024, (double)block / 1024, (double)block_own / 1024,
           (long long)(blocks * KVC_BLOCK_TOKENS), (long long)(blocks_all * KVC_BLOCK_TOKENS),
           (long long)(own_blocks * KVC_BLOCK_TOKENS));
    kvc_context_free(c);
    double held = 0, pool_b = 0;
    CHECK(converse(m, "gemma4-e4b, 18 of 42 layers KV-shared", 0, &held, &pool_b) > 0);
    kvc_model_release(m);
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvc_kv_memory_XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    shape("gemma3-4b", 6);      /* 5 sliding layers (window 1024) to 1 global */
    shape("gpt-oss-20b", 4);    /* sliding (window 128) and global alternate */
    shape("gemma4-26b-a4b", 6); /* 5 sliding (8 KV heads of 256, window 1024) to 1 global (2 of 512) */
    shared_shape();
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_done("test_kv_memory");
}
