/* forward_gdn.c - Gated DeltaNet, the recurrent token mixer of Qwen3.5 / 3.6
 * (qwen35, qwen35moe) and Qwen3-Next (qwen3next), and its gated attention
 * layers (ARCHITECTURES.md §3.4, as llama.cpp's qwen35.cpp, qwen3next.cpp and
 * ggml_gated_delta_net compute them).
 *
 * A GDN layer, for each token x (already rms-normed) of a sequence in
 * position order, with n_k Q/K heads and n_v V heads of d = d_k = d_v:
 *   u = W_qkv x (conv_dim = 2 n_k d + n_v d),  z = W_z x,
 *   beta = sigmoid(W_beta x),  g = softplus(W_alpha x + dt) * a   (n_v; a < 0)
 *   c = silu(causal_conv(u))      per channel over the last K inputs (K - 1 kept in the state)
 *   q, k, v = c split; q, k l2-normalised per head; V head h reads Q/K head h mod n_k
 *   (qwen3next: h / (n_v / n_k), and its projections come fused: project())
 *   per V head h:  S *= exp(g_h);  delta = (v_h - S^T k) beta_h;  S += k delta^T;
 *                  o_h = S^T q / sqrt(d)
 *   o_h = rmsnorm(o_h) * ssm_norm * silu(z_h);  out = W_out o
 * (silu: ssm_scan.h's, the convolution's and kvc_swiglu's formula)
 *
 * The layer's state (kvc_kv_seq_state, f32, zero at position 0):
 *   conv  [K - 1][conv_dim]   the inputs u of the K - 1 previous positions, oldest first
 *   delta [n_v][d][d]         S_h transposed: row j (a V index) holds S_h[0..d)[j] (contiguous
 *                             over the K index, as ggml stores it)
 *
 * Batch invariance: a token's arithmetic depends only on its sequence's state
 * and its own row. The convolution and the recurrence walk each sequence's
 * tokens in position order; the threads split sequences and heads, never a
 * reduction. Each state row is updated by kernels.h's kvc_gdn_row (a
 * fixed order per ISA and head size; SIMD, with a scalar reference), so a
 * state and the logits after it are the same bits whether the prefix ran at
 * once, in chunks or token by token, alone or beside other sequences, on any
 * thread count. */
#include "forward.h"
#include "ssm_scan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- geometry */

typedef struct gdn_dims {
    int32_t K;            /* conv width */
    int32_t n_k, n_v, d;  /* Q/K heads, V heads, head size */
    int64_t conv_dim;     /* 2 n_k d + n_v d */
    int64_t inner;        /* n_v d */
    bool    grouped;      /* V head h reads Q/K head h / (n_v / n_k) (kvc_arch.gdn_v_grouped), else
                           * h mod n_k */
} gdn_dims;

static gdn_dims dims_of(const kvc_hparams *hp)
{
    gdn_dims g = { hp->ssm_d_conv, hp->ssm_n_group, hp->ssm_n_head, hp->ssm_d_state, 0, 0,
                   hp->arch->gdn_v_grouped };
    g.inner = (int64_t)g.n_v * g.d;
    g.conv_dim = 2 * (int64_t)g.n_k * g.d + g.inner;
    return g;
}

/* The i-th (i < n_v / n_k) of the V heads that read Q/K head hk. */
static inline int64_t v_head(const gdn_dims *g, int64_t hk, int64_t i)
{
    return g->grouped ? hk * (g->n_v / g->n_k) + i : hk + i * g->n_k;
}

/* Whether the model has GDN or gated attention layers (kvc_gdn_buf's users;
 * a file may have only the latter: full_attention_interval 1). */
static bool uses_buffers(const kvc_model *m)
{
    for (int32_t il = 0; il < m->hp.n_layer; il++)
        if (m->layers[il].attn == KVC_ATTN_GDN || m->layers[il].attn_gated)
            return true;
    return false;
}

/* ---------------------------------------------------------- layer setup */

/* Which layers are recurrent: attention.recurrent_layers (one entry per layer,
 * MTP blocks included) when the file has it, else every layer but each
 * full_attention_interval-th. The others are gated attention layers. */
