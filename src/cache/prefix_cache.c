/* prefix_cache.c - the prefix tree: nodes in a hash table keyed by
 * (parent hash, tokens), child lists for partial matches and leaf tests, a
 * running count of evictable nodes and the evictable leaves on an LRU list. */
#include "prefix_cache.h"
#include "kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define ROOT_MAGIC 0x6b76636861742e33ull  /* "kvchat.3": the version of the chain hash */

struct kvc_prefix_cache {
    kvc_kv_pool  *pool;           /* borrowed */
    int32_t       B;              /* tokens per block */
    kvc_pc_node  *root;
    kvc_pc_node **buckets;        /* n_buckets chains (hnext), a power of two */
    size_t        n_buckets;
    int64_t       n_nodes;        /* without the root */
    int64_t       n_pending;
    int64_t       n_blocked;      /* nodes that cannot be evicted (themselves or below) */
    uint64_t      n_evicted;
    uint64_t      tick;           /* LRU clock */
    uint64_t      n_inserted;     /* nodes ever made: the next id */
    uint64_t      model_id;       /* kvc_pc_set_model */
    kvc_pc_node  *lru_head;       /* evictable leaves, least recently used first */
    kvc_pc_node  *lru_tail;
    kvc_pc_evict_fn on_evict;     /* kvc_pc_set_evict_hook */
    void         *evict_user;
    kvc_pc_evict_fn on_drop;      /* kvc_pc_set_drop_hook */
    void         *drop_user;
    kvc_pc_chunk_fn on_chunk;     /* kvc_pc_set_chunk_evict_hook */
    void         *chunk_user;
};

static void on_refcount(void *user, void *tag, int32_t refcount);
static void root_hash_update(kvc_prefix_cache *pc);

/* ------------------------------------------------------------ lifetime */

int kvc_pc_new(kvc_kv_pool *pool, kvc_prefix_cache **out, kvc_err *err)
{
    *out = NULL;
    kvc_prefix_cache *pc = calloc(1, sizeof(*pc));
    if (!pc)
        return kvc_fail(err, KVC_ERR_NOMEM, "prefix cache: out of memory");
    pc->pool = pool;
    pc->B = kvc_kv_block_tokens(pool);
    pc->n_buckets = 1024;
    pc->buckets = calloc(pc->n_buckets, sizeof(kvc_pc_node *));
    pc->root = calloc(1, sizeof(kvc_pc_node));
    if (!pc->buckets || !pc->root) {
        kvc_pc_free(pc);
        return kvc_fail(err, KVC_ERR_NOMEM, "prefix cache: out of memory");
    }
    pc->root->block = -1;
    pc->root->depth = -1;
    pc->root->pc = pc;
    root_hash_update(pc);
    kvc_kv_set_watch(pool, on_refcount, pc);
    *out = pc;
    return KVC_OK;
}

/* The next node after n in a parents-first walk of the subtree of `top`. */
static kvc_pc_node *walk_next(kvc_pc_node *n, const kvc_pc_node *top)
{
    if (n->child)
        return n->child;
    while (n != top) {
        if (n->next)
            return n->next;
        n = n->parent;
    }
    return NULL;
}

void kvc_pc_free(kvc_prefix_cache *pc)
{
    if (!pc)
        return;
    if (pc->buckets)
        for (size_t b = 0; b < pc->n_buckets; b++)
            for (kvc_pc_node *n = pc->buckets[b], *nx; n; n = nx) {
                nx = n->hnext;
                kvc_kv_block_tag(pc->pool, n->block, NULL);
                kvc_kv_block_unref(pc->pool, n->block);
                free(n);
            }
    free(pc->buckets);
    free(pc->root);
    kvc_kv_set_watch(pc->pool, NULL, NULL);
    free(pc);
}

/* The hash of the pool's layout (kv.h): each group's chunk size and window,
 * each layer's group and the layer whose K/V it reads (a KV-shared layer's
 * is another's). Two layouts of one model store other records under a hash. */
