/* test_kernels_batch.c - batch invariance of the whole forward pass on every
 * ISA this CPU has, past the sizes where the kernels change shape: a prompt
 * of 300 tokens (19 KV blocks, many attention tiles, prefill and decode
 * matmul kernels) fed in one batch, in chunks of 64, 7 and 1 (decode), with
 * 1 and 2 threads, gives bitwise-equal logits at every position. GQA group
 * 7 (as Qwen2.5-0.5B), F16 and Q8_0 KV caches, Q8_0, Q4_0, Q4_K and Q6_K
 * weights (the vnni ISA's integer path; the float path on the others) and
 * F16 (whose decode reads its rows in lanes, kernels_internal.h). The same for
 * mixture-of-experts models (qwen3moe, Q8_0, Q4_K and MXFP4 experts), plus a batch
 * mixing two conversations routed to different experts: each token's logits
 * equal those of its conversation run alone. The same for the sliding-window
 * models of ../shared (tiny-gpt-oss: window 8, sinks, YaRN; tiny-gemma3: window
 * 12, pattern 3), whose windows lie between the chunks of 7 and 64, and of
 * make-model's tiny-gemma3 (Q8_0, window 100 > 64) and tiny-gpt-oss (MXFP4
 * experts, window 5 < 7); Gemma 4's per-layer head sizes and KV heads, K = V
 * and experts beside the dense FFN in ../shared's tiny-gemma4 (window 8) and
 * make-model's (Q8_0 weights and KV, heads of 64 and 32, window 5, per-layer
 * embeddings, KV-shared layers, whose logits are those of a pool giving the
 * shared layers K/V of their own). */
#include <unistd.h>

#include "forward.h"
#include "kernels.h"
#include "kvchat.h"
#include "model_gen.h"
#include "test.h"

#define N_TOK 300

static char tmpdir[256];

static bool make(const char *arch, const char *ftype, const char *path)
{
    kvc_gen_params p = kvc_gen_default_params();
    p.arch = arch;
    p.n_expert = 8;
    p.n_expert_used = 3;
    p.n_ff_exp = 256;
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
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 512;
    cp.n_threads = n_threads;
    cp.kv_type = kv_type;
    return test_chunked_logits(m, cp, toks, N_TOK, chunk);
}

/* Every position's logits of the model at path, in one batch and in chunks of
 * 64, 7 and 1 with 1 and 2 threads, on every ISA and both KV types: bitwise
 * equal. label names the model in failures. */
static void check_path(const char *path, const char *label)
{
    kvc_model *m = NULL;
    char err[512];
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "load %s: %s", label, err);
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
            if (kv_types[kv] == KVC_KV_Q8_0 && (m->hp.head_dim % 32 != 0 || m->hp.head_dim_swa % 32 != 0))
                continue;   /* refused by the pool (tiny-gpt-oss: heads of 16) */
            float *base = logits_of(m, toks, N_TOK, 1, kv_types[kv]);
            for (int threads = 1; base && threads <= 2; threads++)
                for (size_t c = 0; c < KVC_ARRAY_LEN(chunks); c++) {
                    float *l = logits_of(m, toks, chunks[c], threads, kv_types[kv]);
                    CHECKF(l && memcmp(base, l, bytes) == 0,
                           "%s %s, KV %s: chunks of %d with %d threads differ from one batch",
                           kvc_isa_name((kvc_isa)isa), label, kv_types[kv] == KVC_KV_F16 ? "f16" : "q8_0",
                           chunks[c], threads);
                    free(l);
                }
            free(base);
        }
    }
    kvc_kernels_set_isa(def);
    kvc_model_free(m);
}

static void check_model(const char *arch, const char *ftype)
{
    char path[512], label[64];
    snprintf(path, sizeof(path), "%s/%s-%s.gguf", tmpdir, arch, ftype);
    snprintf(label, sizeof(label), "%s %s", arch, ftype);
    if (make(arch, ftype, path))
        check_path(path, label);
}

/* A model of ../shared/models, skipped (said) when absent. */
static bool shared_model(const char *name, char *path, size_t size)
{
    const char *dir = test_shared_dir();
    snprintf(path, size, "%s/models/%s.gguf", dir ? dir : "", name);
    if (dir && access(path, R_OK) == 0)
        return true;
    printf("test_kernels_batch: no %s, skipped\n", path);
    return false;
}

/* The logits of n tokens of each of n_seq sequences, fed in one batch
 * (interleaved: a token of each sequence in turn) or one sequence at a time;
 * the last layer's expert selections of the batch into sel (n_seq * n * k). */
