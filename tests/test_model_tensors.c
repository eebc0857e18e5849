/* test_model_tensors.c - a GGUF's every tensor is read or refused by name:
 * a file holding a tensor its architecture's row does not bind (a bias, a
 * norm, another layer kind's tensor, a layer past block_count, a global
 * the row lacks) is refused with an error naming the tensor and the
 * architecture, where it once loaded and gave wrong logits; the blocks of
 * multi-token prediction (nextn_predict_layers) are skipped on purpose;
 * every model in ../shared/models and every make-model preset (widths cut,
 * their tensor set kept) loads; Gemma 4 E4B's preset has its KV-shared
 * layers, kept in proportion when its layers are cut. */
#include "test.h"
#include "gguf_edit.h"

#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include "arch.h"
#include "gguf.h"
#include "model.h"
#include "model_gen.h"
#include "quant.h"

static char dir[] = "/tmp/kvc_model_tensors_XXXXXX";

/* Load path; the return code, the error message in msg (the model released). */
static int load(const char *path, char *msg, size_t n, int32_t *n_layer)
{
    kvc_err err = { 0 };
    kvc_model *m = NULL;
    int rc = kvc_model_load_file(path, NULL, NULL, &m, &err);
    snprintf(msg, n, "%s", err.msg);
    if (m && n_layer)
        *n_layer = m->hp.n_layer;
    kvc_model_release(m);
    return rc;
}

/* Generate preset `preset` (n_layer layers when > 0) at path. */
static bool gen(const char *preset, int32_t n_layer, const char *path)
{
    kvc_gen_params p;
    CHECK_EQ_INT(kvc_gen_preset(preset, &p), KVC_OK);
    if (n_layer > 0)
        p.n_layer = n_layer;
    p.n_threads = 1;
    kvc_err err = { 0 };
    int rc = kvc_gen_model(&p, path, &err);
    CHECKF(rc == KVC_OK, "%s: %s", preset, err.msg);
    return rc == KVC_OK;
}

/* A copy of src at dst with every key (block_count = n_block when > 0) and
 * tensor, plus F32 tensors `extra` (NULL-terminated) of n floats each. */
static void with_tensors(const char *src, const char *dst, int32_t n_block, const char *const *extra,
                         int64_t n)
{
    kvc_err err = { 0 };
    gguf_file *f = NULL;
    CHECKF(gguf_open(src, &f, &err) == KVC_OK, "%s", err.msg);
    if (!f)
        return;
    char arch[64], key[96];
    const gguf_kv *a = gguf_find_kv(f, "general.architecture");
    snprintf(arch, sizeof(arch), "%.*s", a ? (int)a->v.str.len : 0, a ? a->v.str.s : "");
    snprintf(key, sizeof(key), "%s.block_count", arch);
    gguf_writer *w = gguf_writer_new();
    CHECK(test_gguf_copy_keys(f, w, n_block > 0 ? key : NULL));
    if (n_block > 0) {
        CHECK(gguf_writer_set_u32(w, key, (uint32_t)n_block) == KVC_OK);
        snprintf(key, sizeof(key), "%s.nextn_predict_layers", arch);
        CHECK(gguf_writer_set_u32(w, key, 1) == KVC_OK);
    }
    CHECK(test_gguf_copy_tensors(f, w));
    float *x = calloc((size_t)n, sizeof(float));
    for (const char *const *e = extra; x && e && *e; e++)
        CHECK(gguf_writer_add_tensor(w, *e, KVC_TYPE_F32, 1, (const int64_t[]){ n }, x,
                                     (size_t)n * sizeof(float)) == KVC_OK);
    free(x);
    CHECKF(gguf_writer_write(w, dst, &err) == KVC_OK, "%s", err.msg);
    gguf_writer_free(w);
    gguf_close(f);
}

/* A tensor the row does not read, of the shape llama.cpp would give it where
 * it has one: the file is refused, naming the tensor and the architecture;
 * the same file without it loads. */
