/* model_gen.c - random-weight GGUF models: weight types, weights, and the
 * file. The parameters and presets are in model_gen_preset.c, the vocabulary
 * in model_gen_vocab.c. */
#include "model_gen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "arch.h"
#include "forward.h"
#include "quant.h"
#include "threadpool.h"

#define GEN_LOGIT_SCALE  5.0f   /* output_norm's mean: the logits' standard deviation */
#define GEN_NORM_NOISE   0.1f   /* norm weights are 1 + this * N(0,1) */
#define GEN_BIAS_STD     0.1f
#define GEN_QUIET_SCALE  0.25f  /* output rows of kvc_gen_token_quiet tokens */
#define GEN_MAX_DIM      (1 << 18)
#define GEN_MAX_VOCAB    (1 << 22)
#define GEN_MAX_LAYERS   1024
#define GEN_PARALLEL_MIN (1 << 18) /* elements; smaller tensors are not worth waking threads */

/* ------------------------------------------------------------ weight types */

/* MIX_MXFP4_MOE: llama.cpp's MXFP4_MOE (gpt-oss's release): experts MXFP4,
 * everything else Q8_0. */
typedef enum gen_mix { MIX_NONE, MIX_K_S, MIX_K_M, MIX_MXFP4_MOE } gen_mix;

typedef struct gen_ftype {
    const char *name;
    uint32_t    file_type;   /* general.file_type (llama_ftype) */
    uint32_t    base;        /* the type of most 2-D weights */
    gen_mix     mix;
} gen_ftype;

static const gen_ftype ftypes[] = {
    { "f32",    0,  KVC_TYPE_F32,  MIX_NONE },
    { "f16",    1,  KVC_TYPE_F16,  MIX_NONE },
    { "bf16",   32, KVC_TYPE_BF16, MIX_NONE },
    { "q4_0",   2,  KVC_TYPE_Q4_0, MIX_NONE },
    { "q4_1",   3,  KVC_TYPE_Q4_1, MIX_NONE },
    { "q8_0",   7,  KVC_TYPE_Q8_0, MIX_NONE },
    { "q5_0",   8,  KVC_TYPE_Q5_0, MIX_NONE },
    { "q5_1",   9,  KVC_TYPE_Q5_1, MIX_NONE },
    { "q4_k",   14, KVC_TYPE_Q4_K, MIX_K_S  },
    { "q4_k_s", 14, KVC_TYPE_Q4_K, MIX_K_S  },
    { "q4_k_m", 15, KVC_TYPE_Q4_K, MIX_K_M  },
    { "q5_k",   16, KVC_TYPE_Q5_K, MIX_K_S  },
    { "q5_k_s", 16, KVC_TYPE_Q5_K, MIX_K_S  },
    { "q5_k_m", 17, KVC_TYPE_Q5_K, MIX_K_M  },
    { "q6_k",   18, KVC_TYPE_Q6_K, MIX_NONE },
    { "mxfp4_moe", 38, KVC_TYPE_Q8_0, MIX_MXFP4_MOE },
};

static const gen_ftype *find_ftype(const char *name)
{
    for (size_t i = 0; name && i < KVC_ARRAY_LEN(ftypes); i++)
        if (strcasecmp(ftypes[i].name, name) == 0)
            return &ftypes[i];
    return NULL;
}

static bool is_float_type(uint32_t t)
{
    return t == KVC_TYPE_F32 || t == KVC_TYPE_F16 || t == KVC_TYPE_BF16;
}

static int64_t block_of(uint32_t t) { return kvc_type_info(t)->block_size; }

/* llama.cpp's "use_more_bits": the first and last eighth of the layers and
 * every third layer in between. */
static bool more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static bool name_has(const char *name, const char *part) { return strstr(name, part) != NULL; }

int kvc_gen_tensor_type(const char *ftype, const char *name, int layer, int n_layer,
                        int64_t ne0, bool tied)
{
    const gen_ftype *ft = find_ftype(ftype);
    if (!ft || !name)
        return -1;
    uint32_t t = ft->base;
    if (is_float_type(t))
        return (int)t;
    bool is_output = strcmp(name, "output.weight") == 0 ||
                     (tied && strcmp(name, "token_embd.weight") == 0);
    if (ft->mix == MIX_MXFP4_MOE && name_has(name, "_exps.weight")) {
        t = KVC_TYPE_MXFP4;
    } else if (is_output) {
        t = (ne0 % block_of(t) != 0 || t == KVC_TYPE_Q8_0) ? KVC_TYPE_Q8_0 : KVC_TYPE_Q6_K;
    } else if (name_has(name, "attn_v.weight")) {
        if (ft->mix == MIX_K_M && more_bits(layer, n_layer))
            t = KVC_TYPE_Q6_K;
        else if (ft->mix == MIX_K_S && t == KVC_TYPE_Q4_K && layer < 4)
            t = KVC_TYPE_Q5_K;
    } else if (name_has(name, "ffn_down")) {
        if (ft->mix == MIX_K_M && more_bits(layer, n_layer))
            t = KVC_TYPE_Q6_K;
        else if (ft->mix == MIX_K_S && t == KVC_TYPE_Q4_K && layer < n_layer / 8)
            t = KVC_TYPE_Q5_K;
    }
    if (ne0 % block_of(t) != 0) {
        switch (t) {
        case KVC_TYPE_Q4_K: t = KVC_TYPE_Q5_0; break;
        case KVC_TYPE_Q5_K: t = KVC_TYPE_Q5_1; break;
        case KVC_TYPE_Q6_K: t = KVC_TYPE_Q8_0; break;
        default: break;
        }
        if (ne0 % block_of(t) != 0)
            t = KVC_TYPE_F16;
    }
    return (int)t;
}

/* ---------------------------------------------------------------- validate */

/* The generator's row: runnable architectures only. */
static const kvc_arch *gen_arch(const char *name)
{
    const kvc_arch *a = kvc_arch_find(name);
    return a && !a->unsupported ? a : NULL;
}

static int check_dim(const char *what, int64_t v, int64_t lo, int64_t hi, kvc_err *err)
{
    if (v < lo || v > hi)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "%s %lld out of range [%lld, %lld]",
                        what, (long long)v, (long long)lo, (long long)hi);
    return KVC_OK;
}

/* The sliding-window and RoPE-scaling parameters: a window only on the rows
 * that slide (gemma3, gpt-oss; without one all their layers are global), a
 * known scaling type with a factor. */
