/* test_model_arch.c - the architecture table (arch.h): every runnable row's
 * generated model loads with every table tensor bound where the row says,
 * architectures known but not run yet and unknown ones are refused with an
 * error naming them, and a missing required key or tensor is named. Needs
 * nothing from ../shared. */
#include "test.h"
#include "gguf_edit.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "arch.h"
#include "forward.h"
#include "gguf.h"
#include "kernels.h"
#include "model.h"
#include "model_gen.h"
#include "quant.h"

static char dir[] = "/tmp/kvc_model_arch_XXXXXX";

/* Load path; the return code, the error message in msg. */
static int load(const char *path, kvc_model **m, char *msg, size_t n)
{
    kvc_err err = { 0 };
    int rc = kvc_model_load_file(path, NULL, NULL, m, &err);
    snprintf(msg, n, "%s", err.msg);
    return rc;
}

/* A file with only general.architecture = arch (and a few keys). */
static void write_stub(const char *path, const char *arch, bool with_shape)
{
    gguf_writer *w = gguf_writer_new();
    char key[96];
    gguf_writer_set_str(w, "general.architecture", arch);
    if (with_shape) {
        snprintf(key, sizeof(key), "%s.block_count", arch);
        gguf_writer_set_u32(w, key, 1);
    }
    kvc_err err = { 0 };
    CHECKF(gguf_writer_write(w, path, &err) == KVC_OK, "%s", err.msg);
    gguf_writer_free(w);
}

static void test_refused(void)
{
    char path[sizeof(dir) + 32], msg[512];
    snprintf(path, sizeof(path), "%s/stub.gguf", dir);
    static const char *const later[] = { "gemma3n", "deepseek2" };
    for (size_t i = 0; i < KVC_ARRAY_LEN(later); i++) {
        write_stub(path, later[i], false);
        kvc_model *m = NULL;
        int rc = load(path, &m, msg, sizeof(msg));
        CHECK_EQ_INT(rc, KVC_ERR_UNSUPPORTED);
        CHECKF(strstr(msg, "architecture") && strstr(msg, later[i]) && strstr(msg, "not supported yet"),
               "%s: %s", later[i], msg);
        CHECK(m == NULL);
    }
    write_stub(path, "deepseek2", false);
    kvc_model *m = NULL;
    load(path, &m, msg, sizeof(msg));
    CHECKF(strstr(msg, "architecture deepseek2: multi-head latent attention is not supported yet"), "%s", msg);

    write_stub(path, "frobnicator", false);
    CHECK_EQ_INT(load(path, &m, msg, sizeof(msg)), KVC_ERR_UNSUPPORTED);
    CHECKF(strstr(msg, "architecture 'frobnicator' not supported") && strstr(msg, "llama") &&
           strstr(msg, "qwen3"), "%s", msg);

    /* a runnable row without its required keys: the first missing one is named */
    write_stub(path, "qwen3", true);
    CHECK(load(path, &m, msg, sizeof(msg)) != KVC_OK);
    CHECKF(strstr(msg, "metadata key qwen3.embedding_length missing"), "%s", msg);
}

/* A one_kind_per_layer row (nemotron_h) generated with layers Mamba-2,
 * attention, FFN (experts as the tiny preset has them): each layer is its
 * one sublayer, with its one norm, and binds only that sublayer's tensors. */
static void check_one_kind(const kvc_model *m, const kvc_gen_params *p)
{
    const kvc_layer *L = m->layers;
    CHECK_EQ_INT(m->hp.n_layer, 3);
    CHECK_EQ_INT(L[0].attn, KVC_ATTN_MAMBA2);
    CHECK_EQ_INT(L[1].attn, KVC_ATTN_FULL);
    CHECK_EQ_INT(L[2].attn, KVC_ATTN_NONE);
    for (int il = 0; il < 3; il++) {
        CHECK_EQ_INT(L[il].ffn, il < 2 ? KVC_FFN_NONE : p->n_expert > 0 ? KVC_FFN_MOE : KVC_FFN_DENSE);
        CHECK_EQ_INT(L[il].state_floats > 0, il == 0);
        CHECK_EQ_INT(L[il].attn_norm != NULL, il < 2);
        CHECK_EQ_INT(L[il].ffn_norm != NULL, il == 2);
        CHECK_EQ_INT(L[il].ssm_in.data != NULL, il == 0);
        CHECK_EQ_INT(L[il].wq.data != NULL, il == 1);
        CHECK_EQ_INT(L[il].router.data != NULL && L[il].sel_bias && L[il].shexp_up.data, il == 2);
        CHECK(!L[il].w_gate.data && !L[il].gate_exps.n && !L[il].shexp_gate.data);   /* ReLU²: no gates */
    }
    CHECK(L[1].no_rope);
    CHECK_EQ_INT(L[2].n_head_kv, 0);
}

