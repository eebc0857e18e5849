/* model_gen_params.c - what a generated model is: its parameters checked and
 * their defaults filled in, each layer's kind, and the metadata keys written
 * from them (the architecture's hyperparameters). The tensors are
 * model_gen.c's. */
#include "model_gen_params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "arch.h"
#include "forward.h"

/* ---------------------------------------------------------------- validate */

const kvc_arch *kvc_gen_arch(const char *name)
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
    const kvc_arch *a = kvc_gen_arch(q->arch);
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

bool kvc_gen_slides(const kvc_gen_params *p, int l)
{
    const kvc_arch *a = kvc_gen_arch(p->arch);
    const int per = p->swa_pattern ? p->swa_pattern : a->swa_period;
    return a->ffn == KVC_FFN_MOE_DENSE && p->n_swa > 0 && (per == 0 || l % per < per - 1);
}

int32_t kvc_gen_head_dim(const kvc_gen_params *p, int l)
{
    return kvc_gen_slides(p, l) ? p->head_dim_swa : p->head_dim;
}

char kvc_gen_kind(const kvc_gen_params *p, int l)
{
    const char *pat = p->layer_pattern && *p->layer_pattern ? p->layer_pattern : "M-M*";
    if (!kvc_gen_arch(p->arch)->one_kind_per_layer)
        return 0;
    const char k = pat[l % (int)strlen(pat)];
    return k == 'E' ? '-' : k;
}

bool kvc_gen_has_ffn(const kvc_gen_params *p, int l)
{
    return !kvc_gen_arch(p->arch)->one_kind_per_layer || kvc_gen_kind(p, l) == '-';
}

bool kvc_gen_layer_moe(const kvc_gen_params *p, int l, bool moe)
{
    return moe && kvc_gen_has_ffn(p, l) && l >= p->n_dense_lead;
}

/* The numbers of a comma-separated list `s` (NULL: none), each in
 * [lo, GEN_MAX_DIM], at most GEN_MAX_LAYERS of them, into list: how many,
 * or -1 when one is malformed or out of range, or a given list is empty. */
static int int_list(const char *s, long lo, int32_t *list)
{
    int n = 0;
    for (const char *c = s; c && *c && n < GEN_MAX_LAYERS;) {
        char *end;
        long v = strtol(c, &end, 10);
        if (end == c || v < lo || v > GEN_MAX_DIM || (*end && *end != ','))
            return -1;
        list[n++] = (int32_t)v;
        c = *end ? end + 1 : end;
    }
    return s && n == 0 ? -1 : n;
}

int kvc_gen_layer_kv_heads(const kvc_gen_params *p, int32_t *kv)
{
    const kvc_arch *a = kvc_gen_arch(p->arch);
    int32_t list[GEN_MAX_LAYERS];
    const int n = int_list(p->kv_heads, 0, list);
    if (n < 0)
        return -1;
    for (int l = 0; l < p->n_layer && l < GEN_MAX_LAYERS; l++)
        kv[l] = a->one_kind_per_layer         ? (kvc_gen_kind(p, l) == '*' ? p->n_head_kv : 0)
              : a->layers == kvc_gdn_layers   ? ((l + 1) % p->full_attn_interval ? 0 : p->n_head_kv)
              : kvc_gen_slides(p, l)              ? p->n_head_kv_swa
              : a->recurrent == KVC_ATTN_FULL ? p->n_head_kv
              : n > 0                         ? list[l % n]
              : l % 2                         ? p->n_head_kv : 0;
    return n;
}

int kvc_gen_layer_ff(const kvc_gen_params *p, int32_t *ff)
{
    int32_t list[GEN_MAX_LAYERS];
    const int n = int_list(p->ff_layers, 1, list);
    int differ = 0;
    if (n < 0)
        return -1;
    int32_t first = 0;
    for (int l = 0; l < p->n_layer && l < GEN_MAX_LAYERS; l++) {
        const bool wide = p->double_wide_mlp && l >= p->n_layer - p->n_kv_shared;
        const int64_t w = (int64_t)(n > 0 ? list[l % n] : p->n_ff) * (wide ? 2 : 1);
        if (kvc_gen_has_ffn(p, l) && (w < 1 || w > GEN_MAX_DIM))
            return -1;
        ff[l] = kvc_gen_has_ffn(p, l) ? (int32_t)w : 0;
        if (ff[l] && first && ff[l] != first)
            differ = 1;
        first = first ? first : ff[l];
    }
    return differ;
}

/* The hybrid rows' parameters (lfm2, granitehybrid): defaults filled in,
 * the per-layer KV heads valid, at least one attention layer. */