static int check_swa(const kvc_gen_params *q, kvc_err *err)
{
    const kvc_arch *a = gen_arch(q->arch);
    int rc;
    /* lfm2: a window makes every attention layer slide, with the global RoPE */
    const bool all_slide = a->recurrent == KVC_ATTN_SHORTCONV;
    if (a->swa_period == 0 && ((q->n_swa && !all_slide) || q->swa_pattern || q->rope_theta_swa))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "arch \"%s\" has no sliding-window layers "
                        "(sliding window: gemma3, gpt-oss, lfm2; pattern, rope base swa: gemma3, "
                        "gpt-oss)", q->arch);
    if ((rc = check_dim("n_swa", q->n_swa, 0, INT32_MAX, err)) ||
        (rc = check_dim("swa_pattern", q->swa_pattern, 0, GEN_MAX_LAYERS, err)) ||
        (rc = check_dim("rope_orig_ctx", q->rope_orig_ctx, 0, INT32_MAX, err)))
        return rc;
    if (!(q->rope_theta_swa >= 0.0f) || !(q->logit_softcap >= 0.0f))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "rope_theta_swa and logit_softcap must not be negative");
    const char *sc = q->rope_scaling;
    if (sc && strcmp(sc, "none") != 0 && strcmp(sc, "linear") != 0 && strcmp(sc, "yarn") != 0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "rope scaling \"%s\": expected none, linear or yarn", sc);
    if (sc && strcmp(sc, "none") != 0 && !(q->rope_factor >= 1.0f))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "rope scaling %s needs a factor >= 1 (got %g)", sc,
                        (double)q->rope_factor);
    return KVC_OK;
}

/* Whether layer l of a gemma4 model slides (written as its
 * sliding_window_pattern entry): with a window, all but every
 * swa_pattern-th layer (0: the row's period). */
static bool gen_slides(const kvc_gen_params *p, int l)
{
    const kvc_arch *a = gen_arch(p->arch);
    const int per = p->swa_pattern ? p->swa_pattern : a->swa_period;
    return a->ffn == KVC_FFN_MOE_DENSE && p->n_swa > 0 && (per == 0 || l % per < per - 1);
}

/* The head size of layer l (gemma4's sliding layers have their own). */
static int32_t gen_head_dim(const kvc_gen_params *p, int l)
{
    return gen_slides(p, l) ? p->head_dim_swa : p->head_dim;
}

/* A one_kind_per_layer row's layer l (kvc_gen_params.layer_pattern): 'M'
 * Mamba-2, '*' attention, '-' an FFN (E is '-'); 0 on other rows. */
static char gen_kind(const kvc_gen_params *p, int l)
{
    const char *pat = p->layer_pattern && *p->layer_pattern ? p->layer_pattern : "M-M*";
    if (!gen_arch(p->arch)->one_kind_per_layer)
        return 0;
    const char k = pat[l % (int)strlen(pat)];
    return k == 'E' ? '-' : k;
}

/* Whether layer l has an FFN, and whether it is experts (moe, from gen_moe). */
static bool gen_has_ffn(const kvc_gen_params *p, int l)
{
    return !gen_arch(p->arch)->one_kind_per_layer || gen_kind(p, l) == '-';
}

static bool gen_layer_moe(const kvc_gen_params *p, int l, bool moe)
{
    return moe && gen_has_ffn(p, l) && l >= p->n_dense_lead;
}

/* The KV heads of each layer (kvc_gen_params.kv_heads) into kv[n_layer]:
 * the list repeated over the layers, or the default (even layers recurrent);
 * every layer n_head_kv for a row without recurrent layers. Returns the
 * list's length, 0 without one, -1 when it is malformed. Gated DeltaNet rows:
 * 0 but on every full_attn_interval-th layer (resolved: >= 1). */
static int layer_kv_heads(const kvc_gen_params *p, int32_t *kv)
{
    const kvc_arch *a = gen_arch(p->arch);
    int32_t list[GEN_MAX_LAYERS];
    int n = 0;
    for (const char *s = p->kv_heads; s && *s && n < GEN_MAX_LAYERS;) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > GEN_MAX_DIM || (*end && *end != ','))
            return -1;
        list[n++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    if (p->kv_heads && n == 0)
        return -1;
    for (int l = 0; l < p->n_layer && l < GEN_MAX_LAYERS; l++)
        kv[l] = a->one_kind_per_layer         ? (gen_kind(p, l) == '*' ? p->n_head_kv : 0)
              : a->layers == kvc_gdn_layers   ? ((l + 1) % p->full_attn_interval ? 0 : p->n_head_kv)
              : gen_slides(p, l)              ? p->n_head_kv_swa
              : a->recurrent == KVC_ATTN_FULL ? p->n_head_kv
              : n > 0                         ? list[l % n]
              : l % 2                         ? p->n_head_kv : 0;
    return n;
}

/* The hybrid rows' parameters (lfm2, granitehybrid): defaults filled in,
 * the per-layer KV heads valid, at least one attention layer. */
static int check_hybrid(kvc_gen_params *q, kvc_err *err)
{
    const kvc_arch *a = gen_arch(q->arch);
    int32_t kv[GEN_MAX_LAYERS];
    int rc, n = layer_kv_heads(q, kv);
    if (q->layer_pattern && (!a->one_kind_per_layer || !*q->layer_pattern ||
                             strspn(q->layer_pattern, "M*-E") != strlen(q->layer_pattern)))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "layer_pattern \"%s\": letters M * - E, for nemotron_h "
                        "and nemotron_h_moe", q->layer_pattern);
    if (q->n_dense_lead && (a->ffn_by_experts || a->ffn != KVC_FFN_MOE || q->n_dense_lead < 0 ||
                            q->n_dense_lead > q->n_layer))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "n_dense_lead %d: 0 to n_layer, for lfm2moe",
                        (int)q->n_dense_lead);
    if (a->recurrent == KVC_ATTN_FULL)
        return q->kv_heads ? kvc_fail(err, KVC_ERR_INVALID_ARG, "arch \"%s\" has no recurrent layers "
                                      "(kv_heads: lfm2, granitehybrid)", q->arch) : KVC_OK;
    if (n < 0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "kv_heads \"%s\": expected comma-separated integers",
                        q->kv_heads);
    bool any_attn = false;
    for (int l = 0; l < q->n_layer; l++) {
        if (kv[l] > q->n_head || (kv[l] > 0 && q->n_head % kv[l] != 0))
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "kv_heads: layer %d has %d KV heads for %d heads",
                            l, (int)kv[l], (int)q->n_head);
        any_attn |= kv[l] > 0;
    }
    if (!any_attn)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "kv_heads: no attention layer among the %d layers",
                        (int)q->n_layer);
    if (q->conv_l == 0)
        q->conv_l = 3;
    if (q->ssm_d_conv == 0)
        q->ssm_d_conv = 4;
    if (q->ssm_d_inner == 0)
        q->ssm_d_inner = 2 * q->n_embd;
    if (q->ssm_d_state == 0)
        q->ssm_d_state = 16;
    if (q->ssm_n_head == 0)
        q->ssm_n_head = KVC_MAX(1, q->ssm_d_inner / 32);
    if (q->ssm_n_group == 0)
        q->ssm_n_group = 1;
    if ((rc = check_dim("conv_l", q->conv_l, 2, 64, err)) ||
        (rc = check_dim("ssm_d_conv", q->ssm_d_conv, 2, 64, err)) ||
        (rc = check_dim("ssm_d_inner", q->ssm_d_inner, 1, GEN_MAX_DIM, err)) ||
        (rc = check_dim("ssm_d_state", q->ssm_d_state, 1, 4096, err)) ||
        (rc = check_dim("ssm_n_head", q->ssm_n_head, 1, q->ssm_d_inner, err)) ||
        (rc = check_dim("ssm_n_group", q->ssm_n_group, 1, q->ssm_n_head, err)) ||
        (rc = check_dim("n_ff_shexp", q->n_ff_shexp, 0, GEN_MAX_DIM, err)))
        return rc;
    if (q->ssm_d_inner % q->ssm_n_head != 0 || q->ssm_n_head % q->ssm_n_group != 0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "ssm_d_inner %d, ssm_n_head %d, ssm_n_group %d: each must "
                        "divide the one before", (int)q->ssm_d_inner, (int)q->ssm_n_head, (int)q->ssm_n_group);
    if (a->ff_exp_is_ff)
        q->n_ff_exp = q->n_ff;
    return KVC_OK;
}