/* Every runnable row: the generated model loads, and each table tensor's
 * field is bound exactly when the generator wrote it. */
static void test_rows(void)
{
    char path[sizeof(dir) + 32], msg[512];
    snprintf(path, sizeof(path), "%s/m.gguf", dir);
    int n_rows = 0;
    for (int i = 0; kvc_arch_at(i); i++, n_rows++) {
        const kvc_arch *a = kvc_arch_at(i);
        kvc_gen_params p;
        kvc_gen_preset("tiny", &p);
        p.arch = a->name;
        p.n_layer = 2;
        p.n_threads = 1;
        p.full_attn_interval = 2;   /* Gated DeltaNet rows: layer 0 recurrent, layer 1 attention */
        const bool gdn = a->layers == kvc_gdn_layers;
        if (a->one_kind_per_layer)   /* nemotron_h: a layer of each kind */
            p.n_layer = 3, p.layer_pattern = "M*-";
        kvc_err err = { 0 };
        CHECKF(kvc_gen_model(&p, path, &err) == KVC_OK, "%s: %s", a->name, err.msg);
        kvc_model *m = NULL;
        int rc = load(path, &m, msg, sizeof(msg));
        CHECKF(rc == KVC_OK, "%s: %s", a->name, msg);
        if (rc != KVC_OK)
            continue;
        CHECK(m->hp.arch == a);
        CHECK(strcmp(m->hp.arch_name, a->name) == 0);
        CHECK_EQ_INT(m->hp.rope_neox, a->rope_neox);
        if (a->one_kind_per_layer) {
            check_one_kind(m, &p);
            kvc_model_release(m);
            continue;
        }
        for (int il = 0; il < m->hp.n_layer; il++) {
            const kvc_layer *L = &m->layers[il];
            const bool rec = gdn && il == 0;
            if (a->recurrent == KVC_ATTN_FULL)   /* the GDN rows' and the attention-only rows' */
                CHECK_EQ_INT(L->attn, rec ? KVC_ATTN_GDN : KVC_ATTN_FULL);
            CHECK_EQ_INT(L->attn_gated, gdn && !rec);
            /* qwen3next's generated files have the fused form (ssm_in, ssm_ba) */
            CHECK_EQ_INT(L->ssm_qkv.data != NULL, rec && !a->gdn_v_grouped);
            CHECK_EQ_INT(L->ssm_ba.data != NULL && L->ssm_in.data != NULL, rec && a->gdn_v_grouped);
            CHECK_EQ_INT(L->ssm_conv != NULL && L->ssm_a != NULL && L->ssm_norm != NULL,
                         rec || (a->recurrent == KVC_ATTN_MAMBA2 && il % 2 == 0));
            CHECK_EQ_INT(L->state_floats > 0, rec || (a->recurrent != KVC_ATTN_FULL && il % 2 == 0));
            if (rec) {
                CHECK(L->ssm_a[0] < 0.0f);
                CHECK(L->attn_norm && L->ffn_norm && !L->wq.data && L->ssm_out.data);
                CHECK_EQ_INT(L->state_floats, (int64_t)(m->hp.ssm_d_conv - 1) *
                             (2 * m->hp.ssm_n_group + m->hp.ssm_n_head) * m->hp.ssm_d_state +
                             (int64_t)m->hp.ssm_n_head * m->hp.ssm_d_state * m->hp.ssm_d_state);
                CHECK_EQ_INT(L->w_gate.data != NULL, a->ffn == KVC_FFN_DENSE);
                continue;
            }
            CHECK_EQ_INT(L->ffn, a->ffn);
            CHECK_EQ_INT(L->n_head, p.n_head);
            CHECK(L->attn_norm && L->ffn_norm);
            if (a->recurrent != KVC_ATTN_FULL && il % 2 == 0) {
                /* the generator's default pattern: even layers recurrent */
                CHECK_EQ_INT(L->attn, a->recurrent);
                CHECK_EQ_INT(L->n_head_kv, 0);
                CHECK(L->state_floats > 0 && L->wq.data == NULL && L->wo.data == NULL);
                CHECK_EQ_INT(L->conv_in.data != NULL, a->recurrent == KVC_ATTN_SHORTCONV);
                CHECK_EQ_INT(L->ssm_in.data != NULL, a->recurrent == KVC_ATTN_MAMBA2);
                CHECK_EQ_INT(L->ssm_conv_b != NULL, a->recurrent == KVC_ATTN_MAMBA2);
                continue;
            }
            CHECK_EQ_INT(L->attn, KVC_ATTN_FULL);
            CHECK_EQ_INT(L->state_floats, 0);
            CHECK_EQ_INT(L->n_head_kv, p.n_head_kv);
            CHECK_EQ_INT(L->head_dim, p.head_dim ? p.head_dim : p.n_embd / p.n_head);
            CHECK(L->wq.data && L->wo.data);
            CHECK_EQ_INT(L->bq != NULL, strcmp(a->name, "qwen2") == 0 || strcmp(a->name, "gpt-oss") == 0);
            CHECK_EQ_INT(L->q_norm != NULL, strcmp(a->name, "qwen3") == 0 || strcmp(a->name, "qwen3moe") == 0 ||
                                                strcmp(a->name, "gemma3") == 0 || gdn ||
                                                strcmp(a->name, "gemma4") == 0 ||
                                                strncmp(a->name, "lfm2", 4) == 0);
            CHECK_EQ_INT(L->sinks != NULL, strcmp(a->name, "gpt-oss") == 0);
            CHECK_EQ_INT(L->post_ffn_norm != NULL, strcmp(a->name, "gemma3") == 0 ||
                                                   strcmp(a->name, "gemma4") == 0);
            CHECK_EQ_INT(L->w_gate.data != NULL, a->ffn != KVC_FFN_MOE);
            CHECK_EQ_INT(L->router.data != NULL, a->ffn != KVC_FFN_DENSE);
            if (a->ffn != KVC_FFN_DENSE) {
                CHECK_EQ_INT(L->gate_exps.n, p.n_expert);
                CHECK_EQ_INT(L->down_exps.w.n_in, a->ff_exp_is_ff ? p.n_ff : p.n_ff_exp);
                CHECK_EQ_INT(L->down_exps.w.n_out, p.n_embd);
                CHECK(L->down_exps.stride == L->down_exps.w.row_bytes * (size_t)p.n_embd);
                CHECK(L->gate_up_exps.n == 0 && L->shexp_gate.data == NULL);
                /* make-model writes gpt-oss's router and expert biases */
                const bool oai = strcmp(a->name, "gpt-oss") == 0;
                CHECK_EQ_INT(L->router_b != NULL, oai);
                CHECK_EQ_INT(L->down_exps_b != NULL, oai);
            }
        }
        kvc_model_release(m);
    }
    CHECK(n_rows >= 3);
}