static int check_hybrid(kvc_gen_params *q, kvc_err *err)
{
    const kvc_arch *a = kvc_gen_arch(q->arch);
    int32_t kv[GEN_MAX_LAYERS];
    int rc, n = kvc_gen_layer_kv_heads(q, kv);
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
    if (kvc_gen_arch(q->arch)->ffn != KVC_FFN_MOE_DENSE)
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

bool kvc_gen_moe(const kvc_gen_params *p)
{
    const kvc_arch *a = kvc_gen_arch(p->arch);
    return a->ffn_by_experts ? p->n_expert > 0 : a->ffn == KVC_FFN_MOE;
}

int kvc_gen_resolve(const kvc_gen_params *p, kvc_gen_params *q, kvc_err *err)
{
    if (!p->vocab || (strcasecmp(p->vocab, "bpe") != 0 && strcasecmp(p->vocab, "spm") != 0))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "vocab \"%s\": expected \"bpe\" or \"spm\"",
                        p->vocab ? p->vocab : "(null)");
    if (!kvc_gen_arch(p->arch)) {
        char known[128];
        kvc_arch_names(known, sizeof(known));
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "arch \"%s\": expected one of %s",
                        p->arch ? p->arch : "(null)", known);
    }
    if (!kvc_gen_ftype(p->ftype, NULL, NULL))
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
    if (kvc_gen_arch(q->arch)->ffn_by_experts && q->n_expert == 0)
        q->n_expert_used = 0;
    if (kvc_gen_moe(q) &&
        ((rc = check_dim("n_expert", q->n_expert, 1, 4096, err)) ||
         (rc = check_dim("n_expert_used", q->n_expert_used, 1, q->n_expert, err)) ||
         (rc = check_dim("n_ff_exp", q->n_ff_exp, 1, GEN_MAX_DIM, err))))
        return rc;
    if (kvc_gen_arch(q->arch)->layers == kvc_gdn_layers) {   /* Gated DeltaNet's shape; 0: default */
        q->ssm_d_conv = q->ssm_d_conv ? q->ssm_d_conv : 4;
        q->ssm_d_state = q->ssm_d_state ? q->ssm_d_state : 16;
        q->ssm_n_group = q->ssm_n_group ? q->ssm_n_group : 2;
        q->ssm_n_head = q->ssm_n_head ? q->ssm_n_head : 2 * q->ssm_n_group;
    }
    if (kvc_gen_arch(q->arch)->layers == kvc_gdn_layers &&
        ((rc = check_dim("ssm_d_conv", q->ssm_d_conv, 1, 16, err)) ||
         (rc = check_dim("ssm_d_state", q->ssm_d_state, 1, 1024, err)) ||
         (rc = check_dim("ssm_n_group", q->ssm_n_group, 1, GEN_MAX_DIM, err)) ||
         (rc = check_dim("ssm_n_head", q->ssm_n_head, q->ssm_n_group, GEN_MAX_DIM, err)) ||
         (rc = check_dim("full_attn_interval", q->full_attn_interval, 1, GEN_MAX_LAYERS, err))))
        return rc;
    if (kvc_gen_arch(q->arch)->layers == kvc_gdn_layers && q->ssm_n_head % q->ssm_n_group != 0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "ssm_n_head %d (V heads) is not a multiple of "
                        "ssm_n_group %d (K heads)", (int)q->ssm_n_head, (int)q->ssm_n_group);
    if (kvc_gen_arch(q->arch)->layers == kvc_gdn_layers)
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
    if (q->double_wide_mlp && kvc_gen_arch(q->arch)->ffn != KVC_FFN_MOE_DENSE)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "double_wide_mlp: arch \"%s\" has no KV-shared layers "
                        "(gemma4)", q->arch);
    int32_t ff[GEN_MAX_LAYERS];
    if (kvc_gen_layer_ff(q, ff) < 0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "ff_layers \"%s\": expected comma-separated widths "
                        "1..%d (doubled on the KV-shared layers with double_wide_mlp)",
                        q->ff_layers ? q->ff_layers : "", GEN_MAX_DIM);
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

/* ------------------------------------------------------------------- keys */

int kvc_gen_write_keys(gguf_writer *w, const kvc_gen_params *p)
{
    uint32_t file_type = 0;
    bool quantized = false;
    kvc_gen_ftype(p->ftype, &file_type, &quantized);
    char name[96], key[96];
    if (p->name)
        snprintf(name, sizeof(name), "%s", p->name);
    else
        snprintf(name, sizeof(name), "random-%s-%dL-%dd", p->arch, (int)p->n_layer, (int)p->n_embd);
    int rc = gguf_writer_set_str(w, "general.architecture", p->arch);
    if (!rc) rc = gguf_writer_set_str(w, "general.name", name);
    if (!rc) rc = gguf_writer_set_u32(w, "general.file_type", file_type);
    if (!rc && quantized)
        rc = gguf_writer_set_u32(w, "general.quantization_version", 2);
#define ARCH_U32(suffix, v) if (!rc) { snprintf(key, sizeof(key), "%s." suffix, p->arch); \
                                        rc = gguf_writer_set_u32(w, key, (uint32_t)(v)); }