int kvc_gdn_layers(kvc_model *m, kvc_err *err)
{
    kvc_hparams *hp = &m->hp;
    const gdn_dims g = dims_of(hp);
    if (g.K < 1 || g.K > 16 || g.n_k < 1 || g.n_v < 1 || g.n_v % g.n_k != 0 || g.d < 1 || g.d > 1024 ||
        hp->ssm_d_inner != g.n_v * g.d)
        return kvc_fail(err, KVC_ERR_FORMAT,
                        "bad Gated DeltaNet shape: conv kernel %d, %d K heads, %d V heads, state %d, "
                        "inner size %d (must be V heads x state)", g.K, g.n_k, g.n_v, g.d, hp->ssm_d_inner);
    char key[96];
    snprintf(key, sizeof(key), "%s.attention.recurrent_layers", hp->arch->name);
    const gguf_kv *kv = gguf_find_kv(m->gguf, key);
    if (kv && (kv->type != GGUF_TYPE_ARRAY || kv->v.arr.type == GGUF_TYPE_STRING ||
               kv->v.arr.n < (uint64_t)hp->n_layer))
        return kvc_fail(err, KVC_ERR_FORMAT, "metadata key %s: not an array of %d numbers", key, hp->n_layer);
    if (!kv && hp->full_attn_interval < 1)
        return kvc_fail(err, KVC_ERR_FORMAT, "metadata key %s.full_attention_interval: %d",
                        hp->arch->name, hp->full_attn_interval);
    for (int32_t il = 0; il < hp->n_layer; il++) {
        kvc_layer *L = &m->layers[il];
        const bool recurrent = kv ? gguf_arr_i64(kv, (uint64_t)il) != 0
                                  : (il + 1) % hp->full_attn_interval != 0;
        if (recurrent) {
            L->attn = KVC_ATTN_GDN;
            L->state_floats = (int64_t)(g.K - 1) * g.conv_dim + (int64_t)g.n_v * g.d * g.d;
        } else {
            L->attn_gated = true;
        }
    }
    return KVC_OK;
}

/* -------------------------------------------------------------- buffers */

static float *alloc_f(size_t n) { return kvc_alloc_aligned(KVC_MAX(n, 1) * sizeof(float)); }

int kvc_gdn_alloc(kvc_compute *c)
{
    const kvc_model *m = c->m;
    if (!uses_buffers(m))
        return KVC_OK;
    const gdn_dims g = dims_of(&m->hp);
    const size_t B = (size_t)c->max_batch;
    kvc_gdn_buf *b = &c->gdn;
    b->qkv = alloc_f(B * (size_t)g.conv_dim);
    b->z = alloc_f(B * (size_t)g.inner);
    b->beta = alloc_f(B * (size_t)g.n_v);
    b->g = alloc_f(B * (size_t)g.n_v);
    b->o = alloc_f(B * (size_t)g.inner);
    b->qg = alloc_f(B * 2 * (size_t)m->hp.n_head * (size_t)m->hp.head_dim);
    if (g.grouped) {   /* qwen3next's fused projections */
        b->qkvz = alloc_f(B * (size_t)(g.conv_dim + g.inner));
        b->ba = alloc_f(B * 2 * (size_t)g.n_v);
        if (!b->qkvz || !b->ba)
            return KVC_ERR_NOMEM;
    }
    b->order = malloc(B * sizeof(int32_t));
    b->run = malloc((B + 1) * sizeof(int32_t));
    b->state = malloc(B * sizeof(float *));
    b->conv_t = kvc_fwd_conv_taps(m, KVC_ATTN_GDN);
    return b->qkv && b->z && b->beta && b->g && b->o && b->qg && b->order && b->run && b->state && b->conv_t
         ? KVC_OK : KVC_ERR_NOMEM;
}