/* The logits of a few tokens, one batch, on the current ISA. */
static float *logits_of(const char *path, int n_tok, int *n_vocab)
{
    kvc_model *m = NULL;
    char err[512];
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "%s", err);
    if (!m)
        return NULL;
    *n_vocab = m->hp.n_vocab;
    kvc_context *c = test_new_context(m, 64, 64, 1, 16);
    int32_t toks[64];
    for (int i = 0; i < n_tok; i++)
        toks[i] = (int32_t)((2654435761u * (uint32_t)(i + 3)) % (uint32_t)m->hp.n_vocab);
    float *out = c ? malloc((size_t)n_tok * *n_vocab * sizeof(float)) : NULL;
    if (out && kvc_context_decode(c, 0, toks, n_tok, true, err, sizeof(err)) == KVC_OK)
        for (int i = 0; i < n_tok; i++)
            memcpy(out + (size_t)i * *n_vocab, kvc_context_logits(c, i), (size_t)*n_vocab * sizeof(float));
    kvc_context_free(c);
    kvc_model_free(m);
    return out;
}

/* Experts whose gate and up stacks differ in type (Q8_0 gate, F32 up: a
 * mix a quantizer may make) run as the same model with both Q8_0, up to
 * rounding. The MoE step once prepared quantized activations for the gate's
 * type only, and the up matmul, whose F32 kernel takes none, wrote nothing. */
