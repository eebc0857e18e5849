/* forward.c - the forward pass over a batch of tokens, reading and writing the
 * paged KV pool.
 *
 * A layer is a sequence of steps chosen by its kinds (arch.h; layer_forward).
 * Order of a full-attention, dense-FFN layer (llama / qwen2 / qwen3, as
 * llama.cpp runs them):
 *   h = rmsnorm(x) * attn_norm
 *   q, k, v = h Wq, h Wk, h Wv   (+ biases: qwen2)   (per-head rmsnorm of q, k: qwen3)
 *   rope(q, k at pos); store k, v in the pool (rounded to the pool's type)
 *   a = softmax(q K^T / sqrt(hd)) V    over positions [0, pos] of the sequence, from the pool
 *   x += a Wo
 *   h = rmsnorm(x) * ffn_norm;  x += (silu(h Wgate) * (h Wup)) Wdown
 * then logits = rmsnorm(x) * output_norm Wout for the tokens that want them.
 *
 * Batch invariance: every step is per token (norms, rope) or a matmul whose
 * per-element arithmetic is fixed (kernels.h), or attention, which takes runs
 * of a sequence's tokens as one tile but gives each query row the same
 * operations whatever the tile (attention.h); it reads its batch-mates' K/V
 * from the pool exactly as a later decode step would. So a token's logits do
 * not depend on the batch, its split into chunks, or the thread count. */
#include "attention.h"
#include "forward.h"
#include "quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ lifetime */

static float *alloc_f(size_t n) { return kvc_alloc_aligned(n * sizeof(float)); }

/* YaRN's correction dimension for beta (ggml's ggml_rope_yarn_corr_dim). */
static double yarn_corr_dim(int32_t n_rot, int32_t n_ctx_orig, double beta, double base)
{
    return n_rot * log(n_ctx_orig / (beta * 2 * M_PI)) / (2 * log(base));
}

/* The rotation of layers with RoPE base `base` (kvc_rope; ARCHITECTURES.md
 * §3.0, as ggml_rope_ext computes it, in double): unscaled when `unscaled`
 * (Gemma 3's sliding layers), else the file's linear or YaRN scaling; pair
 * i's frequency divided by ff[i] first when the model has factors (Llama
 * 3.1's rope_freqs.weight, as ggml's freq_factors). */
static void rope_init(kvc_rope *r, const kvc_hparams *hp, int32_t n_rot, double base, bool unscaled,
                      const float *ff)
{
    const int32_t n = n_rot, half = n / 2;
    r->n_rot = n_rot;
    const int scaling = unscaled ? KVC_ROPE_NONE : hp->rope_scaling;
    const double fs = scaling == KVC_ROPE_NONE ? 1.0 : 1.0 / (double)hp->rope_factor;
    double lo = 0, hi = 0;
    if (scaling == KVC_ROPE_YARN) {
        lo = KVC_MAX(0.0, floor(yarn_corr_dim(n, hp->rope_orig_ctx, 32.0, base)));
        hi = KVC_MIN((double)(n - 1), ceil(yarn_corr_dim(n, hp->rope_orig_ctx, 1.0, base)));
    }
    for (int32_t i = 0; i < half; i++) {
        const double extrap = pow(base, -2.0 * (double)i / (double)n) / (ff ? (double)ff[i] : 1.0);
        if (scaling == KVC_ROPE_YARN) {
            /* the pairs below lo keep their angle, those above hi are scaled */
            const double y = ((double)i - lo) / KVC_MAX(0.001, hi - lo);
            const double ramp = 1.0 - KVC_MIN(1.0, KVC_MAX(0.0, y));
            r->freq[i] = extrap * (fs * (1.0 - ramp) + ramp);
        } else {
            r->freq[i] = scaling == KVC_ROPE_NONE ? extrap : extrap * fs;
        }
    }
    /* llama.cpp's attn_factor cancels get_mscale(factor): what is left is ggml's 1 + 0.1 ln(1/fs) */
    r->mscale = scaling == KVC_ROPE_YARN ? 1.0 + 0.1 * log(1.0 / fs) : 1.0;
}

