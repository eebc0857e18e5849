/* forward_moe.c - the mixture-of-experts FFN step, as llama.cpp's
 * build_moe_ffn computes it (ARCHITECTURES.md §3.0):
 *
 *   h = rmsnorm(x) * ffn_norm
 *   logits = W_r h (+ b_r)
 *   probs  = softmax(logits) | sigmoid(logits) | logits        (gating)
 *   sel    = top-k of probs (+ selection bias), ties to the lower index
 *   w      = probs[sel]; softmax over the k (gpt-oss); / sum (norm_w); * scale
 *   out    = sum_j w_j (down_e(act(gate_e h (+b), up_e h (+b))) * s_e (+ b_down))
 *          + sigmoid(w_sg . h) * down_s(act(gate_s h, up_s h))   (shared expert)
 * (ReLU² experts, shared or not, have no gate: act(up h) = relu(up h)^2.)
 *
 * Gemma 4's MoE layers (KVC_FFN_MOE_DENSE, ARCHITECTURES.md §3.7) run the
 * experts beside the dense FFN, from the same residual stream x:
 *   out = rms(dense(rms(x) * ffn_norm), post_ffw_norm_1)
 *       + rms(experts(rms(x) * pre_ffw_norm_2), post_ffw_norm_2)
 * with the router on rms(x) / sqrt(n_embd) * ffn_gate_inp.scale.
 *
 * Fidelity (DESIGN §3): a token's routing is computed from its own row; each
 * expert's matmuls give every element as a function of its weight row and the
 * token's row only (kernels.h), whichever tokens share the expert; the sum over
 * a token's experts runs in its selection order. So a token's output does not
 * depend on its batch-mates, the chunking or the thread count.
 *
 * Speed: the batch's (token, expert) pairs are grouped by expert, so an
 * expert's weights are read once per batch and only the selected experts'
 * weights are read at all; each phase's tasks are sized by work (tokens x
 * rows), so a popular expert is split across more tasks than a rare one.
 * With prepared activations (kernels.h) each token's input row is quantized
 * once, and every expert reads its tokens' rows in place (no gather); the
 * down input is quantized once per pair, pairs in expert order. */
#include "forward.h"
#include "kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct moe_task {
    int32_t e;               /* expert */
    int64_t r0, r1;          /* its rows */
} moe_task;

typedef struct moe_job {
    fwd             *f;
    const kvc_layer *L;
    int32_t          n, k, n_exp;
    int64_t          d, ff;  /* n_embd, n_ff_exp */
    bool             act;    /* prepared activations in the current matmul phase */
    bool             act_tok; /* ... rows of tokens (gate, up), not of pairs (down) */
    int64_t          n_tasks;
} moe_job;

#define MOE_PAIR_TASK 32     /* pairs per gather or down-quantization task */
#define MOE_TOK_TASK  16     /* tokens per input-quantization task */
#define MOE_DECODE_SPLIT 16  /* at most this many more tasks per decode expert (plan_rows) */

/* ------------------------------------------------------------ buffers */

