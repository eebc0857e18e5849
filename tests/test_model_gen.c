/* test_model_gen.c - random-weight GGUF models: keys, shapes, weight types and
 * their llama.cpp mixes and fallbacks, determinism, weight statistics, and the
 * built-in vocabularies. Needs nothing from ../shared. */
#include "test.h"

#include <stdlib.h>
#include <unistd.h>

#include "gguf.h"
#include "model.h"
#include "model_gen.h"
#include "model_gen_params.h"
#include "quant.h"
#include "tokenizer.h"

/* ---------------------------------------------------------------- helpers */

/* Generate p into memory and open it; NULL (and a failed check) on error. */
static gguf_file *gen_open(const kvc_gen_params *p, void **buf, size_t *size)
{
    kvc_err err = { 0 };
    int rc = kvc_gen_model_memory(p, buf, size, &err);
    CHECKF(rc == KVC_OK, "%s %s: %s", p->arch, p->ftype, err.msg);
    if (rc != KVC_OK)
        return NULL;
    gguf_file *f = NULL;
    rc = gguf_open_memory(*buf, *size, &f, &err);
    CHECKF(rc == KVC_OK, "reopen: %s", err.msg);
    if (rc != KVC_OK) {
        free(*buf);
        *buf = NULL;
    }
    return rc == KVC_OK ? f : NULL;
}

static int64_t get_i64(const gguf_file *f, const char *key)
{
    int64_t v = -1;
    kvc_err err = { 0 };
    CHECKF(gguf_get_i64(f, key, &v, &err) == KVC_OK, "%s: %s", key, err.msg);
    return v;
}

static float get_f32(const gguf_file *f, const char *key)
{
    float v = -1;
    kvc_err err = { 0 };
    CHECKF(gguf_get_f32(f, key, &v, &err) == KVC_OK, "%s: %s", key, err.msg);
    return v;
}

static bool str_is(const gguf_file *f, const char *key, const char *want)
{
    char *s = NULL;
    if (gguf_get_str(f, key, &s, NULL) != KVC_OK)
        return false;
    bool ok = strcmp(s, want) == 0;
    free(s);
    return ok;
}

static bool gstr_is(gguf_str s, const char *want)
{
    return s.len == strlen(want) && memcmp(s.s, want, s.len) == 0;
}

/* Check a tensor's presence, shape and type (type < 0: any). */
static const gguf_tensor *expect_tensor(const gguf_file *f, const char *name, int64_t ne0,
                                        int64_t ne1, int type)
{
    const gguf_tensor *t = gguf_find_tensor(f, name);
    CHECKF(t != NULL, "tensor %s missing", name);
    if (!t)
        return NULL;
    CHECKF(t->ne[0] == ne0 && t->ne[1] == ne1, "%s: shape [%lld, %lld], want [%lld, %lld]", name,
           (long long)t->ne[0], (long long)t->ne[1], (long long)ne0, (long long)ne1);
    CHECKF(t->n_dims == (ne1 > 1 ? 2u : 1u), "%s: n_dims %u", name, t->n_dims);
    if (type >= 0)
        CHECKF((int)t->type == type, "%s: type %s, want %s", name, kvc_type_info(t->type)->name,
               kvc_type_info((uint32_t)type)->name);
    return t;
}

/* Dequantize rows [r0, r1) of a 2-D tensor (or the whole 1-D one) into a malloc'd array. */
static float *dequant_rows(const gguf_tensor *t, int64_t r0, int64_t r1)
{
    size_t rs = kvc_row_size(t->type, t->ne[0]);
    float *out = malloc((size_t)((r1 - r0) * t->ne[0]) * sizeof(float));
    for (int64_t r = r0; r < r1; r++)
        kvc_dequantize_row_ref(t->type, (const uint8_t *)t->data + (size_t)r * rs,
                               out + (r - r0) * t->ne[0], t->ne[0]);
    return out;
}

typedef struct stats { double mean, std, max_abs; } stats;

static stats stats_of(const float *x, int64_t n)
{
    double s = 0, s2 = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
        m = fmax(m, fabs(x[i]));
    }
    stats st = { s / n, 0, m };
    st.std = sqrt(fmax(0, s2 / n - st.mean * st.mean));
    return st;
}

static stats tensor_stats(const gguf_tensor *t, int64_t r0, int64_t r1)
{
    CHECK(t != NULL);
    if (!t)
        return (stats){ 0, 0, 0 };
    float *x = dequant_rows(t, r0, r1);
    stats st = stats_of(x, (r1 - r0) * t->ne[0]);
    free(x);
    return st;
}

static kvc_gen_params small(const char *arch, const char *ftype)
{
    kvc_gen_params p;
    kvc_gen_preset("tiny", &p);
    p.arch = arch;
    p.ftype = ftype;
    p.vocab = strcmp(arch, "qwen2") == 0 ? "bpe" : "spm";
    p.n_embd = 64;
    p.n_ff = 96;
    p.n_threads = 2;
    return p;
}

/* ---------------------------------------------------------------- presets */

static void test_presets(void)
{
    kvc_gen_params p, d = kvc_gen_default_params();
    CHECK_EQ_INT(kvc_gen_preset("demo", &p), KVC_OK);
    CHECK(strcmp(p.arch, d.arch) == 0 && p.n_embd == d.n_embd && p.n_layer == d.n_layer &&
          p.tied == d.tied && strcmp(p.ftype, d.ftype) == 0);
    CHECK(strcmp(d.arch, "qwen2") == 0 && d.n_embd == 128 && d.n_layer == 2 && d.n_head == 4 &&
          d.n_head_kv == 2 && d.n_ff == 384 && d.n_ctx == 4096 && strcmp(d.ftype, "f16") == 0);
    int n = 0;
    for (const char *name; (name = kvc_gen_preset_name(n)) != NULL; n++)
        CHECKF(kvc_gen_preset(name, &p) == KVC_OK, "preset %s", name);
    CHECK(n >= 5);
    CHECK(kvc_gen_preset_name(-1) == NULL);
    p.n_embd = 12345;
    CHECK_EQ_INT(kvc_gen_preset("no-such-preset", &p), KVC_ERR_NOT_FOUND);
    CHECK_EQ_INT(p.n_embd, 12345);                         /* untouched */

    CHECK_EQ_INT(kvc_gen_preset("qwen2.5-0.5b", &p), KVC_OK);
    CHECK(strcmp(p.arch, "qwen2") == 0 && p.n_layer == 24 && p.n_embd == 896 && p.n_head == 14 &&
          p.n_head_kv == 2 && p.head_dim == 64 && p.n_ff == 4864 && p.n_vocab == 151936 &&
          p.n_ctx == 32768 && p.rope_theta == 1e6f && p.tied);
    CHECK_EQ_INT(kvc_gen_preset("qwen3-30b-a3b", &p), KVC_OK);
    CHECK(strcmp(p.arch, "qwen3moe") == 0 && p.n_layer == 48 && p.n_embd == 2048 && p.n_head == 32 &&
          p.n_head_kv == 4 && p.head_dim == 128 && p.n_expert == 128 && p.n_expert_used == 8 &&
          p.n_ff_exp == 768 && p.n_vocab == 151936 && !p.tied);
}