void kvc_gdn_free(kvc_compute *c)
{
    kvc_gdn_buf *b = &c->gdn;
    float *bufs[] = { b->qkv, b->z, b->beta, b->g, b->o, b->qg, b->qkvz, b->ba };
    for (size_t i = 0; i < KVC_ARRAY_LEN(bufs); i++)
        kvc_free_aligned(bufs[i]);
    free(b->order);
    free(b->run);
    free(b->state);
    kvc_fwd_conv_taps_free(b->conv_t, c->m->hp.n_layer);
    memset(b, 0, sizeof(*b));
}

/* ------------------------------------------------------ gated attention */

typedef struct gated_job {
    fwd    *f;
    int64_t hd, n_head;
} gated_job;

/* Row i: the query halves of q|gate into c->q. */
static void split_q_task(void *ctx, int64_t i, int thread)
{
    const gated_job *j = ctx;
    const kvc_compute *c = j->f->c;
    const float *qg = c->gdn.qg + i * 2 * j->n_head * j->hd;
    float *q = c->q + i * j->n_head * j->hd;
    for (int64_t h = 0; h < j->n_head; h++)
        memcpy(q + h * j->hd, qg + h * 2 * j->hd, (size_t)j->hd * sizeof(float));
}

/* Row i: att *= sigmoid(gate). */
static void gate_task(void *ctx, int64_t i, int thread)
{
    const gated_job *j = ctx;
    const kvc_compute *c = j->f->c;
    const float *qg = c->gdn.qg + i * 2 * j->n_head * j->hd;
    float *a = c->att + i * j->n_head * j->hd;
    for (int64_t h = 0; h < j->n_head; h++)
        for (int64_t d = 0; d < j->hd; d++)
            a[h * j->hd + d] *= 1.0f / (1.0f + expf(-qg[h * 2 * j->hd + j->hd + d]));
}

void kvc_gated_qkv(fwd *f)
{
    kvc_compute *c = f->c;
    const kvc_layer *L = &c->m->layers[f->layer];
    const int64_t nkv = (int64_t)L->n_head_kv * L->head_dim;
    gated_job j = { f, L->head_dim, L->n_head };
    kvc_fwd_matmul_n(c, c->h, f->n, 3, (const kvc_weight *[]){ &L->wq, &L->wk, &L->wv },
                     (float *[]){ c->gdn.qg, c->k, c->v }, (const int64_t[]){ 2 * j.n_head * j.hd, nkv, nkv });
    kvc_threadpool_run(c->tp, f->n, split_q_task, &j);
}

void kvc_gated_out(fwd *f)
{
    const kvc_layer *L = &f->c->m->layers[f->layer];
    gated_job j = { f, L->head_dim, L->n_head };
    kvc_threadpool_run(f->c->tp, f->n, gate_task, &j);
}

/* ------------------------------------------------------------ GDN step */

typedef struct gdn_job {
    fwd     *f;
    const kvc_layer *L;
    gdn_dims g;
} gdn_job;

/* Group the batch by sequence: order[] lists each sequence's batch indices
 * in batch order (so in position order, check_batch), sequences in order of
 * first appearance; run[r] is group r's start. */
static void group_batch(fwd *f)
{
    kvc_gdn_buf *b = &f->c->gdn;
    int32_t n_out = 0, n_runs = 0;
    for (int32_t i = 0; i < f->n; i++) {
        bool seen = false;
        for (int32_t j = 0; j < i && !seen; j++)
            seen = f->items[j].seq == f->items[i].seq;
        if (seen)
            continue;
        b->run[n_runs++] = n_out;
        for (int32_t j = i; j < f->n; j++)
            if (f->items[j].seq == f->items[i].seq)
                b->order[n_out++] = j;
    }
    b->run[n_runs] = n_out;
    b->n_runs = n_runs;
}


/* The causal convolution of one token's channels [ch0, ch1) of u, silu
 * applied, in place; the conv state st ([K - 1][cd], oldest first) advances
 * (ssm_scan.h's kvc_conv_step). */
static void conv_channels(float *st, const float *wt, float *u, int64_t cd, int32_t K, int64_t ch0,
                          int64_t ch1)
{
    kvc_conv_step(&(kvc_conv_args){ .st = st + ch0, .ld_st = cd, .wt = wt + ch0, .ld_w = cd, .K = K,
                                    .u = u + ch0, .silu = true, .y = u + ch0, .n = ch1 - ch0 });
}