static bool run_seqs(kvc_model *m, const int32_t *toks, int n_seq, int n, bool together,
                     float *logits, int32_t *sel)
{
    const kvc_hparams *hp = &m->hp;
    /* one full group, each layer with its own KV heads and head dim (Gemma 4's differ) */
    int32_t kvh[64], hd[64];
    kvc_kv_group groups[KVC_KV_MAX_GROUPS];
    kvc_kv_layer layers[64];
    for (int l = 0; l < hp->n_layer && l < 64; l++)
        kvh[l] = m->layers[l].n_head_kv, hd[l] = m->layers[l].head_dim;
    const int n_groups = kvc_kv_groups_of_layers(hp->n_layer, NULL, kvh, hd, groups, layers, NULL);
    kvc_kv_pool_params pp = { hp->n_layer, hp->n_head_kv, hp->head_dim, 0, KVC_TYPE_F16, 64, n_groups,
                              groups, layers };
    kvc_kv_pool *pool = NULL;
    kvc_compute *c = NULL;
    kvc_err e = { 0 };
    kvc_kv_seq seq[4];
    kvc_batch_item items[4 * 64];
    bool ok = n_seq <= 4 && n <= 64 && kvc_kv_pool_new(&pp, &pool, &e) == KVC_OK &&
              kvc_compute_new(m, n_seq * n, n, 2, &c, &e) == KVC_OK;
    for (int s = 0; ok && s < n_seq; s++) {
        kvc_kv_seq_init(&seq[s]);
        ok = kvc_kv_seq_reserve(pool, &seq[s], n, &e) == KVC_OK;
    }
    for (int r = 0; ok && r < (together ? 1 : n_seq); r++) {
        int k = 0;
        for (int i = 0; i < n; i++)
            for (int s = 0; s < n_seq; s++)
                if (together || s == r)
                    items[k++] = (kvc_batch_item){ toks[s * n + i], i, &seq[s], true };
        float *out = malloc((size_t)k * hp->n_vocab * sizeof(float));
        ok = out && kvc_compute_forward(c, pool, items, k, out, &e) == KVC_OK;
        for (int b = 0; ok && b < k; b++) {
            const int s = (int)(items[b].seq - seq), i = items[b].pos;
            memcpy(logits + ((size_t)s * n + i) * hp->n_vocab, out + (size_t)b * hp->n_vocab,
                   (size_t)hp->n_vocab * sizeof(float));
            if (together && hp->n_expert_used > 0)       /* dense models have no selection */
                memcpy(sel + ((size_t)s * n + i) * hp->n_expert_used,
                       c->moe.sel + (size_t)b * hp->n_expert_used, (size_t)hp->n_expert_used * sizeof(int32_t));
        }
        free(out);
    }
    CHECKF(ok, "run_seqs: %s", e.msg);
    for (int s = 0; pool && s < n_seq; s++)
        kvc_kv_seq_release(pool, &seq[s]);
    kvc_compute_free(c);
    kvc_kv_pool_free(pool);
    return ok;
}

/* Conversations batched together are each token's logits bitwise those of
 * its conversation alone; with experts, they were routed to different ones. */
static void check_mixed_path(const char *path, const char *label)
{
    kvc_model *m = NULL;
    char err[512];
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "load %s: %s", label, err);
    if (!m)
        return;
    enum { NS = 3, NT = 40 };
    int32_t toks[NS * NT];
    for (int i = 0; i < NS * NT; i++)
        toks[i] = (int32_t)((2654435761u * (uint32_t)(i + 7)) % (uint32_t)m->hp.n_vocab);
    const size_t nl = (size_t)NS * NT * m->hp.n_vocab;
    float *alone = malloc(nl * sizeof(float)), *mixed = malloc(nl * sizeof(float));
    int32_t *sel = malloc((size_t)NS * NT * (m->hp.n_expert_used + 1) * sizeof(int32_t));
    const kvc_isa def = kvc_kernels_isa();
    for (int isa = KVC_ISA_SCALAR; isa <= KVC_ISA_VNNI; isa++) {
        if (kvc_kernels_set_isa((kvc_isa)isa) != KVC_OK)
            continue;
        if (!run_seqs(m, toks, NS, NT, false, alone, NULL) || !run_seqs(m, toks, NS, NT, true, mixed, sel))
            break;
        CHECKF(memcmp(alone, mixed, nl * sizeof(float)) == 0,
               "%s %s: a batch of %d conversations differs from each alone",
               kvc_isa_name((kvc_isa)isa), label, NS);
        if (m->hp.n_expert == 0)
            continue;
        /* at some position the conversations' tokens (in the last MoE layer) did not
         * all pick the same experts */
        int distinct = 0;
        for (int i = 0; i < NT && distinct <= m->hp.n_expert_used; i++) {
            int used[256] = { 0 };
            distinct = 0;
            for (int s = 0; s < NS; s++)
                for (int j = 0; j < m->hp.n_expert_used; j++)
                    used[sel[((size_t)s * NT + i) * m->hp.n_expert_used + j]]++;
            for (int x = 0; x < m->hp.n_expert && x < 256; x++)
                distinct += used[x] > 0;
        }
        CHECKF(distinct > m->hp.n_expert_used, "%s: the %d conversations' tokens all picked the same "
               "experts", label, NS);
    }
    kvc_kernels_set_isa(def);
    /* KV-shared layers (Gemma 4): a context's pool gives them no memory of
     * their own (kv.h's shares), run_seqs' keeps theirs, never read */
    const int32_t last = m->hp.n_layer - 1;
    if (m->layers[last].kv_layer != last && run_seqs(m, toks, 1, NT, false, alone, NULL)) {
        kvc_context_params cp = kvc_context_default_params();
        cp.n_ctx = 2 * NT;
        cp.n_threads = 2;
        float *shared = test_chunked_logits(m, cp, toks, NT, 7);
        CHECKF(shared && memcmp(shared, alone, (size_t)NT * m->hp.n_vocab * sizeof(float)) == 0,
               "%s: KV-shared layers without memory of their own change the logits", label);
        free(shared);
    }
    free(alone);
    free(mixed);
    free(sel);
    kvc_model_free(m);
}