int kvc_moe_alloc(kvc_compute *c)
{
    const kvc_hparams *hp = &c->m->hp;
    kvc_moe_buf *b = &c->moe;
    const size_t B = (size_t)c->max_batch, k = (size_t)hp->n_expert_used, N = (size_t)hp->n_expert;
    const size_t d = (size_t)hp->n_embd, ff = (size_t)hp->n_ff_exp, fs = (size_t)hp->n_ff_shexp;
    const int nt = kvc_threadpool_n_threads(c->tp);
    b->logits = kvc_alloc_aligned(B * N * sizeof(float));
    b->sel = malloc(B * k * sizeof(int32_t));
    b->w = malloc(B * k * sizeof(float));
    b->pair_of = malloc(B * k * sizeof(int32_t));
    b->pair_tok = malloc(B * k * sizeof(int32_t));
    b->first = malloc((N + 1) * sizeof(int32_t));
    b->fill = malloc(N * sizeof(int32_t));
    b->x = kvc_alloc_aligned(B * k * d * sizeof(float));
    b->gu = kvc_alloc_aligned(B * k * 2 * ff * sizeof(float));
    b->y = kvc_alloc_aligned(B * k * d * sizeof(float));
    b->sh_g = kvc_alloc_aligned(B * fs * sizeof(float));
    b->sh_u = kvc_alloc_aligned(B * fs * sizeof(float));
    b->sh_y = kvc_alloc_aligned(B * d * sizeof(float));
    b->sh_gate = malloc(B * sizeof(float));
    b->dense = kvc_alloc_aligned(B * d * sizeof(float));
    b->rin = kvc_alloc_aligned(B * d * sizeof(float));
    b->max_tasks = (int64_t)((2 + MOE_DECODE_SPLIT) * N + 4 * (size_t)nt + 64);   /* plan_rows */
    b->tasks = malloc((size_t)b->max_tasks * sizeof(moe_task));
    /* the token rows of the input, or later the pair rows of the down input */
    const size_t act_bytes = KVC_MAX(kvc_matmul_act_bytes((int64_t)d, (int64_t)B),
                                     kvc_matmul_act_bytes((int64_t)ff, (int64_t)(B * k)));
    b->act = act_bytes ? kvc_alloc_aligned(act_bytes) : NULL;
    if (!b->logits || !b->sel || !b->w || !b->pair_of || !b->pair_tok || !b->first || !b->fill || !b->x ||
        !b->gu || !b->y || !b->sh_g || !b->sh_u || !b->sh_y || !b->sh_gate || !b->dense || !b->rin ||
        !b->tasks || (act_bytes && !b->act))
        return KVC_ERR_NOMEM;
    /* touched now, so that a context's first full batch does not pay the page faults */
    memset(b->x, 0, B * k * d * sizeof(float));
    memset(b->gu, 0, B * k * 2 * ff * sizeof(float));
    memset(b->y, 0, B * k * d * sizeof(float));
    if (b->act)
        memset(b->act, 0, act_bytes);
    return KVC_OK;
}

void kvc_moe_free(kvc_compute *c)
{
    kvc_moe_buf *b = &c->moe;
    float *al[] = { b->logits, b->x, b->gu, b->y, b->sh_g, b->sh_u, b->sh_y, b->dense, b->rin };
    for (size_t i = 0; i < KVC_ARRAY_LEN(al); i++)
        kvc_free_aligned(al[i]);
    kvc_free_aligned(b->act);
    free(b->sel);
    free(b->w);
    free(b->pair_of);
    free(b->pair_tok);
    free(b->first);
    free(b->fill);
    free(b->sh_gate);
    free(b->tasks);
    memset(b, 0, sizeof(*b));
}

/* ------------------------------------------------------------- routing */

/* Token t's experts and weights from its router logits (gating of arch.h). */
static void route_task(void *ctx, int64_t t, int thread)
{
    moe_job *j = ctx;
    const kvc_hparams *hp = &j->f->c->m->hp;
    kvc_moe_buf *b = &j->f->c->moe;
    const kvc_layer *L = j->L;
    const int32_t N = j->n_exp, k = j->k;
    float *p = b->logits + t * N;
    int32_t *sel = b->sel + t * k;
    float *w = b->w + t * k;
    if (L->router_b)
        for (int32_t i = 0; i < N; i++)
            p[i] += L->router_b[i];
    if (hp->moe_gating == KVC_GATING_SOFTMAX) {
        float m = p[0];
        for (int32_t i = 1; i < N; i++)
            m = p[i] > m ? p[i] : m;
        double sum = 0.0;
        for (int32_t i = 0; i < N; i++)
            sum += exp((double)p[i] - (double)m);
        for (int32_t i = 0; i < N; i++)
            p[i] = (float)(exp((double)p[i] - (double)m) / sum);
    } else if (hp->moe_gating == KVC_GATING_SIGMOID) {
        for (int32_t i = 0; i < N; i++)
            p[i] = (float)(1.0 / (1.0 + exp(-(double)p[i])));
    }
    /* top-k by p (+ selection bias); ties go to the lower index */
    uint64_t taken[64] = { 0 };                                  /* N <= 4096 (model.c) */
    for (int32_t s = 0; s < k; s++) {
        int32_t best = -1;
        float bs = 0.0f;
        for (int32_t i = 0; i < N; i++) {
            if (taken[i >> 6] >> (i & 63) & 1)
                continue;
            float v = L->sel_bias ? p[i] + L->sel_bias[i] : p[i];
            if (best < 0 || v > bs)
                best = i, bs = v;
        }
        taken[best >> 6] |= 1ull << (best & 63);
        sel[s] = best;
        w[s] = p[best];
    }
    if (hp->moe_gating == KVC_GATING_SOFTMAX_WEIGHT) {
        float m = w[0];
        for (int32_t s = 1; s < k; s++)
            m = w[s] > m ? w[s] : m;
        double sum = 0.0;
        for (int32_t s = 0; s < k; s++)
            sum += exp((double)w[s] - (double)m);
        for (int32_t s = 0; s < k; s++)
            w[s] = (float)(exp((double)w[s] - (double)m) / sum);
    }
    if (hp->moe_norm_w) {
        float sum = 0.0f;
        for (int32_t s = 0; s < k; s++)
            sum += w[s];
        sum = sum > 6.103515625e-5f ? sum : 6.103515625e-5f;     /* llama.cpp's clamp */
        for (int32_t s = 0; s < k; s++)
            w[s] /= sum;
    }
    if (hp->moe_w_scale != 0.0f && hp->moe_w_scale != 1.0f)
        for (int32_t s = 0; s < k; s++)
            w[s] *= hp->moe_w_scale;
}