static void test_mixed_expert_types(void)
{
    char a[sizeof(dir) + 32], b[sizeof(dir) + 32];
    snprintf(a, sizeof(a), "%s/q8.gguf", dir);
    snprintf(b, sizeof(b), "%s/mixed.gguf", dir);
    kvc_gen_params p;
    kvc_gen_preset("tiny-qwen3moe", &p);
    p.ftype = "q8_0";
    p.n_threads = 1;
    kvc_err err = { 0 };
    CHECKF(kvc_gen_model(&p, a, &err) == KVC_OK, "%s", err.msg);
    gguf_file *f = NULL;
    CHECKF(gguf_open(a, &f, &err) == KVC_OK, "%s", err.msg);
    if (!f)
        return;
    gguf_writer *w = gguf_writer_new();
    CHECK(test_gguf_copy_keys(f, w, NULL));
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.s);
        if (strstr(name, "ffn_up_exps") && t->type == KVC_TYPE_Q8_0) {
            const int64_t n = t->ne[0] * t->ne[1] * t->ne[2];
            float *x = malloc((size_t)n * sizeof(float));
            kvc_dequantize_row_ref(t->type, t->data, x, n);
            CHECK(gguf_writer_add_tensor(w, name, KVC_TYPE_F32, t->n_dims, t->ne, x,
                                         (size_t)n * sizeof(float)) == KVC_OK);
            free(x);
        } else {
            CHECK(gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->size) == KVC_OK);
        }
    }
    CHECKF(gguf_writer_write(w, b, &err) == KVC_OK, "%s", err.msg);
    gguf_writer_free(w);
    gguf_close(f);
    const kvc_isa def = kvc_kernels_isa();
    for (int isa = KVC_ISA_SCALAR; isa <= KVC_ISA_VNNI; isa++) {
        if (kvc_kernels_set_isa((kvc_isa)isa) != KVC_OK)
            continue;
        int nv = 0;
        float *la = logits_of(a, 20, &nv), *lb = logits_of(b, 20, &nv);
        double d = la && lb ? 0.0 : 1e9;
        for (int64_t i = 0; la && lb && i < 20 * (int64_t)nv; i++)
            d = fmax(d, fabs((double)la[i] - lb[i]));
        CHECKF(d < 1e-2, "%s: Q8_0 gate with F32 up experts: max |dlogit| %g from all-Q8_0",
               kvc_isa_name((kvc_isa)isa), d);
        free(la);
        free(lb);
    }
    kvc_kernels_set_isa(def);
}

/* A copy of the model at src with key `key` set to the U32 v. */
static void with_key(const char *src, const char *dst, const char *key, uint32_t v)
{
    kvc_err err = { 0 };
    gguf_file *f = NULL;
    CHECKF(gguf_open(src, &f, &err) == KVC_OK, "%s", err.msg);
    if (!f)
        return;
    gguf_writer *w = gguf_writer_new();
    CHECK(test_gguf_copy_keys(f, w, key));
    CHECK(gguf_writer_set_u32(w, key, v) == KVC_OK);
    CHECK(test_gguf_copy_tensors(f, w));
    CHECKF(gguf_writer_write(w, dst, &err) == KVC_OK, "%s", err.msg);
    gguf_writer_free(w);
    gguf_close(f);
}

/* Gemma 4 (make-model's tiny-gemma4): the per-layer sliding pattern, each
 * kind's head size, KV heads and rotated dims, K = V on the global layers,
 * the experts beside the dense FFN, proportional rope_freqs, per-layer
 * embeddings when asked for (a key without its tensors is refused by name),
 * KV-shared layers reading the last layer of their kind before them. */