/* The sliding-window presets: Gemma 3 4B's and gpt-oss-20b's shapes, and the
 * keys and extra tensors of the tiny ones (loaded and run by test_kernels_batch). */
static void test_swa(void)
{
    kvc_gen_params p;
    CHECK_EQ_INT(kvc_gen_preset("gemma3-4b", &p), KVC_OK);
    CHECK(strcmp(p.arch, "gemma3") == 0 && p.n_embd == 2560 && p.n_layer == 34 && p.n_head == 8 &&
          p.n_head_kv == 4 && p.head_dim == 256 && p.n_ff == 10240 && p.n_swa == 1024 &&
          p.swa_pattern == 6 && p.n_vocab == 262144 && p.tied);
    CHECK_EQ_INT(kvc_gen_preset("gpt-oss-20b", &p), KVC_OK);
    CHECK(strcmp(p.arch, "gpt-oss") == 0 && p.n_embd == 2880 && p.n_layer == 24 && p.n_head == 64 &&
          p.n_head_kv == 8 && p.head_dim == 64 && p.n_expert == 32 && p.n_expert_used == 4 &&
          p.n_ff_exp == 2880 && p.n_swa == 128 && strcmp(p.rope_scaling, "yarn") == 0 &&
          p.rope_factor == 32.0f && p.rope_orig_ctx == 4096 && p.n_vocab == 201088 && !p.tied);

    void *buf = NULL;
    size_t size = 0;
    CHECK_EQ_INT(kvc_gen_preset("tiny-gemma3", &p), KVC_OK);
    p.n_threads = 2;
    gguf_file *f = gen_open(&p, &buf, &size);
    if (f) {
        CHECK_EQ_INT(get_i64(f, "gemma3.attention.sliding_window"), 12);
        CHECK_EQ_INT(get_i64(f, "gemma3.attention.sliding_window_pattern"), 3);
        CHECK(get_f32(f, "gemma3.rope.freq_base_swa") == 1e4f);
        expect_tensor(f, "blk.2.post_attention_norm.weight", 64, 1, KVC_TYPE_F32);
        expect_tensor(f, "blk.2.post_ffw_norm.weight", 64, 1, KVC_TYPE_F32);
        expect_tensor(f, "blk.0.attn_k_norm.weight", 32, 1, KVC_TYPE_F32);
        gguf_close(f);
        free(buf);
    }
    CHECK_EQ_INT(kvc_gen_preset("tiny-gpt-oss", &p), KVC_OK);
    p.n_threads = 2;
    if ((f = gen_open(&p, &buf, &size))) {
        CHECK_EQ_INT(get_i64(f, "gpt-oss.attention.sliding_window"), 8);
        CHECK(gguf_find_kv(f, "gpt-oss.attention.sliding_window_pattern") == NULL);
        CHECK(get_f32(f, "gpt-oss.rope.scaling.factor") == 4.0f);
        CHECK_EQ_INT(get_i64(f, "gpt-oss.rope.scaling.original_context_length"), 512);
        expect_tensor(f, "blk.1.attn_sinks.weight", 4, 1, KVC_TYPE_F32);
        expect_tensor(f, "blk.1.attn_output.bias", 64, 1, KVC_TYPE_F32);
        expect_tensor(f, "blk.1.post_attention_norm.weight", 64, 1, KVC_TYPE_F32);
        expect_tensor(f, "blk.0.ffn_gate_inp.bias", 8, 1, KVC_TYPE_F32);
        expect_tensor(f, "blk.0.ffn_down_exps.bias", 64, 8, KVC_TYPE_F32);
        gguf_close(f);
        free(buf);
    }
    /* both load and run */
    const char *const tiny[] = { "tiny-gemma3", "tiny-gpt-oss" };
    for (size_t i = 0; i < KVC_ARRAY_LEN(tiny); i++) {
        char path[] = "/tmp/kvc_gen_swa_XXXXXX";
        int fd = mkstemp(path);
        CHECK(fd >= 0);
        if (fd < 0)
            continue;
        close(fd);
        CHECK_EQ_INT(kvc_gen_preset(tiny[i], &p), KVC_OK);
        char err[512];
        CHECKF(kvc_gen_write(&p, path, err, sizeof(err)) == KVC_OK, "%s: %s", tiny[i], err);
        kvc_model *m = NULL;
        CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "%s: %s", tiny[i], err);
        if (m) {
            CHECK(m->layers[0].window == p.n_swa && m->layers[p.n_layer - 1].window == 0);
            kvc_model_free(m);
        }
        unlink(path);
    }
}

/* A qwen3moe file: the expert keys, the 3-D expert tensors (GGUF ne = [in,
 * out, experts]) in the file type's mix, the router left F32. */
static void test_moe(void)
{
    kvc_gen_params p;
    CHECK_EQ_INT(kvc_gen_preset("tiny-qwen3moe", &p), KVC_OK);
    p.ftype = "q4_k_m";
    p.n_embd = 256, p.n_ff_exp = 256, p.n_layer = 2, p.n_threads = 2;
    void *buf = NULL;
    size_t size = 0;
    gguf_file *f = gen_open(&p, &buf, &size);
    if (!f)
        return;
    CHECK_EQ_INT(get_i64(f, "qwen3moe.expert_count"), 8);
    CHECK_EQ_INT(get_i64(f, "qwen3moe.expert_used_count"), 2);
    CHECK_EQ_INT(get_i64(f, "qwen3moe.expert_feed_forward_length"), 256);
    CHECK(gguf_find_tensor(f, "blk.0.ffn_gate.weight") == NULL);
    const gguf_tensor *t = gguf_find_tensor(f, "blk.1.ffn_up_exps.weight");
    CHECK(t && t->n_dims == 3 && t->ne[0] == 256 && t->ne[1] == 256 && t->ne[2] == 8 &&
          t->type == KVC_TYPE_Q4_K && t->size == 8 * 256 * kvc_row_size(KVC_TYPE_Q4_K, 256));
    t = gguf_find_tensor(f, "blk.1.ffn_down_exps.weight");      /* "more bits" layer */
    CHECK(t && t->n_dims == 3 && t->type == KVC_TYPE_Q6_K);
    expect_tensor(f, "blk.0.ffn_gate_inp.weight", 256, 8, KVC_TYPE_F32);
    gguf_close(f);
    free(buf);
    p.ftype = "mxfp4_moe";                      /* gpt-oss's mix */
    if (!(f = gen_open(&p, &buf, &size)))
        return;
    t = gguf_find_tensor(f, "blk.1.ffn_down_exps.weight");
    CHECK(t && t->type == KVC_TYPE_MXFP4 && t->size == 8 * 256 * kvc_row_size(KVC_TYPE_MXFP4, 256));
    expect_tensor(f, "blk.1.attn_v.weight", 256, 32, KVC_TYPE_Q8_0);
    CHECK_EQ_INT(get_i64(f, "general.file_type"), 38);
    expect_tensor(f, "blk.0.attn_q_norm.weight", 32, 1, KVC_TYPE_F32);
    /* expert e's rows are a slice of one stream: expert 1 differs from expert 0 */
    t = gguf_find_tensor(f, "blk.0.ffn_gate_exps.weight");
    const size_t one = t ? t->size / 8 : 0;
    CHECK(t && memcmp(t->data, (const uint8_t *)t->data + one, one) != 0);
    gguf_close(f);
    free(buf);
}

