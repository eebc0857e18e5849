/* test_kv.c - the paged KV pool: reference counts, copy-on-write, truncation,
 * forks, the budget (allocation fails cleanly when full), and the watcher
 * told of a tagged block's 1 <-> 2 transitions. */
#include "kv.h"
#include "quant.h"
#include "test.h"

static kvc_kv_pool *new_pool(int64_t blocks, uint32_t type)
{
    kvc_kv_pool_params p = { 2, 2, 32, 4, type, blocks };
    kvc_kv_pool *pool = NULL;
    kvc_err e = { 0 };
    CHECKF(kvc_kv_pool_new(&p, &pool, &e) == KVC_OK, "%s", e.msg);
    return pool;
}

static void test_alloc_and_refs(void)
{
    kvc_kv_pool *pool = new_pool(3, KVC_TYPE_F16);
    CHECK_EQ_INT(kvc_kv_n_free(pool), 3);
    CHECK_EQ_INT(kvc_kv_block_bytes(pool), 2 * 2 * 2 * 4 * 32 * 2);
    int32_t a = kvc_kv_block_alloc(pool), b = kvc_kv_block_alloc(pool), c = kvc_kv_block_alloc(pool);
    CHECK(a >= 0 && b >= 0 && c >= 0 && a != b && b != c && a != c);
    CHECK_EQ_INT(kvc_kv_block_alloc(pool), -1);
    kvc_kv_block_ref(pool, b);
    CHECK_EQ_INT(kvc_kv_block_refcount(pool, b), 2);
    kvc_kv_block_unref(pool, b);
    CHECK_EQ_INT(kvc_kv_n_free(pool), 0);
    kvc_kv_block_unref(pool, b);
    CHECK_EQ_INT(kvc_kv_n_free(pool), 1);
    CHECK_EQ_INT(kvc_kv_block_alloc(pool), b);
    /* K and V of every (layer, head) are distinct, inside the block */
    uint8_t *k00 = kvc_kv_k(pool, a, 0, 0), *v11 = kvc_kv_v(pool, a, 1, 1);
    CHECK(v11 > k00 && (size_t)(v11 - k00) < kvc_kv_block_bytes(pool));
    CHECK(kvc_kv_k(pool, a, 0, 1) != kvc_kv_v(pool, a, 0, 0));
    kvc_kv_pool_free(pool);
}

typedef struct watch_log {
    int   calls;
    void *tag;
    int   last;
} watch_log;

static void on_watch(void *user, void *tag, int32_t refcount)
{
    watch_log *w = user;
    w->calls++;
    w->tag = tag;
    w->last = refcount;
}

static void test_watch(void)
{
    kvc_kv_pool *pool = new_pool(4, KVC_TYPE_F16);
    watch_log w = { 0 };
    int tag_obj;
    kvc_kv_set_watch(pool, on_watch, &w);
    int32_t a = kvc_kv_block_alloc(pool), b = kvc_kv_block_alloc(pool);
    kvc_kv_block_tag(pool, a, &tag_obj);
    CHECK(kvc_kv_block_tag_of(pool, a) == &tag_obj && kvc_kv_block_tag_of(pool, b) == NULL);
    kvc_kv_block_ref(pool, b);                 /* untagged: silent */
    kvc_kv_block_unref(pool, b);
    CHECK_EQ_INT(w.calls, 0);
    kvc_kv_block_ref(pool, a);                 /* 1 -> 2 */
    CHECK(w.calls == 1 && w.last == 2 && w.tag == &tag_obj);
    kvc_kv_block_ref(pool, a);                 /* 2 -> 3: not a transition it watches */
    kvc_kv_block_unref(pool, a);
    CHECK_EQ_INT(w.calls, 1);
    kvc_kv_block_unref(pool, a);               /* 2 -> 1 */
    CHECK(w.calls == 2 && w.last == 1);
    kvc_kv_block_tag(pool, a, NULL);
    kvc_kv_block_unref(pool, a);               /* untagged before its last reference */
    CHECK_EQ_INT(w.calls, 2);
    CHECK_EQ_INT(kvc_kv_n_free(pool), 3);
    kvc_kv_block_unref(pool, b);
    kvc_kv_pool_free(pool);
}