/* Number the (token, expert) pairs expert by expert, tokens in batch order. */
static void group_pairs(moe_job *j)
{
    kvc_moe_buf *b = &j->f->c->moe;
    const int32_t N = j->n_exp, nk = j->n * j->k;
    memset(b->first, 0, (size_t)(N + 1) * sizeof(int32_t));
    for (int32_t i = 0; i < nk; i++)
        b->first[b->sel[i] + 1]++;
    for (int32_t e = 0; e < N; e++)
        b->first[e + 1] += b->first[e];
    memset(b->fill, 0, (size_t)N * sizeof(int32_t));
    for (int32_t i = 0; i < nk; i++) {
        const int32_t e = b->sel[i], p = b->first[e] + b->fill[e]++;
        b->pair_tok[p] = i / j->k;
        b->pair_of[i] = p;
    }
}

static void gather_task(void *ctx, int64_t task, int thread)
{
    moe_job *j = ctx;
    kvc_moe_buf *b = &j->f->c->moe;
    const int64_t p0 = task * MOE_PAIR_TASK, p1 = KVC_MIN(p0 + MOE_PAIR_TASK, (int64_t)j->n * j->k);
    for (int64_t p = p0; p < p1; p++)
        memcpy(b->x + p * j->d, j->f->c->h + (int64_t)b->pair_tok[p] * j->d, (size_t)j->d * sizeof(float));
}

/* ----------------------------------------------------- expert matmuls */

void kvc_fwd_ffn_act(kvc_ffn_act act, float *g, const float *u, int64_t n)
{
    switch (act) {
    case KVC_ACT_SILU:
        kvc_swiglu(g, u, n);
        break;
    case KVC_ACT_GELU:
        for (int64_t i = 0; i < n; i++) {
            const float x = g[i];
            g[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))) * u[i];
        }
        break;
    case KVC_ACT_RELU2:
        for (int64_t i = 0; i < n; i++) {
            const float r = u[i] > 0.0f ? u[i] : 0.0f;
            g[i] = r * r;
        }
        break;
    case KVC_ACT_SWIGLU_OAI:
        for (int64_t i = 0; i < n; i++) {
            const float x = g[i] < 7.0f ? g[i] : 7.0f;
            const float y = u[i] < -7.0f ? -7.0f : u[i] > 7.0f ? 7.0f : u[i];
            g[i] = x / (1.0f + expf(-1.702f * x)) * (y + 1.0f);
        }
        break;
    }
}

