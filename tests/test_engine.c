/* test_engine.c - the forward pass on generated models, without ../shared.
 *
 *  1. Every architecture x weight type against a float64 reference forward
 *     written here from the GGUF's dequantized weights (independent of forward.c).
 *  2. Batch invariance: a prompt prefilled in one batch, in chunks of 1, 7 and
 *     64 tokens, with 1 and 2 threads, gives bitwise-equal logits.
 *  3. Truncate and recompute (an edit) gives bitwise the same logits as a cold run. */
#include <unistd.h>

#include "gguf.h"
#include "kvchat.h"
#include "model_gen.h"
#include "quant.h"
#include "test.h"

/* --------------------------------------------------- float64 reference */

typedef struct ref_model {
    gguf_file *f;
    int d, L, H, KV, hd, ff, V;
    double eps, theta;
    bool neox, qwen2, qwen3;
} ref_model;

static double *tensor_f64(const ref_model *r, const char *name, int64_t *n_out)
{
    const gguf_tensor *t = gguf_find_tensor(r->f, name);
    if (!t)
        return NULL;
    int64_t n = t->ne[0] * t->ne[1];
    float *tmp = malloc((size_t)n * sizeof(float));
    kvc_dequantize_row_ref(t->type, t->data, tmp, n);
    double *out = malloc((size_t)n * sizeof(double));
    for (int64_t i = 0; i < n; i++)
        out[i] = tmp[i];
    free(tmp);
    if (n_out)
        *n_out = n;
    return out;
}

static double *layer_t(const ref_model *r, int l, const char *what)
{
    char name[96];
    snprintf(name, sizeof(name), "blk.%d.%s", l, what);
    return tensor_f64(r, name, NULL);
}

/* y[o] = sum_i W[o][i] x[i] (+ b[o]) */
static void mv(const double *W, const double *x, int n_in, int n_out, const double *b, double *y)
{
    for (int o = 0; o < n_out; o++) {
        double s = b ? b[o] : 0;
        for (int i = 0; i < n_in; i++)
            s += W[(int64_t)o * n_in + i] * x[i];
        y[o] = s;
    }
}

static void rms(double *y, const double *x, const double *w, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        y[i] = x[i] * s * w[i];
}

static void rope(double *x, int hd, int pos, double theta, bool neox)
{
    for (int i = 0; i < hd / 2; i++) {
        double th = pos * pow(theta, -2.0 * i / hd);
        int a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
        double x0 = x[a], x1 = x[b];
        x[a] = x0 * cos(th) - x1 * sin(th);
        x[b] = x0 * sin(th) + x1 * cos(th);
    }
}

