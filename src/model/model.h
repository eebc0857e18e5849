/* model.h - hyperparameters, tensor binding and the forward pass of the
 * architectures of arch.h's table.
 *
 * A kvc_model is immutable after loading and may be shared by threads. The
 * mutable side of a forward pass (activations, per-thread scratch, the thread
 * pool) lives in a kvc_compute, owned by one thread at a time. */
#ifndef KVC_MODEL_H
#define KVC_MODEL_H

#include "arch.h"
#include "common.h"
#include "gguf.h"
#include "kernels.h"
#include "kv.h"
#include "threadpool.h"
#include "tokenizer.h"

typedef struct kvc_hparams {
    const kvc_arch *arch;    /* the architecture's row (arch.h) */
    char     arch_name[16];
    int32_t  n_vocab;
    int32_t  n_ctx_train;
    int32_t  n_embd;
    int32_t  n_layer;
    int32_t  n_head;         /* the largest of any layer (buffers are sized by these) */
    int32_t  n_head_kv;
    int32_t  head_dim;       /* attention.key_length, else n_embd / n_head */
    int32_t  value_dim;      /* attention.value_length, else head_dim (must equal it) */
    int32_t  n_ff;           /* dense FFN width, the widest layer's (0 when no layer is dense) */
    float    rms_eps;
    float    rope_theta;     /* rope.freq_base, default 10000 */
    bool     rope_neox;      /* rotate (i, i + hd/2) rather than (2i, 2i+1) */
    int32_t  n_rot;          /* rope.dimension_count: the rotated dims of a head (0: head_dim) */
    int32_t  rope_scaling;   /* kvc_rope_scaling (rope.scaling.type) */
    float    rope_factor;    /* rope.scaling.factor (<= 1: no scaling) */
    int32_t  rope_orig_ctx;  /* rope.scaling.original_context_length (YaRN; 0: n_ctx_train) */
    int32_t  n_swa;          /* attention.sliding_window (0: no sliding layers) */
    int32_t  swa_period;     /* attention.sliding_window_pattern (arch.h) */
    float    rope_theta_swa; /* rope.freq_base_swa (0: the row's default) */
    bool     swa_layers;     /* sliding_window_pattern is per layer (layer_slides reads it) */
    int32_t  head_dim_swa;   /* attention.key_length_swa: the sliding layers' head size (0: head_dim) */
    int32_t  value_dim_swa;  /* attention.value_length_swa (must equal head_dim_swa) */
    int32_t  n_rot_swa;      /* rope.dimension_count_swa: the sliding layers' rotated dims (0: n_rot) */
    int32_t  n_embd_per_layer; /* embedding_length_per_layer_input: per-layer embeddings' width
                              * (Gemma 4 E models; 0: none) */
    int32_t  n_kv_shared;    /* attention.shared_kv_layers: the last this many layers reuse the K/V
                              * of the last full or sliding layer before them (Gemma 4 E models) */
    float    emb_scale;      /* embeddings x this (0: none) */
    float    logit_softcap;  /* final_logit_softcapping: logits = c tanh(logits / c) (0: none) */
    bool     tied;           /* token_embd is the output projection */
    /* mixture of experts (n_expert == 0: none) */
    int32_t  n_expert;       /* expert_count */
    int32_t  n_expert_used;  /* expert_used_count: k of top-k */
    int32_t  n_ff_exp;       /* expert_feed_forward_length: one expert's width */
    int32_t  n_ff_shexp;     /* expert_shared_feed_forward_length (0: n_ff_exp) */
    int32_t  moe_gating;     /* kvc_moe_gating (expert_gating_func) */
    bool     moe_norm_w;     /* expert_weights_norm: selected weights sum to 1 */
    float    moe_w_scale;    /* expert_weights_scale (0 or 1: none) */
    kvc_ffn_act ffn_act;     /* the FFNs' activation */
    int32_t  n_layer_dense_lead; /* leading_dense_block_count: the first this many layers' FFNs
                              * are dense, the rest experts (lfm2moe) */
    int32_t  moe_latent;     /* moe_latent_size: experts in a smaller latent space (refused) */
    int32_t  n_layer_nextn;  /* nextn_predict_layers: MTP blocks after the main layers (not run;
                              * n_layer excludes them) */
    /* recurrent layers (arch.h's kvc_arch.recurrent or .layers; 0 when the model has none) */
    int32_t  shortconv_l;    /* shortconv.l_cache: lfm2's kernel width L (state: L - 1 inputs) */
    int32_t  ssm_d_conv;     /* ssm.conv_kernel: the causal convolution's width K */
    int32_t  ssm_d_inner;    /* ssm.inner_size (GDN: n_v * d_state) */
    int32_t  ssm_d_state;    /* ssm.state_size: Mamba-2's N (GDN: the head size d_k = d_v) */
    int32_t  ssm_n_head;     /* ssm.time_step_rank: Mamba heads, d_inner / n_head wide each (GDN:
                              * the V heads n_v) */
    int32_t  ssm_n_group;    /* ssm.group_count: Mamba-2's G groups of B, C (and of the gated
                              * norm); GDN: the Q/K heads n_k */
    int32_t  full_attn_interval; /* GDN: layer il is attention iff (il + 1) % this == 0 */
    /* Granite's scalars (0: none) */
    float    residual_scale; /* residual_scale: each sublayer's output x this before its add */
    float    attn_scale;     /* attention.scale: the scores' factor instead of 1/sqrt(head_dim) */
    float    logit_scale;    /* logit_scale: logits / this */
    bool     rope_finetuned; /* rope.scaling.finetuned (default true); false with
                              * kvc_arch.rope_finetuned_switch: no RoPE */
} kvc_hparams;

