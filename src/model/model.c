/* model.c - loading a GGUF model: hyperparameters, tensor binding, validation. */
#include "model.h"
#include "quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------- hyperparameters */

/* rope.scaling.type: absent is "none"; a type kvc_rope_scaling lacks is refused
 * (running it unscaled would give other logits). */
static int read_rope_scaling(const gguf_file *f, const char *key, int32_t *out, kvc_err *err)
{
    char *s = NULL;
    int rc = gguf_get_str(f, key, &s, err);
    *out = KVC_ROPE_NONE;
    if (rc == KVC_ERR_NOT_FOUND)
        return KVC_OK;
    if (rc)
        return rc;
    if (strcmp(s, "linear") == 0)
        *out = KVC_ROPE_LINEAR;
    else if (strcmp(s, "yarn") == 0)
        *out = KVC_ROPE_YARN;
    else if (strcmp(s, "none") != 0)
        rc = kvc_fail(err, KVC_ERR_UNSUPPORTED, "metadata key %s: RoPE scaling '%.32s' not supported", key, s);
    free(s);
    return rc;
}

/* A per-layer array of a KVC_KEY_U32_LAYERS key (block_count read before):
 * n_layer integers in [0, INT32_MAX]; the field gets the largest (the
 * layers' own values are read by layer_u32). */
static int read_layer_array(const gguf_kv *kv, const char *key, const kvc_hparams *hp, int32_t *field,
                            kvc_err *err)
{
    const uint32_t et = kv->v.arr.type;
    if (et == GGUF_TYPE_FLOAT32 || et == GGUF_TYPE_FLOAT64 || et == GGUF_TYPE_STRING || et == GGUF_TYPE_BOOL ||
        kv->v.arr.n != (uint64_t)hp->n_layer)
        return kvc_fail(err, KVC_ERR_FORMAT, "metadata key %s: expected %d integers (one per layer), "
                        "got an array of %llu", key, hp->n_layer, (unsigned long long)kv->v.arr.n);
    int64_t max = 0;
    for (uint64_t i = 0; i < kv->v.arr.n; i++) {
        const int64_t v = gguf_arr_i64(kv, i);
        if (v < 0 || v > INT32_MAX)
            return kvc_fail(err, KVC_ERR_FORMAT, "metadata key %s: layer %llu: %lld out of range", key,
                            (unsigned long long)i, (long long)v);
        max = KVC_MAX(max, v);
    }
    *field = (int32_t)max;
    return KVC_OK;
}

/* Layer il's value of a KVC_KEY_U32_LAYERS key "{arch}.{suffix}": its entry
 * when the key is an array (validated by read_layer_array), else `scalar`. */
static int32_t layer_u32(const kvc_model *m, const char *suffix, int il, int32_t scalar)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", m->hp.arch->name, suffix);
    const gguf_kv *kv = gguf_find_kv(m->gguf, key);
    return kv && kv->type == GGUF_TYPE_ARRAY ? (int32_t)gguf_arr_i64(kv, (uint64_t)il) : scalar;
}

/* One key of the row into its field; absent optional keys take their default
 * (NAN: leave the row's default in place). */
static int read_key(const gguf_file *f, const char *an, const kvc_arch_key *k, kvc_hparams *hp,
                    kvc_err *err)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", an, k->suffix);
    void *field = (uint8_t *)hp + k->field;
    uint32_t u = 0;
    float x = 0.0f;
    bool b = false;
    if (k->type == KVC_KEY_ROPE_SCALING)
        return read_rope_scaling(f, key, field, err);
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (k->type == KVC_KEY_U32_LAYERS && kv && kv->type == GGUF_TYPE_ARRAY)
        return read_layer_array(kv, key, hp, field, err);
    if (k->type == KVC_KEY_SWA_PATTERN && kv && kv->type == GGUF_TYPE_ARRAY) {
        const uint32_t et = kv->v.arr.type;
        if (et == GGUF_TYPE_FLOAT32 || et == GGUF_TYPE_FLOAT64 || et == GGUF_TYPE_STRING ||
            kv->v.arr.n != (uint64_t)hp->n_layer)
            return kvc_fail(err, KVC_ERR_FORMAT, "metadata key %s: expected %d booleans (one per layer), "
                            "got an array of %llu", key, hp->n_layer, (unsigned long long)kv->v.arr.n);
        *(int32_t *)field = KVC_SWA_PER_LAYER;
        hp->swa_layers = true;
        return KVC_OK;
    }
    const bool u32 = k->type == KVC_KEY_U32 || k->type == KVC_KEY_U32_LAYERS || k->type == KVC_KEY_SWA_PATTERN;
    int rc = u32 ? gguf_get_u32(f, key, &u, err)
           : k->type == KVC_KEY_F32 ? gguf_get_f32(f, key, &x, err)
                                    : gguf_get_bool(f, key, &b, err);
    if (rc == KVC_ERR_NOT_FOUND && k->required)
        return kvc_fail(err, rc, "metadata key %s missing", key);
    if (rc == KVC_ERR_NOT_FOUND) {
        if (isnan(k->def))
            return KVC_OK;
        u = (uint32_t)k->def, x = k->def, b = k->def != 0.0f;
    } else if (rc) {
        return rc;
    }
    if (k->type != KVC_KEY_F32 && k->type != KVC_KEY_BOOL && u > (uint32_t)INT32_MAX)
        return kvc_fail(err, KVC_ERR_FORMAT, "metadata key %s: %u out of range", key, u);
    if (k->type != KVC_KEY_F32 && k->type != KVC_KEY_BOOL)
        *(int32_t *)field = (int32_t)u;
    else if (k->type == KVC_KEY_F32)
        *(float *)field = x;
    else
        *(bool *)field = b;
    return KVC_OK;
}

