/* forward_ssm.c - the recurrent mixers of the hybrid models, as llama.cpp
 * computes them (ARCHITECTURES.md §3.5, §3.6):
 *
 * lfm2's gated short convolution (lfm2.cpp, build_shortconv_block):
 *   [b | c | x] = W_in h;  u = b * x
 *   y = c * sum_{i<L} w[i] u_{t-L+1+i}       (u before the sequence's start: the state)
 *   out = W_out y
 * Mamba-2 (mamba-base.cpp, build_mamba2_layer; ggml_ssm_conv, ggml_ssm_scan):
 *   [z | xBC | dt] = W_in h
 *   xBC = silu(sum_{i<K} w[i] xBC_{t-K+1+i} + conv_bias)  -> x [n_head][hd], B [G][N], C [G][N]
 *   per head h (group g = h / (n_head / G)):
 *     d = softplus(dt_h + dt_bias_h);  S_h = S_h exp(d A_h) + (x_h d) B_g^T;  y_h = S_h C_g + D_h x_h
 *   y = y * silu(z);  y = rmsnorm per group of d_inner / G (ssm_norm);  out = W_out y
 *
 * The state of a layer and sequence (kv.h's kvc_kv_seq_state, f32):
 *   short conv  conv [L - 1][n_embd]            the last L - 1 inputs u, oldest first
 *   Mamba-2     conv [K - 1][d_inner + 2GN]     the last K - 1 rows xBC (before the conv)
 *               ssm  [n_head][hd][N]
 * zero before a sequence's first token.
 *
 * Fidelity (DESIGN.md §3): a token's arithmetic reads its own row and its
 * sequence's state only, and the state advances token by token in position
 * order whatever the chunking, the batch or the threads: one task owns some
 * channels (conv) or one head (scan) of one sequence over all of that
 * sequence's tokens in the batch. Sums have one order: a conv over i = 0 ..
 * K-1, the scan's over N in ssm_scan.h's (the same bits on every ISA). So the
 * state after a prefix, and the logits after it, are bitwise the same
 * computed at once, in chunks, or token by token. */
#include "forward.h"
#include "ssm_scan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SSM_CH_TASK 256   /* channels per convolution task */

/* ------------------------------------------------------------- buffers */

/* The input projection's width and the mixer output's. */
static int64_t proj_width(const kvc_hparams *hp)
{
    const int64_t conv = hp->ssm_d_inner + 2 * (int64_t)hp->ssm_n_group * hp->ssm_d_state;
    return KVC_MAX(3 * (int64_t)hp->n_embd, (int64_t)hp->ssm_d_inner + conv + hp->ssm_n_head);
}

float **kvc_fwd_conv_taps(const kvc_model *m, kvc_attn_kind kind)
{
    const kvc_hparams *hp = &m->hp;
    float **t = calloc((size_t)hp->n_layer, sizeof(float *));
    if (!t)
        return NULL;
    /* GDN and Mamba-2 convolve x|B|C (q|k|v): d_inner + 2 G N channels */
    const bool sc = kind == KVC_ATTN_SHORTCONV;
    const int64_t n = sc ? hp->n_embd : hp->ssm_d_inner + 2 * (int64_t)hp->ssm_n_group * hp->ssm_d_state;
    const int32_t K = sc ? hp->shortconv_l : hp->ssm_d_conv;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const kvc_layer *L = &m->layers[il];
        if (L->attn != kind)
            continue;
        if (!(t[il] = kvc_alloc_aligned((size_t)KVC_MAX(n * K, 1) * sizeof(float)))) {
            kvc_fwd_conv_taps_free(t, hp->n_layer);
            return NULL;
        }
        kvc_conv_taps_transpose(sc ? L->conv : L->ssm_conv, n, K, t[il]);
    }
    return t;
}

void kvc_fwd_conv_taps_free(float **t, int32_t n_layer)
{
    for (int32_t il = 0; t && il < n_layer; il++)
        kvc_free_aligned(t[il]);
    free(t);
}

int kvc_ssm_alloc(kvc_compute *c)
{
    const kvc_hparams *hp = &c->m->hp;
    kvc_ssm_buf *b = &c->ssm;
    const size_t B = (size_t)c->max_batch;
    const size_t conv = (size_t)hp->ssm_d_inner + 2 * (size_t)hp->ssm_n_group * (size_t)hp->ssm_d_state;
    b->proj = kvc_alloc_aligned(B * (size_t)proj_width(hp) * sizeof(float));
    b->xbc = kvc_alloc_aligned(B * KVC_MAX(conv, (size_t)1) * sizeof(float));
    b->y = kvc_alloc_aligned(B * (size_t)KVC_MAX(hp->n_embd, hp->ssm_d_inner) * sizeof(float));
    b->order = malloc(B * sizeof(int32_t));
    b->run = malloc((B + 1) * sizeof(int32_t));
    b->state = malloc(B * sizeof(float *));
    b->conv_t = kvc_fwd_conv_taps(c->m, hp->arch->recurrent);
    return b->proj && b->xbc && b->y && b->order && b->run && b->state && b->conv_t ? KVC_OK : KVC_ERR_NOMEM;
}

