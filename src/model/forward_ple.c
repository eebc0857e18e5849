/* forward_ple.c - Gemma 4's per-layer embeddings (the E models; llama.cpp's
 * gemma4.cpp, build_inp_per_layer and project_per_layer_inputs):
 *
 *   once per token, for every layer l (P = n_embd_per_layer):
 *     proj_l = rms(per_layer_model_proj x0 / sqrt(n_embd) [l], per_layer_proj_norm)
 *     inp_l  = (proj_l + per_layer_token_embd[token][l] * sqrt(P)) / sqrt(2)
 *   after layer l's FFN residual (x the stream, before layer_output_scale):
 *     x += rms(per_layer_proj(gelu(per_layer_inp_gate x) * inp_l), per_layer_post_norm)
 *
 * with x0 the scaled token embedding. Every step is per token or a matmul
 * (kernels.h), so a token's result does not depend on its batch. */
#include "forward.h"
#include "quant.h"

#include <math.h>
#include <stdlib.h>

int kvc_ple_alloc(kvc_compute *c)
{
    const kvc_hparams *hp = &c->m->hp;
    const size_t B = (size_t)c->max_batch, P = (size_t)hp->n_embd_per_layer, all = P * (size_t)hp->n_layer;
    c->ple.inp = kvc_alloc_aligned(B * all * sizeof(float));
    c->ple.row = kvc_alloc_aligned(B * all * sizeof(float));
    c->ple.g = kvc_alloc_aligned(B * P * sizeof(float));
    return c->ple.inp && c->ple.row && c->ple.g ? KVC_OK : KVC_ERR_NOMEM;
}

void kvc_ple_free(kvc_compute *c)
{
    kvc_free_aligned(c->ple.inp);
    kvc_free_aligned(c->ple.row);
    kvc_free_aligned(c->ple.g);
}

/* Token i: its layers' inputs from the projection in ple.inp (in place) and
 * its per_layer_token_embd row, in llama.cpp's order of operations. */
static void inputs_task(void *ctx, int64_t i, int thread)
{
    fwd *f = ctx;
    const kvc_model *m = f->c->m;
    const kvc_hparams *hp = &m->hp;
    const int64_t P = hp->n_embd_per_layer, all = P * hp->n_layer;
    float *inp = f->c->ple.inp + i * all, *row = f->c->ple.row + i * all;
    const kvc_weight *e = &m->ple_embd;
    kvc_dequantize_row(e->type, (const uint8_t *)e->data + (size_t)f->items[i].token * e->row_bytes, row, all);
    const float s_proj = 1.0f / sqrtf((float)hp->n_embd), s_tok = sqrtf((float)P), s_sum = 1.0f / sqrtf(2.0f);
    for (int32_t l = 0; l < hp->n_layer; l++) {
        float *p = inp + l * P;
        for (int64_t d = 0; d < P; d++)
            p[d] *= s_proj;
        kvc_fwd_rmsnorm(p, p, m->ple_proj_norm, P, hp->rms_eps);
        for (int64_t d = 0; d < P; d++)
            p[d] = (p[d] + row[l * P + d] * s_tok) * s_sum;
    }
}

void kvc_ple_inputs(fwd *f)
{
    kvc_compute *c = f->c;
    const kvc_hparams *hp = &c->m->hp;
    if (hp->n_embd_per_layer == 0)
        return;
    const int64_t all = (int64_t)hp->n_embd_per_layer * hp->n_layer;
    kvc_fwd_matmul_n(c, c->x, f->n, 1, (const kvc_weight *[]){ &c->m->ple_proj }, (float *[]){ c->ple.inp },
                     (const int64_t[]){ all });
    kvc_threadpool_run(c->tp, f->n, inputs_task, f);
}

/* Token i: g = gelu(g) * its input of this layer. */
static void gate_task(void *ctx, int64_t i, int thread)
{
    fwd *f = ctx;
    const kvc_hparams *hp = &f->c->m->hp;
    const int64_t P = hp->n_embd_per_layer;
    kvc_fwd_ffn_act(KVC_ACT_GELU, f->c->ple.g + i * P,
                    f->c->ple.inp + (i * hp->n_layer + f->layer) * P, P);
}

void kvc_ple_step(fwd *f)
{
    kvc_compute *c = f->c;
    const kvc_layer *L = &c->m->layers[f->layer];
    const int64_t P = c->m->hp.n_embd_per_layer;
    kvc_threadpool_run(c->tp, f->n, kvc_fwd_ffn_residual_task, f);
    kvc_fwd_matmul_n(c, c->x, f->n, 1, (const kvc_weight *[]){ &L->ple_gate }, (float *[]){ c->ple.g },
                     (const int64_t[]){ P });
    kvc_threadpool_run(c->tp, f->n, gate_task, f);
    kvc_fwd_matmul_n(c, c->ple.g, f->n, 1, (const kvc_weight *[]){ &L->ple_out }, (float *[]){ c->h },
                     (const int64_t[]){ c->m->hp.n_embd });
}
