/* forward.h - what the forward pass's files share (forward.c: the batch, the
 * attention and dense steps; forward_moe.c: the mixture-of-experts step). Not
 * part of the model's interface. */
#ifndef KVC_FORWARD_H
#define KVC_FORWARD_H

#include <stdatomic.h>

#include "model.h"

/* The mixture-of-experts step's buffers, sized at kvc_compute_new for
 * max_batch tokens (all NULL for a model without experts). A "pair" is one
 * (token, selected expert); pairs are numbered expert by expert, tokens in
 * batch order within an expert. */
typedef struct kvc_moe_buf {
    float   *logits;      /* [n][n_expert] router logits */
    int32_t *sel;         /* [n][k] selected experts, in selection order */
    float   *w;           /* [n][k] their weights */
    int32_t *pair_of;     /* [n][k] the pair of token t's j-th expert */
    int32_t *pair_tok;    /* [n * k] the token of each pair */
    int32_t *first;       /* [n_expert + 1] each expert's first pair */
    int32_t *fill;        /* [n_expert] pairs numbered so far (group_pairs) */
    float   *x;           /* [n * k][n_embd] each pair's input row (float path only) */
    float   *gu;          /* [n * k][2 * n_ff_exp] gate, up; then act(gate, up) in the gate half */
    float   *y;           /* [n * k][n_embd] each pair's expert output */
    float   *sh_g;        /* [n][n_ff_shexp] the shared expert's gate, then act(gate, up) */
    float   *sh_u;        /* [n][n_ff_shexp] the shared expert's up */
    float   *sh_y;        /* [n][n_embd] the shared expert's output */
    float   *sh_gate;     /* [n] the shared expert's sigmoid gate input */
    float   *dense;       /* [n][n_embd] the dense FFN's output beside the experts (KVC_FFN_MOE_DENSE) */
    float   *rin;         /* [n][n_embd] the router's input (KVC_FFN_MOE_DENSE) */
    void    *act;         /* prepared activations (kernels.h): [n] token rows of the
                             input, then [n * k] pair rows of the down input */
    struct moe_task *tasks; /* [max_tasks] (expert, part, rows) of a matmul phase */
    int64_t  max_tasks;
} kvc_moe_buf;

/* The Gated DeltaNet step's buffers (forward_gdn.c), sized at
 * kvc_compute_new for max_batch tokens (all NULL for a model without GDN
 * layers). */
typedef struct kvc_gdn_buf {
    float   *qkv;         /* [n][conv_dim] the projection, then (in place) silu(conv(.)), q and k
                           * l2-normalised */
    float   *z;           /* [n][n_v * d_v] the output gate, then silu(z) * the normalised o: out_proj's input */
    float   *beta;        /* [n][n_v] beta's logits (beta = sigmoid of it) */
    float   *g;           /* [n][n_v] alpha (the decay: exp(softplus(alpha + dt) * a)) */
    float   *o;           /* [n][n_v * d_v] the recurrence's output, then rms-normalised */
    float   *qg;          /* [n][2 * n_head * hd] gated attention: per head query, then gate */
    float   *qkvz;        /* [n][conv_dim + n_v * d_v] qwen3next's ssm_in projection (grouped per K
                           * head), split into qkv and z; NULL for the other rows */
    float   *ba;          /* [n][2 * n_v] qwen3next's ssm_ba projection, split into beta and g */
    int32_t *order;       /* [n] batch indices grouped by sequence, positions increasing */
    int32_t *run;         /* [n + 1] the groups' starts in order; n_runs groups */
    int32_t  n_runs;
    float  **state;       /* [n] each group's state of the current layer */
    float  **conv_t;      /* [n_layer] a GDN layer's conv taps transposed [K][conv_dim] (ssm_scan.h),
                           * NULL for the others */
} kvc_gdn_buf;

/* The recurrent steps' buffers (forward_ssm.c), sized at kvc_compute_new for
 * max_batch tokens (all NULL for a model without recurrent layers). A batch's
 * tokens are taken sequence by sequence: order[] lists the batch indices of
 * each sequence's tokens in position order, sequence s at [run[s], run[s+1]). */
