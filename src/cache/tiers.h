/* tiers.h - the prefix tree continued into a block store (DESIGN.md §5).
 *
 * A kvc_tiers joins a tree (and its pool) to a store below RAM:
 *   - lookup continues from RAM into the store: after kvc_pc_lookup, the
 *     following full blocks of the tokens that the store holds are read into
 *     free pool blocks and entered in the tree as ready nodes (never
 *     recomputed); probe first to know how many blocks to make room for;
 *   - blocks are written down when the tree evicts them (the evict hook), and
 *     a finished turn's path is written through (kvc_tiers_write_path);
 *   - writes run on a writer thread, off the engine's path: the engine copies
 *     a block's K/V into a queue slot (a memcpy) and goes on. queue_blocks
 *     slots are kept; more are made while the writer is behind (a turn of
 *     thousands of tokens written through at once), up to 1 GiB of copies.
 *     Past that a write-through is dropped (counted) and an evicted block is
 *     written at once (it would be lost otherwise). Records of other sizes
 *     (recurrent snapshots) go down the same queue (kvc_tiers_queue_record),
 *     up to 1 GiB of them.
 *
 * The chain hashes are the tree's (kvc_pc_node.hash), so the model, KV type,
 * namespace, parent and tokens all name a stored block. The engine thread
 * calls every function; the writer thread only touches the queue and the
 * store, under their locks. */
#ifndef KVC_TIERS_H
#define KVC_TIERS_H

#include "block_store.h"
#include "prefix_cache.h"

typedef struct kvc_tiers kvc_tiers;

typedef struct kvc_tiers_stats {
    uint64_t blocks_fetched;       /* read from the store into the pool */
    uint64_t blocks_written;       /* by the writer thread or at once (records: a pool with
                                      window groups writes one per chunk a block has) */
    uint64_t blocks_queued;        /* copies handed to the writer */
    uint64_t writes_dropped;       /* write-throughs dropped: the queue was full */
    uint64_t evictions_written;    /* evicted blocks sent down */
    uint64_t chunks_written;       /* evicted window chunks sent down (kv.h) */
    uint64_t chunks_fetched;       /* and read back into a block in RAM (kvc_tiers_fetch_windows) */
    uint64_t fetch_failures;       /* blocks the store listed but could not give */
    uint64_t write_failures;       /* puts that failed (the medium) */
    uint64_t tails_written;        /* sequences' tails sent down (kvc_tiers_write_tail) */
    uint64_t tails_fetched;        /* and read back into the pool */
    /* window chunks (kv.h), each a record of its own: */
    uint64_t window_chunks_written;/* written to the store (any reason: the chunk or its block
                                      evicted, write-through, a tail) */
    uint64_t window_bytes_written;
    uint64_t window_chunks_fetched;/* read back into RAM: with their block (kvc_tiers_fetch,
                                      a tail), or into a block in RAM (kvc_tiers_fetch_windows) */
    uint64_t window_bytes_read;
    uint64_t window_chunks_missed; /* needed and not given: a record read that failed (missing,
                                      corrupt), and the chunks the deepest hit of a
                                      kvc_tiers_fetch_windows lacked everywhere (counted per
                                      call): their window is computed again */
    int32_t  writes_pending;       /* blocks queued or being written, now */
} kvc_tiers_stats;

/* Join `pc` (over `pool`) to `store`; all three borrowed, and must outlive
 * the tiers. Sets the tree's evict hook. `queue_blocks`: write queue slots
 * kept (0 = 32), allocated up front. Starts the writer thread. KVC_ERR_NOMEM. */
int  kvc_tiers_new(kvc_prefix_cache *pc, kvc_kv_pool *pool, kvc_block_store *store,
                   int32_t queue_blocks, kvc_tiers **out, kvc_err *err);
/* Write what is queued, stop the writer, unhook the tree. NULL ok. */
void kvc_tiers_free(kvc_tiers *t);

/* How many full blocks of tokens[0, n) after the match `m` (a lookup in
 * namespace `ns` that did not stop at a pending node) the store holds in a
 * row: the blocks kvc_tiers_fetch would read, so the caller can make room for
 * them first. Reads nothing. */
int64_t kvc_tiers_probe(kvc_tiers *t, uint64_t ns, const int32_t *tokens, int64_t n,
                        const kvc_pc_match *m);

/* Read up to `max` of those blocks into free pool blocks and enter them in
 * the tree after m->last, as ready nodes that only the tree references;
 * m->last and m->n_full move to the end of the run (m->partial is cleared when
 * the run is not empty). Stops at the first block the store does not give
 * (missing, or corrupt: discarded by the store) or when no pool block is
 * free. Returns the number of blocks entered. */
int64_t kvc_tiers_fetch(kvc_tiers *t, uint64_t ns, const int32_t *tokens, int64_t n,
                        kvc_pc_match *m, int64_t max);