int kvc_compute_new(const kvc_model *m, int32_t max_batch, int32_t max_ctx, int n_threads,
                    kvc_compute **out, kvc_err *err)
{
    *out = NULL;
    if (max_batch < 1 || max_ctx < 1 || n_threads < 1)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "compute: batch %d, context %d, threads %d",
                        max_batch, max_ctx, n_threads);
    const kvc_hparams *hp = &m->hp;
    kvc_compute *c = calloc(1, sizeof(*c));
    if (!c)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    c->m = m;
    c->max_batch = max_batch;
    c->max_ctx = max_ctx;
    /* buffers sized by the largest layer (head sizes and KV heads may differ per layer) */
    size_t B = (size_t)max_batch, hd = (size_t)KVC_MAX(hp->head_dim, hp->head_dim_swa);
    size_t nq = (size_t)hp->n_head * hd, nkv = 0;
    for (int32_t il = 0; il < hp->n_layer; il++)
        nkv = KVC_MAX(nkv, (size_t)m->layers[il].n_head_kv * (size_t)m->layers[il].head_dim);
    c->x = alloc_f(B * hp->n_embd);
    c->h = alloc_f(B * hp->n_embd);
    c->q = alloc_f(B * nq);
    c->k = alloc_f(B * nkv);
    c->v = alloc_f(B * nkv);
    c->att = alloc_f(B * nq);
    c->gate = alloc_f(B * (size_t)KVC_MAX(hp->n_ff, 1));       /* the widest layer's; 0 in some MoE files */
    c->up = alloc_f(B * (size_t)KVC_MAX(hp->n_ff, 1));
    const size_t half = (size_t)KVC_MAX(hp->n_rot, hp->n_rot_swa) / 2;
    c->rope_half = (int32_t)half;
    c->n_rope = 1;
    for (int32_t il = 0; il < hp->n_layer; il++)
        if (m->layers[il].rope == 1)
            c->n_rope = 2;
    c->rope_cos = alloc_f(B * (size_t)c->n_rope * half);
    c->rope_sin = alloc_f(B * (size_t)c->n_rope * half);
    c->rope[0].freq = malloc(half * sizeof(double));
    c->rope[1].freq = malloc(half * sizeof(double));
    c->tiles = malloc((B + 1) * sizeof(int32_t));
    /* Tiles of about kvc_attn_tile_rows query rows: K/V blocks are read from
     * memory once per tile and from L1 for every 8 or 16 of its rows. */
    int32_t group = 1;   /* the largest query group of any attention layer */
    for (int32_t il = 0; il < hp->n_layer; il++)
        if (m->layers[il].n_head_kv > 0)
            group = KVC_MAX(group, m->layers[il].n_head / m->layers[il].n_head_kv);
    c->tile_tok = KVC_MAX(1, KVC_MIN(64, kvc_attn_tile_rows((int32_t)hd) / group));
    c->tp = kvc_threadpool_new(n_threads);
    c->mm_scratch = calloc((size_t)n_threads, sizeof(float *));
    c->scores = calloc((size_t)n_threads, sizeof(float *));
    c->krow = calloc((size_t)n_threads, sizeof(float *));
    c->blk = calloc((size_t)n_threads * 2 * ((size_t)max_ctx / KVC_BLOCK_TOKENS + 2), sizeof(void *));
    bool ok = c->x && c->h && c->q && c->k && c->v && c->att && c->gate && c->up &&
              c->rope_cos && c->rope_sin && c->rope[0].freq && c->rope[1].freq && c->tiles && c->tp && c->mm_scratch &&
              c->scores && c->krow && c->blk;
    int64_t max_in = KVC_MAX(KVC_MAX((int64_t)hp->n_embd, (int64_t)hp->n_ff), (int64_t)nq);
    max_in = KVC_MAX(max_in, KVC_MAX((int64_t)hp->n_ff_exp, (int64_t)hp->n_ff_shexp));
    max_in = KVC_MAX(max_in, (int64_t)hp->ssm_d_inner);   /* Mamba-2's out_proj */
    c->mm_act_bytes = kvc_matmul_act_bytes(max_in, max_batch);   /* 0 on ISAs that do not use them */
    if (ok && c->mm_act_bytes) {
        c->mm_act = kvc_alloc_aligned(c->mm_act_bytes);
        ok = c->mm_act != NULL;
    }
    for (int t = 0; ok && t < n_threads; t++) {
        c->mm_scratch[t] = alloc_f(kvc_matmul_scratch_floats(max_in));
        c->scores[t] = alloc_f(kvc_attn_scratch_floats((int64_t)c->tile_tok * group, (int32_t)hd));
        ok = c->mm_scratch[t] && c->scores[t];
    }
    if (!ok) {
        kvc_compute_free(c);
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory allocating activations");
    }
    if (hp->n_expert > 0 && kvc_moe_alloc(c) != KVC_OK) {
        kvc_compute_free(c);
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory allocating the experts' buffers");
    }
    if (hp->n_embd_per_layer > 0 && kvc_ple_alloc(c) != KVC_OK) {
        kvc_compute_free(c);
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory allocating the per-layer embeddings' buffers");
    }
    if (kvc_gdn_alloc(c) != KVC_OK ||
        (hp->arch->recurrent != KVC_ATTN_FULL && kvc_ssm_alloc(c) != KVC_OK)) {
        kvc_compute_free(c);
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory allocating the recurrent layers' buffers");
    }
    rope_init(&c->rope[0], hp, hp->n_rot, hp->rope_theta, false, m->rope_freqs);
    rope_init(&c->rope[1], hp, hp->n_rot_swa, hp->rope_theta_swa, !hp->arch->swa_rope_as_global,
              hp->arch->rope_freqs_global ? NULL : m->rope_freqs);
    *out = c;
    return KVC_OK;
}

void kvc_compute_free(kvc_compute *c)
{
    if (!c)
        return;
    int nt = c->tp ? kvc_threadpool_n_threads(c->tp) : 0;
    for (int t = 0; t < nt; t++) {
        if (c->mm_scratch)
            kvc_free_aligned(c->mm_scratch[t]);
        if (c->scores)
            kvc_free_aligned(c->scores[t]);
        if (c->krow)
            kvc_free_aligned(c->krow[t]);
    }
    kvc_moe_free(c);
    kvc_ple_free(c);
    kvc_gdn_free(c);
    kvc_ssm_free(c);
    kvc_threadpool_free(c->tp);
    free(c->mm_scratch);
    kvc_free_aligned(c->mm_act);
    free(c->scores);
    free(c->krow);
    free(c->blk);
    float *bufs[] = { c->x, c->h, c->q, c->k, c->v, c->att, c->gate, c->up, c->rope_cos, c->rope_sin };
    for (size_t i = 0; i < KVC_ARRAY_LEN(bufs); i++)
        kvc_free_aligned(bufs[i]);
    free(c->rope[0].freq);
    free(c->rope[1].freq);
    free(c->tiles);
    free(c);
}

int kvc_compute_n_threads(const kvc_compute *c) { return kvc_threadpool_n_threads(c->tp); }

/* -------------------------------------------------------------- matmul */

/* One weight of a matmul job: y = W x, in row ranges of `per` rows, which
 * are the job's tasks [first, first + ceil(n_out / per)). */
typedef struct mm_part {
    const kvc_weight *w;
    float            *y;
    int64_t           ldy;
    int64_t           per;
    int64_t           first;
    bool              act;           /* reads the quantized x (kvc_matmul_rows_act) */
} mm_part;

#define MM_PARTS 4

typedef struct mm_job {
    kvc_compute *c;
    const float *x;
    int64_t      ldx;
    int64_t      n_in;
    int64_t      n_tok;
    int          n_parts;
    mm_part      parts[MM_PARTS];
} mm_job;

#define ACT_TOK_TASK  16   /* tokens per quantization task (up to 16 tokens: one task, run inline) */

static void act_task(void *ctx, int64_t task, int thread)
{
    mm_job *j = ctx;
    int64_t t0 = task * ACT_TOK_TASK, t1 = KVC_MIN(t0 + ACT_TOK_TASK, j->n_tok);
    kvc_matmul_act_quantize(j->n_in, j->x, j->ldx, j->n_tok, t0, t1, j->c->mm_act);
}