typedef struct kvc_ssm_buf {
    float   *proj;        /* [n][3 n_embd | 2 d_inner + 2GN + n_head] the input projection */
    float   *xbc;         /* [n][d_inner + 2GN] Mamba-2: x, B, C after conv and silu */
    float   *y;           /* [n][n_embd | d_inner] the mixer's output before out_proj */
    int32_t *order;       /* [n] */
    int32_t *run;         /* [n + 1] */
    float  **state;       /* [n] each sequence's state of the current layer */
    int32_t  n_seq;       /* sequences in the batch */
    float  **conv_t;      /* [n_layer] a recurrent layer's conv taps transposed [K][channels]
                           * (ssm_scan.h), NULL for the others */
} kvc_ssm_buf;

/* The per-layer embeddings' buffers (forward_ple.c), sized at
 * kvc_compute_new for max_batch tokens (all NULL without them). */
typedef struct kvc_ple_buf {
    float   *inp;         /* [n][n_layer][P] each token's input of each layer */
    float   *row;         /* [n][n_layer * P] the token's per_layer_token_embd row */
    float   *g;           /* [n][P] gelu(ple_gate x) * the layer's input */
} kvc_ple_buf;

/* One RoPE rotation, shared by the layers whose kvc_layer.rope names it: pair
 * i < n_rot / 2 turns by pos * freq[i] (base^(-2i/n_rot), with linear or YaRN
 * scaling folded in: the angle stays linear in the position, so a context
 * shift is a rotation by the shift), and cos, sin are scaled by mscale (YaRN's
 * magnitude, 1 otherwise). */
typedef struct kvc_rope {
    double  *freq;        /* [n_rot / 2] */
    double   mscale;
    int32_t  n_rot;       /* the rotated dims of a head (hparams' n_rot, or n_rot_swa) */
} kvc_rope;

struct kvc_compute {
    const kvc_model *m;
    kvc_threadpool  *tp;
    int32_t  max_batch;
    int32_t  max_ctx;
    /* activations, max_batch rows each */
    float   *x;           /* [n][n_embd] residual stream */
    float   *h;           /* [n][n_embd] normalised input of a sublayer */
    float   *q;           /* [n][n_head * hd] */
    float   *k;           /* [n][n_head_kv * hd] */
    float   *v;           /* [n][n_head_kv * hd] */
    float   *att;         /* [n][n_head * hd] attention output */
    float   *gate;        /* [n][the layer's n_ff] (sized by the widest) */
    float   *up;          /* [n][the layer's n_ff] */
    float   *rope_cos;    /* [n][n_rope][rope_half] (rotation r's first rope[r].n_rot / 2) */
    float   *rope_sin;    /* [n][n_rope][rope_half] */
    int32_t  rope_half;   /* the largest n_rot / 2 of the rotations */
    int32_t  n_rope;      /* rotations in use: 1, or 2 when sliding layers rotate their own way */
    kvc_rope rope[2];     /* [0]: the global layers', [1]: the sliding layers' (kvc_layer.rope) */
    int32_t *tiles;       /* [max_batch + 1] first batch index of each attention tile, then n */
    int32_t  tile_tok;    /* tokens per attention tile at most */
    /* per-thread scratch */
    float  **mm_scratch;  /* [thread][kvc_matmul_scratch_floats(max n_in)] */
    void    *mm_act;      /* [kvc_matmul_act_bytes(max n_in, max_batch)] quantized activations, or NULL */
    size_t   mm_act_bytes;
    float  **scores;      /* [thread][kvc_attn_scratch_floats(tile_tok * group)] attention state */
    float  **krow;        /* [thread][2 * max_ctx * hd] K, V of a Q8_0 pool as f32, made lazily */
    const void **blk;     /* [thread][2 * max_blocks] block pointers for attention */
    kvc_moe_buf moe;      /* the mixture-of-experts step's buffers (forward_moe.c) */
    kvc_gdn_buf gdn;      /* the Gated DeltaNet step's buffers (forward_gdn.c) */
    kvc_ssm_buf ssm;      /* the recurrent steps' buffers (forward_ssm.c) */
    kvc_ple_buf ple;      /* the per-layer embeddings' buffers (forward_ple.c) */
};

typedef struct fwd {
    kvc_compute          *c;
    kvc_kv_pool          *pool;
    const kvc_batch_item *items;
    int32_t               n;
    int32_t               layer;
    uint32_t              kv_type;
    int32_t               B;           /* tokens per block */
    int32_t               n_tiles;     /* attention tiles: c->tiles[0 .. n_tiles] */
    size_t                row_bytes;   /* one head row in the pool */
    atomic_bool           failed;      /* out of memory inside a task */
} fwd;

/* y_i = W_i x for n <= 3 weights of one n_in, split by rows over the
 * threads (forward.c). */
