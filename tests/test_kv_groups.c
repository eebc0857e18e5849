/* test_kv_groups.c - memory groups (kv.h) on a synthetic model layout: five
 * window(40) layers of head dim 32 in group 1, one full layer of head dim 64
 * in group 0, blocks of KVC_BLOCK_TOKENS. Checks: the layout (each layer's
 * K/V inside its group's chunk, sizes said once); a long sequence decoded
 * token by token holds its full blocks plus at most one window and a block
 * of window chunks, in a window slab of just that size, its window's K/V
 * intact; window chunks behind the window stay hittable until evicted; a
 * hit after the window chunks of an old prefix were evicted stops where
 * the window can still be served; the windows of likely divergence points
 * (kvc_kv_seq_keep) are evicted last; truncation keeps less when it must;
 * eviction takes a tree leaf that can no longer serve a hit first; a
 * window slab whose every chunk is held refuses cleanly. */
#include "kv.h"
#include "prefix_cache.h"
#include "quant.h"
#include "test.h"

enum { B = KVC_BLOCK_TOKENS, W = 40, N_LAYER = 6 };

static const kvc_kv_layer LAYERS[N_LAYER] = {
    { 1, 2, 32 }, { 1, 2, 32 }, { 1, 2, 32 }, { 1, 2, 32 }, { 1, 2, 32 }, { 0, 1, 64 },
};

static kvc_kv_pool *new_pool(int64_t n_blocks, int64_t n_window)
{
    const kvc_kv_group groups[2] = { { KVC_KV_FULL, 0, 0 }, { KVC_KV_WINDOW, W, n_window } };
    kvc_kv_pool_params p = { N_LAYER, 2, 32, 0, KVC_TYPE_F32, n_blocks, 2, groups, LAYERS };
    kvc_kv_pool *pool = NULL;
    kvc_err e = { 0 };
    CHECKF(kvc_kv_pool_new(&p, &pool, &e) == KVC_OK, "%s", e.msg);
    return pool;
}

static void test_layout(void)
{
    kvc_kv_pool *pool = new_pool(8, 4);
    const size_t win = 5 * 2 * 2 * B * 32 * 4, full = 1 * 2 * 1 * B * 64 * 4;
    CHECK_EQ_INT(kvc_kv_group_chunk_bytes(pool, 1), win);
    CHECK_EQ_INT(kvc_kv_group_chunk_bytes(pool, 0), full);
    CHECK_EQ_INT(kvc_kv_block_bytes(pool), win + full);
    kvc_kv_pool_params p = *kvc_kv_pool_params_of(pool);
    CHECK_EQ_INT(kvc_kv_block_bytes_for(&p), win + full);
    CHECK_EQ_INT(kvc_kv_layer_window(pool, 0), W);
    CHECK_EQ_INT(kvc_kv_layer_window(pool, 5), 0);
    CHECK_EQ_INT(kvc_kv_layer_row_bytes(pool, 5), 64 * 4);
    CHECK_EQ_INT(kvc_kv_group_of(pool, 1)->n_blocks, 4);
    int32_t b = kvc_kv_block_alloc(pool);
    /* every (layer, K/V, head) part is distinct and inside its group's chunk */
    const uint8_t *parts[N_LAYER * 4];
    int n = 0;
    for (int l = 0; l < N_LAYER; l++)
        for (int h = 0; h < LAYERS[l].n_kv_head; h++) {
            parts[n++] = kvc_kv_k(pool, b, l, h);
            parts[n++] = kvc_kv_v(pool, b, l, h);
        }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            CHECK(parts[i] != parts[j]);
    const uint8_t *w0 = kvc_kv_k(pool, b, 0, 0), *f0 = kvc_kv_k(pool, b, 5, 0);
    CHECK(f0 == kvc_kv_block_data(pool, b));
    CHECK((size_t)((const uint8_t *)kvc_kv_v(pool, b, 4, 1) - w0) == win - B * 32 * 4);
    CHECK((size_t)((const uint8_t *)kvc_kv_v(pool, b, 5, 0) - f0) == full - B * 64 * 4);
    kvc_kv_block_unref(pool, b);
    CHECK_EQ_INT(kvc_kv_group_n_free(pool, 1), 4);
    /* bad layouts are refused, named */
    kvc_err e = { 0 };
    kvc_kv_pool *bad = NULL;
    const kvc_kv_group g0w[2] = { { KVC_KV_WINDOW, 8, 0 }, { KVC_KV_FULL, 0, 0 } };
    kvc_kv_pool_params q = { N_LAYER, 2, 32, 0, KVC_TYPE_F32, 8, 2, g0w, LAYERS };
    CHECK(kvc_kv_pool_new(&q, &bad, &e) == KVC_ERR_INVALID_ARG && strstr(e.msg, "group 0"));
    const kvc_kv_group g1[2] = { { KVC_KV_FULL, 0, 0 }, { KVC_KV_WINDOW, 0, 0 } };
    q.groups = g1;
    CHECK(kvc_kv_pool_new(&q, &bad, &e) == KVC_ERR_INVALID_ARG && strstr(e.msg, "window 0"));
    kvc_kv_pool_free(pool);
}

