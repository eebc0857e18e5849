/* test_tiers.c - the prefix tree continued into the disk tier (tiers.h), on a
 * tiny generated model.
 *
 *  1. Restart: a sequence computed in one context, its path written through;
 *     a second context (a new process's pool, the same directory reopened)
 *     finds the run on disk (probe), reads it (fetch), and its blocks equal
 *     the first context's bitwise; finishing the prompt from there gives the
 *     logits of a cold run bitwise.
 *  2. Apart: another namespace or another model finds nothing.
 *  3. Eviction writes down: blocks evicted from RAM are on disk after.
 *  4. A corrupt block on disk stops the fetch there; it is counted, and what
 *     follows is recomputed, not read.
 *  5. Written through, then evicted: sent once, found in the queue or on
 *     disk.
 *  6. Through the engine: a conversation's turn, the engine freed (its
 *     writer finishes), a new engine on the same directory: the next turn
 *     finds its history on disk and answers as an engine without a disk.
 *  7. Tails: two sessions, three conversations taking turns. A session is
 *     reset for the third; its full blocks stay in the tree, its last
 *     partial block goes down (kvc_tiers_write_tail) and comes back: its next
 *     turn has as many tokens cached as with a slot of its own, the tail's
 *     from disk, and answers as a cold engine.
 *  8. An engine serving every request cold (--no-cache) opens no tier, so
 *     its disk directory is free for another.
 *  9. Redis heals (when redis-server is installed): instance A writes a
 *     conversation through to its disk and Redis; Redis is flushed; A's next
 *     turn puts the whole chain back (its disk holds it, Redis lost it), so
 *     instance B finds the whole prefix in Redis, not only the new blocks.
 * 10. A far Redis (a proxy adding 40-80 ms a round trip): small requests of
 *     new conversations take about what they take with a local Redis (the
 *     engine never waits on the network but for a short probe deadline). */
#include <fcntl.h>
#include <sys/time.h>
#include <unistd.h>

#include "block_store_redis.h"
#include "context.h"
#include "kernels.h"
#include "redis_proc.h"
#include "tiers.h"
#include "test.h"

static char tmpdir[256];

static kvc_context *new_ctx(kvc_model *m, uint64_t model_id)
{
    kvc_context *c = test_new_context(m, 256, 64, 1, 40);
    kvc_err e = { 0 };
    if (c)
        CHECK(kvc_pc_set_model(c->pc, model_id, &e) == KVC_OK);
    return c;
}

static kvc_block_store *open_store(const char *name)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/%s", tmpdir, name);
    kvc_disk_store_params p = { dir, 0, false };
    kvc_block_store *bs = NULL;
    kvc_err e = { 0 };
    CHECKF(kvc_disk_store_open(&p, &bs, &e) == KVC_OK, "%s", e.msg);
    return bs;
}

static kvc_tiers *new_tiers(kvc_context *c, kvc_block_store *bs, int32_t queue)
{
    kvc_tiers *t = NULL;
    kvc_err e = { 0 };
    CHECKF(kvc_tiers_new(c->pc, c->pool, bs, queue, &t, &e) == KVC_OK, "%s", e.msg);
    return t;
}

/* Compute tokens[0, n) in seq 0 and enter its full blocks in the tree;
 * returns the deepest node. */
static kvc_pc_node *compute_path(kvc_context *c, uint64_t ns, const int32_t *tokens, int32_t n)
{
    char err[512];
    kvc_context_seq_truncate(c, 0, 0);
    CHECKF(kvc_context_decode(c, 0, tokens, n, false, err, sizeof(err)) == KVC_OK, "%s", err);
    kvc_pc_node *node = kvc_pc_root(c->pc);
    kvc_err e = { 0 };
    for (int32_t i = 0; (i + 1) * 16 <= n; i++)
        CHECK(kvc_pc_insert(c->pc, ns, node, tokens + i * 16, c->seqs[0].blocks[i], false, &node,
                            &e) >= 0);
    return node;
}

#define N_TOK 100   /* 6 full blocks and 4 tokens */

