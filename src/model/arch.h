/* arch.h - one row per architecture: the metadata keys it reads, the tensors
 * it binds (with their shapes and which are optional), and the kind of each
 * layer's attention and feed-forward. The loader (model.c), its weight
 * accounting and the generator (model_gen.c) read the same row; the forward
 * pass (forward.c) runs each layer as the steps its kinds name, as llama.cpp's
 * per-architecture graph builders run its shared pieces (build_norm,
 * build_attn, build_moe_ffn).
 *
 * Adding an architecture is a row here plus, at most, a new layer step. */
#ifndef KVC_ARCH_H
#define KVC_ARCH_H

#include "common.h"

/* What a layer's attention (its token mixer) is. The recurrent kinds keep a
 * fixed-size state per sequence instead of K/V (kvc_layer.state_floats,
 * kv.h's recurrent layers). */
typedef enum kvc_attn_kind {
    KVC_ATTN_FULL   = 0,     /* causal attention over every earlier position */
    KVC_ATTN_WINDOW = 1,     /* sliding window: position p sees p - w + 1 .. p (kvc_layer.window) */
    KVC_ATTN_GDN    = 2,     /* Gated DeltaNet (qwen35, qwen35moe, qwen3next) */
    KVC_ATTN_SHORTCONV = 3,  /* gated short convolution (lfm2) */
    KVC_ATTN_MAMBA2 = 4,     /* Mamba-2 selective state space (granitehybrid, nemotron_h) */
    KVC_ATTN_NONE   = 5,     /* no token mixer: the layer is its FFN alone (nemotron_h's MLP and
                              * MoE layers) */
} kvc_attn_kind;

/* How RoPE's angles are scaled (rope.scaling.type). */
typedef enum kvc_rope_scaling {
    KVC_ROPE_NONE   = 0,
    KVC_ROPE_LINEAR = 1,     /* angles x 1/factor */
    KVC_ROPE_YARN   = 2,     /* YaRN: per-pair mix of scaled and unscaled angles, magnitude x (1 + 0.1 ln factor) */
} kvc_rope_scaling;

/* What a layer's feed-forward is. */
typedef enum kvc_ffn_kind {
    KVC_FFN_DENSE = 0,       /* down(act(gate x) * up x) */
    KVC_FFN_MOE   = 1,       /* a router picks n_expert_used of n_expert such FFNs */
    KVC_FFN_MOE_DENSE = 2,   /* experts beside a dense FFN, each with its own norms, summed
                              * (Gemma 4's MoE layers: forward_moe.c) */
    KVC_FFN_NONE  = 3,       /* no FFN: the layer is its token mixer alone (nemotron_h's Mamba-2
                              * and attention layers) */
} kvc_ffn_kind;

/* How the router turns its logits into the selected experts' weights
 * (llama.cpp's llama_expert_gating_func_type, same numbers in GGUF). */
typedef enum kvc_moe_gating {
    KVC_GATING_SOFTMAX        = 1,   /* softmax over all experts, then top-k */
    KVC_GATING_SIGMOID        = 2,   /* sigmoid per expert, then top-k (+ selection bias) */
    KVC_GATING_SOFTMAX_WEIGHT = 3,   /* top-k of the raw logits, softmax over the k */
} kvc_moe_gating;

/* The activation of a gated FFN (dense or expert). */
typedef enum kvc_ffn_act {
    KVC_ACT_SILU = 0,        /* SwiGLU: silu(g) * u */
    KVC_ACT_GELU = 1,        /* GeGLU: gelu_tanh(g) * u */
    KVC_ACT_RELU2 = 2,       /* relu(u)^2, not gated (no gate tensor) */
    KVC_ACT_SWIGLU_OAI = 3,  /* gpt-oss: min(g,7) * sigmoid(1.702 min(g,7)) * (clamp(u,-7,7) + 1) */
} kvc_ffn_act;