/* Position p's first K value in layer 0 (window) and 5 (full). */
static float *k_at(kvc_kv_pool *pool, const kvc_kv_seq *s, int64_t p, int layer)
{
    float *k = kvc_kv_k(pool, s->blocks[p / B], layer, 0);
    return k ? k + p % B : NULL;   /* F32 K: [head_dim][B], dimension 0 */
}

/* Decode tokens [seq->n_tokens, n) one at a time, writing p into both
 * groups; every step checks the window's positions still hold theirs. */
static int64_t decode_to(kvc_kv_pool *pool, kvc_kv_seq *s, int64_t n, int64_t *max_held)
{
    for (int64_t p = s->n_tokens; p < n; p++) {
        kvc_err e = { 0 };
        if (kvc_kv_seq_reserve(pool, s, p + 1, &e) != KVC_OK ||
            kvc_kv_seq_window(pool, s, p + 1, &e) != KVC_OK) {
            CHECKF(false, "reserve %lld: %s", (long long)p + 1, e.msg);
            return p;
        }
        *k_at(pool, s, p, 0) = (float)p;
        *k_at(pool, s, p, 5) = (float)p;
        s->n_tokens = p + 1;
        for (int64_t q = p - W + 1 > 0 ? p - W + 1 : 0; q <= p; q++)
            if (*k_at(pool, s, q, 0) != (float)q) {
                CHECKF(false, "window position %lld lost at %lld", (long long)q, (long long)p);
                return p;
            }
        *max_held = KVC_MAX(*max_held, kvc_kv_group_n_held(pool, 1));
    }
    return n;
}

static void test_long_sequence_memory(void)
{
    /* one window (+ the position before it) and one block: ceil((W + 1) / B) + 1 */
    const int64_t win_chunks = (W + 1 + B - 1) / B + 1, n = 1000;
    kvc_kv_pool *pool = new_pool((n + B - 1) / B + 1, win_chunks);
    kvc_kv_seq s;
    kvc_kv_seq_init(&s);
    int64_t held = 0;
    CHECK_EQ_INT(decode_to(pool, &s, n, &held), n);
    CHECKF(held <= win_chunks, "held %lld window chunks", (long long)held);
    CHECK_EQ_INT(kvc_kv_group_n_held(pool, 0), (n + B - 1) / B);
    for (int64_t p = 0; p < n; p++)   /* the full layer keeps every position */
        if (*k_at(pool, &s, p, 5) != (float)p) {
            CHECKF(false, "full position %lld lost", (long long)p);
            break;
        }
    /* the blocks behind the window lost their window chunks to the new ones */
    CHECK(!kvc_kv_block_has(pool, s.blocks[0], 1) && kvc_kv_block_has(pool, s.blocks[0], 0));
    CHECK(k_at(pool, &s, 0, 0) == NULL);
    /* truncation back into the evicted part keeps less: the longest length
     * whose window is still there (the whole window slab holds n's window) */
    int64_t kept = kvc_kv_seq_truncate(pool, &s, 500);
    CHECKF(kept < 500 && kept % B == 0, "kept %lld", (long long)kept);
    CHECK_EQ_INT(s.n_tokens, kept);
    CHECK_EQ_INT(kvc_kv_servable(pool, s.blocks, kept), kept);
    kvc_kv_seq_release(pool, &s);
    CHECK_EQ_INT(kvc_kv_n_free(pool), kvc_kv_n_blocks(pool));
    CHECK_EQ_INT(kvc_kv_group_n_held(pool, 1), 0);
    kvc_kv_pool_free(pool);
}

