/* test_gdn.c - the Gated DeltaNet hybrids (qwen35, qwen35moe, qwen3next;
 * forward_gdn.c).
 *
 * Bitwise invariance of the recurrence: a prompt of 200 tokens fed in one
 * batch, in chunks of 64, 7 and 1 (token by token), with 1 and 2 threads, on
 * every ISA this CPU has, gives bitwise-equal logits at every position AND
 * bitwise-equal states (conv and delta state) of every recurrent layer after
 * it; three sequences batched together (their tokens interleaved) give each
 * sequence the logits and states it has alone. Models: make-model's
 * tiny-qwen35 (f32, q8_0: the vnni ISA's integer matmuls) and tiny-qwen35moe
 * (3 V heads per K head, shared expert), tiny-qwen3next (f32, f16: V heads
 * grouped by K head, fused projections), and ../shared's tiny-qwen35* when
 * present. The scalar ISA's logits are the reference the SIMD ISAs stay
 * within 0.1 of (logits of std ~5; the avx2/vnni matmuls' 16-bit activations
 * drift by up to 0.05 over 200 positions of these random models).
 *
 * Context shift is refused for these models with a clear error: by the
 * engine (overflow 'shift'), by the chat prompt builder when a prompt would
 * need it, and by the forward pass's K mover. */
#include <math.h>
#include <unistd.h>

#include "forward.h"
#include "kernels.h"
#include "kvchat.h"
#include "model_gen.h"
#include "chat_template.h"
#include "prompt.h"
#include "test.h"

#define N_TOK 200

static char tmpdir[256];

/* A pool for model m with its recurrent layers' states (as context.c lays it out). */
static kvc_kv_pool *pool_for(const kvc_model *m, int64_t n_blocks)
{
    const kvc_hparams *hp = &m->hp;
    kvc_kv_layer layers[64];
    kvc_kv_group full = { KVC_KV_FULL, 0, 0 };
    if (hp->n_layer > 64)
        return NULL;
    for (int32_t l = 0; l < hp->n_layer; l++)
        layers[l] = (kvc_kv_layer){ 0, m->layers[l].n_head_kv, m->layers[l].head_dim,
                                    m->layers[l].state_floats };
    kvc_kv_pool_params pp = { hp->n_layer, hp->n_head_kv, hp->head_dim, 0, KVC_TYPE_F16, n_blocks,
                              1, &full, layers };
    kvc_kv_pool *pool = NULL;
    kvc_err e = { 0 };
    CHECKF(kvc_kv_pool_new(&pp, &pool, &e) == KVC_OK, "pool: %s", e.msg);
    return pool;
}

/* Every recurrent layer's state of seq, concatenated into out (malloc'd). */
static float *states_of(const kvc_model *m, kvc_kv_pool *pool, kvc_kv_seq *seq, size_t *n_out)
{
    size_t n = 0;
    for (int32_t l = 0; l < m->hp.n_layer; l++)
        n += (size_t)m->layers[l].state_floats;
    float *out = malloc(KVC_MAX(n, 1) * sizeof(float));
    size_t at = 0;
    for (int32_t l = 0; out && l < m->hp.n_layer; l++) {
        if (!m->layers[l].state_floats)
            continue;
        const float *s = kvc_kv_seq_state(pool, seq, l);
        CHECK(s != NULL);
        if (s)
            memcpy(out + at, s, (size_t)m->layers[l].state_floats * sizeof(float));
        at += (size_t)m->layers[l].state_floats;
    }
    *n_out = n;
    return out;
}

/* n_seq sequences of n tokens each (toks[s * n + i]); tokens fed in batches
 * of `chunk` positions with n_threads. together: each batch holds the next
 * `chunk` positions of every sequence, interleaved; else one sequence after
 * another. logits[s][i][n_vocab] and the states after the last token,
 * states[s][state floats], out. */