/* Gemma 4's sliding layers' shape: defaults (the global layers'), valid; the
 * other rows have none. */
static int check_gemma4(kvc_gen_params *q, kvc_err *err)
{
    int rc;
    if (gen_arch(q->arch)->ffn != KVC_FFN_MOE_DENSE)
        return q->head_dim_swa || q->n_head_kv_swa || q->n_rot_swa || q->n_embd_per_layer || q->n_kv_shared
             ? kvc_fail(err, KVC_ERR_INVALID_ARG, "arch \"%s\" has no sliding layers of their own shape "
                        "(head_dim_swa, n_head_kv_swa, n_rot_swa: gemma4)", q->arch) : KVC_OK;
    if ((rc = check_dim("n_embd_per_layer", q->n_embd_per_layer, 0, GEN_MAX_DIM / q->n_layer, err)) ||
        (rc = check_dim("n_kv_shared", q->n_kv_shared, 0, KVC_MAX(0, q->n_layer - 2), err)))
        return rc;
    q->head_dim_swa = q->head_dim_swa ? q->head_dim_swa : q->head_dim;
    q->n_head_kv_swa = q->n_head_kv_swa ? q->n_head_kv_swa : q->n_head_kv;
    if ((rc = check_dim("head_dim_swa", q->head_dim_swa, 2, GEN_MAX_DIM, err)) ||
        (rc = check_dim("n_head_kv_swa", q->n_head_kv_swa, 1, q->n_head, err)) ||
        (rc = check_dim("n_rot_swa", q->n_rot_swa, 0, q->head_dim_swa, err)) ||
        (rc = check_dim("n_head * head_dim_swa", (int64_t)q->n_head * q->head_dim_swa, 1, GEN_MAX_DIM, err)))
        return rc;
    if (q->head_dim_swa % 2 != 0 || q->n_rot_swa % 2 != 0 || q->n_head % q->n_head_kv_swa != 0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "head_dim_swa %d and n_rot_swa %d must be even, "
                        "n_head_kv_swa %d divide n_head %d", (int)q->head_dim_swa, (int)q->n_rot_swa,
                        (int)q->n_head_kv_swa, (int)q->n_head);
    return KVC_OK;
}

/* Whether the (resolved) model's FFNs are mixtures of experts. */
static bool gen_moe(const kvc_gen_params *p)
{
    const kvc_arch *a = gen_arch(p->arch);
    return a->ffn_by_experts ? p->n_expert > 0 : a->ffn == KVC_FFN_MOE;
}

/* Validate p and fill the defaults (n_head_kv, head_dim, n_vocab) into *q. */
static int resolve_params(const kvc_gen_params *p, kvc_gen_params *q, kvc_err *err)
{
    if (!p->vocab || (strcasecmp(p->vocab, "bpe") != 0 && strcasecmp(p->vocab, "spm") != 0))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "vocab \"%s\": expected \"bpe\" or \"spm\"",
                        p->vocab ? p->vocab : "(null)");
    if (!gen_arch(p->arch)) {
        char known[128];
        kvc_arch_names(known, sizeof(known));
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "arch \"%s\": expected one of %s",
                        p->arch ? p->arch : "(null)", known);
    }
    if (!find_ftype(p->ftype))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "ftype \"%s\" unknown (f32 f16 bf16 q8_0 q4_0 "
                        "q4_1 q5_0 q5_1 q4_k q4_k_s q4_k_m q5_k q5_k_s q5_k_m q6_k mxfp4_moe)",
                        p->ftype ? p->ftype : "(null)");
    *q = *p;
    if (q->n_head_kv == 0)
        q->n_head_kv = q->n_head;
    if (q->head_dim == 0 && q->n_head > 0)
        q->head_dim = q->n_embd / q->n_head;
    int rc;
    if ((rc = check_dim("n_embd", q->n_embd, 1, GEN_MAX_DIM, err)) ||
        (rc = check_dim("n_layer", q->n_layer, 1, GEN_MAX_LAYERS, err)) ||
        (rc = check_dim("n_head", q->n_head, 1, GEN_MAX_DIM, err)) ||
        (rc = check_dim("n_head_kv", q->n_head_kv, 1, q->n_head, err)) ||
        (rc = check_dim("head_dim", q->head_dim, 2, GEN_MAX_DIM, err)) ||
        (rc = check_dim("n_head * head_dim", (int64_t)q->n_head * q->head_dim, 1, GEN_MAX_DIM, err)) ||
        (rc = check_dim("n_ff", q->n_ff, 1, GEN_MAX_DIM, err)) ||
        (rc = check_dim("n_ctx", q->n_ctx, 1, INT32_MAX, err)) ||
        (rc = check_dim("n_vocab", q->n_vocab, 0, GEN_MAX_VOCAB, err)) ||
        (rc = check_dim("n_threads", q->n_threads, 0, 1024, err)))
        return rc;
    if (gen_arch(q->arch)->ffn_by_experts && q->n_expert == 0)
        q->n_expert_used = 0;
    if (gen_moe(q) &&
        ((rc = check_dim("n_expert", q->n_expert, 1, 4096, err)) ||
         (rc = check_dim("n_expert_used", q->n_expert_used, 1, q->n_expert, err)) ||
         (rc = check_dim("n_ff_exp", q->n_ff_exp, 1, GEN_MAX_DIM, err))))
        return rc;
    if (gen_arch(q->arch)->layers == kvc_gdn_layers) {   /* Gated DeltaNet's shape; 0: default */
        q->ssm_d_conv = q->ssm_d_conv ? q->ssm_d_conv : 4;
        q->ssm_d_state = q->ssm_d_state ? q->ssm_d_state : 16;
        q->ssm_n_group = q->ssm_n_group ? q->ssm_n_group : 2;
        q->ssm_n_head = q->ssm_n_head ? q->ssm_n_head : 2 * q->ssm_n_group;
    }
    if (gen_arch(q->arch)->layers == kvc_gdn_layers &&
        ((rc = check_dim("ssm_d_conv", q->ssm_d_conv, 1, 16, err)) ||
         (rc = check_dim("ssm_d_state", q->ssm_d_state, 1, 1024, err)) ||
         (rc = check_dim("ssm_n_group", q->ssm_n_group, 1, GEN_MAX_DIM, err)) ||
         (rc = check_dim("ssm_n_head", q->ssm_n_head, q->ssm_n_group, GEN_MAX_DIM, err)) ||
         (rc = check_dim("full_attn_interval", q->full_attn_interval, 1, GEN_MAX_LAYERS, err))))
        return rc;
    if (gen_arch(q->arch)->layers == kvc_gdn_layers && q->ssm_n_head % q->ssm_n_group != 0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "ssm_n_head %d (V heads) is not a multiple of "
                        "ssm_n_group %d (K heads)", (int)q->ssm_n_head, (int)q->ssm_n_group);
    if (gen_arch(q->arch)->layers == kvc_gdn_layers)
        q->ssm_d_inner = q->ssm_n_head * q->ssm_d_state;   /* the V heads' width */
    if ((rc = check_dim("n_rot", q->n_rot, 0, q->head_dim, err)) ||
        (rc = check_dim("n_ff_shexp", q->n_ff_shexp, 0, GEN_MAX_DIM, err)))
        return rc;
    if (q->n_rot % 2 != 0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "n_rot %d is odd (RoPE rotates pairs)", (int)q->n_rot);
    if (p->head_dim == 0 && q->n_embd % q->n_head != 0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "n_embd %d is not a multiple of n_head %d; give head_dim",
                        (int)q->n_embd, (int)q->n_head);
    if (q->n_head % q->n_head_kv != 0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "n_head %d is not a multiple of n_head_kv %d",
                        (int)q->n_head, (int)q->n_head_kv);
    if (q->head_dim % 2 != 0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "head_dim %d is odd (RoPE rotates pairs)",
                        (int)q->head_dim);
    if (!(q->rope_theta > 0.0f) || !(q->rms_eps > 0.0f))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "rope_theta and rms_eps must be positive");
    if ((rc = check_swa(q, err)) || (rc = check_hybrid(q, err)) || (rc = check_gemma4(q, err)))
        return rc;
    int32_t natural = kvc_gen_vocab_size(q->vocab);
    if (natural < 0)
        return kvc_fail(err, KVC_ERR_NOMEM, "building the %s vocabulary: out of memory", q->vocab);
    if (q->n_vocab == 0)
        q->n_vocab = natural;
    if (q->n_vocab < natural)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "n_vocab %d is below the %s vocabulary's %d tokens",
                        (int)q->n_vocab, q->vocab, (int)natural);
    return KVC_OK;
}