static void test_restart(kvc_model *m, const int32_t *toks)
{
    kvc_context *a = new_ctx(m, 42), *cold = new_ctx(m, 42);
    kvc_block_store *bs = open_store("restart");
    if (!a || !cold || !bs)
        return;
    kvc_tiers *t = new_tiers(a, bs, 2);                   /* a path longer than the queue */
    kvc_pc_node *last = compute_path(a, 0, toks, N_TOK);
    CHECK_EQ_INT(kvc_tiers_write_path(t, last), 6);
    CHECK_EQ_INT(kvc_tiers_write_path(t, last), 0);          /* queued or stored already */
    kvc_tiers_flush(t);
    kvc_tiers_stats st;
    kvc_tiers_stats_get(t, &st);
    CHECK_EQ_INT(st.blocks_written, 6);
    CHECK_EQ_INT(st.writes_dropped, 0);
    kvc_tiers_free(t);
    kvc_bs_close(bs);

    /* "restart": a new context and the directory opened again */
    kvc_context *b = new_ctx(m, 42);
    bs = open_store("restart");
    t = b && bs ? new_tiers(b, bs, 0) : NULL;
    if (!t)
        return;
    kvc_pc_match mt;
    kvc_pc_lookup(b->pc, 0, toks, N_TOK, &mt);
    CHECK_EQ_INT(mt.n_full, 0);
    CHECK_EQ_INT(kvc_tiers_probe(t, 0, toks, N_TOK, &mt), 6);
    CHECK_EQ_INT(kvc_tiers_fetch(t, 0, toks, N_TOK, &mt, 4), 4);   /* at most max */
    CHECK_EQ_INT(mt.n_full, 4);
    CHECK_EQ_INT(kvc_tiers_probe(t, 0, toks, N_TOK, &mt), 2);
    CHECK_EQ_INT(kvc_tiers_fetch(t, 0, toks, N_TOK, &mt, 100), 2);
    CHECK_EQ_INT(mt.n_full, 6);
    kvc_err e = { 0 };
    CHECK(kvc_pc_check(b->pc, &e) == KVC_OK);
    CHECK_EQ_INT(kvc_pc_evictable(b->pc), 6);
    size_t bytes = kvc_kv_block_bytes(b->pool);
    int same = 0;
    int32_t blocks[6];
    for (kvc_pc_node *n = mt.last; n != kvc_pc_root(b->pc); n = n->parent) {
        blocks[n->depth] = n->block;
        same += memcmp(kvc_kv_block_data(b->pool, n->block),
                       kvc_kv_block_data(a->pool, a->seqs[0].blocks[n->depth]), bytes) == 0;
    }
    CHECK_EQ_INT(same, 6);
    /* the rest of the prompt computed on top of the fetched run: a cold run's logits */
    char err[512];
    kvc_context_seq_truncate(b, 0, 0);
    CHECK(kvc_kv_seq_append_blocks(b->pool, &b->seqs[0], blocks, 6, &e) == KVC_OK);
    CHECK(kvc_context_decode(b, 0, toks + 96, N_TOK - 96, false, err, sizeof(err)) == KVC_OK);
    CHECK(kvc_context_decode(cold, 0, toks, N_TOK, false, err, sizeof(err)) == KVC_OK);
    CHECK(memcmp(kvc_context_logits(b, -1), kvc_context_logits(cold, -1),
                 (size_t)m->hp.n_vocab * sizeof(float)) == 0);
    kvc_tiers_stats_get(t, &st);
    CHECK_EQ_INT(st.blocks_fetched, 6);
    kvc_bs_stats bst;
    kvc_tiers_store_stats(t, &bst);
    CHECK_EQ_INT(bst.bytes_read, 6 * bytes);
    kvc_tiers_free(t);
    kvc_bs_close(bs);

    /* apart: another namespace, another model */
    kvc_context *other = new_ctx(m, 43);
    bs = open_store("restart");
    t = other && bs ? new_tiers(other, bs, 0) : NULL;
    if (t) {
        kvc_pc_lookup(other->pc, 0, toks, N_TOK, &mt);
        CHECK_EQ_INT(kvc_tiers_probe(t, 0, toks, N_TOK, &mt), 0);   /* another model id */
        kvc_tiers_free(t);
    }
    kvc_context_free(other);
    kvc_context *c = new_ctx(m, 42);
    t = c ? new_tiers(c, bs, 0) : NULL;
    if (t) {
        kvc_pc_lookup(c->pc, 7, toks, N_TOK, &mt);
        CHECK_EQ_INT(kvc_tiers_probe(t, 7, toks, N_TOK, &mt), 0);   /* another namespace */
        kvc_pc_lookup(c->pc, 0, toks, N_TOK, &mt);
        CHECK_EQ_INT(kvc_tiers_probe(t, 0, toks, N_TOK, &mt), 6);
        kvc_tiers_free(t);
    }
    kvc_context_free(c);
    /* apart: another arithmetic (the scalar ISA rounds otherwise, kernels.h) */
    const kvc_isa isa = kvc_kernels_isa();
    if (isa != KVC_ISA_SCALAR && kvc_kernels_set_isa(KVC_ISA_SCALAR) == KVC_OK) {
        c = new_ctx(m, 42);
        t = c ? new_tiers(c, bs, 0) : NULL;
        if (t) {
            kvc_pc_lookup(c->pc, 0, toks, N_TOK, &mt);
            CHECK_EQ_INT(kvc_tiers_probe(t, 0, toks, N_TOK, &mt), 0);
            kvc_tiers_free(t);
        }
        kvc_context_free(c);
        kvc_kernels_set_isa(isa);
    }
    kvc_bs_close(bs);
    kvc_context_free(a);
    kvc_context_free(b);
    kvc_context_free(cold);
}

static void test_evict_and_corrupt(kvc_model *m, const int32_t *toks)
{
    kvc_context *a = new_ctx(m, 42);
    kvc_block_store *bs = open_store("evict");
    kvc_tiers *t = a && bs ? new_tiers(a, bs, 2) : NULL;   /* 2 slots kept, more made */
    if (!t)
        return;
    compute_path(a, 0, toks, N_TOK);
    kvc_context_seq_truncate(a, 0, 0);                     /* only the tree holds them */
    CHECK_EQ_INT(kvc_pc_evictable(a->pc), 6);
    CHECK_EQ_INT(kvc_pc_evict(a->pc, 100), 6);
    kvc_tiers_flush(t);
    kvc_tiers_stats st;
    kvc_tiers_stats_get(t, &st);
    CHECK_EQ_INT(st.evictions_written, 6);
    CHECK_EQ_INT(st.blocks_written, 6);
    kvc_bs_stats bst;
    kvc_tiers_store_stats(t, &bst);
    CHECK_EQ_INT(bst.n_blocks, 6);
    /* flip a byte in the third block's K/V: the fetch stops before it */
    kvc_pc_match mt;
    kvc_pc_lookup(a->pc, 0, toks, N_TOK, &mt);
    uint64_t h = kvc_pc_ns_seed(a->pc, 0);
    for (int i = 0; i < 3; i++)
        h = kvc_pc_chain_hash(a->pc, h, toks + 16 * i);
    char path[600];
    snprintf(path, sizeof(path), "%s/evict/%016llx.kvb", tmpdir, (unsigned long long)h);
    int fd = open(path, O_RDWR);
    uint8_t byte = 0;
    CHECK(fd >= 0 && pread(fd, &byte, 1, 4000) == 1);
    byte ^= 1;
    CHECK(pwrite(fd, &byte, 1, 4000) == 1);
    close(fd);
    CHECK_EQ_INT(kvc_tiers_probe(t, 0, toks, N_TOK, &mt), 6);   /* the index does not know */
    CHECK_EQ_INT(kvc_tiers_fetch(t, 0, toks, N_TOK, &mt, 100), 2);
    kvc_tiers_stats_get(t, &st);
    kvc_tiers_store_stats(t, &bst);
    CHECK_EQ_INT(st.fetch_failures, 1);
    CHECK_EQ_INT(bst.checksum_failures, 1);
    CHECK_EQ_INT(kvc_tiers_probe(t, 0, toks, N_TOK, &mt), 0);   /* discarded */
    kvc_err e = { 0 };
    CHECK(kvc_pc_check(a->pc, &e) == KVC_OK);
    kvc_tiers_free(t);
    kvc_bs_close(bs);
    kvc_context_free(a);
}