void kvc_ssm_free(kvc_compute *c)
{
    kvc_ssm_buf *b = &c->ssm;
    kvc_free_aligned(b->proj);
    kvc_free_aligned(b->xbc);
    kvc_free_aligned(b->y);
    free(b->order);
    free(b->run);
    free(b->state);
    kvc_fwd_conv_taps_free(b->conv_t, c->m->hp.n_layer);
    memset(b, 0, sizeof(*b));
}

/* ------------------------------------------------------------ sequences */

/* The batch's tokens by sequence (kvc_ssm_buf's order and run; sequences in
 * order of first appearance, each one's tokens in batch order, which is
 * position order: check_batch), and each sequence's state of the layer.
 * false when a state cannot be allocated. */
static bool group_by_seq(fwd *f)
{
    kvc_ssm_buf *b = &f->c->ssm;
    const kvc_kv_seq *seen[f->n];
    int32_t ns = 0, k = 0;
    for (int32_t i = 0; i < f->n; i++) {
        int32_t s = 0;
        while (s < ns && seen[s] != f->items[i].seq)
            s++;
        if (s == ns) {
            seen[ns++] = f->items[i].seq;
            b->state[s] = kvc_kv_seq_state(f->pool, f->items[i].seq, f->layer);
            if (!b->state[s])
                return false;
        }
    }
    for (int32_t s = 0; s < ns; s++) {
        b->run[s] = k;
        for (int32_t i = 0; i < f->n; i++)
            if (f->items[i].seq == seen[s])
                b->order[k++] = i;
    }
    b->run[ns] = k;
    b->n_seq = ns;
    return true;
}

/* -------------------------------------------------- lfm2: short convolution */

/* Channels [c0, c1) of one sequence (task / channel tasks) over its tokens. */
static void shortconv_task(void *ctx, int64_t task, int thread)
{
    fwd *f = ctx;
    kvc_compute *c = f->c;
    const kvc_ssm_buf *b = &c->ssm;
    const int64_t E = c->m->hp.n_embd, n_ch = (E + SSM_CH_TASK - 1) / SSM_CH_TASK;
    const int32_t K = c->m->hp.shortconv_l, s = (int32_t)(task / n_ch);
    const int64_t c0 = task % n_ch * SSM_CH_TASK, c1 = KVC_MIN(c0 + SSM_CH_TASK, E);
    for (int32_t j = b->run[s]; j < b->run[s + 1]; j++) {
        const int32_t i = b->order[j];
        const float *p = b->proj + (int64_t)i * 3 * E;   /* b | c | x */
        kvc_conv_step(&(kvc_conv_args){ .st = b->state[s] + c0, .ld_st = E, .wt = b->conv_t[f->layer] + c0,
                                        .ld_w = E, .K = K, .u = p + c0, .u_mul = p + 2 * E + c0,
                                        .y_mul = p + E + c0, .y = b->y + (int64_t)i * E + c0, .n = c1 - c0 });
    }
}

void kvc_shortconv_step(fwd *f)
{
    kvc_compute *c = f->c;
    const kvc_layer *L = &c->m->layers[f->layer];
    const int64_t n = f->n, E = c->m->hp.n_embd;

    kvc_threadpool_run(c->tp, n, kvc_fwd_attn_norm_task, f);
    kvc_fwd_matmul_n(c, c->h, n, 1, (const kvc_weight *[]){ &L->conv_in }, (float *[]){ c->ssm.proj },
                     (const int64_t[]){ 3 * E });
    if (!group_by_seq(f)) {
        atomic_store(&f->failed, true);
        return;
    }
    kvc_threadpool_run(c->tp, c->ssm.n_seq * ((E + SSM_CH_TASK - 1) / SSM_CH_TASK), shortconv_task, f);
    kvc_fwd_matmul_n(c, c->ssm.y, n, 1, (const kvc_weight *[]){ &L->conv_out }, (float *[]){ c->h },
                     (const int64_t[]){ E });
}

/* ------------------------------------------------------------- Mamba-2 */

typedef struct mamba_dims {
    int64_t d_inner, conv, in, N, G, nh, hd;   /* conv = d_inner + 2GN; in = d_inner + conv + nh */
    int32_t K;
} mamba_dims;

static mamba_dims dims_of(const kvc_hparams *hp)
{
    mamba_dims d;
    d.d_inner = hp->ssm_d_inner;
    d.N = hp->ssm_d_state;
    d.G = hp->ssm_n_group;
    d.nh = hp->ssm_n_head;
    d.hd = d.d_inner / d.nh;
    d.conv = d.d_inner + 2 * d.G * d.N;
    d.in = d.d_inner + d.conv + d.nh;
    d.K = hp->ssm_d_conv;
    return d;
}

/* Conv channels [c0, c1) of one sequence over its tokens: xbc = silu(conv + bias)
 * (ssm_scan.h's kvc_conv_step). */