static void expect_invalid(const kvc_gen_params *p, const char *needle)
{
    kvc_err err = { 0 };
    void *buf = NULL;
    size_t size = 0;
    int rc = kvc_gen_model_memory(p, &buf, &size, &err);
    CHECKF(rc == KVC_ERR_INVALID_ARG, "%s: rc %d", needle, rc);
    CHECKF(strstr(err.msg, needle) != NULL, "message \"%s\" does not name %s", err.msg, needle);
    CHECK(buf == NULL);
    free(buf);
}

static void test_bad_params(void)
{
    kvc_gen_params p;
    p = small("qwen2", "f32"); p.arch = "gptj";         expect_invalid(&p, "arch");
    p = small("qwen2", "f32"); p.arch = NULL;           expect_invalid(&p, "arch");
    p = small("qwen2", "f32"); p.ftype = "q3_k";        expect_invalid(&p, "ftype");
    p = small("qwen2", "f32"); p.vocab = "wordpiece";   expect_invalid(&p, "vocab");
    p = small("qwen2", "f32"); p.n_head_kv = 3;         expect_invalid(&p, "n_head_kv");
    p = small("qwen2", "f32"); p.n_embd = 66;           expect_invalid(&p, "n_head");
    p = small("qwen2", "f32"); p.head_dim = 15;         expect_invalid(&p, "head_dim");
    p = small("qwen2", "f32"); p.n_layer = 0;           expect_invalid(&p, "n_layer");
    p = small("qwen2", "f32"); p.n_ff = -1;             expect_invalid(&p, "n_ff");
    p = small("qwen2", "f32"); p.n_vocab = 300;         expect_invalid(&p, "n_vocab");
    p = small("qwen2", "f32"); p.rope_theta = 0;        expect_invalid(&p, "rope_theta");
    p = small("qwen2", "f32"); p.n_swa = 8;             expect_invalid(&p, "sliding");
    p = small("gemma3", "f32"); p.n_swa = -1;           expect_invalid(&p, "n_swa");
    p = small("gemma3", "f32"); p.n_swa = 8; p.rope_scaling = "ntk"; expect_invalid(&p, "ntk");
    p = small("gemma3", "f32"); p.n_swa = 8; p.rope_scaling = "yarn"; expect_invalid(&p, "factor");
    kvc_err err = { 0 };
    CHECK_EQ_INT(kvc_gen_model(&p, NULL, &err), KVC_ERR_INVALID_ARG);
}

/* ------------------------------------------------------------- structure */

/* Every key and tensor of p's model, with the types kvc_gen_tensor_type promises. */
static void check_model(const gguf_file *f, const kvc_gen_params *p)
{
    char key[128];
    int64_t hd = p->head_dim ? p->head_dim : p->n_embd / p->n_head;
    int64_t kvh = p->n_head_kv ? p->n_head_kv : p->n_head;
    int64_t d = p->n_embd, q = p->n_head * hd, kv = kvh * hd;
    CHECK(str_is(f, "general.architecture", p->arch));
#define K(suffix) (snprintf(key, sizeof(key), "%s." suffix, p->arch), key)
    CHECK_EQ_INT(get_i64(f, K("embedding_length")), d);
    CHECK_EQ_INT(get_i64(f, K("block_count")), p->n_layer);
    CHECK_EQ_INT(get_i64(f, K("feed_forward_length")), p->n_ff);
    CHECK_EQ_INT(get_i64(f, K("context_length")), p->n_ctx);
    CHECK_EQ_INT(get_i64(f, K("attention.head_count")), p->n_head);
    CHECK_EQ_INT(get_i64(f, K("attention.head_count_kv")), kvh);
    CHECK_EQ_INT(get_i64(f, K("attention.key_length")), hd);
    CHECK_EQ_INT(get_i64(f, K("attention.value_length")), hd);
    CHECK_EQ_INT(get_i64(f, K("rope.dimension_count")), hd);
    CHECK_NEAR(get_f32(f, K("rope.freq_base")), p->rope_theta, 1e-3);
    CHECK_NEAR(get_f32(f, K("attention.layer_norm_rms_epsilon")), p->rms_eps, 1e-12);
    int64_t n_vocab = get_i64(f, K("vocab_size"));
#undef K
    const gguf_kv *toks = NULL;
    CHECK_EQ_INT(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, NULL), KVC_OK);
    CHECK(toks && (int64_t)toks->v.arr.n == n_vocab);
    if (p->n_vocab)
        CHECK_EQ_INT(n_vocab, p->n_vocab);

    bool quantized = strstr("f32 f16 bf16", p->ftype) == NULL;
    int64_t qv = -1;
    CHECK_EQ_INT(gguf_get_i64(f, "general.quantization_version", &qv, NULL),
                 quantized ? KVC_OK : KVC_ERR_NOT_FOUND);
    if (quantized)
        CHECK_EQ_INT(qv, 2);

    int n_expected = 2 + !p->tied;
    int emb_type = kvc_gen_tensor_type(p->ftype, "token_embd.weight", -1, p->n_layer, d, p->tied);
    expect_tensor(f, "token_embd.weight", d, n_vocab, emb_type);
    expect_tensor(f, "output_norm.weight", d, 1, KVC_TYPE_F32);
    if (p->tied)
        CHECK(gguf_find_tensor(f, "output.weight") == NULL);
    else
        expect_tensor(f, "output.weight", d, n_vocab,
                      kvc_gen_tensor_type(p->ftype, "output.weight", -1, p->n_layer, d, false));
    struct { const char *name; int64_t ne0, ne1; bool vec; const char *arch; } per_layer[] = {
        { "attn_norm.weight",   d,  1,        true,  NULL },
        { "attn_q.weight",      d,  q,        false, NULL },
        { "attn_k.weight",      d,  kv,       false, NULL },
        { "attn_v.weight",      d,  kv,       false, NULL },
        { "attn_q.bias",        q,  1,        true,  "qwen2" },
        { "attn_k.bias",        kv, 1,        true,  "qwen2" },
        { "attn_v.bias",        kv, 1,        true,  "qwen2" },
        { "attn_q_norm.weight", hd, 1,        true,  "qwen3" },
        { "attn_k_norm.weight", hd, 1,        true,  "qwen3" },
        { "attn_output.weight", q,  d,        false, NULL },
        { "ffn_norm.weight",    d,  1,        true,  NULL },
        { "ffn_gate.weight",    d,  p->n_ff,  false, NULL },
        { "ffn_up.weight",      d,  p->n_ff,  false, NULL },
        { "ffn_down.weight",    p->n_ff, d,   false, NULL },
    };
    for (int l = 0; l < p->n_layer; l++) {
        for (size_t i = 0; i < sizeof(per_layer) / sizeof(per_layer[0]); i++) {
            char name[96];
            snprintf(name, sizeof(name), "blk.%d.%s", l, per_layer[i].name);
            if (per_layer[i].arch && strcmp(per_layer[i].arch, p->arch) != 0) {
                CHECKF(gguf_find_tensor(f, name) == NULL, "%s should not exist in %s", name, p->arch);
                continue;
            }
            int type = per_layer[i].vec ? KVC_TYPE_F32
                     : kvc_gen_tensor_type(p->ftype, name, l, p->n_layer, per_layer[i].ne0, p->tied);
            expect_tensor(f, name, per_layer[i].ne0, per_layer[i].ne1, type);
            n_expected++;
        }
    }
    CHECK_EQ_INT(gguf_n_tensors(f), n_expected);
}

