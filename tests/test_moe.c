/* test_moe.c - the mixture-of-experts step (forward_moe.c) against a plain
 * scalar computation written out here, for the router and expert variants
 * no shipped test model uses: sigmoid gating with a selection bias and a
 * weight scale (Nemotron, GLM), ReLU² experts, softmax over the selected k
 * (gpt-oss) with GeGLU, and the shared expert with its sigmoid gate
 * (Qwen3.5-MoE). Each variant is put onto a generated tiny-qwen3moe's first
 * layer (its F32 weights, plus test-owned shared-expert and bias arrays);
 * the step's output must match the reference, and be bitwise the same for a
 * token alone, in a batch, and with 1 or 2 threads. Needs nothing from
 * ../shared. */
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arch.h"
#include "forward.h"
#include "kernels.h"
#include "model.h"
#include "model_gen.h"

#define N_TOK 24
#define FS    96      /* the shared expert's width */

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x1000000 - 0.5f;
}

typedef struct variant {
    const char    *name;
    kvc_moe_gating gating;
    bool           norm_w;
    float          w_scale;
    kvc_ffn_act    act;
    bool           sel_bias;
    bool           shared;    /* a shared expert with a sigmoid gate */
} variant;

static double act_ref(kvc_ffn_act act, double g, double u)
{
    switch (act) {
    case KVC_ACT_SILU: return g / (1.0 + exp(-g)) * u;
    case KVC_ACT_GELU: return 0.5 * g * (1.0 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
    case KVC_ACT_RELU2: return u > 0 ? u * u : 0.0;
    default: return NAN;
    }
}

static double dot_row(const kvc_weight *w, int64_t r, const double *x)
{
    const float *row = (const float *)(const void *)((const uint8_t *)w->data + (size_t)r * w->row_bytes);
    double s = 0.0;
    for (int64_t i = 0; i < w->n_in; i++)
        s += (double)row[i] * x[i];
    return s;
}

/* y = down(act(gate h, up h)) of one FFN, in double. */
static void ffn_ref(kvc_ffn_act act, const kvc_weight *g, const kvc_weight *u, const kvc_weight *d,
                    const double *h, double *y)
{
    double *a = malloc((size_t)g->n_out * sizeof(double));
    for (int64_t r = 0; r < g->n_out; r++)
        a[r] = act_ref(act, dot_row(g, r, h), dot_row(u, r, h));
    for (int64_t r = 0; r < d->n_out; r++)
        y[r] = dot_row(d, r, a);
    free(a);
}

/* Token x's output, the reference way; false when two candidates for the
 * last selected place are too close to call (then the token is not judged). */
static bool moe_ref(const kvc_model *m, const variant *v, const float *x, double *out)
{
    const kvc_hparams *hp = &m->hp;
    const kvc_layer *L = &m->layers[0];
    const int64_t d = hp->n_embd, N = hp->n_expert, k = hp->n_expert_used;
    double *h = malloc((size_t)d * sizeof(double)), *p = malloc((size_t)N * sizeof(double));
    double *y = malloc((size_t)d * sizeof(double));
    double ss = 0.0;
    for (int64_t i = 0; i < d; i++)
        ss += (double)x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / (double)d + hp->rms_eps);
    for (int64_t i = 0; i < d; i++)
        h[i] = x[i] * inv * L->ffn_norm[i];
    for (int64_t e = 0; e < N; e++) {
        const double l = dot_row(&L->router, e, h);
        p[e] = v->gating == KVC_GATING_SIGMOID ? 1.0 / (1.0 + exp(-l)) : l;
    }
    if (v->gating == KVC_GATING_SOFTMAX) {
        double mx = p[0], s = 0.0;
        for (int64_t e = 1; e < N; e++)
            mx = fmax(mx, p[e]);
        for (int64_t e = 0; e < N; e++)
            s += exp(p[e] - mx);
        for (int64_t e = 0; e < N; e++)
            p[e] = exp(p[e] - mx) / s;
    }
    int64_t sel[16];
    double w[16], wsum = 0.0;
    bool clear = true;
    uint64_t taken = 0;
    for (int64_t s = 0; s < k; s++) {
        int64_t best = -1;
        double bv = 0.0, second = -INFINITY;
        for (int64_t e = 0; e < N; e++) {
            if (taken >> e & 1)
                continue;
            const double val = p[e] + (L->sel_bias ? L->sel_bias[e] : 0.0);
            if (best < 0 || val > bv) {
                second = best < 0 ? second : bv;
                best = e, bv = val;
            } else if (val > second) {
                second = val;
            }
        }
        clear = clear && bv - second > 1e-4;
        taken |= 1ull << best;
        sel[s] = best;
        w[s] = p[best];
    }
    if (v->gating == KVC_GATING_SOFTMAX_WEIGHT) {
        double mx = w[0], s = 0.0;
        for (int64_t j = 1; j < k; j++)
            mx = fmax(mx, w[j]);
        for (int64_t j = 0; j < k; j++)
            s += exp(w[j] - mx);
        for (int64_t j = 0; j < k; j++)
            w[j] = exp(w[j] - mx) / s;
    }
    for (int64_t j = 0; j < k; j++)
        wsum += w[j];
    for (int64_t i = 0; i < d; i++)
        out[i] = 0.0;
    for (int64_t j = 0; j < k; j++) {
        double wj = v->norm_w ? w[j] / wsum : w[j];
        if (v->w_scale != 0.0f)
            wj *= v->w_scale;
        const kvc_weight g = kvc_expert(&L->gate_exps, (int32_t)sel[j]), u = kvc_expert(&L->up_exps, (int32_t)sel[j]);
        const kvc_weight dn = kvc_expert(&L->down_exps, (int32_t)sel[j]);
        ffn_ref(v->act, &g, &u, &dn, h, y);
        for (int64_t i = 0; i < d; i++)
            out[i] += wj * y[i];
    }
    if (v->shared) {
        const double gate = 1.0 / (1.0 + exp(-dot_row(&L->shexp_gate_inp, 0, h)));
        ffn_ref(v->act, &L->shexp_gate, &L->shexp_up, &L->shexp_down, h, y);
        for (int64_t i = 0; i < d; i++)
            out[i] += gate * y[i];
    }
    free(h);
    free(p);
    free(y);
    return clear;
}