static uint64_t layout_hash(const kvc_kv_pool *pool)
{
    uint64_t h = 0;
    for (int32_t g = 0; g < kvc_kv_n_groups(pool); g++) {
        const uint64_t gv[2] = { kvc_kv_group_chunk_bytes(pool, g), (uint64_t)kvc_kv_group_of(pool, g)->window };
        h = XXH3_64bits_withSeed(gv, sizeof(gv), h);
    }
    for (int32_t l = 0; l < kvc_kv_pool_params_of(pool)->n_layer; l++) {
        const int32_t lv[2] = { kvc_kv_layer_group(pool, l), kvc_kv_layer_kv_of(pool, l) };
        h = XXH3_64bits_withSeed(lv, sizeof(lv), h);
    }
    return h;
}

/* The root's hash: what every chain starts from, before the namespace. It
 * covers the pool's layout and the arithmetic too (kernels.h): blocks
 * another layout, ISA or build of the kernels computed hold other bits, and
 * are not found. */
static void root_hash_update(kvc_prefix_cache *pc)
{
    const kvc_kv_pool_params *pp = kvc_kv_pool_params_of(pc->pool);
    uint64_t id[9] = { ROOT_MAGIC, pc->model_id, pp->type, (uint64_t)pp->n_layer,
                       (uint64_t)pp->n_kv_head, (uint64_t)pp->head_dim,
                       (uint64_t)pp->block_tokens, kvc_kernels_arith_id(), layout_hash(pc->pool) };
    pc->root->hash = XXH3_64bits(id, sizeof(id));
}

int kvc_pc_set_model(kvc_prefix_cache *pc, uint64_t model_id, kvc_err *err)
{
    if (pc->n_nodes > 0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG,
                        "prefix cache: model identity set on a tree of %lld blocks",
                        (long long)pc->n_nodes);
    pc->model_id = model_id;
    root_hash_update(pc);
    return KVC_OK;
}

uint64_t kvc_pc_ns_seed(const kvc_prefix_cache *pc, uint64_t ns)
{
    return XXH3_64bits_withSeed(&ns, sizeof(ns), pc->root->hash);
}

kvc_pc_node *kvc_pc_root(kvc_prefix_cache *pc) { return pc->root; }
int64_t  kvc_pc_n_nodes(const kvc_prefix_cache *pc) { return pc->n_nodes; }
int64_t  kvc_pc_n_pending(const kvc_prefix_cache *pc) { return pc->n_pending; }
uint64_t kvc_pc_n_evicted(const kvc_prefix_cache *pc) { return pc->n_evicted; }

/* ---------------------------------------------------------- hash table */

uint64_t kvc_pc_chain_hash(const kvc_prefix_cache *pc, uint64_t parent_hash,
                           const int32_t *tokens)
{
    return XXH3_64bits_withSeed(tokens, (size_t)pc->B * sizeof(int32_t), parent_hash);
}

uint64_t kvc_pc_parent_hash(const kvc_prefix_cache *pc, const kvc_pc_node *node)
{
    return node->parent == pc->root ? kvc_pc_ns_seed(pc, node->ns) : node->parent->hash;
}

/* The chain hash of the block `tokens` after `parent` in namespace `ns`. */
static uint64_t hash_of(const kvc_prefix_cache *pc, uint64_t ns, const kvc_pc_node *parent,
                        const int32_t *tokens)
{
    uint64_t seed = parent == pc->root ? kvc_pc_ns_seed(pc, ns) : parent->hash;
    return kvc_pc_chain_hash(pc, seed, tokens);
}

static void hash_link(kvc_prefix_cache *pc, kvc_pc_node *n)
{
    size_t b = (size_t)n->hash & (pc->n_buckets - 1);
    n->hnext = pc->buckets[b];
    pc->buckets[b] = n;
}

static void hash_unlink(kvc_prefix_cache *pc, kvc_pc_node *n)
{
    kvc_pc_node **p = &pc->buckets[(size_t)n->hash & (pc->n_buckets - 1)];
    while (*p != n)
        p = &(*p)->hnext;
    *p = n->hnext;
}