static void mm_task(void *ctx, int64_t task, int thread)
{
    mm_job *j = ctx;
    int p = j->n_parts - 1;
    while (task < j->parts[p].first)
        p--;
    const mm_part *m = &j->parts[p];
    int64_t r0 = (task - m->first) * m->per;
    int64_t r1 = KVC_MIN(r0 + m->per, m->w->n_out);
    if (m->act)
        kvc_matmul_rows_act(m->w, j->c->mm_act, j->n_tok, m->y, m->ldy, r0, r1, j->c->mm_scratch[thread]);
    else
        kvc_matmul_rows(m->w, j->x, j->ldx, j->n_tok, m->y, m->ldy, r0, r1, j->c->mm_scratch[thread]);
}

/* y_i[t][r] = W_i x[t] for t < n_tok and each of n <= MM_PARTS weights of one
 * n_in (Q, K and V; gate and up), split by rows over the threads in one
 * dispatch. Any split gives the same values (kernels.h). Kernels that quantize x (kernels.h,
 * "prepared activations") get it quantized once for all n, split by tokens,
 * instead of once per row range; the values are the same. */
void kvc_fwd_matmul_n(kvc_compute *c, const float *x, int64_t n_tok, int n, const kvc_weight *const w[],
                     float *const y[], const int64_t ldy[])
{
    const int nt = kvc_threadpool_n_threads(c->tp);
    const int64_t n_in = w[0]->n_in;
    const bool act_ok = c->mm_act && kvc_matmul_act_bytes(n_in, n_tok) <= c->mm_act_bytes;
    mm_job j = { c, x, n_in, n_in, n_tok, n, { { 0 } } };
    bool any_act = false;
    int64_t tasks = 0;
    for (int i = 0; i < n; i++) {
        mm_part *m = &j.parts[i];
        m->w = w[i];
        m->y = y[i];
        m->ldy = ldy[i];
        m->act = act_ok && kvc_matmul_uses_act(w[i]);
        any_act = any_act || m->act;
        /* row ranges in multiples of the kernels' row groups (16, or what the
         * prepared-activation kernel takes); with groups of 32, 2 ranges a
         * thread, so that 896 rows split into 7 groups each */
        const int64_t align = m->act ? kvc_matmul_act_row_group(n_tok) : 16, ranges = align > 16 ? 2 : 4;
        int64_t per = (w[i]->n_out + ranges * nt - 1) / (ranges * nt);
        per = (per + align - 1) / align * align;
        if (align == 16 && n_tok <= KVC_DECODE_TOK)
            per = kvc_fwd_decode_rows(w[i]->row_bytes, per);
        m->per = per < 16 ? 16 : per;
        m->first = tasks;
        tasks += (w[i]->n_out + m->per - 1) / m->per;
    }
    if (any_act)
        kvc_threadpool_run(c->tp, (n_tok + ACT_TOK_TASK - 1) / ACT_TOK_TASK, act_task, &j);
    kvc_threadpool_run(c->tp, tasks, mm_task, &j);
}

/* WHY small ranges in decode: the pool hands tasks out one at a time, so a
 * thread that runs slower (a vCPU shared with other processes, or one the
 * OS takes away for a while) holds back the matmul by at most the range it
 * holds. Cut into 4 ranges a thread, the 151936-row output matrix of
 * Qwen3-30B-A3B was ranges of 31 MB each: one thread descheduled for a few
 * ms left the other spinning at the end of nearly every matmul. A range of
 * 1 MB costs two contended atomics (a claim, a done: ~0.5 us) per ~70 us of
 * streaming, and the kernel's prefetch of its first row group; matrices
 * under 8 MB keep their 4 ranges a thread. */
int64_t kvc_fwd_decode_rows(size_t row_bytes, int64_t per)
{
    int64_t rows = (int64_t)(KVC_DECODE_TASK_BYTES / KVC_MAX(row_bytes, 1)) / 16 * 16;
    rows = rows < 16 ? 16 : rows;
    return rows < per ? rows : per;
}

static void matmul(kvc_compute *c, const kvc_weight *w, const float *x, int64_t n_tok, float *y, int64_t ldy)
{
    kvc_fwd_matmul_n(c, x, n_tok, 1, &w, &y, &ldy);
}

/* ------------------------------------------------------- per-token math */

/* out = x / sqrt(mean(x^2) + eps) * w  (the sum in double, as exact as cheap) */
void kvc_fwd_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)x[i] * (double)x[i];
    float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    if (!w)
        for (int64_t i = 0; i < n; i++)
            out[i] = x[i] * scale;
    else
        for (int64_t i = 0; i < n; i++)
            out[i] = (x[i] * scale) * w[i];
}

/* Rotate the first n_rot dims of one head in place: pairs (2i, 2i+1), or
 * (i, i + n_rot/2) for NEOX; the rest stay as they are. */
static void rope_head(float *x, const float *cs, const float *sn, int32_t n_rot, bool neox)
{
    int32_t half = n_rot / 2;
    for (int32_t i = 0; i < half; i++) {
        int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * cs[i] - x1 * sn[i];
        x[b] = x0 * sn[i] + x1 * cs[i];
    }
}

static void rope_table(const double *freq, int32_t half, double pos, double mscale, float *cs, float *sn)
{
    for (int32_t i = 0; i < half; i++) {
        double th = pos * freq[i];
        cs[i] = (float)(cos(th) * mscale);
        sn[i] = (float)(sin(th) * mscale);
    }
}

/* Store one head's row (hd floats) in the pool's type. */
static void store_row(uint32_t type, const float *src, void *dst, int32_t hd)
{
    switch (type) {
    case KVC_TYPE_F32:  memcpy(dst, src, (size_t)hd * sizeof(float)); break;
    case KVC_TYPE_F16:  kvc_fp32_to_fp16_row(src, dst, hd); break;
    default:            kvc_quantize_row_ref(type, src, dst, hd); break;
    }
}

/* Store one head's key at row r of a block. F16 and F32 keys are stored
 * transposed, [hd][B] (attention.h); Q8_0 keys as rows, quantized along hd. */
