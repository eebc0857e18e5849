/* test_shift_k.c - kvc_compute_shift_k (the context shift's re-rotation of
 * cached keys) on models whose layers rotate differently: gemma3 (sliding
 * layers with base 1e4, global ones with 1e6 and linear scaling), gpt-oss
 * (YaRN) and gemma4 (sliding layers of 16 dims, global ones of 32 with
 * proportional RoPE: a quarter of the pairs rotate). Tokens computed at positions 0.. and shifted by d must hold the
 * keys of the same tokens computed after d other tokens: on layer 0, whose
 * keys depend only on the token and its position, within 2e-3 of the keys'
 * scale. Layer 0 slides with pattern 3 and is global with pattern 1. A layer
 * rotated with another layer's frequencies is off by far more. */
#include "forward.h"
#include "kvchat.h"
#include "model_gen.h"
#include "test.h"

#include <math.h>
#include <unistd.h>

#define N   40
#define D   23

/* Compute n tokens at positions 0.. into seq (F32 K/V). */
static bool run(kvc_compute *c, kvc_kv_pool *pool, kvc_kv_seq *seq, const int32_t *toks, int n,
                float *out)
{
    kvc_batch_item items[N + D];
    kvc_err e = { 0 };
    if (kvc_kv_seq_reserve(pool, seq, n, &e) != KVC_OK) {
        CHECKF(0, "reserve: %s", e.msg);
        return false;
    }
    for (int i = 0; i < n; i++)
        items[i] = (kvc_batch_item){ toks[i], i, seq, i == n - 1 };
    int rc = kvc_compute_forward(c, pool, items, n, out, &e);
    CHECKF(rc == KVC_OK, "forward: %s", e.msg);
    return rc == KVC_OK;
}

static float key_of(kvc_kv_pool *pool, const kvc_kv_seq *s, int p, int l, int h, int d)
{
    const int B = kvc_kv_block_tokens(pool);
    const float *head = kvc_kv_k(pool, s->blocks[p / B], l, h);
    return head[d * B + p % B];
}

static void check(const char *preset, int swa_pattern)
{
    char path[] = "/tmp/kvc_shift_k_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return;
    close(fd);
    kvc_gen_params g;
    CHECK_EQ_INT(kvc_gen_preset(preset, &g), KVC_OK);
    g.n_threads = 2;
    g.swa_pattern = swa_pattern;
    if (strcmp(g.arch, "gemma3") == 0)
        g.rope_scaling = "linear", g.rope_factor = 8.0f;   /* as Gemma 3 4B's global layers */
    char err[512];
    kvc_model *m = NULL;
    CHECKF(kvc_gen_write(&g, path, err, sizeof(err)) == KVC_OK, "%s", err);
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "%s", err);
    unlink(path);
    if (!m)
        return;
    const kvc_hparams *hp = &m->hp;
    kvc_kv_layer layers[64];   /* each layer with its own KV heads and head dim (gemma4's differ) */
    kvc_kv_group full = { KVC_KV_FULL, 0, 0 };
    for (int l = 0; l < hp->n_layer && l < 64; l++)
        layers[l] = (kvc_kv_layer){ 0, m->layers[l].n_head_kv, m->layers[l].head_dim, 0 };
    kvc_kv_pool_params pp = { hp->n_layer, hp->n_head_kv, hp->head_dim, 0, KVC_TYPE_F32, 16, 1, &full, layers };
    kvc_kv_pool *pool = NULL;
    kvc_compute *c = NULL;
    kvc_err e = { 0 };
    kvc_kv_seq a, b;
    kvc_kv_seq_init(&a);
    kvc_kv_seq_init(&b);
    float *out = malloc((size_t)hp->n_vocab * sizeof(float));
    int32_t toks[N + D];   /* D others, then the N tokens */
    for (int i = 0; i < N + D; i++)
        toks[i] = (int32_t)(3 + (2654435761u * (uint32_t)(i + 1)) % (uint32_t)(hp->n_vocab - 3));
    bool ok = out && kvc_kv_pool_new(&pp, &pool, &e) == KVC_OK &&
              kvc_compute_new(m, N + D, N + D, 1, &c, &e) == KVC_OK;
    CHECKF(ok, "%s: %s", preset, e.msg);
    ok = ok && run(c, pool, &a, toks + D, N, out) && run(c, pool, &b, toks, N + D, out);
    if (ok) {
        CHECKF(kvc_compute_shift_k(c, pool, &a, 0, N, D, &e) == KVC_OK, "shift: %s", e.msg);
        for (int l = 0; l < 1; l++) {
            double worst = 0, scale = 0;
            for (int p = 0; p < N; p++)
                for (int h = 0; h < m->layers[l].n_head_kv; h++)
                    for (int d = 0; d < m->layers[l].head_dim; d++) {
                        const float x = key_of(pool, &a, p, l, h, d), y = key_of(pool, &b, p + D, l, h, d);
                        worst = fmax(worst, fabs((double)x - y));
                        scale = fmax(scale, fabs((double)y));
                    }
            printf("  %s pattern %d layer %d (%s, base %g): shifted keys within %.2g of %.2g\n", preset,
                   swa_pattern, l, m->layers[l].window ? "sliding" : "global", m->layers[l].rope_theta,
                   worst, scale);
            CHECKF(worst <= 2e-3 * scale, "%s layer %d (%s): shifted keys off by %g of %g", preset, l,
                   m->layers[l].window ? "sliding" : "global", worst, scale);
        }
    }
    kvc_kv_seq_release(pool, &a);
    kvc_kv_seq_release(pool, &b);
    kvc_compute_free(c);
    kvc_kv_pool_free(pool);
    free(out);
    kvc_model_free(m);
}

int main(void)
{
    check("tiny-gemma3", 3);
    check("tiny-gemma3", 1);
    check("tiny-gpt-oss", 0);
    check("tiny-gemma4", 3);
    check("tiny-gemma4", 1);
    return test_done("test_shift_k");
}
