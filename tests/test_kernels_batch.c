/* test_kernels_batch.c - batch invariance of the whole forward pass on every
 * ISA this CPU has, past the sizes where the kernels change shape: a prompt
 * of 300 tokens (19 KV blocks, many attention tiles, prefill and decode
 * matmul kernels) fed in one batch, in chunks of 64, 7 and 1 (decode), with
 * 1 and 2 threads, gives bitwise-equal logits at every position. GQA group
 * 7 (as Qwen2.5-0.5B), F16 and Q8_0 KV caches, Q8_0, Q4_0, Q4_K and Q6_K
 * weights (the vnni ISA's integer path; the float path on the others) and
 * F16 (whose decode reads its rows in lanes, kernels_internal.h). */
#include <unistd.h>

#include "kernels.h"
#include "kvchat.h"
#include "model_gen.h"
#include "test.h"

#define N_TOK 300

static char tmpdir[256];

static bool make(const char *ftype, const char *path)
{
    kvc_gen_params p = kvc_gen_default_params();
    p.arch = "qwen2";
    p.ftype = ftype;
    p.n_embd = 256;
    p.n_layer = 2;
    p.n_head = 7;
    p.n_head_kv = 1;
    p.head_dim = 32;
    p.n_ff = 512;
    p.n_ctx = 1024;
    kvc_err e = { 0 };
    int rc = kvc_gen_model(&p, path, &e);
    CHECKF(rc == KVC_OK, "gen %s: %s", ftype, e.msg);
    return rc == KVC_OK;
}

/* All logits [N_TOK][V], fed in chunks of `chunk` with n_threads; NULL on failure. */
static float *logits_of(kvc_model *m, const int32_t *toks, int chunk, int n_threads, int kv_type)
{
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = chunk;
    cp.n_threads = n_threads;
    cp.kv_type = kv_type;
    kvc_context *ctx = NULL;
    char err[512];
    if (kvc_context_new(m, &cp, &ctx, err, sizeof(err)) != KVC_OK) {
        CHECKF(0, "context: %s", err);
        return NULL;
    }
    float *out = malloc((size_t)N_TOK * info.n_vocab * sizeof(float));
    for (int done = 0; out && done < N_TOK;) {
        int k = KVC_MIN(N_TOK - done, chunk);
        if (kvc_context_decode(ctx, 0, toks + done, k, true, err, sizeof(err)) != KVC_OK) {
            CHECKF(0, "decode: %s", err);
            free(out);
            out = NULL;
            break;
        }
        for (int i = 0; i < k; i++)
            memcpy(out + (size_t)(done + i) * info.n_vocab, kvc_context_logits(ctx, i),
                   (size_t)info.n_vocab * sizeof(float));
        done += k;
    }
    kvc_context_free(ctx);
    return out;
}

static void check_model(const char *ftype)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s.gguf", tmpdir, ftype);
    if (!make(ftype, path))
        return;
    kvc_model *m = NULL;
    char err[512];
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "load: %s", err);
    if (!m)
        return;
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    int32_t toks[N_TOK];
    for (int i = 0; i < N_TOK; i++)
        toks[i] = (int32_t)((1000003u * (uint32_t)(i + 1)) % (uint32_t)info.n_vocab);
    const size_t bytes = (size_t)N_TOK * info.n_vocab * sizeof(float);
    const int kv_types[] = { KVC_KV_F16, KVC_KV_Q8_0 };
    const int chunks[] = { 64, 7, 1 };
    const kvc_isa def = kvc_kernels_isa();
    for (int isa = KVC_ISA_SCALAR; isa <= KVC_ISA_VNNI; isa++) {
        if (kvc_kernels_set_isa((kvc_isa)isa) != KVC_OK)
            continue;
        for (size_t kv = 0; kv < KVC_ARRAY_LEN(kv_types); kv++) {
            float *base = logits_of(m, toks, N_TOK, 1, kv_types[kv]);
            for (int threads = 1; base && threads <= 2; threads++)
                for (size_t c = 0; c < KVC_ARRAY_LEN(chunks); c++) {
                    float *l = logits_of(m, toks, chunks[c], threads, kv_types[kv]);
                    CHECKF(l && memcmp(base, l, bytes) == 0,
                           "%s %s, KV %s: chunks of %d with %d threads differ from one batch",
                           kvc_isa_name((kvc_isa)isa), ftype, kv_types[kv] == KVC_KV_F16 ? "f16" : "q8_0",
                           chunks[c], threads);
                    free(l);
                }
            free(base);
        }
    }
    kvc_kernels_set_isa(def);
    kvc_model_free(m);
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvc_test_kernels_batch_XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    check_model("q8_0");
    check_model("q4_0");
    check_model("q4_k");
    check_model("q6_k");
    check_model("f16");
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_done("test_kernels_batch");
}