static void test_gemma4(void)
{
    char path[sizeof(dir) + 32], bad[sizeof(dir) + 32], msg[512];
    snprintf(path, sizeof(path), "%s/g4.gguf", dir);
    snprintf(bad, sizeof(bad), "%s/g4bad.gguf", dir);
    kvc_gen_params p;
    CHECK_EQ_INT(kvc_gen_preset("tiny-gemma4", &p), KVC_OK);
    p.n_threads = 1;
    kvc_err err = { 0 };
    CHECKF(kvc_gen_model(&p, path, &err) == KVC_OK, "%s", err.msg);
    kvc_model *m = NULL;
    CHECKF(load(path, &m, msg, sizeof(msg)) == KVC_OK, "%s", msg);
    if (!m)
        return;
    CHECK_EQ_INT(m->hp.n_layer, 9);
    for (int il = 0; il < m->hp.n_layer; il++) {
        const kvc_layer *L = &m->layers[il];
        const bool slides = il % 3 != 2;
        CHECK_EQ_INT(L->attn, slides ? KVC_ATTN_WINDOW : KVC_ATTN_FULL);
        CHECK_EQ_INT(L->window, slides ? 8 : 0);
        CHECK_EQ_INT(L->head_dim, slides ? 16 : 32);
        CHECK_EQ_INT(L->n_head_kv, slides ? 2 : 1);
        CHECK_EQ_INT(L->n_rot, slides ? 16 : 32);
        CHECK_EQ_INT(L->rope, slides ? 1 : 0);
        CHECK_EQ_INT(L->wv.data != NULL, slides);
        CHECK(L->v_norm && L->attn_scale == 1.0f && L->out_scale && L->q_norm && L->k_norm);
        CHECK_EQ_INT(L->ffn, KVC_FFN_MOE_DENSE);
        CHECK(L->w_gate.data && L->router.data && L->router_in_scale && L->pre_ffn_norm2 &&
              L->post_ffn_norm1 && L->post_ffn_norm2 && L->post_ffn_norm && L->down_exps.n == 8);
    }
    CHECK(m->rope_freqs && m->rope_freqs[3] == 1.0f && m->rope_freqs[4] > 1e29f);
    CHECK(m->hp.emb_scale == 8.0f && m->hp.logit_softcap == 30.0f);
    CHECK(!m->ple_embd.data && !m->layers[0].ple_gate.data);
    kvc_model_release(m);
    p.n_embd_per_layer = 16;
    CHECKF(kvc_gen_model(&p, bad, &err) == KVC_OK, "%s", err.msg);
    CHECKF(load(bad, &m, msg, sizeof(msg)) == KVC_OK, "%s", msg);
    if (m) {
        CHECK(m->hp.n_embd_per_layer == 16 && m->ple_embd.n_in == 16 * 9 && m->ple_proj.n_out == 16 * 9 &&
              m->ple_proj_norm);
        for (int il = 0; il < m->hp.n_layer; il++)
            CHECK(m->layers[il].ple_gate.n_out == 16 && m->layers[il].ple_out.n_in == 16 &&
                  m->layers[il].ple_post_norm);
        kvc_model_release(m);
    }

    with_key(path, bad, "gemma4.embedding_length_per_layer_input", 16);   /* without its tensors */
    CHECK_EQ_INT(load(bad, &m, msg, sizeof(msg)), KVC_ERR_NOT_FOUND);
    CHECKF(strstr(msg, "tensor per_layer_token_embd.weight missing"), "%s", msg);
    with_key(path, bad, "gemma4.attention.shared_kv_layers", 8);   /* one layer left with K/V */
    CHECK_EQ_INT(load(bad, &m, msg, sizeof(msg)), KVC_ERR_FORMAT);
    CHECKF(strstr(msg, "shared_kv_layers 8 of 9 layers"), "%s", msg);
    /* the last 3 layers (sliding 6, 7; global 8) read layers 4 and 5, and have no K */
    p.n_embd_per_layer = 0;
    p.n_kv_shared = 3;
    CHECKF(kvc_gen_model(&p, bad, &err) == KVC_OK, "%s", err.msg);
    CHECKF(load(bad, &m, msg, sizeof(msg)) == KVC_OK, "%s", msg);
    for (int il = 0; m && il < m->hp.n_layer; il++) {
        const kvc_layer *L = &m->layers[il];
        CHECK_EQ_INT(L->kv_layer, il < 6 ? il : il == 8 ? 5 : 4);
        CHECK_EQ_INT(L->wk.data != NULL && L->k_norm != NULL, il < 6);
    }
    kvc_model_release(m);
    with_key(path, bad, "gemma4.attention.key_length_swa", 15);
    CHECK_EQ_INT(load(bad, &m, msg, sizeof(msg)), KVC_ERR_UNSUPPORTED);
    CHECKF(strstr(msg, "sliding layers' head dimension 15"), "%s", msg);
}