/* Logits [n][V] of every position of toks. */
static double *ref_forward(const ref_model *r, const int32_t *toks, int n)
{
    int d = r->d, hd = r->hd, nq = r->H * hd, nkv = r->KV * hd;
    double *x = calloc((size_t)n * d, sizeof(double));
    double *emb = tensor_f64(r, "token_embd.weight", NULL);
    for (int t = 0; t < n; t++)
        memcpy(x + (int64_t)t * d, emb + (int64_t)toks[t] * d, (size_t)d * sizeof(double));
    double *K = malloc((size_t)n * nkv * sizeof(double)), *Vv = malloc((size_t)n * nkv * sizeof(double));
    double *h = malloc((size_t)d * sizeof(double)), *q = malloc((size_t)nq * sizeof(double));
    double *att = malloc((size_t)nq * sizeof(double)), *o = malloc((size_t)d * sizeof(double));
    double *g = malloc((size_t)r->ff * sizeof(double)), *u = malloc((size_t)r->ff * sizeof(double));
    double *Q = malloc((size_t)n * nq * sizeof(double)), *sc = malloc((size_t)n * sizeof(double));
    for (int l = 0; l < r->L; l++) {
        double *an = layer_t(r, l, "attn_norm.weight"), *wq = layer_t(r, l, "attn_q.weight");
        double *wk = layer_t(r, l, "attn_k.weight"), *wv = layer_t(r, l, "attn_v.weight");
        double *wo = layer_t(r, l, "attn_output.weight"), *fn = layer_t(r, l, "ffn_norm.weight");
        double *wg = layer_t(r, l, "ffn_gate.weight"), *wu = layer_t(r, l, "ffn_up.weight");
        double *wd = layer_t(r, l, "ffn_down.weight");
        double *bq = layer_t(r, l, "attn_q.bias"), *bk = layer_t(r, l, "attn_k.bias");
        double *bv = layer_t(r, l, "attn_v.bias");
        double *qn = layer_t(r, l, "attn_q_norm.weight"), *kn = layer_t(r, l, "attn_k_norm.weight");
        for (int t = 0; t < n; t++) {
            rms(h, x + (int64_t)t * d, an, d, r->eps);
            mv(wq, h, d, nq, bq, Q + (int64_t)t * nq);
            mv(wk, h, d, nkv, bk, K + (int64_t)t * nkv);
            mv(wv, h, d, nkv, bv, Vv + (int64_t)t * nkv);
            for (int hh = 0; hh < r->H; hh++) {
                double *qh = Q + (int64_t)t * nq + hh * hd;
                if (qn)
                    rms(qh, qh, qn, hd, r->eps);
                rope(qh, hd, t, r->theta, r->neox);
            }
            for (int hh = 0; hh < r->KV; hh++) {
                double *kh = K + (int64_t)t * nkv + hh * hd;
                if (kn)
                    rms(kh, kh, kn, hd, r->eps);
                rope(kh, hd, t, r->theta, r->neox);
            }
        }
        for (int t = 0; t < n; t++) {
            for (int hh = 0; hh < r->H; hh++) {
                int kvh = hh / (r->H / r->KV);
                const double *qh = Q + (int64_t)t * nq + hh * hd;
                double mx = -1e300, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double s = 0;
                    for (int e = 0; e < hd; e++)
                        s += qh[e] * K[(int64_t)j * nkv + kvh * hd + e];
                    sc[j] = s / sqrt((double)hd);
                    if (sc[j] > mx)
                        mx = sc[j];
                }
                for (int j = 0; j <= t; j++)
                    sum += (sc[j] = exp(sc[j] - mx));
                for (int e = 0; e < hd; e++) {
                    double a = 0;
                    for (int j = 0; j <= t; j++)
                        a += sc[j] * Vv[(int64_t)j * nkv + kvh * hd + e];
                    att[hh * hd + e] = a / sum;
                }
            }
            double *xt = x + (int64_t)t * d;
            mv(wo, att, nq, d, NULL, o);
            for (int i = 0; i < d; i++)
                xt[i] += o[i];
            rms(h, xt, fn, d, r->eps);
            mv(wg, h, d, r->ff, NULL, g);
            mv(wu, h, d, r->ff, NULL, u);
            for (int i = 0; i < r->ff; i++)
                g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            mv(wd, g, r->ff, d, NULL, o);
            for (int i = 0; i < d; i++)
                xt[i] += o[i];
        }
        double *ps[] = { an, wq, wk, wv, wo, fn, wg, wu, wd, bq, bk, bv, qn, kn };
        for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++)
            free(ps[i]);
    }
    double *on = tensor_f64(r, "output_norm.weight", NULL);
    double *out_w = tensor_f64(r, "output.weight", NULL);
    if (!out_w)
        out_w = emb, emb = NULL;
    double *logits = malloc((size_t)n * r->V * sizeof(double));
    for (int t = 0; t < n; t++) {
        rms(h, x + (int64_t)t * d, on, d, r->eps);
        mv(out_w, h, d, r->V, NULL, logits + (int64_t)t * r->V);
    }
    free(on); free(out_w); free(emb); free(x); free(K); free(Vv); free(h); free(q);
    free(att); free(o); free(g); free(u); free(Q); free(sc);
    return logits;
}

/* ------------------------------------------------------------- helpers */

static char tmpdir[256];

