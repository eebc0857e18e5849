/* test_arch_ref.c - the architectures no shared tiny model covers
 * (nemotron_h_moe, lfm2moe, nemotron_h) against llama.cpp without llama.cpp:
 * make-model generates each tiny preset here (F32, deterministic: the same
 * bytes on every machine), the forward pass runs 40 tokens, and the logits
 * must equal llama.cpp's, committed in tests/ref_logits/<preset>.txt (how
 * they were made: its README), within 1e-3 (measured: 3e-5; a logit's scale
 * is about 5), with llama.cpp's top-1 token our top-1 over the whole
 * vocabulary. The tokens go in one batch and in chunks of 7 (the chunked
 * run must be bitwise the same). A KV block holds the attention layers'
 * K/V only. tiny-gemma4-dw (gemma4 with FFN widths 96, 64, ... and
 * double-wide KV-shared layers, as Gemma 4 E2B) has a wider tolerance:
 * llama.cpp's CPU GELU goes through an fp16 table, ours is exact (measured:
 * 0.067 over these logits, 0.115 over the whole vocabulary, 0.006 at position
 * 0; one width for every
 * layer, as the uniform build reads it, is off by several units). Needs
 * nothing from ../shared. */
#include "test.h"

#include "context.h"
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_TOK 40

/* One reference file against the model generated from its preset, within
 * tol of llama.cpp's logits. */
static void check_preset(const char *dir, const char *preset, double tol)
{
    char path[512], ref[512];
    kvc_model *m = test_gen_model(dir, preset, path, sizeof(path));
    snprintf(ref, sizeof(ref), "%s/tests/ref_logits/%s.txt", KVC_SOURCE_DIR, preset);
    FILE *f = fopen(ref, "r");
    CHECKF(f != NULL, "%s: cannot open", ref);
    if (!m || !f) {
        if (f)
            fclose(f);
        kvc_model_free(m);
        return;
    }
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    int32_t toks[N_TOK];
    for (int i = 0; i < N_TOK; i++)
        toks[i] = (int32_t)((1000003u * (uint32_t)(i + 1)) % 2000u + 3u);
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 256;
    cp.n_threads = 1;
    cp.kv_type = KVC_KV_F32;
    float *l = test_chunked_logits(m, cp, toks, N_TOK, N_TOK);
    float *l7 = test_chunked_logits(m, cp, toks, N_TOK, 7);
    CHECKF(l && l7 && memcmp(l, l7, (size_t)N_TOK * info.n_vocab * sizeof(float)) == 0,
           "%s: logits in chunks of 7 differ from one batch", preset);
    /* K/V only for the attention layers (FFN-only and recurrent layers: none;
     * the sliding and KV-shared ones of gemma4 are other memory groups) */
    const bool g4 = strcmp(m->hp.arch->name, "gemma4") == 0;
    kvc_context *ctx = g4 ? NULL : test_new_context(m, 256, 16, 1, 64);
    size_t want_bytes = 0;
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        const kvc_layer *L = &m->layers[il];
        if (L->attn == KVC_ATTN_FULL)
            want_bytes += 2 * (size_t)KVC_BLOCK_TOKENS * (size_t)L->n_head_kv * (size_t)L->head_dim * 2;
    }
    CHECKF(g4 || (ctx && kvc_kv_block_bytes(ctx->pool) == want_bytes), "%s: a block of %zu bytes, its attention "
           "layers' K/V (F16) %zu", preset, ctx ? kvc_kv_block_bytes(ctx->pool) : 0, want_bytes);
    kvc_context_free(ctx);
    char line[256];
    double worst = 0.0;
    int n = 0, tops = 0, last_pos = -1;
    while (l && fgets(line, sizeof(line), f)) {
        int pos, id;
        double want;
        if (line[0] == '#' || sscanf(line, "%d %d %lf", &pos, &id, &want) != 3)
            continue;
        if (pos < 0 || pos >= N_TOK || id < 0 || id >= info.n_vocab) {
            CHECKF(0, "%s: bad line '%s'", ref, line);
            break;
        }
        const float *row = l + (size_t)pos * info.n_vocab;
        worst = fmax(worst, fabs(row[id] - want));
        n++;
        if (pos != last_pos) {   /* llama.cpp's top-1: ours too, over the whole vocabulary */
            int best = 0;
            for (int v = 1; v < info.n_vocab; v++)
                best = row[v] > row[best] ? v : best;
            CHECKF(best == id || row[best] - row[id] < tol, "%s: position %d: top-1 %d (%g), llama.cpp's %d (%g)",
                   preset, pos, best, row[best], id, row[id]);
            tops++;
            last_pos = pos;
        }
    }
    fclose(f);
    CHECKF(n >= 100 && tops >= 6, "%s: only %d reference logits at %d positions", ref, n, tops);
    CHECKF(worst <= tol, "%s: max |ours - llama.cpp| %.3g over %d logits (tolerance %g)", preset, worst, n, tol);
    printf("  %-22s max |ours - llama.cpp| %.2e over %d logits at %d positions\n", preset, worst, n, tops);
    free(l);
    free(l7);
    kvc_model_free(m);
    unlink(path);
}

/* tiny-gemma4-dw's layers have their own FFN widths: ff_layers 96, 64 in
 * turn, doubled on the three KV-shared layers (E2B's double-wide MLPs), the
 * widest as hp.n_ff; read back from the file's feed_forward_length array. */
static void check_dw_widths(const char *dir)
{
    char path[512];
    kvc_model *m = test_gen_model(dir, "tiny-gemma4-dw", path, sizeof(path));
    static const int32_t want[9] = { 96, 64, 96, 64, 96, 64, 192, 128, 192 };
    CHECK(m != NULL && m->hp.n_layer == 9);
    for (int il = 0; m && il < m->hp.n_layer && il < 9; il++)
        CHECKF(m->layers[il].n_ff == want[il] && m->layers[il].w_down.n_in == want[il],
               "tiny-gemma4-dw layer %d: n_ff %d, expected %d", il, m->layers[il].n_ff, want[il]);
    CHECK(m && m->hp.n_ff == 192);
    kvc_model_free(m);
    unlink(path);
}

int main(void)
{
    char dir[] = "/tmp/kvc_arch_ref_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    static const struct { const char *name; double tol; } presets[] = {
        { "tiny-nemotron_h_moe", 1e-3 }, { "tiny-lfm2moe", 1e-3 }, { "tiny-nemotron_h", 1e-3 },
        { "tiny-gemma4-dw", 0.1 },
    };
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
        check_preset(dir, presets[i].name, presets[i].tol);
    check_dw_widths(dir);
    rmdir(dir);
    return test_done("test_arch_ref");
}