/* ------------------------------------------------------------------ random */

/* A tensor's weights are one splitmix64 stream from a seed hashed from the
 * model seed and the tensor's name: element k is mix(s + (k+1) * golden), so a
 * row can be generated without the ones before it. */
#define GOLDEN 0x9E3779B97F4A7C15ull

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t tensor_seed(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;      /* FNV-1a */
    for (const unsigned char *s = (const unsigned char *)name; *s; s++)
        h = (h ^ *s) * 0x100000001b3ull;
    return mix64(seed ^ mix64(h));
}

/* Approximately N(0,1): the sum of the four 16-bit uniforms in one draw
 * (Irwin-Hall), centred and scaled; bounded at +-sqrt(12) * 0.99998. */
static inline float normal_of(uint64_t x)
{
    static const double inv_std = 2.6428804453310986e-05;  /* 1/sqrt((65536^2 - 1) / 3) */
    int64_t sum = (int64_t)(x & 0xFFFF) + (int64_t)((x >> 16) & 0xFFFF) +
                  (int64_t)((x >> 32) & 0xFFFF) + (int64_t)(x >> 48);
    return (float)((double)(sum - 131070) * inv_std);
}

/* -------------------------------------------------------------- generation */

typedef struct gen_tensor {
    char     name[64];
    int      layer;          /* -1 for global tensors */
    int      n_dims;
    int64_t  ne[3];          /* ne[0] row length; ne[1] rows (1 for 1-D); ne[2] experts (or 1) */
    int64_t  rows;           /* ne[1] * ne[2] */
    bool     is_float;       /* norm weight or bias: stays F32 */
    uint32_t type;
    float    mean, std;      /* element = mean + std * N(0,1) */
    const uint8_t *quiet;    /* [rows] rows to scale by GEN_QUIET_SCALE, or NULL */
    int64_t  rope_keep;      /* > 0: rope_freqs of proportional RoPE: elements [0, rope_keep)
                              * 1 (rotated), the others 1e30 (not) */
} gen_tensor;

typedef struct gen_job {
    const gen_tensor *t;
    uint64_t seed;           /* tensor_seed */
    size_t   row_size;       /* bytes per row in t->type */
    int64_t  rows_per_task;
    uint8_t *out;            /* [rows * row_size] */
    float  **scratch;        /* per thread, [ne[0]] */
} gen_job;

static void gen_rows(void *ctx, int64_t task, int thread)
{
    const gen_job *j = ctx;
    const gen_tensor *t = j->t;
    float *row = j->scratch[thread];
    int64_t r0 = task * j->rows_per_task;
    int64_t r1 = KVC_MIN(r0 + j->rows_per_task, t->rows);
    for (int64_t r = r0; r < r1; r++) {
        uint64_t s = j->seed + (uint64_t)(r * t->ne[0]) * GOLDEN;
        float mean = t->mean, std = t->std;
        if (t->quiet && t->quiet[r]) {
            mean *= GEN_QUIET_SCALE;
            std *= GEN_QUIET_SCALE;
        }
        for (int64_t k = 0; k < t->ne[0]; k++) {
            s += GOLDEN;
            row[k] = t->rope_keep > 0 ? (k < t->rope_keep ? 1.0f : 1e30f) : mean + std * normal_of(mix64(s));
        }
        uint8_t *dst = j->out + (size_t)r * j->row_size;
        switch (t->type) {
        case KVC_TYPE_F32:
            memcpy(dst, row, (size_t)t->ne[0] * sizeof(float));
            break;
        case KVC_TYPE_F16:
            for (int64_t k = 0; k < t->ne[0]; k++)
                ((kvc_fp16 *)dst)[k] = kvc_fp32_to_fp16(row[k]);
            break;
        case KVC_TYPE_BF16:
            for (int64_t k = 0; k < t->ne[0]; k++)
                ((kvc_bf16 *)dst)[k] = kvc_fp32_to_bf16(row[k]);
            break;
        default:
            kvc_quantize_row_ref(t->type, row, dst, t->ne[0]);  /* checked in gen_tensor_add */
            break;
        }
    }
}

