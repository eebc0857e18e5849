/* test_qwen3next.c - qwen3next (Qwen3-Next, Qwen3-Coder-Next) against
 * llama.cpp, without llama.cpp.
 *
 * make-model's tiny-qwen3next (f32, seed 42; 3 GDN layers with 3 V heads per
 * K head in the fused ssm_in / ssm_ba form, 1 gated attention layer, experts
 * with a gated shared expert), generated here, fed N_TOK tokens in one batch
 * with an F32 KV cache, gives on every ISA this CPU has logits within TOL of
 * llama.cpp's at the positions and vocabulary ids of
 * tests/ref/qwen3next-llamacpp.txt (its header says how they were made), and
 * llama.cpp's argmax wherever llama.cpp's margin exceeds 2 TOL. A forward pass
 * that reads the V heads tiled (qwen35's order), swaps beta and alpha, the
 * query and its gate, or q and k, is off by more than 1 there.
 * The same model with its fused projections split as newer files store them
 * (attn_qkv, attn_gate beside ssm_ba) gives bitwise the same logits; a GDN
 * layer with neither form is refused, naming the tensor. */
#include "test.h"
#include "gguf_edit.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernels.h"
#include "model.h"
#include "model_gen.h"

#define N_TOK 40
#define TOL   2e-3     /* llama.cpp's F32 graph vs ours: at most 4e-4 seen (avx2, vnni) */

static char dir[] = "/tmp/kvc_qwen3next_XXXXXX";

/* The reference's tokens: those of its header. */
static void ref_tokens(int32_t *toks)
{
    for (int i = 0; i < N_TOK; i++)
        toks[i] = (int32_t)((1000003 * (i + 1)) % 2000 + 3);
}

/* The logits [N_TOK][n_vocab] of the model at path, one batch, F32 KV, on the
 * current ISA; malloc'd, NULL (a failed check) on error. */
static float *logits_of(const char *path, int32_t *n_vocab)
{
    kvc_model *m = NULL;
    char err[512];
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "%s", err);
    if (!m)
        return NULL;
    *n_vocab = m->hp.n_vocab;
    int32_t toks[N_TOK];
    ref_tokens(toks);
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 64;
    cp.n_threads = 2;
    cp.kv_type = KVC_KV_F32;
    float *out = test_chunked_logits(m, cp, toks, N_TOK, N_TOK);
    kvc_model_free(m);
    return out;
}

typedef struct ref_entry {
    int32_t pos, id;
    float   logit;
} ref_entry;

/* The reference's lines "pos id logit" (after '#' comments) into e[]; the count. */
static int read_ref(ref_entry *e, int max)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/tests/ref/qwen3next-llamacpp.txt", KVC_SOURCE_DIR);
    FILE *f = fopen(path, "r");
    CHECKF(f != NULL, "cannot open %s", path);
    int n = 0;
    char line[256];
    while (f && n < max && fgets(line, sizeof(line), f))
        if (line[0] != '#' && sscanf(line, "%d %d %f", &e[n].pos, &e[n].id, &e[n].logit) == 3)
            n++;
    if (f)
        fclose(f);
    return n;
}

/* Our logits against the reference: the largest |ours - llama.cpp|, and
 * per position the argmax where llama.cpp's top-1 (among the listed ids,
 * which hold its top 3) leads by more than 2 TOL. */
static double compare(const float *l, int32_t n_vocab, const ref_entry *e, int n, int *argmax_checked)
{
    double worst = 0.0;
    *argmax_checked = 0;
    for (int i = 0; i < n; i++) {
        CHECK(e[i].pos < N_TOK && e[i].id < n_vocab);
        if (e[i].pos >= N_TOK || e[i].id >= n_vocab)
            return 1e9;
        worst = fmax(worst, fabs((double)l[(size_t)e[i].pos * n_vocab + e[i].id] - e[i].logit));
    }
    for (int i = 0; i < n;) {
        int j = i, top = i;
        float second = -INFINITY;
        for (; j < n && e[j].pos == e[i].pos; j++)
            if (e[j].logit > e[top].logit)
                top = j;
        for (int k = i; k < j; k++)
            if (k != top)
                second = fmaxf(second, e[k].logit);
        const float *row = l + (size_t)e[i].pos * n_vocab;
        int32_t best = 0;
        for (int32_t v = 1; v < n_vocab; v++)
            if (row[v] > row[best])
                best = v;
        if (e[top].logit - second > 2 * TOL) {
            CHECKF(best == e[top].id, "position %d: argmax %d, llama.cpp's %d", e[i].pos, best, e[top].id);
            (*argmax_checked)++;
        }
        i = j;
    }
    return worst;
}

/* dst: the model at src with every layer's ssm_in split into attn_qkv (q of
 * every K head, k of every K head, then the V heads' v in order) and
 * attn_gate (their z), as newer qwen3next files store them; without any
 * projection of the GDN layers when `drop` (a broken file). */
