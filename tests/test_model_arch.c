/* test_model_arch.c - the architecture table (arch.h): every runnable row's
 * generated model loads with every table tensor bound where the row says,
 * architectures known but not run yet and unknown ones are refused with an
 * error naming them, and a missing required key or tensor is named. Needs
 * nothing from ../shared. */
#include "test.h"

#include <stdlib.h>
#include <unistd.h>

#include "arch.h"
#include "gguf.h"
#include "model.h"
#include "model_gen.h"

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
    static const char *const later[] = { "gemma4", "qwen35", "qwen35moe", "lfm2", "granitehybrid" };
    for (size_t i = 0; i < KVC_ARRAY_LEN(later); i++) {
        write_stub(path, later[i], false);
        kvc_model *m = NULL;
        int rc = load(path, &m, msg, sizeof(msg));
        CHECK_EQ_INT(rc, KVC_ERR_UNSUPPORTED);
        CHECKF(strstr(msg, "architecture") && strstr(msg, later[i]) && strstr(msg, "not supported yet"),
               "%s: %s", later[i], msg);
        CHECK(m == NULL);
    }
    write_stub(path, "lfm2", false);
    kvc_model *m = NULL;
    load(path, &m, msg, sizeof(msg));
    CHECKF(strstr(msg, "architecture lfm2: short-convolution recurrent layers are not supported yet"), "%s", msg);

    write_stub(path, "frobnicator", false);
    CHECK_EQ_INT(load(path, &m, msg, sizeof(msg)), KVC_ERR_UNSUPPORTED);
    CHECKF(strstr(msg, "architecture 'frobnicator' not supported") && strstr(msg, "llama") &&
           strstr(msg, "qwen3"), "%s", msg);

    /* a runnable row without its required keys: the first missing one is named */
    write_stub(path, "qwen3", true);
    CHECK(load(path, &m, msg, sizeof(msg)) != KVC_OK);
    CHECKF(strstr(msg, "metadata key qwen3.embedding_length missing"), "%s", msg);
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
        for (int il = 0; il < m->hp.n_layer; il++) {
            const kvc_layer *L = &m->layers[il];
            CHECK_EQ_INT(L->attn, KVC_ATTN_FULL);
            CHECK_EQ_INT(L->ffn, a->ffn);
            CHECK_EQ_INT(L->n_head, p.n_head);
            CHECK_EQ_INT(L->n_head_kv, p.n_head_kv);
            CHECK_EQ_INT(L->head_dim, p.head_dim ? p.head_dim : p.n_embd / p.n_head);
            CHECK(L->attn_norm && L->ffn_norm && L->wq.data && L->wo.data);
            CHECK_EQ_INT(L->bq != NULL, strcmp(a->name, "qwen2") == 0 || strcmp(a->name, "gpt-oss") == 0);
            CHECK_EQ_INT(L->q_norm != NULL, strcmp(a->name, "qwen3") == 0 || strcmp(a->name, "qwen3moe") == 0 ||
                                                strcmp(a->name, "gemma3") == 0);
            CHECK_EQ_INT(L->sinks != NULL, strcmp(a->name, "gpt-oss") == 0);
            CHECK_EQ_INT(L->post_ffn_norm != NULL, strcmp(a->name, "gemma3") == 0);
            CHECK_EQ_INT(L->w_gate.data != NULL, a->ffn == KVC_FFN_DENSE);
            CHECK_EQ_INT(L->router.data != NULL, a->ffn == KVC_FFN_MOE);
            if (a->ffn == KVC_FFN_MOE) {
                CHECK_EQ_INT(L->gate_exps.n, p.n_expert);
                CHECK_EQ_INT(L->down_exps.w.n_in, p.n_ff_exp);
                CHECK_EQ_INT(L->down_exps.w.n_out, p.n_embd);
                CHECK(L->down_exps.stride == L->down_exps.w.row_bytes * (size_t)p.n_embd);
                CHECK(L->gate_up_exps.n == 0 && L->router_b == NULL && L->shexp_gate.data == NULL);
            }
        }
        kvc_model_release(m);
    }
    CHECK(n_rows >= 3);
}

int main(void)
{
    CHECK(mkdtemp(dir) != NULL);
    test_refused();
    test_rows();
    char cmd[sizeof(dir) + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return test_done("test_model_arch");
}