static void test_seq_reserve_truncate(void)
{
    kvc_kv_pool *pool = new_pool(4, KVC_TYPE_F32);
    kvc_kv_seq s;
    kvc_kv_seq_init(&s);
    kvc_err e = { 0 };
    CHECK(kvc_kv_seq_reserve(pool, &s, 10, &e) == KVC_OK);   /* 3 blocks of 4 */
    CHECK_EQ_INT(s.n_blocks, 3);
    CHECK_EQ_INT(kvc_kv_n_free(pool), 1);
    s.n_tokens = 10;
    CHECK(kvc_kv_seq_reserve(pool, &s, 17, &e) == KVC_ERR_KV_FULL);  /* needs 2 more */
    CHECK(strstr(e.msg, "KV cache full") != NULL);
    CHECK_EQ_INT(s.n_blocks, 3);             /* unchanged */
    kvc_kv_seq_truncate(pool, &s, 5);
    CHECK_EQ_INT(s.n_blocks, 2);
    CHECK_EQ_INT(s.n_tokens, 5);
    CHECK_EQ_INT(kvc_kv_n_free(pool), 2);
    kvc_kv_seq_truncate(pool, &s, 8);        /* longer: nothing happens */
    CHECK_EQ_INT(s.n_tokens, 5);
    kvc_kv_seq_release(pool, &s);
    CHECK_EQ_INT(kvc_kv_n_free(pool), 4);
    CHECK(s.blocks == NULL && s.n_tokens == 0);
    kvc_kv_pool_free(pool);
}

static void test_fork_and_cow(void)
{
    kvc_kv_pool *pool = new_pool(8, KVC_TYPE_F32);
    kvc_err e = { 0 };
    kvc_kv_seq a, b;
    kvc_kv_seq_init(&a);
    kvc_kv_seq_init(&b);
    CHECK(kvc_kv_seq_reserve(pool, &a, 6, &e) == KVC_OK);
    a.n_tokens = 6;
    float *row = (float *)kvc_kv_k(pool, a.blocks[1], 0, 0) + 32;   /* position 5 */
    row[0] = 42.0f;
    CHECK(kvc_kv_seq_fork(pool, &a, &b, 6, &e) == KVC_OK);
    CHECK_EQ_INT(b.n_tokens, 6);
    CHECK_EQ_INT(kvc_kv_block_refcount(pool, a.blocks[0]), 2);
    CHECK_EQ_INT(kvc_kv_block_refcount(pool, a.blocks[1]), 2);
    /* b writes position 6: its partial block is copied first */
    int32_t shared = b.blocks[1];
    CHECK(kvc_kv_seq_reserve(pool, &b, 7, &e) == KVC_OK);
    CHECK(b.blocks[1] != shared);
    CHECK(b.blocks[0] == a.blocks[0]);
    CHECK_EQ_INT(kvc_kv_block_refcount(pool, shared), 1);
    float *copy = (float *)kvc_kv_k(pool, b.blocks[1], 0, 0) + 32;
    CHECK(copy[0] == 42.0f);
    /* appending whole blocks needs a block boundary */
    int32_t extra = kvc_kv_block_alloc(pool);
    CHECK(kvc_kv_seq_append_blocks(pool, &a, &extra, 1, &e) == KVC_ERR_INVALID_ARG);
    kvc_kv_seq c;
    kvc_kv_seq_init(&c);
    CHECK(kvc_kv_seq_append_blocks(pool, &c, &extra, 1, &e) == KVC_OK);
    CHECK_EQ_INT(c.n_tokens, 4);
    CHECK_EQ_INT(kvc_kv_block_refcount(pool, extra), 2);
    kvc_kv_block_unref(pool, extra);
    kvc_kv_seq_release(pool, &a);
    kvc_kv_seq_release(pool, &b);
    kvc_kv_seq_release(pool, &c);
    CHECK_EQ_INT(kvc_kv_n_free(pool), 8);
    kvc_kv_pool_free(pool);
}

