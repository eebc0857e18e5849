/* test_prefix_cache.c - the prefix tree and the turns that share it, against a
 * reference model (DESIGN.md §2).
 *
 *  1. Units: lookup of full and partial blocks, hash verified by content,
 *     pending nodes stop a lookup, LRU eviction takes leaves first and never
 *     a referenced or pinned block. Namespaces never match each other. The
 *     running evictable count and the LRU list through every kind of change
 *     (kvc_pc_check recounts both by brute force, after every step of the
 *     randomized run too), eviction order, and make_room that evicts nothing
 *     unless that makes room.
 *  2. A randomized model-based run: thousands of operations (new conversation,
 *     extend, edit, branch, regenerate, no-cache, cancel, evict, drop a
 *     session's hold) on several sessions of one small pool, their turns
 *     interleaved in shared batches. After every prepare and every step:
 *     every block's reference count equals the references the model counts
 *     (sequences' tables + tree nodes), free blocks are exactly those with
 *     none, running turns' promised blocks are free (the budget holds), and
 *     tree nodes only disappear by eviction. At rest: the tree holds exactly
 *     what was computed (every computed full block is in the tree unless
 *     evicted, nothing else is) and, periodically, every node's block equals
 *     bitwise the K/V of a cold run of its path. Sampled turns' replies
 *     (greedy and seeded) equal a cold run of the same tokens.
 *  3. Budget errors: a request larger than the whole pool fails with the sizes.
 * Tiny generated model (kvc_gen_preset "tiny"). */
#include <unistd.h>
#include <xxhash.h>

#include "chat_template.h"
#include "session.h"
#include "test.h"

static char tmpdir[256];
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static int rint_(int n) { return (int)(rnd() % (uint64_t)n); }
static bool chance(int percent) { return rint_(100) < percent; }

/* ============================================================ units */

static void test_units(kvc_model *m)
{
    kvc_context *c = test_new_context(m, 512, 64, 2, 16);
    if (!c)
        return;
    kvc_prefix_cache *pc = c->pc;
    kvc_kv_pool *pool = c->pool;
    kvc_err e = { 0 };
    int32_t toks[64];
    for (int i = 0; i < 64; i++)
        toks[i] = 100 + i;
    /* a chain of three blocks: 0-15, 16-31, 32-47 */
    kvc_pc_node *n[3], *parent = kvc_pc_root(pc);
    int32_t blk[3];
    for (int i = 0; i < 3; i++) {
        blk[i] = kvc_kv_block_alloc(pool);
        CHECK_EQ_INT(kvc_pc_insert(pc, 0, parent, toks + 16 * i, blk[i], false, &n[i], &e), 1);
        kvc_kv_block_unref(pool, blk[i]);          /* the tree's reference only */
        parent = n[i];
    }
    CHECK_EQ_INT(kvc_kv_block_refcount(pool, blk[0]), 1);
    kvc_pc_node *dup = NULL;
    CHECK_EQ_INT(kvc_pc_insert(pc, 0, kvc_pc_root(pc), toks, 7, false, &dup, &e), 0);
    CHECK(dup == n[0] && dup->block == blk[0]);
    kvc_pc_match mt;
    kvc_pc_lookup(pc, 0, toks, 64, &mt);
    CHECK(mt.n_full == 3 && mt.last == n[2] && mt.partial == NULL && mt.pending == NULL);
    kvc_pc_lookup(pc, 0, toks, 40, &mt);              /* 2 full + 8 of the third */
    CHECK(mt.n_full == 2 && mt.partial == n[2] && mt.partial_len == 8);
    int32_t other[48];
    memcpy(other, toks, sizeof(other));
    other[20] = 5;                                 /* differs inside block 1 */
    kvc_pc_lookup(pc, 0, other, 48, &mt);
    CHECK(mt.n_full == 1 && mt.partial == n[1] && mt.partial_len == 4);
    /* same hash seed, other tokens: content decides, never the hash alone */
    other[0] = 99;
    kvc_pc_lookup(pc, 0, other, 48, &mt);
    CHECK(mt.n_full == 0 && mt.partial == NULL);
    CHECK(kvc_pc_check(pc, &e) == KVC_OK);
    /* a pending fourth block stops the lookup */
    kvc_pc_node *p4;
    int32_t b4 = kvc_kv_block_alloc(pool);
    CHECK_EQ_INT(kvc_pc_insert(pc, 0, n[2], toks + 48, b4, true, &p4, &e), 1);
    kvc_pc_lookup(pc, 0, toks, 64, &mt);
    CHECK(mt.n_full == 3 && mt.pending == p4 && mt.partial == NULL);
    CHECK_EQ_INT(kvc_pc_evictable(pc), 0);         /* pending pins the whole path */
    kvc_pc_set_ready(pc, p4);
    kvc_pc_lookup(pc, 0, toks, 64, &mt);
    CHECK(mt.n_full == 4 && mt.pending == NULL);
    CHECK_EQ_INT(kvc_pc_evictable(pc), 0);         /* block 4 is ours too: a leaf in use */
    kvc_kv_block_unref(pool, b4);
    CHECK_EQ_INT(kvc_pc_evictable(pc), 4);
    /* pins and references keep nodes; eviction frees leaves first */
    kvc_pc_pin(n[1]);
    int64_t free0 = kvc_kv_n_free(pool);
    CHECK_EQ_INT(kvc_pc_evict(pc, 10), 2);         /* the 4th and 3rd blocks only */
    CHECK_EQ_INT(kvc_kv_n_free(pool), free0 + 2);
    CHECK_EQ_INT(kvc_pc_n_nodes(pc), 2);
    kvc_pc_unpin(n[1]);
    kvc_kv_block_ref(pool, blk[1]);                /* a sequence holds block 1 */
    CHECK_EQ_INT(kvc_pc_evict(pc, 10), 0);
    kvc_kv_block_unref(pool, blk[1]);
    /* LRU: of two leaves, the one used longer ago goes first */
    kvc_pc_node *x, *y;
    other[40] = 3;
    int32_t bx = kvc_kv_block_alloc(pool), by = kvc_kv_block_alloc(pool);
    CHECK_EQ_INT(kvc_pc_insert(pc, 0, n[1], toks + 32, bx, false, &x, &e), 1);
    CHECK_EQ_INT(kvc_pc_insert(pc, 0, n[1], other + 32, by, false, &y, &e), 1);
    kvc_kv_block_unref(pool, bx);
    kvc_kv_block_unref(pool, by);
    kvc_pc_lookup(pc, 0, toks, 48, &mt);              /* touches x */
    CHECK_EQ_INT(kvc_pc_evict(pc, 1), 1);
    CHECK(kvc_pc_find(pc, 0, n[1], toks + 32) == x);
    CHECK(kvc_pc_find(pc, 0, n[1], other + 32) == NULL);
    CHECK(kvc_pc_check(pc, &e) == KVC_OK);
    CHECK_EQ_INT(kvc_pc_evict(pc, 100), 3);
    CHECK_EQ_INT(kvc_kv_n_free(pool), kvc_kv_n_blocks(pool));
    CHECK_EQ_INT(kvc_pc_n_evicted(pc), 6);
    kvc_context_free(c);
}