/* A sliding-window model (tiny-gemma3, window 12): a block is two records,
 * (block, full layers) and (block, window layers). With the last block's
 * window record corrupt, the fetch still reads every block (their full
 * layers), the match is cut where the window can still serve (80 of 96),
 * and computing on from there gives a cold run's logits. */
static void test_window_records(kvc_model *m)
{
    int32_t toks[N_TOK];
    for (int i = 0; i < N_TOK; i++)
        toks[i] = (int32_t)((i * 7919 + 11) % m->hp.n_vocab);
    kvc_context *a = new_ctx(m, 42), *b = new_ctx(m, 42), *cold = new_ctx(m, 42);
    kvc_block_store *bs = open_store("window");
    kvc_tiers *t = a && b && cold && bs ? new_tiers(a, bs, 0) : NULL;
    if (!t)
        return;
    CHECK_EQ_INT(kvc_kv_n_groups(a->pool), 2);
    kvc_pc_node *last = compute_path(a, 0, toks, N_TOK);
    CHECK_EQ_INT(kvc_tiers_write_path(t, last), 6);
    kvc_tiers_flush(t);
    kvc_tiers_stats st;
    kvc_tiers_stats_get(t, &st);
    CHECK_EQ_INT(st.blocks_written, 12);                   /* 6 blocks, 2 records each */
    const uint64_t cb = kvc_kv_group_chunk_bytes(a->pool, 1);
    CHECK(st.window_chunks_written == 6 && st.window_bytes_written == 6 * cb);
    kvc_tiers_free(t);
    kvc_bs_close(bs);
    char path[600];
    snprintf(path, sizeof(path), "%s/window/%016llx.kvb", tmpdir,
             (unsigned long long)kvc_tiers_group_hash(last->hash, 1));
    int fd = open(path, O_RDWR);
    uint8_t byte = 0;
    CHECKF(fd >= 0 && pread(fd, &byte, 1, 300) == 1, "%s", path);
    byte ^= 1;
    CHECK(pwrite(fd, &byte, 1, 300) == 1);
    close(fd);
    bs = open_store("window");
    t = bs ? new_tiers(b, bs, 0) : NULL;
    if (!t)
        return;
    kvc_pc_match mt;
    kvc_pc_lookup(b->pc, 0, toks, N_TOK, &mt);
    CHECK_EQ_INT(kvc_tiers_probe(t, 0, toks, N_TOK, &mt), 6);
    CHECK_EQ_INT(kvc_tiers_fetch(t, 0, toks, N_TOK, &mt, 100), 6);
    kvc_bs_stats bst;
    kvc_tiers_store_stats(t, &bst);
    CHECK_EQ_INT(bst.checksum_failures, 1);
    kvc_tiers_stats_get(t, &st);                           /* the corrupt one missed */
    CHECKF(st.window_chunks_fetched == 5 && st.window_bytes_read == 5 * cb && st.window_chunks_missed == 1,
           "window chunks: %llu fetched (%llu bytes), %llu missed", (unsigned long long)st.window_chunks_fetched,
           (unsigned long long)st.window_bytes_read, (unsigned long long)st.window_chunks_missed);
    CHECK(!kvc_kv_block_has(b->pool, mt.last->block, 1) && kvc_kv_block_has(b->pool, mt.last->parent->block, 1));
    kvc_pc_lookup(b->pc, 0, toks, N_TOK, &mt);
    CHECK_EQ_INT(mt.n_full, 5);
    int32_t blocks[5];
    for (kvc_pc_node *n = mt.last; n != kvc_pc_root(b->pc); n = n->parent)
        blocks[n->depth] = n->block;
    kvc_err e = { 0 };
    char err[512];
    CHECK(kvc_kv_seq_append_blocks(b->pool, &b->seqs[0], blocks, 5, &e) == KVC_OK);
    CHECK(kvc_context_decode(b, 0, toks + 80, N_TOK - 80, false, err, sizeof(err)) == KVC_OK);
    CHECK(kvc_context_decode(cold, 0, toks, N_TOK, false, err, sizeof(err)) == KVC_OK);
    CHECK(memcmp(kvc_context_logits(b, -1), kvc_context_logits(cold, -1),
                 (size_t)m->hp.n_vocab * sizeof(float)) == 0);
    kvc_tiers_free(t);
    kvc_bs_close(bs);
    kvc_context_free(a);
    kvc_context_free(b);
    kvc_context_free(cold);
}