static void split_fused(const char *src, const char *dst, bool drop)
{
    gguf_file *f = NULL;
    kvc_err err = { 0 };
    CHECKF(gguf_open(src, &f, &err) == KVC_OK, "%s", err.msg);
    if (!f)
        return;
    uint32_t d = 0, n_k = 0, n_v = 0;
    gguf_get_u32(f, "qwen3next.ssm.state_size", &d, &err);
    gguf_get_u32(f, "qwen3next.ssm.group_count", &n_k, &err);
    gguf_get_u32(f, "qwen3next.ssm.time_step_rank", &n_v, &err);
    CHECK(d > 0 && n_k > 0 && n_v % n_k == 0);
    gguf_writer *w = gguf_writer_new();
    CHECK(test_gguf_copy_keys(f, w, NULL));
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.s);
        if (!strstr(name, ".ssm_in.weight")) {
            CHECK(gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->size) == KVC_OK);
            continue;
        }
        if (drop)
            continue;
        const size_t row = t->size / (size_t)t->ne[1];   /* whole rows: any type */
        const size_t r = n_v / n_k, per_k = (2 + 2 * r) * d;
        const size_t conv = (2 * n_k + n_v) * (size_t)d, inner = n_v * (size_t)d;
        uint8_t *qkv = malloc(conv * row), *z = malloc(inner * row);
        const uint8_t *s = t->data;
        for (size_t hk = 0; qkv && z && hk < n_k; hk++) {
            const uint8_t *h = s + hk * per_k * row;
            memcpy(qkv + hk * d * row, h, d * row);                               /* q */
            memcpy(qkv + (n_k + hk) * d * row, h + d * row, d * row);             /* k */
            memcpy(qkv + (2 * n_k + hk * r) * d * row, h + 2 * d * row, r * d * row);   /* v */
            memcpy(z + hk * r * d * row, h + (2 + r) * d * row, r * d * row);     /* z */
        }
        char nq[128], nz[128];
        snprintf(nq, sizeof(nq), "%.*s.attn_qkv.weight", (int)(strstr(name, ".ssm_in") - name), name);
        snprintf(nz, sizeof(nz), "%.*s.attn_gate.weight", (int)(strstr(name, ".ssm_in") - name), name);
        const int64_t ne_q[2] = { t->ne[0], (int64_t)conv }, ne_z[2] = { t->ne[0], (int64_t)inner };
        CHECK(qkv && z && gguf_writer_add_tensor(w, nq, t->type, 2, ne_q, qkv, conv * row) == KVC_OK);
        CHECK(qkv && z && gguf_writer_add_tensor(w, nz, t->type, 2, ne_z, z, inner * row) == KVC_OK);
        free(qkv);
        free(z);
    }
    CHECKF(gguf_writer_write(w, dst, &err) == KVC_OK, "%s", err.msg);
    gguf_writer_free(w);
    gguf_close(f);
}

int main(void)
{
    if (!mkdtemp(dir))
        return 1;
    char fused[sizeof(dir) + 32], split[sizeof(dir) + 32], broken[sizeof(dir) + 32];
    snprintf(fused, sizeof(fused), "%s/fused.gguf", dir);
    snprintf(split, sizeof(split), "%s/split.gguf", dir);
    snprintf(broken, sizeof(broken), "%s/broken.gguf", dir);
    kvc_gen_params p;
    CHECK(kvc_gen_preset("tiny-qwen3next", &p) == KVC_OK);
    p.n_threads = 2;
    char err[512];
    CHECKF(kvc_gen_write(&p, fused, err, sizeof(err)) == KVC_OK, "%s", err);

    ref_entry ref[256];
    const int n_ref = read_ref(ref, 256);
    CHECK(n_ref >= 40);
    const kvc_isa def = kvc_kernels_isa();
    for (int isa = KVC_ISA_SCALAR; isa <= KVC_ISA_VNNI; isa++) {
        if (kvc_kernels_set_isa((kvc_isa)isa) != KVC_OK)
            continue;
        int32_t nv = 0;
        float *l = logits_of(fused, &nv);
        int n_arg = 0;
        const double worst = l ? compare(l, nv, ref, n_ref, &n_arg) : 1e9;
        printf("test_qwen3next: %s: max |ours - llama.cpp| %.6f over %d logits, argmax checked at %d "
               "positions\n", kvc_isa_name((kvc_isa)isa), worst, n_ref, n_arg);
        CHECKF(worst < TOL, "%s: max |ours - llama.cpp| %g (tolerance %g)", kvc_isa_name((kvc_isa)isa),
               worst, TOL);
        CHECK(n_arg >= 6);
        free(l);
    }
    kvc_kernels_set_isa(def);

    /* the split form: the same rows, so the same bits */
    split_fused(fused, split, false);
    int32_t nv = 0, nv2 = 0;
    float *a = logits_of(fused, &nv), *b = logits_of(split, &nv2);
    CHECK(a && b && nv == nv2);
    CHECK(a && b && memcmp(a, b, (size_t)N_TOK * nv * sizeof(float)) == 0);
    free(a);
    free(b);

    split_fused(fused, broken, true);
    kvc_model *m = NULL;
    CHECK(kvc_model_load(broken, NULL, &m, err, sizeof(err)) != KVC_OK);
    CHECKF(strstr(err, "tensor blk.0.attn_qkv.weight (or ssm_in.weight) missing"), "%s", err);
    kvc_model_free(m);

    char cmd[sizeof(dir) + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return test_done("test_qwen3next");
}