/* Split each active expert's n_rows rows into tasks of about equal work
 * (tokens x rows) over the threads; rows in multiples of the kernels' group.
 * An expert of at most KVC_DECODE_TOK pairs (decode) is cut further, into
 * ranges of about KVC_DECODE_TASK_BYTES of its weights (row_bytes a row,
 * over the matrices a task reads), at most MOE_DECODE_SPLIT more, so that a
 * slow thread holds back little (kvc_fwd_decode_rows). At most
 * 4 * threads + (2 + MOE_DECODE_SPLIT) * (active experts) tasks, within
 * b->max_tasks. */
static void plan_rows(moe_job *j, int64_t n_rows, size_t row_bytes)
{
    kvc_compute *c = j->f->c;
    kvc_moe_buf *b = &c->moe;
    const int nt = kvc_threadpool_n_threads(c->tp);
    const int64_t target = KVC_MAX(1, ((int64_t)j->n * j->k * n_rows + 4 * nt - 1) / (4 * nt));
    j->n_tasks = 0;
    for (int32_t e = 0; e < j->n_exp; e++) {
        const int64_t n_e = b->first[e + 1] - b->first[e];
        if (n_e == 0)
            continue;
        const int64_t align = j->act ? KVC_MAX(16, kvc_matmul_act_row_group(n_e)) : 16;
        const int64_t chunks = KVC_MAX(1, (n_e * n_rows + target - 1) / target);
        int64_t per = (n_rows + chunks - 1) / chunks;
        per = (per + align - 1) / align * align;
        if (align == 16 && n_e <= KVC_DECODE_TOK)
            per = KVC_MIN(per, KVC_MAX(kvc_fwd_decode_rows(row_bytes, per),
                                       (n_rows / MOE_DECODE_SPLIT + 15) / 16 * 16));
        int64_t r = 0;
        for (; r < n_rows && j->n_tasks < b->max_tasks; r += per)
            b->tasks[j->n_tasks++] = (moe_task){ e, r, KVC_MIN(r + per, n_rows) };
        KVC_ASSERT(r >= n_rows);   /* max_tasks holds every plan */
    }
}

/* Whether this ISA prepares activations for the phase's weights (w, and w2
 * unless NULL); if not, the matmuls take float rows of b->x or b->gu. */
static bool uses_act(const moe_job *j, const kvc_weight *w, const kvc_weight *w2)
{
    return j->f->c->moe.act && kvc_matmul_uses_act(w) && (!w2 || kvc_matmul_uses_act(w2));
}

/* Input rows of tokens [16 t, 16 t + 16), each once, whichever experts read them. */
static void quant_in_task(void *ctx, int64_t task, int thread)
{
    moe_job *j = ctx;
    const int64_t t0 = task * MOE_TOK_TASK, t1 = KVC_MIN(t0 + MOE_TOK_TASK, (int64_t)j->n);
    kvc_matmul_act_quantize(j->d, j->f->c->h, j->d, j->n, t0, t1, j->f->c->moe.act);
}

/* Down-input rows of pairs [32 t, 32 t + 32), in pair (expert) order. */
static void quant_down_task(void *ctx, int64_t task, int thread)
{
    moe_job *j = ctx;
    const int64_t n_pairs = (int64_t)j->n * j->k;
    const int64_t p0 = task * MOE_PAIR_TASK, p1 = KVC_MIN(p0 + MOE_PAIR_TASK, n_pairs);
    kvc_matmul_act_quantize(j->ff, j->f->c->moe.gu, 2 * j->ff, n_pairs, p0, p1, j->f->c->moe.act);
}

/* y rows [r0, r1) of w for expert e's n_e pairs: from x (float path), or
 * from the prepared rows, the token rows of its pairs (gate, up) or its
 * pairs' own rows (down). */
static void expert_rows(moe_job *j, const kvc_weight *w, const float *x, int64_t ldx, int32_t e,
                        float *y, int64_t ldy, int64_t r0, int64_t r1, int thread)
{
    kvc_compute *c = j->f->c;
    kvc_moe_buf *b = &c->moe;
    const int64_t p0 = b->first[e], n_e = b->first[e + 1] - p0;
    if (!j->act)
        kvc_matmul_rows(w, x, ldx, n_e, y, ldy, r0, r1, c->mm_scratch[thread]);
    else if (j->act_tok)
        kvc_matmul_rows_act_tok(w, b->act, b->pair_tok + p0, n_e, y, ldy, r0, r1, c->mm_scratch[thread]);
    else
        kvc_matmul_rows_act(w, (const uint8_t *)b->act + kvc_matmul_act_bytes(j->ff, p0), n_e, y, ldy, r0, r1,
                            c->mm_scratch[thread]);
}