/* The bytes of a tail's records over `garbage` in the pool's unused memory
 * (every chunk of every block filled with it first): a conversation of
 * N_TOK tokens computed, its 4-token tail sent down alone; the store's
 * files (group 0's record and the window group's), in name order. */
static uint8_t *tail_files(kvc_model *m, int garbage, size_t *len)
{
    *len = 0;
    int32_t toks[N_TOK], win[64];
    for (int i = 0; i < N_TOK; i++)
        toks[i] = (int32_t)((i * 7919 + 3) % m->hp.n_vocab);
    for (int32_t l = 0; l < m->hp.n_layer && l < 64; l++)
        win[l] = m->layers[l].window;
    char name[32], dir[512];
    snprintf(name, sizeof(name), "tail%02x", garbage);
    snprintf(dir, sizeof(dir), "%s/%s", tmpdir, name);
    kvc_context *c = test_new_context(m, 256, 64, 1, 40);
    kvc_block_store *bs = open_store(name);
    kvc_err e = { 0 };
    char err[512];
    kvc_tiers *t = NULL;
    uint8_t *out = NULL;
    if (!c || !bs || kvc_context_set_windows(c, win, 0, &e) != KVC_OK || !(t = new_tiers(c, bs, 0)))
        goto done;
    int32_t held[64], n_held = 0;   /* every block, each chunk of it filled */
    for (int32_t b; n_held < 64 && (b = kvc_kv_block_alloc(c->pool)) >= 0; held[n_held++] = b)
        for (int32_t g = 0; g < kvc_kv_n_groups(c->pool); g++)
            memset(kvc_kv_chunk_data(c->pool, b, g), garbage, kvc_kv_group_chunk_bytes(c->pool, g));
    while (n_held > 0)
        kvc_kv_block_unref(c->pool, held[--n_held]);
    CHECKF(kvc_context_decode(c, 0, toks, N_TOK, false, err, sizeof(err)) == KVC_OK, "%s", err);
    CHECK(kvc_kv_n_groups(c->pool) == 2 && c->seqs[0].n_blocks == 7);
    kvc_tiers_write_tail(t, 0, toks, N_TOK, c->seqs[0].blocks[6]);
    kvc_tiers_flush(t);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "cat $(ls %s/*.kvb | sort)", dir);
    FILE *f = popen(cmd, "r");
    size_t cap = 0;
    for (size_t got = 1; f && got > 0; *len += got) {
        if (*len + 4096 > cap && !(out = realloc(out, cap = cap * 2 + 65536)))
            break;
        got = fread(out + *len, 1, 4096, f);
    }
    if (f)
        pclose(f);
done:
    kvc_tiers_free(t);
    kvc_bs_close(bs);
    kvc_context_free(c);
    return out;
}

/* A tail's records are the same bytes whatever the pool's unused memory
 * held (tiny-gemma3: a full and a window group). Its block's positions past
 * the tail were never written: before, they went to disk (and Redis) as
 * they were, valgrind's "writev points to uninitialised bytes", and as an
 * earlier owner's K/V; now they are zeros. */
static void test_tail_bytes(kvc_model *m)
{
    size_t la = 0, lb = 0;
    uint8_t *a = tail_files(m, 0x00, &la), *b = tail_files(m, 0xA5, &lb);
    CHECKF(a && b && la == lb && la > 2 * 64, "tail records: %zu and %zu bytes", la, lb);
    size_t diff = 0;
    for (size_t i = 0; a && b && i < KVC_MIN(la, lb); i++)
        diff += a[i] != b[i];
    CHECKF(diff == 0, "tail records: %zu of %zu bytes depend on the pool's unused memory", diff, la);
    free(a);
    free(b);
}

/* Window chunks evicted from RAM go down the tier (tiny-gemma3, window 12,
 * a window slab of 6 chunks): a conversation computed 16 tokens at a time
 * and entered in the tree, then another that takes the slab's chunks. The
 * first one's evicted window chunks were written (a record each), their
 * blocks stay in RAM without them, so a lookup stops short; read back
 * (kvc_tiers_fetch_windows), the whole path serves again and computing on
 * from it gives a cold run's logits. Before, the chunks were dropped: the
 * lookup stayed short and the rest was computed again. */