static void test_extra_refused(void)
{
    static const struct {
        const char *preset, *arch, *tensor;
        int64_t     n;
    } cases[] = {
        /* Nemotron-H's optional dense FFN biases (llama.cpp adds them when present);
         * layer 1 of tiny-nemotron_h ("M-M-M*-") is a ReLU² MLP of 96 */
        { "tiny-nemotron_h", "nemotron_h", "blk.1.ffn_up.bias", 96 },
        { "tiny-nemotron_h", "nemotron_h", "blk.1.ffn_down.bias", 64 },
        /* a QK-norm on a row without one */
        { "tiny-llama", "llama", "blk.0.attn_q_norm.weight", 16 },
        /* Qwen2's optional output bias; Llama's attention output bias */
        { "tiny", "qwen2", "output.bias", 0 },
        { "tiny-llama", "llama", "blk.1.attn_output.bias", 64 },
        /* another layer kind's tensor: a norm of attention on a Mamba-2 layer */
        { "tiny-granitehybrid", "granitehybrid", "blk.0.attn_q.bias", 64 },
        /* a layer past block_count, and a global the row lacks (a reranker head) */
        { "tiny-qwen3", "qwen3", "blk.2.attn_norm.weight", 64 },
        { "tiny-qwen3", "qwen3", "cls.output.weight", 64 },
    };
    char src[sizeof(dir) + 32], dst[sizeof(dir) + 32], msg[512], want[256];
    snprintf(src, sizeof(src), "%s/src.gguf", dir);
    snprintf(dst, sizeof(dst), "%s/extra.gguf", dir);
    const char *made = NULL;
    for (size_t i = 0; i < KVC_ARRAY_LEN(cases); i++) {
        if ((!made || strcmp(made, cases[i].preset) != 0) && !gen(cases[i].preset, 0, src))
            continue;
        made = cases[i].preset;
        CHECKF(load(src, msg, sizeof(msg), NULL) == KVC_OK, "%s: %s", made, msg);
        const char *extra[] = { cases[i].tensor, NULL };
        with_tensors(src, dst, 0, extra, cases[i].n ? cases[i].n : 2048);
        CHECK_EQ_INT(load(dst, msg, sizeof(msg), NULL), KVC_ERR_UNSUPPORTED);
        snprintf(want, sizeof(want), "architecture %s: tensor %s is not supported (1 tensor of the file not read)",
                 cases[i].arch, cases[i].tensor);
        CHECKF(strstr(msg, want) != NULL, "%s + %s: %s", made, cases[i].tensor, msg);
    }
    /* several: the first in file order is named, all are counted */
    if (gen("tiny-qwen3", 0, src)) {
        const char *extra[] = { "blk.0.attn_q.bias", "blk.1.attn_k.bias", "foo.weight", NULL };
        with_tensors(src, dst, 0, extra, 128);
        CHECK_EQ_INT(load(dst, msg, sizeof(msg), NULL), KVC_ERR_UNSUPPORTED);
        CHECKF(strstr(msg, "architecture qwen3: tensor blk.0.attn_q.bias is not supported (3 tensors"), "%s", msg);
    }
}

/* Qwen3.5's multi-token-prediction block (block_count 5 with
 * nextn_predict_layers 1): its tensors are skipped, the main pass has the 4
 * layers; a tensor of a block past it is still refused. */
static void test_mtp_skipped(void)
{
    char src[sizeof(dir) + 32], dst[sizeof(dir) + 32], msg[512];
    snprintf(src, sizeof(src), "%s/q35.gguf", dir);
    snprintf(dst, sizeof(dst), "%s/q35mtp.gguf", dir);
    if (!gen("tiny-qwen35", 0, src))
        return;
    const char *mtp[] = { "blk.4.nextn.enorm.weight", "blk.4.attn_norm.weight", NULL };
    with_tensors(src, dst, 5, mtp, 64);
    int32_t n_layer = 0;
    CHECKF(load(dst, msg, sizeof(msg), &n_layer) == KVC_OK, "%s", msg);
    CHECK_EQ_INT(n_layer, 4);
    const char *past[] = { "blk.4.nextn.enorm.weight", "blk.5.attn_norm.weight", NULL };
    with_tensors(src, dst, 5, past, 64);
    CHECK_EQ_INT(load(dst, msg, sizeof(msg), NULL), KVC_ERR_UNSUPPORTED);
    CHECKF(strstr(msg, "architecture qwen35: tensor blk.5.attn_norm.weight is not supported"), "%s", msg);
}

/* Every model of ../shared/models loads (each was made by llama.cpp's
 * tools or for its references: none holds a tensor we do not read). */
static void test_shared_models(void)
{
    const char *shared = test_shared_dir();
    char path[4200], msg[512];
    snprintf(path, sizeof(path), "%s/models", shared ? shared : "");
    DIR *d = shared ? opendir(path) : NULL;
    if (!d) {
        printf("  ../shared/models: skipped (absent)\n");
        return;
    }
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        const size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 5, ".gguf") != 0)
            continue;
        snprintf(path, sizeof(path), "%s/models/%s", shared, e->d_name);
        CHECKF(load(path, msg, sizeof(msg), NULL) == KVC_OK, "%s", msg);
        n++;
    }
    closedir(d);
    CHECK(n >= 10);
    printf("  %d models of ../shared/models load\n", n);
}

/* Every make-model preset loads. The large ones are generated with their
 * architecture, layer kinds and optional parts (shared experts, per-layer
 * embeddings, KV-shared layers, biases) but narrow, few layers and the
 * built-in vocabulary, so that the test stays small. */