/* Gate and up rows [r0, r1) of one expert for its pairs, their biases, and
 * the activation of those columns. */
static void gate_up_task(void *ctx, int64_t task, int thread)
{
    moe_job *j = ctx;
    kvc_moe_buf *b = &j->f->c->moe;
    const kvc_layer *L = j->L;
    const moe_task *t = &b->tasks[task];
    const int32_t e = t->e;
    const int64_t p0 = b->first[e], n_e = b->first[e + 1] - p0, ff = j->ff, ld = 2 * ff;
    const float *x = b->x + p0 * j->d;
    float *gu = b->gu + p0 * ld;
    if (L->gate_up_exps.n) {
        const kvc_weight w = kvc_expert(&L->gate_up_exps, e);
        expert_rows(j, &w, x, j->d, e, gu, ld, t->r0, t->r1, thread);
        expert_rows(j, &w, x, j->d, e, gu, ld, ff + t->r0, ff + t->r1, thread);
    } else if (!L->gate_exps.n) {   /* not gated (ReLU²): the activation reads up alone */
        const kvc_weight wu = kvc_expert(&L->up_exps, e);
        expert_rows(j, &wu, x, j->d, e, gu + ff, ld, t->r0, t->r1, thread);
    } else {
        const kvc_weight wg = kvc_expert(&L->gate_exps, e), wu = kvc_expert(&L->up_exps, e);
        expert_rows(j, &wg, x, j->d, e, gu, ld, t->r0, t->r1, thread);
        expert_rows(j, &wu, x, j->d, e, gu + ff, ld, t->r0, t->r1, thread);
    }
    const kvc_ffn_act act = j->f->c->m->hp.ffn_act;
    for (int64_t p = 0; p < n_e; p++) {
        float *g = gu + p * ld, *u = g + ff;
        for (int64_t r = t->r0; r < t->r1; r++) {
            if (L->gate_exps_b)
                g[r] += L->gate_exps_b[(int64_t)e * ff + r];
            if (L->up_exps_b)
                u[r] += L->up_exps_b[(int64_t)e * ff + r];
        }
        kvc_fwd_ffn_act(act, g + t->r0, u + t->r0, t->r1 - t->r0);
    }
}

/* Down rows [r0, r1) of one expert for its pairs, its output scale and its bias. */
static void down_task(void *ctx, int64_t task, int thread)
{
    moe_job *j = ctx;
    kvc_moe_buf *b = &j->f->c->moe;
    const kvc_layer *L = j->L;
    const moe_task *t = &b->tasks[task];
    const int32_t e = t->e;
    const int64_t p0 = b->first[e], n_e = b->first[e + 1] - p0;
    const kvc_weight w = kvc_expert(&L->down_exps, e);
    float *y = b->y + p0 * j->d;
    expert_rows(j, &w, b->gu + p0 * 2 * j->ff, 2 * j->ff, e, y, j->d, t->r0, t->r1, thread);
    if (L->down_exps_s)
        for (int64_t p = 0; p < n_e; p++)
            for (int64_t r = t->r0; r < t->r1; r++)
                y[p * j->d + r] *= L->down_exps_s[e];
    if (L->down_exps_b)
        for (int64_t p = 0; p < n_e; p++)
            for (int64_t r = t->r0; r < t->r1; r++)
                y[p * j->d + r] += L->down_exps_b[(int64_t)e * j->d + r];
}

/* ------------------------------------------------------ shared expert */

static void shexp_act_task(void *ctx, int64_t t, int thread)
{
    moe_job *j = ctx;
    kvc_moe_buf *b = &j->f->c->moe;
    const int64_t fs = j->f->c->m->hp.n_ff_shexp;
    kvc_fwd_ffn_act(j->f->c->m->hp.ffn_act, b->sh_g + t * fs, b->sh_u + t * fs, fs);
}