/* The step over tokens [t0, t1) of xs on c; the outputs into out rows t0.. */
static void run_step(kvc_compute *c, const float *xs, int64_t t0, int64_t t1, float *out)
{
    const int64_t d = c->m->hp.n_embd, n = t1 - t0;
    memcpy(c->x, xs + t0 * d, (size_t)(n * d) * sizeof(float));
    memset(c->h, 0, (size_t)(n * d) * sizeof(float));     /* the attention added nothing */
    fwd f = { .c = c, .n = (int32_t)n, .layer = 0 };
    kvc_moe_step(&f);
    memcpy(out + t0 * d, c->h, (size_t)(n * d) * sizeof(float));
}

static kvc_weight f32_weight(int64_t n_in, int64_t n_out, float scale, uint64_t *seed)
{
    float *p = malloc((size_t)(n_in * n_out) * sizeof(float));
    for (int64_t i = 0; i < n_in * n_out; i++)
        p[i] = scale * frand(seed);
    return (kvc_weight){ KVC_TYPE_F32, n_in, n_out, (size_t)n_in * sizeof(float), p };
}

static void check_variant(const char *path, const variant *v)
{
    kvc_model *m = NULL;
    kvc_err err = { 0 };
    CHECKF(kvc_model_load_file(path, NULL, NULL, &m, &err) == KVC_OK, "%s", err.msg);
    if (!m)
        return;
    kvc_hparams *hp = &m->hp;
    kvc_layer *L = &m->layers[0];
    uint64_t seed = 1234;
    hp->moe_gating = v->gating;
    hp->moe_norm_w = v->norm_w;
    hp->moe_w_scale = v->w_scale;
    hp->ffn_act = v->act;
    float *bias = NULL;
    if (v->sel_bias) {
        bias = malloc((size_t)hp->n_expert * sizeof(float));
        for (int32_t e = 0; e < hp->n_expert; e++)
            bias[e] = 0.6f * frand(&seed);
        L->sel_bias = bias;
    }
    const int64_t d = hp->n_embd;
    if (v->shared) {
        hp->n_ff_shexp = FS;
        L->shexp_gate = f32_weight(d, FS, 0.3f, &seed);
        L->shexp_up = f32_weight(d, FS, 0.3f, &seed);
        L->shexp_down = f32_weight(FS, d, 0.3f, &seed);
        L->shexp_gate_inp = f32_weight(d, 1, 0.5f, &seed);
    }
    float *xs = malloc((size_t)(N_TOK * d) * sizeof(float));
    for (int64_t i = 0; i < N_TOK * d; i++)
        xs[i] = 2.0f * frand(&seed);

    float *outs[3];
    for (int run = 0; run < 3; run++) {
        /* run 0: one batch, 1 thread; 1: one batch, 2 threads; 2: token by token, 2 threads */
        kvc_compute *c = NULL;
        outs[run] = calloc((size_t)(N_TOK * d), sizeof(float));
        CHECKF(kvc_compute_new(m, N_TOK, 64, run == 0 ? 1 : 2, &c, &err) == KVC_OK, "%s", err.msg);
        if (!c)
            continue;
        for (int64_t t = 0; t < N_TOK; t += run == 2 ? 1 : N_TOK)
            run_step(c, xs, t, run == 2 ? t + 1 : N_TOK, outs[run]);
        kvc_compute_free(c);
    }
    CHECKF(memcmp(outs[0], outs[1], (size_t)(N_TOK * d) * sizeof(float)) == 0, "%s: 1 and 2 threads differ", v->name);
    CHECKF(memcmp(outs[0], outs[2], (size_t)(N_TOK * d) * sizeof(float)) == 0, "%s: alone and in a batch differ",
           v->name);

    double *ref = malloc((size_t)d * sizeof(double)), worst = 0.0;
    int judged = 0;
    for (int64_t t = 0; t < N_TOK; t++) {
        if (!moe_ref(m, v, xs + t * d, ref))
            continue;
        judged++;
        double mx = 0.0, err_t = 0.0;
        for (int64_t i = 0; i < d; i++) {
            mx = fmax(mx, fabs(ref[i]));
            err_t = fmax(err_t, fabs(ref[i] - outs[0][t * d + i]));
        }
        worst = fmax(worst, err_t / fmax(mx, 1e-6));
    }
    CHECKF(judged >= N_TOK / 2, "%s: only %d of %d tokens had a clear selection", v->name, judged, N_TOK);
    CHECKF(worst < 2e-4, "%s (%s): max error %.3g of the output's scale against the reference", v->name,
           kvc_isa_name(kvc_kernels_isa()), worst);
    printf("  %-28s %-6s %d tokens judged, max relative error %.2e\n", v->name, kvc_isa_name(kvc_kernels_isa()),
           judged, worst);

    for (int run = 0; run < 3; run++)
        free(outs[run]);
    free(ref);
    free(xs);
    if (v->shared) {
        free((void *)L->shexp_gate.data);
        free((void *)L->shexp_up.data);
        free((void *)L->shexp_down.data);
        free((void *)L->shexp_gate_inp.data);
        L->shexp_gate = L->shexp_up = L->shexp_down = L->shexp_gate_inp = (kvc_weight){ 0 };
    }
    L->sel_bias = NULL;
    free(bias);
    kvc_model_release(m);
}