/* Window chunks (kv.h). The pool evicts a window group's chunk that no
 * sequence holds when the group runs short; the tiers write its record
 * first (the tree's chunk evict hook), as they write an evicted block. A
 * block still in RAM without that chunk cuts a match short
 * (kvc_kv_servable): read back the chunks the deepest hit needs.
 *
 * The tree's ready path for tokens[0, n) may go on past the match m (a
 * lookup in namespace ns that did not stop at a pending node), cut where a
 * window group lacked chunks. Find the deepest block boundary on it for
 * which RAM, the queue and the store hold every window chunk a hit there
 * needs, and read those RAM lacks into their blocks (kvc_kv_block_add_chunk:
 * each may evict another chunk, written down first). Returns the number of
 * chunks read: when > 0, look up again for the match they serve. */
int64_t kvc_tiers_fetch_windows(kvc_tiers *t, uint64_t ns, const int32_t *tokens, int64_t n,
                                const kvc_pc_match *m);

/* Write `node` and its ancestors through to the store in the background, up
 * to the first one the store holds already. Ready nodes only; a pending node
 * is skipped. A store with a shared tier is also told of the whole chain
 * (kvc_bs_refresh), so that it puts back there what that tier lost although
 * the local disk holds it. Returns the number of blocks queued. */
int64_t kvc_tiers_write_path(kvc_tiers *t, const kvc_pc_node *node);

/* Tails. The tree holds full blocks only; the last, partial block of a
 * sequence is its owner's. When an idle session lets its K/V go under
 * pressure, its tail goes down as a block of its own, keyed by the chain hash
 * before it and its k < B tokens (a key no full block has), so the next turn
 * of that conversation reads it back instead of computing up to B - 1 tokens
 * again.
 *
 * Send down the tail of tokens[0, n) (n % B of them; nothing when 0), whose
 * K/V is in pool block `block` (copied now), in namespace ns. */
void kvc_tiers_write_tail(kvc_tiers *t, uint64_t ns, const int32_t *tokens, int64_t n,
                          int32_t block);
/* The length of the longest tail the store holds for tokens[0, n) after the
 * match `m` (the full blocks before it: m->n_full of them), longer than
 * min_len tokens; 0 when none. Reads nothing, so the caller can make room
 * first. */
int32_t kvc_tiers_probe_tail(kvc_tiers *t, uint64_t ns, const int32_t *tokens, int64_t n,
                             const kvc_pc_match *m, int32_t min_len);
/* Read that tail, k tokens long (kvc_tiers_probe_tail), into a newly
 * allocated pool block, *block (the caller owns its reference). false, with
 * *block -1, when no block is free or the store does not give it (missing,
 * or corrupt: discarded). */
bool kvc_tiers_fetch_tail(kvc_tiers *t, uint64_t ns, const int32_t *tokens,
                          const kvc_pc_match *m, int32_t k, int32_t *block);

/* The key of memory group g's record (kv.h) of the block under chain hash
 * h: h itself for group 0, a hash of (h, g) for a window group. A block is a
 * record per chunk it has; read back, a window record missing or corrupt
 * leaves that chunk out (kvc_kv_servable then cuts a match short). */
uint64_t kvc_tiers_group_hash(uint64_t h, int32_t g);

/* Wait until the writer has written everything queued, and the store has
 * done what it does in the background (kvc_bs_flush). */
void kvc_tiers_flush(kvc_tiers *t);

/* Records other than the tree's blocks (recurrent snapshots, snapshot.h),
 * of any size and up to B tokens (d->n_tokens).
 *
 * Whether the queue or the store holds `hash`. */
bool kvc_tiers_has(kvc_tiers *t, uint64_t hash);
/* Write record d (`data`, `bytes`: malloc'd, taken over and freed by the
 * tiers whatever happens) in the background, by the writer thread that
 * writes blocks: the caller's thread only queues it. The store writes it as
 * any record, checksummed and all-or-nothing. Past 1 GiB of records queued
 * (or without memory for a queue entry) it is written at once instead.
 * KVC_OK when queued (or held already, or written at once); the store's
 * error when written at once and that failed. */
int  kvc_tiers_queue_record(kvc_tiers *t, const kvc_block_desc *d, void *data, size_t bytes);
/* Read record d into data (bytes): from the queue while it waits there, else
 * from the store. KVC_OK only for the record d exactly (hash, parent,
 * tokens, size), its checksum holding (kvc_bs_get); a corrupt one is
 * discarded by the store: KVC_ERR_FORMAT. */
int  kvc_tiers_get_record(kvc_tiers *t, const kvc_block_desc *d, void *data, size_t bytes);

void kvc_tiers_stats_get(kvc_tiers *t, kvc_tiers_stats *st);

/* The store's own figures, read under its lock. */
void kvc_tiers_store_stats(kvc_tiers *t, kvc_bs_stats *st);

#endif
