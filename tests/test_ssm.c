/* test_ssm.c - the recurrent layers of the hybrid models (lfm2's short
 * convolution, granitehybrid's Mamba-2; forward_ssm.c) are invariant:
 *  - a prompt of 150 tokens fed in one batch, in chunks of 64, 7 and 1, with
 *    1 and 2 threads, on every ISA this CPU has: every position's logits and
 *    the recurrent state after the prompt are bitwise equal;
 *  - three sequences interleaved in one batch: each one's logits and state
 *    equal those of the sequence run alone;
 *  - the Mamba-2 scan step's AVX2 path gives the scalar reference's bits;
 *  - a context shift is refused with an error that says why;
 *  - sessions: a conversation sharing cached blocks with another, the next
 *    turn and an edited message run and equal a cold run;
 *  - make-model refuses bad hybrid parameters, naming them.
 * Models: make-model's tiny-lfm2, tiny-granitehybrid and tiny-nemotron_h_moe
 * (F32, and Q8_0 for the integer matmul paths), tiny-lfm2moe and
 * tiny-nemotron_h, an lfm2 with a sliding window of 5 on its
 * attention layers, a granitehybrid with a state size N = 12 (the scan's
 * scalar path on every ISA). Needs nothing from ../shared. */
#include <unistd.h>

#include "context.h"
#include "forward.h"
#include "kernels.h"
#include "kvchat.h"
#include "model_gen.h"
#include "ssm_scan.h"
#include "test.h"

#define N_TOK 150

static char tmpdir[256];

/* A pool for model m's layers (recurrent ones keep a state), F16 K/V. */
static kvc_kv_pool *pool_for(const kvc_model *m, int64_t n_blocks)
{
    const kvc_hparams *hp = &m->hp;
    kvc_kv_layer layers[64];
    if (hp->n_layer > 64)
        return NULL;
    for (int32_t l = 0; l < hp->n_layer; l++)
        layers[l] = (kvc_kv_layer){ 0, m->layers[l].n_head_kv, m->layers[l].head_dim, m->layers[l].state_floats };
    kvc_kv_group full = { KVC_KV_FULL, 0, 0 };
    kvc_kv_pool_params pp = { hp->n_layer, hp->n_head_kv, hp->head_dim, 0, KVC_TYPE_F16, n_blocks, 1, &full, layers };
    kvc_kv_pool *pool = NULL;
    kvc_err e = { 0 };
    CHECKF(kvc_kv_pool_new(&pp, &pool, &e) == KVC_OK, "pool: %s", e.msg);
    return pool;
}

/* The logits of n_seq sequences of n tokens each ([s][i][V]) and their states
 * after them ([s][state floats]), fed in batches of `chunk` tokens per
 * sequence, the sequences' tokens interleaved within a batch when together,
 * else one sequence after the other. */
static bool run(kvc_model *m, const int32_t *toks, int n_seq, int n, int chunk, int n_threads, bool together,
                float *logits, float *states)
{
    const kvc_hparams *hp = &m->hp;
    kvc_kv_pool *pool = pool_for(m, (int64_t)n_seq * (n / KVC_BLOCK_TOKENS + 2));
    kvc_compute *c = NULL;
    kvc_err e = { 0 };
    kvc_kv_seq seq[4];
    kvc_batch_item items[4 * N_TOK];
    float *out = malloc((size_t)n_seq * chunk * hp->n_vocab * sizeof(float));
    bool ok = pool && out && n_seq <= 4 && n <= N_TOK &&
              kvc_compute_new(m, n_seq * chunk, n, n_threads, &c, &e) == KVC_OK;
    for (int s = 0; s < n_seq; s++)
        kvc_kv_seq_init(&seq[s]);
    for (int s = 0; ok && s < n_seq; s++)
        ok = kvc_kv_seq_reserve(pool, &seq[s], n, &e) == KVC_OK;
    for (int r = 0; ok && r < (together ? 1 : n_seq); r++)
        for (int i0 = 0; ok && i0 < n; i0 += chunk) {
            int k = 0;
            for (int i = i0; i < n && i < i0 + chunk; i++)
                for (int s = 0; s < n_seq; s++)
                    if (together || s == r)
                        items[k++] = (kvc_batch_item){ toks[s * n + i], i, &seq[s], true };
            ok = kvc_compute_forward(c, pool, items, k, out, &e) == KVC_OK;
            for (int b = 0; ok && b < k; b++)
                memcpy(logits + ((size_t)(items[b].seq - seq) * n + items[b].pos) * hp->n_vocab,
                       out + (size_t)b * hp->n_vocab, (size_t)hp->n_vocab * sizeof(float));
        }
    const int64_t sf = pool ? kvc_kv_state_floats(pool) : 0;
    for (int s = 0; ok && s < n_seq; s++)
        memcpy(states + s * sf, seq[s].state, (size_t)sf * sizeof(float));
    CHECKF(ok, "run: %s", e.msg);
    for (int s = 0; pool && s < n_seq; s++)
        kvc_kv_seq_release(pool, &seq[s]);
    kvc_compute_free(c);
    kvc_kv_pool_free(pool);
    free(out);
    return ok;
}

