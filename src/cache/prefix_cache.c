/* prefix_cache.c - the prefix tree: nodes in a hash table keyed by
 * (parent hash, tokens), child lists for partial matches and leaf tests, and
 * LRU eviction of leaves through a binary heap built on demand. */
#include "prefix_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define ROOT_HASH 0x6b76636861742e31ull   /* any constant: the seed of depth-0 hashes */

struct kvc_prefix_cache {
    kvc_kv_pool  *pool;           /* borrowed */
    int32_t       B;              /* tokens per block */
    kvc_pc_node  *root;
    kvc_pc_node **buckets;        /* n_buckets chains (hnext), a power of two */
    size_t        n_buckets;
    int64_t       n_nodes;        /* without the root */
    int64_t       n_pending;
    uint64_t      n_evicted;
    uint64_t      tick;           /* LRU clock */
    uint64_t      epoch;          /* kvc_pc_evictable marks */
    uint64_t      n_inserted;     /* nodes ever made: the next id */
};

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
    pc->root->hash = ROOT_HASH;
    pc->root->block = -1;
    pc->root->depth = -1;
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
                kvc_kv_block_unref(pc->pool, n->block);
                free(n);
            }
    free(pc->buckets);
    free(pc->root);
    free(pc);
}

kvc_pc_node *kvc_pc_root(kvc_prefix_cache *pc) { return pc->root; }
int64_t  kvc_pc_n_nodes(const kvc_prefix_cache *pc) { return pc->n_nodes; }
int64_t  kvc_pc_n_pending(const kvc_prefix_cache *pc) { return pc->n_pending; }
uint64_t kvc_pc_n_evicted(const kvc_prefix_cache *pc) { return pc->n_evicted; }

/* ---------------------------------------------------------- hash table */

static uint64_t hash_of(const kvc_prefix_cache *pc, uint64_t parent_hash, const int32_t *tokens)
{
    return XXH3_64bits_withSeed(tokens, (size_t)pc->B * sizeof(int32_t), parent_hash);
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

static kvc_pc_node *find_hashed(kvc_prefix_cache *pc, kvc_pc_node *parent, uint64_t h,
                                const int32_t *tokens)
{
    for (kvc_pc_node *n = pc->buckets[(size_t)h & (pc->n_buckets - 1)]; n; n = n->hnext)
        if (n->hash == h && n->parent == parent &&
            memcmp(n->tokens, tokens, (size_t)pc->B * sizeof(int32_t)) == 0)
            return n;
    return NULL;
}

kvc_pc_node *kvc_pc_find(kvc_prefix_cache *pc, kvc_pc_node *parent, const int32_t *tokens)
{
    return find_hashed(pc, parent, hash_of(pc, parent->hash, tokens), tokens);
}

/* -------------------------------------------------------------- lookup */

void kvc_pc_lookup(kvc_prefix_cache *pc, const int32_t *tokens, int64_t n, kvc_pc_match *m)
{
    const int64_t B = pc->B;
    uint64_t tick = ++pc->tick;
    memset(m, 0, sizeof(*m));
    kvc_pc_node *node = pc->root;
    int64_t i = 0;
    while ((i + 1) * B <= n) {
        kvc_pc_node *c = kvc_pc_find(pc, node, tokens + i * B);
        if (!c)
            break;
        if (c->pending) {
            m->pending = c;
            break;
        }
        c->last_used = tick;
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
        if (c->pending)
            continue;
        int64_t k = 0;
        while (k < rest && c->tokens[k] == want[k])
            k++;
        if (k > m->partial_len) {
            m->partial = c;
            m->partial_len = (int32_t)k;
        }
    }
    if (m->partial)
        m->partial->last_used = tick;
}

/* ---------------------------------------------------------- insert/remove */

int kvc_pc_insert(kvc_prefix_cache *pc, kvc_pc_node *parent, const int32_t *tokens,
                  int32_t block, bool pending, kvc_pc_node **out, kvc_err *err)
{
    uint64_t h = hash_of(pc, parent->hash, tokens);
    kvc_pc_node *n = find_hashed(pc, parent, h, tokens);
    if (n) {
        *out = n;
        return 0;
    }
    n = calloc(1, sizeof(*n) + (size_t)pc->B * sizeof(int32_t));
    if (!n)
        return kvc_fail(err, KVC_ERR_NOMEM, "prefix cache: out of memory");
    memcpy(n->tokens, tokens, (size_t)pc->B * sizeof(int32_t));
    n->parent = parent;
    n->hash = h;
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
    kvc_kv_block_ref(pc->pool, block);
    pc->n_nodes++;
    pc->n_pending += pending;
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
    }
}