static void check_moe_mixed(const char *ftype)
{
    char path[512], label[64];
    snprintf(path, sizeof(path), "%s/mixed-%s.gguf", tmpdir, ftype);
    snprintf(label, sizeof(label), "qwen3moe %s", ftype);
    if (make("qwen3moe", ftype, path))
        check_mixed_path(path, label);
}

/* A sliding-window model of make-model's preset with window n_swa (and, for
 * gemma4, global and sliding head sizes hd and hd_swa, 0: the preset's,
 * per-layer embeddings of width ple, 0: none, and `shared` KV-shared layers). */
static void check_swa_preset(const char *preset, const char *ftype, int n_swa, int hd, int hd_swa, int ple,
                             int shared)
{
    char path[512], label[96];
    snprintf(path, sizeof(path), "%s/%s-%s-w%d.gguf", tmpdir, preset, ftype, n_swa);
    snprintf(label, sizeof(label), "%s %s window %d", preset, ftype, n_swa);
    kvc_gen_params p;
    CHECK_EQ_INT(kvc_gen_preset(preset, &p), KVC_OK);
    p.ftype = ftype;
    p.n_swa = n_swa;
    p.head_dim = hd ? hd : p.head_dim;
    p.head_dim_swa = hd_swa ? hd_swa : p.head_dim_swa;
    p.n_embd_per_layer = ple;
    p.n_kv_shared = shared;
    p.n_threads = 2;
    char err[512];
    CHECKF(kvc_gen_write(&p, path, err, sizeof(err)) == KVC_OK, "gen %s: %s", label, err);
    check_path(path, label);
    check_mixed_path(path, label);
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvc_test_kernels_batch_XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    check_model("qwen2", "q8_0");
    check_model("qwen2", "q4_0");
    check_model("qwen2", "q4_k");
    check_model("qwen2", "q6_k");
    check_model("qwen2", "f16");
    check_model("qwen3moe", "q8_0");
    check_model("qwen3moe", "q4_k");
    check_model("qwen3moe", "mxfp4_moe");
    check_moe_mixed("q8_0");
    check_moe_mixed("f32");
    /* sliding windows below a chunk of 7 and above one of 64 (q8_0 weights, MXFP4 experts) */
    check_swa_preset("tiny-gemma3", "q8_0", 100, 0, 0, 0, 0);
    check_swa_preset("tiny-gpt-oss", "mxfp4_moe", 5, 0, 0, 0, 0);
    /* heads of 64 and 32 (Q8_0 KV too), PLE, the last 3 layers KV-shared */
    check_swa_preset("tiny-gemma4", "q8_0", 5, 64, 32, 32, 3);
    /* sliding windows (8 and 12) between the chunks of 7 and 64, sinks, YaRN */
    const char *const shared[] = { "tiny-gpt-oss-f32", "tiny-gemma3-f32", "tiny-gemma4-f32" };
    for (size_t i = 0; i < KVC_ARRAY_LEN(shared); i++) {
        char path[4400];
        if (shared_model(shared[i], path, sizeof(path))) {
            check_path(path, shared[i]);
            check_mixed_path(path, shared[i]);
        }
    }
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_done("test_kernels_batch");
}