/* Generate tensor t and add it to the writer. */
static int gen_tensor_add(gguf_writer *w, const gen_tensor *t, uint64_t seed,
                          kvc_threadpool *tp, float **scratch, kvc_err *err)
{
    size_t row_size = kvc_row_size(t->type, t->ne[0]);
    const kvc_type_traits *tt = kvc_type_info(t->type);
    if (row_size == 0 || !tt)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "tensor %s: row of %lld not possible in type %u",
                        t->name, (long long)t->ne[0], t->type);
    if (!is_float_type(t->type)) {
        /* a quantizer that is missing would otherwise leave garbage in the file */
        float zero[QK_K] = { 0 };
        uint8_t probe[sizeof(block_q8_0) * QK_K / QK8_0 + sizeof(block_q6_K)];
        if (kvc_quantize_row_ref(t->type, zero, probe, tt->block_size) == 0)
            return kvc_fail(err, KVC_ERR_UNSUPPORTED, "tensor %s: quantization to %s not available",
                            t->name, tt->name);
    }
    size_t size = row_size * (size_t)t->rows;
    gen_job j = { .t = t, .seed = tensor_seed(seed, t->name), .row_size = row_size,
                  .out = malloc(size ? size : 1), .scratch = scratch };
    if (!j.out)
        return kvc_fail(err, KVC_ERR_NOMEM, "tensor %s: cannot allocate %zu bytes", t->name, size);
    j.rows_per_task = KVC_MAX(1, 65536 / t->ne[0]);
    int64_t n_tasks = (t->rows + j.rows_per_task - 1) / j.rows_per_task;
    if (tp && t->ne[0] * t->rows >= GEN_PARALLEL_MIN)
        kvc_threadpool_run(tp, n_tasks, gen_rows, &j);
    else
        for (int64_t i = 0; i < n_tasks; i++)
            gen_rows(&j, i, 0);
    int rc = gguf_writer_add_tensor(w, t->name, t->type, (uint32_t)t->n_dims, t->ne, j.out, size);
    free(j.out);
    if (rc != KVC_OK)
        return kvc_fail(err, rc, "tensor %s: adding to the file: %s", t->name, kvc_strerror(rc));
    return KVC_OK;
}

/* ------------------------------------------------------------------ layout */

/* The value of a table dimension (arch.h) for generator parameters p, in a
 * layer of kv KV heads of hd. */
static int64_t gen_dim(const kvc_gen_params *p, int64_t n_vocab, int32_t kv, int32_t hd, uint8_t d)
{
    const int64_t conv = p->ssm_d_inner + 2 * (int64_t)p->ssm_n_group * p->ssm_d_state;
    switch ((kvc_dim)d) {
    case KVC_D1:         return 1;
    case KVC_D_EMBD:     return p->n_embd;
    case KVC_D_VOCAB:    return n_vocab;
    case KVC_D_Q:        return (int64_t)p->n_head * hd;
    case KVC_D_KV:       return (int64_t)kv * hd;
    case KVC_D_HEAD:     return hd;
    case KVC_D_HEADS:    return p->n_head;
    case KVC_D_FF:       return p->n_ff;
    case KVC_D_EXP:      return p->n_expert;
    case KVC_D_FF_EXP:   return p->n_ff_exp;
    case KVC_D_FF_EXP2:  return 2 * (int64_t)p->n_ff_exp;
    case KVC_D_FF_SHEXP: return p->n_ff_shexp ? p->n_ff_shexp : p->n_ff_exp;
    case KVC_D_Q2:       return 2 * (int64_t)p->n_head * hd;
    case KVC_D_PLE:      return p->n_embd_per_layer;
    case KVC_D_PLE_ALL:  return (int64_t)p->n_embd_per_layer * p->n_layer;
    case KVC_D_EMBD3:    return 3 * (int64_t)p->n_embd;
    case KVC_D_CONV_L:   return p->conv_l;
    case KVC_D_SSM_CONV_K: return p->ssm_d_conv;
    case KVC_D_SSM_CONV_DIM: return conv;
    case KVC_D_SSM_IN:   return p->ssm_d_inner + conv + p->ssm_n_head;
    case KVC_D_SSM_INNER: return p->ssm_d_inner;
    case KVC_D_SSM_HEADS: return p->ssm_n_head;
    case KVC_D_SSM_STATE: return p->ssm_d_state;
    case KVC_D_SSM_GROUPS: return p->ssm_n_group;
    case KVC_D_SSM_GROUP_W: return p->ssm_d_inner / p->ssm_n_group;
    case KVC_D_SSM_QKVZ: return p->ssm_d_inner + conv;
    case KVC_D_SSM_HEADS2: return 2 * (int64_t)p->ssm_n_head;
    }
    return 0;
}

/* The optional tensors a row's released models carry, written too: gpt-oss's
 * router and expert biases. */
static const struct { const char *arch, *name; } gen_optional[] = {
    { "gpt-oss", "ffn_gate_inp.bias" },
    { "gpt-oss", "ffn_gate_exps.bias" },
    { "gpt-oss", "ffn_up_exps.bias" },
    { "gpt-oss", "ffn_down_exps.bias" },
    { "qwen35moe", "ffn_gate_inp_shexp.weight" },   /* with n_ff_shexp > 0 (gen_writes) */
    { "qwen35moe", "ffn_gate_shexp.weight" },
    { "qwen35moe", "ffn_up_shexp.weight" },
    { "qwen35moe", "ffn_down_shexp.weight" },
    { "qwen3next", "ssm_in.weight" },               /* the fused form released files have */
    { "qwen3next", "ffn_gate_inp_shexp.weight" },
    { "qwen3next", "ffn_gate_shexp.weight" },
    { "qwen3next", "ffn_up_shexp.weight" },
    { "qwen3next", "ffn_down_shexp.weight" },
    { "gemma4", "layer_output_scale.weight" },
    { "gemma4", "attn_v.weight" },                  /* sliding layers only (gen_writes) */
    { "gemma4", "attn_k.weight" },                  /* not on KV-shared layers (gen_writes) */
    { "gemma4", "attn_k_norm.weight" },
    { "gemma4", "inp_gate.weight" },                /* per-layer embeddings: with */
    { "gemma4", "proj.weight" },                    /* n_embd_per_layer > 0 (gen_writes) */
    { "gemma4", "post_norm.weight" },
    { "lfm2moe", "exp_probs_b.bias" },
};

/* Whether table tensor t is written in layer l of kv KV heads (0: recurrent):
 * the required ones (and the separate gate/up of experts rather than the
 * fused form), the row's gen_optional ones, granitehybrid's shared expert
 * and conv bias, on layers of its kind; gemma4's global layers have no
 * attn_v (V = K), as released. */