/* A tensor's dimension, named by the hyperparameter it equals. */
typedef enum kvc_dim {
    KVC_D1 = 0,              /* 1 (the dimension is absent) */
    KVC_D_EMBD,              /* n_embd */
    KVC_D_VOCAB,             /* n_vocab (taken from token_embd.weight) */
    KVC_D_Q,                 /* n_head * head_dim of the layer */
    KVC_D_KV,                /* n_head_kv * head_dim of the layer */
    KVC_D_HEAD,              /* head_dim */
    KVC_D_HEADS,             /* n_head of the layer (one value per query head: attention sinks) */
    KVC_D_FF,                /* n_ff (dense FFN) */
    KVC_D_EXP,               /* n_expert */
    KVC_D_FF_EXP,            /* n_ff_exp (one expert's FFN width) */
    KVC_D_FF_EXP2,           /* 2 * n_ff_exp (fused gate and up) */
    KVC_D_FF_SHEXP,          /* n_ff_shexp (the shared expert's width) */
    KVC_D_Q2,                /* 2 * n_head * head_dim (gated attention: query and gate rows) */
    KVC_D_PLE,               /* n_embd_per_layer (Gemma 4's per-layer embeddings) */
    KVC_D_PLE_ALL,           /* n_embd_per_layer * n_layer */
    /* recurrent layers (kvc_hparams' shortconv_l and ssm_*) */
    KVC_D_EMBD3,             /* 3 * n_embd (lfm2's in_proj: b, c, x) */
    KVC_D_CONV_L,            /* shortconv.l_cache (lfm2's kernel width) */
    KVC_D_SSM_CONV_K,        /* ssm.conv_kernel: the causal convolution's width K */
    KVC_D_SSM_CONV_DIM,      /* the convolved channels: d_inner + 2 * n_group * d_state (GDN: q, k,
                              * v; Mamba-2: x, B, C) */
    KVC_D_SSM_IN,            /* 2 * d_inner + 2 * n_group * d_state + n_ssm_head (Mamba-2: z, xBC, dt) */
    KVC_D_SSM_INNER,         /* ssm.inner_size: d_inner (GDN: n_v heads x d_state) */
    KVC_D_SSM_HEADS,         /* ssm.time_step_rank: the recurrent heads (GDN: the V heads n_v) */
    KVC_D_SSM_STATE,         /* ssm.state_size: d_state (GDN: the head size d_k = d_v) */
    KVC_D_SSM_GROUPS,        /* ssm.group_count */
    KVC_D_SSM_GROUP_W,       /* d_inner / n_group (one group of Mamba-2's gated norm) */
    KVC_D_SSM_QKVZ,          /* 2 n_k d_k + 2 n_v d_v (qwen3next's fused ssm_in: q, k, v, z) */
    KVC_D_SSM_HEADS2,        /* 2 n_v (qwen3next's fused ssm_ba: beta, alpha) */
} kvc_dim;

/* Which layers carry a tensor. */
typedef enum kvc_tensor_when {
    KVC_ON_ALL = 0,
    KVC_ON_DENSE,            /* layers whose FFN is dense */
    KVC_ON_MOE,              /* layers whose FFN has experts (KVC_FFN_MOE, _MOE_DENSE) */
    KVC_ON_ATTN,             /* layers whose token mixer is attention (full or window) */
    KVC_ON_RECR,             /* layers whose token mixer is recurrent (the row's kind: Gated
                              * DeltaNet, short convolution, Mamba-2) */
    KVC_ON_MIXER,            /* layers that have a token mixer (attention or recurrent) */
    KVC_ON_FFN,              /* layers that have an FFN (dense or experts) */
} kvc_tensor_when;

#define KVC_T_OPTIONAL  1u   /* may be absent: its field stays NULL / empty */
#define KVC_T_FUSED_ALT 2u   /* required unless the fused form (ffn_gate_up_exps) is there;
                              * the generator writes this form */

/* One tensor of an architecture. ne[] in GGUF order (ne[0] the row length).
 * The binding follows the shape: ne[1] = KVC_D1 is a vector (converted to
 * f32), ne[2] = KVC_D1 a matrix (kvc_weight), else a stack of per-expert
 * matrices (kvc_experts); a 2-D tensor whose field is a float pointer (expert
 * biases) is taken as one f32 vector of ne[0] * ne[1]. */
typedef struct kvc_arch_tensor {
    const char *name;        /* per layer: after "blk.N."; global: the whole name */
    uint8_t     ne[3];       /* kvc_dim each */
    uint8_t     when;        /* kvc_tensor_when */
    uint8_t     flags;       /* KVC_T_* */
    uint8_t     is_float;    /* the field is a const float * (vectors, expert biases) */
    uint16_t    field;       /* offsetof(kvc_layer or kvc_model, its field) */
} kvc_arch_tensor;

/* One metadata key, read as "{arch}.{suffix}" into a kvc_hparams field. */
typedef enum kvc_key_type {
    KVC_KEY_U32, KVC_KEY_F32, KVC_KEY_BOOL,
    KVC_KEY_U32_LAYERS,      /* a U32, or an array of one per layer: the field gets the largest,
                              * model.c's layer_hparams each layer's (head_count_kv of the hybrids) */
    KVC_KEY_ROPE_SCALING,    /* a string: "none", "linear" or "yarn", into a kvc_rope_scaling */
    KVC_KEY_SWA_PATTERN,     /* sliding_window_pattern: a U32 period, or an array of one bool (or
                              * integer) per layer, true = the layer slides (Gemma 4): the field
                              * (swa_period) then gets KVC_SWA_PER_LAYER, model.c's layer_slides
                              * reads each layer's */
} kvc_key_type;