static void test_archs_and_types(void)
{
    static const char *const archs[] = { "llama", "qwen2", "qwen3" };
    static const char *const types[] = { "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0",
                                         "q5_1", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m" };
    static const uint32_t ftype_ids[] = { 0, 1, 32, 7, 2, 3, 8, 9, 14, 16, 18, 15, 17 };
    for (size_t a = 0; a < 3; a++) {
        for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
            if (t >= 8 && t % 3 != a)                      /* K types are slow: one arch each */
                continue;
            kvc_gen_params p = small(archs[a], types[t]);
            p.tied = (a + t) % 2 == 0;
            if (t >= 8) {                                  /* K types: rows of 256 */
                p.n_embd = 256;
                p.n_ff = 256;
            }
            if (t >= 3)                                    /* quantizing is slow; the mixes */
                p.n_layer = 1;                             /* over layers are tested below */
            void *buf = NULL;
            size_t size = 0;
            int64_t t0 = kvc_time_us();
            gguf_file *f = gen_open(&p, &buf, &size);
            if (!f)
                continue;
            int64_t t1 = kvc_time_us();
            check_model(f, &p);
            if (getenv("KVC_TEST_VERBOSE"))
                printf("  %-6s %-7s gen %6.1f ms check %6.1f ms\n", archs[a], types[t],
                       (t1 - t0) / 1e3, (kvc_time_us() - t1) / 1e3);
            CHECK_EQ_INT(get_i64(f, "general.file_type"), ftype_ids[t]);
            gguf_close(f);
            free(buf);
        }
    }
}

/* ------------------------------------------------------------ type rules */

static void test_type_rules(void)
{
    /* q4_k_m over 8 layers: "more bits" layers are 0, 3, 6, 7 */
    static const bool more[8] = { true, false, false, true, false, false, true, true };
    for (int l = 0; l < 8; l++) {
        int want = more[l] ? KVC_TYPE_Q6_K : KVC_TYPE_Q4_K;
        CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_m", "blk.x.attn_v.weight", l, 8, 256, false), want);
        CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_m", "blk.x.ffn_down.weight", l, 8, 512, false), want);
        CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_m", "blk.x.attn_q.weight", l, 8, 256, false), KVC_TYPE_Q4_K);
        CHECK_EQ_INT(kvc_gen_tensor_type("q5_k_m", "blk.x.ffn_down.weight", l, 8, 512, false),
                     more[l] ? KVC_TYPE_Q6_K : KVC_TYPE_Q5_K);
        /* q4_k_s: attn_v Q5_K in layers 0-3, ffn_down Q5_K in the first eighth */
        CHECK_EQ_INT(kvc_gen_tensor_type("q4_k", "blk.x.attn_v.weight", l, 8, 256, false),
                     l < 4 ? KVC_TYPE_Q5_K : KVC_TYPE_Q4_K);
        CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_s", "blk.x.ffn_down.weight", l, 8, 256, false),
                     l < 1 ? KVC_TYPE_Q5_K : KVC_TYPE_Q4_K);
        CHECK_EQ_INT(kvc_gen_tensor_type("q5_k", "blk.x.attn_v.weight", l, 8, 256, false), KVC_TYPE_Q5_K);
    }
    /* with 2 layers only the last one gets more bits (as tiny-llama-q4_k_m.gguf) */
    CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_m", "blk.0.attn_v.weight", 0, 2, 256, false), KVC_TYPE_Q4_K);
    CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_m", "blk.1.attn_v.weight", 1, 2, 256, false), KVC_TYPE_Q6_K);

    /* output: Q6_K unless the base is Q8_0 or rows do not fit the base block */
    CHECK_EQ_INT(kvc_gen_tensor_type("q4_0", "output.weight", -1, 2, 256, false), KVC_TYPE_Q6_K);
    CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_m", "output.weight", -1, 2, 256, false), KVC_TYPE_Q6_K);
    CHECK_EQ_INT(kvc_gen_tensor_type("q8_0", "output.weight", -1, 2, 256, false), KVC_TYPE_Q8_0);
    CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_m", "token_embd.weight", -1, 2, 256, false), KVC_TYPE_Q4_K);
    CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_m", "token_embd.weight", -1, 2, 256, true), KVC_TYPE_Q6_K);
    CHECK_EQ_INT(kvc_gen_tensor_type("q4_0", "token_embd.weight", -1, 2, 64, false), KVC_TYPE_Q4_0);
    /* Q6_K falls back */
    CHECK_EQ_INT(kvc_gen_tensor_type("q4_0", "output.weight", -1, 2, 64, false), KVC_TYPE_Q8_0);
    CHECK_EQ_INT(kvc_gen_tensor_type("f16", "output.weight", -1, 2, 64, false), KVC_TYPE_F16);
    CHECK_EQ_INT(kvc_gen_tensor_type("bf16", "blk.0.attn_q.weight", 0, 2, 10, false), KVC_TYPE_BF16);

    /* Qwen2.5-0.5B's shapes in q4_k_m (n_embd 896 = 3.5 * 256, n_ff 4864 = 19 * 256):
     * what llama.cpp's own Q4_K_M file of that model holds */
    CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_m", "token_embd.weight", -1, 24, 896, true), KVC_TYPE_Q8_0);
    CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_m", "blk.5.attn_q.weight", 5, 24, 896, true), KVC_TYPE_Q5_0);
    CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_m", "blk.5.ffn_up.weight", 5, 24, 896, true), KVC_TYPE_Q5_0);
    CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_m", "blk.0.attn_v.weight", 0, 24, 896, true), KVC_TYPE_Q8_0);
    CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_m", "blk.4.attn_v.weight", 4, 24, 896, true), KVC_TYPE_Q5_0);
    CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_m", "blk.0.ffn_down.weight", 0, 24, 4864, true), KVC_TYPE_Q6_K);
    CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_m", "blk.4.ffn_down.weight", 4, 24, 4864, true), KVC_TYPE_Q4_K);
    CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_m", "blk.5.ffn_down.weight", 5, 24, 4864, true), KVC_TYPE_Q6_K);
    CHECK_EQ_INT(kvc_gen_tensor_type("q5_k_m", "blk.5.attn_q.weight", 5, 24, 896, true), KVC_TYPE_Q5_1);
    CHECK_EQ_INT(kvc_gen_tensor_type("q6_k", "blk.5.attn_q.weight", 5, 24, 896, true), KVC_TYPE_Q8_0);

    /* rows that fit no block at all: F16 */
    CHECK_EQ_INT(kvc_gen_tensor_type("q8_0", "blk.0.attn_q.weight", 0, 2, 40, false), KVC_TYPE_F16);
    CHECK_EQ_INT(kvc_gen_tensor_type("q4_k_m", "blk.0.attn_q.weight", 0, 2, 40, false), KVC_TYPE_F16);
    CHECK_EQ_INT(kvc_gen_tensor_type("nope", "blk.0.attn_q.weight", 0, 2, 256, false), -1);
}

