/* test_snapshot_session.c - a turn's use of recurrent snapshots
 * (session_snap.c, the hooks in session_turn.c and turn_prepare.c), in
 * process, on a generated attention model whose pool is given one more,
 * recurrent, layer the forward pass never touches: the pool then has states,
 * so every cached length must be one a snapshot (or the session's own state)
 * serves, while the replies can be checked against a context without it. The
 * five-turn scenario of issue 32 with S = 64: T1 400 tokens; T2 = T1 + its
 * reply + 300; T3 = T2 + its reply + 20; T4 diverges right after T1's
 * prompt; T5 20 tokens earlier; T6 is T1 again, T7 T3 again (each served
 * whole from a snapshot's logits, nothing run; T3 ends inside a block).
 * Checked: the tokens cached (every one before the divergence, T5 at least
 * 380 - S), the replies equal a cold context's (greedy and seeded), the
 * store's and the tree's invariants; a context shift refused. */
#include "context.h"
#include "session.h"
#include "snapshot.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_T1  400
#define N_GEN 12
#define S_INT 64

/* Give context c's pool one more layer, recurrent, of `floats` floats. */
static void add_fake_state(kvc_context *c, int64_t floats)
{
    const kvc_kv_pool_params *old = kvc_kv_pool_params_of(c->pool);
    const int32_t L = old->n_layer;
    kvc_kv_layer *layers = calloc((size_t)L + 1, sizeof(*layers));
    kvc_kv_group full = { KVC_KV_FULL, 0, 0 };
    for (int32_t l = 0; l < L; l++)
        layers[l] = old->layers ? old->layers[l] : (kvc_kv_layer){ 0, 0, 0, 0 };
    layers[L] = (kvc_kv_layer){ 0, 0, 0, floats };
    kvc_kv_pool_params pp = *old;
    pp.n_layer = L + 1;
    pp.n_groups = 1;
    pp.groups = &full;
    pp.layers = layers;
    kvc_kv_pool *pool = NULL;
    kvc_err e = { 0 };
    kvc_pc_free(c->pc);
    CHECKF(kvc_kv_pool_new(&pp, &pool, &e) == KVC_OK, "%s", e.msg);
    /* the forward pass checks the pool's layers against the model's: the
     * extra one (read by nothing but the snapshots, which take every state
     * at once) is hidden from it; the pool reads n_layer only when made */
    ((kvc_kv_pool_params *)kvc_kv_pool_params_of(pool))->n_layer = L;
    kvc_kv_pool_free(c->pool);
    c->pool = pool;
    CHECK(kvc_pc_new(pool, &c->pc, &e) == KVC_OK);
    CHECKF(kvc_snaps_new(pool, c->pc, c->model->hp.n_vocab, &c->snaps, &e) == KVC_OK, "%s", e.msg);
    c->snap_interval = S_INT;
    free(layers);
}

static bool room(kvc_context *c, int64_t n_free, void *user)
{
    return kvc_context_make_room(c, n_free);
}

typedef struct result {
    char   *text;
    int32_t cached, computed;
    int32_t *toks;      /* prompt and reply tokens */
    int64_t n_toks;
} result;

/* One completion turn of tokens[0, n) on s, alone. */
static result turn(kvc_session *s, const int32_t *tokens, int64_t n, uint64_t seed, int dropped,
                   int *rc_out)
{
    kvc_chat_params p = kvc_chat_default_params();
    p.max_tokens = N_GEN;
    if (seed) {
        p.sampling.temperature = 0.8f;
        p.sampling.seed = seed;
    } else
        p.sampling.temperature = 0;
    kvc_turn *t = NULL;
    kvc_err e = { 0 };
    result r = { 0 };
    int rc = kvc_turn_new(s, tokens, n, KVC_TURN_COMPLETION, &p, NULL, NULL, kvc_time_us(), &t, &e);
    if (!rc) {
        kvc_turn_set_dropped(t, dropped);
        rc = kvc_turn_prepare(t, room, NULL, &e);
    }
    while (!rc && kvc_turn_phase(t) != KVC_TURN_DONE) {
        rc = kvc_turns_step(s->ctx, &t, 1, 0, &e);
        rc = rc > 0 ? KVC_OK : rc ? rc : KVC_ERR_INVALID_ARG;
    }
    if (t) {
        int64_t nt;
        const int32_t *tv = kvc_turn_tokens(t, &nt);
        r.toks = malloc((size_t)nt * sizeof(int32_t));
        memcpy(r.toks, tv, (size_t)nt * sizeof(int32_t));
        r.n_toks = nt;
        kvc_chat_stats st;
        kvc_err e2 = { 0 };
        int rc2 = kvc_turn_end(t, &r.text, &st, &e2);
        if (!rc)
            rc = rc2;
        r.cached = st.cached_tokens;
        r.computed = st.computed_tokens;
    }
    if (rc_out)
        *rc_out = rc;
    else
        CHECKF(rc == KVC_OK, "turn: %s", e.msg);
    return r;
}

static int fill(int32_t *t, int at, int n, uint32_t salt, int n_vocab)
{
    const uint32_t span = (uint32_t)n_vocab - 300;
    for (int i = 0; i < n; i++)
        t[at + i] = (int32_t)(259 + (2654435761u * (uint32_t)(i + 1) + 40503u * salt) % span);
    return at + n;
}