static void mamba_conv_task(void *ctx, int64_t task, int thread)
{
    fwd *f = ctx;
    kvc_compute *c = f->c;
    const kvc_layer *L = &c->m->layers[f->layer];
    const kvc_ssm_buf *b = &c->ssm;
    const mamba_dims d = dims_of(&c->m->hp);
    const int64_t n_ch = (d.conv + SSM_CH_TASK - 1) / SSM_CH_TASK;
    const int32_t s = (int32_t)(task / n_ch);
    const int64_t c0 = task % n_ch * SSM_CH_TASK, c1 = KVC_MIN(c0 + SSM_CH_TASK, d.conv);
    for (int32_t j = b->run[s]; j < b->run[s + 1]; j++) {
        const int32_t i = b->order[j];
        kvc_conv_step(&(kvc_conv_args){
            .st = b->state[s] + c0, .ld_st = d.conv, .wt = b->conv_t[f->layer] + c0, .ld_w = d.conv, .K = d.K,
            .u = b->proj + (int64_t)i * d.in + d.d_inner + c0, .bias = L->ssm_conv_b ? L->ssm_conv_b + c0 : NULL,
            .silu = true, .y = b->xbc + (int64_t)i * d.conv + c0, .n = c1 - c0 });
    }
}

/* Head task % n_head of sequence task / n_head over its tokens: the scan,
 * the D skip and the gate, into y. */
static void mamba_scan_task(void *ctx, int64_t task, int thread)
{
    fwd *f = ctx;
    kvc_compute *c = f->c;
    const kvc_layer *L = &c->m->layers[f->layer];
    const kvc_ssm_buf *b = &c->ssm;
    const mamba_dims d = dims_of(&c->m->hp);
    const int32_t s = (int32_t)(task / d.nh), h = (int32_t)(task % d.nh);
    const int64_t g = h / (d.nh / d.G);
    float *S = b->state[s] + (int64_t)(d.K - 1) * d.conv + (int64_t)h * d.hd * d.N;
    for (int32_t j = b->run[s]; j < b->run[s + 1]; j++) {
        const int32_t i = b->order[j];
        const float *p = b->proj + (int64_t)i * d.in;
        const float *xbc = b->xbc + (int64_t)i * d.conv;
        const float *x = xbc + h * d.hd, *B = xbc + d.d_inner + g * d.N, *C = xbc + d.d_inner + (d.G + g) * d.N;
        float *z = b->proj + (int64_t)i * d.in + h * d.hd;
        float *y = b->y + (int64_t)i * d.d_inner + h * d.hd;
        const float v = p[d.d_inner + d.conv + h] + L->ssm_dt_b[h];
        const float dt = v > 20.0f ? v : logf(1.0f + expf(v));    /* softplus, as ggml */
        kvc_ssm_scan_head(S, x, B, C, expf(dt * L->ssm_a[h]), dt, (int32_t)d.hd, (int32_t)d.N, y);
        for (int64_t r = 0; r < d.hd; r++)
            y[r] = y[r] + x[r] * L->ssm_d[h];
        kvc_swiglu(z, y, d.hd);   /* z = silu(z) y: z is read nowhere else */
        memcpy(y, z, (size_t)d.hd * sizeof(float));
    }
}

/* Row i: the gated output's RMSNorm per group of d_inner / G. */
static void mamba_norm_task(void *ctx, int64_t i, int thread)
{
    fwd *f = ctx;
    kvc_compute *c = f->c;
    const kvc_layer *L = &c->m->layers[f->layer];
    const mamba_dims d = dims_of(&c->m->hp);
    const int64_t w = d.d_inner / d.G;
    float *y = c->ssm.y + i * d.d_inner;
    for (int64_t g = 0; g < d.G; g++)
        kvc_fwd_rmsnorm(y + g * w, y + g * w, L->ssm_norm + g * w, w, c->m->hp.rms_eps);
}

void kvc_mamba2_step(fwd *f)
{
    kvc_compute *c = f->c;
    const kvc_layer *L = &c->m->layers[f->layer];
    const int64_t n = f->n, E = c->m->hp.n_embd;
    const mamba_dims d = dims_of(&c->m->hp);

    kvc_threadpool_run(c->tp, n, kvc_fwd_attn_norm_task, f);
    kvc_fwd_matmul_n(c, c->h, n, 1, (const kvc_weight *[]){ &L->ssm_in }, (float *[]){ c->ssm.proj },
                     (const int64_t[]){ d.in });
    if (!group_by_seq(f)) {
        atomic_store(&f->failed, true);
        return;
    }
    kvc_threadpool_run(c->tp, c->ssm.n_seq * ((d.conv + SSM_CH_TASK - 1) / SSM_CH_TASK), mamba_conv_task, f);
    kvc_threadpool_run(c->tp, c->ssm.n_seq * d.nh, mamba_scan_task, f);
    kvc_threadpool_run(c->tp, n, mamba_norm_task, f);
    kvc_fwd_matmul_n(c, c->ssm.y, n, 1, (const kvc_weight *[]){ &L->ssm_out }, (float *[]){ c->h },
                     (const int64_t[]){ E });
}