/* Namespaces and identity: the same tokens in two namespaces are two nodes
 * that never match each other; the chain hash depends on the model id. */
static void test_namespaces(kvc_model *m)
{
    kvc_context *c = test_new_context(m, 512, 64, 1, 16);
    if (!c)
        return;
    kvc_prefix_cache *pc = c->pc;
    kvc_kv_pool *pool = c->pool;
    kvc_err e = { 0 };
    int32_t toks[32];
    for (int i = 0; i < 32; i++)
        toks[i] = 7 + i;
    uint64_t seed0 = kvc_pc_ns_seed(pc, 0);
    CHECK(kvc_pc_set_model(pc, 0x1234, &e) == KVC_OK);
    CHECK(kvc_pc_ns_seed(pc, 0) != seed0);
    CHECK(kvc_pc_ns_seed(pc, 0) != kvc_pc_ns_seed(pc, 1));
    kvc_pc_node *a, *b, *a2, *b2;
    int32_t ba = kvc_kv_block_alloc(pool), bb = kvc_kv_block_alloc(pool);
    int32_t ba2 = kvc_kv_block_alloc(pool), bb2 = kvc_kv_block_alloc(pool);
    CHECK_EQ_INT(kvc_pc_insert(pc, 0, kvc_pc_root(pc), toks, ba, false, &a, &e), 1);
    CHECK_EQ_INT(kvc_pc_insert(pc, 1, kvc_pc_root(pc), toks, bb, false, &b, &e), 1);
    CHECK(a != b && a->hash != b->hash && a->ns == 0 && b->ns == 1);
    CHECK_EQ_INT(kvc_pc_insert(pc, 0, a, toks + 16, ba2, false, &a2, &e), 1);
    CHECK_EQ_INT(kvc_pc_insert(pc, 1, b, toks + 16, bb2, false, &b2, &e), 1);
    CHECK(kvc_pc_set_model(pc, 0x5678, &e) == KVC_ERR_INVALID_ARG);  /* not empty */
    kvc_pc_match mt;
    kvc_pc_lookup(pc, 0, toks, 32, &mt);
    CHECK(mt.n_full == 2 && mt.last == a2);
    kvc_pc_lookup(pc, 1, toks, 32, &mt);
    CHECK(mt.n_full == 2 && mt.last == b2);
    kvc_pc_lookup(pc, 2, toks, 32, &mt);
    CHECK(mt.n_full == 0 && mt.partial == NULL && mt.last == kvc_pc_root(pc));
    kvc_pc_lookup(pc, 2, toks, 10, &mt);               /* no partial match across either */
    CHECK(mt.partial == NULL);
    kvc_pc_lookup(pc, 1, toks, 10, &mt);
    CHECK(mt.partial == b && mt.partial_len == 10);
    CHECK(kvc_pc_check(pc, &e) == KVC_OK);
    int32_t blocks[4] = { ba, bb, ba2, bb2 };
    for (int i = 0; i < 4; i++)
        kvc_kv_block_unref(pool, blocks[i]);
    CHECK_EQ_INT(kvc_pc_evictable(pc), 4);
    CHECK_EQ_INT(kvc_pc_evict(pc, 4), 4);
    CHECK(kvc_pc_check(pc, &e) == KVC_OK);
    kvc_context_free(c);
}