/* Token t's output: its experts' outputs weighted, in selection order, then
 * the shared expert's (gated by a sigmoid when the layer has the gate). */
static void combine_task(void *ctx, int64_t t, int thread)
{
    moe_job *j = ctx;
    kvc_moe_buf *b = &j->f->c->moe;
    float *out = j->f->c->h + t * j->d;
    const int32_t *pair = b->pair_of + t * j->k;
    const float *w = b->w + t * j->k;
    const float *y0 = b->y + (int64_t)pair[0] * j->d;
    for (int64_t i = 0; i < j->d; i++)
        out[i] = w[0] * y0[i];
    for (int32_t s = 1; s < j->k; s++) {
        const float *ys = b->y + (int64_t)pair[s] * j->d;
        for (int64_t i = 0; i < j->d; i++)
            out[i] += w[s] * ys[i];
    }
    if (j->L->shexp_up.data) {
        const float g = j->L->shexp_gate_inp.data
                      ? (float)(1.0 / (1.0 + exp(-(double)b->sh_gate[t]))) : 1.0f;
        const float *sy = b->sh_y + t * j->d;
        for (int64_t i = 0; i < j->d; i++)
            out[i] += g * sy[i];
    }
}

/* ---------------------------------------------------------------- step */

/* The experts of the router logits in b->logits for the input rows in c->h
 * (n_embd each): routing, the selected experts, and each token's weighted
 * sum (plus the shared expert's output in b->sh_y, when the layer has one)
 * into c->h. */
static void run_experts(moe_job *j)
{
    fwd *f = j->f;
    kvc_compute *c = f->c;
    const kvc_layer *L = j->L;
    const int64_t n = f->n;

    kvc_threadpool_run(c->tp, n, route_task, j);
    group_pairs(j);
    const int64_t n_pairs = n * j->k, pair_tasks = (n_pairs + MOE_PAIR_TASK - 1) / MOE_PAIR_TASK;

    const bool fused = L->gate_up_exps.n > 0;
    j->act_tok = true;
    const kvc_weight *first = fused ? &L->gate_up_exps.w : L->gate_exps.n ? &L->gate_exps.w : &L->up_exps.w;
    if ((j->act = uses_act(j, first, fused ? NULL : &L->up_exps.w)))
        kvc_threadpool_run(c->tp, (n + MOE_TOK_TASK - 1) / MOE_TOK_TASK, quant_in_task, j);
    else
        kvc_threadpool_run(c->tp, pair_tasks, gather_task, j);
    const size_t gu_bytes = fused ? 2 * L->gate_up_exps.w.row_bytes
                          : L->up_exps.w.row_bytes + (L->gate_exps.n ? L->gate_exps.w.row_bytes : 0);
    plan_rows(j, j->ff, gu_bytes);
    kvc_threadpool_run(c->tp, j->n_tasks, gate_up_task, j);

    j->act_tok = false;
    if ((j->act = uses_act(j, &L->down_exps.w, NULL)))
        kvc_threadpool_run(c->tp, pair_tasks, quant_down_task, j);
    plan_rows(j, j->d, L->down_exps.w.row_bytes);
    kvc_threadpool_run(c->tp, j->n_tasks, down_task, j);

    kvc_threadpool_run(c->tp, n, combine_task, j);
}