/* Tokens of path `id`: distinct per path and position. */
static void path_tokens(int id, int32_t *t, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        t[i] = id * 100000 + (int32_t)i;
}

/* Decode path `id` to n tokens in s, entering each full block in the tree. */
static kvc_pc_node *run_path(kvc_kv_pool *pool, kvc_prefix_cache *pc, kvc_kv_seq *s, int id, int64_t n)
{
    int32_t tok[1024];
    path_tokens(id, tok, n);
    kvc_pc_node *parent = kvc_pc_root(pc);
    int64_t held = 0;
    for (int64_t p = 0; p < n; p += B) {
        decode_to(pool, s, p + B, &held);
        kvc_pc_node *nd = NULL;
        kvc_err e = { 0 };
        CHECK(kvc_pc_insert(pc, KVC_NS_DEFAULT, parent, tok + p, s->blocks[p / B], false, &nd, &e) == 1);
        parent = nd;
    }
    return parent;
}

static int32_t lookup_full(kvc_prefix_cache *pc, int id, int64_t n, int64_t diverge)
{
    int32_t tok[1024];
    path_tokens(id, tok, n);
    for (int64_t i = diverge; i < n; i++)
        tok[i] = -1 - (int32_t)i;
    kvc_pc_match m;
    kvc_pc_lookup(pc, KVC_NS_DEFAULT, tok, n, &m);
    return m.n_full * B + m.partial_len;
}

static void test_tree_hits(void)
{
    /* 16 blocks of path A, whose window chunks stay until evicted */
    kvc_kv_pool *pool = new_pool(64, 16);
    kvc_prefix_cache *pc = NULL;
    kvc_err e = { 0 };
    CHECK(kvc_pc_new(pool, &pc, &e) == KVC_OK);
    kvc_kv_seq a, x;
    kvc_kv_seq_init(&a);
    kvc_kv_seq_init(&x);
    run_path(pool, pc, &a, 1, 256);
    CHECK_EQ_INT(kvc_kv_group_n_free(pool, 1), 0);
    CHECK(kvc_kv_group_n_held(pool, 1) <= (W + 1 + B - 1) / B + 1);
    CHECK_EQ_INT(kvc_kv_seq_truncate(pool, &a, 128), 128);   /* its window again held */
    kvc_kv_seq_release(pool, &a);
    CHECK_EQ_INT(kvc_kv_group_n_held(pool, 1), 0);
    /* released, not evicted: every hit is served */
    CHECK_EQ_INT(lookup_full(pc, 1, 256, 256), 256);
    CHECK_EQ_INT(lookup_full(pc, 1, 210, 200), 200);
    CHECK_EQ_INT(lookup_full(pc, 1, 110, 100), 100);
    /* 8 new blocks take the 8 window chunks released first: those of A's
     * blocks 0-4 (behind its window while it ran) and 8-10 (released by the
     * truncation to 128, which held 5-7 again) */
    CHECK(kvc_kv_seq_reserve(pool, &x, 8 * B, &e) == KVC_OK);
    CHECK_EQ_INT(kvc_kv_group_n_held(pool, 1), 0);   /* reserved: no window chunk before written */
    CHECK(kvc_kv_seq_window(pool, &x, 8 * B, &e) == KVC_OK);
    kvc_pc_match m;
    int32_t tok[256];
    path_tokens(1, tok, 256);
    kvc_pc_lookup(pc, KVC_NS_DEFAULT, tok, 256, &m);
    CHECK_EQ_INT(m.n_full, 16);
    const kvc_pc_node *nd = m.last;
    bool gone[16];
    for (; nd != kvc_pc_root(pc); nd = nd->parent)
        gone[nd->depth] = !kvc_kv_block_has(pool, nd->block, 1);
    for (int i = 0; i < 16; i++)
        CHECKF(gone[i] == (i <= 4 || (i >= 8 && i <= 10)), "block %d: window chunk %s", i,
               gone[i] ? "gone" : "there");
    /* the whole path still hits (its window, 13-15, is there); a request
     * diverging at 200 needs 10-12: it stops at 128 (window 5-7); one
     * diverging at 100 finds no window (3-4 gone, then 0-2): nothing */
    CHECK_EQ_INT(lookup_full(pc, 1, 256, 256), 256);
    CHECK_EQ_INT(lookup_full(pc, 1, 210, 200), 128);
    CHECK_EQ_INT(lookup_full(pc, 1, 110, 100), 0);
    CHECK(kvc_pc_check(pc, &e) == KVC_OK);
    kvc_kv_seq_release(pool, &x);
    kvc_pc_free(pc);
    CHECK_EQ_INT(kvc_kv_n_free(pool), 64);
    CHECK_EQ_INT(kvc_kv_group_n_free(pool, 1), 16);
    kvc_kv_pool_free(pool);
}