/* The fallbacks in a generated file: n_embd 96 with q4_k_m. */
static void test_fallback_file(void)
{
    kvc_gen_params p = small("llama", "q4_k_m");
    p.n_embd = 96, p.n_head = 3, p.n_head_kv = 1, p.n_ff = 256, p.n_layer = 8, p.tied = false;
    void *buf;
    size_t size;
    gguf_file *f = gen_open(&p, &buf, &size);
    if (!f)
        return;
    check_model(f, &p);
    expect_tensor(f, "blk.1.attn_q.weight", 96, 96, KVC_TYPE_Q5_0);
    expect_tensor(f, "blk.1.attn_v.weight", 96, 32, KVC_TYPE_Q5_0);
    expect_tensor(f, "blk.0.attn_v.weight", 96, 32, KVC_TYPE_Q8_0);     /* Q6_K -> Q8_0 */
    expect_tensor(f, "blk.1.ffn_down.weight", 256, 96, KVC_TYPE_Q4_K);  /* rows of 256 fit */
    expect_tensor(f, "blk.0.ffn_down.weight", 256, 96, KVC_TYPE_Q6_K);
    expect_tensor(f, "token_embd.weight", 96, get_i64(f, "llama.vocab_size"), KVC_TYPE_Q5_0);
    expect_tensor(f, "output.weight", 96, get_i64(f, "llama.vocab_size"), KVC_TYPE_Q8_0);
    CHECK_EQ_INT(get_i64(f, "general.file_type"), 15);
    gguf_close(f);
    free(buf);

    /* rows of 256 everywhere: the real mix, Q4_K and Q6_K; over 4 layers the
     * "more bits" ones are 2 and 3 */
    p.n_embd = 256, p.n_head = 2, p.n_head_kv = 1, p.n_ff = 256, p.n_layer = 4;
    f = gen_open(&p, &buf, &size);
    if (!f)
        return;
    check_model(f, &p);
    int n_q4k = 0, n_q6k = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        n_q4k += t->type == KVC_TYPE_Q4_K;
        n_q6k += t->type == KVC_TYPE_Q6_K;
        CHECK(t->type == KVC_TYPE_Q4_K || t->type == KVC_TYPE_Q6_K || t->type == KVC_TYPE_F32);
    }
    CHECK_EQ_INT(n_q6k, 1 + 2 * 2);                 /* output + attn_v, ffn_down in 2 of 4 layers */
    CHECK_EQ_INT(n_q4k, 1 + 4 * 7 - 2 * 2);         /* token_embd + the rest */
    expect_tensor(f, "blk.1.attn_v.weight", 256, 128, KVC_TYPE_Q4_K);
    expect_tensor(f, "blk.2.attn_v.weight", 256, 128, KVC_TYPE_Q6_K);
    gguf_close(f);
    free(buf);
}

/* ----------------------------------------------------------- determinism */

static void test_determinism(void)
{
    kvc_gen_params p = small("qwen3", "f16");
    void *a, *b, *c;
    size_t na, nb, nc;
    kvc_err err = { 0 };
    CHECK_EQ_INT(kvc_gen_model_memory(&p, &a, &na, &err), KVC_OK);
    CHECK_EQ_INT(kvc_gen_model_memory(&p, &b, &nb, &err), KVC_OK);
    CHECK(na == nb && memcmp(a, b, na) == 0);
    free(b);

    /* the thread count changes nothing (token_embd is big enough for threads) */
    kvc_gen_params big = p;
    big.n_embd = 128;
    big.n_vocab = 8192;
    big.ftype = "q8_0";
    big.n_threads = 1;
    CHECK_EQ_INT(kvc_gen_model_memory(&big, &b, &nb, &err), KVC_OK);
    big.n_threads = 3;
    CHECK_EQ_INT(kvc_gen_model_memory(&big, &c, &nc, &err), KVC_OK);
    CHECK(nb == nc && memcmp(b, c, nb) == 0);
    free(b);
    free(c);
    p.seed = 43;
    CHECK_EQ_INT(kvc_gen_model_memory(&p, &c, &nc, &err), KVC_OK);
    CHECK(na == nc && memcmp(a, c, na) != 0);
    free(c);

    /* blk.0 does not depend on the number of layers */
    p.seed = 42;
    p.n_layer = 3;
    CHECK_EQ_INT(kvc_gen_model_memory(&p, &b, &nb, &err), KVC_OK);
    gguf_file *fa = NULL, *fb = NULL;
    CHECK_EQ_INT(gguf_open_memory(a, na, &fa, &err), KVC_OK);
    CHECK_EQ_INT(gguf_open_memory(b, nb, &fb, &err), KVC_OK);
    if (fa && fb) {
        const gguf_tensor *ta = gguf_find_tensor(fa, "blk.0.ffn_up.weight");
        const gguf_tensor *tb = gguf_find_tensor(fb, "blk.0.ffn_up.weight");
        CHECK(ta && tb && ta->size == tb->size && memcmp(ta->data, tb->data, ta->size) == 0);
        ta = gguf_find_tensor(fa, "blk.0.ffn_gate.weight");
        CHECK(ta && tb && ta->size == tb->size && memcmp(ta->data, tb->data, ta->size) != 0);
    }
    gguf_close(fa);
    gguf_close(fb);
    free(a);
    free(b);

    /* the file is the memory image */
    char dir[] = "/tmp/kvc_model_gen_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[sizeof(dir) + 32];
    snprintf(path, sizeof(path), "%s/m.gguf", dir);
    p = small("llama", "bf16");
    CHECK_EQ_INT(kvc_gen_model(&p, path, &err), KVC_OK);
    CHECK_EQ_INT(kvc_gen_model_memory(&p, &a, &na, &err), KVC_OK);
    size_t nf = 0;
    char *file = test_read_file(path, &nf);
    CHECK(file && nf == na && memcmp(file, a, na) == 0);
    gguf_file *f = NULL;
    CHECK_EQ_INT(gguf_open(path, &f, &err), KVC_OK);
    if (f)
        check_model(f, &p);
    gguf_close(f);
    free(file);
    free(a);
    unlink(path);
    rmdir(dir);

    /* an unwritable path is an I/O error, named in the message */
    CHECK_EQ_INT(kvc_gen_model(&p, "/nonexistent-dir/m.gguf", &err), KVC_ERR_IO);
    char msg[64] = "";
    CHECK_EQ_INT(kvc_gen_write(&p, "/nonexistent-dir/m.gguf", msg, sizeof(msg)), KVC_ERR_IO);
    CHECK(strstr(msg, "/nonexistent-dir/m.gguf") != NULL);
    CHECK_EQ_INT(kvc_gen_write(&p, "/nonexistent-dir/m.gguf", NULL, 0), KVC_ERR_IO);
}