/* Chunkings, threads and ISAs; then sequences mixed in a batch. */
static void check_model(const char *path, const char *label, int32_t n_swa)
{
    kvc_model *m = NULL;
    char err[512];
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "load %s: %s", label, err);
    if (!m)
        return;
    const int64_t V = m->hp.n_vocab;
    int64_t sf = 0;
    for (int32_t l = 0; l < m->hp.n_layer; l++)
        sf += m->layers[l].state_floats;
    CHECKF(sf > 0, "%s: no recurrent layer", label);
    for (int32_t l = 0; l < m->hp.n_layer; l++)   /* attention layers slide by the model's window */
        CHECK_EQ_INT(m->layers[l].window, m->layers[l].state_floats ? 0 : n_swa);
    int32_t toks[3 * N_TOK];
    for (int i = 0; i < 3 * N_TOK; i++)
        toks[i] = (int32_t)((1000003u * (uint32_t)(i + 1)) % (uint32_t)V);
    const size_t lb = (size_t)N_TOK * V * sizeof(float), sb = (size_t)sf * sizeof(float);
    float *base_l = malloc(3 * lb), *base_s = malloc(3 * sb), *l = malloc(3 * lb), *s = malloc(3 * sb);
    const int chunks[] = { 64, 7, 1 };
    const kvc_isa def = kvc_kernels_isa();
    for (int isa = KVC_ISA_SCALAR; isa <= KVC_ISA_VNNI; isa++) {
        if (kvc_kernels_set_isa((kvc_isa)isa) != KVC_OK)
            continue;
        if (!run(m, toks, 1, N_TOK, N_TOK, 1, true, base_l, base_s))
            break;
        bool nonzero = false;
        for (int64_t j = 0; j < sf; j++)
            nonzero |= base_s[j] != 0.0f;
        CHECKF(nonzero, "%s: the state after the prompt is all zero", label);
        for (int threads = 1; threads <= 2; threads++)
            for (size_t c = 0; c < KVC_ARRAY_LEN(chunks); c++) {
                bool ok = run(m, toks, 1, N_TOK, chunks[c], threads, true, l, s);
                CHECKF(ok && memcmp(base_l, l, lb) == 0, "%s %s: logits, chunks of %d with %d threads differ "
                       "from one batch", kvc_isa_name((kvc_isa)isa), label, chunks[c], threads);
                CHECKF(ok && memcmp(base_s, s, sb) == 0, "%s %s: state, chunks of %d with %d threads differs "
                       "from one batch", kvc_isa_name((kvc_isa)isa), label, chunks[c], threads);
            }
        /* three sequences in one batch (interleaved), in chunks of 64 and of 7, vs each alone */
        for (size_t c = 0; c < 2; c++) {
            bool ok = run(m, toks, 3, N_TOK, N_TOK, 2, false, base_l, base_s) &&
                      run(m, toks, 3, N_TOK, chunks[c], 2, true, l, s);
            CHECKF(ok && memcmp(base_l, l, 3 * lb) == 0, "%s %s: logits of 3 sequences batched (chunks of %d) "
                   "differ from each alone", kvc_isa_name((kvc_isa)isa), label, chunks[c]);
            CHECKF(ok && memcmp(base_s, s, 3 * sb) == 0, "%s %s: states of 3 sequences batched (chunks of %d) "
                   "differ from each alone", kvc_isa_name((kvc_isa)isa), label, chunks[c]);
        }
    }
    kvc_kernels_set_isa(def);
    free(base_l);
    free(base_s);
    free(l);
    free(s);
    kvc_model_free(m);
}