static void store_k(uint32_t type, const float *src, void *head, int32_t r, int32_t B,
                    size_t row_bytes, int32_t hd)
{
    if (type == KVC_TYPE_F16)
        for (int32_t d = 0; d < hd; d++)
            ((kvc_fp16 *)head)[d * B + r] = kvc_fp32_to_fp16(src[d]);
    else if (type == KVC_TYPE_F32)
        for (int32_t d = 0; d < hd; d++)
            ((float *)head)[d * B + r] = src[d];
    else
        store_row(type, src, (uint8_t *)head + (size_t)r * row_bytes, hd);
}

/* Read back one head's key at row r of a block as floats. */
static void load_k(uint32_t type, const void *head, int32_t r, int32_t B, size_t row_bytes,
                   int32_t hd, float *out)
{
    if (type == KVC_TYPE_F16)
        for (int32_t d = 0; d < hd; d++)
            out[d] = kvc_fp16_to_fp32(((const kvc_fp16 *)head)[d * B + r]);
    else if (type == KVC_TYPE_F32)
        for (int32_t d = 0; d < hd; d++)
            out[d] = ((const float *)head)[d * B + r];
    else
        kvc_dequantize_row(type, (const uint8_t *)head + (size_t)r * row_bytes, out, hd);
}

/* ------------------------------------------------------------ the batch */

static void embed_task(void *ctx, int64_t i, int thread)
{
    fwd *f = ctx;
    const kvc_model *m = f->c->m;
    const kvc_weight *e = &m->tok_embd;
    const uint8_t *row = (const uint8_t *)e->data + (size_t)f->items[i].token * e->row_bytes;
    float *x = f->c->x + i * m->hp.n_embd;
    kvc_dequantize_row(e->type, row, x, m->hp.n_embd);
    if (m->hp.emb_scale != 0.0f)
        for (int32_t d = 0; d < m->hp.n_embd; d++)
            x[d] *= m->hp.emb_scale;
    for (int32_t r = 0; r < f->c->n_rope; r++) {
        const size_t at = ((size_t)i * (size_t)f->c->n_rope + (size_t)r) * (size_t)f->c->rope_half;
        rope_table(f->c->rope[r].freq, f->c->rope[r].n_rot / 2, (double)f->items[i].pos, f->c->rope[r].mscale,
                   f->c->rope_cos + at, f->c->rope_sin + at);
    }
}

static void add_rows(float *x, const float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] += y[i];
}

/* The residual adds run in the tasks of the next step (row by row, on every
 * thread): a sublayer leaves its output in h, and the task that reads x next
 * first adds it. */

static void add_bias(float *x, const float *b, int64_t n)
{
    if (b)
        for (int64_t i = 0; i < n; i++)
            x[i] += b[i];
}

/* x += a sublayer's output h, after its bias and its post-norm (Gemma's
 * sandwich norms) where the layer has them. */
static void residual_add(const kvc_hparams *hp, float *x, float *h, const float *bias, const float *post_norm)
{
    add_bias(h, bias, hp->n_embd);
    if (post_norm)
        kvc_fwd_rmsnorm(h, h, post_norm, hp->n_embd, hp->rms_eps);
    if (hp->residual_scale != 0.0f)   /* Granite */
        for (int32_t d = 0; d < hp->n_embd; d++)
            h[d] *= hp->residual_scale;
    add_rows(x, h, hp->n_embd);
}

/* x += layer L's output h (after its post-norm: the FFN's, or with per-layer
 * embeddings theirs, kvc_ple_step having added the FFN's), then x *= the
 * layer's output scale where it has one (Gemma 4). */
static void ffn_residual(const kvc_hparams *hp, const kvc_layer *L, float *x, float *h)
{
    residual_add(hp, x, h, NULL, L->ple_gate.data ? L->ple_post_norm : L->post_ffn_norm);
    if (L->out_scale)
        for (int32_t d = 0; d < hp->n_embd; d++)
            x[d] *= L->out_scale[0];
}

void kvc_fwd_ffn_residual_task(void *ctx, int64_t i, int thread)
{
    fwd *f = ctx;
    const kvc_hparams *hp = &f->c->m->hp;
    residual_add(hp, f->c->x + i * hp->n_embd, f->c->h + i * hp->n_embd, NULL,
                 f->c->m->layers[f->layer].post_ffn_norm);
}

/* Row i: x += the previous layer's FFN output (none before layer 0), then the
 * attention's norm. */
void kvc_fwd_attn_norm_task(void *ctx, int64_t i, int thread)
{
    fwd *f = ctx;
    const kvc_hparams *hp = &f->c->m->hp;
    float *x = f->c->x + i * hp->n_embd, *h = f->c->h + i * hp->n_embd;
    if (f->layer > 0)
        ffn_residual(hp, &f->c->m->layers[f->layer - 1], x, h);
    kvc_fwd_rmsnorm(h, x, f->c->m->layers[f->layer].attn_norm, hp->n_embd, hp->rms_eps);
}

/* Row i: x += the attention's output (+ its bias, post-norm), then the FFN's norm. */
void kvc_fwd_ffn_norm_task(void *ctx, int64_t i, int thread)
{
    fwd *f = ctx;
    const kvc_hparams *hp = &f->c->m->hp;
    const kvc_layer *L = &f->c->m->layers[f->layer];
    float *x = f->c->x + i * hp->n_embd, *h = f->c->h + i * hp->n_embd;
    residual_add(hp, x, h, L->bo, L->post_attn_norm);
    kvc_fwd_rmsnorm(h, x, L->ffn_norm, hp->n_embd, hp->rms_eps);
}

/* Row i: gate = act(gate, up) (SwiGLU, GeGLU, ...: the row's activation). */
static void ffn_act_task(void *ctx, int64_t i, int thread)
{
    fwd *f = ctx;
    const int64_t n_ff = f->c->m->layers[f->layer].n_ff;
    kvc_fwd_ffn_act(f->c->m->hp.ffn_act, f->c->gate + i * n_ff, f->c->up + i * n_ff, n_ff);
}

/* Row i: x += the last layer's FFN output. */
static void last_residual_task(void *ctx, int64_t i, int thread)
{
    fwd *f = ctx;
    const kvc_model *m = f->c->m;
    const int64_t d = m->hp.n_embd;
    ffn_residual(&m->hp, &m->layers[m->hp.n_layer - 1], f->c->x + i * d, f->c->h + i * d);
}