#define ARCH_F32(suffix, v) if (!rc) { snprintf(key, sizeof(key), "%s." suffix, p->arch); \
                                        rc = gguf_writer_set_f32(w, key, (v)); }
    ARCH_U32("vocab_size", p->n_vocab);
    ARCH_U32("context_length", p->n_ctx);
    ARCH_U32("embedding_length", p->n_embd);
    ARCH_U32("block_count", p->n_layer);
    int32_t ff[GEN_MAX_LAYERS];
    const bool ff_differ = kvc_gen_layer_ff(p, ff) > 0;   /* valid: kvc_gen_resolve */
    if (kvc_gen_arch(p->arch)->one_kind_per_layer)   /* llama.cpp requires it (MTP head) */
        ARCH_F32("attention.layer_norm_epsilon", p->rms_eps);
    if (kvc_gen_arch(p->arch)->one_kind_per_layer || ff_differ) {   /* per layer: 0 = a mixer layer */
        snprintf(key, sizeof(key), "%s.feed_forward_length", p->arch);
        if (!rc)
            rc = gguf_writer_set_arr(w, key, GGUF_TYPE_INT32, ff, (uint64_t)p->n_layer);
    } else {
        ARCH_U32("feed_forward_length", ff[0]);
    }
    ARCH_U32("attention.head_count", p->n_head);
    const bool g4 = kvc_gen_arch(p->arch)->ffn == KVC_FFN_MOE_DENSE;
    if (kvc_gen_arch(p->arch)->recurrent != KVC_ATTN_FULL || g4) {   /* per layer: 0 = recurrent */
        int32_t kv[GEN_MAX_LAYERS];
        kvc_gen_layer_kv_heads(p, kv);
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
    if (kvc_gen_moe(p)) {
        ARCH_U32("expert_count", p->n_expert);
        ARCH_U32("expert_used_count", p->n_expert_used);
        if (!kvc_gen_arch(p->arch)->ff_exp_is_ff)
            ARCH_U32("expert_feed_forward_length", p->n_ff_exp);
        if (p->n_ff_shexp > 0)
            ARCH_U32("expert_shared_feed_forward_length", p->n_ff_shexp);
        if (p->expert_weights_scale != 0.0f)
            ARCH_F32("expert_weights_scale", p->expert_weights_scale);
        if (p->expert_weights_norm && !rc) {
            snprintf(key, sizeof(key), "%s.expert_weights_norm", p->arch);
            rc = gguf_writer_set_bool(w, key, true);
        }
        if (kvc_gen_arch(p->arch)->recurrent == KVC_ATTN_SHORTCONV) {   /* lfm2moe */
            ARCH_U32("expert_gating_func", KVC_GATING_SIGMOID);
            ARCH_U32("leading_dense_block_count", p->n_dense_lead);
        }
    }
    if (kvc_gen_arch(p->arch)->layers == kvc_gdn_layers && !kvc_gen_arch(p->arch)->gdn_v_grouped) {
        /* IMRoPE sections (t, h, w, e) of the rotated pairs, as Qwen3.5's [11, 11, 10, 0] */
        const int32_t half = (p->n_rot ? p->n_rot : p->head_dim) / 2;
        const int32_t sec[4] = { (half + 2) / 3, (half + 1) / 3, half / 3, 0 };
        if (!rc) { snprintf(key, sizeof(key), "%s.rope.dimension_sections", p->arch);
                   rc = gguf_writer_set_arr(w, key, GGUF_TYPE_INT32, sec, 4); }
    }
    if (kvc_gen_arch(p->arch)->layers == kvc_gdn_layers)
        ARCH_U32("full_attention_interval", p->full_attn_interval);
    if (kvc_gen_arch(p->arch)->recurrent == KVC_ATTN_SHORTCONV)
        ARCH_U32("shortconv.l_cache", p->conv_l);
    if (kvc_gen_arch(p->arch)->recurrent == KVC_ATTN_MAMBA2 || kvc_gen_arch(p->arch)->layers == kvc_gdn_layers) {
        ARCH_U32("ssm.conv_kernel", p->ssm_d_conv);
        ARCH_U32("ssm.inner_size", p->ssm_d_inner);
        ARCH_U32("ssm.state_size", p->ssm_d_state);
        ARCH_U32("ssm.time_step_rank", p->ssm_n_head);
        ARCH_U32("ssm.group_count", p->ssm_n_group);
    }
    if (kvc_gen_arch(p->arch)->rope_finetuned_switch) {
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
            slides[l] = kvc_gen_slides(p, l);
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
