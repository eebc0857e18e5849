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
 * it can make its parent a leaf in turn (see "Eviction" below).
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
    kvc_pc_node *lru_next, *lru_prev; /* the list of evictable leaves, if on it */
    kvc_prefix_cache *pc;     /* the tree it belongs to */
    uint64_t     hash;        /* the chain hash: XXH3 of tokens seeded with the
                                 parent's hash (depth 0: the namespace's seed) */
    uint64_t     ns;          /* cache namespace (0 = default); the root: 0 */
    uint64_t     last_used;   /* tick of the last use: lookup, insert, release */
    int32_t      block;       /* pool block of positions [depth * B, depth * B + B); root: -1 */
    int32_t      depth;       /* block index in the sequence; root: -1 */
    int32_t      n_children;
    int32_t      pins;
    int32_t      n_blocked_kids; /* children whose subtree holds a non-evictable node */
    bool         blocked;     /* it or a descendant cannot be evicted */
    bool         on_lru;      /* an evictable leaf: on the LRU list */
    uint64_t     id;          /* serial number of the insert that made it (1, 2, ...) */
    bool         pending;     /* K/V still being computed by the node's owner */
    int32_t      tokens[];    /* B tokens (none for the root) */
};

/* A tree over `pool` (borrowed; it must outlive the tree; the tree becomes
 * its watcher, kvc_kv_set_watch). NOMEM only. */
int  kvc_pc_new(kvc_kv_pool *pool, kvc_prefix_cache **out, kvc_err *err);
/* Drop the tree's reference on every block and free the tree. NULL ok. */
void kvc_pc_free(kvc_prefix_cache *pc);

/* Namespaces and identity. Every chain hash starts from a seed that covers
 * the model (a fingerprint of its file, see block_store.h), the KV type and
 * shape of the pool, and the namespace: blocks of two namespaces, two models
 * or two KV types never match, in this tree or in any tier below that keys
 * blocks by node->hash. `model_id` is set once, before the first insert
 * (0 until then); KVC_ERR_INVALID_ARG when the tree is not empty. */
#define KVC_NS_DEFAULT 0
int      kvc_pc_set_model(kvc_prefix_cache *pc, uint64_t model_id, kvc_err *err);
uint64_t kvc_pc_ns_seed(const kvc_prefix_cache *pc, uint64_t ns); /* parent hash of depth 0 */
/* The chain hash of the block `tokens` (B of them) after a parent whose chain
 * hash is `parent_hash`: what a node made of them would have as its hash. */
uint64_t kvc_pc_chain_hash(const kvc_prefix_cache *pc, uint64_t parent_hash,
                           const int32_t *tokens);
/* The chain hash of node's parent (depth 0: its namespace's seed). */
uint64_t kvc_pc_parent_hash(const kvc_prefix_cache *pc, const kvc_pc_node *node);

/* The root: the parent of every depth-0 node of every namespace. */
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
 * and copied on write; of several, one whose block has every window chunk); cut back, when the pool has window groups, to the
 * longest length every group can serve (kvc_kv_servable: a block boundary,
 * no partial and no pending then). Marks the matched nodes used (LRU). */
void kvc_pc_lookup(kvc_prefix_cache *pc, uint64_t ns, const int32_t *tokens, int64_t n,
                   kvc_pc_match *m);

/* The child of `parent` in namespace `ns` whose B tokens are `tokens`, or
 * NULL. Below the root, `ns` must be the parent's. */
kvc_pc_node *kvc_pc_find(kvc_prefix_cache *pc, uint64_t ns, kvc_pc_node *parent,
                         const int32_t *tokens);

/* Enter the block after `parent`'s path in namespace `ns` (below the root,
 * the parent's): `tokens` (B of them, copied) whose
 * K/V are (pending: will be) in `block`; the tree takes a reference on the
 * block. Returns 1 with *out the new node; 0 when a node with that content
 * exists already (*out is that node; nothing changed); KVC_ERR_NOMEM (tree
 * unchanged). `parent` must not be pending unless the caller owns it. */