/* The row of the file's architecture, or an error naming it. */
static int find_arch(const gguf_file *f, const kvc_arch **out, kvc_err *err)
{
    char *name = NULL;
    int rc = gguf_get_str(f, "general.architecture", &name, err);
    if (rc == KVC_ERR_NOT_FOUND)
        return kvc_fail(err, rc, "metadata key general.architecture missing");
    if (rc)
        return rc;
    const kvc_arch *a = kvc_arch_find(name);
    char known[128];
    kvc_arch_names(known, sizeof(known));
    if (!a)
        rc = kvc_fail(err, KVC_ERR_UNSUPPORTED, "architecture '%.64s' not supported (%s)", name, known);
    else if (a->unsupported)
        rc = kvc_fail(err, KVC_ERR_UNSUPPORTED, "architecture %s: %s", a->name, a->unsupported);
    free(name);
    *out = a;
    return rc;
}

/* The recurrent layers' shapes (kvc_arch.recurrent), when the row has them. */
static int check_recurrent(const kvc_hparams *hp, kvc_err *err)
{
    const int32_t lim = 1 << 20;
    if (hp->arch->recurrent == KVC_ATTN_SHORTCONV && (hp->shortconv_l < 2 || hp->shortconv_l > 64))
        return kvc_fail(err, KVC_ERR_FORMAT, "bad short convolution: l_cache %d (2..64)", hp->shortconv_l);
    if (hp->arch->recurrent == KVC_ATTN_MAMBA2 &&
        (hp->ssm_d_conv < 1 || hp->ssm_d_conv > 64 || hp->ssm_d_inner <= 0 || hp->ssm_d_inner > lim ||
         hp->ssm_d_state <= 0 || hp->ssm_d_state > 4096 || hp->ssm_n_head <= 0 || hp->ssm_n_group <= 0 ||
         hp->ssm_d_inner % hp->ssm_n_head != 0 || hp->ssm_n_head % hp->ssm_n_group != 0))
        return kvc_fail(err, KVC_ERR_FORMAT,
                        "bad Mamba-2 shape: conv kernel %d, inner size %d, state size %d, %d heads, %d groups",
                        hp->ssm_d_conv, hp->ssm_d_inner, hp->ssm_d_state, hp->ssm_n_head, hp->ssm_n_group);
    return KVC_OK;
}