int main(void)
{
    char dir[] = "/tmp/kvc_moe_XXXXXX", path[64];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof(path), "%s/m.gguf", dir);
    kvc_gen_params p;
    kvc_gen_preset("tiny-qwen3moe", &p);      /* F32, 8 experts of 64, top-2 */
    p.n_expert_used = 3;
    p.n_threads = 1;
    kvc_err err = { 0 };
    CHECKF(kvc_gen_model(&p, path, &err) == KVC_OK, "%s", err.msg);
    static const variant vs[] = {
        { "sigmoid+bias, scale, relu2", KVC_GATING_SIGMOID, false, 2.5f, KVC_ACT_RELU2, true, false },
        { "sigmoid+bias, norm, silu", KVC_GATING_SIGMOID, true, 0.0f, KVC_ACT_SILU, true, false },
        { "softmax, shared gated, silu", KVC_GATING_SOFTMAX, true, 0.0f, KVC_ACT_SILU, false, true },
        { "softmax-of-k, gelu, shared", KVC_GATING_SOFTMAX_WEIGHT, false, 0.0f, KVC_ACT_GELU, false, true },
        { "sigmoid+bias, relu2, shared", KVC_GATING_SIGMOID, true, 1.5f, KVC_ACT_RELU2, true, true },
    };
    const kvc_isa def = kvc_kernels_isa();
    for (int isa = KVC_ISA_SCALAR; isa <= (int)def; isa++) {
        if (isa != KVC_ISA_SCALAR && isa != (int)def)
            continue;
        kvc_kernels_set_isa((kvc_isa)isa);
        for (size_t i = 0; i < sizeof(vs) / sizeof(vs[0]); i++)
            check_variant(path, &vs[i]);
    }
    kvc_kernels_set_isa(def);
    unlink(path);
    rmdir(dir);
    return test_done("test_moe");
}