/* The running count and the LRU list through every kind of change, against
 * the brute-force recount of kvc_pc_check; the order of eviction (leaves up,
 * least recently used first); the evict hook; make_room evicts nothing when
 * that cannot make room. */
typedef struct evict_log {
    int32_t blocks[32];
    int     n;
} evict_log;

static void log_evict(void *user, const kvc_pc_node *n)
{
    evict_log *l = user;
    l->blocks[l->n++] = n->block;
}

static void test_lru(kvc_model *m)
{
    kvc_context *c = test_new_context(m, 512, 64, 1, 16);
    if (!c)
        return;
    kvc_prefix_cache *pc = c->pc;
    kvc_kv_pool *pool = c->pool;
    kvc_err e = { 0 };
    int32_t toks[64];
    for (int i = 0; i < 64; i++)
        toks[i] = 300 + i;
    /* two chains under a shared block: S -> A1 -> A2 and S -> B1 */
    kvc_pc_node *S, *A1, *A2, *B1;
    int32_t bs = kvc_kv_block_alloc(pool), ba1 = kvc_kv_block_alloc(pool);
    int32_t ba2 = kvc_kv_block_alloc(pool), bb1 = kvc_kv_block_alloc(pool);
    CHECK_EQ_INT(kvc_pc_insert(pc, 0, kvc_pc_root(pc), toks, bs, false, &S, &e), 1);
    CHECK_EQ_INT(kvc_pc_insert(pc, 0, S, toks + 16, ba1, false, &A1, &e), 1);
    CHECK_EQ_INT(kvc_pc_insert(pc, 0, A1, toks + 32, ba2, false, &A2, &e), 1);
    CHECK_EQ_INT(kvc_pc_insert(pc, 0, S, toks + 48, bb1, true, &B1, &e), 1);
    CHECK_EQ_INT(kvc_pc_evictable(pc), 0);
    CHECK(kvc_pc_check(pc, &e) == KVC_OK);
    kvc_kv_block_unref(pool, bs);
    kvc_kv_block_unref(pool, ba1);
    CHECK_EQ_INT(kvc_pc_evictable(pc), 0);                /* A2 and B1 still held below */
    kvc_kv_block_unref(pool, ba2);
    CHECK_EQ_INT(kvc_pc_evictable(pc), 2);                /* A1, A2; S waits for B1 */
    CHECK(kvc_pc_lru_next(pc, NULL) == A2 && kvc_pc_lru_next(pc, A2) == NULL);
    kvc_kv_block_unref(pool, bb1);
    CHECK_EQ_INT(kvc_pc_evictable(pc), 2);                /* B1 is pending */
    kvc_pc_set_ready(pc, B1);
    CHECK_EQ_INT(kvc_pc_evictable(pc), 4);
    CHECK(kvc_pc_lru_next(pc, NULL) == A2 && kvc_pc_lru_next(pc, A2) == B1);
    kvc_pc_pin(A1);                                       /* a pin blocks A1 and S */
    CHECK_EQ_INT(kvc_pc_evictable(pc), 2);
    CHECK(kvc_pc_check(pc, &e) == KVC_OK);
    kvc_pc_unpin(A1);
    CHECK_EQ_INT(kvc_pc_evictable(pc), 4);
    kvc_kv_block_ref(pool, bs);                           /* a sequence holds S */
    CHECK_EQ_INT(kvc_pc_evictable(pc), 3);
    kvc_kv_block_unref(pool, bs);
    /* a lookup of S, A1, A2 makes A2 the most recent: B1 goes first, then
     * the A chain from its leaf up, then S */
    kvc_pc_match mt;
    kvc_pc_lookup(pc, 0, toks, 48, &mt);
    CHECK(mt.last == A2 && kvc_pc_lru_next(pc, NULL) == B1);
    CHECK(kvc_pc_check(pc, &e) == KVC_OK);
    /* make_room: asking for more than free + evictable evicts nothing */
    int64_t free0 = kvc_kv_n_free(pool);
    CHECK(!kvc_context_make_room(c, free0 + 5));
    CHECK_EQ_INT(kvc_pc_n_nodes(pc), 4);
    evict_log log = { .n = 0 };
    kvc_pc_set_evict_hook(pc, log_evict, &log);
    CHECK(kvc_context_make_room(c, free0 + 3));
    CHECK_EQ_INT(log.n, 3);
    CHECK(log.blocks[0] == bb1 && log.blocks[1] == ba2 && log.blocks[2] == ba1);
    CHECK_EQ_INT(kvc_pc_evictable(pc), 1);
    CHECK(kvc_pc_lru_next(pc, NULL) == S);
    CHECK(kvc_pc_check(pc, &e) == KVC_OK);
    kvc_context_free(c);
}

/* ====================================================== reference model */

/* A map of 64-bit keys to values (open addressing; 0 is never a key); a set
 * when the values are not used. */
typedef struct map64 {
    uint64_t *k, *v;
    size_t    cap, n;
} map64;