/* A copy of the model at src with one more tensor, rope_freqs.weight. */
static void with_rope_freqs(const char *src, const char *dst, uint32_t type, int64_t n, const float *v)
{
    kvc_err err = { 0 };
    gguf_file *f = NULL;
    CHECKF(gguf_open(src, &f, &err) == KVC_OK, "%s", err.msg);
    if (!f)
        return;
    gguf_writer *w = gguf_writer_new();
    CHECK(test_gguf_copy_keys(f, w, NULL));
    CHECK(test_gguf_copy_tensors(f, w));
    kvc_fp16 h[64];
    for (int64_t i = 0; i < n && i < 64; i++)
        h[i] = kvc_fp32_to_fp16(v[i]);
    CHECK(gguf_writer_add_tensor(w, "rope_freqs.weight", type, 1, (const int64_t[]){ n },
                                 type == KVC_TYPE_F16 ? (const void *)h : (const void *)v,
                                 (size_t)n * (type == KVC_TYPE_F16 ? 2 : 4)) == KVC_OK);
    CHECKF(gguf_writer_write(w, dst, &err) == KVC_OK, "%s", err.msg);
    gguf_writer_free(w);
    gguf_close(f);
}

/* Llama 3.1's rope_freqs.weight divides each pair's frequency (it was
 * ignored, the logits those of no scaling): all factors 2 give bitwise the
 * logits of linear scaling by 2, all 1 those of none; a wrong type, length
 * or value is refused with the tensor's name. */
static void test_rope_freqs(void)
{
    char plain[sizeof(dir) + 32], lin[sizeof(dir) + 32], ff[sizeof(dir) + 32];
    snprintf(plain, sizeof(plain), "%s/plain.gguf", dir);
    snprintf(lin, sizeof(lin), "%s/linear2.gguf", dir);
    snprintf(ff, sizeof(ff), "%s/ff.gguf", dir);
    kvc_gen_params p;
    kvc_gen_preset("tiny-llama", &p);
    p.n_threads = 1;
    kvc_err err = { 0 };
    CHECKF(kvc_gen_model(&p, plain, &err) == KVC_OK, "%s", err.msg);
    p.rope_scaling = "linear", p.rope_factor = 2.0f;
    CHECKF(kvc_gen_model(&p, lin, &err) == KVC_OK, "%s", err.msg);
    const int64_t half = p.n_embd / p.n_head / 2;
    float v[64];
    int nv = 0;
    float *la = logits_of(plain, 12, &nv), *lb = logits_of(lin, 12, &nv);
    const size_t bytes = (size_t)12 * (size_t)nv * sizeof(float);
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t i = 0; i < half; i++)
            v[i] = pass ? 2.0f : 1.0f;
        with_rope_freqs(plain, ff, KVC_TYPE_F32, half, v);
        float *lf = logits_of(ff, 12, &nv);
        const float *want = pass ? lb : la;
        CHECKF(lf && want && memcmp(lf, want, bytes) == 0, "rope_freqs all %d: not the logits of %s", pass + 1,
               pass ? "linear scaling by 2" : "no scaling");
        free(lf);
    }
    CHECK(la && lb && memcmp(la, lb, bytes) != 0);
    free(la);
    free(lb);
    static const struct { uint32_t type; int64_t n; float v0; const char *msg; } bad[] = {
        { KVC_TYPE_F16, 0, 1.0f, "only F32" }, { KVC_TYPE_F32, -1, 1.0f, "rope_freqs.weight" },
        { KVC_TYPE_F32, 0, 0.0f, "not a positive number" }, { KVC_TYPE_F32, 0, -1.0f, "not a positive number" },
    };
    for (size_t k = 0; k < KVC_ARRAY_LEN(bad); k++) {
        for (int64_t i = 0; i < half; i++)
            v[i] = i == 3 ? bad[k].v0 : 1.0f;
        with_rope_freqs(plain, ff, bad[k].type, half + bad[k].n, v);
        kvc_model *m = NULL;
        char msg[512];
        CHECKF(load(ff, &m, msg, sizeof(msg)) != KVC_OK && strstr(msg, "rope_freqs.weight") && strstr(msg, bad[k].msg),
               "bad rope_freqs %zu: %s", k, msg);
        kvc_model_release(m);
    }
}

int main(void)
{
    CHECK(mkdtemp(dir) != NULL);
    test_refused();
    test_rows();
    test_mixed_expert_types();
    test_rope_freqs();
    test_gemma4();
    char cmd[sizeof(dir) + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return test_done("test_model_arch");
}