static int load_hparams(const gguf_file *f, kvc_hparams *hp, kvc_err *err)
{
    const kvc_arch *a = NULL;
    int rc = find_arch(f, &a, err);
    if (rc)
        return rc;
    memset(hp, 0, sizeof(*hp));
    hp->arch = a;
    snprintf(hp->arch_name, sizeof(hp->arch_name), "%s", a->name);
    hp->rope_neox = a->rope_neox;
    hp->moe_gating = a->gating;
    hp->moe_norm_w = a->moe_norm_w;
    hp->ffn_act = a->act;
    hp->swa_period = a->swa_period;
    hp->rope_finetuned = true;
    for (const kvc_arch_key *const *list = a->keys; *list; list++)
        for (const kvc_arch_key *k = *list; k->suffix; k++)
            if ((rc = read_key(f, a->name, k, hp, err)))
                return rc;
    if (hp->n_head_kv == 0)
        hp->n_head_kv = hp->n_head;
    if (hp->n_layer_nextn < 0 || hp->n_layer_nextn >= hp->n_layer)
        return kvc_fail(err, KVC_ERR_FORMAT, "bad nextn_predict_layers %d of %d layers",
                        hp->n_layer_nextn, hp->n_layer);
    hp->n_layer -= hp->n_layer_nextn;   /* the MTP blocks are not part of the main pass */
    const int32_t lim = 1 << 20;
    const bool moe = a->ffn_by_experts ? hp->n_expert > 0 : a->ffn == KVC_FFN_MOE;
    if (hp->n_embd <= 0 || hp->n_embd > lim || hp->n_layer <= 0 || hp->n_layer > 4096 ||
        hp->n_head <= 0 || hp->n_head > 4096 || hp->n_head_kv > hp->n_head ||
        hp->n_head % hp->n_head_kv != 0 || (!moe && (hp->n_ff <= 0 || hp->n_ff > lim)))
        return kvc_fail(err, KVC_ERR_FORMAT,
                        "bad hyperparameters: n_embd %d, layers %d, heads %d, kv heads %d, n_ff %d",
                        hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, hp->n_ff);
    if (moe) {
        if (a->ff_exp_is_ff)
            hp->n_ff_exp = hp->n_ff;
        if (hp->n_ff_exp == 0 && hp->n_expert_used > 0)
            hp->n_ff_exp = hp->n_ff / hp->n_expert_used;       /* llama.cpp's fallback */
        if (hp->n_ff_shexp == 0)
            hp->n_ff_shexp = hp->n_ff_exp;
        if (hp->n_expert <= 0 || hp->n_expert > 4096 || hp->n_expert_used <= 0 ||
            hp->n_expert_used > hp->n_expert || hp->n_ff_exp <= 0 || hp->n_ff_exp > lim ||
            hp->n_ff_shexp > lim)
            return kvc_fail(err, KVC_ERR_FORMAT, "bad expert hyperparameters: %d experts, %d used, width %d",
                            hp->n_expert, hp->n_expert_used, hp->n_ff_exp);
        if (hp->moe_gating < KVC_GATING_SOFTMAX || hp->moe_gating > KVC_GATING_SOFTMAX_WEIGHT)
            return kvc_fail(err, KVC_ERR_UNSUPPORTED, "expert gating function %d not supported",
                            hp->moe_gating);
        if (hp->moe_latent > 0)
            return kvc_fail(err, KVC_ERR_UNSUPPORTED, "moe_latent_size %d: experts in a latent space "
                            "(Nemotron 3 Super) are not supported yet", hp->moe_latent);
        if (hp->n_layer_dense_lead < 0 || hp->n_layer_dense_lead > hp->n_layer ||
            (hp->n_layer_dense_lead > 0 && (hp->n_ff <= 0 || hp->n_ff > lim)))
            return kvc_fail(err, KVC_ERR_FORMAT, "bad leading_dense_block_count %d of %d layers (n_ff %d)",
                            hp->n_layer_dense_lead, hp->n_layer, hp->n_ff);
    }
    if (hp->head_dim == 0)
        hp->head_dim = hp->n_embd / hp->n_head;
    if (hp->value_dim == 0)
        hp->value_dim = hp->head_dim;
    if (hp->head_dim != hp->value_dim || hp->head_dim == 0 || hp->head_dim % 2 != 0 || hp->head_dim > 1024)
        return kvc_fail(err, KVC_ERR_UNSUPPORTED, "head dimension %d (value %d) not supported",
                        hp->head_dim, hp->value_dim);
    if (!(hp->rms_eps > 0.0f) || !(hp->rope_theta > 0.0f))
        return kvc_fail(err, KVC_ERR_FORMAT, "bad rms epsilon %g or rope base %g",
                        hp->rms_eps, hp->rope_theta);
    if (hp->n_ctx_train == 0)
        hp->n_ctx_train = 4096;
    if (hp->n_rot == 0)
        hp->n_rot = hp->head_dim;
    if (hp->n_rot < 2 || hp->n_rot % 2 != 0 || hp->n_rot > hp->head_dim)
        return kvc_fail(err, KVC_ERR_UNSUPPORTED, "rope dimension count %d of head dimension %d not supported",
                        hp->n_rot, hp->head_dim);
    if (hp->rope_scaling != KVC_ROPE_NONE && !(hp->rope_factor > 1.0f))
        hp->rope_scaling = KVC_ROPE_NONE;   /* a factor of 1 (or none) scales nothing */
    if (hp->rope_orig_ctx == 0)
        hp->rope_orig_ctx = hp->n_ctx_train;
    if (hp->head_dim_swa == 0)
        hp->head_dim_swa = hp->head_dim;
    if (hp->value_dim_swa == 0)
        hp->value_dim_swa = hp->head_dim_swa;
    if (hp->n_rot_swa == 0)
        hp->n_rot_swa = KVC_MIN(hp->n_rot, hp->head_dim_swa);
    if (hp->head_dim_swa != hp->value_dim_swa || hp->head_dim_swa % 2 != 0 || hp->head_dim_swa > 1024 ||
        hp->n_rot_swa < 2 || hp->n_rot_swa % 2 != 0 || hp->n_rot_swa > hp->head_dim_swa)
        return kvc_fail(err, KVC_ERR_UNSUPPORTED, "sliding layers' head dimension %d (value %d, rope %d) "
                        "not supported", hp->head_dim_swa, hp->value_dim_swa, hp->n_rot_swa);
    if (hp->n_embd_per_layer < 0 || hp->n_embd_per_layer > lim / KVC_MAX(hp->n_layer, 1))
        return kvc_fail(err, KVC_ERR_FORMAT, "bad embedding_length_per_layer_input %d", hp->n_embd_per_layer);
    if (hp->n_kv_shared < 0 || (hp->n_kv_shared > 0 && hp->n_kv_shared > hp->n_layer - 2))
        return kvc_fail(err, KVC_ERR_FORMAT, "attention.shared_kv_layers %d of %d layers: at least 2 must "
                        "keep their K/V", hp->n_kv_shared, hp->n_layer);
    if (hp->n_swa < 0 || (hp->swa_period < 0 && !hp->swa_layers) || !(hp->rope_theta_swa >= 0.0f) ||
        !(hp->logit_softcap >= 0.0f))
        return kvc_fail(err, KVC_ERR_FORMAT, "bad sliding window %d (pattern %d), rope base %g or soft-cap %g",
                        hp->n_swa, hp->swa_period, hp->rope_theta_swa, hp->logit_softcap);
    if (hp->rope_theta_swa == 0.0f)
        hp->rope_theta_swa = a->swa_rope_as_global ? hp->rope_theta : 10000.0f;
    if (a->emb_scale_sqrt)
        hp->emb_scale = sqrtf((float)hp->n_embd);
    return check_recurrent(hp, err);
}