static void test_kept_windows(void)
{
    /* path A (16 blocks) in the tree, released; a request is likely to
     * diverge at 100 (kvc_kv_seq_keep): the window chunks a hit there needs
     * (blocks 3-6: [(96 - W) / B, ceil(100 / B))) are evicted after every
     * other released chunk, however old */
    kvc_kv_pool *pool = new_pool(64, 16);
    kvc_prefix_cache *pc = NULL;
    kvc_err e = { 0 };
    CHECK(kvc_pc_new(pool, &pc, &e) == KVC_OK);
    kvc_kv_seq a, x;
    kvc_kv_seq_init(&a);
    kvc_kv_seq_init(&x);
    run_path(pool, pc, &a, 1, 256);
    kvc_kv_seq_keep(pool, &a, 100);
    kvc_kv_seq_release(pool, &a);
    CHECK_EQ_INT(lookup_full(pc, 1, 110, 100), 100);
    /* 8 new chunks: the 8 released first but for the kept ones (0-2, 7-11) */
    CHECK(kvc_kv_seq_reserve(pool, &x, 8 * B, &e) == KVC_OK);
    CHECK(kvc_kv_seq_window(pool, &x, 8 * B, &e) == KVC_OK);
    CHECK_EQ_INT(lookup_full(pc, 1, 110, 100), 100);
    CHECK_EQ_INT(lookup_full(pc, 1, 256, 256), 256);   /* 12-15 are there still */
    CHECK_EQ_INT(lookup_full(pc, 1, 210, 200), 112);   /* 9-11 are not: the kept 4-6 serve 112 */
    /* 4 more: the last unkept ones (12-15) go, the kept ones stay */
    CHECK(kvc_kv_seq_reserve(pool, &x, 12 * B, &e) == KVC_OK);
    CHECK(kvc_kv_seq_window(pool, &x, 12 * B, &e) == KVC_OK);
    CHECK_EQ_INT(lookup_full(pc, 1, 256, 256), 112);
    CHECK_EQ_INT(lookup_full(pc, 1, 110, 100), 100);
    /* then they go too, the least recently released first */
    CHECK(kvc_kv_seq_reserve(pool, &x, 13 * B, &e) == KVC_OK);
    CHECK(kvc_kv_seq_window(pool, &x, 13 * B, &e) == KVC_OK);
    CHECK_EQ_INT(lookup_full(pc, 1, 110, 100), 0);
    CHECK(kvc_pc_check(pc, &e) == KVC_OK);
    kvc_kv_seq_release(pool, &x);
    kvc_pc_free(pc);
    CHECK_EQ_INT(kvc_kv_n_free(pool), 64);
    CHECK_EQ_INT(kvc_kv_group_n_free(pool, 1), 16);
    kvc_kv_pool_free(pool);
}