static void test_window_chunks_down(kvc_model *m)
{
    int32_t toks[N_TOK], other[N_TOK], win[64];
    for (int i = 0; i < N_TOK; i++) {
        toks[i] = (int32_t)((i * 7919 + 11) % m->hp.n_vocab);
        other[i] = (int32_t)((i * 104729 + 5) % m->hp.n_vocab);
    }
    for (int32_t l = 0; l < m->hp.n_layer && l < 64; l++)
        win[l] = m->layers[l].window;
    kvc_context *c = test_new_context(m, 256, 16, 1, 40), *cold = new_ctx(m, 42);
    kvc_block_store *bs = open_store("chunks");
    kvc_err e = { 0 };
    char err[512];
    if (!c || !cold || !bs)
        return;
    CHECKF(kvc_context_set_windows(c, win, 6, &e) == KVC_OK && kvc_pc_set_model(c->pc, 42, &e) == KVC_OK,
           "%s", e.msg);
    kvc_tiers *t = new_tiers(c, bs, 0);
    if (!t)
        return;
    CHECK_EQ_INT(kvc_kv_group_of(c->pool, 1)->n_blocks, 6);
    const int32_t *const convs[2] = { toks, other };
    for (int k = 0; k < 2; k++) {
        kvc_context_seq_truncate(c, 0, 0);
        kvc_pc_node *node = kvc_pc_root(c->pc);
        for (int p = 0; p < N_TOK; p += 16) {   /* each block in the tree once written */
            CHECKF(kvc_context_decode(c, 0, convs[k] + p, KVC_MIN(16, N_TOK - p), false, err, sizeof(err)) == KVC_OK,
                   "%s", err);
            if (p + 16 <= N_TOK)
                CHECK(kvc_pc_insert(c->pc, 0, node, convs[k] + p, c->seqs[0].blocks[p / 16], false, &node, &e) >= 0);
        }
    }
    kvc_context_seq_truncate(c, 0, 0);
    kvc_tiers_flush(t);
    kvc_tiers_stats st;
    kvc_tiers_stats_get(t, &st);
    CHECKF(st.chunks_written >= 5, "%llu window chunks written", (unsigned long long)st.chunks_written);
    kvc_pc_match mt;
    kvc_pc_lookup(c->pc, 0, toks, N_TOK, &mt);
    CHECKF(mt.n_full < 5, "matched %d blocks with their window chunks evicted", mt.n_full);
    CHECK(kvc_tiers_fetch_windows(t, 0, toks, N_TOK, &mt) > 0);
    kvc_pc_lookup(c->pc, 0, toks, N_TOK, &mt);
    CHECK_EQ_INT(mt.n_full, 6);
    kvc_tiers_stats_get(t, &st);
    CHECK(st.chunks_fetched > 0 && st.fetch_failures == 0);
    const uint64_t cb = kvc_kv_group_chunk_bytes(c->pool, 1);
    CHECKF(st.window_chunks_fetched == st.chunks_fetched && st.window_bytes_read == st.chunks_fetched * cb &&
           st.window_chunks_missed == 0 && st.window_chunks_written >= st.chunks_written &&
           st.window_bytes_written == st.window_chunks_written * cb,
           "window chunks: %llu written (%llu bytes), %llu fetched (%llu bytes), %llu missed",
           (unsigned long long)st.window_chunks_written, (unsigned long long)st.window_bytes_written,
           (unsigned long long)st.window_chunks_fetched, (unsigned long long)st.window_bytes_read,
           (unsigned long long)st.window_chunks_missed);
    int32_t blocks[6];
    for (kvc_pc_node *n = mt.last; n != kvc_pc_root(c->pc); n = n->parent)
        blocks[n->depth] = n->block;
    CHECK(mt.n_full == 6 && kvc_kv_seq_append_blocks(c->pool, &c->seqs[0], blocks, 6, &e) == KVC_OK);
    CHECK(kvc_context_decode(c, 0, toks + 96, N_TOK - 96, false, err, sizeof(err)) == KVC_OK);
    CHECK(kvc_context_decode(cold, 0, toks, N_TOK, false, err, sizeof(err)) == KVC_OK);
    CHECK(memcmp(kvc_context_logits(c, -1), kvc_context_logits(cold, -1),
                 (size_t)m->hp.n_vocab * sizeof(float)) == 0);
    kvc_tiers_free(t);
    kvc_bs_close(bs);
    kvc_context_free(c);
    kvc_context_free(cold);
}

/* Written through, then evicted before (or after) the writer got to them:
 * nothing is sent twice, and the fetch finds every block, in the queue or on
 * disk, equal to a cold run's. */
static void test_through_then_evict(kvc_model *m, const int32_t *toks)
{
    kvc_context *a = new_ctx(m, 42), *cold = new_ctx(m, 42);
    kvc_block_store *bs = open_store("through");
    kvc_tiers *t = a && cold && bs ? new_tiers(a, bs, 0) : NULL;
    if (!t)
        return;
    kvc_pc_node *last = compute_path(a, 0, toks, N_TOK);
    CHECK_EQ_INT(kvc_tiers_write_path(t, last), 6);
    kvc_context_seq_truncate(a, 0, 0);
    CHECK_EQ_INT(kvc_pc_evict(a->pc, 100), 6);
    kvc_tiers_stats st;
    kvc_tiers_stats_get(t, &st);
    CHECK_EQ_INT(st.evictions_written, 0);
    kvc_pc_match mt;
    kvc_pc_lookup(a->pc, 0, toks, N_TOK, &mt);
    CHECK_EQ_INT(kvc_tiers_fetch(t, 0, toks, N_TOK, &mt, 100), 6);
    char err[512];
    CHECK(kvc_context_decode(cold, 0, toks, N_TOK, false, err, sizeof(err)) == KVC_OK);
    int same = 0;
    for (kvc_pc_node *n = mt.last; n != kvc_pc_root(a->pc); n = n->parent)
        same += memcmp(kvc_kv_block_data(a->pool, n->block),
                       kvc_kv_block_data(cold->pool, cold->seqs[0].blocks[n->depth]),
                       kvc_kv_block_bytes(a->pool)) == 0;
    CHECK_EQ_INT(same, 6);
    kvc_tiers_flush(t);
    kvc_tiers_stats_get(t, &st);
    CHECK_EQ_INT(st.blocks_written, 6);
    kvc_tiers_free(t);
    kvc_bs_close(bs);
    kvc_context_free(a);
    kvc_context_free(cold);
}

/* One request through an engine, of the conversation `key`; the reply
 * (malloc'd) and its stats. */
static char *ask_key(kvc_engine *e, const char *key, const kvc_chat_message *msgs, size_t n,
                     kvc_chat_stats *st)
{
    kvc_request_params rp = { .messages = msgs, .n_messages = n, .session_key = key };
    rp.chat = kvc_chat_default_params();
    rp.chat.max_tokens = 12;
    char err[512];
    kvc_request *r = kvc_engine_submit(e, &rp, NULL, err, sizeof(err));
    CHECKF(r, "%s", err);
    char *reply = NULL;
    kvc_event ev;
    while (r && kvc_request_next(r, &ev, -1)) {
        if (ev.type == KVC_EVENT_DONE) {
            reply = strdup(ev.text ? ev.text : "");
            *st = ev.stats;
        }
        CHECKF(ev.type != KVC_EVENT_ERROR, "%s", ev.message);
        bool last = ev.type != KVC_EVENT_TEXT;
        kvc_event_clear(&ev);
        if (last)
            break;
    }
    kvc_request_free(r);
    return reply;
}

