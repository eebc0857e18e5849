/* test_snapshot.c - recurrent-state snapshots in the prefix tree
 * (snapshot.h) over a pool with recurrent layers, driven by a fake forward
 * pass whose states and K/V are known functions of the tokens: a hit at the
 * exact length, the fallback to the newest snapshot before, partial tokens
 * verified, logits kept, states and K/V equal after a restore (and after
 * continuing from it), the cost counted in the pool's blocks, LRU eviction,
 * a node leaving the tree taking its snapshots, and the disk tier: a
 * snapshot written by the tiers' writer thread reads back whole, a
 * truncated record (a crash mid-write) is detected and ignored. */
#include "quant.h"
#include "snapshot.h"
#include "test.h"
#include "tiers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define B 4
#define NV 8

/* Layers: 0 recurrent (10 floats), 1 attention (1 head of 32), 2 recurrent (6). */
static kvc_kv_pool *new_pool(int64_t blocks)
{
    static const kvc_kv_group full = { KVC_KV_FULL, 0, 0 };
    static const kvc_kv_layer layers[3] = { { 0, 0, 0, 10 }, { 0, 0, 0, 0 }, { 0, 0, 0, 6 } };
    kvc_kv_pool_params p = { 3, 1, 32, B, KVC_TYPE_F32, blocks, 1, &full, layers };
    kvc_kv_pool *pool = NULL;
    kvc_err e = { 0 };
    CHECKF(kvc_kv_pool_new(&p, &pool, &e) == KVC_OK, "%s", e.msg);
    return pool;
}

/* A stand-in for the logits: from the states. */
static float s0_last(kvc_kv_pool *pool, kvc_kv_seq *seq, int v)
{
    return kvc_kv_seq_state(pool, seq, 0)[v] + kvc_kv_seq_state(pool, seq, 2)[v % 6];
}

/* The fake forward pass over positions [seq->n_tokens, to) of tokens: each
 * recurrent state a function of the whole prefix, K of layer 1 of the token
 * and its position; logits (NV) of the last one. */
static void fake_run(kvc_kv_pool *pool, kvc_kv_seq *seq, const int32_t *tokens, int64_t to,
                     float *logits)
{
    kvc_err e = { 0 };
    CHECKF(kvc_kv_seq_reserve(pool, seq, to, &e) == KVC_OK, "%s", e.msg);
    for (int64_t p = seq->n_tokens; p < to; p++) {
        float *s0 = kvc_kv_seq_state(pool, seq, 0), *s2 = kvc_kv_seq_state(pool, seq, 2);
        for (int i = 0; i < 10; i++)
            s0[i] = s0[i] * 0.75f + (float)tokens[p] * 0.1f + (float)i;
        for (int i = 0; i < 6; i++)
            s2[i] = s2[i] * 0.5f - (float)tokens[p] + s0[i];
        float *k = kvc_kv_k(pool, seq->blocks[p / B], 1, 0);
        for (int d = 0; d < 32; d++)
            k[d * B + p % B] = (float)tokens[p] * 100.0f + (float)p + (float)d * 0.01f;
        seq->n_tokens = p + 1;
    }
    if (logits)
        for (int v = 0; v < NV; v++)
            logits[v] = s0_last(pool, seq, v);
}


/* Publish the sequence's full blocks [0, n_tokens / B) in the tree; returns
 * the node of the last (the root when none). */
static kvc_pc_node *publish(kvc_prefix_cache *pc, kvc_kv_seq *seq, const int32_t *tokens)
{
    kvc_pc_node *node = kvc_pc_root(pc);
    kvc_err e = { 0 };
    for (int64_t i = 0; i < seq->n_tokens / B; i++) {
        kvc_pc_node *n = NULL;
        CHECK(kvc_pc_insert(pc, 0, node, tokens + i * B, seq->blocks[i], false, &n, &e) >= 0);
        node = n;
    }
    return node;
}

/* The snapshot found for tokens[0, n) up to limit, via a tree lookup. */
static kvc_snap *find(kvc_snaps *S, kvc_prefix_cache *pc, const int32_t *tokens, int64_t n,
                      int64_t limit, int64_t logits_at)
{
    kvc_pc_match m;
    kvc_pc_lookup(pc, 0, tokens, n, &m);
    return kvc_snaps_find(S, 0, m.last, tokens, limit, logits_at);
}