static void test_dead_leaf_first(void)
{
    /* Q (5 blocks) then P (2 blocks) in the tree, all released; Q used again
     * last, so P's leaf is the least recently used. Then the window chunks
     * released first go: Q's 0, 1 (behind its window) and 4 (its leaf). Q's
     * leaf can no longer end a hit: the tree evicts it before P's. */
    kvc_kv_pool *pool = new_pool(32, 7);
    kvc_prefix_cache *pc = NULL;
    kvc_err e = { 0 };
    CHECK(kvc_pc_new(pool, &pc, &e) == KVC_OK);
    kvc_kv_seq q, p, x;
    kvc_kv_seq_init(&q);
    kvc_kv_seq_init(&p);
    kvc_kv_seq_init(&x);
    kvc_pc_node *q_leaf = run_path(pool, pc, &q, 2, 80);
    kvc_kv_seq_release(pool, &q);
    kvc_pc_node *p_leaf = run_path(pool, pc, &p, 3, 32);
    kvc_kv_seq_release(pool, &p);
    CHECK_EQ_INT(lookup_full(pc, 2, 80, 80), 80);   /* a use of Q's path */
    CHECK(kvc_pc_lru_next(pc, NULL) == p_leaf);
    int64_t held = 0;
    CHECK_EQ_INT(decode_to(pool, &x, 3 * B, &held), 3 * B);
    CHECK(!kvc_kv_block_has(pool, q_leaf->block, 1));
    CHECK(kvc_pc_lru_next(pc, NULL) == q_leaf);
    CHECK_EQ_INT(lookup_full(pc, 2, 80, 80), 0);     /* window gone: no hit */
    CHECK(kvc_pc_lru_next(pc, NULL) == q_leaf);     /* and the lookup did not revive it */
    CHECK_EQ_INT(kvc_pc_evict(pc, 1), 1);
    CHECK_EQ_INT(lookup_full(pc, 3, 32, 32), 32);    /* P survived */
    CHECK(kvc_pc_check(pc, &e) == KVC_OK);
    /* every window chunk held: a new block is refused cleanly */
    kvc_kv_seq_release(pool, &x);
    kvc_kv_seq y;
    kvc_kv_seq_init(&y);
    const int32_t before = (int32_t)kvc_kv_n_free(pool);
    /* 7 chunks, the rest taken by tree blocks that give theirs up: fill y
     * with 7 blocks at once (all held, its window covers them) */
    CHECK(kvc_kv_seq_reserve(pool, &y, 7 * B, &e) == KVC_OK);
    CHECK(kvc_kv_seq_window(pool, &y, 7 * B, &e) == KVC_OK);
    CHECK_EQ_INT(kvc_kv_block_alloc(pool), -1);
    CHECK(kvc_kv_seq_reserve(pool, &y, 8 * B, &e) == KVC_OK);   /* the full group has room */
    CHECK(kvc_kv_seq_window(pool, &y, 8 * B, &e) == KVC_ERR_KV_FULL && strstr(e.msg, "group 1"));
    CHECK_EQ_INT(y.n_blocks, 8);
    CHECK_EQ_INT(y.to[1], 7);
    CHECK_EQ_INT(kvc_kv_n_free(pool), before - 8);
    kvc_kv_seq_release(pool, &y);
    kvc_pc_free(pc);
    CHECK_EQ_INT(kvc_kv_n_free(pool), 32);
    kvc_kv_pool_free(pool);
}

static void test_fork_and_append(void)
{
    kvc_kv_pool *pool = new_pool(32, 12);
    kvc_kv_seq a, b, c;
    kvc_kv_seq_init(&a);
    kvc_kv_seq_init(&b);
    kvc_kv_seq_init(&c);
    int64_t held = 0;
    decode_to(pool, &a, 100, &held);
    kvc_err e = { 0 };
    /* a fork at 96 holds the window of 96: blocks 3-5 */
    CHECK(kvc_kv_seq_fork(pool, &a, &b, 96, &e) == KVC_OK);
    CHECK_EQ_INT(b.n_tokens, 96);
    CHECK_EQ_INT(b.from[1], (96 - W) / B);
    decode_to(pool, &b, 120, &held);
    CHECK_EQ_INT(*k_at(pool, &b, 80, 0), 80.0f);   /* shared window position */
    /* copy-on-write of shared blocks carries every chunk and the holds */
    const int32_t shared4 = b.blocks[4], held_before = (int32_t)kvc_kv_group_n_held(pool, 1);
    CHECK(kvc_kv_seq_make_private(pool, &b, 0, 7, &e) == KVC_OK);
    CHECK(b.blocks[4] != shared4 && b.blocks[4] != a.blocks[4] && b.blocks[6] != a.blocks[6]);
    CHECK_EQ_INT(kvc_kv_block_refcount(pool, shared4), 1);
    CHECK_EQ_INT(*k_at(pool, &b, 80, 0), 80.0f);
    CHECK_EQ_INT(*k_at(pool, &b, 70, 5), 70.0f);
    CHECK(!kvc_kv_block_has(pool, b.blocks[0], 1));   /* behind b's window: no chunk copied */
    CHECK_EQ_INT(kvc_kv_group_n_held(pool, 1), held_before + (6 - b.from[1]));
    /* appending cached blocks takes their window chunks */
    CHECK(kvc_kv_seq_append_blocks(pool, &c, a.blocks, 6, &e) == KVC_OK);
    CHECK_EQ_INT(c.n_tokens, 96);
    CHECK_EQ_INT(c.from[1], (96 - W) / B);
    kvc_kv_seq_release(pool, &a);
    kvc_kv_seq_release(pool, &b);
    kvc_kv_seq_release(pool, &c);
    CHECK_EQ_INT(kvc_kv_n_free(pool), 32);
    CHECK_EQ_INT(kvc_kv_group_n_free(pool, 1), 12);
    CHECK_EQ_INT(kvc_kv_group_n_held(pool, 1), 0);
    kvc_kv_pool_free(pool);
}