/* A stack of per-expert matrices stored as one 3-D tensor (GGUF ne = [n_in,
 * n_out, n]): expert e's matrix is w with data advanced by e * stride. */
typedef struct kvc_experts {
    kvc_weight w;                    /* expert 0 */
    int32_t    n;                    /* experts; 0 = the tensor is absent */
    size_t     stride;               /* bytes from one expert's matrix to the next */
} kvc_experts;

/* Expert e of a stack, as a matrix. */
static inline kvc_weight kvc_expert(const kvc_experts *x, int32_t e)
{
    kvc_weight w = x->w;
    w.data = (const uint8_t *)x->w.data + (size_t)e * x->stride;
    return w;
}

typedef struct kvc_layer {
    /* what the layer is (arch.h) and its own attention shape */
    kvc_attn_kind attn;
    kvc_ffn_kind  ffn;
    int32_t      n_head;
    int32_t      n_head_kv;
    int32_t      head_dim;
    int32_t      n_rot;              /* its rotated dims (its rotation's: compute's kvc_rope) */
    float        rope_theta;
    int32_t      window;             /* sliding window in positions; 0 = full */
    int32_t      rope;               /* which of the compute's rotations (0: global, 1: sliding layers) */
    float        attn_scale;         /* the scores' factor (1/sqrt(head_dim), or the row's rule) */
    bool         no_rope;            /* positions enter only through the causal mask (NoPE) */
    int64_t      state_floats;       /* recurrent kinds: floats of the layer's per-sequence state
                                      * (conv state, then the recurrent state); 0 for attention */

    const float *attn_norm;          /* [n_embd] */
    kvc_weight   wq;                 /* n_embd -> n_head * hd */
    kvc_weight   wk;                 /* n_embd -> n_head_kv * hd */
    kvc_weight   wv;                 /* n_embd -> n_head_kv * hd */
    kvc_weight   wo;                 /* n_head * hd -> n_embd */
    const float *bq, *bk, *bv;       /* qwen2 biases, else NULL */
    const float *q_norm, *k_norm;    /* qwen3 [hd], else NULL */
    const float *bo;                 /* attn_output.bias [n_embd] (gpt-oss), else NULL */
    const float *sinks;              /* attn_sinks [n_head]: per-head logits in the softmax's
                                      * denominator (gpt-oss), else NULL */
    const float *post_attn_norm;     /* [n_embd] rms-norm of the attention's output before the
                                      * residual add (Gemma's sandwich norms), else NULL */
    const float *post_ffn_norm;      /* [n_embd] the same for the FFN's output, else NULL */
    const float *ffn_norm;           /* [n_embd] */
    const float *out_scale;          /* layer_output_scale [1]: the residual stream x this after the
                                      * layer (Gemma 4), else NULL */
    bool         v_norm;             /* V rms-normed per head, no weight; V = K (before K's norm)
                                      * when wv is absent (Gemma 4) */
    int32_t      kv_layer;           /* the layer whose K/V it attends to: itself, or for a KV-shared
                                      * layer (Gemma 4) an earlier one of its kind (it stores none) */
    /* per-layer embeddings (Gemma 4 E models; empty: none): after the FFN's
     * residual add, x += rms(ple_out(gelu(ple_gate x) * the layer's input), ple_post_norm) */
    kvc_weight   ple_gate;           /* blk.N.inp_gate: n_embd -> P */
    kvc_weight   ple_out;            /* blk.N.proj: P -> n_embd */
    const float *ple_post_norm;      /* blk.N.post_norm [n_embd] */
    /* dense FFN */
    int32_t      n_ff;               /* its width: feed_forward_length, or that array's entry for
                                      * the layer (Gemma 4 E2B's double-wide MLPs; pruned models);
                                      * hp.n_ff is the widest, buffers are sized by it */
    kvc_weight   w_gate;             /* n_embd -> n_ff */
    kvc_weight   w_up;               /* n_embd -> n_ff */
    kvc_weight   w_down;             /* n_ff -> n_embd */
    /* mixture of experts */
    kvc_weight   router;             /* ffn_gate_inp: n_embd -> n_expert */
    const float *router_b;           /* [n_expert] or NULL */
    const float *sel_bias;           /* exp_probs_b: [n_expert] added for selection only, or NULL */
    kvc_experts  gate_exps;          /* n x (n_embd -> n_ff_exp), or empty when fused */
    kvc_experts  up_exps;            /* n x (n_embd -> n_ff_exp), or empty when fused */
    kvc_experts  gate_up_exps;       /* n x (n_embd -> 2 n_ff_exp): gate rows, then up rows */
    kvc_experts  down_exps;          /* n x (n_ff_exp -> n_embd) */
    const float *gate_exps_b;        /* [n][n_ff_exp] or NULL */
    const float *up_exps_b;          /* [n][n_ff_exp] or NULL */
    const float *down_exps_b;        /* [n][n_embd] or NULL */
    const float *down_exps_s;        /* [n] each expert's output scale, or NULL */
    /* experts beside a dense FFN (KVC_FFN_MOE_DENSE, Gemma 4) */
    const float *router_in_scale;    /* ffn_gate_inp.scale [n_embd]: router input rms(x)/sqrt(n_embd) x this */
    const float *pre_ffn_norm2;      /* [n_embd] the experts' input norm (the dense FFN's: ffn_norm) */
    const float *post_ffn_norm1;     /* [n_embd] the dense FFN's output norm */
    const float *post_ffn_norm2;     /* [n_embd] the experts' output norm */
    kvc_weight   shexp_gate_inp;     /* n_embd -> 1: sigmoid gate of the shared expert, or empty */
    kvc_weight   shexp_gate;         /* n_embd -> n_ff_shexp, or empty (no shared expert) */
    kvc_weight   shexp_up;           /* n_embd -> n_ff_shexp */
    kvc_weight   shexp_down;         /* n_ff_shexp -> n_embd */
    /* gated attention (qwen35): wq gives per head hd query rows then hd gate
     * rows (n_embd -> 2 n_head hd); the output is a * sigmoid(gate) */
    bool         attn_gated;
    /* Gated DeltaNet (forward_gdn.c; conv_dim = 2 n_k d_k + n_v d_v) */
    kvc_weight   ssm_qkv;            /* attn_qkv: n_embd -> conv_dim (q | k | v) */
    kvc_weight   ssm_z;              /* attn_gate: n_embd -> n_v d_v (the output gate z) */
    kvc_weight   ssm_beta;           /* n_embd -> n_v */
    kvc_weight   ssm_alpha;          /* n_embd -> n_v */
    kvc_weight   ssm_ba;             /* qwen3next's fused beta, alpha: n_embd -> 2 n_v, per K head
                                      * its n_v / n_k beta rows then as many alpha rows (the other
                                      * GDN fields are then qwen3next's: V heads grouped by K head,
                                      * kvc_arch.gdn_v_grouped) */
    /* short convolution (lfm2) */
    const float *conv;               /* [n_embd][L] causal kernel per channel */
    kvc_weight   conv_in;            /* n_embd -> 3 n_embd: b, c, x */
    kvc_weight   conv_out;           /* n_embd -> n_embd */
    /* Mamba-2 (granitehybrid); the fields below are shared with GDN where named */
    kvc_weight   ssm_in;             /* n_embd -> z [d_inner], xBC [d_inner + 2GN], dt [n_head]
                                      * (GDN, qwen3next: per K head q [d_k], k [d_k], its V heads'
                                      * v [n_v / n_k d_v] and z [same]; empty when ssm_qkv, ssm_z) */
    const float *ssm_conv;           /* [conv_dim][K] causal kernel per channel (Mamba-2: conv_dim =
                                      * d_inner + 2GN; GDN: 2 n_k d_k + n_v d_v) */
    const float *ssm_conv_b;         /* [d_inner + 2GN] or NULL */
    const float *ssm_dt_b;           /* [n_head] added to dt before the softplus (GDN: to alpha) */
    const float *ssm_a;              /* [n_head] = -exp(A_log) (GDN: [n_v]) */
    const float *ssm_d;              /* [n_head] skip */
    const float *ssm_norm;           /* [G][d_inner / G] gated norm's weights (GDN: [d_v], no +1) */
    kvc_weight   ssm_out;            /* d_inner -> n_embd (GDN: n_v d_v -> n_embd) */
} kvc_layer;