void kvc_pc_remove(kvc_prefix_cache *pc, kvc_pc_node *n)
{
    kvc_pc_node *p = n->parent;
    if (n->prev)
        n->prev->next = n->next;
    else
        p->child = n->next;
    if (n->next)
        n->next->prev = n->prev;
    p->n_children--;
    hash_unlink(pc, n);
    kvc_kv_block_unref(pc->pool, n->block);
    pc->n_nodes--;
    pc->n_pending -= n->pending;
    free(n);
}

void kvc_pc_pin(kvc_pc_node *node)
{
    if (node && node->parent)
        node->pins++;
}

void kvc_pc_unpin(kvc_pc_node *node)
{
    if (node && node->parent)
        node->pins--;
}

/* ------------------------------------------------------------ eviction */

/* Evictable by itself: its children aside, nothing but the tree holds it. */
static bool self_evictable(const kvc_prefix_cache *pc, const kvc_pc_node *n)
{
    return !n->pending && n->pins == 0 && kvc_kv_block_refcount(pc->pool, n->block) == 1;
}

/* Heap order: least recently used first; deeper first among equals (leaves
 * before their parents), then by block id so the order is deterministic. */
static bool heap_less(const kvc_pc_node *a, const kvc_pc_node *b)
{
    if (a->last_used != b->last_used)
        return a->last_used < b->last_used;
    if (a->depth != b->depth)
        return a->depth > b->depth;
    return a->block < b->block;
}

static void heap_push(kvc_pc_node **h, size_t *n, kvc_pc_node *x)
{
    size_t i = (*n)++;
    while (i > 0 && heap_less(x, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = x;
}

static kvc_pc_node *heap_pop(kvc_pc_node **h, size_t *n)
{
    kvc_pc_node *top = h[0], *x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c]))
            c++;
        if (!heap_less(h[c], x))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0)
        h[i] = x;
    return top;
}

int64_t kvc_pc_evict(kvc_prefix_cache *pc, int64_t want)
{
    if (want <= 0 || pc->n_nodes == 0)
        return 0;
    kvc_pc_node **heap = malloc((size_t)pc->n_nodes * sizeof(kvc_pc_node *));
    if (!heap)
        return 0;
    size_t nh = 0;
    for (size_t b = 0; b < pc->n_buckets; b++)
        for (kvc_pc_node *n = pc->buckets[b]; n; n = n->hnext)
            if (n->n_children == 0 && self_evictable(pc, n))
                heap_push(heap, &nh, n);
    int64_t freed = 0;
    while (freed < want && nh > 0) {
        kvc_pc_node *n = heap_pop(heap, &nh), *p = n->parent;
        kvc_pc_remove(pc, n);
        pc->n_evicted++;
        freed++;
        if (p != pc->root && p->n_children == 0 && self_evictable(pc, p))
            heap_push(heap, &nh, p);
    }
    free(heap);
    return freed;
}

int64_t kvc_pc_evictable(kvc_prefix_cache *pc)
{
    /* a node is blocked when it, or any descendant, is not evictable by
     * itself: mark every such node's path up to the root */
    uint64_t ep = ++pc->epoch;
    int64_t blocked = 0;
    for (size_t b = 0; b < pc->n_buckets; b++)
        for (kvc_pc_node *n = pc->buckets[b]; n; n = n->hnext) {
            if (self_evictable(pc, n))
                continue;
            for (kvc_pc_node *a = n; a != pc->root && a->mark != ep; a = a->parent) {
                a->mark = ep;
                blocked++;
            }
        }
    return pc->n_nodes - blocked;
}

/* --------------------------------------------------------------- checks */

void kvc_pc_foreach(kvc_prefix_cache *pc, void (*fn)(kvc_pc_node *node, void *user), void *user)
{
    for (kvc_pc_node *n = pc->root->child; n; n = walk_next(n, pc->root))
        fn(n, user);
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
        if (n->hash != hash_of(pc, p->hash, n->tokens))
            return kvc_fail(err, KVC_ERR_FORMAT, "node of block %d: wrong hash", n->block);
        if (kvc_pc_find(pc, p, n->tokens) != n)
            return kvc_fail(err, KVC_ERR_FORMAT, "node of block %d: not found by its content",
                            n->block);
        if (n->block < 0 || n->block >= kvc_kv_n_blocks(pc->pool) ||
            kvc_kv_block_refcount(pc->pool, n->block) < 1)
            return kvc_fail(err, KVC_ERR_FORMAT, "node at depth %d: block %d not referenced",
                            n->depth, n->block);
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
    return KVC_OK;
}