static void test_bad_params(void)
{
    kvc_kv_pool *pool = NULL;
    kvc_err e = { 0 };
    kvc_kv_pool_params p = { 2, 2, 48, 16, KVC_TYPE_Q8_0, 4 };
    CHECK(kvc_kv_pool_new(&p, &pool, &e) == KVC_ERR_INVALID_ARG);   /* 48 % 32 != 0 */
    CHECK(strstr(e.msg, "head dim 48") != NULL);
    p.head_dim = 64;
    p.type = KVC_TYPE_Q4_K;
    CHECK(kvc_kv_pool_new(&p, &pool, &e) == KVC_ERR_INVALID_ARG);
    p.type = KVC_TYPE_Q8_0;
    p.n_blocks = 0;
    CHECK(kvc_kv_pool_new(&p, &pool, &e) == KVC_ERR_INVALID_ARG);
    p.n_blocks = 4;
    CHECK(kvc_kv_pool_new(&p, &pool, &e) == KVC_OK);
    kvc_kv_pool_free(pool);
    kvc_kv_pool_free(NULL);
}

/* Recurrent layers: no K/V in the block, a state per sequence that starts
 * at zero, is copied whole by a fork of the whole sequence, and is zeroed by
 * any cut (no snapshots yet: a cut keeps nothing, no cached path serves). */
static void test_recurrent_states(void)
{
    kvc_kv_group full = { KVC_KV_FULL, 0, 0 };
    kvc_kv_layer layers[3] = { { 0, 0, 0, 10 }, { 0, 0, 0, 0 }, { 0, 0, 0, 6 } };
    kvc_kv_pool_params p = { 3, 2, 32, 4, KVC_TYPE_F16, 8, 1, &full, layers };
    kvc_kv_pool *pool = NULL;
    kvc_err e = { 0 };
    CHECKF(kvc_kv_pool_new(&p, &pool, &e) == KVC_OK, "%s", e.msg);
    if (!pool)
        return;
    CHECK_EQ_INT(kvc_kv_block_bytes(pool), 2 * 4 * 32 * 2 * 2);   /* layer 1's K/V only */
    CHECK_EQ_INT(kvc_kv_state_floats(pool), 16);
    CHECK_EQ_INT(kvc_kv_layer_state_floats(pool, 2), 6);
    kvc_kv_seq a, b;
    kvc_kv_seq_init(&a);
    kvc_kv_seq_init(&b);
    CHECK(kvc_kv_seq_state(pool, &a, 1) == NULL);
    float *s0 = kvc_kv_seq_state(pool, &a, 0), *s2 = kvc_kv_seq_state(pool, &a, 2);
    CHECK(s0 && s2 && s2 == s0 + 10 && s0[9] == 0.0f && s2[5] == 0.0f);
    CHECK(kvc_kv_seq_reserve(pool, &a, 6, &e) == KVC_OK);
    a.n_tokens = 6;
    s2[5] = 3.0f;
    CHECK_EQ_INT(kvc_kv_servable(pool, a.blocks, 4), 0);
    CHECK(kvc_kv_seq_fork(pool, &a, &b, 6, &e) == KVC_OK);
    CHECK_EQ_INT(b.n_tokens, 6);
    CHECK(kvc_kv_seq_state(pool, &b, 2)[5] == 3.0f);
    kvc_kv_seq_release(pool, &b);
    kvc_kv_seq_init(&b);
    CHECK(kvc_kv_seq_fork(pool, &a, &b, 5, &e) == KVC_OK);
    CHECK_EQ_INT(b.n_tokens, 0);
    CHECK(kvc_kv_seq_append_blocks(pool, &b, a.blocks, 1, &e) == KVC_ERR_INVALID_ARG);
    CHECK_EQ_INT(kvc_kv_seq_truncate(pool, &a, 6), 6);
    CHECK(s2[5] == 3.0f);
    CHECK_EQ_INT(kvc_kv_seq_truncate(pool, &a, 5), 0);
    CHECK(a.state == NULL);                      /* an empty sequence holds no state memory */
    CHECK(kvc_kv_seq_state(pool, &a, 2)[5] == 0.0f);
    kvc_kv_seq_release(pool, &a);
    kvc_kv_seq_release(pool, &b);
    CHECK_EQ_INT(kvc_kv_n_free(pool), 8);
    kvc_kv_pool_free(pool);
}

int main(void)
{
    test_recurrent_states();
    test_alloc_and_refs();
    test_watch();
    test_seq_reserve_truncate();
    test_fork_and_cow();
    test_bad_params();
    return test_done("test_kv");
}