/* Rows per task for a decode-kernel matmul (row group 16) over rows of
 * row_bytes each: about KVC_DECODE_TASK_BYTES of weights, a multiple of 16,
 * at most `per` (the caller's split by threads). Any split gives the same
 * values (kernels.h). */
#define KVC_DECODE_TASK_BYTES (1u << 20)
#define KVC_DECODE_TOK        4     /* up to this many tokens a matmul is decode */
int64_t kvc_fwd_decode_rows(size_t row_bytes, int64_t per);
void kvc_fwd_matmul_n(kvc_compute *c, const float *x, int64_t n_tok, int n, const kvc_weight *const w[],
                      float *const y[], const int64_t ldy[]);
/* g = act(g, u) over n elements, in place: the activation of a gated FFN,
 * dense or expert (arch.h; GeGLU with the exact tanh GELU). */
void kvc_fwd_ffn_act(kvc_ffn_act act, float *g, const float *u, int64_t n);
/* Row i: x += the attention's output, then the FFN's norm into h. */
void kvc_fwd_ffn_norm_task(void *ctx, int64_t i, int thread);
/* Row i: x += the previous layer's FFN output (none before layer 0), then the
 * mixer's norm into h. */
void kvc_fwd_attn_norm_task(void *ctx, int64_t i, int thread);
/* The dense gated FFN of layer f->layer on the n_ff-wide rows of c->h:
 * down(act(gate h) * up h) into out ([n][n_embd]; may be c->h). */
void kvc_fwd_ffn_dense(fwd *f, float *out);
/* out = x / sqrt(mean(x^2) + eps) * w over n elements (out may be x; w NULL:
 * no weight). */
void kvc_fwd_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);

/* The recurrent mixers (forward_ssm.c): lfm2's gated short convolution and
 * Mamba-2, each reading and updating its sequences' states (kv.h) token by
 * token in position order; and their buffers. */
void kvc_shortconv_step(fwd *f);
void kvc_mamba2_step(fwd *f);
int  kvc_ssm_alloc(kvc_compute *c);      /* KVC_OK, or KVC_ERR_NOMEM */
void kvc_ssm_free(kvc_compute *c);
/* Per layer of the model whose attn is `kind` (a recurrent kind), its conv
 * taps transposed for kvc_conv_step (ssm_scan.h); NULL for the other layers.
 * NULL when out of memory. Freed by kvc_fwd_conv_taps_free (NULL ok). */
float **kvc_fwd_conv_taps(const kvc_model *m, kvc_attn_kind kind);
void    kvc_fwd_conv_taps_free(float **t, int32_t n_layer);

/* The Gated DeltaNet step (forward_gdn.c): the layer's token mixer, its
 * output left in h; its buffers; and the arch row's layer setup (arch.h). */
void kvc_gdn_step(fwd *f);
int  kvc_gdn_alloc(kvc_compute *c);      /* KVC_OK, or KVC_ERR_NOMEM */
void kvc_gdn_free(kvc_compute *c);
int  kvc_gdn_layers(kvc_model *m, kvc_err *err);
/* Gated attention (L->attn_gated): the q|gate projection with K and V, q
 * split out into c->q; after the attention, att *= sigmoid(gate). */
void kvc_gated_qkv(fwd *f);
void kvc_gated_out(fwd *f);

/* Gemma 4's per-layer embeddings (forward_ple.c): each token's input of
 * every layer, computed once after the embedding (c->x); and the step after a
 * layer's FFN, which adds the FFN's output to x and leaves the per-layer
 * embedding's output in h (added by the next residual, after ple_post_norm). */
void kvc_ple_inputs(fwd *f);
void kvc_ple_step(fwd *f);
int  kvc_ple_alloc(kvc_compute *c);      /* KVC_OK, or KVC_ERR_NOMEM */
void kvc_ple_free(kvc_compute *c);
/* Row i: x += h after the FFN's post-norm (forward.c's residual add). */
void kvc_fwd_ffn_residual_task(void *ctx, int64_t i, int thread);

/* The mixture-of-experts FFN steps (forward_moe.c): experts (and a shared
 * expert), or experts beside a dense FFN (Gemma 4); and their buffers. */
void kvc_moe_step(fwd *f);
void kvc_moe_dense_step(fwd *f);
int  kvc_moe_alloc(kvc_compute *c);      /* KVC_OK, or KVC_ERR_NOMEM */
void kvc_moe_free(kvc_compute *c);

#endif