/* Whether layer il slides: its entry of a per-layer sliding_window_pattern
 * (validated by read_key), else llama.cpp's set_swa_pattern rule. */
static bool layer_slides(const kvc_model *m, int il)
{
    const kvc_hparams *hp = &m->hp;
    const int p = hp->swa_period;
    if (hp->swa_layers) {
        char key[128];
        snprintf(key, sizeof(key), "%s.attention.sliding_window_pattern", hp->arch->name);
        return hp->n_swa > 0 && gguf_arr_i64(gguf_find_kv(m->gguf, key), (uint64_t)il) != 0;
    }
    return hp->n_swa > 0 && (p == 0 || il % p < p - 1);
}

/* Layer il's FFN: the row's; with ffn_by_experts, experts when the model has
 * them (Gemma 4: beside the dense FFN, on the layers that have a router). */
static kvc_ffn_kind layer_ffn(const kvc_model *m, int il)
{
    const kvc_arch *a = m->hp.arch;
    char name[64];
    if (!a->ffn_by_experts)
        return a->ffn == KVC_FFN_MOE && il < m->hp.n_layer_dense_lead ? KVC_FFN_DENSE : a->ffn;
    if (m->hp.n_expert == 0 || il < m->hp.n_layer_dense_lead)
        return KVC_FFN_DENSE;
    if (a->ffn != KVC_FFN_MOE_DENSE)
        return KVC_FFN_MOE;
    snprintf(name, sizeof(name), "blk.%d.ffn_gate_inp.weight", il);
    return gguf_find_tensor(m->gguf, name) ? KVC_FFN_MOE_DENSE : KVC_FFN_DENSE;
}

/* The floats of one sequence's state in a recurrent layer of kind k (kv.h):
 * the convolution's last inputs, then the recurrent state. */
static int64_t state_floats(const kvc_hparams *hp, kvc_attn_kind k)
{
    const int64_t conv = (int64_t)hp->ssm_d_inner + 2 * (int64_t)hp->ssm_n_group * hp->ssm_d_state;
    switch (k) {
    case KVC_ATTN_SHORTCONV: return (int64_t)(hp->shortconv_l - 1) * hp->n_embd;
    case KVC_ATTN_MAMBA2:    return (int64_t)(hp->ssm_d_conv - 1) * conv + (int64_t)hp->ssm_d_inner * hp->ssm_d_state;
    default:                 return 0;
    }
}

/* kvc_arch.one_kind_per_layer (nemotron_h): layer il is an FFN alone (of
 * its own width L->n_ff; experts when the model has them) where its
 * feed_forward_length is > 0, else its mixer alone. The pool gives an FFN
 * layer no K/V (context.c's memory groups). */
static void one_kind(kvc_layer *L)
{
    if (L->n_ff == 0)
        L->ffn = KVC_FFN_NONE;
    else
        L->attn = KVC_ATTN_NONE;
}

/* Every layer's kinds and attention shape: full or sliding by the pattern,
 * the sliding layers with their own RoPE base (and rotation, forward.c); a
 * layer of no KV heads (a per-layer head_count_kv) is the row's recurrent
 * kind, with its state. */
static int layer_hparams(kvc_model *m, kvc_err *err)
{
    const kvc_hparams *hp = &m->hp;
    const int32_t per_head = hp->arch->attn_scale_embd_layers == hp->n_layer ? hp->n_embd / hp->n_head
                                                                             : hp->head_dim;
    for (int il = 0; il < hp->n_layer; il++) {
        kvc_layer *L = &m->layers[il];
        const bool slides = layer_slides(m, il);
        L->attn = slides ? KVC_ATTN_WINDOW : KVC_ATTN_FULL;
        L->ffn = layer_ffn(m, il);
        L->n_head = hp->n_head;
        L->n_head_kv = layer_u32(m, "attention.head_count_kv", il, hp->n_head_kv);
        L->head_dim = slides ? hp->head_dim_swa : hp->head_dim;
        L->n_rot = slides ? hp->n_rot_swa : hp->n_rot;
        L->rope_theta = slides ? hp->rope_theta_swa : hp->rope_theta;
        L->window = slides ? hp->n_swa : 0;
        L->rope = slides ? 1 : 0;
        L->attn_scale = hp->attn_scale > 0.0f ? hp->attn_scale
                      : hp->arch->attn_scale > 0.0f ? hp->arch->attn_scale : 1.0f / sqrtf((float)per_head);
        L->v_norm = hp->arch->v_norm;
        L->kv_layer = il;
        L->no_rope = hp->arch->nope || (hp->arch->rope_finetuned_switch && !hp->rope_finetuned);
        if (L->n_head_kv == 0 && hp->arch->recurrent == KVC_ATTN_FULL)
            return kvc_fail(err, KVC_ERR_FORMAT, "layer %d: no KV heads, and %s has no recurrent layers",
                            il, hp->arch->name);
        L->n_ff = layer_u32(m, "feed_forward_length", il, hp->n_ff);
        if (hp->arch->one_kind_per_layer)
            one_kind(L);
        else if ((L->ffn == KVC_FFN_DENSE || L->ffn == KVC_FFN_MOE_DENSE) && L->n_ff == 0)
            return kvc_fail(err, KVC_ERR_FORMAT, "layer %d: feed_forward_length 0 for a dense FFN", il);
        if (L->attn == KVC_ATTN_NONE) {
            L->window = 0;
        } else if (L->n_head_kv == 0) {
            L->attn = hp->arch->recurrent;
            L->window = 0;
            L->state_floats = state_floats(hp, L->attn);
        } else if (L->n_head_kv > L->n_head || L->n_head % L->n_head_kv != 0) {
            return kvc_fail(err, KVC_ERR_FORMAT, "layer %d: %d KV heads for %d heads", il, L->n_head_kv,
                            L->n_head);
        }
    }
    /* KV-shared layers read the last layer of their kind before them (llama.cpp's
     * reuse rule: the last two layers that keep K/V are a sliding and a full one) */
    const int32_t first = hp->n_layer - hp->n_kv_shared;
    for (int il = first; hp->n_kv_shared > 0 && il < hp->n_layer; il++) {
        kvc_layer *L = &m->layers[il];
        L->kv_layer = first - (L->attn == KVC_ATTN_WINDOW ? 2 : 1);
        const kvc_layer *S = &m->layers[L->kv_layer];
        if (S->attn != L->attn || S->head_dim != L->head_dim || S->n_head_kv != L->n_head_kv)
            return kvc_fail(err, KVC_ERR_FORMAT, "layer %d shares the K/V of layer %d, of another kind or "
                            "shape", il, L->kv_layer);
    }
    return KVC_OK;
}

