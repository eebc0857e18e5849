/* model_gen.c - random-weight GGUF models: weight types, weights, and the
 * file. The parameters, each layer's kind and the metadata keys are in
 * model_gen_params.c, the presets in model_gen_preset.c, the vocabulary in
 * model_gen_vocab.c. */
#include "model_gen.h"
#include "model_gen_params.h"

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

bool kvc_gen_ftype(const char *ftype, uint32_t *file_type, bool *quantized)
{
    const gen_ftype *ft = find_ftype(ftype);
    if (ft && file_type)
        *file_type = ft->file_type;
    if (ft && quantized)
        *quantized = !is_float_type(ft->base);
    return ft != NULL;
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
 * layer of kv KV heads of hd and a dense FFN ff wide. */
static int64_t gen_dim(const kvc_gen_params *p, int64_t n_vocab, int32_t kv, int32_t hd, int32_t ff, uint8_t d)
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
    case KVC_D_FF:       return ff;
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
    const kvc_arch *a = kvc_gen_arch(p->arch);
    bool want = !(t->flags & KVC_T_OPTIONAL);
    for (size_t i = 0; !want && i < KVC_ARRAY_LEN(gen_optional); i++)
        want = strcmp(a->name, gen_optional[i].arch) == 0 && strcmp(t->name, gen_optional[i].name) == 0 &&
               (!strstr(t->name, "_shexp") || p->n_ff_shexp > 0) &&
               (strcmp(t->name, "attn_v.weight") != 0 || kvc_gen_slides(p, l)) &&
               ((!strstr(t->name, "attn_k") && strcmp(t->name, "attn_v.weight") != 0) ||
                l < p->n_layer - p->n_kv_shared) &&
               ((t->ne[0] != KVC_D_PLE && t->ne[1] != KVC_D_PLE && strcmp(t->name, "post_norm.weight") != 0) ||
                p->n_embd_per_layer > 0);
    if (!want && a->recurrent == KVC_ATTN_MAMBA2)
        want = strcmp(t->name, "ssm_conv1d.bias") == 0 ||
               (p->n_ff_shexp > 0 && strstr(t->name, "_shexp.weight") && !strstr(t->name, "gate_inp"));
    const bool ffn = kvc_gen_has_ffn(p, l), moe = kvc_gen_layer_moe(p, l, kvc_gen_moe(p));
    switch ((kvc_tensor_when)t->when) {
    case KVC_ON_ALL:   return want;
    case KVC_ON_DENSE: return want && ffn && !moe;
    case KVC_ON_MOE:   return want && moe;
    case KVC_ON_ATTN:  return want && kv > 0;
    case KVC_ON_RECR:  return want && kv == 0 && kvc_gen_kind(p, l) != '-';
    case KVC_ON_MIXER: return want && kvc_gen_kind(p, l) != '-';
    case KVC_ON_FFN:   return want && ffn;
    }
    return false;
}

/* The tensors of the model, in file order (malloc'd, *n_out of them): the
 * architecture's table row (arch.h); they borrow `quiet` ([n_vocab]). */
static gen_tensor *plan_tensors(const kvc_gen_params *p, int64_t n_vocab, const uint8_t *quiet,
                                int *n_out)
{
    const kvc_arch *a = kvc_gen_arch(p->arch);
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

    int32_t kv[GEN_MAX_LAYERS], ff[GEN_MAX_LAYERS];
    kvc_gen_layer_kv_heads(p, kv);                       /* valid: kvc_gen_resolve */
    kvc_gen_layer_ff(p, ff);
    ADD(-1, "token_embd.weight", 2, false, d, n_vocab, 1, 0.0f, emb_std, p->tied ? quiet : NULL);
    for (int l = 0; l < p->n_layer; l++)
        for (const kvc_arch_tensor *const *list = a->tensors; *list; list++)
            for (const kvc_arch_tensor *t = *list; t->name; t++) {
                if (!gen_writes(p, t, l, kv[l]))
                    continue;
                const int32_t hd = kvc_gen_head_dim(p, l);
                const int64_t ne0 = gen_dim(p, n_vocab, kv[l], hd, ff[l], t->ne[0]),
                              ne1 = gen_dim(p, n_vocab, kv[l], hd, ff[l], t->ne[1]),
                              ne2 = gen_dim(p, n_vocab, kv[l], hd, ff[l], t->ne[2]);
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
    int rc = kvc_gen_resolve(user, &p, err);
    if (rc != KVC_OK)
        return rc;
    gguf_writer *w = gguf_writer_new();
    if (!w)
        return kvc_fail(err, KVC_ERR_NOMEM, "cannot allocate the GGUF writer");
    kvc_gen_vocab_info vi;
    rc = kvc_gen_write_keys(w, &p);
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