void kvc_moe_step(fwd *f)
{
    kvc_compute *c = f->c;
    const kvc_hparams *hp = &c->m->hp;
    const kvc_layer *L = &c->m->layers[f->layer];
    kvc_moe_buf *b = &c->moe;
    moe_job j = { f, L, f->n, hp->n_expert_used, hp->n_expert, hp->n_embd, hp->n_ff_exp, false, false, 0 };
    const int64_t n = f->n, fs = hp->n_ff_shexp;

    kvc_threadpool_run(c->tp, n, kvc_fwd_ffn_norm_task, f);
    if (L->shexp_gate_inp.data)
        kvc_fwd_matmul_n(c, c->h, n, 2, (const kvc_weight *[]){ &L->router, &L->shexp_gate_inp },
                         (float *[]){ b->logits, b->sh_gate }, (const int64_t[]){ j.n_exp, 1 });
    else
        kvc_fwd_matmul_n(c, c->h, n, 1, (const kvc_weight *[]){ &L->router }, (float *[]){ b->logits },
                         (const int64_t[]){ j.n_exp });
    if (L->shexp_gate.data)
        kvc_fwd_matmul_n(c, c->h, n, 2, (const kvc_weight *[]){ &L->shexp_gate, &L->shexp_up },
                         (float *[]){ b->sh_g, b->sh_u }, (const int64_t[]){ fs, fs });
    else if (L->shexp_up.data)   /* not gated (ReLU²) */
        kvc_fwd_matmul_n(c, c->h, n, 1, (const kvc_weight *[]){ &L->shexp_up }, (float *[]){ b->sh_u },
                         (const int64_t[]){ fs });
    if (L->shexp_up.data) {
        kvc_threadpool_run(c->tp, n, shexp_act_task, &j);
        kvc_fwd_matmul_n(c, b->sh_g, n, 1, (const kvc_weight *[]){ &L->shexp_down },
                         (float *[]){ b->sh_y }, (const int64_t[]){ j.d });
    }
    run_experts(&j);
}

/* Row t, after the dense FFN: its output post-normed (post_ffw_norm_1); the
 * experts' input rms(x) * pre_ffw_norm_2 into h; the router's input
 * rms(x) / sqrt(n_embd) * ffn_gate_inp.scale, in llama.cpp's order. */
static void dense_side_task(void *ctx, int64_t t, int thread)
{
    moe_job *j = ctx;
    const kvc_hparams *hp = &j->f->c->m->hp;
    kvc_moe_buf *b = &j->f->c->moe;
    const kvc_layer *L = j->L;
    const float *x = j->f->c->x + t * j->d;
    float *dn = b->dense + t * j->d, *r = b->rin + t * j->d;
    kvc_fwd_rmsnorm(dn, dn, L->post_ffn_norm1, j->d, hp->rms_eps);
    kvc_fwd_rmsnorm(j->f->c->h + t * j->d, x, L->pre_ffn_norm2, j->d, hp->rms_eps);
    kvc_fwd_rmsnorm(r, x, NULL, j->d, hp->rms_eps);
    const float inv = 1.0f / sqrtf((float)j->d);
    for (int64_t i = 0; i < j->d; i++)
        r[i] = r[i] * inv * L->router_in_scale[i];
}

/* Row t: h = rms(experts' output, post_ffw_norm_2) + the dense side. */
static void moe_dense_out_task(void *ctx, int64_t t, int thread)
{
    moe_job *j = ctx;
    kvc_moe_buf *b = &j->f->c->moe;
    float *h = j->f->c->h + t * j->d;
    const float *dn = b->dense + t * j->d;
    kvc_fwd_rmsnorm(h, h, j->L->post_ffn_norm2, j->d, j->f->c->m->hp.rms_eps);
    for (int64_t i = 0; i < j->d; i++)
        h[i] = dn[i] + h[i];
}

void kvc_moe_dense_step(fwd *f)
{
    kvc_compute *c = f->c;
    const kvc_hparams *hp = &c->m->hp;
    const kvc_layer *L = &c->m->layers[f->layer];
    kvc_moe_buf *b = &c->moe;
    moe_job j = { f, L, f->n, hp->n_expert_used, hp->n_expert, hp->n_embd, hp->n_ff_exp, false, false, 0 };
    const int64_t n = f->n;

    kvc_threadpool_run(c->tp, n, kvc_fwd_ffn_norm_task, f);   /* x += attention; h = rms(x) * ffn_norm */
    kvc_fwd_ffn_dense(f, b->dense);
    kvc_threadpool_run(c->tp, n, dense_side_task, &j);
    kvc_fwd_matmul_n(c, b->rin, n, 1, (const kvc_weight *[]){ &L->router }, (float *[]){ b->logits },
                     (const int64_t[]){ j.n_exp });
    run_experts(&j);
    kvc_threadpool_run(c->tp, n, moe_dense_out_task, &j);
}