/* ------------------------------------------------------------- tensors */

typedef struct binder {
    kvc_model *m;
    kvc_err   *err;
    float     *owned_next;    /* where the next converted 1-D weight goes */
    const gguf_tensor **used; /* (n_used) every tensor bound, to find those that were not */
    size_t     n_used, cap_used;
} binder;

/* Record that tensor t is read (check_all_used); false when out of memory. */
static bool mark_used(binder *b, const gguf_tensor *t)
{
    if (!kvc_grow((void **)&b->used, &b->cap_used, b->n_used, sizeof(*b->used)))
        return false;
    b->used[b->n_used++] = t;
    return true;
}

static int shape_error(kvc_err *err, const gguf_tensor *t, const char *name, const int64_t ne[3])
{
    return kvc_fail(err, KVC_ERR_FORMAT,
                    "tensor %s: shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld]", name,
                    (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                    (long long)t->ne[3], (long long)ne[0], (long long)ne[1], (long long)ne[2]);
}

/* The value of dimension d for layer L (NULL: a global tensor). */
static int64_t dim_of(const kvc_hparams *hp, const kvc_layer *L, uint8_t d)
{
    const int64_t hd = L ? L->head_dim : hp->head_dim;
    switch ((kvc_dim)d) {
    case KVC_D1:         return 1;
    case KVC_D_EMBD:     return hp->n_embd;
    case KVC_D_VOCAB:    return hp->n_vocab;
    case KVC_D_Q:        return (L ? L->n_head : hp->n_head) * hd;
    case KVC_D_KV:       return (L ? L->n_head_kv : hp->n_head_kv) * hd;
    case KVC_D_HEAD:     return hd;
    case KVC_D_HEADS:    return L ? L->n_head : hp->n_head;
    case KVC_D_FF:       return L ? L->n_ff : hp->n_ff;
    case KVC_D_EXP:      return hp->n_expert;
    case KVC_D_FF_EXP:   return hp->n_ff_exp;
    case KVC_D_FF_EXP2:  return 2 * (int64_t)hp->n_ff_exp;
    case KVC_D_FF_SHEXP: return hp->n_ff_shexp;
    case KVC_D_Q2:       return 2 * (int64_t)(L ? L->n_head : hp->n_head) * hd;
    case KVC_D_PLE:      return hp->n_embd_per_layer;
    case KVC_D_PLE_ALL:  return (int64_t)hp->n_embd_per_layer * hp->n_layer;
    case KVC_D_EMBD3:    return 3 * (int64_t)hp->n_embd;
    case KVC_D_CONV_L:   return hp->shortconv_l;
    case KVC_D_SSM_CONV_K:   return hp->ssm_d_conv;
    case KVC_D_SSM_CONV_DIM: return hp->ssm_d_inner + 2 * (int64_t)hp->ssm_n_group * hp->ssm_d_state;
    case KVC_D_SSM_IN:   return 2 * (int64_t)hp->ssm_d_inner + 2 * (int64_t)hp->ssm_n_group * hp->ssm_d_state +
                                hp->ssm_n_head;
    case KVC_D_SSM_INNER: return hp->ssm_d_inner;
    case KVC_D_SSM_HEADS: return hp->ssm_n_head;
    case KVC_D_SSM_STATE: return hp->ssm_d_state;
    case KVC_D_SSM_GROUPS: return hp->ssm_n_group;
    case KVC_D_SSM_GROUP_W: return hp->ssm_n_group ? hp->ssm_d_inner / hp->ssm_n_group : 0;
    case KVC_D_SSM_QKVZ: return 2 * (int64_t)hp->ssm_d_inner + 2 * (int64_t)hp->ssm_n_group * hp->ssm_d_state;
    case KVC_D_SSM_HEADS2: return 2 * (int64_t)hp->ssm_n_head;
    }
    return 0;
}

/* Bind tensor `name` of table entry t with shape ne to the field at base +
 * t->field: a float vector, a matrix or a stack of expert matrices. */
static int bind_one(binder *b, const kvc_arch_tensor *t, const char *name, const int64_t ne[3],
                    bool required, void *base)
{
    const gguf_tensor *g = gguf_find_tensor(b->m->gguf, name);
    void *field = (uint8_t *)base + t->field;
    if (!g)
        return required ? kvc_fail(b->err, KVC_ERR_NOT_FOUND, "tensor %s missing", name) : KVC_OK;
    if (!mark_used(b, g))
        return kvc_fail(b->err, KVC_ERR_NOMEM, "out of memory binding tensors");
    if (g->ne[0] != ne[0] || g->ne[1] != ne[1] || g->ne[2] != ne[2] || g->ne[3] != 1)
        return shape_error(b->err, g, name, ne);
    const kvc_type_traits *tr = kvc_type_info(g->type);
    if (!tr || !tr->supported)
        return kvc_fail(b->err, KVC_ERR_UNSUPPORTED, "tensor %s: type %u (%s) not supported",
                        name, g->type, tr ? tr->name : "unknown");
    const int64_t n = ne[0] * ne[1] * ne[2];
    b->m->n_params += (uint64_t)n;
    b->m->weight_bytes += g->size;
    if (t->is_float) {
        /* norm weights and biases as f32: in place when they are, else converted */
        const float **out = field;
        if (g->type == KVC_TYPE_F32 && ((uintptr_t)g->data & 3) == 0) {
            *out = g->data;
            return KVC_OK;
        }
        kvc_dequantize_row_ref(g->type, g->data, b->owned_next, n);
        *out = b->owned_next;
        b->owned_next += n;
        return KVC_OK;
    }
    kvc_weight w = { g->type, ne[0], ne[1], kvc_row_size(g->type, ne[0]), g->data };
    if (ne[2] == 1) {
        *(kvc_weight *)field = w;
    } else {
        kvc_experts *x = field;
        x->w = w;
        x->n = (int32_t)ne[2];
        x->stride = w.row_bytes * (size_t)ne[1];
    }
    return KVC_OK;
}

static bool applies(const kvc_arch_tensor *t, const kvc_layer *L)
{
    const bool attn = L->attn == KVC_ATTN_FULL || L->attn == KVC_ATTN_WINDOW;
    const bool recr = !attn && L->attn != KVC_ATTN_NONE;
    switch ((kvc_tensor_when)t->when) {
    case KVC_ON_ALL:   return true;
    case KVC_ON_DENSE: return L->ffn == KVC_FFN_DENSE;
    case KVC_ON_MOE:   return L->ffn == KVC_FFN_MOE || L->ffn == KVC_FFN_MOE_DENSE;
    case KVC_ON_ATTN:  return attn;
    case KVC_ON_RECR:  return recr;
    case KVC_ON_MIXER: return L->attn != KVC_ATTN_NONE;
    case KVC_ON_FFN:   return L->ffn != KVC_FFN_NONE;
    }
    return false;
}

static int bind_layer(binder *b, int il)
{
    const kvc_hparams *hp = &b->m->hp;
    kvc_layer *L = &b->m->layers[il];
    char name[96];
    int rc;
    for (const kvc_arch_tensor *const *list = hp->arch->tensors; *list; list++)
        for (const kvc_arch_tensor *t = *list; t->name; t++) {
            if (!applies(t, L))
                continue;
            const int64_t ne[3] = { dim_of(hp, L, t->ne[0]), dim_of(hp, L, t->ne[1]),
                                    dim_of(hp, L, t->ne[2]) };
            snprintf(name, sizeof(name), "blk.%d.%s", il, t->name);
            if ((rc = bind_one(b, t, name, ne, !(t->flags & (KVC_T_OPTIONAL | KVC_T_FUSED_ALT)), L)))
                return rc;
        }
    /* ReLU² FFNs have no gate (nemotron_h: its table requires up and down) */
    if ((L->ffn == KVC_FFN_MOE || L->ffn == KVC_FFN_MOE_DENSE) && hp->ffn_act != KVC_ACT_RELU2 &&
        !L->gate_up_exps.n && (!L->gate_exps.n || !L->up_exps.n))
        return kvc_fail(b->err, KVC_ERR_NOT_FOUND, "tensor blk.%d.%s missing", il,
                        L->gate_exps.n ? "ffn_up_exps.weight" : "ffn_gate_exps.weight");
    if (L->kv_layer == il && (L->attn == KVC_ATTN_FULL || L->attn == KVC_ATTN_WINDOW) &&
        (!L->wk.data || (hp->arch->v_norm && !L->k_norm)))
        return kvc_fail(b->err, KVC_ERR_NOT_FOUND, "tensor blk.%d.%s missing", il,
                        !L->wk.data ? "attn_k.weight" : "attn_k_norm.weight");
    if (hp->n_embd_per_layer > 0 && (!L->ple_gate.data || !L->ple_out.data || !L->ple_post_norm))
        return kvc_fail(b->err, KVC_ERR_NOT_FOUND, "tensor blk.%d.%s missing", il,
                        !L->ple_gate.data ? "inp_gate.weight" : !L->ple_out.data ? "proj.weight" : "post_norm.weight");
    if (L->attn == KVC_ATTN_GDN && !L->ssm_in.data && (!L->ssm_qkv.data || !L->ssm_z.data))
        return kvc_fail(b->err, KVC_ERR_NOT_FOUND, "tensor blk.%d.%s missing", il,
                        L->ssm_qkv.data ? "attn_gate.weight" : "attn_qkv.weight (or ssm_in.weight)");
    if (L->shexp_gate.data && (!L->shexp_up.data || !L->shexp_down.data))
        return kvc_fail(b->err, KVC_ERR_NOT_FOUND, "tensor blk.%d.ffn_%s_shexp.weight missing", il,
                        L->shexp_up.data ? "down" : "up");
    return KVC_OK;
}

/* Floats needed to hold every f32 weight (vectors, expert biases) converted,
 * at most: the table's float tensors over every layer, and output_norm. */
static int64_t owned_floats(const kvc_model *m)
{
    const kvc_hparams *hp = &m->hp;
    int64_t n = hp->n_embd + hp->n_embd_per_layer;   /* output_norm, per_layer_proj_norm */
    for (int il = 0; il < hp->n_layer; il++)
        for (const kvc_arch_tensor *const *list = hp->arch->tensors; *list; list++)
            for (const kvc_arch_tensor *t = *list; t->name; t++)
                if (t->is_float && applies(t, &m->layers[il]))
                    n += dim_of(hp, &m->layers[il], t->ne[0]) * dim_of(hp, &m->layers[il], t->ne[1]);
    return n;
}

/* Llama 3.1+'s RoPE scaling, as llama.cpp's converter stores it: one factor
 * per rotated pair, every layer's frequencies divided by it (Gemma 4: the
 * global layers'). Absent: none. */
static int bind_rope_freqs(binder *b)
{
    kvc_model *m = b->m;
    const kvc_hparams *hp = &m->hp;
    const gguf_tensor *rf = gguf_find_tensor(m->gguf, "rope_freqs.weight");
    if (!rf)
        return KVC_OK;
    if (rf->type != KVC_TYPE_F32 || ((uintptr_t)rf->data & 3) != 0)
        return kvc_fail(b->err, KVC_ERR_UNSUPPORTED, "tensor rope_freqs.weight: type %u, only F32 is supported",
                        rf->type);
    if (rf->ne[0] != hp->n_rot / 2 || rf->ne[1] != 1 || rf->ne[2] != 1)
        return shape_error(b->err, rf, "rope_freqs.weight", (const int64_t[3]){ hp->n_rot / 2, 1, 1 });
    m->rope_freqs = rf->data;
    for (int32_t i = 0; i < hp->n_rot / 2; i++)
        if (!(m->rope_freqs[i] > 0.0f) || isinf(m->rope_freqs[i]))
            return kvc_fail(b->err, KVC_ERR_FORMAT, "tensor rope_freqs.weight: factor %d is %g, not a positive number",
                            i, (double)m->rope_freqs[i]);
    return mark_used(b, rf) ? KVC_OK : kvc_fail(b->err, KVC_ERR_NOMEM, "out of memory binding tensors");
}

/* The global tensors, then every layer's, then rope_freqs. */
static int bind_all(binder *b)
{
    kvc_model *m = b->m;
    const kvc_hparams *hp = &m->hp;
    int rc;
    for (const kvc_arch_tensor *t = kvc_arch_globals; t->name; t++) {
        const int64_t ne[3] = { dim_of(hp, NULL, t->ne[0]), dim_of(hp, NULL, t->ne[1]), 1 };
        const char *name = t->field == offsetof(kvc_model, output_norm) && hp->arch->output_norm
                         ? hp->arch->output_norm : t->name;
        if ((rc = bind_one(b, t, name, ne, !(t->flags & KVC_T_OPTIONAL), m)))
            return rc;
    }
    if (hp->n_embd_per_layer > 0 && (!m->ple_embd.data || !m->ple_proj.data || !m->ple_proj_norm))
        return kvc_fail(b->err, KVC_ERR_NOT_FOUND, "tensor %s missing", !m->ple_embd.data ? "per_layer_token_embd.weight"
                        : !m->ple_proj.data ? "per_layer_model_proj.weight" : "per_layer_proj_norm.weight");
    if (!m->output.data) {
        m->output = m->tok_embd;
        m->hp.tied = true;
    }
    for (int il = 0; il < hp->n_layer; il++)
        if ((rc = bind_layer(b, il)))
            return rc;
    return bind_rope_freqs(b);
}

static int cmp_ptr(const void *a, const void *b)
{
    const uintptr_t x = (uintptr_t)*(const gguf_tensor *const *)a, y = (uintptr_t)*(const gguf_tensor *const *)b;
    return (x > y) - (x < y);
}

/* Whether tensor `name` belongs to one of the multi-token-prediction blocks
 * after the main layers (nextn_predict_layers): not run, skipped on purpose
 * as llama.cpp skips them unless it drafts with them. */
static bool is_mtp(const kvc_hparams *hp, const char *name)
{
    int il = -1, n = 0;
    return hp->n_layer_nextn > 0 && sscanf(name, "blk.%d.%n", &il, &n) == 1 && n > 0 &&
           il >= hp->n_layer && il < hp->n_layer + hp->n_layer_nextn;
}

/* Every tensor of the file must have been bound (b->used) or be skipped on
 * purpose (is_mtp): one the row does not know (a bias, a norm, another
 * layer kind's tensor, a newer variant's) would otherwise be ignored and
 * the logits silently wrong. llama.cpp refuses such files too ("wrong
 * number of tensors"). The error names the first one in file order. */
static int check_all_used(binder *b)
{
    const gguf_file *f = b->m->gguf;
    const kvc_hparams *hp = &b->m->hp;
    qsort(b->used, b->n_used, sizeof(*b->used), cmp_ptr);
    int64_t n_unused = 0;
    char first[160] = "";
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char name[160];
        snprintf(name, sizeof(name), "%.*s", (int)KVC_MIN(t->name.len, sizeof(name) - 1), t->name.s);
        if (bsearch(&t, b->used, b->n_used, sizeof(*b->used), cmp_ptr) || is_mtp(hp, name))
            continue;
        if (n_unused++ == 0)
            snprintf(first, sizeof(first), "%s", name);
    }
    if (n_unused == 0)
        return KVC_OK;
    return kvc_fail(b->err, KVC_ERR_UNSUPPORTED, "architecture %s: tensor %s is not supported (%lld tensor%s of the "
                    "file not read)", hp->arch->name, first, (long long)n_unused, n_unused == 1 ? "" : "s");
}