/* Biases, per-head norms, rope; then K and V of token i go into the pool. */
static void qkv_task(void *ctx, int64_t i, int thread)
{
    fwd *f = ctx;
    kvc_compute *c = f->c;
    const kvc_hparams *hp = &c->m->hp;
    const kvc_layer *L = &c->m->layers[f->layer];
    const int32_t hd = L->head_dim, n_rot = c->rope[L->rope].n_rot;
    float *q = c->q + i * L->n_head * hd;
    float *k = c->k + i * L->n_head_kv * hd;
    float *v = c->v + i * L->n_head_kv * hd;
    add_bias(q, L->bq, (int64_t)L->n_head * hd);
    add_bias(k, L->bk, (int64_t)L->n_head_kv * hd);
    if (!L->wv.data)   /* V = K before K's norm and rotation (Gemma 4's global layers) */
        memcpy(v, k, (size_t)L->n_head_kv * (size_t)hd * sizeof(float));
    add_bias(v, L->bv, (int64_t)L->n_head_kv * hd);
    const size_t at = ((size_t)i * (size_t)c->n_rope + (size_t)L->rope) * (size_t)c->rope_half;
    const float *cs = c->rope_cos + at, *sn = c->rope_sin + at;
    for (int32_t h = 0; h < L->n_head; h++) {
        if (L->q_norm)
            kvc_fwd_rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, hp->rms_eps);
        if (!L->no_rope)
            rope_head(q + h * hd, cs, sn, n_rot, hp->rope_neox);
    }
    if (L->kv_layer != f->layer)   /* KV-shared: attends to an earlier layer's K/V */
        return;
    const kvc_batch_item *it = &f->items[i];
    int32_t blk = it->seq->blocks[it->pos / f->B];
    size_t off = (size_t)(it->pos % f->B) * f->row_bytes;
    for (int32_t h = 0; h < L->n_head_kv; h++) {
        if (L->k_norm)
            kvc_fwd_rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, hp->rms_eps);
        if (L->v_norm)
            kvc_fwd_rmsnorm(v + h * hd, v + h * hd, NULL, hd, hp->rms_eps);
        if (!L->no_rope)
            rope_head(k + h * hd, cs, sn, n_rot, hp->rope_neox);
        store_k(f->kv_type, k + h * hd, kvc_kv_k(f->pool, blk, f->layer, h), it->pos % f->B, f->B,
                f->row_bytes, hd);
        store_row(f->kv_type, v + h * hd, (uint8_t *)kvc_kv_v(f->pool, blk, f->layer, h) + off, hd);
    }
}

/* A Q8_0 pool's K and V of positions [0, n_pos) as F32 in the attention
 * layout, into per-thread memory made on first use. NULL when out of memory. */
static float *dequant_kv(fwd *f, const kvc_batch_item *it, int32_t kvh, int64_t n_pos, int thread,
                         const void **kb, const void **vb)
{
    kvc_compute *c = f->c;
    const int32_t hd = c->m->layers[f->layer].head_dim, B = f->B;
    const size_t hd_max = (size_t)KVC_MAX(c->m->hp.head_dim, c->m->hp.head_dim_swa);
    if (!c->krow[thread] &&
        !(c->krow[thread] = alloc_f(2 * (size_t)((c->max_ctx + B) / B * B) * hd_max)))
        return NULL;
    float *kt = c->krow[thread], *vt = kt + (size_t)((c->max_ctx + B) / B * B) * hd;
    const int64_t nb = (n_pos + B - 1) / B;
    float row[1024];
    for (int64_t b = 0; b < nb; b++) {
        int32_t blk = it->seq->blocks[b];
        const int32_t kl = c->m->layers[f->layer].kv_layer;
        const uint8_t *kh = kvc_kv_k(f->pool, blk, kl, kvh);
        const uint8_t *vh = kvc_kv_v(f->pool, blk, kl, kvh);
        float *kb_f = kt + b * B * hd, *vb_f = vt + b * B * hd;
        kb[b] = vb[b] = NULL;
        if (!kh)   /* behind a window group's window: released, not read */
            continue;
        for (int32_t r = 0; r < B && b * B + r < n_pos; r++) {
            kvc_dequantize_row(f->kv_type, kh + (size_t)r * f->row_bytes, row, hd);
            for (int32_t d = 0; d < hd; d++)
                kb_f[d * B + r] = row[d];
            kvc_dequantize_row(f->kv_type, vh + (size_t)r * f->row_bytes, vb_f + r * hd, hd);
        }
        kb[b] = kb_f;
        vb[b] = vb_f;
    }
    return kt;
}

/* Attention of tile task % n_tiles (consecutive tokens of one sequence) for
 * the query heads of KV head task / n_tiles, each token over positions
 * [0, pos] of its sequence (attention.h).
 * WHY KV-head-major: threads take neighbouring tasks at the same time.
 * Taken tile-major, two threads worked on the same tile, the same tokens'
 * rows of q and of the output, each its KV head's part; on Zen 3 each was
 * then 20-25% slower in the kernel (pp140 @ d3089: the attention ran 1.34x
 * faster on 2 threads than on 1, the matmuls 1.8x). Neighbouring tiles of
 * one KV head (which also read the same K/V) do not slow each other, nor do
 * different tiles of different KV heads. */