/* The scan step's AVX2 path against the scalar reference, bitwise. */
static void check_scan_kernel(void)
{
    const kvc_isa def = kvc_kernels_isa();
    if (kvc_kernels_set_isa(KVC_ISA_AVX2) != KVC_OK) {
        printf("test_ssm: no AVX2, scan kernel comparison skipped\n");
        return;
    }
    kvc_kernels_set_isa(def);
    const int32_t Ns[] = { 8, 16, 128 }, hds[] = { 1, 7, 64 };
    uint64_t r = 12345;
    for (size_t a = 0; a < KVC_ARRAY_LEN(Ns); a++)
        for (size_t b = 0; b < KVC_ARRAY_LEN(hds); b++) {
            const int32_t N = Ns[a], hd = hds[b];
            float S0[64 * 128], S1[64 * 128], x[64], B[128], C[128], y0[64], y1[64];
            for (int32_t i = 0; i < hd * N; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                S0[i] = S1[i] = (float)((int64_t)(r >> 33) % 20001 - 10000) / 3000.0f;
            }
            for (int32_t i = 0; i < N; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                B[i] = (float)((int64_t)(r >> 40) % 2001 - 1000) / 700.0f;
                C[i] = (float)((int64_t)(r >> 20) % 2001 - 1000) / 900.0f;
            }
            for (int32_t i = 0; i < hd; i++)
                x[i] = (float)(i % 13) / 5.0f - 1.1f;
            for (int step = 0; step < 3; step++) {   /* the state carried over three tokens */
                kvc_ssm_scan_head_isa(KVC_ISA_SCALAR, S0, x, B, C, 0.93f, 0.61f, hd, N, y0);
                kvc_ssm_scan_head_isa(KVC_ISA_AVX2, S1, x, B, C, 0.93f, 0.61f, hd, N, y1);
            }
            CHECKF(memcmp(S0, S1, (size_t)hd * N * sizeof(float)) == 0 &&
                   memcmp(y0, y1, (size_t)hd * sizeof(float)) == 0,
                   "scan: AVX2 differs from the scalar reference (N %d, hd %d)", N, hd);
        }
}

/* The convolution's AVX2 path against the scalar reference, bitwise: outputs
 * and the state over three tokens, for K 1..4 (lfm2 3, Mamba-2 and GDN 4),
 * channel counts with and without a tail, bias, silu, u_mul and y_mul (lfm2)
 * on and off, in place (y = u, GDN) and not; inputs reaching silu's regions (< -80, -0, big). */