static int bind_tensors(kvc_model *m, kvc_err *err)
{
    const kvc_hparams *hp = &m->hp;
    const gguf_tensor *emb = gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!emb)
        return kvc_fail(err, KVC_ERR_NOT_FOUND, "tensor token_embd.weight missing");
    if (emb->ne[0] != hp->n_embd || emb->ne[1] < 1 || emb->ne[1] > INT32_MAX)
        return shape_error(err, emb, "token_embd.weight", (const int64_t[3]){ hp->n_embd, emb->ne[1], 1 });
    m->hp.n_vocab = (int32_t)emb->ne[1];
    m->layers = calloc((size_t)hp->n_layer, sizeof(kvc_layer));
    if (!m->layers)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory binding tensors");
    int rc = layer_hparams(m, err);
    if (rc || (hp->arch->layers && (rc = hp->arch->layers(m, err))))
        return rc;
    m->owned = malloc((size_t)owned_floats(m) * sizeof(float));
    if (!m->owned)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory binding tensors");
    binder b = { m, err, m->owned, NULL, 0, 0 };
    rc = bind_all(&b);
    if (!rc)
        rc = check_all_used(&b);
    free(b.used);
    return rc;
}

/* Read one byte per page of every tensor so the first forward pass does not
 * pay for page faults, reporting progress as it goes. */