/* Cached blocks below the window of the length they make may come
 * without their window chunk; those the window needs may not. */
static void test_append_evicted(void)
{
    kvc_kv_pool *pool = new_pool(32, 8);
    kvc_kv_seq a, big, d, one;
    kvc_kv_seq_init(&a);
    kvc_kv_seq_init(&big);
    kvc_kv_seq_init(&d);
    kvc_kv_seq_init(&one);
    int64_t held = 0;
    kvc_err e = { 0 };
    decode_to(pool, &a, 100, &held);                           /* holds 3-6, released 0-2 */
    CHECK(kvc_kv_seq_reserve(pool, &big, 4 * B, &e) == KVC_OK);   /* 1 free + a's 0-2 */
    CHECK(kvc_kv_seq_window(pool, &big, 4 * B, &e) == KVC_OK);
    CHECK(!kvc_kv_block_has(pool, a.blocks[0], 1) && !kvc_kv_block_has(pool, a.blocks[2], 1));
    CHECK(kvc_kv_seq_append_blocks(pool, &d, a.blocks, 6, &e) == KVC_OK);
    CHECK_EQ_INT(d.n_tokens, 96);
    CHECK_EQ_INT(d.from[1], (96 - W) / B);
    CHECK(kvc_kv_seq_append_blocks(pool, &one, a.blocks, 1, &e) == KVC_ERR_INVALID_ARG &&
          strstr(e.msg, "evicted"));
    CHECK_EQ_INT(one.n_blocks, 0);
    CHECK_EQ_INT(kvc_kv_seq_truncate(pool, &d, 40), 0);   /* its window there is gone */
    kvc_kv_seq_release(pool, &a);
    kvc_kv_seq_release(pool, &big);
    kvc_kv_seq_release(pool, &d);
    kvc_kv_seq_release(pool, &one);
    CHECK_EQ_INT(kvc_kv_n_free(pool), 32);
    CHECK_EQ_INT(kvc_kv_group_n_free(pool, 1), 8);
    kvc_kv_pool_free(pool);
}

/* A prefill reserved at once gets its window chunks as it is written, so
 * it holds one running window, in a slab of just that size; at rest it
 * holds none, and once they are evicted its next turn keeps less. */
static void test_prefill_and_rest(void)
{
    enum { N = 1000, CHUNK = 16 };
    kvc_kv_pool *probe = new_pool(1, 1);
    const int64_t need = probe ? kvc_kv_window_need(probe, 1, CHUNK) : 0;
    kvc_kv_pool_free(probe);
    CHECK_EQ_INT(need, (W + CHUNK + B - 1) / B + 2);
    kvc_kv_pool *pool = new_pool(2 * ((N + B - 1) / B), need);
    kvc_kv_seq s, o;
    kvc_kv_seq_init(&s);
    kvc_kv_seq_init(&o);
    kvc_err e = { 0 };
    CHECK(kvc_kv_seq_reserve(pool, &s, N, &e) == KVC_OK);
    CHECK_EQ_INT(kvc_kv_group_n_held(pool, 1), 0);
    int64_t held = 0;
    for (int64_t p = 0; p < N; p += CHUNK) {
        CHECKF(kvc_kv_seq_window(pool, &s, p + CHUNK, &e) == KVC_OK, "at %lld: %s", (long long)p, e.msg);
        for (int64_t q = p; q < p + CHUNK; q++)
            *k_at(pool, &s, q, 0) = (float)q;
        s.n_tokens = p + CHUNK;
        held = KVC_MAX(held, kvc_kv_group_n_held(pool, 1));
    }
    CHECKF(held <= need, "held %lld of %lld", (long long)held, (long long)need);
    CHECK_EQ_INT(*k_at(pool, &s, N - W, 0), (float)(N - W));
    kvc_kv_seq_rest(pool, &s);
    CHECK_EQ_INT(kvc_kv_group_n_held(pool, 1), 0);
    CHECK_EQ_INT(kvc_kv_seq_truncate(pool, &s, N), N);   /* nothing evicted: all of it, held again */
    CHECK(kvc_kv_group_n_held(pool, 1) > 0);
    kvc_kv_seq_rest(pool, &s);
    decode_to(pool, &o, 6 * B, &held);                  /* takes every window chunk */
    CHECK(kvc_kv_seq_window(pool, &s, N + 1, &e) == KVC_ERR_INVALID_ARG && strstr(e.msg, "evicted"));
    const int64_t kept = kvc_kv_seq_truncate(pool, &s, N);
    CHECKF(kept < N, "kept %lld", (long long)kept);
    kvc_kv_seq_release(pool, &s);
    kvc_kv_seq_release(pool, &o);
    CHECK_EQ_INT(kvc_kv_group_n_held(pool, 1), 0);
    CHECK_EQ_INT(kvc_kv_n_free(pool), kvc_kv_n_blocks(pool));
    kvc_kv_pool_free(pool);
}