static void attn_task(void *ctx, int64_t task, int thread)
{
    fwd *f = ctx;
    kvc_compute *c = f->c;
    const kvc_layer *L = &c->m->layers[f->layer];
    const int32_t hd = L->head_dim, group = L->n_head / L->n_head_kv;
    const int64_t tile = task % f->n_tiles;
    const int32_t kvh = (int32_t)(task / f->n_tiles);
    const int32_t i0 = c->tiles[tile], n_tok = c->tiles[tile + 1] - i0;
    const kvc_batch_item *it = &f->items[i0];
    const int64_t n_pos = (int64_t)it->pos + n_tok, nb = (n_pos + f->B - 1) / f->B;
    const void **kb = c->blk + (size_t)thread * 2 * ((size_t)c->max_ctx / KVC_BLOCK_TOKENS + 2), **vb = kb + nb;
    if (f->kv_type == KVC_TYPE_Q8_0) {
        if (!dequant_kv(f, it, kvh, n_pos, thread, kb, vb)) {
            atomic_store(&f->failed, true);
            return;
        }
    } else {
        for (int64_t b = 0; b < nb; b++) {
            kb[b] = kvc_kv_k(f->pool, it->seq->blocks[b], L->kv_layer, kvh);
            vb[b] = kvc_kv_v(f->pool, it->seq->blocks[b], L->kv_layer, kvh);
        }
    }
    const int64_t ld = (int64_t)L->n_head * hd;
    const size_t off = (size_t)i0 * ld + (size_t)kvh * group * hd;
    /* the model's sliding window; a layer of a model without one follows its
     * pool group's (kvc_context_set_windows: the window pools of test_window) */
    const int32_t window = L->window ? L->window : kvc_kv_layer_window(f->pool, f->layer);
    kvc_attn_args a = {
        .n_tok = n_tok, .n_q = group, .hd = hd, .n_pos = (int64_t)it->pos + 1, .window = window,
        .f16 = f->kv_type == KVC_TYPE_F16, .k = kb, .v = vb,
        .q = c->q + off, .ldq = ld, .scale = L->attn_scale,
        .sinks = L->sinks ? L->sinks + (size_t)kvh * group : NULL,
        .out = c->att + off, .ldo = ld, .scratch = c->scores[thread],
    };
    kvc_attention(&a);
}

/* Runs of consecutive batch items of one sequence (so consecutive positions,
 * check_batch), at most tile_tok long: c->tiles[0 .. n_tiles]. A sequence's
 * run of n items becomes ceil(n / tile_tok) tiles whose lengths differ by at
 * most 1.
 * WHY even: the threads take the tiles one after another, so cut at tile_tok
 * a prefill of 140 tokens (36, 36, 36, 32 for each KV head) left one thread
 * 8 tokens' attention ahead of the other at every layer; 35 each does not. A
 * row's result does not depend on its tile (attention.h). */
static int32_t make_tiles(kvc_compute *c, const kvc_batch_item *items, int32_t n)
{
    int32_t nt = 0;
    c->tiles[0] = 0;
    for (int32_t i0 = 0, i1; i0 < n; i0 = i1) {
        for (i1 = i0 + 1; i1 < n && items[i1].seq == items[i0].seq; i1++)
            ;
        const int32_t len = i1 - i0, k = (len + c->tile_tok - 1) / c->tile_tok;
        for (int32_t j = 1; j <= k; j++)
            c->tiles[++nt] = i0 + (int32_t)((int64_t)len * j / k);
    }
    return nt;
}

/* ------------------------------------------------------------ layer steps */

/* A layer is its attention step then its FFN step, chosen by the layer's
 * kinds (arch.h). Each step starts with its norm task, which first adds the
 * previous step's output (left in h) to the residual stream x. */
typedef void (*layer_step)(fwd *f);

/* Causal attention, full or over the layer's sliding window (biases,
 * QK-norm, sinks and the post-norm are the layer's optional tensors). */
static void attn_step(fwd *f)
{
    kvc_compute *c = f->c;
    const kvc_layer *L = &c->m->layers[f->layer];
    const int64_t n = f->n, d = c->m->hp.n_embd;
    const int64_t nq = (int64_t)L->n_head * L->head_dim, nkv = (int64_t)L->n_head_kv * L->head_dim;

    kvc_threadpool_run(c->tp, n, kvc_fwd_attn_norm_task, f);
    if (L->attn_gated)
        kvc_gated_qkv(f);
    else   /* without wv, V is K (qkv_task); a KV-shared layer projects only Q */
        kvc_fwd_matmul_n(c, c->h, n, L->kv_layer != f->layer ? 1 : L->wv.data ? 3 : 2, (const kvc_weight *[]){ &L->wq, &L->wk, &L->wv },
                 (float *[]){ c->q, c->k, c->v }, (const int64_t[]){ nq, nkv, nkv });
    kvc_threadpool_run(c->tp, n, qkv_task, f);
    kvc_threadpool_run(c->tp, (int64_t)f->n_tiles * L->n_head_kv, attn_task, f);
    if (L->attn_gated)
        kvc_gated_out(f);
    matmul(c, &L->wo, c->att, n, c->h, d);
}

void kvc_fwd_ffn_dense(fwd *f, float *out)
{
    kvc_compute *c = f->c;
    const kvc_layer *L = &c->m->layers[f->layer];
    const int64_t n = f->n, d = c->m->hp.n_embd, n_ff = L->n_ff;

    if (L->w_gate.data)
        kvc_fwd_matmul_n(c, c->h, n, 2, (const kvc_weight *[]){ &L->w_gate, &L->w_up },
                         (float *[]){ c->gate, c->up }, (const int64_t[]){ n_ff, n_ff });
    else   /* not gated (ReLU²): the activation reads up alone */
        kvc_fwd_matmul_n(c, c->h, n, 1, (const kvc_weight *[]){ &L->w_up }, (float *[]){ c->up },
                         (const int64_t[]){ n_ff });
    kvc_threadpool_run(c->tp, n, ffn_act_task, f);
    matmul(c, &L->w_down, c->gate, n, out, d);
}

/* The dense gated FFN: down(act(gate h) * up h). */
static void ffn_dense_step(fwd *f)
{
    kvc_threadpool_run(f->c->tp, f->n, kvc_fwd_ffn_norm_task, f);
    kvc_fwd_ffn_dense(f, f->c->h);
}

/* Row i of a layer without a token mixer: x += the previous layer's output,
 * and nothing for the FFN's norm task to add (h = 0; x + 0 is x). */
static void no_mixer_task(void *ctx, int64_t i, int thread)
{
    fwd *f = ctx;
    const kvc_hparams *hp = &f->c->m->hp;
    float *x = f->c->x + i * hp->n_embd, *h = f->c->h + i * hp->n_embd;
    if (f->layer > 0)
        ffn_residual(hp, &f->c->m->layers[f->layer - 1], x, h);
    memset(h, 0, (size_t)hp->n_embd * sizeof(float));
}