/* ------------------------------------------------------------ statistics */

static void test_statistics(void)
{
    kvc_gen_params p = small("qwen2", "f32");
    p.n_embd = 256, p.n_ff = 512, p.n_vocab = 2000, p.tied = false;
    void *buf;
    size_t size;
    gguf_file *f = gen_open(&p, &buf, &size);
    if (!f)
        return;
    stats st = tensor_stats(gguf_find_tensor(f, "blk.0.attn_q.weight"), 0, 256);
    CHECK_NEAR(st.mean, 0.0, 0.003);
    CHECK_NEAR(st.std, 1.0 / 16, 0.002);
    CHECK(st.max_abs <= 3.47 / 16 && st.max_abs > 3.0 / 16);   /* bounded, yet reaching 3 sigma */
    st = tensor_stats(gguf_find_tensor(f, "blk.1.ffn_down.weight"), 0, 256);
    CHECK_NEAR(st.std, 1.0 / sqrt(512), 0.002);
    st = tensor_stats(gguf_find_tensor(f, "blk.0.attn_norm.weight"), 0, 1);
    CHECK_NEAR(st.mean, 1.0, 0.03);
    CHECK_NEAR(st.std, 0.1, 0.02);
    st = tensor_stats(gguf_find_tensor(f, "output_norm.weight"), 0, 1);
    CHECK_NEAR(st.mean, 5.0, 0.1);
    st = tensor_stats(gguf_find_tensor(f, "blk.1.attn_k.bias"), 0, 1);
    CHECK_NEAR(st.std, 0.1, 0.03);

    /* quiet rows of the output projection (fillers, lone bytes) are a quarter
     * of the others; the learned tokens are not quiet */
    int32_t n_real = kvc_gen_vocab_size("bpe");
    const gguf_tensor *out = gguf_find_tensor(f, "output.weight");
    stats real = tensor_stats(out, 256, n_real - 3);
    stats fill = tensor_stats(out, n_real, 2000);
    stats bytes = tensor_stats(out, 94, 188);            /* bytes 0xA1-0xFF */
    CHECK_NEAR(real.std, 1.0 / 16, 0.002);
    CHECK_NEAR(fill.std / real.std, 0.25, 0.01);
    CHECK_NEAR(bytes.std / real.std, 0.25, 0.02);
    /* the input embedding of an untied model is not scaled */
    const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    CHECK_NEAR(tensor_stats(emb, n_real, 2000).std, 1.0 / 16, 0.002);
    gguf_close(f);
    free(buf);

    /* the same weights survive quantization roughly */
    static const char *const qt[] = { "q8_0", "q4_k_m", "q6_k", "q4_0", "q5_1" };
    p.n_vocab = 0;
    p.n_layer = 1;
    for (size_t i = 0; i < sizeof(qt) / sizeof(qt[0]); i++) {
        p.ftype = qt[i];
        int type = kvc_gen_tensor_type(qt[i], "blk.0.attn_q.weight", 0, 2, 256, false);
        f = gen_open(&p, &buf, &size);
        if (!f)
            continue;
        const gguf_tensor *t = gguf_find_tensor(f, "blk.0.attn_q.weight");
        CHECK(t && (int)t->type == type);
        st = tensor_stats(t, 0, 256);
        CHECKF(fabs(st.mean) < 0.004 && fabs(st.std - 1.0 / 16) < 0.004, "%s: mean %g std %g",
               qt[i], st.mean, st.std);
        gguf_close(f);
        free(buf);
    }
}

/* ------------------------------------------------------------ vocabulary */

static int32_t find_token(const gguf_kv *toks, const char *s)
{
    for (uint64_t i = 0; i < toks->v.arr.n; i++)
        if (gstr_is(toks->v.arr.strs[i], s))
            return (int32_t)i;
    return -1;
}

static void test_vocab_bpe(void)
{
    kvc_gen_params p = small("qwen2", "f32");
    p.vocab_only = true;
    p.n_vocab = 1000;
    void *buf;
    size_t size;
    gguf_file *f = gen_open(&p, &buf, &size);
    if (!f)
        return;
    CHECK_EQ_INT(gguf_n_tensors(f), 0);
    CHECK(str_is(f, "tokenizer.ggml.model", "gpt2"));
    CHECK(str_is(f, "tokenizer.ggml.pre", "qwen2"));
    const gguf_kv *toks = NULL, *types = NULL, *merges = NULL;
    CHECK_EQ_INT(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, NULL), KVC_OK);
    CHECK_EQ_INT(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &types, NULL), KVC_OK);
    CHECK_EQ_INT(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &merges, NULL), KVC_OK);
    CHECK(gguf_find_kv(f, "tokenizer.ggml.scores") == NULL);
    if (!toks || !types || !merges)
        goto out;
    int32_t n_real = kvc_gen_vocab_size("bpe");
    CHECK(toks->v.arr.n == 1000 && types->v.arr.n == 1000);
    CHECK(n_real > 400 && n_real < 1000);
    CHECK(merges->v.arr.n >= 200);
    /* GPT-2's byte tokens: '!' first, 'Ā' (byte 0) at 188, 'Ġ' (space) at 220 */
    CHECK(gstr_is(toks->v.arr.strs[0], "!"));
    CHECK(gstr_is(toks->v.arr.strs[188], "\xC4\x80"));
    CHECK(gstr_is(toks->v.arr.strs[220], "\xC4\xA0"));
    /* token texts are distinct */
    int dup = 0;
    for (uint64_t i = 0; i < toks->v.arr.n; i++)
        for (uint64_t j = i + 1; j < toks->v.arr.n; j++)
            dup += toks->v.arr.strs[i].len == toks->v.arr.strs[j].len &&
                   memcmp(toks->v.arr.strs[i].s, toks->v.arr.strs[j].s, toks->v.arr.strs[i].len) == 0;
    CHECK_EQ_INT(dup, 0);
    /* every merge joins two tokens into a third */
    int bad = 0;
    for (uint64_t i = 0; i < merges->v.arr.n; i++) {
        char m[256], joined[256];
        gguf_str s = merges->v.arr.strs[i];
        snprintf(m, sizeof(m), "%.*s", (int)s.len, s.s);
        char *sp = strchr(m, ' ');
        if (!sp) { bad++; continue; }
        *sp = 0;
        snprintf(joined, sizeof(joined), "%s%s", m, sp + 1);
        bad += find_token(toks, m) < 0 || find_token(toks, sp + 1) < 0 || find_token(toks, joined) < 0;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(find_token(toks, "\xC4\xA0the") > 255);        /* " the" was learned */
    int32_t eot = find_token(toks, "<|endoftext|>"), ims = find_token(toks, "<|im_start|>"),
            ime = find_token(toks, "<|im_end|>");
    CHECK(eot == n_real - 3 && ims == n_real - 2 && ime == n_real - 1);
    CHECK_EQ_INT(gguf_arr_i64(types, (uint64_t)ims), 3);
    CHECK_EQ_INT(gguf_arr_i64(types, (uint64_t)ime), 3);
    CHECK_EQ_INT(gguf_arr_i64(types, 100), 1);
    CHECK_EQ_INT(get_i64(f, "tokenizer.ggml.bos_token_id"), eot);
    CHECK_EQ_INT(get_i64(f, "tokenizer.ggml.eos_token_id"), ime);
    CHECK_EQ_INT(get_i64(f, "tokenizer.ggml.eot_token_id"), ime);
    bool add_bos = true;
    CHECK_EQ_INT(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos, NULL), KVC_OK);
    CHECK(!add_bos);
    CHECK(gstr_is(toks->v.arr.strs[n_real], "<|filler_0|>"));
    CHECK(gstr_is(toks->v.arr.strs[999], "<|filler_" ) == false);
    CHECK_EQ_INT(find_token(toks, "<|filler_0|>"), n_real);
    CHECK_EQ_INT(gguf_arr_i64(types, 999), 5);
    char *tmpl = NULL;
    CHECK_EQ_INT(gguf_get_str(f, "tokenizer.chat_template", &tmpl, NULL), KVC_OK);
    CHECK(tmpl && strstr(tmpl, "<|im_start|>") && strstr(tmpl, "add_generation_prompt"));
    free(tmpl);
