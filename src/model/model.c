/* model.c - loading a GGUF model: hyperparameters, tensor binding, validation. */
#include "model.h"
#include "quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const arch_names[] = { "llama", "qwen2", "qwen3" };

/* ------------------------------------------------------- hyperparameters */

static int get_arch_u32(const gguf_file *f, const char *arch, const char *suffix,
                        bool required, uint32_t *out, kvc_err *err)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    int rc = gguf_get_u32(f, key, out, err);
    if (rc == KVC_ERR_NOT_FOUND && !required)
        return KVC_OK;
    if (rc == KVC_ERR_NOT_FOUND)
        return kvc_fail(err, rc, "metadata key %s missing", key);
    return rc;
}

static int get_arch_f32(const gguf_file *f, const char *arch, const char *suffix,
                        float *out, kvc_err *err)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    int rc = gguf_get_f32(f, key, out, err);
    return rc == KVC_ERR_NOT_FOUND ? KVC_OK : rc;
}

static int load_hparams(const gguf_file *f, kvc_hparams *hp, kvc_err *err)
{
    char *arch = NULL;
    int rc = gguf_get_str(f, "general.architecture", &arch, err);
    if (rc == KVC_ERR_NOT_FOUND)
        return kvc_fail(err, rc, "metadata key general.architecture missing");
    if (rc)
        return rc;
    int a = -1;
    for (int i = 0; i < (int)KVC_ARRAY_LEN(arch_names); i++)
        if (strcmp(arch, arch_names[i]) == 0)
            a = i;
    if (a < 0) {
        kvc_fail(err, KVC_ERR_UNSUPPORTED, "architecture '%.64s' not supported (llama, qwen2, qwen3)", arch);
        free(arch);
        return KVC_ERR_UNSUPPORTED;
    }
    free(arch);
    memset(hp, 0, sizeof(*hp));
    hp->arch = (kvc_arch)a;
    snprintf(hp->arch_name, sizeof(hp->arch_name), "%s", arch_names[a]);
    const char *an = hp->arch_name;

    uint32_t n_ctx = 0, n_embd, n_layer, n_head, n_head_kv = 0, n_ff, key_len = 0, val_len = 0;
    if ((rc = get_arch_u32(f, an, "context_length", false, &n_ctx, err)) ||
        (rc = get_arch_u32(f, an, "embedding_length", true, &n_embd, err)) ||
        (rc = get_arch_u32(f, an, "block_count", true, &n_layer, err)) ||
        (rc = get_arch_u32(f, an, "attention.head_count", true, &n_head, err)) ||
        (rc = get_arch_u32(f, an, "attention.head_count_kv", false, &n_head_kv, err)) ||
        (rc = get_arch_u32(f, an, "feed_forward_length", true, &n_ff, err)) ||
        (rc = get_arch_u32(f, an, "attention.key_length", false, &key_len, err)) ||
        (rc = get_arch_u32(f, an, "attention.value_length", false, &val_len, err)))
        return rc;
    hp->rms_eps = 1e-5f;
    hp->rope_theta = 10000.0f;
    if ((rc = get_arch_f32(f, an, "attention.layer_norm_rms_epsilon", &hp->rms_eps, err)) ||
        (rc = get_arch_f32(f, an, "rope.freq_base", &hp->rope_theta, err)))
        return rc;
    if (n_head_kv == 0)
        n_head_kv = n_head;
    const uint32_t lim = 1u << 20;
    if (n_embd == 0 || n_embd > lim || n_layer == 0 || n_layer > 4096 || n_head == 0 ||
        n_head > 4096 || n_head_kv > n_head || n_head % n_head_kv != 0 || n_ff == 0 || n_ff > lim)
        return kvc_fail(err, KVC_ERR_FORMAT,
                        "bad hyperparameters: n_embd %u, layers %u, heads %u, kv heads %u, n_ff %u",
                        n_embd, n_layer, n_head, n_head_kv, n_ff);
    if (key_len == 0)
        key_len = n_embd / n_head;
    if (val_len == 0)
        val_len = key_len;
    if (key_len != val_len || key_len == 0 || key_len % 2 != 0 || key_len > 1024)
        return kvc_fail(err, KVC_ERR_UNSUPPORTED, "head dimension %u (value %u) not supported",
                        key_len, val_len);
    if (!(hp->rms_eps > 0.0f) || !(hp->rope_theta > 0.0f))
        return kvc_fail(err, KVC_ERR_FORMAT, "bad rms epsilon %g or rope base %g",
                        hp->rms_eps, hp->rope_theta);
    hp->n_ctx_train = n_ctx ? (int32_t)KVC_MIN(n_ctx, (uint32_t)INT32_MAX) : 4096;
    hp->n_embd = (int32_t)n_embd;
    hp->n_layer = (int32_t)n_layer;
    hp->n_head = (int32_t)n_head;
    hp->n_head_kv = (int32_t)n_head_kv;
    hp->head_dim = (int32_t)key_len;
    hp->n_ff = (int32_t)n_ff;
    hp->rope_neox = hp->arch == KVC_ARCH_QWEN2 || hp->arch == KVC_ARCH_QWEN3;
    return KVC_OK;
}

