/* kv.h - the paged KV pool (DESIGN.md §2).
 *
 * The pool holds fixed-size blocks of B tokens (block_tokens, 16 by default).
 * One block stores, for every layer, the keys and values of its B positions:
 *     K, V of layer l: [n_kv_head][B][head_dim] elements of the pool's type
 * (head-major, so attention reads one head's keys for consecutive positions
 * contiguously). The block is the unit of sharing, eviction and, later,
 * spilling to disk: all of it is one contiguous chunk of kvc_kv_block_bytes().
 *
 * Blocks are reference-counted, like SQLite's page cache: kvc_kv_block_alloc()
 * returns a block pinned once; every kvc_kv_block_ref() needs one
 * kvc_kv_block_unref(); the block returns to the free list when its count
 * reaches zero. A full block is immutable and may be shared by any number of
 * sequences (and the prefix tree). A partly filled block may be written only by
 * a sole owner: kvc_kv_seq_reserve() copies a shared block before the sequence
 * writes into it (copy-on-write).
 *
 * A sequence is a block table plus a length: position p lives in block
 * blocks[p / B], row p % B. Not thread-safe: one engine thread owns the pool. */
#ifndef KVC_KV_H
#define KVC_KV_H

#include "common.h"

typedef struct kvc_kv_pool kvc_kv_pool;

typedef struct kvc_kv_pool_params {
    int32_t  n_layer;
    int32_t  n_kv_head;
    int32_t  head_dim;
    int32_t  block_tokens;  /* B; 0 = 16 */
    uint32_t type;          /* KVC_TYPE_F16 (default), KVC_TYPE_F32 or KVC_TYPE_Q8_0 */
    int64_t  n_blocks;      /* capacity in blocks */
} kvc_kv_pool_params;

/* Allocate the pool's memory up front. KVC_ERR_INVALID_ARG for a bad shape or
 * type (Q8_0 needs head_dim % 32 == 0), KVC_ERR_NOMEM. */
int  kvc_kv_pool_new(const kvc_kv_pool_params *p, kvc_kv_pool **out, kvc_err *err);
void kvc_kv_pool_free(kvc_kv_pool *pool);                 /* NULL ok */

const kvc_kv_pool_params *kvc_kv_pool_params_of(const kvc_kv_pool *pool);
int32_t kvc_kv_block_tokens(const kvc_kv_pool *pool);
int64_t kvc_kv_n_blocks(const kvc_kv_pool *pool);
int64_t kvc_kv_n_free(const kvc_kv_pool *pool);
size_t  kvc_kv_block_bytes(const kvc_kv_pool *pool);      /* all layers, K and V */
size_t  kvc_kv_row_bytes(const kvc_kv_pool *pool);        /* one head, one position */
/* kvc_kv_block_bytes of a pool with these params (block_tokens 0 = 16), before
 * making it, to size a pool for a memory budget; 0 for a bad shape or type. */
size_t  kvc_kv_block_bytes_for(const kvc_kv_pool_params *p);

/* A free block with reference count 1, or -1 when none is free. Its contents
 * are undefined. */
int32_t kvc_kv_block_alloc(kvc_kv_pool *pool);
void    kvc_kv_block_ref(kvc_kv_pool *pool, int32_t block);
/* Drop one reference (the block must have one); at zero the block is free
 * again. */
void    kvc_kv_block_unref(kvc_kv_pool *pool, int32_t block);
int32_t kvc_kv_block_refcount(const kvc_kv_pool *pool, int32_t block);

/* Watching: the prefix tree keeps a running count of the blocks it could evict,
 * and a block is evictable only while the tree's is its sole reference. So the
 * pool tells one watcher, in O(1), whenever a tagged block's count moves
 * between 1 and 2: fn(user, tag, 1) after it fell to 1, fn(user, tag, 2) after
 * it rose to 2. A tag is the watcher's (the tree node holding the block); a
 * block has at most one. Set the watcher before tagging; tag NULL = untagged. */
typedef void (*kvc_kv_watch_fn)(void *user, void *tag, int32_t refcount);
void    kvc_kv_set_watch(kvc_kv_pool *pool, kvc_kv_watch_fn fn, void *user);
void    kvc_kv_block_tag(kvc_kv_pool *pool, int32_t block, void *tag);
void   *kvc_kv_block_tag_of(const kvc_kv_pool *pool, int32_t block);

/* The whole block: kvc_kv_block_bytes() contiguous bytes (what a tier stores). */
void *kvc_kv_block_data(kvc_kv_pool *pool, int32_t block);

/* Keys / values of one head of one layer of a block: B rows of head_dim
 * elements of the pool's type, kvc_kv_row_bytes() apart. */
void *kvc_kv_k(kvc_kv_pool *pool, int32_t block, int32_t layer, int32_t head);
void *kvc_kv_v(kvc_kv_pool *pool, int32_t block, int32_t layer, int32_t head);

/* ------------------------------------------------------------ sequences */

typedef struct kvc_kv_seq {
    int32_t *blocks;     /* block table, n_blocks entries; the sequence holds one reference each */
    int32_t  n_blocks;
    int32_t  cap;        /* allocated entries */
    int64_t  n_tokens;   /* positions [0, n_tokens) hold valid K/V */
} kvc_kv_seq;

void kvc_kv_seq_init(kvc_kv_seq *seq);

/* Make positions [seq->n_tokens, n) writable: allocate the blocks they need and
 * copy-on-write a shared block among them. Does not change n_tokens (the
 * forward pass sets it as it writes). On KVC_ERR_KV_FULL or KVC_ERR_NOMEM the
 * sequence is as it was. */
int  kvc_kv_seq_reserve(kvc_kv_pool *pool, kvc_kv_seq *seq, int64_t n, kvc_err *err);

/* How many free blocks kvc_kv_seq_reserve(pool, seq, n) would take now
 * (new blocks and a copy-on-write), without taking them. */
int64_t kvc_kv_seq_reserve_need(const kvc_kv_pool *pool, const kvc_kv_seq *seq, int64_t n);

/* Keep positions [0, n), drop the rest: blocks wholly past n are released.
 * n >= n_tokens keeps every position; only blocks reserved past n_tokens
 * (kvc_kv_seq_reserve) and not written are released. */
void kvc_kv_seq_truncate(kvc_kv_pool *pool, kvc_kv_seq *seq, int64_t n);

/* Release every block and the table; the sequence is empty afterwards. */
void kvc_kv_seq_release(kvc_kv_pool *pool, kvc_kv_seq *seq);

/* Append `n` full blocks (a cached prefix found elsewhere), taking a reference
 * on each; the sequence must end on a block boundary. n_tokens grows by n*B. */
int  kvc_kv_seq_append_blocks(kvc_kv_pool *pool, kvc_kv_seq *seq,
                              const int32_t *blocks, int32_t n, kvc_err *err);

/* Make `dst` (empty) share the first n positions of `src`: full blocks are
 * shared by reference; a trailing partial block too (copied on first write). */
int  kvc_kv_seq_fork(kvc_kv_pool *pool, const kvc_kv_seq *src, kvc_kv_seq *dst,
                     int64_t n, kvc_err *err);

#endif