/* A layer that is its FFN alone (nemotron_h). */
static void no_mixer_step(fwd *f)
{
    kvc_threadpool_run(f->c->tp, f->n, no_mixer_task, f);
}

/* Row i of a layer without an FFN: the mixer's output bias, which the FFN's
 * norm task would have added (the next step adds h as an FFN's output). */
static void no_ffn_task(void *ctx, int64_t i, int thread)
{
    fwd *f = ctx;
    const int64_t d = f->c->m->hp.n_embd;
    add_bias(f->c->h + i * d, f->c->m->layers[f->layer].bo, d);
}

/* A layer that is its token mixer alone (nemotron_h). */
static void no_ffn_step(fwd *f)
{
    if (f->c->m->layers[f->layer].bo)
        kvc_threadpool_run(f->c->tp, f->n, no_ffn_task, f);
}

static const layer_step attn_steps[] = {
    [KVC_ATTN_FULL]   = attn_step,
    [KVC_ATTN_WINDOW] = attn_step,
    [KVC_ATTN_GDN]    = kvc_gdn_step,
    [KVC_ATTN_SHORTCONV] = kvc_shortconv_step,
    [KVC_ATTN_MAMBA2] = kvc_mamba2_step,
    [KVC_ATTN_NONE]   = no_mixer_step,
};

static const layer_step ffn_steps[] = {
    [KVC_FFN_DENSE] = ffn_dense_step,
    [KVC_FFN_MOE]   = kvc_moe_step,
    [KVC_FFN_MOE_DENSE] = kvc_moe_dense_step,
    [KVC_FFN_NONE]  = no_ffn_step,
};

static void layer_forward(fwd *f)
{
    const kvc_layer *L = &f->c->m->layers[f->layer];
    f->row_bytes = kvc_kv_layer_row_bytes(f->pool, L->kv_layer);   /* head sizes may differ per layer */
    attn_steps[L->attn](f);
    ffn_steps[L->ffn](f);
    if (L->ple_gate.data)
        kvc_ple_step(f);
}

/* Check the batch against the rules of kvc_compute_forward before touching
 * anything. */
static int check_batch(const kvc_compute *c, const kvc_kv_pool *pool, const kvc_batch_item *items,
                       int32_t n, kvc_err *err)
{
    const kvc_hparams *hp = &c->m->hp;
    const int64_t B = kvc_kv_block_tokens(pool);
    if (B != KVC_ATTN_B)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV pool blocks of %lld tokens: attention takes %d",
                        (long long)B, KVC_ATTN_B);
    if (n < 1 || n > c->max_batch)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "batch of %d tokens (1..%d)", n, c->max_batch);
    const kvc_kv_pool_params *pp = kvc_kv_pool_params_of(pool);
    if (pp->n_layer != hp->n_layer || pp->n_kv_head != hp->n_head_kv || pp->head_dim != hp->head_dim)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV pool shape does not match the model");
    for (int32_t l = 0; l < hp->n_layer; l++) {   /* head sizes and KV heads may differ per layer */
        const kvc_layer *L = &c->m->layers[l];
        if (L->state_floats == 0 && L->attn != KVC_ATTN_NONE && (kvc_kv_layer_n_kv_head(pool, l) != L->n_head_kv ||
                                     kvc_kv_layer_head_dim(pool, l) != L->head_dim))
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV pool layer %d: %d KV heads of %d, the model's "
                            "%d of %d", l, kvc_kv_layer_n_kv_head(pool, l), kvc_kv_layer_head_dim(pool, l),
                            L->n_head_kv, L->head_dim);
        const int32_t kv_of = kvc_kv_layer_kv_of(pool, l);   /* a pool may give a KV-shared layer its own */
        if (kv_of != l && kv_of != L->kv_layer)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV pool layer %d shares layer %d's K/V, the "
                            "model's layer %d's", l, kv_of, L->kv_layer);
    }
    for (int32_t i = 0; i < n; i++) {
        const kvc_batch_item *it = &items[i];
        if (it->token < 0 || it->token >= hp->n_vocab)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "token %d at batch index %d out of range [0, %d)",
                            it->token, i, hp->n_vocab);
        if (!it->seq || it->pos < 0 || it->pos >= c->max_ctx)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "batch index %d: position %d outside [0, %d)",
                            i, it->pos, c->max_ctx);
        if (it->pos >= it->seq->n_blocks * B)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "batch index %d: position %d not reserved", i, it->pos);
        /* the expected position: the sequence's length, or one past its previous batch token */
        int64_t expect = it->seq->n_tokens;
        for (int32_t j = i - 1; j >= 0; j--)
            if (items[j].seq == it->seq) {
                expect = items[j].pos + 1;
                break;
            }
        if (it->pos != expect)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "batch index %d: position %d, expected %lld",
                            i, it->pos, (long long)expect);
    }
    return KVC_OK;
}

typedef struct out_job {
    kvc_compute *c;
    const int32_t *rows;    /* batch indices that want logits */
} out_job;

static void out_norm_task(void *ctx, int64_t i, int thread)
{
    out_job *o = ctx;
    const kvc_hparams *hp = &o->c->m->hp;
    kvc_fwd_rmsnorm(o->c->h + i * hp->n_embd, o->c->x + (int64_t)o->rows[i] * hp->n_embd,
            o->c->m->output_norm, hp->n_embd, hp->rms_eps);
}