static bool gen_writes(const kvc_gen_params *p, const kvc_arch_tensor *t, int l, int32_t kv)
{
    const kvc_arch *a = gen_arch(p->arch);
    bool want = !(t->flags & KVC_T_OPTIONAL);
    for (size_t i = 0; !want && i < KVC_ARRAY_LEN(gen_optional); i++)
        want = strcmp(a->name, gen_optional[i].arch) == 0 && strcmp(t->name, gen_optional[i].name) == 0 &&
               (!strstr(t->name, "_shexp") || p->n_ff_shexp > 0) &&
               (strcmp(t->name, "attn_v.weight") != 0 || gen_slides(p, l)) &&
               ((!strstr(t->name, "attn_k") && strcmp(t->name, "attn_v.weight") != 0) ||
                l < p->n_layer - p->n_kv_shared) &&
               ((t->ne[0] != KVC_D_PLE && t->ne[1] != KVC_D_PLE && strcmp(t->name, "post_norm.weight") != 0) ||
                p->n_embd_per_layer > 0);
    if (!want && a->recurrent == KVC_ATTN_MAMBA2)
        want = strcmp(t->name, "ssm_conv1d.bias") == 0 ||
               (p->n_ff_shexp > 0 && strstr(t->name, "_shexp.weight") && !strstr(t->name, "gate_inp"));
    const bool ffn = gen_has_ffn(p, l), moe = gen_layer_moe(p, l, gen_moe(p));
    switch ((kvc_tensor_when)t->when) {
    case KVC_ON_ALL:   return want;
    case KVC_ON_DENSE: return want && ffn && !moe;
    case KVC_ON_MOE:   return want && moe;
    case KVC_ON_ATTN:  return want && kv > 0;
    case KVC_ON_RECR:  return want && kv == 0 && gen_kind(p, l) != '-';
    case KVC_ON_MIXER: return want && gen_kind(p, l) != '-';
    case KVC_ON_FFN:   return want && ffn;
    }
    return false;
}

/* The tensors of the model, in file order (malloc'd, *n_out of them): the
 * architecture's table row (arch.h); they borrow `quiet` ([n_vocab]). */
static gen_tensor *plan_tensors(const kvc_gen_params *p, int64_t n_vocab, const uint8_t *quiet,
                                int *n_out)
{
    const kvc_arch *a = gen_arch(p->arch);
    int per_layer = 0;
    for (const kvc_arch_tensor *const *list = a->tensors; *list; list++)
        for (const kvc_arch_tensor *t = *list; t->name; t++)
            per_layer++;
    gen_tensor *ts = calloc((size_t)p->n_layer * (size_t)per_layer + 7, sizeof(*ts));
    if (!ts)
        return NULL;
    int n = 0;
    const int64_t d = p->n_embd;
    const float emb_std = 1.0f / sqrtf((float)d);

    /* dims_: the table's (a vector 1, a matrix 2, experts 3) */
#define ADD(layer_, nm, dims_, isf_, ne0, ne1, ne2, mean_, std_, quiet_) do {                 \
        gen_tensor *t_ = &ts[n++];                                                           \
        if ((layer_) >= 0) snprintf(t_->name, sizeof(t_->name), "blk.%d.%s", (layer_), nm);  \
        else snprintf(t_->name, sizeof(t_->name), "%s", nm);                                 \
        t_->layer = (layer_), t_->n_dims = (dims_), t_->is_float = (isf_);                   \
        t_->ne[0] = (ne0), t_->ne[1] = (ne1), t_->ne[2] = (ne2), t_->rows = (ne1) * (ne2);   \
        t_->mean = (mean_), t_->std = (std_), t_->quiet = (quiet_);                          \
    } while (0)

    int32_t kv[GEN_MAX_LAYERS];
    layer_kv_heads(p, kv);                       /* valid: resolve_params */
    ADD(-1, "token_embd.weight", 2, false, d, n_vocab, 1, 0.0f, emb_std, p->tied ? quiet : NULL);
    for (int l = 0; l < p->n_layer; l++)
        for (const kvc_arch_tensor *const *list = a->tensors; *list; list++)
            for (const kvc_arch_tensor *t = *list; t->name; t++) {
                if (!gen_writes(p, t, l, kv[l]))
                    continue;
                const int32_t hd = gen_head_dim(p, l);
                const int64_t ne0 = gen_dim(p, n_vocab, kv[l], hd, t->ne[0]),
                              ne1 = gen_dim(p, n_vocab, kv[l], hd, t->ne[1]),
                              ne2 = gen_dim(p, n_vocab, kv[l], hd, t->ne[2]);
                const int dims = t->ne[2] != KVC_D1 ? 3 : t->ne[1] != KVC_D1 || !t->is_float ? 2 : 1;
                if (strcmp(t->name, "ssm_a") == 0)           /* -exp(A_log): a decay, < 0 */
                    ADD(l, t->name, dims, true, ne0, ne1, ne2, -1.0f, 0.25f, NULL);
                else if (strstr(t->name, "norm.weight") || strstr(t->name, "scale"))
                    /* norm weights and scales (gemma4's router input, layer output): 1 + noise */
                    ADD(l, t->name, dims, true, ne0, ne1, ne2, 1.0f, GEN_NORM_NOISE, NULL);
                else if (strstr(t->name, ".bias"))
                    ADD(l, t->name, dims, true, ne0, ne1, ne2, 0.0f, GEN_BIAS_STD, NULL);
                else                                         /* projections: N(0, 1/ne0) */
                    ADD(l, t->name, dims, t->is_float, ne0, ne1, ne2, 0.0f,
                        1.0f / sqrtf((float)ne0), NULL);
            }
    if (p->n_embd_per_layer > 0) {   /* gemma4's per-layer embeddings */
        const int64_t all = (int64_t)p->n_embd_per_layer * p->n_layer;
        ADD(-1, "per_layer_token_embd.weight", 2, false, all, n_vocab, 1, 0.0f,
            1.0f / sqrtf((float)p->n_embd_per_layer), NULL);
        ADD(-1, "per_layer_model_proj.weight", 2, false, d, all, 1, 0.0f, 1.0f / sqrtf((float)d), NULL);
        ADD(-1, "per_layer_proj_norm.weight", 1, true, p->n_embd_per_layer, 1, 1, 1.0f, GEN_NORM_NOISE, NULL);
    }
    if (a->rope_freqs_global) {   /* proportional RoPE: a quarter of the global pairs rotate */
        const int64_t half = (p->n_rot ? p->n_rot : p->head_dim) / 2;
        ADD(-1, "rope_freqs.weight", 1, true, half, 1, 1, 1.0f, 0.0f, NULL);
        ts[n - 1].rope_keep = KVC_MAX(1, half / 4);
    }
    ADD(-1, a->output_norm ? a->output_norm : "output_norm.weight", 1, true, d, 1, 1, GEN_LOGIT_SCALE,
        GEN_LOGIT_SCALE * GEN_NORM_NOISE, NULL);
    if (!p->tied)
        ADD(-1, "output.weight", 2, false, d, n_vocab, 1, 0.0f, emb_std, quiet);