/* x / max(|x|, eps) over n (ggml_l2_norm: the sum of squares in double). */
static void l2norm(float *x, int64_t n, float eps)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)(x[i] * x[i]);
    const float scale = 1.0f / fmaxf(sqrtf((float)ss), eps);
    for (int64_t i = 0; i < n; i++)
        x[i] *= scale;
}

/* Task (group r, K head hk): everything of the layer that reads the state,
 * for Q/K head hk and the V heads h = hk (mod n_k) that read it, over the
 * group's tokens in position order. Per token: the convolution of its
 * channels (q_hk, k_hk, each v_h), l2 norms of q and k; per V head beta =
 * sigmoid, g = softplus(alpha + dt) * a, the delta rule (one kvc_gdn_row per
 * state row), o_h = rmsnorm(o_h) * ssm_norm * silu(z_h). Tasks own disjoint
 * channels, state rows and output heads; one dispatch, as decode wants. */
static void head_task(void *ctx, int64_t task, int thread)
{
    const gdn_job *j = ctx;
    const kvc_gdn_buf *b = &j->f->c->gdn;
    const kvc_layer *L = j->L;
    const int32_t n_v = j->g.n_v, d = j->g.d, n_k = j->g.n_k, K = j->g.K;
    const int64_t r = task / n_k, hk = task % n_k, cd = j->g.conv_dim;
    const float eps = j->f->c->m->hp.rms_eps, scale = 1.0f / sqrtf((float)d);
    float *st = b->state[r];                                       /* [K - 1][conv_dim] */
    float *S0 = st + (int64_t)(K - 1) * cd;                        /* [n_v][d_v][d_k] */
    for (int32_t t = b->run[r]; t < b->run[r + 1]; t++) {
        const int64_t i = b->order[t];
        float *u = b->qkv + i * cd;
        float *q = u + hk * d, *k = u + ((int64_t)n_k + hk) * d;
        conv_channels(st, b->conv_t[j->f->layer], u, cd, K, hk * d, (hk + 1) * d);
        conv_channels(st, b->conv_t[j->f->layer], u, cd, K, ((int64_t)n_k + hk) * d, ((int64_t)n_k + hk + 1) * d);
        l2norm(q, d, eps);
        l2norm(k, d, eps);
        for (int64_t vi = 0; vi < n_v / n_k; vi++) {
            const int64_t h = v_head(&j->g, hk, vi);
            const int64_t v0 = 2 * (int64_t)n_k * d + h * d;
            conv_channels(st, b->conv_t[j->f->layer], u, cd, K, v0, v0 + d);
            const float *v = u + v0;
            const float beta = 1.0f / (1.0f + expf(-b->beta[i * n_v + h]));
            const float a = b->g[i * n_v + h] + L->ssm_dt_b[h];
            const float g = (a > 20.0f ? a : log1pf(expf(a))) * L->ssm_a[h];   /* ggml_softplus */
            const float decay = expf(g);
            float *S = S0 + h * (int64_t)d * d, *o = b->o + i * j->g.inner + h * d;
            for (int32_t jv = 0; jv < d; jv++)
                o[jv] = kvc_gdn_row(S + (int64_t)jv * d, k, q, decay, v[jv], beta, d) * scale;
            float *z = b->z + i * j->g.inner + h * d;
            kvc_fwd_rmsnorm(o, o, L->ssm_norm, d, eps);
            kvc_swiglu(z, o, d);   /* z = silu(z) o: W_out reads z */
        }
    }
}

/* Row i of qwen3next's fused projections into the step's layout: qkvz
 * (when ssm_in; per K head hk: q, k, its V heads' v, then their z) into
 * qkv (q | k | v) and z, ba (per K head: its V heads' beta, then alpha) into
 * beta and g. A K head's V heads are consecutive in both (gdn_v_grouped). */