static size_t map_slot(const map64 *s, uint64_t key)
{
    size_t i = key & (s->cap - 1);
    while (s->k[i] && s->k[i] != key)
        i = (i + 1) & (s->cap - 1);
    return i;
}

static bool set_has(const map64 *s, uint64_t key)
{
    return s->cap && s->k[map_slot(s, key)] == key;
}

static void map_put(map64 *s, uint64_t key, uint64_t val)
{
    if ((s->n + 1) * 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        map64 g = { calloc(cap, 8), calloc(cap, 8), cap, 0 };
        for (size_t i = 0; i < s->cap; i++)
            if (s->k[i])
                map_put(&g, s->k[i], s->v[i]);
        free(s->k);
        free(s->v);
        *s = g;
    }
    size_t i = map_slot(s, key);
    s->n += s->k[i] == 0;
    s->k[i] = key;
    s->v[i] = val;
}

static void set_add(map64 *s, uint64_t key) { map_put(s, key, 0); }

static void map_free(map64 *s)
{
    free(s->k);
    free(s->v);
    memset(s, 0, sizeof(*s));
}

/* What the model knows. */
typedef struct model_state {
    kvc_context *ctx;
    map64        computed;        /* paths of every full block computed (chained hash) */
    map64        evicted;         /* paths that left the tree by eviction */
    map64        tree_prev;       /* ready nodes in the tree at the last check: id -> path */
    uint64_t     evicted_prev;    /* kvc_pc_n_evicted then */
    int32_t     *expect;          /* [n_blocks] reference counts */
} model_state;

/* The chained key of each block path of tokens[0, n): calls add for each. */
static void add_paths(model_state *ms, const int32_t *tokens, int64_t n)
{
    const int64_t B = kvc_kv_block_tokens(ms->ctx->pool);
    uint64_t h = kvc_pc_ns_seed(ms->ctx->pc, KVC_NS_DEFAULT);
    for (int64_t d = 0; (d + 1) * B <= n; d++) {
        h = XXH3_64bits_withSeed(tokens + d * B, (size_t)B * sizeof(int32_t), h);
        set_add(&ms->computed, h | 1);
    }
}

typedef struct walk_ctx {
    model_state *ms;
    map64       *now;             /* ready nodes: id -> path */
    map64       *paths;           /* their paths */
    int          bad_ready;       /* ready nodes whose path was never computed */
    bool         check_computed;
    int          pins;
} walk_ctx;

static void count_node(kvc_pc_node *n, void *user)
{
    walk_ctx *w = user;
    w->ms->expect[n->block]++;
    w->pins += n->pins;
    if (n->pending)
        return;
    map_put(w->now, n->id, n->hash | 1);
    set_add(w->paths, n->hash | 1);
    if (w->check_computed && !set_has(&w->ms->computed, n->hash | 1))
        w->bad_ready++;
}

/* The invariants that hold after every prepare and step. `at_rest`: no turn
 * runs; then also the tree against what was computed. */
static void check_state(model_state *ms, bool at_rest, const char *where)
{
    kvc_context *c = ms->ctx;
    kvc_kv_pool *pool = c->pool;
    kvc_err e = { 0 };
    int rc = kvc_pc_check(c->pc, &e);
    CHECKF(rc == KVC_OK, "%s: tree: %s", where, e.msg);
    int64_t nb = kvc_kv_n_blocks(pool);
    memset(ms->expect, 0, (size_t)nb * sizeof(int32_t));
    for (int32_t s = 0; s < c->p.n_seq; s++)
        for (int32_t i = 0; i < c->seqs[s].n_blocks; i++)
            ms->expect[c->seqs[s].blocks[i]]++;
    map64 now = { 0 }, paths = { 0 };
    walk_ctx w = { ms, &now, &paths, 0, at_rest, 0 };
    kvc_pc_foreach(c->pc, count_node, &w);
    int64_t zero = 0, wrong = 0;
    for (int64_t b = 0; b < nb; b++) {
        zero += ms->expect[b] == 0;
        if (kvc_kv_block_refcount(pool, (int32_t)b) != ms->expect[b] && wrong++ < 3)
            CHECKF(0, "%s: block %lld: refcount %d, the model counts %d", where, (long long)b,
                   kvc_kv_block_refcount(pool, (int32_t)b), ms->expect[b]);
    }
    CHECKF(kvc_kv_n_free(pool) == zero, "%s: %lld free blocks, %lld unreferenced", where,
           (long long)kvc_kv_n_free(pool), (long long)zero);
    CHECKF(c->promised >= 0 && kvc_kv_n_free(pool) >= c->promised,
           "%s: %lld free blocks < %lld promised", where, (long long)kvc_kv_n_free(pool),
           (long long)c->promised);
    /* ready nodes leave the tree only by eviction, and eviction takes only
     * ready nodes seen at the last check (nothing enters in between) */
    uint64_t ev = kvc_pc_n_evicted(c->pc) - ms->evicted_prev;
    int64_t lost = 0;
    for (size_t i = 0; i < ms->tree_prev.cap; i++) {
        uint64_t id = ms->tree_prev.k[i];
        if (id && !set_has(&now, id)) {
            lost++;
            set_add(&ms->evicted, ms->tree_prev.v[i]);
        }
    }
    CHECKF((uint64_t)lost == ev, "%s: %lld nodes left the tree, %llu evicted", where,
           (long long)lost, (unsigned long long)ev);
    ms->evicted_prev += ev;
    if (at_rest) {
        CHECKF(w.bad_ready == 0, "%s: %d tree nodes were never computed", where, w.bad_ready);
        CHECKF(kvc_pc_n_pending(c->pc) == 0 && w.pins == 0 && c->promised == 0,
               "%s: at rest with %lld pending, %d pins, %lld promised", where,
               (long long)kvc_pc_n_pending(c->pc), w.pins, (long long)c->promised);
        int64_t missing = 0;
        for (size_t i = 0; i < ms->computed.cap; i++) {
            uint64_t k = ms->computed.k[i];
            missing += k && !set_has(&paths, k) && !set_has(&ms->evicted, k);
        }
        CHECKF(missing == 0, "%s: %lld computed blocks neither in the tree nor evicted", where,
               (long long)missing);
    }
    map_free(&ms->tree_prev);
    map_free(&paths);
    ms->tree_prev = now;
}