static char *ask(kvc_engine *e, const kvc_chat_message *msgs, size_t n, kvc_chat_stats *st)
{
    return ask_key(e, "conv", msgs, n, st);
}

/* An engine on a 512-token context, one thread, a disk tier of disk_mib in
 * dir (0: none). */
static kvc_engine_params engine_params(const char *dir, const char *model_path,
                                       int32_t n_parallel, int64_t disk_mib)
{
    kvc_engine_params ep = kvc_engine_default_params();
    ep.n_ctx = 512;
    ep.n_threads = 1;
    ep.n_parallel = n_parallel;
    ep.cache_disk_mib = disk_mib;
    ep.cache_dir = dir;
    ep.model_path = model_path;
    return ep;
}

/* A conversation's second turn after a restart reads its first turn from
 * disk (sliding-window models: every window record of the hit point's
 * window too, else the window groups could serve none of it), and its reply
 * equals a fresh engine's without a disk tier. */
static void test_engine_restart(kvc_model *m, const char *model_path, const char *label)
{
    char dir[600], user[2000];
    snprintf(dir, sizeof(dir), "%s/engine-%s", tmpdir, label);
    int at = snprintf(user, sizeof(user), "Remember:");
    for (int i = 0; i < 120; i++)
        at += snprintf(user + at, sizeof(user) - (size_t)at, " %s", i % 3 ? "stone" : "river");
    kvc_chat_message msgs[4] = { { "system", "You are terse." }, { "user", user },
                                 { "assistant", NULL }, { "user", "And then?" } };
    kvc_engine_params ep = engine_params(dir, model_path, 2, 16);
    kvc_engine *e = NULL;
    char err[512];
    CHECKF(kvc_engine_new(m, &ep, &e, err, sizeof(err)) == KVC_OK, "%s", err);
    if (!e)
        return;
    kvc_chat_stats st;
    char *r1 = ask(e, msgs, 2, &st);
    kvc_engine_free(e);                                  /* the writer finishes first */
    msgs[2].content = r1 ? r1 : "";
    CHECKF(kvc_engine_new(m, &ep, &e, err, sizeof(err)) == KVC_OK, "%s", err);
    char *warm = e ? ask(e, msgs, 4, &st) : NULL;
    kvc_engine_metrics em;
    if (e)
        kvc_engine_get_metrics(e, &em);
    kvc_engine_free(e);
    ep.cache_disk_mib = 0;
    CHECKF(kvc_engine_new(m, &ep, &e, err, sizeof(err)) == KVC_OK, "%s", err);
    kvc_chat_stats cold_st;
    char *cold = e ? ask(e, msgs, 4, &cold_st) : NULL;
    kvc_engine_free(e);
    CHECKF(warm && cold && strcmp(warm, cold) == 0, "%s: warm reply differs from a fresh engine's", label);
    printf("  engine restart (%s): next turn %d prompt tokens, %d cached, %d of them from disk "
           "(cold: %d computed; %llu records read)\n", label, st.prompt_tokens, st.cached_tokens,
           st.cached_disk_tokens, cold_st.computed_tokens, (unsigned long long)em.disk_blocks_read);
    CHECKF(st.cached_disk_tokens * 10 >= st.prompt_tokens * 8, "%s: only %d of %d tokens from disk",
           label, st.cached_disk_tokens, st.prompt_tokens);
    CHECK_EQ_INT(em.disk_tokens, st.cached_disk_tokens);
    CHECK(em.disk_blocks_read > 0 && em.disk_checksum_failures == 0);
    free(r1);
    free(warm);
    free(cold);
}

/* An engine serving every request cold (serve --no-cache) opens no tier:
 * the disk directory stays free for a normal server started beside it. */
static void test_no_cache_no_lock(kvc_model *m, const char *model_path)
{
    char dir[600], err[512];
    snprintf(dir, sizeof(dir), "%s/nocache", tmpdir);
    kvc_engine_params ep = engine_params(dir, model_path, 1, 16);
    ep.no_cache = true;
    kvc_engine *e = NULL;
    CHECKF(kvc_engine_new(m, &ep, &e, err, sizeof(err)) == KVC_OK, "%s", err);
    kvc_disk_store_params dp = { dir, 0, false };
    kvc_block_store *bs = NULL;
    kvc_err ke = { 0 };
    int rc = kvc_disk_store_open(&dp, &bs, &ke);
    CHECKF(rc == KVC_OK, "a --no-cache engine holds the disk directory: %s", ke.msg);
    kvc_bs_close(bs);
    kvc_engine_metrics em;
    if (e)
        kvc_engine_get_metrics(e, &em);
    CHECK(e && em.disk_bytes_budget == 0);
    kvc_engine_free(e);
}

/* Conversations A, B and C take turns (A1, B1, C1, A2) on an engine of one
 * slot and `idle` sessions kept beside it (disk tier on when `disk`); A2's
 * reply and stats. */