static void test_groups_of_layers(void)
{
    /* Gemma 3's pattern (5 local, 1 global), and a second window */
    const int32_t win[8] = { 1024, 1024, 1024, 1024, 1024, 0, 512, 0 }, hd[8] = { 256, 256, 256, 256, 256, 512, 0, 512 };
    kvc_kv_group g[KVC_KV_MAX_GROUPS];
    kvc_kv_layer l[8];
    kvc_err e = { 0 };
    CHECK_EQ_INT(kvc_kv_groups_of_layers(8, win, NULL, hd, g, l, &e), 3);
    CHECK(g[0].kind == KVC_KV_FULL && g[1].kind == KVC_KV_WINDOW && g[1].window == 1024 && g[2].window == 512);
    CHECK(l[0].group == 1 && l[5].group == 0 && l[6].group == 2 && l[7].group == 0);
    CHECK(l[5].head_dim == 512 && l[6].head_dim == 0 && l[0].n_kv_head == 0);
    kvc_kv_pool_params p = { 8, 4, 256, 0, KVC_TYPE_F16, 10, 3, g, l };
    kvc_kv_pool *pool = NULL;
    CHECKF(kvc_kv_pool_new(&p, &pool, &e) == KVC_OK, "%s", e.msg);
    CHECK_EQ_INT(kvc_kv_layer_window(pool, 4), 1024);
    CHECK_EQ_INT(kvc_kv_layer_window(pool, 6), 512);
    CHECK_EQ_INT(kvc_kv_group_chunk_bytes(pool, 0), 2 * (2 * 4 * B * 512 * 2));
    kvc_kv_pool_free(pool);
    /* every layer windowed: no full group to hold the blocks */
    const int32_t all[2] = { 128, 128 };
    CHECK(kvc_kv_groups_of_layers(2, all, NULL, NULL, g, l, &e) == KVC_ERR_INVALID_ARG && strstr(e.msg, "full"));
    const int32_t many[5] = { 0, 1, 2, 3, 4 };
    CHECK(kvc_kv_groups_of_layers(5, many, NULL, NULL, g, l, &e) == KVC_ERR_INVALID_ARG);
}

/* KV-shared layers (Gemma 4's last layers) take no bytes: a layout of
 * window, window, full, then a window layer sharing layer 1 and a full one
 * sharing layer 2 has the chunks of the first three alone, the shared
 * layers read through their sources, and layouts a shared layer cannot
 * have are refused, named; the chain hashes tell the layout from one
 * where each layer keeps its own. */