static void check_conv_kernel(void)
{
    const kvc_isa def = kvc_kernels_isa();
    if (kvc_kernels_set_isa(KVC_ISA_AVX2) != KVC_OK) {
        printf("test_ssm: no AVX2, conv kernel comparison skipped\n");
        return;
    }
    kvc_kernels_set_isa(def);
    enum { LD = 80 };
    const int64_t ns[] = { 1, 7, 8, 13, 64, 80 };
    uint64_t r = 777;
    for (int32_t K = 1; K <= 4; K++)
        for (size_t a = 0; a < KVC_ARRAY_LEN(ns); a++)
            for (int v = 0; v < 32; v++) {   /* bits: 0 bias, 1 silu, 2 in place, 3 u_mul, 4 y_mul */
                const int64_t n = ns[a];
                float st[2][3 * LD], wt[4 * LD], bias[LD], u[2][LD], y[2][LD], um[LD], ym[LD];
                for (int64_t i = 0; i < 3 * LD; i++) {
                    r = r * 6364136223846793005ull + 1442695040888963407ull;
                    st[0][i] = st[1][i] = (float)((int64_t)(r >> 33) % 20001 - 10000) / 400.0f;
                }
                for (int64_t i = 0; i < 4 * LD; i++) {
                    r = r * 6364136223846793005ull + 1442695040888963407ull;
                    wt[i] = (float)((int64_t)(r >> 33) % 2001 - 1000) / 300.0f;
                }
                for (int64_t i = 0; i < LD; i++) {
                    bias[i] = (float)(i % 11) / 4.0f - 1.2f;
                    um[i] = (float)(i % 7) / 3.0f - 0.9f;
                    ym[i] = (float)(i % 5) / 2.0f - 1.1f;
                }
                for (int step = 0; step < 3; step++) {
                    for (int64_t i = 0; i < LD; i++) {
                        r = r * 6364136223846793005ull + 1442695040888963407ull;
                        u[0][i] = u[1][i] = i % 9 == 4 ? -0.0f : i % 9 == 5 ? -900.0f
                                          : (float)((int64_t)(r >> 33) % 20001 - 10000) / 500.0f;
                    }
                    for (int p = 0; p < 2; p++)
                        kvc_conv_step_isa(p ? KVC_ISA_AVX2 : KVC_ISA_SCALAR, &(kvc_conv_args){
                            .st = st[p], .ld_st = LD, .wt = wt, .ld_w = LD, .K = K, .u = u[p],
                            .u_mul = v & 8 ? um : NULL, .bias = v & 1 ? bias : NULL, .silu = v & 2,
                            .y_mul = v & 16 ? ym : NULL, .y = v & 4 ? u[p] : y[p], .n = n });
                    const float *y0 = v & 4 ? u[0] : y[0], *y1 = v & 4 ? u[1] : y[1];
                    CHECKF(memcmp(st[0], st[1], sizeof(st[0])) == 0 && memcmp(y0, y1, (size_t)n * sizeof(float)) == 0,
                           "conv: AVX2 differs from the scalar reference (K %d, n %lld, variant %d, token %d)",
                           K, (long long)n, v, step);
                }
            }
}

/* A context shift on a hybrid model: refused, saying why. */
static void check_shift_refused(const char *path)
{
    kvc_model *m = NULL;
    char err[512];
    if (kvc_model_load(path, NULL, &m, err, sizeof(err)) != KVC_OK) {
        CHECKF(0, "load: %s", err);
        return;
    }
    kvc_engine_params ep = kvc_engine_default_params();
    ep.n_ctx = 256;
    ep.n_parallel = 1;
    ep.n_threads = 1;
    ep.overflow = KVC_OVERFLOW_SHIFT;
    kvc_engine *e = NULL;
    int rc = kvc_engine_new(m, &ep, &e, err, sizeof(err));
    CHECK_EQ_INT(rc, KVC_ERR_UNSUPPORTED);
    CHECKF(strstr(err, "context shift") && strstr(err, "not supported") && strstr(err, "recurrent"), "%s", err);
    CHECK(e == NULL);
    kvc_engine_free(e);
    /* the kernel itself refuses too */
    kvc_compute *c = NULL;
    kvc_err ce = { 0 };
    kvc_kv_pool *pool = pool_for(m, 8);
    kvc_kv_seq seq;
    kvc_kv_seq_init(&seq);
    CHECK(pool && kvc_compute_new(m, 8, 64, 1, &c, &ce) == KVC_OK);
    if (c && pool) {
        CHECK_EQ_INT(kvc_compute_shift_k(c, pool, &seq, 0, 0, 4, &ce), KVC_ERR_UNSUPPORTED);
        CHECKF(strstr(ce.msg, "recurrent"), "%s", ce.msg);
    }
    kvc_compute_free(c);
    kvc_kv_pool_free(pool);
    kvc_model_free(m);
}

static bool make(const char *preset, const char *ftype, int32_t d_state, int32_t n_swa, const char *path)
{
    kvc_gen_params p;
    kvc_gen_preset(preset, &p);
    p.ftype = ftype;
    p.n_threads = 1;
    p.n_swa = n_swa;
    if (d_state)
        p.ssm_d_state = d_state;
    char err[512];
    int rc = kvc_gen_write(&p, path, err, sizeof(err));
    CHECKF(rc == KVC_OK, "gen %s %s: %s", preset, ftype, err);
    return rc == KVC_OK;
}