static void split_fused_task(void *ctx, int64_t i, int thread)
{
    const gdn_job *j = ctx;
    const kvc_gdn_buf *b = &j->f->c->gdn;
    const int64_t d = j->g.d, n_k = j->g.n_k, r = j->g.n_v / n_k, w = (2 + 2 * r) * d;
    const bool fused_qkvz = !j->L->ssm_qkv.data;   /* else qkv and z came split */
    for (int64_t hk = 0; fused_qkvz && hk < n_k; hk++) {
        const float *src = b->qkvz + i * (j->g.conv_dim + j->g.inner) + hk * w;
        float *qkv = b->qkv + i * j->g.conv_dim;
        memcpy(qkv + hk * d, src, (size_t)d * sizeof(float));
        memcpy(qkv + (n_k + hk) * d, src + d, (size_t)d * sizeof(float));
        memcpy(qkv + (2 * n_k + hk * r) * d, src + 2 * d, (size_t)(r * d) * sizeof(float));
        memcpy(b->z + i * j->g.inner + hk * r * d, src + (2 + r) * d, (size_t)(r * d) * sizeof(float));
    }
    for (int64_t hk = 0; hk < n_k; hk++) {
        const float *src = b->ba + i * 2 * j->g.n_v + hk * 2 * r;
        memcpy(b->beta + i * j->g.n_v + hk * r, src, (size_t)r * sizeof(float));
        memcpy(b->g + i * j->g.n_v + hk * r, src + r, (size_t)r * sizeof(float));
    }
}

/* The layer's input projections of h into qkv, z, beta and g (alpha): four
 * matrices (qwen35), or qwen3next's fused ones split by rows
 * (split_fused_task). */
static void project(const gdn_job *j)
{
    kvc_compute *c = j->f->c;
    kvc_gdn_buf *b = &c->gdn;
    const kvc_layer *L = j->L;
    const int64_t n = j->f->n;
    if (!L->ssm_ba.data) {
        kvc_fwd_matmul_n(c, c->h, n, 4, (const kvc_weight *[]){ &L->ssm_qkv, &L->ssm_z, &L->ssm_beta, &L->ssm_alpha },
                         (float *[]){ b->qkv, b->z, b->beta, b->g },
                         (const int64_t[]){ j->g.conv_dim, j->g.inner, j->g.n_v, j->g.n_v });
        return;
    }
    if (L->ssm_qkv.data)   /* split q | k | v and z, as qwen35's (llama.cpp prefers them too) */
        kvc_fwd_matmul_n(c, c->h, n, 3, (const kvc_weight *[]){ &L->ssm_qkv, &L->ssm_z, &L->ssm_ba },
                         (float *[]){ b->qkv, b->z, b->ba },
                         (const int64_t[]){ j->g.conv_dim, j->g.inner, 2 * j->g.n_v });
    else
        kvc_fwd_matmul_n(c, c->h, n, 2, (const kvc_weight *[]){ &L->ssm_in, &L->ssm_ba },
                         (float *[]){ b->qkvz, b->ba },
                         (const int64_t[]){ j->g.conv_dim + j->g.inner, 2 * j->g.n_v });
    kvc_threadpool_run(c->tp, n, split_fused_task, (void *)j);
}

void kvc_gdn_step(fwd *f)
{
    kvc_compute *c = f->c;
    kvc_gdn_buf *b = &c->gdn;
    const kvc_layer *L = &c->m->layers[f->layer];
    gdn_job j = { f, L, dims_of(&c->m->hp) };
    const int64_t n = f->n;

    group_batch(f);
    /* the states are made on first use: fetched here, on one thread */
    for (int32_t r = 0; r < b->n_runs; r++)
        if (!(b->state[r] = kvc_kv_seq_state(f->pool, f->items[b->order[b->run[r]]].seq, f->layer))) {
            atomic_store(&f->failed, true);
            return;
        }
    kvc_threadpool_run(c->tp, n, kvc_fwd_attn_norm_task, f);
    project(&j);
    kvc_threadpool_run(c->tp, (int64_t)b->n_runs * j.g.n_k, head_task, &j);
    kvc_fwd_matmul_n(c, b->z, n, 1, (const kvc_weight *[]){ &L->ssm_out }, (float *[]){ c->h },
                     (const int64_t[]){ c->m->hp.n_embd });
}