/* Double the bucket array when the table is full; on allocation failure keep
 * the longer chains (still correct). */
static void hash_grow(kvc_prefix_cache *pc)
{
    if ((size_t)pc->n_nodes < pc->n_buckets)
        return;
    size_t old_n = pc->n_buckets;
    kvc_pc_node **old = pc->buckets, **nb = calloc(old_n * 2, sizeof(kvc_pc_node *));
    if (!nb)
        return;
    pc->buckets = nb;
    pc->n_buckets = old_n * 2;
    for (size_t b = 0; b < old_n; b++)
        for (kvc_pc_node *n = old[b], *nx; n; n = nx) {
            nx = n->hnext;
            hash_link(pc, n);
        }
    free(old);
}

static kvc_pc_node *find_hashed(kvc_prefix_cache *pc, uint64_t ns, kvc_pc_node *parent,
                                uint64_t h, const int32_t *tokens)
{
    for (kvc_pc_node *n = pc->buckets[(size_t)h & (pc->n_buckets - 1)]; n; n = n->hnext)
        if (n->hash == h && n->parent == parent && n->ns == ns &&
            memcmp(n->tokens, tokens, (size_t)pc->B * sizeof(int32_t)) == 0)
            return n;
    return NULL;
}

kvc_pc_node *kvc_pc_find(kvc_prefix_cache *pc, uint64_t ns, kvc_pc_node *parent,
                         const int32_t *tokens)
{
    KVC_ASSERT(parent == pc->root || parent->ns == ns);
    return find_hashed(pc, ns, parent, hash_of(pc, ns, parent, tokens), tokens);
}

/* ----------------------------------------------------- evictable state */

static void lru_unlink(kvc_prefix_cache *pc, kvc_pc_node *n)
{
    if (n->lru_prev)
        n->lru_prev->lru_next = n->lru_next;
    else
        pc->lru_head = n->lru_next;
    if (n->lru_next)
        n->lru_next->lru_prev = n->lru_prev;
    else
        pc->lru_tail = n->lru_prev;
    n->lru_next = n->lru_prev = NULL;
    n->on_lru = false;
}

static void lru_push_tail(kvc_prefix_cache *pc, kvc_pc_node *n)
{
    n->lru_next = NULL;
    n->lru_prev = pc->lru_tail;
    if (pc->lru_tail)
        pc->lru_tail->lru_next = n;
    else
        pc->lru_head = n;
    pc->lru_tail = n;
    n->on_lru = true;
}

static void lru_push_head(kvc_prefix_cache *pc, kvc_pc_node *n)
{
    n->lru_prev = NULL;
    n->lru_next = pc->lru_head;
    if (pc->lru_head)
        pc->lru_head->lru_prev = n;
    else
        pc->lru_tail = n;
    pc->lru_head = n;
    n->on_lru = true;
}

/* A use of n: the most recent end of the list if it is on it. */
/* A node no hit can end in: its block lost a window group's chunk. Such
 * leaves are evicted first (the least recent end of the list, and a use does
 * not move them). */
static bool dead(const kvc_prefix_cache *pc, const kvc_pc_node *n)
{
    return !kvc_kv_block_whole(pc->pool, n->block);
}

static void touch(kvc_prefix_cache *pc, kvc_pc_node *n, uint64_t tick)
{
    n->last_used = tick;
    if (n->on_lru && pc->lru_tail != n && !dead(pc, n)) {
        lru_unlink(pc, n);
        lru_push_tail(pc, n);
    }
}

/* Evictable by itself: its children aside, nothing but the tree holds it. */
static bool self_evictable(const kvc_prefix_cache *pc, const kvc_pc_node *n)
{
    return !n->pending && n->pins == 0 && kvc_kv_block_refcount(pc->pool, n->block) == 1;
}

/* How a node that becomes an evictable leaf enters the list. */
enum { ENTER_USED,     /* its last holder let go now: a use, the most recent end */
       ENTER_EXPOSED   /* its last child left: by its own last use (see the header) */ };

/* Something about n itself changed (its pins, pending state, pool count,
 * children): recompute whether it is blocked and on the list, and carry a
 * change of blocked up to the first ancestor whose state it does not change. */