static bool make(const char *arch, const char *ftype, const char *vocab, const char *path)
{
    kvc_gen_params p = kvc_gen_default_params();
    p.arch = arch;
    p.ftype = ftype;
    p.vocab = vocab;
    p.n_embd = 256;
    p.n_layer = 2;
    p.n_head = 4;
    p.n_head_kv = arch[0] == 'q' && arch[4] == '3' ? 1 : 2;
    p.head_dim = 64;
    p.n_ff = 512;
    p.n_ctx = 1024;
    p.tied = strcmp(arch, "llama") != 0;
    kvc_err e = { 0 };
    int rc = kvc_gen_model(&p, path, &e);
    CHECKF(rc == KVC_OK, "gen %s %s: %s", arch, ftype, e.msg);
    return rc == KVC_OK;
}

/* All logits [n][V] of toks, fed in chunks of `chunk` with n_threads. */
static float *engine_logits(kvc_model *m, const int32_t *toks, int n, int chunk, int n_threads,
                            int kv_type)
{
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 512;
    cp.n_threads = n_threads;
    cp.kv_type = kv_type;
    return test_chunked_logits(m, cp, toks, n, chunk);
}

static int32_t *some_tokens(kvc_model *m, int *n)
{
    const char *text = "The quick brown fox jumps over the lazy dog. Once upon a time, there was a "
                       "little robot who wanted to learn how to paint. Every morning it rolled to "
                       "the window and looked at the sky, counting colours: blue, grey, gold.";
    int32_t *t = malloc(512 * sizeof(int32_t));
    *n = (int)kvc_model_tokenize(m, text, strlen(text), true, false, t, 512);
    return t;
}

/* ---------------------------------------------------------------- tests */

static void test_against_reference(const char *arch, const char *ftype, const char *vocab)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s-%s.gguf", tmpdir, arch, ftype);
    if (!make(arch, ftype, vocab, path))
        return;
    kvc_model *m = NULL;
    char err[512];
    int rc = kvc_model_load(path, NULL, &m, err, sizeof(err));
    CHECKF(rc == KVC_OK, "load %s: %s", path, err);
    if (rc)
        return;
    int n;
    int32_t *toks = some_tokens(m, &n);
    if (n > 40)
        n = 40;
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    float *got = engine_logits(m, toks, n, 16, 2, KVC_KV_F32);

    ref_model r = { 0 };
    kvc_err e = { 0 };
    CHECK(gguf_open(path, &r.f, &e) == KVC_OK);
    r.d = info.n_embd; r.L = info.n_layer; r.H = info.n_head; r.KV = info.n_head_kv;
    r.hd = info.head_dim; r.ff = info.n_ff; r.V = info.n_vocab;
    float eps = 1e-6f, theta = 10000.f;
    char key[96];
    snprintf(key, sizeof(key), "%s.attention.layer_norm_rms_epsilon", arch);
    gguf_get_f32(r.f, key, &eps, NULL);
    snprintf(key, sizeof(key), "%s.rope.freq_base", arch);
    gguf_get_f32(r.f, key, &theta, NULL);
    r.eps = eps;
    r.theta = theta;
    r.neox = strcmp(arch, "llama") != 0;
    double *want = ref_forward(&r, toks, n);
    double worst = 0, scale = 0;
    for (int64_t i = 0; got && i < (int64_t)n * r.V; i++) {
        double dd = fabs(got[i] - want[i]);
        if (dd > worst)
            worst = dd;
        if (fabs(want[i]) > scale)
            scale = fabs(want[i]);
    }
    /* f32 KV: only float32 rounding separates us from exact */
    CHECKF(worst <= 1e-3 * (scale > 1 ? scale : 1), "%s %s: max |dlogit| %.3g (logit scale %.3g)",
           arch, ftype, worst, scale);
    printf("  %-6s %-7s max |dlogit| vs float64 = %.2e (max |logit| %.1f)\n", arch, ftype, worst, scale);
    free(want);
    free(got);
    free(toks);
    gguf_close(r.f);
    kvc_model_free(m);
}