int  kvc_pc_insert(kvc_prefix_cache *pc, uint64_t ns, kvc_pc_node *parent,
                   const int32_t *tokens, int32_t block, bool pending, kvc_pc_node **out,
                   kvc_err *err);

/* A pending node's K/V are written: it can be matched and shared. */
void kvc_pc_set_ready(kvc_prefix_cache *pc, kvc_pc_node *node);

/* Remove a node that has no children and no pins (an abandoned pending
 * block), dropping the tree's reference on its block. */
void kvc_pc_remove(kvc_prefix_cache *pc, kvc_pc_node *node);

void kvc_pc_pin(kvc_pc_node *node);     /* NULL and the root are no-ops */
void kvc_pc_unpin(kvc_pc_node *node);

/* Eviction. The tree keeps, as things change (insert, remove, pin, unpin,
 * set_ready, and a block's pool count moving between 1 and 2), a running count
 * of evictable nodes (those whose whole subtree is evictable) and the
 * evictable leaves on an intrusive LRU list, least recently used first. A leaf
 * enters the list at the most recent end when it becomes evictable (its last
 * other holder let go: that was its last use) or is used again; a parent
 * whose last child was evicted enters at the least recent end when it was
 * used no later than that end (its subtree goes first, leaves up), else at
 * the most recent end. Everything is O(1) per block, but for the walk up to
 * the first ancestor already blocked when a node's own state changes. */

/* Evict least recently used evictable leaves until `n` blocks have returned
 * to the pool or none is left. Returns the number freed (each eviction frees
 * exactly one pool block). The evict hook, if set, sees each node first. */
int64_t kvc_pc_evict(kvc_prefix_cache *pc, int64_t n);

/* How many blocks kvc_pc_evict could free now. O(1). */
int64_t kvc_pc_evictable(const kvc_prefix_cache *pc);

/* Called with each node about to be evicted, its block still valid and
 * referenced (to write it down a tier). NULL fn = none. */
typedef void (*kvc_pc_evict_fn)(void *user, const kvc_pc_node *node);
void kvc_pc_set_evict_hook(kvc_prefix_cache *pc, kvc_pc_evict_fn fn, void *user);

/* Called with each node about to leave the tree (evicted or removed), for
 * what hangs off it (recurrent snapshots, snapshot.h). NULL fn = none. */
void kvc_pc_set_drop_hook(kvc_prefix_cache *pc, kvc_pc_evict_fn fn, void *user);

/* Called with a ready node whose block is about to lose its chunk of window
 * group g (evicted from RAM, kv.h), the chunk still readable
 * (kvc_kv_chunk_data): to write it down a tier. NULL fn = none. */
typedef void (*kvc_pc_chunk_fn)(void *user, const kvc_pc_node *node, int32_t g);
void kvc_pc_set_chunk_evict_hook(kvc_prefix_cache *pc, kvc_pc_chunk_fn fn, void *user);

/* Advance the tree's LRU clock and return it: a tick to compare with
 * nodes' last_used, for entries evicted together with the tree's leaves. */
uint64_t kvc_pc_tick(kvc_prefix_cache *pc);

/* The LRU list, least recently used first: kvc_pc_lru_next(pc, NULL) is the
 * first, NULL after the last. For tests and reports. */
const kvc_pc_node *kvc_pc_lru_next(const kvc_prefix_cache *pc, const kvc_pc_node *node);

/* Check every invariant (tree links, child counts, hash chains and values,
 * namespaces, depths, each node's block referenced and tagged, pending nodes
 * without ready children, the evictable count and the LRU list against a
 * brute-force recount). KVC_OK, or KVC_ERR_FORMAT with what is wrong. For tests. */
int  kvc_pc_check(kvc_prefix_cache *pc, kvc_err *err);

/* Call fn on every node but the root, parents before children. */
void kvc_pc_foreach(kvc_prefix_cache *pc, void (*fn)(kvc_pc_node *node, void *user), void *user);

#endif