/* ------------------------------------------------------------- tensors */

typedef struct binder {
    kvc_model *m;
    kvc_err   *err;
    float     *owned_next;    /* where the next converted 1-D weight goes */
} binder;

static int shape_error(kvc_err *err, const gguf_tensor *t, const char *name,
                       int64_t ne0, int64_t ne1)
{
    return kvc_fail(err, KVC_ERR_FORMAT,
                    "tensor %s: shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]", name,
                    (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                    (long long)t->ne[3], (long long)ne0, (long long)ne1);
}

static const gguf_tensor *find(binder *b, const char *name, bool required, int *rc)
{
    const gguf_tensor *t = gguf_find_tensor(b->m->gguf, name);
    if (!t && required)
        *rc = kvc_fail(b->err, KVC_ERR_NOT_FOUND, "tensor %s missing", name);
    return t;
}

/* A matrix of n_out rows of n_in, in any supported type. */
static int bind_matrix(binder *b, const char *name, int64_t n_in, int64_t n_out,
                       bool required, kvc_weight *w)
{
    int rc = KVC_OK;
    const gguf_tensor *t = find(b, name, required, &rc);
    if (!t)
        return rc;
    if (t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != 1 || t->ne[3] != 1)
        return shape_error(b->err, t, name, n_in, n_out);
    const kvc_type_traits *tr = kvc_type_info(t->type);
    if (!tr || !tr->supported)
        return kvc_fail(b->err, KVC_ERR_UNSUPPORTED, "tensor %s: type %u (%s) not supported",
                        name, t->type, tr ? tr->name : "unknown");
    w->type = t->type;
    w->n_in = n_in;
    w->n_out = n_out;
    w->row_bytes = kvc_row_size(t->type, n_in);
    w->data = t->data;
    b->m->n_params += (uint64_t)(n_in * n_out);
    b->m->weight_bytes += t->size;
    return KVC_OK;
}

/* A vector of n floats (norm weight or bias); F16/BF16 are converted. */
static int bind_vector(binder *b, const char *name, int64_t n, bool required, const float **out)
{
    int rc = KVC_OK;
    const gguf_tensor *t = find(b, name, required, &rc);
    *out = NULL;
    if (!t)
        return rc;
    if (t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
        return shape_error(b->err, t, name, n, 1);
    b->m->n_params += (uint64_t)n;
    b->m->weight_bytes += t->size;
    if (t->type == KVC_TYPE_F32 && ((uintptr_t)t->data & 3) == 0) {
        *out = t->data;
        return KVC_OK;
    }
    const kvc_type_traits *tr = kvc_type_info(t->type);
    if (!tr || !tr->supported)
        return kvc_fail(b->err, KVC_ERR_UNSUPPORTED, "tensor %s: type %u not supported", name, t->type);
    kvc_dequantize_row_ref(t->type, t->data, b->owned_next, n);
    *out = b->owned_next;
    b->owned_next += n;
    return KVC_OK;
}

static int bind_layer(binder *b, int il)
{
    kvc_model *m = b->m;
    const kvc_hparams *hp = &m->hp;
    kvc_layer *L = &m->layers[il];
    const int64_t d = hp->n_embd, hd = hp->head_dim;
    const int64_t nq = hp->n_head * hd, nkv = hp->n_head_kv * hd;
    const bool qwen2 = hp->arch == KVC_ARCH_QWEN2, qwen3 = hp->arch == KVC_ARCH_QWEN3;
    char name[96];
    int rc;
#define NAME(s) (snprintf(name, sizeof(name), "blk.%d.%s", il, s), name)
    if ((rc = bind_vector(b, NAME("attn_norm.weight"), d, true, &L->attn_norm)) ||
        (rc = bind_matrix(b, NAME("attn_q.weight"), d, nq, true, &L->wq)) ||
        (rc = bind_matrix(b, NAME("attn_k.weight"), d, nkv, true, &L->wk)) ||
        (rc = bind_matrix(b, NAME("attn_v.weight"), d, nkv, true, &L->wv)) ||
        (rc = bind_matrix(b, NAME("attn_output.weight"), nq, d, true, &L->wo)) ||
        (rc = bind_vector(b, NAME("attn_q.bias"), nq, qwen2, &L->bq)) ||
        (rc = bind_vector(b, NAME("attn_k.bias"), nkv, qwen2, &L->bk)) ||
        (rc = bind_vector(b, NAME("attn_v.bias"), nkv, qwen2, &L->bv)) ||
        (rc = bind_vector(b, NAME("attn_q_norm.weight"), hd, qwen3, &L->q_norm)) ||
        (rc = bind_vector(b, NAME("attn_k_norm.weight"), hd, qwen3, &L->k_norm)) ||
        (rc = bind_vector(b, NAME("ffn_norm.weight"), d, true, &L->ffn_norm)) ||
        (rc = bind_matrix(b, NAME("ffn_gate.weight"), d, hp->n_ff, true, &L->w_gate)) ||
        (rc = bind_matrix(b, NAME("ffn_up.weight"), d, hp->n_ff, true, &L->w_up)) ||
        (rc = bind_matrix(b, NAME("ffn_down.weight"), hp->n_ff, d, true, &L->w_down)))
        return rc;
#undef NAME
    return KVC_OK;
}

/* Floats needed to hold every 1-D weight converted to f32, at most. */
static int64_t owned_floats(const kvc_hparams *hp)
{
    int64_t per_layer = 2 * (int64_t)hp->n_embd + (int64_t)(hp->n_head + 2 * hp->n_head_kv) * hp->head_dim +
                        2 * (int64_t)hp->head_dim;
    return per_layer * hp->n_layer + hp->n_embd;
}

static int bind_tensors(kvc_model *m, kvc_err *err)
{
    const kvc_hparams *hp = &m->hp;
    m->layers = calloc((size_t)hp->n_layer, sizeof(kvc_layer));
    m->owned = malloc((size_t)owned_floats(hp) * sizeof(float));
    if (!m->layers || !m->owned)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory binding tensors");
    binder b = { m, err, m->owned };
    int rc;
    const gguf_tensor *emb = gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!emb)
        return kvc_fail(err, KVC_ERR_NOT_FOUND, "tensor token_embd.weight missing");
    if (emb->ne[0] != hp->n_embd || emb->ne[1] < 1 || emb->ne[1] > INT32_MAX)
        return shape_error(err, emb, "token_embd.weight", hp->n_embd, emb->ne[1]);
    m->hp.n_vocab = (int32_t)emb->ne[1];
    if ((rc = bind_matrix(&b, "token_embd.weight", hp->n_embd, hp->n_vocab, true, &m->tok_embd)) ||
        (rc = bind_vector(&b, "output_norm.weight", hp->n_embd, true, &m->output_norm)) ||
        (rc = bind_matrix(&b, "output.weight", hp->n_embd, hp->n_vocab, false, &m->output)))
        return rc;
    if (!m->output.data) {
        m->output = m->tok_embd;
        m->hp.tied = true;
    }
    for (int il = 0; il < hp->n_layer; il++)
        if ((rc = bind_layer(&b, il)))
            return rc;
    return KVC_OK;
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