#define KVC_SWA_PER_LAYER (-1)

typedef struct kvc_arch_key {
    const char *suffix;
    uint8_t     type;        /* kvc_key_type; U32 fields are int32_t */
    bool        required;
    uint16_t    field;       /* offsetof(kvc_hparams, its field) */
    float       def;         /* the value when absent and not required */
} kvc_arch_key;

struct kvc_model;

typedef struct kvc_arch {
    const char *name;                        /* general.architecture */
    const char *unsupported;                 /* why it cannot run yet; NULL when it can */
    bool        rope_neox;                   /* rotate (i, i + hd/2), else (2i, 2i+1) */
    int32_t     swa_period;                  /* default sliding_window_pattern: with a window,
                                              * layer il slides iff il % period < period - 1
                                              * (llama.cpp's set_swa_pattern; 0: all slide) */
    bool        swa_rope_as_global;          /* sliding layers rotate with the global base and
                                              * scaling unless rope.freq_base_swa says otherwise
                                              * (gpt-oss); else base 10000, unscaled (Gemma 3) */
    bool        emb_scale_sqrt;              /* embeddings x sqrt(n_embd) (Gemma) */
    int32_t     attn_scale_embd_layers;      /* at this many layers the query scale is
                                              * 1/sqrt(n_embd / n_head), not 1/sqrt(head_dim)
                                              * (Gemma 3 27B, as llama.cpp chooses it); 0: never */
    kvc_ffn_kind ffn;                        /* every layer's FFN (hybrids: per layer later) */
    kvc_moe_gating gating;                   /* default router (MoE) */
    bool        moe_norm_w;                  /* default: renormalise the selected weights */
    kvc_ffn_act act;                         /* the FFNs' activation */
    /* The row's own per-layer setup, run after the common one (model.c's
     * layer_hparams) and before the tensors are bound: which layers are
     * recurrent, their state sizes, validation of the row's own keys. NULL:
     * none. Returns KVC_OK or an error naming the bad key. */
    int (*layers)(struct kvc_model *m, kvc_err *err);
    bool        ffn_by_experts;              /* every FFN is MoE when expert_count > 0, else
                                              * dense (granitehybrid); overrides .ffn */
    bool        ff_exp_is_ff;                /* an expert's width is feed_forward_length (granite) */
    kvc_attn_kind recurrent;                 /* the mixer of a layer whose head_count_kv is 0
                                              * (lfm2, granitehybrid); 0: none such */
    bool        rope_finetuned_switch;       /* rope.scaling.finetuned false => no RoPE at all
                                              * (Granite 4.0-H is NoPE) */
    bool        nope;                        /* no RoPE at all, whatever the keys (Nemotron-H) */
    bool        one_kind_per_layer;          /* each layer is one sublayer alone (nemotron_h):
                                              * an FFN where its feed_forward_length (per layer)
                                              * is > 0, else attention where it has KV heads,
                                              * else the row's recurrent kind */
    const char *output_norm;                 /* the final norm's tensor; NULL: output_norm.weight
                                              * (lfm2: token_embd_norm.weight) */
    float       attn_scale;                  /* every layer's score factor (Gemma 4: 1, its
                                              * QK-norms set the scale); 0: 1/sqrt(head_dim) */
    bool        v_norm;                      /* V rms-normed per head without a weight; a layer
                                              * without attn_v takes V = K before K's norm
                                              * (Gemma 4) */
    bool        gdn_v_grouped;               /* Gated DeltaNet V head h reads Q/K head h / (n_v / n_k)
                                              * (qwen3next); else h mod n_k (qwen35, whose converter
                                              * reorders the V heads) */
    bool        rope_freqs_global;           /* rope_freqs.weight divides only the global layers'
                                              * frequencies (Gemma 4's proportional RoPE); else
                                              * every layer's (Llama 3.1) */
    const kvc_arch_key    *const *keys;      /* NULL-terminated lists of {0}-terminated keys */
    const kvc_arch_tensor *const *tensors;   /* per layer, NULL-terminated lists */
} kvc_arch;

/* The row of architecture `name`: NULL when kvchat knows nothing of it. A row
 * with `unsupported` set names a known architecture it cannot run yet. */
const kvc_arch *kvc_arch_find(const char *name);

/* The names of the runnable architectures, for messages: "llama, qwen2, ..."
 * into buf (size > 0 bytes, NUL-terminated, cut to fit). */
void kvc_arch_names(char *buf, size_t size);

/* The runnable architectures, i < n; NULL past the end (the generator's list). */
const kvc_arch *kvc_arch_at(int i);

/* The global tensors every architecture has (token_embd, output_norm,
 * output), {0}-terminated; fields are offsets into kvc_model. */
extern const kvc_arch_tensor kvc_arch_globals[];

#endif