/* Every leaf's path computed cold: each node's block must equal, bitwise, the
 * cold sequence's block at its depth. */
typedef struct content_ctx {
    model_state *ms;
    kvc_context *cold;
    int64_t      nodes, bad;
} content_ctx;

static void check_leaf(kvc_pc_node *n, void *user)
{
    content_ctx *cc = user;
    if (n->n_children || n->pending)
        return;
    const int32_t B = kvc_kv_block_tokens(cc->ms->ctx->pool);
    int32_t len = (n->depth + 1) * B;
    int32_t *path = malloc((size_t)len * sizeof(int32_t));
    for (kvc_pc_node *a = n; a->parent; a = a->parent)
        memcpy(path + a->depth * B, a->tokens, (size_t)B * sizeof(int32_t));
    char err[512];
    kvc_context_seq_truncate(cc->cold, 0, 0);
    int rc = kvc_context_decode(cc->cold, 0, path, len, false, err, sizeof(err));
    CHECKF(rc == KVC_OK, "cold decode: %s", err);
    size_t bytes = kvc_kv_block_bytes(cc->ms->ctx->pool);
    for (kvc_pc_node *a = n; rc == KVC_OK && a->parent; a = a->parent) {
        const void *got = kvc_kv_k(cc->ms->ctx->pool, a->block, 0, 0);
        const void *want = kvc_kv_k(cc->cold->pool, cc->cold->seqs[0].blocks[a->depth], 0, 0);
        cc->nodes++;
        if (memcmp(got, want, bytes) != 0 && cc->bad++ < 3)
            CHECKF(0, "tree block at depth %d (pool block %d) differs from a cold run", a->depth,
                   a->block);
    }
    free(path);
}

/* ============================================================ the run */

static const char *const words[] = {
    "river", "stone", "garden", "lamp", "quiet", "market", "silver", "window", "bread", "north",
    "candle", "forest", "letter", "harbor", "violet", "engine", "paper", "summer", "clock", "salt",
};

static char *sentence(int n_words)
{
    char *s = malloc((size_t)n_words * 10 + 8), *p = s;
    for (int i = 0; i < n_words; i++)
        p += sprintf(p, "%s%s", i ? " " : "", words[rint_(KVC_ARRAY_LEN(words))]);
    strcpy(p, ".");
    return s;
}

#define MAX_MSGS 24
#define N_SESS   5

typedef struct conv {
    const char *role[MAX_MSGS];
    char       *content[MAX_MSGS];
    int         n;
} conv;

static void conv_clear(conv *c)
{
    while (c->n > 0)
        free(c->content[--c->n]);
}

static void conv_push(conv *c, const char *role, char *owned)
{
    c->role[c->n] = role;
    c->content[c->n++] = owned;
}

static void conv_copy(conv *dst, const conv *src)
{
    conv_clear(dst);
    for (int i = 0; i < src->n; i++)
        conv_push(dst, src->role[i], strdup(src->content[i]));
}

static char *system_prompts[3];

typedef struct sess {
    kvc_session    *s;
    conv            c;
    kvc_turn       *t;
    kvc_chat_params p;
    bool            active;
    int64_t         last_used;
} sess;

static sess S[N_SESS];
static int64_t tick;

typedef struct counts {
    int turns, ok, cancelled, wait_prefix, wait_memory, kv_full, nocache, fidelity, branches,
        evictions, drops, steps, multi, preempted;
} counts;

/* kvc_room_fn of the run: evict, then let idle sessions go (as the engine). */
static bool room(kvc_context *c, int64_t n_free, void *user)
{
    counts *k = user;
    while (!kvc_context_make_room(c, n_free)) {
        sess *lru = NULL;
        for (int i = 0; i < N_SESS; i++)
            if (!S[i].active && c->seqs[S[i].s->seq].n_blocks > 0 &&
                (!lru || S[i].last_used < lru->last_used))
                lru = &S[i];
        if (!lru)
            return false;
        kvc_session_drop_kv(lru->s);
        k->drops++;
    }
    return true;
}