static void test_shared_layers(void)
{
    const kvc_kv_group groups[2] = { { KVC_KV_FULL, 0, 0 }, { KVC_KV_WINDOW, W, 0 } };
    kvc_kv_layer ls[5] = { { 1, 2, 32 }, { 1, 2, 32 }, { 0, 1, 64 }, { 1, 2, 32, 0, 2 }, { 0, 1, 64, 0, 2 } };
    kvc_kv_pool_params p = { 5, 2, 32, 0, KVC_TYPE_F32, 8, 2, groups, ls };
    const size_t win = 2 * 2 * 2 * B * 32 * 4, full = 2 * 1 * B * 64 * 4;
    kvc_kv_pool *pool = NULL;
    kvc_err e = { 0 };
    CHECKF(kvc_kv_pool_new(&p, &pool, &e) == KVC_OK, "%s", e.msg);
    if (!pool)
        return;
    CHECK_EQ_INT(kvc_kv_group_chunk_bytes(pool, 1), win);
    CHECK_EQ_INT(kvc_kv_group_chunk_bytes(pool, 0), full);
    CHECK_EQ_INT(kvc_kv_block_bytes(pool), win + full);
    CHECK_EQ_INT(kvc_kv_block_bytes_for(&p), win + full);
    CHECK_EQ_INT(kvc_kv_group_bytes_for(&p, 0), full);
    CHECK_EQ_INT(kvc_kv_layer_kv_of(pool, 3), 1);
    CHECK_EQ_INT(kvc_kv_layer_kv_of(pool, 4), 2);
    CHECK_EQ_INT(kvc_kv_layer_kv_of(pool, 2), 2);
    CHECK_EQ_INT(kvc_kv_pool_params_of(pool)->layers[4].shares, 2);
    CHECK_EQ_INT(kvc_kv_layer_window(pool, 3), W);
    CHECK_EQ_INT(kvc_kv_layer_head_dim(pool, 4), 64);
    const int32_t b = kvc_kv_block_alloc(pool);
    CHECK(kvc_kv_k(pool, b, 3, 0) == NULL && kvc_kv_v(pool, b, 4, 0) == NULL);
    CHECK(kvc_kv_k(pool, b, 1, 1) != NULL && kvc_kv_k(pool, b, 2, 0) == kvc_kv_block_data(pool, b));
    kvc_kv_block_unref(pool, b);
    /* its records are another layout's than those of the pool where each
     * layer keeps its own: the chain hashes differ from the root on */
    kvc_kv_layer mine[5];
    memcpy(mine, ls, sizeof(mine));
    mine[3].shares = mine[4].shares = 0;
    kvc_kv_pool_params po = p;
    po.layers = mine;
    kvc_kv_pool *own = NULL;
    kvc_prefix_cache *pc = NULL, *pc_own = NULL;
    CHECK(kvc_kv_pool_new(&po, &own, &e) == KVC_OK && kvc_pc_new(pool, &pc, &e) == KVC_OK &&
          kvc_pc_new(own, &pc_own, &e) == KVC_OK);
    CHECK(pc && pc_own && kvc_pc_root(pc)->hash != kvc_pc_root(pc_own)->hash);
    kvc_pc_free(pc);
    kvc_pc_free(pc_own);
    kvc_kv_pool_free(own);
    kvc_kv_pool_free(pool);
    /* shares another group's layer, a shared one, one of another shape, a later one, itself */
    const struct { int32_t layer, shares, group, head_dim; } bad[] = {
        { 3, 1, 0, 32 }, { 4, 1, 0, 64 }, { 4, 2, 0, 32 }, { 1, -1, 1, 32 }, { 3, 4, 1, 32 },
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad); i++) {
        kvc_kv_layer q[5];
        memcpy(q, ls, sizeof(q));
        q[bad[i].layer].shares = bad[i].shares;
        q[bad[i].layer].group = bad[i].group;
        q[bad[i].layer].head_dim = bad[i].head_dim;
        if (i == 1)   /* layer 4 shares layer 3, itself shared */
            q[4] = (kvc_kv_layer){ 1, 2, 32, 0, 1 };
        kvc_kv_pool_params pq = p;
        pq.layers = q;
        kvc_kv_pool *no = NULL;
        const int rc = kvc_kv_pool_new(&pq, &no, &e);
        CHECKF(rc == KVC_ERR_INVALID_ARG && strstr(e.msg, "shares"), "bad layout %zu: rc %d, %s", i, rc, e.msg);
        kvc_kv_pool_free(no);
    }
}

int main(void)
{
    test_groups_of_layers();
    test_shared_layers();
    test_layout();
    test_long_sequence_memory();
    test_tree_hits();
    test_kept_windows();
    test_dead_leaf_first();
    test_fork_and_append();
    test_append_evicted();
    test_prefill_and_rest();
    return test_done("test_kv_groups");
}