/* One reply to msgs on session s (no_cache: a cold run); malloc'd, NULL on failure. */
static char *reply_of(kvc_session *s, const kvc_chat_message *msgs, size_t n, bool no_cache, kvc_chat_stats *st)
{
    kvc_chat_params p = kvc_chat_default_params();
    p.max_tokens = 16;
    p.sampling.temperature = 0;
    p.no_cache = no_cache;
    char *reply = NULL, err[512];
    int rc = kvc_session_chat(s, msgs, n, &p, NULL, NULL, &reply, st, err, sizeof(err));
    CHECKF(rc == KVC_OK, "chat (%s): %s", no_cache ? "cold" : "cached", err);
    return rc == KVC_OK ? reply : NULL;
}

/* Sessions on a hybrid model, with a disk tier asked for: a conversation
 * sharing a prefix with another one's cached blocks (no recurrent state is
 * kept for it yet, so nothing is reused), the next turn of a conversation, and
 * an edited earlier message all run and equal a cold run. */
static void check_sessions(const char *path)
{
    kvc_model *m = NULL;
    char err[512];
    if (kvc_model_load(path, NULL, &m, err, sizeof(err)) != KVC_OK) {
        CHECKF(0, "load: %s", err);
        return;
    }
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 512;
    cp.n_seq = 3;
    cp.n_threads = 1;
    kvc_context *ctx = NULL;
    kvc_session *a = NULL, *b = NULL, *cold = NULL;
    if (kvc_context_new(m, &cp, &ctx, err, sizeof(err)) == KVC_OK) {
        /* a disk tier: blocks and state snapshots spill there (snapshot.h) */
        char dir[300];
        snprintf(dir, sizeof(dir), "%s/kv", tmpdir);
        kvc_err e = { 0 };
        CHECKF(kvc_context_set_tiers(ctx, path, dir, 64, NULL, &e) == KVC_OK, "tiers: %s", e.msg);
        a = kvc_session_new(ctx, 0, NULL, err, sizeof(err));
        b = kvc_session_new(ctx, 1, NULL, err, sizeof(err));
        cold = kvc_session_new(ctx, 2, NULL, err, sizeof(err));
    }
    CHECKF(a && b && cold, "context and sessions: %s", err);
    const char *sys = "You are a helpful assistant who tells long stories about small animals in a forest.";
    kvc_chat_message x[4] = { { "system", sys }, { "user", "Tell me about the fox." } };
    kvc_chat_message y[2] = { { "system", sys }, { "user", "Tell me about the owl instead." } };
    kvc_chat_stats st = { 0 };
    char *r1 = a ? reply_of(a, x, 2, false, &st) : NULL;
    char *r2 = b ? reply_of(b, y, 2, false, &st) : NULL;   /* shares the system prompt's blocks */
    char *c2 = r2 ? reply_of(cold, y, 2, true, &st) : NULL;
    CHECKF(r2 && c2 && strcmp(r2, c2) == 0, "shared prefix: '%s' vs cold '%s'", r2 ? r2 : "", c2 ? c2 : "");
    if (r1) {   /* the next turn of x, then x with its first user message edited */
        x[2] = (kvc_chat_message){ "assistant", r1 };
        x[3] = (kvc_chat_message){ "user", "And then?" };
        char *r3 = reply_of(a, x, 4, false, &st), *c3 = reply_of(cold, x, 4, true, &st);
        CHECKF(r3 && c3 && strcmp(r3, c3) == 0, "next turn: '%s' vs cold '%s'", r3 ? r3 : "", c3 ? c3 : "");
        x[1].content = "Tell me about the bear.";
        char *r4 = reply_of(a, x, 4, false, &st);
        /* served from a state snapshot before the edit (snapshot.h), the rest
         * computed, and said so */
        CHECK(st.cached_tokens < st.prompt_tokens);
        CHECK_EQ_INT(st.cached_tokens + st.computed_tokens, st.prompt_tokens);
        char *c4 = reply_of(cold, x, 4, true, &st);
        CHECKF(r4 && c4 && strcmp(r4, c4) == 0, "edited: '%s' vs cold '%s'", r4 ? r4 : "", c4 ? c4 : "");
        free(r3), free(c3), free(r4), free(c4);
    }
    free(r1), free(r2), free(c2);
    kvc_session_free(a);
    kvc_session_free(b);
    kvc_session_free(cold);
    kvc_context_free(ctx);
    kvc_model_free(m);
}