/* A cold run of the same tokens must give the same reply tokens. */
static void check_fidelity(kvc_context *cold, const sess *x, int32_t n_prompt)
{
    const kvc_session *s = x->s;
    char err[512];
    kvc_context_seq_truncate(cold, 0, 0);
    int rc = kvc_context_decode(cold, 0, s->toks.v, n_prompt, false, err, sizeof(err));
    CHECKF(rc == KVC_OK, "cold: %s", err);
    kvc_sampler *smp = kvc_sampler_new(&x->p.sampling, cold->model->hp.n_vocab);
    for (int32_t i = 0; i < n_prompt; i++)
        kvc_sampler_accept(smp, s->toks.v[i]);
    for (int64_t i = n_prompt; rc == KVC_OK && i < s->toks.n; i++) {
        int32_t id = kvc_sampler_sample(smp, kvc_context_logits(cold, -1));
        if (id != s->toks.v[i]) {
            CHECKF(0, "reply token %lld: %d with the cache, %d cold", (long long)(i - n_prompt),
                   s->toks.v[i], id);
            break;
        }
        kvc_sampler_accept(smp, id);
        if (i + 1 < s->toks.n)
            rc = kvc_context_decode(cold, 0, &id, 1, false, err, sizeof(err));
    }
    kvc_sampler_free(smp);
}

/* Set up session i's conversation and turn for this round. */
static void start_turn(int i, counts *k)
{
    sess *x = &S[i];
    int op = rint_(100);
    if (x->c.n == 0 || op < 15) {                              /* a new conversation */
        conv_clear(&x->c);
        conv_push(&x->c, "system", strdup(system_prompts[rint_(3)]));
        conv_push(&x->c, "user", sentence(3 + rint_(20)));
        if (chance(30))
            kvc_session_reset(x->s);
    } else if (op < 55 && x->c.n + 2 < MAX_MSGS && x->c.role[x->c.n - 1][0] == 'a') {
        conv_push(&x->c, "user", sentence(2 + rint_(15)));     /* extend */
    } else if (op < 70) {                                      /* edit a message */
        int at = 1 + rint_(x->c.n - 1 > 0 ? x->c.n - 1 : 1);
        while (x->c.n > at + 1)
            free(x->c.content[--x->c.n]);
        if (at < x->c.n) {
            free(x->c.content[at]);
            x->c.content[at] = sentence(2 + rint_(10));
            x->c.role[at] = "user";
        }
    } else if (op < 85) {                                      /* branch another's */
        int j = rint_(N_SESS);
        if (j != i && !S[j].active && S[j].c.n > 0 && S[j].c.n + 1 < MAX_MSGS) {
            conv_copy(&x->c, &S[j].c);
            k->branches++;
        }
        if (x->c.role[x->c.n - 1][0] == 'a' || chance(50))
            conv_push(&x->c, "user", sentence(2 + rint_(8)));
    } else if (x->c.role[x->c.n - 1][0] == 'a') {              /* regenerate */
        free(x->c.content[--x->c.n]);
    } else {
        conv_push(&x->c, "assistant", sentence(3));
        conv_push(&x->c, "user", sentence(4));
    }
    if (x->c.n + 2 >= MAX_MSGS) {                              /* too long: start over */
        conv_clear(&x->c);
        conv_push(&x->c, "system", strdup(system_prompts[rint_(3)]));
        conv_push(&x->c, "user", sentence(5));
    }
    x->p = kvc_chat_default_params();
    x->p.max_tokens = chance(20) ? 40 + rint_(60) : 1 + rint_(12);   /* long ones grow */
    x->p.sampling.temperature = chance(70) ? 0.0f : 0.9f;
    x->p.sampling.seed = rnd();
    x->p.no_cache = chance(5);
    k->nocache += x->p.no_cache;
    kvc_chat_message msgs[MAX_MSGS];
    for (int m = 0; m < x->c.n; m++)
        msgs[m] = (kvc_chat_message){ x->c.role[m], x->c.content[m] };
    kvc_tokbuf toks = { 0 };
    kvc_err e = { 0 };
    int32_t dropped;
    CHECK(kvc_prompt_chat(x->s->ctx->model, x->s->tmpl, msgs, (size_t)x->c.n, &x->p,
                          x->s->ctx->p.n_ctx, &toks, &dropped, NULL, &e) == KVC_OK);
    int rc = kvc_turn_new(x->s, toks.v, toks.n, KVC_TURN_CHAT, &x->p, NULL, NULL, kvc_time_us(),
                          &x->t, &e);
    kvc_tokbuf_free(&toks);
    if (rc == KVC_ERR_CONTEXT_LENGTH) {                        /* grown past 512: start over */
        conv_clear(&x->c);
        return;
    }
    CHECKF(rc == KVC_OK, "turn: %s", e.msg);
    x->active = rc == KVC_OK;
    x->last_used = ++tick;
    k->turns++;
}

/* End session x's turn: the conversation takes the reply, the model the
 * blocks it computed, and sometimes a cold run checks the reply. */