static void refresh(kvc_prefix_cache *pc, kvc_pc_node *n, int how)
{
    if (n == pc->root)
        return;
    bool b = !self_evictable(pc, n) || n->n_blocked_kids > 0;
    bool leaf_now = !b && n->n_children == 0;
    if (leaf_now && !n->on_lru) {
        if (dead(pc, n)) {
            lru_push_head(pc, n);
        } else if (how == ENTER_USED) {
            n->last_used = ++pc->tick;
            lru_push_tail(pc, n);
        } else if (!pc->lru_head || n->last_used <= pc->lru_head->last_used) {
            lru_push_head(pc, n);
        } else {
            lru_push_tail(pc, n);
        }
    } else if (!leaf_now && n->on_lru) {
        lru_unlink(pc, n);
    }
    while (n != pc->root && b != n->blocked) {
        n->blocked = b;
        pc->n_blocked += b ? 1 : -1;
        kvc_pc_node *p = n->parent;
        p->n_blocked_kids += b ? 1 : -1;
        if (p == pc->root)
            break;
        /* p has a child, so p is not a leaf: only its blocked state moves */
        b = !self_evictable(pc, p) || p->n_blocked_kids > 0;
        n = p;
    }
}

static void on_refcount(void *user, void *tag, int32_t refcount)
{
    kvc_prefix_cache *pc = user;
    kvc_pc_node *n = tag;
    if (refcount > 0) {
        refresh(pc, n, ENTER_USED);
    } else if (refcount < 0) {                     /* about to lose its chunk of group -refcount */
        if (pc->on_chunk && !n->pending)
            pc->on_chunk(pc->chunk_user, n, -refcount);
    } else if (n->on_lru && pc->lru_head != n) {   /* lost a window chunk: first to go */
        lru_unlink(pc, n);
        lru_push_head(pc, n);
    }
}

int64_t kvc_pc_evictable(const kvc_prefix_cache *pc)
{
    return pc->n_nodes - pc->n_blocked;
}

const kvc_pc_node *kvc_pc_lru_next(const kvc_prefix_cache *pc, const kvc_pc_node *node)
{
    return node ? node->lru_next : pc->lru_head;
}

void kvc_pc_set_evict_hook(kvc_prefix_cache *pc, kvc_pc_evict_fn fn, void *user)
{
    pc->on_evict = fn;
    pc->evict_user = user;
}

void kvc_pc_set_drop_hook(kvc_prefix_cache *pc, kvc_pc_evict_fn fn, void *user)
{
    pc->on_drop = fn;
    pc->drop_user = user;
}

void kvc_pc_set_chunk_evict_hook(kvc_prefix_cache *pc, kvc_pc_chunk_fn fn, void *user)
{
    pc->on_chunk = fn;
    pc->chunk_user = user;
}

uint64_t kvc_pc_tick(kvc_prefix_cache *pc) { return ++pc->tick; }

/* -------------------------------------------------------------- lookup */

static void lookup(kvc_prefix_cache *pc, uint64_t ns, const int32_t *tokens, int64_t n,
                   kvc_pc_match *m);

/* Cut the match back to the longest length every memory group of the pool
 * can serve (kvc_kv_servable): a window group needs the chunks of the last w
 * positions before the hit point. Out of memory: no match. */
static void serve(kvc_prefix_cache *pc, kvc_pc_match *m)
{
    const int64_t B = pc->B, len = (int64_t)m->n_full * B + m->partial_len;
    if (kvc_kv_n_groups(pc->pool) == 1 || len == 0)
        return;
    const int32_t nb = m->n_full + (m->partial != NULL);
    int32_t *blocks = malloc((size_t)nb * sizeof(*blocks));
    int64_t L = 0;
    if (blocks) {
        for (kvc_pc_node *x = m->last; x != pc->root; x = x->parent)
            blocks[x->depth] = x->block;
        if (m->partial)
            blocks[m->n_full] = m->partial->block;
        L = kvc_kv_servable(pc->pool, blocks, len);
        free(blocks);
    }
    if (L == len)
        return;
    m->partial = NULL;     /* L < len is a block boundary */
    m->partial_len = 0;
    m->pending = NULL;     /* no longer the next block */
    while (m->n_full > L / B) {
        m->last = m->last->parent;
        m->n_full--;
    }
}