#undef ADD

    /* norms, biases and routers stay F32, as llama.cpp's quantizer leaves them */
    for (int i = 0; i < n; i++)
        ts[i].type = ts[i].is_float || strstr(ts[i].name, "ffn_gate_inp")
                   ? KVC_TYPE_F32
                   : (uint32_t)kvc_gen_tensor_type(p->ftype, ts[i].name, ts[i].layer, p->n_layer,
                                                   ts[i].ne[0], p->tied);
    *n_out = n;
    return ts;
}

/* ------------------------------------------------------------------- keys */

static int write_hparams(gguf_writer *w, const kvc_gen_params *p)
{
    const gen_ftype *ft = find_ftype(p->ftype);
    char name[96], key[96];
    if (p->name)
        snprintf(name, sizeof(name), "%s", p->name);
    else
        snprintf(name, sizeof(name), "random-%s-%dL-%dd", p->arch, (int)p->n_layer, (int)p->n_embd);
    int rc = gguf_writer_set_str(w, "general.architecture", p->arch);
    if (!rc) rc = gguf_writer_set_str(w, "general.name", name);
    if (!rc) rc = gguf_writer_set_u32(w, "general.file_type", ft->file_type);
    if (!rc && !is_float_type(ft->base))
        rc = gguf_writer_set_u32(w, "general.quantization_version", 2);
#define ARCH_U32(suffix, v) if (!rc) { snprintf(key, sizeof(key), "%s." suffix, p->arch); \
                                        rc = gguf_writer_set_u32(w, key, (uint32_t)(v)); }
#define ARCH_F32(suffix, v) if (!rc) { snprintf(key, sizeof(key), "%s." suffix, p->arch); \
                                        rc = gguf_writer_set_f32(w, key, (v)); }
    ARCH_U32("vocab_size", p->n_vocab);
    ARCH_U32("context_length", p->n_ctx);
    ARCH_U32("embedding_length", p->n_embd);
    ARCH_U32("block_count", p->n_layer);
    if (gen_arch(p->arch)->one_kind_per_layer) {   /* per layer: 0 = a mixer layer */
        int32_t ff[GEN_MAX_LAYERS];
        ARCH_F32("attention.layer_norm_epsilon", p->rms_eps);   /* llama.cpp requires it (MTP head) */
        for (int l = 0; l < p->n_layer; l++)
            ff[l] = gen_has_ffn(p, l) ? p->n_ff : 0;
        snprintf(key, sizeof(key), "%s.feed_forward_length", p->arch);
        if (!rc)
            rc = gguf_writer_set_arr(w, key, GGUF_TYPE_INT32, ff, (uint64_t)p->n_layer);
    } else {
        ARCH_U32("feed_forward_length", p->n_ff);
    }
    ARCH_U32("attention.head_count", p->n_head);
    const bool g4 = gen_arch(p->arch)->ffn == KVC_FFN_MOE_DENSE;
    if (gen_arch(p->arch)->recurrent != KVC_ATTN_FULL || g4) {   /* per layer: 0 = recurrent */
        int32_t kv[GEN_MAX_LAYERS];
        layer_kv_heads(p, kv);
        snprintf(key, sizeof(key), "%s.attention.head_count_kv", p->arch);
        if (!rc)
            rc = gguf_writer_set_arr(w, key, GGUF_TYPE_INT32, kv, (uint64_t)p->n_layer);
    } else {
        ARCH_U32("attention.head_count_kv", p->n_head_kv);
    }
    ARCH_U32("attention.key_length", p->head_dim);
    ARCH_U32("attention.value_length", p->head_dim);
    ARCH_U32("rope.dimension_count", p->n_rot ? p->n_rot : p->head_dim);
    ARCH_F32("rope.freq_base", p->rope_theta);
    ARCH_F32("attention.layer_norm_rms_epsilon", p->rms_eps);
    if (gen_moe(p)) {
        ARCH_U32("expert_count", p->n_expert);
        ARCH_U32("expert_used_count", p->n_expert_used);
        if (!gen_arch(p->arch)->ff_exp_is_ff)
            ARCH_U32("expert_feed_forward_length", p->n_ff_exp);
        if (p->n_ff_shexp > 0)
            ARCH_U32("expert_shared_feed_forward_length", p->n_ff_shexp);
        if (p->expert_weights_scale != 0.0f)
            ARCH_F32("expert_weights_scale", p->expert_weights_scale);
        if (p->expert_weights_norm && !rc) {
            snprintf(key, sizeof(key), "%s.expert_weights_norm", p->arch);
            rc = gguf_writer_set_bool(w, key, true);
        }
        if (gen_arch(p->arch)->recurrent == KVC_ATTN_SHORTCONV) {   /* lfm2moe */
            ARCH_U32("expert_gating_func", KVC_GATING_SIGMOID);
            ARCH_U32("leading_dense_block_count", p->n_dense_lead);
        }
    }
    if (gen_arch(p->arch)->layers == kvc_gdn_layers && !gen_arch(p->arch)->gdn_v_grouped) {
        /* IMRoPE sections (t, h, w, e) of the rotated pairs, as Qwen3.5's [11, 11, 10, 0] */
        const int32_t half = (p->n_rot ? p->n_rot : p->head_dim) / 2;
        const int32_t sec[4] = { (half + 2) / 3, (half + 1) / 3, half / 3, 0 };
        if (!rc) { snprintf(key, sizeof(key), "%s.rope.dimension_sections", p->arch);
                   rc = gguf_writer_set_arr(w, key, GGUF_TYPE_INT32, sec, 4); }
    }
    if (gen_arch(p->arch)->layers == kvc_gdn_layers)
        ARCH_U32("full_attention_interval", p->full_attn_interval);
    if (gen_arch(p->arch)->recurrent == KVC_ATTN_SHORTCONV)
        ARCH_U32("shortconv.l_cache", p->conv_l);
    if (gen_arch(p->arch)->recurrent == KVC_ATTN_MAMBA2 || gen_arch(p->arch)->layers == kvc_gdn_layers) {
        ARCH_U32("ssm.conv_kernel", p->ssm_d_conv);
        ARCH_U32("ssm.inner_size", p->ssm_d_inner);
        ARCH_U32("ssm.state_size", p->ssm_d_state);
        ARCH_U32("ssm.time_step_rank", p->ssm_n_head);
        ARCH_U32("ssm.group_count", p->ssm_n_group);
    }
    if (gen_arch(p->arch)->rope_finetuned_switch) {
        if (!rc) { snprintf(key, sizeof(key), "%s.rope.scaling.finetuned", p->arch);   /* NoPE, as released */
                   rc = gguf_writer_set_bool(w, key, false); }
    }
    if (p->embedding_scale != 0.0f)
        ARCH_F32("embedding_scale", p->embedding_scale);
    if (p->residual_scale != 0.0f)
        ARCH_F32("residual_scale", p->residual_scale);
    if (p->attention_scale != 0.0f)
        ARCH_F32("attention.scale", p->attention_scale);
    if (p->logit_scale != 0.0f)
        ARCH_F32("logit_scale", p->logit_scale);
    if (p->n_swa > 0)
        ARCH_U32("attention.sliding_window", p->n_swa);
    if (g4) {   /* the pattern per layer, the sliding layers' shape, no per-layer embeddings */
        bool slides[GEN_MAX_LAYERS];
        for (int l = 0; l < p->n_layer; l++)
            slides[l] = gen_slides(p, l);
        snprintf(key, sizeof(key), "%s.attention.sliding_window_pattern", p->arch);
        if (!rc)
            rc = gguf_writer_set_arr(w, key, GGUF_TYPE_BOOL, slides, (uint64_t)p->n_layer);
        if (p->n_swa == 0)
            ARCH_U32("attention.sliding_window", 0);
        ARCH_U32("attention.key_length_swa", p->head_dim_swa);
        ARCH_U32("attention.value_length_swa", p->head_dim_swa);
        ARCH_U32("rope.dimension_count_swa", p->n_rot_swa ? p->n_rot_swa : p->head_dim_swa);
        ARCH_U32("embedding_length_per_layer_input", p->n_embd_per_layer);
        if (p->n_kv_shared > 0)
            ARCH_U32("attention.shared_kv_layers", p->n_kv_shared);
    } else if (p->swa_pattern > 0) {
        ARCH_U32("attention.sliding_window_pattern", p->swa_pattern);
    }
    if (p->rope_theta_swa > 0.0f)
        ARCH_F32("rope.freq_base_swa", p->rope_theta_swa);
    if (p->logit_softcap > 0.0f)
        ARCH_F32("final_logit_softcapping", p->logit_softcap);
    if (p->rope_scaling) {
        if (!rc) { snprintf(key, sizeof(key), "%s.rope.scaling.type", p->arch);
                   rc = gguf_writer_set_str(w, key, p->rope_scaling); }
        if (strcmp(p->rope_scaling, "none") != 0)
            ARCH_F32("rope.scaling.factor", p->rope_factor);
        if (p->rope_orig_ctx > 0)
            ARCH_U32("rope.scaling.original_context_length", p->rope_orig_ctx);
    }