static void end_turn(model_state *ms, kvc_context *cold, sess *x, counts *k)
{
    char *reply = NULL;
    kvc_chat_stats st;
    kvc_err e = { 0 };
    bool prepared = kvc_turn_phase(x->t) != KVC_TURN_NEW;
    int rc = kvc_turn_end(x->t, &reply, &st, &e);
    x->t = NULL;
    x->active = false;
    x->last_used = ++tick;
    CHECKF(rc == KVC_OK, "turn end: %s", e.msg);
    kvc_kv_seq *seq = &ms->ctx->seqs[x->s->seq];
    if (prepared && !x->p.no_cache)          /* a cold turn publishes nothing */
        add_paths(ms, x->s->toks.v, KVC_MIN(seq->n_tokens, x->s->toks.n));
    bool cancelled = st.finish_reason && strcmp(st.finish_reason, "cancelled") == 0;
    k->cancelled += cancelled;
    if (rc == KVC_OK && prepared && !cancelled) {
        k->ok++;
        CHECK_EQ_INT(st.computed_tokens, st.prompt_tokens - st.cached_tokens);
        if (x->p.no_cache)
            CHECK_EQ_INT(st.cached_tokens, 0);
        if (chance(12) || x->p.no_cache) {
            check_fidelity(cold, x, st.prompt_tokens);
            k->fidelity++;
        }
        if (x->c.n + 1 < MAX_MSGS)
            conv_push(&x->c, "assistant", strdup(reply ? reply : ""));
    }
    free(reply);
    if (x->p.no_cache)                       /* as the engine: a cold turn's session is reset */
        kvc_session_reset(x->s);
}