typedef struct kvc_model {
    gguf_file     *gguf;             /* the mapping every weight points into */
    kvc_hparams    hp;
    kvc_tokenizer *tok;
    char          *chat_template;    /* tokenizer.chat_template, or NULL */
    char          *chat_template_tool_use; /* tokenizer.chat_template.tool_use, or NULL */
    char          *name;             /* general.name, or the file name */
    uint64_t       n_params;
    uint64_t       weight_bytes;
    kvc_weight     tok_embd;         /* n_embd x n_vocab rows */
    const float   *output_norm;      /* [n_embd] */
    kvc_weight     output;           /* n_embd -> n_vocab (tok_embd when tied) */
    kvc_layer     *layers;           /* n_layer */
    kvc_weight     ple_embd;         /* per_layer_token_embd: P * n_layer x n_vocab rows, or empty */
    kvc_weight     ple_proj;         /* per_layer_model_proj: n_embd -> P * n_layer */
    const float   *ple_proj_norm;    /* per_layer_proj_norm [P] */
    const float   *rope_freqs;       /* rope_freqs.weight: [n_rot / 2] divisors of the pairs'
                                        RoPE frequencies (Llama 3.1+), or NULL */
    float         *owned;            /* 1-D weights converted to f32 */
} kvc_model;

typedef void (*kvc_progress_fn)(float fraction, void *user);