void kvc_pc_lookup(kvc_prefix_cache *pc, uint64_t ns, const int32_t *tokens, int64_t n,
                   kvc_pc_match *m)
{
    lookup(pc, ns, tokens, n, m);
    serve(pc, m);
}

static void lookup(kvc_prefix_cache *pc, uint64_t ns, const int32_t *tokens, int64_t n,
                   kvc_pc_match *m)
{
    const int64_t B = pc->B;
    uint64_t tick = ++pc->tick;
    memset(m, 0, sizeof(*m));
    kvc_pc_node *node = pc->root;
    int64_t i = 0;
    while ((i + 1) * B <= n) {
        kvc_pc_node *c = kvc_pc_find(pc, ns, node, tokens + i * B);
        if (!c)
            break;
        if (c->pending) {
            m->pending = c;
            break;
        }
        touch(pc, c, tick);
        node = c;
        i++;
    }
    m->last = node;
    m->n_full = (int32_t)i;
    if (m->pending || i * B >= n)
        return;
    int64_t rest = KVC_MIN(B, n - i * B);
    const int32_t *want = tokens + i * B;
    for (kvc_pc_node *c = node->child; c; c = c->next) {
        if (c->pending || c->ns != ns)
            continue;
        int64_t k = 0;
        while (k < rest && c->tokens[k] == want[k])
            k++;
        /* of equals, one with every window chunk: a hit can end in it */
        if (k > m->partial_len || (k > 0 && k == m->partial_len && dead(pc, m->partial) &&
                                   !dead(pc, c))) {
            m->partial = c;
            m->partial_len = (int32_t)k;
        }
    }
    if (m->partial)
        touch(pc, m->partial, tick);
}

/* ---------------------------------------------------------- insert/remove */

int kvc_pc_insert(kvc_prefix_cache *pc, uint64_t ns, kvc_pc_node *parent, const int32_t *tokens,
                  int32_t block, bool pending, kvc_pc_node **out, kvc_err *err)
{
    KVC_ASSERT(parent == pc->root || parent->ns == ns);
    uint64_t h = hash_of(pc, ns, parent, tokens);
    kvc_pc_node *n = find_hashed(pc, ns, parent, h, tokens);
    if (n) {
        *out = n;
        return 0;
    }
    n = calloc(1, sizeof(*n) + (size_t)pc->B * sizeof(int32_t));
    if (!n)
        return kvc_fail(err, KVC_ERR_NOMEM, "prefix cache: out of memory");
    KVC_ASSERT(!kvc_kv_block_tag_of(pc->pool, block));   /* a block is in the tree once */
    memcpy(n->tokens, tokens, (size_t)pc->B * sizeof(int32_t));
    n->parent = parent;
    n->pc = pc;
    n->hash = h;
    n->ns = ns;
    n->block = block;
    n->depth = parent->depth + 1;
    n->pending = pending;
    n->last_used = ++pc->tick;
    n->id = ++pc->n_inserted;
    n->next = parent->child;
    if (parent->child)
        parent->child->prev = n;
    parent->child = n;
    parent->n_children++;
    hash_link(pc, n);
    kvc_kv_block_ref(pc->pool, block);     /* before the tag: no callback for our own */
    kvc_kv_block_tag(pc->pool, block, n);
    pc->n_nodes++;
    pc->n_pending += pending;
    refresh(pc, parent, ENTER_EXPOSED);    /* no longer a leaf */
    refresh(pc, n, ENTER_USED);
    hash_grow(pc);
    *out = n;
    return 1;
}

void kvc_pc_set_ready(kvc_prefix_cache *pc, kvc_pc_node *node)
{
    if (node->pending) {
        node->pending = false;
        pc->n_pending--;
        node->last_used = ++pc->tick;
        refresh(pc, node, ENTER_USED);
    }
}