static bool run(kvc_model *m, const int32_t *toks, int n_seq, int n, int chunk, int n_threads,
                bool together, float *logits, float *states)
{
    const kvc_hparams *hp = &m->hp;
    kvc_kv_pool *pool = pool_for(m, 4 * ((n + 15) / 16) + 4);
    kvc_compute *c = NULL;
    kvc_err e = { 0 };
    kvc_kv_seq seq[4];
    const int max_batch = chunk * (together ? n_seq : 1);
    kvc_batch_item *items = malloc((size_t)max_batch * sizeof(*items));
    float *out = malloc((size_t)max_batch * hp->n_vocab * sizeof(float));
    bool ok = pool && items && out && n_seq <= 4 &&
              kvc_compute_new(m, max_batch, n + 16, n_threads, &c, &e) == KVC_OK;
    for (int s = 0; s < n_seq; s++)
        kvc_kv_seq_init(&seq[s]);
    for (int s = 0; ok && s < n_seq; s++)
        ok = kvc_kv_seq_reserve(pool, &seq[s], n, &e) == KVC_OK;
    for (int r = 0; ok && r < (together ? 1 : n_seq); r++)
        for (int i0 = 0; ok && i0 < n; i0 += chunk) {
            int k = 0;
            for (int i = i0; i < KVC_MIN(n, i0 + chunk); i++)
                for (int s = 0; s < n_seq; s++)
                    if (together || s == r)
                        items[k++] = (kvc_batch_item){ toks[s * n + i], i, &seq[s], true };
            ok = kvc_compute_forward(c, pool, items, k, out, &e) == KVC_OK;
            for (int b = 0; ok && b < k; b++) {
                const int s = (int)(items[b].seq - seq), i = items[b].pos;
                memcpy(logits + ((size_t)s * n + i) * hp->n_vocab, out + (size_t)b * hp->n_vocab,
                       (size_t)hp->n_vocab * sizeof(float));
            }
        }
    CHECKF(ok, "run: %s", e.msg);
    size_t ns = 0;
    for (int s = 0; ok && s < n_seq; s++) {
        float *st = states_of(m, pool, &seq[s], &ns);
        if (st)
            memcpy(states + (size_t)s * ns, st, ns * sizeof(float));
        free(st);
    }
    for (int s = 0; pool && s < n_seq; s++)
        kvc_kv_seq_release(pool, &seq[s]);
    kvc_compute_free(c);
    kvc_kv_pool_free(pool);
    free(items);
    free(out);
    return ok;
}

static size_t state_floats(const kvc_model *m)
{
    size_t n = 0;
    for (int32_t l = 0; l < m->hp.n_layer; l++)
        n += (size_t)m->layers[l].state_floats;
    return n;
}

/* The model at path: chunkings, thread counts and mixed batches give the same
 * bits, logits and states, on every ISA; the ISAs agree within 2e-3. */