static void scenario(kvc_model *m, uint64_t seed)
{
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 2048;
    cp.n_threads = 2;
    cp.kv_blocks = 600;
    char err[256];
    kvc_context *warm = NULL, *cold = NULL;
    CHECKF(kvc_context_new(m, &cp, &warm, err, sizeof(err)) == KVC_OK, "%s", err);
    CHECKF(kvc_context_new(m, &cp, &cold, err, sizeof(err)) == KVC_OK, "%s", err);
    if (!warm || !cold)
        return;
    add_fake_state(warm, 40);
    kvc_session *s = kvc_session_new(warm, 0, NULL, err, sizeof(err));
    const int V = m->hp.n_vocab;
    static int32_t T[7][2048];
    int want[7];
    result prev = { 0 };
    int T3_len = 0;
    for (int k = 0; k < 7; k++) {
        int n = 0;
        switch (k) {
        case 0: n = fill(T[0], 0, N_T1, 1, V); want[k] = 0; break;
        case 1: case 2:   /* the previous prompt and reply: the session's own state */
            memcpy(T[k], prev.toks, (size_t)prev.n_toks * sizeof(int32_t));
            n = fill(T[k], (int)prev.n_toks, k == 1 ? 300 : 20, 10 + (uint32_t)k, V);
            want[k] = (int)prev.n_toks - 1;   /* the last reply token was never run */
            break;
        case 3:
            memcpy(T[k], T[0], N_T1 * sizeof(int32_t));
            n = fill(T[k], N_T1, 60, 30, V);
            want[k] = N_T1;
            break;
        case 4:
            memcpy(T[k], T[0], (N_T1 - 20) * sizeof(int32_t));
            n = fill(T[k], N_T1 - 20, 60, 40, V);
            want[k] = N_T1 - 20 - S_INT;
            break;
        case 5:
            memcpy(T[k], T[0], N_T1 * sizeof(int32_t));
            n = N_T1;
            want[k] = N_T1;   /* whole, from the snapshot's logits */
            break;
        case 6:   /* T3 again: its end is not a block boundary (a partial block) */
            n = T3_len;
            memcpy(T[k], T[2], (size_t)n * sizeof(int32_t));
            want[k] = n;
            break;
        }
        if (k == 2)
            T3_len = n;
        free(prev.toks);
        free(prev.text);
        result w = turn(s, T[k], n, seed, 0, NULL);
        kvc_session *cs = kvc_session_new(cold, 0, NULL, err, sizeof(err));
        result c = turn(cs, T[k], n, seed, 0, NULL);
        kvc_session_free(cs);
        printf("  seed %llu T%d: %d tokens, %d cached (want >= %d), %d computed\n",
               (unsigned long long)seed, k + 1, n, w.cached, want[k], w.computed);
        CHECKF(w.cached >= want[k], "T%d: %d cached, want %d", k + 1, w.cached, want[k]);
        CHECKF(w.cached + w.computed == n, "T%d: %d cached + %d computed != %d", k + 1, w.cached,
               w.computed, n);
        CHECKF(w.text && c.text && strcmp(w.text, c.text) == 0, "T%d: warm \"%s\" != cold \"%s\"",
               k + 1, w.text ? w.text : "(null)", c.text ? c.text : "(null)");
        free(c.text);
        free(c.toks);
        prev = w;
        kvc_err e = { 0 };
        CHECKF(kvc_snaps_check(warm->snaps, &e) == KVC_OK, "%s", e.msg);
        CHECKF(kvc_pc_check(warm->pc, &e) == KVC_OK, "%s", e.msg);
    }
    CHECK_EQ_INT(prev.computed, 0);   /* T7: nothing run */
    free(prev.toks);
    free(prev.text);
    kvc_snaps_stats st;
    kvc_snaps_get_stats(warm->snaps, &st);
    printf("  %lld snapshots (%lld blocks), %llu taken, %llu restored\n", (long long)st.count,
           (long long)st.blocks, (unsigned long long)st.taken, (unsigned long long)st.restored);
    CHECK(st.restored >= 3);
    /* a context shift is refused, with what was wrong */
    int rc = 0;
    result r = turn(s, T[0], 100, seed, 50, &rc);
    CHECK_EQ_INT(rc, KVC_ERR_CONTEXT_LENGTH);
    free(r.text);
    free(r.toks);
    kvc_session_free(s);
    kvc_context_free(warm);
    kvc_context_free(cold);
}

int main(void)
{
    char dir[] = "/tmp/kvc_snap_session_XXXXXX", path[512], err[512];
    if (!mkdtemp(dir))
        return 1;
    kvc_gen_params g;
    CHECK_EQ_INT(kvc_gen_preset("tiny-qwen3", &g), KVC_OK);
    g.n_threads = 2;
    snprintf(path, sizeof(path), "%s/m.gguf", dir);
    CHECKF(kvc_gen_write(&g, path, err, sizeof(err)) == KVC_OK, "%s", err);
    kvc_model *m = NULL;
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "%s", err);
    if (m) {
        scenario(m, 0);
        scenario(m, 7);
        kvc_model_free(m);
    }
    unlink(path);
    rmdir(dir);
    return test_done("test_snapshot_session");
}