static char *a_b_a(kvc_model *m, const char *model_path, int32_t idle, bool disk,
                   kvc_chat_stats *st)
{
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/tails%d%d", tmpdir, idle, disk);
    kvc_chat_message a[4] = { { "user", "Tell me about rivers and the stones they carry." },
                              { "assistant", NULL }, { "user", "And the sea?" } };
    kvc_chat_message b[1] = { { "user", "Something else entirely, about mountains." } };
    kvc_chat_message c[1] = { { "user", "And now about the weather in the hills." } };
    kvc_engine_params ep = engine_params(dir, model_path, 1, disk ? 16 : 0);
    ep.max_sessions = idle;
    kvc_engine *e = NULL;
    char err[512];
    CHECKF(kvc_engine_new(m, &ep, &e, err, sizeof(err)) == KVC_OK, "%s", err);
    if (!e)
        return NULL;
    kvc_chat_stats s1, s2;
    char *r1 = ask_key(e, "A", a, 1, &s1);
    CHECK(test_wait_background(e));
    char *rb = ask_key(e, "B", b, 1, &s2);
    CHECK(test_wait_background(e));
    char *rc = ask_key(e, "C", c, 1, &s2);
    CHECK(test_wait_background(e));
    a[1].content = r1 ? r1 : "";
    char *r2 = ask_key(e, "A", a, 3, st);
    kvc_engine_free(e);
    free(r1);
    free(rb);
    free(rc);
    return r2;
}

static void test_engine_tails(kvc_model *m, const char *model_path)
{
    kvc_chat_stats own, spilled, cold;
    char *r_own = a_b_a(m, model_path, 4, false, &own);     /* A keeps its session */
    char *r_spill = a_b_a(m, model_path, 1, true, &spilled); /* C takes A's */
    char *r_cold = a_b_a(m, model_path, 1, false, &cold);   /* A's tail is lost */
    printf("  tails: A's next turn %d prompt tokens; cached %d with a slot of its own, %d "
           "(%d from disk) reset with a disk tier, %d reset without\n", own.prompt_tokens,
           own.cached_tokens, spilled.cached_tokens, spilled.cached_disk_tokens,
           cold.cached_tokens);
    CHECK(r_own && r_spill && r_cold && !strcmp(r_own, r_spill) && !strcmp(r_own, r_cold));
    CHECKF(own.cached_tokens % 16 != 0, "the conversation ends on a block boundary (%d tokens): "
           "no tail to test", own.cached_tokens);
    CHECK_EQ_INT(spilled.cached_tokens, own.cached_tokens);
    CHECK(spilled.cached_disk_tokens >= own.cached_tokens % 16);
    CHECK(cold.cached_tokens < own.cached_tokens);
    free(r_own);
    free(r_spill);
    free(r_cold);
}

/* Tiers over a disk directory `name` and the Redis on `port`, for ctx c. */
static kvc_tiers *redis_tiers(kvc_context *c, const char *name, int port,
                              kvc_block_store **store)
{
    char dir[512], url[64];
    snprintf(dir, sizeof(dir), "%s/%s", tmpdir, name);
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/0", port);
    kvc_disk_store_params dp = { dir, 0, false };
    kvc_block_store *local = NULL;
    kvc_err e = { 0 };
    CHECKF(kvc_disk_store_open(&dp, &local, &e) == KVC_OK, "%s", e.msg);
    kvc_redis_store_params rp = { .url = url, .model_fp = 42, .timeout_ms = 1000,
                                  .wait_ms = 1000 };
    *store = NULL;
    CHECKF(kvc_redis_store_open(&rp, local, store, &e) == KVC_OK, "%s", e.msg);
    return *store ? new_tiers(c, *store, 0) : NULL;
}

static void redis_flushall(int port)
{
    struct timeval tv = { 1, 0 };
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", port, tv);
    redisReply *r = rc && !rc->err ? redisCommand(rc, "FLUSHALL") : NULL;
    CHECK(r && r->type == REDIS_REPLY_STATUS);
    if (r)
        freeReplyObject(r);
    if (rc)
        redisFree(rc);
}

#define N_LONG 140   /* the next turn: 8 full blocks, the first 6 as before */

static void test_redis_heals(kvc_model *m, int port, const int32_t *toks)
{
    kvc_context *a = new_ctx(m, 42), *b = new_ctx(m, 42);
    kvc_block_store *sa = NULL, *sb = NULL;
    kvc_tiers *ta = a ? redis_tiers(a, "heal_a", port, &sa) : NULL;
    kvc_tiers *tb = b ? redis_tiers(b, "heal_b", port, &sb) : NULL;
    if (!ta || !tb)
        goto out;
    kvc_pc_node *leaf = compute_path(a, 0, toks, N_TOK);       /* turn 1: 6 blocks */
    CHECK_EQ_INT(kvc_tiers_write_path(ta, leaf), 6);
    kvc_tiers_flush(ta);
    redis_flushall(port);                                     /* Redis loses them all */
    leaf = compute_path(a, 0, toks, N_LONG);                  /* turn 2: 2 new blocks */
    kvc_tiers_write_path(ta, leaf);
    kvc_tiers_flush(ta);
    kvc_pc_match mb;
    kvc_pc_lookup(b->pc, 0, toks, N_LONG, &mb);
    int64_t found = kvc_tiers_probe(tb, 0, toks, N_LONG, &mb);
    printf("  redis heals: after a FLUSHALL and one more turn on A, B finds %lld of %d blocks "
           "in Redis\n", (long long)found, N_LONG / 16);
    CHECKF(found == N_LONG / 16, "B found %lld of %d blocks after the flush", (long long)found,
           N_LONG / 16);
    CHECK_EQ_INT(kvc_tiers_fetch(tb, 0, toks, N_LONG, &mb, found), found);
out:
    kvc_tiers_free(ta);
    kvc_tiers_free(tb);
    kvc_bs_close(sa);
    kvc_bs_close(sb);
    kvc_context_free(a);
    kvc_context_free(b);
}