static void check_path(const char *path, const char *label)
{
    kvc_model *m = NULL;
    char err[512];
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "load %s: %s", label, err);
    if (!m)
        return;
    CHECKF(kvc_model_recurrent(m), "%s: no recurrent layer", label);
    enum { NS = 3 };
    const size_t V = (size_t)m->hp.n_vocab, S = state_floats(m);
    int32_t toks[NS * N_TOK];
    for (int i = 0; i < NS * N_TOK; i++)
        toks[i] = (int32_t)((2654435761u * (uint32_t)(i + 7)) % (uint32_t)V);
    const size_t nl = (size_t)N_TOK * V;
    float *base = malloc(NS * nl * sizeof(float)), *l = malloc(NS * nl * sizeof(float));
    float *bst = malloc(NS * S * sizeof(float)), *st = malloc(NS * S * sizeof(float));
    float *ref = malloc(nl * sizeof(float));
    const int chunks[] = { 64, 7, 1 };
    const kvc_isa def = kvc_kernels_isa();
    bool have_ref = false;
    for (int isa = KVC_ISA_SCALAR; isa <= KVC_ISA_VNNI; isa++) {
        if (kvc_kernels_set_isa((kvc_isa)isa) != KVC_OK)
            continue;
        const char *in = kvc_isa_name((kvc_isa)isa);
        if (!run(m, toks, 1, N_TOK, N_TOK, 1, false, base, bst))
            break;
        /* the state is not all zeros: the recurrence ran */
        double mag = 0;
        for (size_t i = 0; i < S; i++)
            mag += fabs(bst[i]);
        CHECKF(mag > 0 && isfinite(mag), "%s %s: state magnitude %g", in, label, mag);
        for (int threads = 1; threads <= 2; threads++)
            for (size_t c = 0; c < KVC_ARRAY_LEN(chunks); c++) {
                if (!run(m, toks, 1, N_TOK, chunks[c], threads, false, l, st))
                    continue;
                CHECKF(memcmp(base, l, nl * sizeof(float)) == 0,
                       "%s %s: logits in chunks of %d with %d threads differ from one batch", in, label,
                       chunks[c], threads);
                CHECKF(memcmp(bst, st, S * sizeof(float)) == 0,
                       "%s %s: states after chunks of %d with %d threads differ from one batch", in,
                       label, chunks[c], threads);
            }
        /* the ISAs compute the same function, to rounding */
        if (!have_ref) {
            memcpy(ref, base, nl * sizeof(float));
            have_ref = true;
        } else {
            double dev = 0;
            for (size_t i = 0; i < nl; i++)
                dev = fmax(dev, fabs((double)ref[i] - base[i]));
            CHECKF(dev < 0.1, "%s %s: logits %g from the scalar ISA's", in, label, dev);
        }
        /* three conversations interleaved in batches of 7 and 64 positions, 2
         * threads: each token's logits and each sequence's states are those
         * of the sequence alone */
        for (size_t c = 0; c < 2; c++) {
            if (!run(m, toks, NS, N_TOK, chunks[c], 1, false, base, bst) ||
                !run(m, toks, NS, N_TOK, chunks[c], 2, true, l, st))
                continue;
            CHECKF(memcmp(base, l, NS * nl * sizeof(float)) == 0,
                   "%s %s: logits of %d interleaved sequences (chunks of %d) differ from each alone",
                   in, label, NS, chunks[c]);
            CHECKF(memcmp(bst, st, NS * S * sizeof(float)) == 0,
                   "%s %s: states of %d interleaved sequences differ from each alone", in, label, NS);
            CHECKF(memcmp(st, st + S, S * sizeof(float)) != 0, "%s: two sequences' states equal", label);
        }
    }
    kvc_kernels_set_isa(def);
    free(base);
    free(l);
    free(bst);
    free(st);
    free(ref);
    kvc_model_free(m);
}

static bool make_preset(const char *preset, const char *ftype, char *path, size_t size)
{
    snprintf(path, size, "%s/%s-%s.gguf", tmpdir, preset, ftype);
    kvc_gen_params p;
    CHECK_EQ_INT(kvc_gen_preset(preset, &p), KVC_OK);
    p.ftype = ftype;
    p.n_threads = 2;
    char err[512];
    int rc = kvc_gen_write(&p, path, err, sizeof(err));
    CHECKF(rc == KVC_OK, "gen %s %s: %s", preset, ftype, err);
    return rc == KVC_OK;
}