void kvc_pc_remove(kvc_prefix_cache *pc, kvc_pc_node *n)
{
    KVC_ASSERT(n->n_children == 0 && n->pins == 0);
    if (pc->on_drop)
        pc->on_drop(pc->drop_user, n);
    kvc_pc_node *p = n->parent;
    if (n->on_lru)
        lru_unlink(pc, n);
    if (n->blocked) {
        pc->n_blocked--;
        p->n_blocked_kids--;
    }
    if (n->prev)
        n->prev->next = n->next;
    else
        p->child = n->next;
    if (n->next)
        n->next->prev = n->prev;
    p->n_children--;
    hash_unlink(pc, n);
    kvc_kv_block_tag(pc->pool, n->block, NULL);
    kvc_kv_block_unref(pc->pool, n->block);
    pc->n_nodes--;
    pc->n_pending -= n->pending;
    free(n);
    refresh(pc, p, ENTER_EXPOSED);
}

void kvc_pc_pin(kvc_pc_node *node)
{
    if (node && node->parent && node->pins++ == 0)
        refresh(node->pc, node, ENTER_USED);
}

void kvc_pc_unpin(kvc_pc_node *node)
{
    if (!node || !node->parent)
        return;
    KVC_ASSERT(node->pins > 0);
    if (--node->pins == 0)
        refresh(node->pc, node, ENTER_USED);
}

/* ------------------------------------------------------------ eviction */

int64_t kvc_pc_evict(kvc_prefix_cache *pc, int64_t want)
{
    int64_t freed = 0;
    while (freed < want && pc->lru_head) {
        kvc_pc_node *n = pc->lru_head;
        if (pc->on_evict)
            pc->on_evict(pc->evict_user, n);
        kvc_pc_remove(pc, n);
        pc->n_evicted++;
        freed++;
    }
    return freed;
}

/* --------------------------------------------------------------- checks */

void kvc_pc_foreach(kvc_prefix_cache *pc, void (*fn)(kvc_pc_node *node, void *user), void *user)
{
    for (kvc_pc_node *n = pc->root->child; n; n = walk_next(n, pc->root))
        fn(n, user);
}

/* The blocked state of n's subtree recomputed from scratch (recursively:
 * tests only); the first node whose kept state disagrees goes to *bad. */
static bool recount_blocked(kvc_prefix_cache *pc, kvc_pc_node *n, int64_t *n_blocked,
                            int64_t *n_leaves, kvc_pc_node **bad)
{
    int32_t kids = 0;
    for (kvc_pc_node *c = n->child; c; c = c->next)
        kids += recount_blocked(pc, c, n_blocked, n_leaves, bad);
    bool b = n != pc->root && (!self_evictable(pc, n) || kids > 0);
    bool leaf = n != pc->root && !b && n->n_children == 0;
    if (!*bad && (kids != n->n_blocked_kids || (n != pc->root && b != n->blocked) ||
                  leaf != n->on_lru))
        *bad = n;
    *n_blocked += b;
    *n_leaves += leaf;
    return b;
}

/* The running count and the LRU list against a recount. */
static int check_evictable(kvc_prefix_cache *pc, kvc_err *err)
{
    int64_t blocked = 0, leaves = 0, listed = 0;
    kvc_pc_node *bad = NULL;
    recount_blocked(pc, pc->root, &blocked, &leaves, &bad);
    if (bad)
        return kvc_fail(err, KVC_ERR_FORMAT, "node of block %d at depth %d: kept evictable "
                        "state (blocked %d, %d blocked children, listed %d) is wrong",
                        bad->block, bad->depth, bad->blocked, bad->n_blocked_kids, bad->on_lru);
    if (blocked != pc->n_blocked)
        return kvc_fail(err, KVC_ERR_FORMAT, "%lld nodes blocked, %lld counted",
                        (long long)blocked, (long long)pc->n_blocked);
    for (kvc_pc_node *n = pc->lru_head, *prev = NULL; n; prev = n, n = n->lru_next) {
        if (n->lru_prev != prev || !n->on_lru || n->blocked || n->n_children ||
            (!n->lru_next && n != pc->lru_tail) || ++listed > pc->n_nodes)
            return kvc_fail(err, KVC_ERR_FORMAT, "LRU list broken at block %d", n->block);
    }
    if (listed != leaves)
        return kvc_fail(err, KVC_ERR_FORMAT, "%lld evictable leaves, %lld on the LRU list",
                        (long long)leaves, (long long)listed);
    return KVC_OK;
}