static void touch_weights(const kvc_model *m, kvc_progress_fn progress, void *user)
{
    int64_t n = gguf_n_tensors(m->gguf);
    uint64_t total = 0, done = 0;
    for (int64_t i = 0; i < n; i++)
        total += gguf_tensor_at(m->gguf, i)->size;
    volatile uint8_t sink = 0;
    for (int64_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_at(m->gguf, i);
        const uint8_t *p = t->data;
        for (size_t off = 0; off < t->size; off += 4096)
            sink ^= p[off];
        done += t->size;
        if (progress && total)
            progress((float)((double)done / (double)total), user);
    }
    (void)sink;
}

int kvc_model_load_file(const char *path, kvc_progress_fn progress, void *user,
                        kvc_model **out, kvc_err *err)
{
    *out = NULL;
    kvc_model *m = calloc(1, sizeof(*m));
    if (!m)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    int rc = gguf_open(path, &m->gguf, err);
    if (!rc)
        rc = load_hparams(m->gguf, &m->hp, err);
    if (!rc)
        rc = bind_tensors(m, err);
    if (!rc)
        rc = kvc_tokenizer_load(m->gguf, &m->tok, err);
    if (!rc && kvc_tokenizer_n_vocab(m->tok) > m->hp.n_vocab)
        rc = kvc_fail(err, KVC_ERR_FORMAT, "vocabulary has %d tokens but token_embd.weight only %d rows",
                      kvc_tokenizer_n_vocab(m->tok), m->hp.n_vocab);
    if (!rc) {
        int r2 = gguf_get_str(m->gguf, "tokenizer.chat_template", &m->chat_template, NULL);
        if (r2 && r2 != KVC_ERR_NOT_FOUND)
            m->chat_template = NULL;
        if (gguf_get_str(m->gguf, "tokenizer.chat_template.tool_use", &m->chat_template_tool_use,
                         NULL) != KVC_OK)
            m->chat_template_tool_use = NULL;
        if (gguf_get_str(m->gguf, "general.name", &m->name, NULL) != KVC_OK) {
            const char *base = strrchr(path, '/');
            m->name = strdup(base ? base + 1 : path);
            if (!m->name)
                rc = kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
        }
    }
    if (rc) {
        kvc_err_prefix(err, "%s", path);
        kvc_model_release(m);
        return rc;
    }
    touch_weights(m, progress, user);
    *out = m;
    return KVC_OK;
}

void kvc_model_release(kvc_model *m)
{
    if (!m)
        return;
    kvc_tokenizer_free(m->tok);
    gguf_close(m->gguf);
    free(m->chat_template);
    free(m->chat_template_tool_use);
    free(m->name);
    free(m->layers);
    free(m->owned);
    free(m);
}

bool kvc_model_recurrent(const kvc_model *m)
{
    for (int32_t il = 0; il < m->hp.n_layer; il++)
        if (m->layers[il].state_floats > 0)
            return true;
    return false;
}
