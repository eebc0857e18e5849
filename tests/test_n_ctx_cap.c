/* test_n_ctx_cap.c - a model file that claims a context of 2^31 - 1 tokens.
 *
 * The context length taken from the file is capped by what the KV pool can
 * hold: the budget when one is given (engine), else the contexts asked for
 * within half the physical memory. Without the cap the pool would be sized
 * for 2^31 tokens per sequence (terabytes) and creation fails or swaps. An
 * explicit n_ctx is taken as given. */
#include <unistd.h>

#include "context.h"
#include "model_gen.h"
#include "test.h"

int main(void)
{
    char dir[] = "/tmp/kvc_test_n_ctx_XXXXXX", path[512], err[512];
    if (!mkdtemp(dir))
        return 1;
    snprintf(path, sizeof(path), "%s/huge_ctx.gguf", dir);
    kvc_gen_params g;
    kvc_gen_preset("tiny", &g);
    g.n_ctx = INT32_MAX;
    kvc_err e = { 0 };
    kvc_model *m = NULL;
    CHECKF(kvc_gen_model(&g, path, &e) == KVC_OK, "gen: %s", e.msg);
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "load: %s", err);
    if (!m)
        return test_done("test_n_ctx_cap");
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    CHECK_EQ_INT(info.n_ctx_train, INT32_MAX);
    const uint64_t ram = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    const size_t bb = kvc_context_block_bytes(m, KVC_KV_F16);

    /* No pool size given: two sequences within half the RAM. (Only the
     * length is checked: allocating gigabytes of pool, even untouched, is
     * slow under AddressSanitizer.) */
    int32_t n = kvc_context_fit_n_ctx(m, KVC_KV_F16, 0, 2);
    CHECKF(n >= 16 && n < INT32_MAX, "context length %d", n);
    CHECKF(2 * ((uint64_t)n / 16 + 1) * bb <= ram / 2 + bb,
           "a pool for 2 x %d tokens is more than half of %llu bytes of RAM", n,
           (unsigned long long)ram);
    printf("no pool size: n_ctx %d (%.1f GiB of KV per sequence)\n", n,
           (double)n / 16 * bb / 1073741824.0);
    /* A context with a pool of 300 blocks: the length is what it holds. */
    kvc_context_params cp = kvc_context_default_params();
    cp.n_seq = 2;
    cp.n_threads = 1;
    cp.kv_blocks = 300;
    kvc_context *ctx = NULL;
    CHECKF(kvc_context_new(m, &cp, &ctx, err, sizeof(err)) == KVC_OK, "context: %s", err);
    if (ctx)
        CHECK_EQ_INT(kvc_context_n_ctx(ctx), 299 * 16);
    kvc_context_free(ctx);
    /* An explicit length is not capped. */
    cp.n_ctx = 4096;
    CHECKF(kvc_context_new(m, &cp, &ctx, err, sizeof(err)) == KVC_OK, "context: %s", err);
    if (ctx)
        CHECK_EQ_INT(kvc_context_n_ctx(ctx), 4096);
    kvc_context_free(ctx);

    /* An engine with a 4 MiB budget: the context is what the budget holds. */
    kvc_engine_params ep = kvc_engine_default_params();
    ep.n_parallel = 2;
    ep.n_threads = 1;
    ep.kv_budget_mib = 4;
    kvc_engine *eng = NULL;
    CHECKF(kvc_engine_new(m, &ep, &eng, err, sizeof(err)) == KVC_OK, "engine: %s", err);
    if (eng) {
        kvc_engine_metrics em;
        kvc_engine_get_metrics(eng, &em);
        int32_t n = kvc_engine_n_ctx(eng);
        CHECKF(n >= 16 && (int64_t)n <= (em.blocks_total - 1) * 16,
               "engine context %d with %lld blocks", n, (long long)em.blocks_total);
        CHECKF((uint64_t)em.blocks_total * (uint64_t)em.block_bytes <= 4u << 20,
               "the pool is %lld blocks of %lld bytes", (long long)em.blocks_total,
               (long long)em.block_bytes);
        printf("engine (4 MiB budget): n_ctx %d, %lld blocks\n", n, (long long)em.blocks_total);
        kvc_engine_free(eng);
    }
    kvc_model_free(m);
    unlink(path);
    rmdir(dir);
    return test_done("test_n_ctx_cap");
}