out:
    gguf_close(f);
    free(buf);

    /* llama arch: llama-bpe pre-tokenizer unless told */
    p.arch = "llama";
    f = gen_open(&p, &buf, &size);
    if (f)
        CHECK(str_is(f, "tokenizer.ggml.pre", "llama-bpe"));
    gguf_close(f);
    free(buf);
    p.bpe_pre = "gpt-2";
    f = gen_open(&p, &buf, &size);
    if (f)
        CHECK(str_is(f, "tokenizer.ggml.pre", "gpt-2"));
    gguf_close(f);
    free(buf);
}

static void test_quiet(void)
{
    int32_t nb = kvc_gen_vocab_size("bpe"), ns = kvc_gen_vocab_size("spm");
    CHECK(!kvc_gen_token_quiet("bpe", nb, 0));            /* '!' */
    CHECK(!kvc_gen_token_quiet("bpe", nb, 93));           /* '~' */
    CHECK(kvc_gen_token_quiet("bpe", nb, 94));            /* byte 0xA1 */
    CHECK(kvc_gen_token_quiet("bpe", nb, 188));           /* byte 0x00 */
    CHECK(!kvc_gen_token_quiet("bpe", nb, 220));          /* space */
    CHECK(kvc_gen_token_quiet("bpe", nb, 221));           /* byte 0x7F */
    CHECK(!kvc_gen_token_quiet("bpe", nb, 256));
    CHECK(kvc_gen_token_quiet("bpe", nb, nb - 3));        /* <|endoftext|> */
    CHECK(kvc_gen_token_quiet("bpe", nb, nb - 2));        /* <|im_start|> */
    CHECK(!kvc_gen_token_quiet("bpe", nb, nb - 1));       /* <|im_end|> ends a reply */
    CHECK(kvc_gen_token_quiet("bpe", nb, nb));            /* filler */
    CHECK(kvc_gen_token_quiet("spm", ns, 0) && kvc_gen_token_quiet("spm", ns, 1));
    CHECK(kvc_gen_token_quiet("spm", ns, 3) && kvc_gen_token_quiet("spm", ns, 258));
    CHECK(!kvc_gen_token_quiet("spm", ns, 259));
    CHECK(kvc_gen_token_quiet("spm", ns, ns - 2));
    CHECK(!kvc_gen_token_quiet("spm", ns, ns - 1));
}

static void test_vocab_spm(void)
{
    kvc_gen_params p = small("llama", "f32");
    p.vocab_only = true;
    void *buf;
    size_t size;
    gguf_file *f = gen_open(&p, &buf, &size);
    if (!f)
        return;
    CHECK(str_is(f, "tokenizer.ggml.model", "llama"));
    const gguf_kv *toks = NULL, *types = NULL, *scores = NULL;
    CHECK_EQ_INT(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, NULL), KVC_OK);
    CHECK_EQ_INT(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &types, NULL), KVC_OK);
    CHECK_EQ_INT(gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, &scores, NULL), KVC_OK);
    CHECK(gguf_find_kv(f, "tokenizer.ggml.merges") == NULL);
    if (!toks || !types || !scores)
        goto out;
    int32_t n = kvc_gen_vocab_size("spm");
    CHECK_EQ_INT(toks->v.arr.n, n);
    CHECK(gstr_is(toks->v.arr.strs[0], "<unk>") && gguf_arr_i64(types, 0) == 2);
    CHECK(gstr_is(toks->v.arr.strs[1], "<s>") && gguf_arr_i64(types, 1) == 3);
    CHECK(gstr_is(toks->v.arr.strs[2], "</s>") && gguf_arr_i64(types, 2) == 3);
    CHECK(gstr_is(toks->v.arr.strs[3], "<0x00>") && gguf_arr_i64(types, 3) == 6);
    CHECK(gstr_is(toks->v.arr.strs[3 + 0x0A], "<0x0A>") && gguf_arr_i64(types, 3 + 255) == 6);
    CHECK(gstr_is(toks->v.arr.strs[258], "<0xFF>"));
    /* pieces: normal, scores falling */
    CHECK(gguf_arr_i64(types, 259) == 1);
    for (int32_t i = 260; i < n - 2; i++)
        CHECKF(gguf_arr_f64(scores, (uint64_t)i) < gguf_arr_f64(scores, (uint64_t)i - 1), "score of %d", i);
    CHECK(find_token(toks, "\xE2\x96\x81the") > 258);   /* "▁the" */
    CHECK(find_token(toks, "\xE2\x96\x81") > 258);      /* "▁" */
    CHECK(find_token(toks, "a") > 258 && find_token(toks, "~") > 258);
    CHECK(find_token(toks, "<|im_start|>") == n - 2 && gguf_arr_i64(types, (uint64_t)n - 2) == 3);
    CHECK(find_token(toks, "<|im_end|>") == n - 1 && gguf_arr_i64(types, (uint64_t)n - 1) == 3);
    CHECK_EQ_INT(get_i64(f, "tokenizer.ggml.bos_token_id"), 1);
    CHECK_EQ_INT(get_i64(f, "tokenizer.ggml.eos_token_id"), 2);
    CHECK_EQ_INT(get_i64(f, "tokenizer.ggml.unknown_token_id"), 0);
    CHECK_EQ_INT(get_i64(f, "tokenizer.ggml.eot_token_id"), n - 1);
    bool add_bos = false;
    CHECK_EQ_INT(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos, NULL), KVC_OK);
    CHECK(add_bos);
    /* a piece never holds a control character (those go through byte tokens) */
    for (int32_t i = 259; i < n - 2; i++)
        for (uint64_t k = 0; k < toks->v.arr.strs[i].len; k++)
            CHECK((unsigned char)toks->v.arr.strs[i].s[k] >= 0x20);
out:
    gguf_close(f);
    free(buf);
}