int kvc_pc_check(kvc_prefix_cache *pc, kvc_err *err)
{
    int64_t seen = 0, pending = 0;
    for (kvc_pc_node *n = pc->root->child; n; n = walk_next(n, pc->root)) {
        kvc_pc_node *p = n->parent;
        seen++;
        pending += n->pending;
        if (!p)
            return kvc_fail(err, KVC_ERR_FORMAT, "node of block %d has no parent", n->block);
        if (n->depth != p->depth + 1)
            return kvc_fail(err, KVC_ERR_FORMAT, "node of block %d: depth %d under depth %d",
                            n->block, n->depth, p->depth);
        if (p != pc->root && n->ns != p->ns)
            return kvc_fail(err, KVC_ERR_FORMAT, "node of block %d: namespace %llu under %llu",
                            n->block, (unsigned long long)n->ns, (unsigned long long)p->ns);
        if (n->hash != hash_of(pc, n->ns, p, n->tokens))
            return kvc_fail(err, KVC_ERR_FORMAT, "node of block %d: wrong hash", n->block);
        if (kvc_pc_find(pc, n->ns, p, n->tokens) != n)
            return kvc_fail(err, KVC_ERR_FORMAT, "node of block %d: not found by its content",
                            n->block);
        if (n->block < 0 || n->block >= kvc_kv_n_blocks(pc->pool) ||
            kvc_kv_block_refcount(pc->pool, n->block) < 1)
            return kvc_fail(err, KVC_ERR_FORMAT, "node at depth %d: block %d not referenced",
                            n->depth, n->block);
        if (kvc_kv_block_tag_of(pc->pool, n->block) != n)
            return kvc_fail(err, KVC_ERR_FORMAT, "node of block %d: the block is not tagged "
                            "with it", n->block);
        if (n->pins < 0)
            return kvc_fail(err, KVC_ERR_FORMAT, "node of block %d: %d pins", n->block, n->pins);
        if (p->pending && !n->pending)
            return kvc_fail(err, KVC_ERR_FORMAT, "ready node of block %d under a pending one",
                            n->block);
        int32_t count = 0;
        for (kvc_pc_node *c = n->child, *prev = NULL; c; prev = c, c = c->next) {
            count++;
            if (c->parent != n || c->prev != prev)
                return kvc_fail(err, KVC_ERR_FORMAT, "node of block %d: broken child list",
                                n->block);
        }
        if (count != n->n_children)
            return kvc_fail(err, KVC_ERR_FORMAT, "node of block %d: %d children, counted %d",
                            n->block, n->n_children, count);
    }
    int32_t roots = 0;
    for (kvc_pc_node *c = pc->root->child; c; c = c->next)
        roots++;
    if (roots != pc->root->n_children)
        return kvc_fail(err, KVC_ERR_FORMAT, "root: %d children, counted %d",
                        pc->root->n_children, roots);
    int64_t hashed = 0;
    for (size_t b = 0; b < pc->n_buckets; b++)
        for (kvc_pc_node *n = pc->buckets[b]; n; n = n->hnext)
            hashed++;
    if (seen != pc->n_nodes || hashed != pc->n_nodes || pending != pc->n_pending)
        return kvc_fail(err, KVC_ERR_FORMAT, "%lld nodes counted, %lld in the tree, %lld hashed; "
                        "%lld pending counted, %lld walked", (long long)pc->n_nodes,
                        (long long)seen, (long long)hashed, (long long)pc->n_pending,
                        (long long)pending);
    return check_evictable(pc, err);
}