/* Context shift: refused with an error that says why, wherever it would run. */
static void check_no_shift(const char *path)
{
    kvc_model *m = NULL;
    char err[512];
    if (kvc_model_load(path, NULL, &m, err, sizeof(err)) != KVC_OK)
        return;
    kvc_engine_params ep = kvc_engine_default_params();
    ep.overflow = KVC_OVERFLOW_SHIFT;
    ep.n_ctx = 256;
    ep.n_parallel = 1;
    kvc_engine *e = NULL;
    CHECK_EQ_INT(kvc_engine_new(m, &ep, &e, err, sizeof(err)), KVC_ERR_UNSUPPORTED);
    CHECKF(e == NULL && strstr(err, "shift") && strstr(err, "qwen35") && strstr(err, "recurrent"), "%s", err);

    /* the prompt builder: a conversation longer than the context */
    static char text[4000];
    for (int i = 0; i + 6 < (int)sizeof(text); i += 6)
        memcpy(text + i, "words ", 6);
    kvc_chat_message msgs[] = { { .role = "user", .content = text },
                                { .role = "assistant", .content = "ok" },
                                { .role = "user", .content = "and?" } };
    kvc_chat_params cp = kvc_chat_default_params();
    cp.overflow = KVC_OVERFLOW_SHIFT;
    cp.max_tokens = 16;
    kvc_chat_template *tmpl = NULL;
    kvc_err ke = { 0 };
    kvc_tokbuf toks = { 0 };
    int32_t dropped = 0;
    kvc_chat_template_params tp = { .jinja = m->chat_template };
    if (kvc_chat_template_new(&tp, &tmpl, &ke) == KVC_OK) {
        int rc = kvc_prompt_chat(m, tmpl, msgs, 3, &cp, 256, &toks, &dropped, NULL, &ke);
        CHECK_EQ_INT(rc, KVC_ERR_CONTEXT_LENGTH);
        CHECKF(strstr(ke.msg, "context shift is not supported for qwen35"), "%s", ke.msg);
        CHECK_EQ_INT(dropped, 0);
    } else {
        CHECKF(0, "template: %s", ke.msg);
    }
    kvc_tokbuf_free(&toks);
    kvc_chat_template_free(tmpl);

    /* the K mover itself */
    kvc_compute *c = NULL;
    kvc_kv_pool *pool = pool_for(m, 8);
    if (pool && kvc_compute_new(m, 16, 64, 1, &c, &ke) == KVC_OK) {
        int32_t blocks[2] = { 0, 1 };
        CHECK_EQ_INT(kvc_compute_move_kv(c, pool, blocks, 16, blocks, 0, 8, &ke), KVC_ERR_UNSUPPORTED);
        CHECKF(strstr(ke.msg, "context shift not supported for qwen35"), "%s", ke.msg);
    }
    kvc_compute_free(c);
    kvc_kv_pool_free(pool);
    kvc_model_free(m);
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvc_test_gdn_XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    char path[512];
    if (make_preset("tiny-qwen35", "f32", path, sizeof(path))) {
        check_path(path, "tiny-qwen35 f32");
        check_no_shift(path);
    }
    if (make_preset("tiny-qwen35", "q8_0", path, sizeof(path)))
        check_path(path, "tiny-qwen35 q8_0");
    if (make_preset("tiny-qwen35moe", "f32", path, sizeof(path)))
        check_path(path, "tiny-qwen35moe f32");
    if (make_preset("tiny-qwen3next", "f32", path, sizeof(path)))
        check_path(path, "tiny-qwen3next f32");
    if (make_preset("tiny-qwen3next", "f16", path, sizeof(path)))
        check_path(path, "tiny-qwen3next f16");
    /* every layer gated attention (full_attention_interval 1): no recurrent
     * layer, the gated attention's buffers still there */
    {
        kvc_gen_params p;
        kvc_gen_preset("tiny-qwen35", &p);
        p.full_attn_interval = 1;
        p.n_threads = 2;
        snprintf(path, sizeof(path), "%s/all-attn.gguf", tmpdir);
        char err[512];
        kvc_model *m = NULL;
        kvc_context *ctx = NULL;
        CHECKF(kvc_gen_write(&p, path, err, sizeof(err)) == KVC_OK, "gen: %s", err);
        CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "load: %s", err);
        kvc_context_params cp = kvc_context_default_params();
        cp.n_ctx = 64;
        if (m && kvc_context_new(m, &cp, &ctx, err, sizeof(err)) == KVC_OK) {
            const int32_t toks[] = { 1, 2, 3, 4, 5 };
            CHECK(!kvc_model_recurrent(m) && m->layers[0].attn_gated);
            CHECKF(kvc_context_decode(ctx, 0, toks, 5, true, err, sizeof(err)) == KVC_OK, "decode: %s", err);
            CHECK(isfinite(kvc_context_logits(ctx, 4)[0]));
        }
        kvc_context_free(ctx);
        kvc_model_free(m);
    }
    const char *const shared[] = { "tiny-qwen35-f32", "tiny-qwen35-q8_0", "tiny-qwen35moe-f32" };
    const char *dir = test_shared_dir();
    for (size_t i = 0; i < KVC_ARRAY_LEN(shared); i++) {
        char sp[4400];
        snprintf(sp, sizeof(sp), "%s/models/%s.gguf", dir ? dir : "", shared[i]);
        if (dir && access(sp, R_OK) == 0)
            check_path(sp, shared[i]);
        else
            printf("test_gdn: no %s, skipped\n", sp);
    }
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_done("test_gdn");
}