/* Load and validate a model: every tensor the architecture needs must exist
 * with the right shape and a supported type, and every tensor of the file
 * must be one the architecture reads (KVC_ERR_UNSUPPORTED naming the first
 * other one: ignoring it would give wrong logits), but for the
 * multi-token-prediction blocks, skipped; errors name the tensor or key.
 * `progress` (may be NULL) is called with fractions in [0, 1] while the weights
 * are touched (paged in). */
int  kvc_model_load_file(const char *path, kvc_progress_fn progress, void *user,
                         kvc_model **out, kvc_err *err);
void kvc_model_release(kvc_model *m);     /* NULL ok */

/* Whether a layer of the model keeps a recurrent state instead of K/V (Gated
 * DeltaNet, lfm2's short convolution, Mamba-2): such a state cannot be moved
 * to other positions, so a context shift is refused for these models. */
bool kvc_model_recurrent(const kvc_model *m);

/* --------------------------------------------------------------- forward */

typedef struct kvc_compute kvc_compute;

/* max_batch: most tokens per forward call; max_ctx: longest sequence attended
 * over; n_threads >= 1. */
int  kvc_compute_new(const kvc_model *m, int32_t max_batch, int32_t max_ctx, int n_threads,
                     kvc_compute **out, kvc_err *err);
void kvc_compute_free(kvc_compute *c);    /* NULL ok */
int  kvc_compute_n_threads(const kvc_compute *c);

/* One token of a batch. Tokens of one sequence must come in increasing
 * position order, and each position must be either the sequence's current
 * length or a position already reserved right after another batch token of
 * the same sequence (no gaps). */
typedef struct kvc_batch_item {
    int32_t     token;
    int32_t     pos;
    kvc_kv_seq *seq;
    bool        want_logits;
} kvc_batch_item;

/* Run the model over n <= max_batch tokens: their K/V are written into the
 * pool at (seq, pos) (the caller reserved the blocks with kvc_kv_seq_reserve)
 * and each token attends to positions [0, pos] of its sequence. Logits of the
 * tokens with want_logits are written to `logits`, n_vocab floats each, in
 * batch order. seq->n_tokens grows to cover the positions written. The
 * window chunks of those positions are had first (kvc_kv_seq_window: its
 * errors, before anything is written).
 * A token's logits depend only on its sequence's tokens [0, pos], never on the
 * rest of the batch or the thread count. */
int  kvc_compute_forward(kvc_compute *c, kvc_kv_pool *pool, const kvc_batch_item *items,
                         int32_t n, float *logits, kvc_err *err);

/* Rotate the cached keys of positions [p0, p1) of `seq` by `delta` positions
 * (RoPE is a rotation, so a shifted position is a rotation of the cached K). */
int  kvc_compute_shift_k(kvc_compute *c, kvc_kv_pool *pool, kvc_kv_seq *seq,
                         int64_t p0, int64_t p1, int64_t delta, kvc_err *err);

/* Copy the K/V of positions [a, a+k) of the block table src_blocks to positions
 * [d, d+k) of the block table dst_blocks (position p in table[p / B], row
 * p % B), rotating the keys by d - a positions (a context shift). The
 * destination blocks must be owned by the caller alone (reference count 1)
 * (they may be the source blocks: with src_blocks == dst_blocks and d < a the
 * move is done in place, each row read before it is overwritten). */
int  kvc_compute_move_kv(kvc_compute *c, kvc_kv_pool *pool, const int32_t *src_blocks, int64_t a,
                         const int32_t *dst_blocks, int64_t d, int64_t k, kvc_err *err);

#endif