static void test_random(kvc_model *m, int rounds)
{
    kvc_context *ctx = test_new_context(m, 512, 48, N_SESS, 72);
    kvc_context *cold = test_new_context(m, 512, 512, 1, 40);
    if (!ctx || !cold)
        return;
    model_state ms = { .ctx = ctx };
    ms.expect = calloc((size_t)kvc_kv_n_blocks(ctx->pool), sizeof(int32_t));
    char err[512];
    for (int i = 0; i < N_SESS; i++) {
        S[i] = (sess){ 0 };
        S[i].s = kvc_session_new(ctx, i, NULL, err, sizeof(err));
    }
    counts k = { 0 };
    uint64_t content_nodes = 0;
    for (int round = 0; round < rounds; round++) {
        int n_act = 1 + rint_(N_SESS), order[N_SESS];
        for (int i = 0; i < N_SESS; i++)
            order[i] = i;
        for (int i = N_SESS - 1; i > 0; i--) {
            int j = rint_(i + 1), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (int i = 0; i < n_act; i++)
            start_turn(order[i], &k);
        k.multi += n_act > 1;
        for (;;) {
            kvc_turn *run[N_SESS];
            int n_run = 0, n_new = 0, n_mem = 0;
            for (int i = 0; i < N_SESS; i++) {
                sess *x = &S[order[i]];
                if (!x->active)
                    continue;
                if (chance(2))
                    kvc_turn_cancel(x->t);             /* waiting, in prefill or decoding */
                if (kvc_turn_phase(x->t) == KVC_TURN_NEW) {
                    kvc_err e = { 0 };
                    int rc = kvc_turn_prepare(x->t, room, &k, &e);
                    CHECKF(rc >= 0, "prepare: %s", e.msg);
                    k.wait_prefix += rc == KVC_TURN_WAIT_PREFIX;
                    k.wait_memory += rc == KVC_TURN_WAIT_MEMORY;
                    n_mem += rc == KVC_TURN_WAIT_MEMORY;
                    check_state(&ms, false, "prepare");
                }
                int ph = kvc_turn_phase(x->t);
                if (ph == KVC_TURN_NEW)
                    n_new++;
                else if (ph != KVC_TURN_DONE)
                    run[n_run++] = x->t;
            }
            if (n_run == 0 && n_new > 0) {
                /* nothing runs: a turn still waiting never fits (the engine
                 * fails it); one waiting for a prefix would wait forever */
                for (int i = 0; i < N_SESS; i++)
                    if (S[i].active && kvc_turn_phase(S[i].t) == KVC_TURN_NEW) {
                        CHECKF(n_mem > 0, "a turn waits for a prefix nobody computes");
                        k.kv_full++;
                        end_turn(&ms, cold, &S[i], &k);
                    }
            }
            if (chance(10)) {
                kvc_pc_evict(ctx->pc, 1 + rint_(6));
                k.evictions++;
            }
            if (n_run > 0) {                           /* as the engine: room to grow */
                int64_t held[N_SESS];                  /* what each has computed */
                for (int i = 0; i < n_run; i++)
                    held[i] = ctx->seqs[kvc_turn_session(run[i])->seq].n_tokens;
                int32_t kept = kvc_turns_grow(ctx, run, n_run, room, &k);
                for (int i = kept; i < n_run; i++) {   /* preempted: their blocks are the tree's */
                    int64_t nt = 0;
                    const int32_t *tv = kvc_turn_tokens(run[i], &nt);
                    bool cold = false;
                    for (int j = 0; j < N_SESS; j++)
                        cold |= S[j].t == run[i] && S[j].p.no_cache;
                    if (!cold)
                        add_paths(&ms, tv, KVC_MIN(nt, held[i]));
                }
                k.preempted += n_run - kept;
                n_run = kept;
                check_state(&ms, false, "grow");
            }
            if (n_run > 0) {
                kvc_err e = { 0 };
                int n = kvc_turns_step(ctx, run, n_run, 0, &e);
                CHECKF(n > 0, "step: %d %s", n, e.msg);
                k.steps++;
                check_state(&ms, false, "step");
            }
            bool any = false;
            for (int i = 0; i < N_SESS; i++) {
                sess *x = &S[order[i]];
                if (x->active && kvc_turn_phase(x->t) == KVC_TURN_DONE)
                    end_turn(&ms, cold, x, &k);
                any = any || x->active;
            }
            if (!any)
                break;
        }
        if (chance(8)) {                               /* an idle session lets go */
            sess *x = &S[rint_(N_SESS)];
            kvc_session_drop_kv(x->s);
            k.drops++;
        }
        check_state(&ms, true, "at rest");
        if (round % 40 == 39 || round == rounds - 1) {
            content_ctx cc = { &ms, cold, 0, 0 };
            kvc_pc_foreach(ctx->pc, check_leaf, &cc);
            CHECKF(cc.bad == 0, "%lld of %lld tree blocks differ from cold runs", (long long)cc.bad,
                   (long long)cc.nodes);
            content_nodes += (uint64_t)cc.nodes;
        }
    }
    printf("  %d rounds: %d turns (%d in rounds of several), %d steps; %d replied, %d cancelled, "
           "%d no-cache, %d branched\n"
           "  waits: %d for a prefix in the works, %d for memory (%d never fit); %d evictions "
           "asked, %d holds dropped, %llu blocks evicted; %d preemptions\n"
           "  %d replies checked against cold runs; %llu tree blocks checked bitwise\n",
           rounds, k.turns, k.multi, k.steps, k.ok, k.cancelled, k.nocache, k.branches,
           k.wait_prefix, k.wait_memory, k.kv_full, k.evictions, k.drops,
           (unsigned long long)kvc_pc_n_evicted(ctx->pc), k.preempted, k.fidelity,
           (unsigned long long)content_nodes);
    CHECKF(k.wait_prefix > 0 && k.wait_memory > 0 && k.cancelled > 0 && k.branches > 0 &&
           kvc_pc_n_evicted(ctx->pc) > 0, "a case was not exercised");
    for (int i = 0; i < N_SESS; i++) {
        conv_clear(&S[i].c);
        kvc_session_free(S[i].s);
    }
    free(ms.expect);
    map_free(&ms.computed);
    map_free(&ms.evicted);
    map_free(&ms.tree_prev);
    kvc_context_free(ctx);
    kvc_context_free(cold);
}

/* A request larger than the whole pool fails at once, with the sizes; one
 * that fits after eviction runs. */
static void test_budget(kvc_model *m)
{
    kvc_context *ctx = test_new_context(m, 512, 64, 1, 8);   /* 8 blocks: 112 usable tokens */
    char err[512], *reply = NULL;
    kvc_session *s = ctx ? kvc_session_new(ctx, 0, NULL, err, sizeof(err)) : NULL;
    if (!s)
        return;
    kvc_chat_message msg = { "user", "river stone garden lamp quiet market silver window" };
    kvc_chat_params p = kvc_chat_default_params();
    p.max_tokens = 100;
    kvc_chat_stats st;
    int rc = kvc_session_chat(s, &msg, 1, &p, NULL, NULL, &reply, &st, err, sizeof(err));
    CHECK_EQ_INT(rc, KVC_ERR_KV_FULL);
    CHECKF(strstr(err, "KV cache holds 112 tokens") && strstr(err, "100"), "message: %s", err);
    p.max_tokens = 20;
    for (int i = 0; i < 6; i++) {                      /* different prompts: the tree fills */
        char text[64];
        snprintf(text, sizeof(text), "%s number %d", msg.content, i);
        kvc_chat_message mi = { "user", text };
        rc = kvc_session_chat(s, &mi, 1, &p, NULL, NULL, &reply, &st, err, sizeof(err));
        CHECKF(rc == KVC_OK, "turn %d: %s", i, err);
        free(reply);
        kvc_session_reset(s);
    }
    CHECKF(kvc_pc_n_evicted(ctx->pc) > 0, "nothing was evicted");
    kvc_session_free(s);
    kvc_context_free(ctx);
}

int main(int argc, char **argv)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvc_test_prefix_XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    int rounds = argc > 1 ? atoi(argv[1]) : 1200;
    if (argc > 2)
        rng_state = strtoull(argv[2], NULL, 0);
    char model_path[512];
    kvc_model *m = test_gen_model(tmpdir, "tiny", model_path, sizeof(model_path));
    if (m) {
        rng_state ^= 0x5555;
        system_prompts[0] = sentence(40);
        system_prompts[1] = sentence(70);
        system_prompts[2] = strdup("You are a helpful assistant.");
        test_units(m);
        test_namespaces(m);
        test_lru(m);
        test_budget(m);
        test_random(m, rounds);
        for (int i = 0; i < 3; i++)
            free(system_prompts[i]);
    }
    kvc_model_free(m);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_done("test_prefix_cache");
}