/* make-model's hybrid parameters: bad ones refused with a message naming them. */
static void check_gen_errors(void)
{
    static const struct { const char *preset, *kv, *want; } bad[] = {
        { "tiny-lfm2", "0,x", "kv_heads \"0,x\": expected comma-separated integers" },
        { "tiny-lfm2", "", "kv_heads \"\": expected comma-separated integers" },
        { "tiny-lfm2", "0", "kv_heads: no attention layer among the 8 layers" },
        { "tiny-granitehybrid", "0,3", "kv_heads: layer 1 has 3 KV heads for 4 heads" },
        { "tiny", "0,2", "arch \"qwen2\" has no recurrent layers" },
    };
    char path[300], err[512];
    snprintf(path, sizeof(path), "%s/bad.gguf", tmpdir);
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad); i++) {
        kvc_gen_params p;
        kvc_gen_preset(bad[i].preset, &p);
        p.kv_heads = bad[i].kv;
        CHECK_EQ_INT(kvc_gen_write(&p, path, err, sizeof(err)), KVC_ERR_INVALID_ARG);
        CHECKF(strstr(err, bad[i].want), "%s kv_heads '%s': %s", bad[i].preset, bad[i].kv, err);
    }
    static const struct { const char *preset, *pattern; int32_t lead; const char *want; } bad2[] = {
        { "tiny-nemotron_h", "M*x", 0, "layer_pattern \"M*x\": letters M * - E" },
        { "tiny-nemotron_h", "M-", 0, "no attention layer among the 7 layers" },
        { "tiny-lfm2", "M*-", 0, "layer_pattern \"M*-\": letters M * - E, for nemotron_h" },
        { "tiny-lfm2moe", NULL, 9, "n_dense_lead 9: 0 to n_layer, for lfm2moe" },
        { "tiny-granitehybrid", NULL, 1, "n_dense_lead 1: 0 to n_layer, for lfm2moe" },
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad2); i++) {
        kvc_gen_params p;
        kvc_gen_preset(bad2[i].preset, &p);
        p.layer_pattern = bad2[i].pattern;
        p.n_dense_lead = bad2[i].lead;
        CHECK_EQ_INT(kvc_gen_write(&p, path, err, sizeof(err)), KVC_ERR_INVALID_ARG);
        CHECKF(strstr(err, bad2[i].want), "%s: %s", bad2[i].preset, err);
    }
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvc_test_ssm_XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    check_scan_kernel();
    check_conv_kernel();
    check_gen_errors();
    static const struct { const char *preset, *ftype; int32_t d_state, n_swa; bool sessions; } models[] = {
        { "tiny-lfm2", "f32", 0, 0, true },
        { "tiny-lfm2", "q8_0", 0, 0, false },
        { "tiny-lfm2", "f32", 0, 5, false },            /* every attention layer slides, window < 7 */
        { "tiny-granitehybrid", "f32", 0, 0, true },
        { "tiny-granitehybrid", "q8_0", 0, 0, false },
        { "tiny-granitehybrid", "f32", 12, 0, false },  /* N % 8 != 0: the scan's scalar path everywhere */
        { "tiny-nemotron_h_moe", "f32", 0, 0, true },   /* Mamba-2, attention, MoE: a layer each */
        { "tiny-nemotron_h_moe", "q8_0", 0, 0, false },
        { "tiny-lfm2moe", "f32", 0, 0, true },          /* dense first layers, then experts */
        { "tiny-nemotron_h", "f32", 0, 0, true },       /* ReLU² MLP layers */
    };
    char path[512], label[96];
    for (size_t i = 0; i < KVC_ARRAY_LEN(models); i++) {
        snprintf(path, sizeof(path), "%s/m%zu.gguf", tmpdir, i);
        snprintf(label, sizeof(label), "%s %s N=%d window %d", models[i].preset, models[i].ftype,
                 models[i].d_state, models[i].n_swa);
        if (make(models[i].preset, models[i].ftype, models[i].d_state, models[i].n_swa, path)) {
            check_model(path, label, models[i].n_swa);
            if (i == 0)
                check_shift_refused(path);
            if (models[i].sessions)
                check_sessions(path);
        }
    }
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_done("test_ssm");
}