static double now_ms(void)
{
    struct timeval t;
    gettimeofday(&t, NULL);
    return (double)t.tv_sec * 1e3 + (double)t.tv_usec / 1e3;
}

/* Small requests (new conversations of ten words) on two engines, one with a
 * local Redis, one with the same Redis 40-80 ms away; taken in turns. */
static void test_far_redis(kvc_model *m, const char *model_path, int port)
{
    slow_proxy px;
    if (!slow_proxy_start(&px, port, 40, 80)) {
        CHECKF(false, "cannot start the proxy");
        return;
    }
    char near_dir[600], far_dir[600], near_url[64], far_url[64];
    snprintf(near_dir, sizeof(near_dir), "%s/near", tmpdir);
    snprintf(far_dir, sizeof(far_dir), "%s/far", tmpdir);
    snprintf(near_url, sizeof(near_url), "redis://127.0.0.1:%d/1", port);
    snprintf(far_url, sizeof(far_url), "redis://127.0.0.1:%d/2", px.port);
    kvc_engine_params np = engine_params(near_dir, model_path, 1, 16);
    kvc_engine_params fp = engine_params(far_dir, model_path, 1, 16);
    np.cache_redis = near_url;
    fp.cache_redis = far_url;
    fp.cache_redis_timeout_ms = 500;
    kvc_engine *ne = NULL, *fe = NULL;
    char err[512];
    CHECKF(kvc_engine_new(m, &np, &ne, err, sizeof(err)) == KVC_OK, "%s", err);
    CHECKF(kvc_engine_new(m, &fp, &fe, err, sizeof(err)) == KVC_OK, "%s", err);
    static const char *words[] = { "river", "stone", "cloud", "maple", "ember", "quartz",
                                   "harbor", "willow", "copper", "meadow", "falcon", "glacier" };
    double t_near = 0, t_far = 0;
    const int rounds = 20;
    for (int i = 0; ne && fe && i <= rounds; i++) {
        char user[256], key[32];
        int at = 0;
        for (int w = 0; w < 10; w++)
            at += snprintf(user + at, sizeof(user) - (size_t)at, "%s%s", w ? " " : "",
                           words[(i * 7 + w * 5) % 12]);
        snprintf(key, sizeof(key), "small%d", i);
        kvc_chat_message msgs[2] = { { "system", "You are terse." }, { "user", user } };
        kvc_chat_stats st;
        kvc_engine *first = i % 2 ? ne : fe, *second = i % 2 ? fe : ne;   /* in turns */
        double t0 = now_ms();
        free(ask_key(first, key, msgs, 2, &st));
        double t1 = now_ms();
        free(ask_key(second, key, msgs, 2, &st));
        double t2 = now_ms();
        if (i > 0) {                                           /* the first warms up */
            t_near += first == ne ? t1 - t0 : t2 - t1;
            t_far += first == fe ? t1 - t0 : t2 - t1;
        }
    }
    kvc_engine_metrics em = { 0 };
    for (int w = 0; fe && w < 100 && em.redis_blocks_written == 0; w++) {   /* they land */
        if (w)
            usleep(30 * 1000);
        kvc_engine_get_metrics(fe, &em);
    }
    CHECK(em.redis_blocks_written > 0);
    printf("  far redis: %d small requests, %.1f ms each with a local Redis, %.1f ms with one "
           "40-80 ms away (%.2fx); %lld blocks written there\n", rounds, t_near / rounds,
           t_far / rounds, t_far / t_near, (long long)em.redis_blocks_written);
    CHECKF(t_far <= 1.2 * t_near + 3.0 * rounds,
           "small requests took %.1f ms with a far Redis, %.1f ms with a local one",
           t_far / rounds, t_near / rounds);
    kvc_engine_free(ne);
    kvc_engine_free(fe);
    slow_proxy_stop(&px);
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvc_test_tiers_XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    char model_path[512];
    kvc_model *m = test_gen_model(tmpdir, "tiny", model_path, sizeof(model_path));
    if (m) {
        int32_t toks[N_TOK];
        uint64_t x = 88172645463325252ull;
        for (int i = 0; i < N_TOK; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            toks[i] = (int32_t)(x % (uint64_t)m->hp.n_vocab);
        }
        test_restart(m, toks);
        test_evict_and_corrupt(m, toks);
        test_through_then_evict(m, toks);
        test_engine_restart(m, model_path, "tiny");
        test_engine_tails(m, model_path);
        test_no_cache_no_lock(m, model_path);
        redis_proc rp;
        bool absent = false;
        if (redis_proc_start(&rp, 0, &absent)) {
            int32_t longer[N_LONG];
            memcpy(longer, toks, sizeof(toks));
            for (int i = N_TOK; i < N_LONG; i++)
                longer[i] = (int32_t)((i * 7919) % m->hp.n_vocab);
            test_redis_heals(m, rp.port, longer);
            test_far_redis(m, model_path, rp.port);
            redis_proc_stop(&rp, false);
        } else {
            CHECKF(absent, "redis-server did not start");
            printf("  redis cases skipped: redis-server is not installed\n");
        }
    }
    kvc_model_free(m);
    /* sliding-window models: a record per (block, memory group) */
    const char *const swa[] = { "tiny-gemma3", "tiny-gpt-oss" };
    for (size_t i = 0; i < KVC_ARRAY_LEN(swa); i++) {
        kvc_model *w = test_gen_model(tmpdir, swa[i], model_path, sizeof(model_path));
        if (w && i == 0) {
            test_window_records(w);
            test_window_chunks_down(w);
            test_tail_bytes(w);
        }
        if (w)
            test_engine_restart(w, model_path, swa[i]);
        kvc_model_free(w);
    }
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_done("test_tiers");
}