#undef ARCH_U32
#undef ARCH_F32
    return rc;
}

static int default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

/* Generate every tensor of the (resolved) model p into w. */
static int gen_weights(gguf_writer *w, const kvc_gen_params *p, const kvc_gen_vocab_info *vi,
                       kvc_err *err)
{
    int n_tensors = 0, rc = KVC_OK;
    int n_threads = p->n_threads ? p->n_threads : default_threads();
    uint8_t *quiet = malloc((size_t)vi->n_vocab);                     /* [n_vocab] */
    for (int32_t i = 0; quiet && i < vi->n_vocab; i++)
        quiet[i] = !p->all_tokens && kvc_gen_token_quiet(p->vocab, vi->n_real, i);
    gen_tensor *ts = quiet ? plan_tensors(p, vi->n_vocab, quiet, &n_tensors) : NULL;
    int64_t max_ne0 = 0, max_n = 0;
    for (int i = 0; ts && i < n_tensors; i++) {
        max_ne0 = KVC_MAX(max_ne0, ts[i].ne[0]);
        max_n = KVC_MAX(max_n, ts[i].ne[0] * ts[i].rows);
    }
    kvc_threadpool *tp = NULL;
    bool parallel = n_threads > 1 && max_n >= GEN_PARALLEL_MIN;
    if (ts && parallel)
        tp = kvc_threadpool_new(n_threads);
    float **scratch = ts && (tp || !parallel) ? calloc((size_t)n_threads, sizeof(float *)) : NULL;
    for (int i = 0; scratch && i < n_threads; i++)                    /* [n_threads][max_ne0] */
        if (!(scratch[i] = malloc((size_t)max_ne0 * sizeof(float))))
            rc = KVC_ERR_NOMEM;
    if (!scratch || rc != KVC_OK)
        rc = kvc_fail(err, KVC_ERR_NOMEM, "cannot allocate the generator's buffers");
    for (int i = 0; rc == KVC_OK && i < n_tensors; i++)
        rc = gen_tensor_add(w, &ts[i], p->seed, tp, scratch, err);
    for (int i = 0; scratch && i < n_threads; i++)
        free(scratch[i]);
    free(scratch);
    kvc_threadpool_free(tp);
    free(ts);
    free(quiet);
    return rc;
}

/* Build the whole file in a writer (*out, the caller's to free). */
static int gen_build(const kvc_gen_params *user, gguf_writer **out, kvc_err *err)
{
    kvc_gen_params p;
    int rc = resolve_params(user, &p, err);
    if (rc != KVC_OK)
        return rc;
    gguf_writer *w = gguf_writer_new();
    if (!w)
        return kvc_fail(err, KVC_ERR_NOMEM, "cannot allocate the GGUF writer");
    kvc_gen_vocab_info vi;
    rc = write_hparams(w, &p);
    if (rc != KVC_OK)
        kvc_fail(err, rc, "writing the hyperparameters: %s", kvc_strerror(rc));
    else
        rc = kvc_gen_vocab_write(w, &p, &vi, err);
    if (rc == KVC_OK && !p.vocab_only)
        rc = gen_weights(w, &p, &vi, err);
    if (rc != KVC_OK) {
        gguf_writer_free(w);
        return rc;
    }
    *out = w;
    return KVC_OK;
}

int kvc_gen_model(const kvc_gen_params *p, const char *path, kvc_err *err)
{
    if (!p || !path)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "kvc_gen_model: NULL argument");
    gguf_writer *w = NULL;
    int rc = gen_build(p, &w, err);
    if (rc == KVC_OK)
        rc = gguf_writer_write(w, path, err);
    gguf_writer_free(w);
    return rc;
}

int kvc_gen_write(const kvc_gen_params *p, const char *path, char *err, size_t err_size)
{
    kvc_err e = { 0 };
    int rc = kvc_gen_model(p, path, &e);
    if (rc != KVC_OK && err && err_size > 0)
        snprintf(err, err_size, "%s", e.msg[0] ? e.msg : kvc_strerror(rc));
    return rc;
}

int kvc_gen_model_memory(const kvc_gen_params *p, void **out, size_t *out_size, kvc_err *err)
{
    if (!p || !out || !out_size)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "kvc_gen_model_memory: NULL argument");
    *out = NULL;
    gguf_writer *w = NULL;
    int rc = gen_build(p, &w, err);
    if (rc == KVC_OK)
        rc = gguf_writer_to_memory(w, out, out_size, err);
    gguf_writer_free(w);
    return rc;
}