int kvc_compute_forward(kvc_compute *c, kvc_kv_pool *pool, const kvc_batch_item *items,
                        int32_t n, float *logits, kvc_err *err)
{
    int rc = check_batch(c, pool, items, n, err);
    for (int32_t i = 0; !rc && i < n; i++)   /* the window chunks the batch writes (kv.h) */
        rc = kvc_kv_seq_window(pool, items[i].seq, (int64_t)items[i].pos + 1, err);
    if (rc)
        return rc;
    const kvc_hparams *hp = &c->m->hp;
    fwd f = { c, pool, items, n, 0, kvc_kv_pool_params_of(pool)->type,
              kvc_kv_block_tokens(pool), make_tiles(c, items, n), kvc_kv_row_bytes(pool), false };

    kvc_threadpool_run(c->tp, n, embed_task, &f);
    kvc_ple_inputs(&f);
    for (f.layer = 0; f.layer < hp->n_layer && !atomic_load(&f.failed); f.layer++)
        layer_forward(&f);
    if (atomic_load(&f.failed))
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory in the forward pass (Q8_0 K/V rows or recurrent states)");
    kvc_threadpool_run(c->tp, n, last_residual_task, &f);
    for (int32_t i = 0; i < n; i++)
        if (items[i].pos + 1 > items[i].seq->n_tokens)
            items[i].seq->n_tokens = items[i].pos + 1;

    int32_t rows[n > 0 ? n : 1];
    int32_t n_out = 0;
    for (int32_t i = 0; i < n; i++)
        if (items[i].want_logits)
            rows[n_out++] = i;
    if (n_out == 0)
        return KVC_OK;
    out_job o = { c, rows };
    kvc_threadpool_run(c->tp, n_out, out_norm_task, &o);
    matmul(c, &c->m->output, c->h, n_out, logits, hp->n_vocab);
    if (hp->logit_scale != 0.0f) {   /* Granite */
        const float inv = 1.0f / hp->logit_scale;
        for (int64_t j = 0; j < (int64_t)n_out * hp->n_vocab; j++)
            logits[j] *= inv;
    }
    if (hp->logit_softcap > 0.0f) {
        const float cap = hp->logit_softcap;
        for (int64_t j = 0; j < (int64_t)n_out * hp->n_vocab; j++)
            logits[j] = cap * tanhf(logits[j] / cap);
    }
    return KVC_OK;
}

/* ----------------------------------------------------------- K shifting */

int kvc_compute_shift_k(kvc_compute *c, kvc_kv_pool *pool, kvc_kv_seq *seq,
                        int64_t p0, int64_t p1, int64_t delta, kvc_err *err)
{
    const kvc_hparams *hp = &c->m->hp;
    const int32_t B = kvc_kv_block_tokens(pool);
    const uint32_t type = kvc_kv_pool_params_of(pool)->type;
    if (kvc_model_recurrent(c->m))
        return kvc_fail(err, KVC_ERR_UNSUPPORTED, "context shift not supported for %s: its recurrent "
                        "layers' state cannot be moved to other positions", hp->arch_name);
    if (p0 < 0 || p1 > seq->n_tokens || p0 > p1)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "shift of positions [%lld, %lld) of %lld",
                        (long long)p0, (long long)p1, (long long)seq->n_tokens);
    float cs[2][512], sn[2][512], row[1024];
    for (int r = 0; r < c->n_rope; r++)
        rope_table(c->rope[r].freq, c->rope[r].n_rot / 2, (double)delta, 1.0, cs[r], sn[r]);
    for (int64_t p = p0; p < p1; p++) {
        int32_t blk = seq->blocks[p / B];
        if (kvc_kv_block_refcount(pool, blk) > 1)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "shift of a shared block");
        for (int32_t l = 0; l < hp->n_layer; l++) {
            const kvc_layer *L = &c->m->layers[l];
            const size_t rb = kvc_kv_layer_row_bytes(pool, l);
            const int r = L->rope;
            for (int32_t h = 0; h < L->n_head_kv; h++) {
                void *head = kvc_kv_k(pool, blk, l, h);
                if (!head)   /* behind a window group's window: released */
                    continue;
                load_k(type, head, (int32_t)(p % B), B, rb, L->head_dim, row);
                rope_head(row, cs[r], sn[r], c->rope[r].n_rot, hp->rope_neox);
                store_k(type, row, head, (int32_t)(p % B), B, rb, L->head_dim);
            }
        }
    }
    return KVC_OK;
}

int kvc_compute_move_kv(kvc_compute *c, kvc_kv_pool *pool, const int32_t *src_blocks, int64_t a,
                        const int32_t *dst_blocks, int64_t d, int64_t k, kvc_err *err)
{
    const kvc_hparams *hp = &c->m->hp;
    const int32_t B = kvc_kv_block_tokens(pool);
    const uint32_t type = kvc_kv_pool_params_of(pool)->type;
    if (kvc_model_recurrent(c->m))
        return kvc_fail(err, KVC_ERR_UNSUPPORTED, "context shift not supported for %s: its recurrent "
                        "layers' state cannot be moved to other positions", hp->arch_name);
    if (a < 0 || d < 0 || k < 0 || KVC_MAX(hp->head_dim, hp->head_dim_swa) > 1024 || (src_blocks == dst_blocks && d > a))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "move of positions [%lld, %lld) to %lld",
                        (long long)a, (long long)(a + k), (long long)d);
    float cs[2][512], sn[2][512], row[1024];
    for (int r = 0; r < c->n_rope; r++)
        rope_table(c->rope[r].freq, c->rope[r].n_rot / 2, (double)(d - a), 1.0, cs[r], sn[r]);
    for (int64_t j = 0; j < k; j++) {
        const int64_t p = a + j, q = d + j;
        const int32_t sb = src_blocks[p / B], db = dst_blocks[q / B];
        const int32_t sr = (int32_t)(p % B), dr = (int32_t)(q % B);
        if (kvc_kv_block_refcount(pool, db) > 1)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "move into a shared block");
        for (int32_t l = 0; l < hp->n_layer; l++) {
            const kvc_layer *L = &c->m->layers[l];
            const size_t rb = kvc_kv_layer_row_bytes(pool, l);
            const int r = L->rope;
            for (int32_t h = 0; h < L->n_head_kv; h++) {
                if (!kvc_kv_k(pool, sb, l, h) || !kvc_kv_k(pool, db, l, h))
                    continue;   /* behind a window group's window: released */
                load_k(type, kvc_kv_k(pool, sb, l, h), sr, B, rb, L->head_dim, row);
                rope_head(row, cs[r], sn[r], c->rope[r].n_rot, hp->rope_neox);
                store_k(type, row, kvc_kv_k(pool, db, l, h), dr, B, rb, L->head_dim);
                memcpy((uint8_t *)kvc_kv_v(pool, db, l, h) + (size_t)dr * rb,
                       (const uint8_t *)kvc_kv_v(pool, sb, l, h) + (size_t)sr * rb, rb);
            }
        }
    }
    return KVC_OK;
}