/* The vocabularies tokenize any text and give it back; the learned pieces are used. */
static void roundtrip(const char *vocab, const char *arch)
{
    kvc_gen_params p = small(arch, "f32");
    p.vocab = vocab;
    p.vocab_only = true;
    p.n_vocab = 1200;
    void *buf;
    size_t size;
    gguf_file *f = gen_open(&p, &buf, &size);
    if (!f)
        return;
    kvc_tokenizer *tok = NULL;
    kvc_err err = { 0 };
    int rc = kvc_tokenizer_load(f, &tok, &err);
    CHECKF(rc == KVC_OK, "%s: %s", vocab, err.msg);
    if (rc == KVC_OK) {
        static const char *const texts[] = {
            "Hello, how are you? I am a helpful assistant.",
            "The quick brown fox jumps over the lazy dog. ",
            "  two  spaces,\ttabs\nand newlines\n\n",
            "numbers 12345 and 3.14159, symbols #$%&*{}[]",
            "caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80 <|filler_3|>",
            "<|im_start|>user\nHi<|im_end|>\n",
        };
        for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
            int32_t ids[512];
            int64_t n = kvc_tokenize(tok, texts[i], strlen(texts[i]), false, false, ids, 512);
            CHECKF(n > 0 && n <= 512, "%s: tokenize \"%s\" -> %lld", vocab, texts[i], (long long)n);
            if (n <= 0 || n > 512)
                continue;
            for (int64_t k = 0; k < n; k++)
                CHECKF(kvc_tokenizer_token_type(tok, ids[k]) != 5, "%s: a filler came out", vocab);
            char *back = kvc_detokenize(tok, ids, n, false);
            const char *want = texts[i];
            CHECKF(back && strcmp(back + (back[0] == ' ' && want[0] != ' '), want) == 0,
                   "%s: \"%s\" -> \"%s\"", vocab, want, back ? back : "(null)");
            free(back);
        }
        /* the learned pieces are used: the corpus takes over 2.5 bytes a token */
        const char *c = kvc_gen_corpus();
        int64_t n = kvc_tokenize(tok, c, strlen(c), false, false, NULL, 0);
        CHECKF(n > 0 && n < (int64_t)strlen(c) * 2 / 5, "%s: corpus of %zu bytes -> %lld tokens", vocab,
               strlen(c), (long long)n);
        /* special tokens parse when asked */
        int32_t ids[16];
        n = kvc_tokenize(tok, "<|im_start|>", 12, false, true, ids, 16);
        CHECK(n == 1 && ids[0] == kvc_tokenizer_find(tok, "<|im_start|>"));
        CHECK(kvc_tokenizer_is_eog(tok, kvc_tokenizer_find(tok, "<|im_end|>")));
    }
    kvc_tokenizer_free(tok);
    gguf_close(f);
    free(buf);
}

#define RUN(fn) do { int64_t t_ = kvc_time_us(); fn(); \
    if (getenv("KVC_TEST_VERBOSE")) printf("%-24s %7.1f ms\n", #fn, (kvc_time_us() - t_) / 1e3); } while (0)

static void test_roundtrips(void)
{
    roundtrip("bpe", "qwen2");
    roundtrip("bpe", "llama");
    roundtrip("spm", "llama");
}

/* Per-layer FFN widths: ff_layers repeated over the layers, double_wide_mlp
 * (gemma4's KV-shared layers twice as wide), Gemma 4 E2B's shape and its cut,
 * the feed_forward_length array and the tensors' shapes; bad lists refused. */
static void test_ff_layers(void)
{
    kvc_gen_params p;
    int32_t ff[64];
    CHECK_EQ_INT(kvc_gen_preset("gemma4-e2b", &p), KVC_OK);
    CHECK(strcmp(p.arch, "gemma4") == 0 && p.n_layer == 35 && p.n_embd == 1536 && p.n_head == 8 &&
          p.n_head_kv == 1 && p.head_dim == 512 && p.head_dim_swa == 256 && p.n_swa == 512 &&
          p.swa_pattern == 5 && p.n_embd_per_layer == 256 && p.n_kv_shared == 20 && p.double_wide_mlp);
    CHECK_EQ_INT(kvc_gen_layer_ff(&p, ff), 1);
    CHECK(ff[0] == 6144 && ff[14] == 6144 && ff[15] == 12288 && ff[34] == 12288);
    kvc_gen_cut_layers(&p, 10);              /* 5 layers keep K/V (a whole pattern), 5 shared */
    CHECK_EQ_INT(p.n_kv_shared, 5);
    CHECK_EQ_INT(kvc_gen_layer_ff(&p, ff), 1);
    CHECK(ff[4] == 6144 && ff[5] == 12288 && ff[9] == 12288);

    void *buf = NULL;
    size_t size = 0;
    p = small("llama", "f32");
    p.n_layer = 3, p.ff_layers = "96,64";
    gguf_file *f = gen_open(&p, &buf, &size);
    if (f) {
        const gguf_kv *kv = gguf_find_kv(f, "llama.feed_forward_length");
        CHECK(kv && kv->type == GGUF_TYPE_ARRAY && kv->v.arr.n == 3 && gguf_arr_i64(kv, 0) == 96 &&
              gguf_arr_i64(kv, 1) == 64 && gguf_arr_i64(kv, 2) == 96);
        expect_tensor(f, "blk.1.ffn_gate.weight", 64, 64, KVC_TYPE_F32);
        expect_tensor(f, "blk.1.ffn_down.weight", 64, 64, KVC_TYPE_F32);
        expect_tensor(f, "blk.2.ffn_down.weight", 96, 64, KVC_TYPE_F32);
        gguf_close(f);
        free(buf);
    }
    p.ff_layers = "80";                      /* one width: the scalar key */
    if ((f = gen_open(&p, &buf, &size))) {
        CHECK_EQ_INT(get_i64(f, "llama.feed_forward_length"), 80);
        expect_tensor(f, "blk.0.ffn_up.weight", 64, 80, KVC_TYPE_F32);
        gguf_close(f);
        free(buf);
    }
    p = small("llama", "f32"); p.ff_layers = "96,x";     expect_invalid(&p, "ff_layers");
    p = small("llama", "f32"); p.ff_layers = "96,0";     expect_invalid(&p, "ff_layers");
    p = small("llama", "f32"); p.ff_layers = "";         expect_invalid(&p, "ff_layers");
    p = small("llama", "f32"); p.double_wide_mlp = true; expect_invalid(&p, "double_wide_mlp");
}

int main(void)
{
    int64_t t0 = kvc_time_us();
    RUN(test_presets);
    RUN(test_moe);
    RUN(test_swa);
    RUN(test_ff_layers);
    RUN(test_bad_params);
    RUN(test_type_rules);
    RUN(test_archs_and_types);
    RUN(test_fallback_file);
    RUN(test_determinism);
    RUN(test_statistics);
    RUN(test_vocab_bpe);
    RUN(test_vocab_spm);
    RUN(test_quiet);
    RUN(test_roundtrips);
    printf("test_model_gen: %.2f s\n", (kvc_time_us() - t0) / 1e6);
    return test_done("test_model_gen");
}