static void check_all(kvc_snaps *S, kvc_prefix_cache *pc)
{
    kvc_err e = { 0 };
    CHECKF(kvc_snaps_check(S, &e) == KVC_OK, "%s", e.msg);
    CHECKF(kvc_pc_check(pc, &e) == KVC_OK, "%s", e.msg);
}

/* kvc_kv_seq_assign: the sequence holds exactly the given blocks. */
static void test_assign(void)
{
    kvc_kv_pool *pool = new_pool(8);
    kvc_kv_seq a, b;
    kvc_kv_seq_init(&a);
    kvc_kv_seq_init(&b);
    int32_t t[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    fake_run(pool, &a, t, 6, NULL);
    fake_run(pool, &b, t, 3, NULL);
    kvc_err e = { 0 };
    int32_t keep = b.blocks[0];
    CHECK(kvc_kv_seq_assign(pool, &b, a.blocks, 6, &e) == KVC_OK);
    CHECK_EQ_INT(b.n_tokens, 6);
    CHECK_EQ_INT(b.n_blocks, 2);
    CHECK(b.blocks[0] == a.blocks[0] && b.blocks[1] == a.blocks[1]);
    CHECK_EQ_INT(kvc_kv_block_refcount(pool, a.blocks[1]), 2);
    CHECK_EQ_INT(kvc_kv_block_refcount(pool, keep), 0);   /* b's old block freed */
    CHECK_EQ_INT(kvc_kv_n_free(pool), 6);
    /* b continues: the shared partial block is copied before b writes */
    fake_run(pool, &b, t, 8, NULL);
    CHECK(b.blocks[1] != a.blocks[1]);
    CHECK_EQ_INT(kvc_kv_block_refcount(pool, a.blocks[1]), 1);
    kvc_kv_seq_release(pool, &a);
    kvc_kv_seq_release(pool, &b);
    CHECK_EQ_INT(kvc_kv_n_free(pool), 8);
    kvc_kv_pool_free(pool);
}

static void test_snapshots(void)
{
    kvc_kv_pool *pool = new_pool(64);
    kvc_prefix_cache *pc = NULL;
    kvc_snaps *S = NULL;
    kvc_err e = { 0 };
    CHECK(kvc_pc_new(pool, &pc, &e) == KVC_OK);
    CHECKF(kvc_snaps_new(pool, pc, NV, &S, &e) == KVC_OK, "%s", e.msg);
    if (!S)
        return;
    /* payload: 16 state floats (+ 8 logits) in blocks of 1 * 32 * 4 * 2 * 4 bytes */
    CHECK_EQ_INT(kvc_snaps_cost(S, 8, true), 1);
    CHECK_EQ_INT(kvc_snaps_cost(S, 10, true), 2);

    int32_t T[24];
    for (int i = 0; i < 24; i++)
        T[i] = 3 + (i * 7) % 11;
    kvc_kv_seq a;
    kvc_kv_seq_init(&a);
    float lg10[NV], lg22[NV];
    fake_run(pool, &a, T, 10, lg10);
    kvc_pc_node *n1 = publish(pc, &a, T);
    float st10[16];
    memcpy(st10, kvc_kv_seq_states(pool, &a), sizeof(st10));
    int64_t free0 = kvc_kv_n_free(pool);
    CHECK_EQ_INT(kvc_snaps_take(S, 0, n1, T, &a, lg10, &e), 1);
    CHECK_EQ_INT(free0 - kvc_kv_n_free(pool), kvc_snaps_cost(S, 10, true));
    CHECK_EQ_INT(kvc_snaps_take(S, 0, n1, T, &a, lg10, &e), 0);   /* there already */
    CHECK(kvc_snaps_take(S, 0, kvc_pc_root(pc), T, &a, NULL, &e) == KVC_ERR_INVALID_ARG);
    fake_run(pool, &a, T, 16, NULL);
    CHECK_EQ_INT(kvc_snaps_take(S, 0, publish(pc, &a, T), T, &a, NULL, &e), 1);
    fake_run(pool, &a, T, 22, lg22);
    kvc_pc_node *n4 = publish(pc, &a, T);
    CHECK_EQ_INT(kvc_snaps_take(S, 0, n4, T, &a, NULL, &e), 1);
    check_all(S, pc);

    /* a hit at the exact length, else the newest before */
    kvc_snap *sn = find(S, pc, T, 24, 22, -1);
    CHECK(sn && kvc_snap_pos(sn) == 22);
    sn = find(S, pc, T, 24, 21, -1);
    CHECK(sn && kvc_snap_pos(sn) == 16);
    sn = find(S, pc, T, 24, 15, -1);
    CHECK(sn && kvc_snap_pos(sn) == 10 && kvc_snap_has_logits(sn));
    CHECK(find(S, pc, T, 24, 9, -1) == NULL);
    sn = find(S, pc, T, 22, 22, 22);                       /* logits needed at 22: none there */
    CHECK(sn && kvc_snap_pos(sn) == 16);
    /* the partial tokens are compared: a path diverging at 9 has none at 10 */
    int32_t U[24];
    memcpy(U, T, sizeof(U));
    U[9] = 99;
    CHECK(find(S, pc, U, 24, 24, -1) == NULL);
    U[9] = T[9];
    U[11] = 99;                                            /* diverging at 11: 10 serves */
    sn = find(S, pc, U, 24, 11, -1);
    CHECK(sn && kvc_snap_pos(sn) == 10);

    /* restore: states, K/V and logits as computed; continuing gives a's */
    kvc_kv_seq b;
    kvc_kv_seq_init(&b);
    fake_run(pool, &b, U, 3, NULL);                        /* b held something else */
    float lg[NV] = { 0 };
    CHECK(kvc_snaps_restore(S, sn, &b, lg, &e) == KVC_OK);
    CHECK_EQ_INT(b.n_tokens, 10);
    CHECK(memcmp(kvc_kv_seq_states(pool, &b), st10, sizeof(st10)) == 0);
    CHECK(memcmp(lg, lg10, sizeof(lg)) == 0);
    for (int64_t p = 0; p < 10; p++)
        CHECK(((float *)kvc_kv_k(pool, b.blocks[p / B], 1, 0))[5 * B + p % B] ==
              (float)T[p] * 100.0f + (float)p + 0.05f);
    float lgb[NV];
    fake_run(pool, &b, T, 22, lgb);
    CHECK(memcmp(kvc_kv_seq_states(pool, &b), kvc_kv_seq_states(pool, &a), 16 * sizeof(float)) == 0);
    CHECK(memcmp(lgb, lg22, sizeof(lgb)) == 0);
    check_all(S, pc);

    /* LRU: the one used least recently goes first; its blocks are freed */
    kvc_snaps_stats st;
    kvc_snaps_get_stats(S, &st);
    CHECK_EQ_INT(st.count, 3);
    sn = find(S, pc, T, 24, 16, -1);                        /* 16 used last now */
    kvc_snaps_pin(S, sn);
    int64_t ev = kvc_snaps_evictable(S), f1 = kvc_kv_n_free(pool);
    CHECK_EQ_INT(ev, st.blocks - kvc_snaps_cost(S, 16, false));
    CHECK(kvc_snaps_evict_one(S) > 0);                      /* 22 (used before 16, after 10) */
    CHECK(find(S, pc, T, 24, 22, -1) == sn);
    CHECK(kvc_snaps_evict_one(S) > 0);                      /* 10 */
    CHECK_EQ_INT(kvc_snaps_evict_one(S), 0);                /* 16 is pinned */
    CHECK_EQ_INT(kvc_kv_n_free(pool) - f1, ev);
    kvc_snaps_unpin(S, sn);
    check_all(S, pc);

    /* a node leaving the tree takes its snapshots: everything back */
    kvc_kv_seq_release(pool, &a);
    kvc_kv_seq_release(pool, &b);
    kvc_pc_evict(pc, 1000);
    kvc_snaps_get_stats(S, &st);
    CHECK_EQ_INT(st.count, 0);
    CHECK_EQ_INT(st.dropped, 1);
    CHECK_EQ_INT(kvc_kv_n_free(pool), 64);
    check_all(S, pc);
    kvc_snaps_free(S);
    kvc_pc_free(pc);
    kvc_kv_pool_free(pool);
}

/* Within a budget: snapshots taken while room is made by evicting the least
 * recently used (snapshots and the tree's leaves alike) never exceed the pool. */
static void test_budget(void)
{
    kvc_kv_pool *pool = new_pool(12);
    kvc_prefix_cache *pc = NULL;
    kvc_snaps *S = NULL;
    kvc_err e = { 0 };
    CHECK(kvc_pc_new(pool, &pc, &e) == KVC_OK);
    CHECK(kvc_snaps_new(pool, pc, NV, &S, &e) == KVC_OK);
    int32_t T[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    int taken = 0;
    for (int k = 0; k < 20; k++) {
        kvc_kv_seq a;
        kvc_kv_seq_init(&a);
        T[0] = 100 + k;                                     /* a new path each time */
        while (kvc_kv_n_free(pool) < 2 + kvc_snaps_cost(S, 6, true)) {
            const kvc_pc_node *leaf = kvc_pc_lru_next(pc, NULL);
            if (leaf && leaf->last_used < kvc_snaps_oldest(S))
                kvc_pc_evict(pc, 1);
            else if (!kvc_snaps_evict_one(S))
                break;
        }
        fake_run(pool, &a, T, 6, NULL);
        kvc_pc_node *n = publish(pc, &a, T);
        float lg[NV] = { 0 };
        taken += kvc_snaps_take(S, 0, n, T, &a, lg, &e) == 1;
        kvc_kv_seq_release(pool, &a);
        check_all(S, pc);
    }
    CHECK_EQ_INT(taken, 20);
    kvc_snaps_stats st;
    kvc_snaps_get_stats(S, &st);
    CHECK(st.count >= 1 && st.evicted + st.dropped == 20 - (uint64_t)st.count);
    CHECK(kvc_kv_n_free(pool) >= 0);
    kvc_snap *sn = find(S, pc, T, 8, 6, 6);                /* the newest is there */
    CHECK(sn && kvc_snap_pos(sn) == 6);
    kvc_snaps_free(S);
    kvc_pc_free(pc);
    CHECK_EQ_INT(kvc_kv_n_free(pool), 12);
    kvc_kv_pool_free(pool);
}

/* The disk tier under dir, the tiers over pool and pc, the store's figures. */
static kvc_tiers *open_tiers(const char *dir, kvc_kv_pool *pool, kvc_prefix_cache *pc,
                             kvc_block_store **bs)
{
    kvc_disk_store_params dp = { .dir = dir, .budget_bytes = 1 << 20 };
    kvc_err e = { 0 };
    kvc_tiers *t = NULL;
    CHECKF(kvc_disk_store_open(&dp, bs, &e) == KVC_OK, "%s", e.msg);
    CHECKF(*bs && kvc_tiers_new(pc, pool, *bs, 0, &t, &e) == KVC_OK, "%s", e.msg);
    return t;
}

static void truncate_record(const char *dir, uint64_t hash)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%016llx.kvb", dir, (unsigned long long)hash);
    CHECKF(truncate(path, 100) == 0, "truncate %s", path);   /* the header and a little */
}

/* A snapshot taken goes down the tiers' queue (the caller only copies it),
 * the writer thread writes it, and it reads back equal; a record cut short
 * (a crash mid-write, a power loss) is detected, ignored and recomputed,
 * whether found at a read or when the store is opened again. */
static void test_tiers(void)
{
    char dir[] = "/tmp/kvc_test_snapshot_XXXXXX";
    if (!mkdtemp(dir))
        return;
    kvc_kv_pool *pool = new_pool(16);
    kvc_prefix_cache *pc = NULL;
    kvc_snaps *S = NULL;
    kvc_err e = { 0 };
    CHECK(kvc_pc_new(pool, &pc, &e) == KVC_OK);
    CHECK(kvc_snaps_new(pool, pc, NV, &S, &e) == KVC_OK);
    kvc_block_store *bs = NULL;
    kvc_tiers *t = open_tiers(dir, pool, pc, &bs);
    kvc_snaps_set_tiers(S, t);
    int32_t T[8] = { 5, 6, 7, 8, 9, 10, 11, 12 };
    kvc_kv_seq a, b;
    kvc_kv_seq_init(&a);
    kvc_kv_seq_init(&b);
    float lg[NV], lg2[NV];
    int32_t held[16], n_held = 0;                          /* garbage in every block first */
    for (int32_t x; n_held < 16 && (x = kvc_kv_block_alloc(pool)) >= 0; held[n_held++] = x)
        memset(kvc_kv_block_data(pool, x), 0xA5, kvc_kv_block_bytes(pool));
    while (n_held > 0)
        kvc_kv_block_unref(pool, held[--n_held]);
    fake_run(pool, &a, T, 6, lg);                          /* a partial block: r = 2 */
    kvc_pc_node *n = publish(pc, &a, T);
    CHECK_EQ_INT(kvc_snaps_take(S, 0, n, T, &a, lg, &e), 1);
    kvc_snap *sn = find(S, pc, T, 8, 6, 6);
    CHECK(sn != NULL);
    const uint64_t h = sn ? kvc_snap_hash(S, sn) : 0;
    CHECK(kvc_tiers_has(t, h));                            /* queued or written: held */
    kvc_tiers_flush(t);
    kvc_tiers_stats ts;
    kvc_tiers_stats_get(t, &ts);
    CHECK_EQ_INT((int)ts.blocks_written, 1);               /* by the writer thread */
    CHECK_EQ_INT(ts.writes_pending, 0);
    kvc_snaps_stats st;
    kvc_snaps_get_stats(S, &st);
    CHECK_EQ_INT((int)st.written, 1);

    /* out of RAM, read back whole: states, logits, the partial block's K/V */
    CHECK(kvc_snaps_evict_one(S) > 0);
    kvc_pc_match m;
    kvc_pc_lookup(pc, 0, T, 8, &m);
    sn = kvc_snaps_fetch(S, 0, m.last, T, 6, 6, 0);
    CHECK(sn && kvc_snap_pos(sn) == 6 && kvc_snap_has_logits(sn));
    if (sn) {
        CHECK(kvc_snaps_restore(S, sn, &b, lg2, &e) == KVC_OK);
        CHECK(memcmp(kvc_kv_seq_states(pool, &b), kvc_kv_seq_states(pool, &a),
                     (size_t)kvc_kv_state_floats(pool) * sizeof(float)) == 0);
        CHECK(memcmp(lg, lg2, sizeof(lg)) == 0);
        /* K of positions 4, 5 as written; the rest of the record zeros, not
         * the pool's garbage (before: 0xA5 bytes went to disk and came back) */
        const float *kb = kvc_kv_k(pool, b.blocks[1], 1, 0), *ka = kvc_kv_k(pool, a.blocks[1], 1, 0);
        const float *vb = kvc_kv_v(pool, b.blocks[1], 1, 0);
        int same = 0, zero = 0;
        for (int d = 0; d < 32; d++)
            for (int j = 0; j < B; j++) {
                same += j < 2 && kb[d * B + j] == ka[d * B + j];
                zero += j >= 2 && kb[d * B + j] == 0.0f && vb[j * 32 + d] == 0.0f;
            }
        CHECKF(same == 64 && zero == 64, "partial block read back: %d of 64 K written equal, %d of 64 "
               "unwritten positions' K and V zero", same, zero);
    }
    kvc_kv_seq_release(pool, &b);
    check_all(S, pc);

    /* cut short while the store is open: the read fails its checks */
    truncate_record(dir, h);
    CHECK(kvc_snaps_evict_one(S) > 0);
    kvc_pc_lookup(pc, 0, T, 8, &m);
    CHECK(kvc_snaps_fetch(S, 0, m.last, T, 6, 6, 0) == NULL);
    kvc_bs_stats bst;
    kvc_tiers_store_stats(t, &bst);
    CHECK_EQ_INT((int)bst.checksum_failures, 1);
    CHECK(!kvc_tiers_has(t, h));                           /* discarded */

    /* taken again, written, then cut short behind a closed store: dropped
     * when the store is opened again */
    kvc_kv_seq_release(pool, &a);
    kvc_kv_seq_init(&a);
    fake_run(pool, &a, T, 6, lg);
    n = publish(pc, &a, T);
    CHECK_EQ_INT(kvc_snaps_take(S, 0, n, T, &a, lg, &e), 1);
    kvc_tiers_free(t);                                     /* writes what is queued */
    kvc_bs_close(bs);
    truncate_record(dir, h);
    t = open_tiers(dir, pool, pc, &bs);
    kvc_snaps_set_tiers(S, t);
    kvc_tiers_store_stats(t, &bst);
    CHECK_EQ_INT((int)bst.discarded_at_load, 1);
    CHECK(!kvc_tiers_has(t, h));
    CHECK(kvc_snaps_evict_one(S) > 0);
    kvc_pc_lookup(pc, 0, T, 8, &m);
    CHECK(kvc_snaps_fetch(S, 0, m.last, T, 6, 6, 0) == NULL);
    check_all(S, pc);

    kvc_kv_seq_release(pool, &a);
    kvc_snaps_free(S);
    kvc_tiers_free(t);
    kvc_bs_close(bs);
    kvc_pc_free(pc);
    kvc_kv_pool_free(pool);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

int main(void)
{
    test_assign();
    test_snapshots();
    test_budget();
    test_tiers();
    return test_done("test_snapshot");
}