static void test_batch_invariance(void)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/inv.gguf", tmpdir);
    if (!make("qwen2", "q8_0", "bpe", path))
        return;
    kvc_model *m = NULL;
    char err[512];
    CHECK(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK);
    if (!m)
        return;
    int n;
    int32_t *toks = some_tokens(m, &n);
    CHECK(n > 64);
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    size_t bytes = (size_t)n * info.n_vocab * sizeof(float);
    float *base = engine_logits(m, toks, n, n, 1, KVC_KV_F16);
    const int chunks[] = { 1, 7, 64, n };
    for (int threads = 1; threads <= 2; threads++)
        for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
            float *l = engine_logits(m, toks, n, chunks[c], threads, KVC_KV_F16);
            CHECKF(base && l && memcmp(base, l, bytes) == 0,
                   "logits differ: chunk %d, %d threads vs one batch, 1 thread", chunks[c], threads);
            free(l);
        }
    free(base);
    free(toks);
    kvc_model_free(m);
}

static void test_truncate_recompute(void)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/inv.gguf", tmpdir);
    kvc_model *m = NULL;
    char err[512];
    CHECK(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK);
    if (!m)
        return;
    int n;
    int32_t *toks = some_tokens(m, &n);
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    kvc_context *ctx = NULL;
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 512;
    cp.n_threads = 2;
    CHECK(kvc_context_new(m, &cp, &ctx, err, sizeof(err)) == KVC_OK);
    /* cold: the whole prompt */
    CHECK(kvc_context_decode(ctx, 0, toks, n, false, err, sizeof(err)) == KVC_OK);
    float *cold = malloc((size_t)info.n_vocab * sizeof(float));
    memcpy(cold, kvc_context_logits(ctx, -1), (size_t)info.n_vocab * sizeof(float));
    /* an edit: a different middle, then back to the original (truncate + recompute) */
    int keep = n / 3;
    CHECK(kvc_context_seq_truncate(ctx, 0, keep) == KVC_OK);
    CHECK_EQ_INT(kvc_context_seq_len(ctx, 0), keep);
    int32_t other[5] = { 5, 6, 7, 8, 9 };
    CHECK(kvc_context_decode(ctx, 0, other, 5, false, err, sizeof(err)) == KVC_OK);
    CHECK(kvc_context_seq_truncate(ctx, 0, keep) == KVC_OK);
    CHECK(kvc_context_decode(ctx, 0, toks + keep, n - keep, false, err, sizeof(err)) == KVC_OK);
    CHECK(memcmp(cold, kvc_context_logits(ctx, -1), (size_t)info.n_vocab * sizeof(float)) == 0);
    /* a context overflow is refused and leaves the sequence as it was */
    int32_t many[600] = { 0 };
    CHECK(kvc_context_decode(ctx, 0, many, 600, false, err, sizeof(err)) == KVC_ERR_CONTEXT_LENGTH);
    CHECK_EQ_INT(kvc_context_seq_len(ctx, 0), n);
    int32_t bad = info.n_vocab;
    CHECK(kvc_context_decode(ctx, 0, &bad, 1, false, err, sizeof(err)) == KVC_ERR_INVALID_ARG);
    CHECK(strstr(err, "out of range") != NULL);
    CHECK_EQ_INT(kvc_context_seq_len(ctx, 0), n);
    free(cold);
    free(toks);
    kvc_context_free(ctx);
    kvc_model_free(m);
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvc_test_engine_XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    const char *types[] = { "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1",
                            "q4_k", "q5_k", "q6_k", "q4_k_m" };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        test_against_reference("llama", types[i], "spm");
    test_against_reference("qwen2", "f16", "bpe");
    test_against_reference("qwen2", "q8_0", "bpe");
    test_against_reference("qwen3", "q6_k", "spm");
    test_against_reference("qwen3", "bf16", "bpe");
    test_batch_invariance();
    test_truncate_recompute();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_done("test_engine");
}
