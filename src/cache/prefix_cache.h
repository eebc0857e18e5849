/* prefix_cache.h - the prefix tree over full KV blocks (DESIGN.md §2).
 *
 * Every full block any sequence has computed can be entered here, keyed by its
 * content chained to its parent: a node stands for the token path
 * tokens[0, (depth + 1) * B) and names the pool block holding the K/V of its
 * last B positions. A node's identity is (parent, its B tokens); it is found
 * through a hash of (parent's hash, tokens) and then verified by comparing the
 * parent pointer and the tokens themselves: a hash alone is never trusted.
 * Because a node's K/V depend only on the path's tokens (the forward pass is
 * batch-invariant), any sequence whose tokens start with the path may use the
 * block: two conversations with the same system prompt store it once.
 *
 * References: the tree holds one pool reference on every node's block
 * (kvc_kv_block_ref); sequences that attach the block hold their own. A node
 * can be evicted only when nothing else references its block (its pool
 * reference count is 1), it has no children (leaves first), it is not pinned
 * and not pending. Eviction picks the least recently used such leaf; evicting
 * it can make its parent a leaf in turn.
 *
 * In-flight blocks: a sequence about to compute a prompt block enters it as
 * PENDING (its K/V not yet written). Lookup stops at a pending node and reports
 * it, so a second request for the same prefix waits and reuses the block
 * instead of computing it a second time. The owner marks it ready when its
 * K/V are written, or removes it (cancel, failure).
 *
 * Pins: kvc_pc_pin keeps a node (and so, as a non-leaf, every ancestor) from
 * eviction; one kvc_pc_unpin per pin. A sequence pins the deepest node of its
 * path that it extends.
 *
 * Not thread-safe: the thread that owns the pool owns the tree. */
#ifndef KVC_PREFIX_CACHE_H
#define KVC_PREFIX_CACHE_H

#include "kv.h"

typedef struct kvc_prefix_cache kvc_prefix_cache;
typedef struct kvc_pc_node kvc_pc_node;

/* Read-only outside prefix_cache.c. */
struct kvc_pc_node {
    kvc_pc_node *parent;      /* NULL for the root */
    kvc_pc_node *child;       /* first child */
    kvc_pc_node *next, *prev; /* siblings */
    kvc_pc_node *hnext;       /* hash bucket chain */
    uint64_t     hash;        /* XXH3 of tokens seeded with the parent's hash */
    uint64_t     last_used;   /* tick of the last lookup or insert that touched it */
    int32_t      block;       /* pool block of positions [depth * B, depth * B + B); root: -1 */
    int32_t      depth;       /* block index in the sequence; root: -1 */
    int32_t      n_children;
    int32_t      pins;
    uint64_t     mark;        /* scratch of kvc_pc_evictable */
    uint64_t     id;          /* serial number of the insert that made it (1, 2, ...) */
    bool         pending;     /* K/V still being computed by the node's owner */
    int32_t      tokens[];    /* B tokens (none for the root) */
};

/* A tree over `pool` (borrowed; it must outlive the tree). NOMEM only. */
int  kvc_pc_new(kvc_kv_pool *pool, kvc_prefix_cache **out, kvc_err *err);
/* Drop the tree's reference on every block and free the tree. NULL ok. */
void kvc_pc_free(kvc_prefix_cache *pc);

kvc_pc_node *kvc_pc_root(kvc_prefix_cache *pc);
int64_t  kvc_pc_n_nodes(const kvc_prefix_cache *pc);    /* without the root */
int64_t  kvc_pc_n_pending(const kvc_prefix_cache *pc);
uint64_t kvc_pc_n_evicted(const kvc_prefix_cache *pc);  /* nodes evicted so far */

/* The result of a lookup of tokens[0, n). */
typedef struct kvc_pc_match {
    kvc_pc_node *last;        /* deepest ready node of the path (root when none) */
    int32_t      n_full;      /* ready full blocks matched: tokens [0, n_full * B) */
    kvc_pc_node *partial;     /* a ready child of `last` sharing partial_len tokens, or NULL */
    int32_t      partial_len; /* in [1, B) when partial is set, else 0 */
    kvc_pc_node *pending;     /* the match stopped at this pending node (the next
                                 block of tokens is being computed), or NULL */
} kvc_pc_match;

/* The longest cached prefix of tokens[0, n): the run of ready full blocks,
 * then (unless it stopped at a pending node) the ready child of the last one
 * that shares the most tokens with the rest (a partial block, usable read-only
 * and copied on write). Marks the matched nodes used (LRU). */
void kvc_pc_lookup(kvc_prefix_cache *pc, const int32_t *tokens, int64_t n, kvc_pc_match *m);

/* The child of `parent` whose B tokens are `tokens`, or NULL. */
kvc_pc_node *kvc_pc_find(kvc_prefix_cache *pc, kvc_pc_node *parent, const int32_t *tokens);

/* Enter the block after `parent`'s path: `tokens` (B of them, copied) whose
 * K/V are (pending: will be) in `block`; the tree takes a reference on the
 * block. Returns 1 with *out the new node; 0 when a node with that content
 * exists already (*out is that node; nothing changed); KVC_ERR_NOMEM (tree
 * unchanged). `parent` must not be pending unless the caller owns it. */
int  kvc_pc_insert(kvc_prefix_cache *pc, kvc_pc_node *parent, const int32_t *tokens,
                   int32_t block, bool pending, kvc_pc_node **out, kvc_err *err);

/* A pending node's K/V are written: it can be matched and shared. */
void kvc_pc_set_ready(kvc_prefix_cache *pc, kvc_pc_node *node);

/* Remove a node that has no children and no pins (an abandoned pending
 * block), dropping the tree's reference on its block. */
void kvc_pc_remove(kvc_prefix_cache *pc, kvc_pc_node *node);

void kvc_pc_pin(kvc_pc_node *node);     /* NULL and the root are no-ops */
void kvc_pc_unpin(kvc_pc_node *node);

/* Evict least recently used evictable leaves (see above) until `n` blocks
 * have returned to the pool or none is left. Returns the number freed. */
int64_t kvc_pc_evict(kvc_prefix_cache *pc, int64_t n);

/* How many blocks kvc_pc_evict could free now (nodes whose whole subtree is
 * evictable). O(nodes). */
int64_t kvc_pc_evictable(kvc_prefix_cache *pc);

/* Check every invariant (tree links, child counts, hash chains and values,
 * depths, each node's block referenced, pending nodes without ready
 * children). KVC_OK, or KVC_ERR_FORMAT with what is wrong. For tests. */
int  kvc_pc_check(kvc_prefix_cache *pc, kvc_err *err);

/* Call fn on every node but the root, parents before children. */
void kvc_pc_foreach(kvc_prefix_cache *pc, void (*fn)(kvc_pc_node *node, void *user), void *user);

#endif