static void test_presets(void)
{
    char path[sizeof(dir) + 32], msg[512];
    snprintf(path, sizeof(path), "%s/preset.gguf", dir);
    int n = 0;
    for (const char *name; (name = kvc_gen_preset_name(n)) != NULL; n++) {
        kvc_gen_params p;
        CHECK_EQ_INT(kvc_gen_preset(name, &p), KVC_OK);
        if (strncmp(name, "tiny", 4) != 0 && strcmp(name, "demo") != 0) {
            kvc_gen_cut_layers(&p, p.layer_pattern ? (int32_t)strlen(p.layer_pattern) : 12);
            p.n_vocab = 0;
            p.n_embd = 128;
            p.n_ff = 128;
            p.n_ff_exp = 64;
            p.n_ff_shexp = p.n_ff_shexp ? 64 : 0;
            p.n_expert = KVC_MIN(p.n_expert, 8);
            p.n_expert_used = KVC_MIN(p.n_expert_used, p.n_expert);
            p.n_embd_per_layer = p.n_embd_per_layer ? 16 : 0;
            if (p.ssm_d_inner > 0)   /* Mamba-2: d_inner = 2 n_embd, heads of 32 */
                p.ssm_d_inner = 2 * p.n_embd, p.ssm_n_head = p.ssm_d_inner / 32;
        }
        p.n_threads = 2;
        kvc_err err = { 0 };
        CHECKF(kvc_gen_model(&p, path, &err) == KVC_OK, "preset %s: %s", name, err.msg);
        CHECKF(load(path, msg, sizeof(msg), NULL) == KVC_OK, "preset %s: %s", name, msg);
    }
    CHECK(n >= 30);
}

/* Gemma 4 E4B's preset has its 18 KV-shared layers of 42 (it once had none);
 * cut to fewer layers they keep their share, the layers keeping K/V ending
 * with a whole sliding pattern of 6 (a sliding and a global layer for the
 * shared ones to read), and the cut model loads with them. */
static void test_kv_shared_cut(void)
{
    kvc_gen_params p;
    CHECK_EQ_INT(kvc_gen_preset("gemma4-e4b", &p), KVC_OK);
    CHECK(p.n_layer == 42 && p.n_kv_shared == 18 && p.swa_pattern == 6 && p.n_embd_per_layer == 256);
    static const int32_t cut[][2] = { { 42, 18 }, { 24, 12 }, { 12, 6 }, { 7, 1 }, { 6, 0 }, { 3, 0 } };
    for (size_t i = 0; i < KVC_ARRAY_LEN(cut); i++) {
        kvc_gen_preset("gemma4-e4b", &p);
        kvc_gen_cut_layers(&p, cut[i][0]);
        CHECKF(p.n_layer == cut[i][0] && p.n_kv_shared == cut[i][1], "cut to %d: %d layers, %d shared",
               cut[i][0], p.n_layer, p.n_kv_shared);
    }
    CHECK_EQ_INT(kvc_gen_preset("gemma4-26b-a4b", &p), KVC_OK);
    kvc_gen_cut_layers(&p, 12);
    CHECK(p.n_layer == 12 && p.n_kv_shared == 0);
    /* the cut E4B shape, narrow: layers 6-11 read layers 4 (sliding) and 5 (global) */
    kvc_gen_preset("gemma4-e4b", &p);
    kvc_gen_cut_layers(&p, 12);
    p.n_embd = 64, p.n_ff = 64, p.n_vocab = 0, p.ftype = "f32", p.n_embd_per_layer = 16, p.n_threads = 1;
    void *buf = NULL;
    size_t size = 0;
    kvc_err err = { 0 };
    CHECKF(kvc_gen_model_memory(&p, &buf, &size, &err) == KVC_OK, "%s", err.msg);
    char path[] = "/tmp/kvc_gen_e4b_XXXXXX";
    const int fd = buf ? mkstemp(path) : -1;
    CHECK(fd >= 0 && write(fd, buf, size) == (ssize_t)size);
    if (fd >= 0)
        close(fd);
    free(buf);
    kvc_model *m = NULL;
    CHECKF(fd >= 0 && kvc_model_load_file(path, NULL, NULL, &m, &err) == KVC_OK, "%s", err.msg);
    for (int il = 0; m && il < 12; il++)
        CHECK_EQ_INT(m->layers[il].kv_layer, il < 6 ? il : il % 6 == 5 ? 5 : 4);
    kvc_model_release(m);
    unlink(path);
}

int main(void)
{
    CHECK(mkdtemp(dir) != NULL);
    test_extra_refused();
    test_mtp_skipped();
    test_shared_models();
    test_presets();
    test_kv_shared_cut();
    char cmd[sizeof(dir) + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return test_done("test_model_tensors");
}
