/* kv.h - the paged KV pool (DESIGN.md §2, "Memory groups").
 *
 * The pool holds fixed-size blocks of B positions (block_tokens; models run
 * with KVC_BLOCK_TOKENS, common.h). Each layer belongs to a MEMORY GROUP of
 * one kind:
 *   full       K/V of every position (every model has one: group 0);
 *   window(w)  K/V too, but position p attends only to p - w + 1 .. p, so a
 *              running sequence needs only the blocks of its last w positions.
 * A block is one id (what sequences, the prefix tree and the tiers hold and
 * reference-count) with one CHUNK per group: group 0's chunk is always
 * there; a window group's chunk may be gone (evicted) while the block, and
 * so the full layers' K/V of its positions, stays. Chunk of group g:
 *     for each layer l of g, in layer order:
 *       K: [n_kv_head_l][head_dim_l][B]  (kvc_kv_k; F16/F32: transposed per head,
 *          attention.h's [head_dim][B]; Q8_0: B rows of head_dim, store_k in forward.c)
 *       V: [n_kv_head_l][B][head_dim_l]  (kvc_kv_v: B rows of head_dim elements)
 *     each head's part kvc_kv_layer_row_bytes(l) * B bytes
 *   but for a KV-SHARED layer (Gemma 4's last layers: kvc_kv_layer.shares),
 *   which attends to the K/V an earlier layer of its group wrote and has no
 *   bytes of its own in any chunk, record or budget.
 * With one group (every model without windows) a block is exactly the one
 * contiguous chunk it always was (kvc_kv_block_data).
 *
 * Blocks are reference-counted, like SQLite's page cache: kvc_kv_block_alloc()
 * returns a block pinned once; every kvc_kv_block_ref() needs one
 * kvc_kv_block_unref(); the block (every chunk of it) returns to the free
 * lists when its count reaches zero. A full block is immutable and may be
 * shared by any number of sequences (and the prefix tree). A partly filled
 * block may be written only by a sole owner: kvc_kv_seq_reserve() copies a
 * shared block before the sequence writes into it (copy-on-write).
 *
 * Window chunks. A sequence HOLDS the window chunks of its blocks from the
 * one its window still needs on (kvc_kv_seq.from); a block behind the window
 * keeps its reference (the full layers need it) but its window chunk is
 * released: evictable, still usable until evicted. A group's chunks run out
 * -> the pool evicts one that no sequence holds, first those of blocks not in
 * the prefix tree (untagged: no hit but their own resting sequence's), then
 * the least recently released, and last those kept for the points where the
 * next requests are likely to diverge (kvc_kv_seq_keep). So a long sequence
 * costs its full layers plus about one window (w positions and a block) per
 * window group, and every message start and prompt end of a conversation
 * keeps a hit while the window slabs have room for their windows.
 *
 * A sequence is a block table plus a length: position p lives in block
 * blocks[p / B], row p % B. Not thread-safe: one engine thread owns the pool. */
#ifndef KVC_KV_H
#define KVC_KV_H

#include "common.h"

typedef struct kvc_kv_pool kvc_kv_pool;

#define KVC_KV_MAX_GROUPS 4

typedef enum kvc_kv_kind {
    KVC_KV_FULL = 0,
    KVC_KV_WINDOW = 1,
    KVC_KV_RECURRENT = 2,   /* a fixed-size state per sequence (kvc_kv_layer.state_floats) */
} kvc_kv_kind;

typedef struct kvc_kv_group {
    kvc_kv_kind kind;
    int32_t     window;     /* KVC_KV_WINDOW: w >= 1, position p attends to p - w + 1 .. p */
    int64_t     n_blocks;   /* chunks this group has room for; 0: the pool's n_blocks. Group 0: n_blocks */
} kvc_kv_group;

typedef struct kvc_kv_layer {
    int32_t group;          /* its memory group, < n_groups */
    int32_t n_kv_head;      /* 0: the pool's n_kv_head; -1: no K/V and no state (a layer
                             * without a token mixer: nemotron_h's FFN layers) */
    int32_t head_dim;       /* 0: the pool's head_dim */
    int64_t state_floats;   /* > 0: a recurrent layer: no K/V in any chunk, instead a state of
                             * this many floats per sequence (kvc_kv_seq_state) */
    int32_t shares;         /* 0: keeps its own K/V. d > 0: KV-shared, it reads the K/V of layer
                             * l - d (earlier, same group, KV heads and head dim, itself not
                             * shared) and has no bytes of its own (kvc_kv_k is NULL for it) */
} kvc_kv_layer;

typedef struct kvc_kv_pool_params {
    int32_t  n_layer;
    int32_t  n_kv_head;     /* every layer's, unless layers says otherwise */
    int32_t  head_dim;
    int32_t  block_tokens;  /* B; 0 = KVC_BLOCK_TOKENS (what the attention kernel takes) */
    uint32_t type;          /* KVC_TYPE_F16 (default), KVC_TYPE_F32 or KVC_TYPE_Q8_0 */
    int64_t  n_blocks;      /* capacity in blocks (group 0's chunks) */
    int32_t  n_groups;      /* 0 = 1: one full group of every layer, groups and layers unused */
    const kvc_kv_group *groups;   /* [n_groups], borrowed; group 0 full (every full layer, whatever
                                   * its head dim), the others window groups */
    const kvc_kv_layer *layers;   /* [n_layer], borrowed; NULL: every layer in group 0 */
} kvc_kv_pool_params;

/* The memory groups of a model's layers: layer l attends with window
 * window[l] (0: full) and has n_kv_head[l] KV heads of head_dim[l] (either
 * array NULL, or an entry 0: the pool's). Group 0 takes the full layers,
 * then one window group per distinct window, first seen first, each with
 * room for as many chunks as the pool has blocks (n_blocks 0). Fills
 * groups[KVC_KV_MAX_GROUPS] and layers[n_layer] for kvc_kv_pool_params;
 * returns the number of groups (1: no window layer), or
 * KVC_ERR_INVALID_ARG (nothing usable) when no layer is full or there are
 * more than KVC_KV_MAX_GROUPS - 1 distinct windows: the caller then runs
 * one full group, the attention still windowed, without the memory saving. */
int  kvc_kv_groups_of_layers(int32_t n_layer, const int32_t *window, const int32_t *n_kv_head,
                             const int32_t *head_dim, kvc_kv_group *groups, kvc_kv_layer *layers,
                             kvc_err *err);

/* Allocate the pool's memory up front. KVC_ERR_INVALID_ARG for a bad shape,
 * group layout or type (Q8_0 needs head_dim % 32 == 0), KVC_ERR_NOMEM. */
int  kvc_kv_pool_new(const kvc_kv_pool_params *p, kvc_kv_pool **out, kvc_err *err);
void kvc_kv_pool_free(kvc_kv_pool *pool);                 /* NULL ok */

/* The params as resolved (block_tokens, n_groups >= 1; groups and layers
 * point into the pool). */
const kvc_kv_pool_params *kvc_kv_pool_params_of(const kvc_kv_pool *pool);
int32_t kvc_kv_block_tokens(const kvc_kv_pool *pool);
int64_t kvc_kv_n_blocks(const kvc_kv_pool *pool);
int64_t kvc_kv_n_free(const kvc_kv_pool *pool);
size_t  kvc_kv_block_bytes(const kvc_kv_pool *pool);      /* every group's chunk, all layers, K and V */
size_t  kvc_kv_row_bytes(const kvc_kv_pool *pool);        /* one head, one position, of layer 0 */
size_t  kvc_kv_layer_row_bytes(const kvc_kv_pool *pool, int32_t layer);
/* A layer's KV heads and head dim as laid out (the pool's where its
 * kvc_kv_layer said 0). */
int32_t kvc_kv_layer_n_kv_head(const kvc_kv_pool *pool, int32_t layer);
int32_t kvc_kv_layer_head_dim(const kvc_kv_pool *pool, int32_t layer);
/* The layer whose K/V the layer attends to: itself, or for a KV-shared
 * layer the earlier one it shares. */
int32_t kvc_kv_layer_kv_of(const kvc_kv_pool *pool, int32_t layer);
/* kvc_kv_block_bytes of a pool with these params, before making it, to size a
 * pool for a memory budget; 0 for a bad shape or type. */
size_t  kvc_kv_block_bytes_for(const kvc_kv_pool_params *p);
/* The same for group g's chunk alone (g < 0: every group's). */
size_t  kvc_kv_group_bytes_for(const kvc_kv_pool_params *p, int32_t g);

/* Groups. */
int32_t kvc_kv_n_groups(const kvc_kv_pool *pool);
const kvc_kv_group *kvc_kv_group_of(const kvc_kv_pool *pool, int32_t g);   /* n_blocks resolved */
int32_t kvc_kv_layer_group(const kvc_kv_pool *pool, int32_t layer);
/* The attention window of a layer (attention.h's kvc_attn_args.window): its
 * group's w, 0 for a full group. */
int32_t kvc_kv_layer_window(const kvc_kv_pool *pool, int32_t layer);
size_t  kvc_kv_group_chunk_bytes(const kvc_kv_pool *pool, int32_t g);
int64_t kvc_kv_group_n_free(const kvc_kv_pool *pool, int32_t g);   /* free chunks */
int64_t kvc_kv_group_n_held(const kvc_kv_pool *pool, int32_t g);   /* chunks a sequence holds */
/* Whether block's chunk of group g is there (always for group 0); whether
 * it has every group's. */
bool    kvc_kv_block_has(const kvc_kv_pool *pool, int32_t block, int32_t g);
bool    kvc_kv_block_whole(const kvc_kv_pool *pool, int32_t block);

/* A free block with reference count 1 and a chunk in every group (a group
 * short of free chunks evicts one, see above), or -1 when none is free or a
 * group has no chunk left to evict. Its contents are undefined. */
int32_t kvc_kv_block_alloc(kvc_kv_pool *pool);
void    kvc_kv_block_ref(kvc_kv_pool *pool, int32_t block);
/* Drop one reference (the block must have one); at zero the block and its
 * chunks are free again. */
void    kvc_kv_block_unref(kvc_kv_pool *pool, int32_t block);
int32_t kvc_kv_block_refcount(const kvc_kv_pool *pool, int32_t block);
/* Copy every chunk src has into dst (which has them all): copy-on-write. */
void    kvc_kv_block_copy(kvc_kv_pool *pool, int32_t dst, int32_t src);

/* Watching: the prefix tree keeps a running count of the blocks it could evict,
 * and a block is evictable only while the tree's is its sole reference. So the
 * pool tells one watcher, in O(1), whenever a tagged block's count moves
 * between 1 and 2: fn(user, tag, 1) after it fell to 1, fn(user, tag, 2) after
 * it rose to 2; fn(user, tag, -g) just before its chunk of window group g is
 * evicted (its data still readable, kvc_kv_chunk_data: to write it down a
 * tier); and fn(user, tag, 0) after the block lost a window chunk (evicted or
 * dropped: no hit can end in it any more). A tag is the watcher's (the tree
 * node holding the block); a block has at most one. Set the watcher before
 * tagging; tag NULL = untagged. (An untagged block's released window chunks
 * are evicted first.) */
typedef void (*kvc_kv_watch_fn)(void *user, void *tag, int32_t refcount);
void    kvc_kv_set_watch(kvc_kv_pool *pool, kvc_kv_watch_fn fn, void *user);
void    kvc_kv_block_tag(kvc_kv_pool *pool, int32_t block, void *tag);
void   *kvc_kv_block_tag_of(const kvc_kv_pool *pool, int32_t block);

/* Group 0's chunk of the block: kvc_kv_group_chunk_bytes(pool, 0) contiguous
 * bytes; with one group, the whole block (what a tier stores). */
void *kvc_kv_block_data(kvc_kv_pool *pool, int32_t block);

/* Group g's chunk of the block (kvc_kv_group_chunk_bytes(pool, g) bytes),
 * or NULL when it is gone: what a tier stores as the record of (block, g). */
void *kvc_kv_chunk_data(kvc_kv_pool *pool, int32_t block, int32_t g);
/* Zero positions [from, B) of `chunk`, a copy of group g's chunk (layout
 * above; from in [0, B]): what a tier stores of a partly written block, so
 * that the bytes past its tokens are defined (the same on every write, and
 * no earlier owner's K/V leaves the pool with it). The pool's own chunks
 * are not touched: their unwritten positions stay undefined. */
void  kvc_kv_chunk_clear_rows(const kvc_kv_pool *pool, int32_t g, void *chunk, int32_t from);
/* Let the block's chunk of window group g > 0 go (a block read back from a
 * tier without its window record), as an eviction would; no sequence may
 * hold it. */
void  kvc_kv_block_drop_chunk(kvc_kv_pool *pool, int32_t block, int32_t g);
/* Make sure the block has a chunk of window group g > 0, and that it is the
 * last to be evicted of its list: the one it has (*fresh false; moved to the
 * most recent end unless a sequence holds it), or a new one (*fresh true,
 * its contents undefined: fill it, or let it go with
 * kvc_kv_block_drop_chunk), evicting one no sequence holds when none is
 * free. Its data, or NULL when every chunk of the group is held. */
void *kvc_kv_block_add_chunk(kvc_kv_pool *pool, int32_t block, int32_t g, bool *fresh);

/* Keys / values of one head of one layer of a block (layout above), or NULL
 * when the block's chunk of the layer's group is gone or the layer is
 * KV-shared (it has none: read kvc_kv_layer_kv_of's). */
void *kvc_kv_k(kvc_kv_pool *pool, int32_t block, int32_t layer, int32_t head);
void *kvc_kv_v(kvc_kv_pool *pool, int32_t block, int32_t layer, int32_t head);

/* How much of a path every group can serve: blocks[] covers positions
 * [0, len) (ceil(len / B) blocks). The longest L <= len, L = len or a
 * multiple of B, such that a sequence continuing from L has what each group
 * needs: full, every block (they exist); window(w), the chunks of positions
 * [L - w, L) (one more than the next position attends to, so that the last
 * token can be run again). 0 is always served. */
int64_t kvc_kv_servable(const kvc_kv_pool *pool, const int32_t *blocks, int64_t len);

/* ------------------------------------------------------------ recurrent layers
 *
 * A recurrent layer (state_floats > 0) keeps no K/V: each sequence has one
 * state per such layer that summarises its positions [0, n_tokens) (zero at
 * n_tokens 0), read and updated in place by the forward pass, token by token
 * in position order. A state cannot be cut back, and the pool does not know
 * which tokens a path holds: by itself a pool with recurrent layers serves no
 * cached path to another sequence (kvc_kv_servable is 0 but for len 0), a
 * truncation below n_tokens keeps 0 positions, and a fork shares either the
 * whole of its source or nothing. Snapshots of the states at chosen
 * positions (snapshot.h) are what serves a shorter or another path: found by
 * tokens, restored with kvc_kv_seq_assign and kvc_kv_seq_states. */

/* Floats of every recurrent layer's state, summed (0: no recurrent layer). */
int64_t kvc_kv_state_floats(const kvc_kv_pool *pool);
/* Floats of layer's state (0: not recurrent). */
int64_t kvc_kv_layer_state_floats(const kvc_kv_pool *pool, int32_t layer);

/* ------------------------------------------------------------ sequences */

typedef struct kvc_kv_seq {
    int32_t *blocks;     /* block table, n_blocks entries; the sequence holds one reference each */
    int32_t  n_blocks;
    int32_t  cap;        /* allocated entries */
    int64_t  n_tokens;   /* positions [0, n_tokens) hold valid K/V */
    int32_t  from[KVC_KV_MAX_GROUPS];   /* per group: it holds the chunks of blocks [from, to) */
    int32_t  to[KVC_KV_MAX_GROUPS];     /* (window groups; full: 0). ceil(n_tokens / B) <= to <=
                                         * n_blocks: blocks from `to` on are reserved, not written,
                                         * and get their window chunks when written
                                         * (kvc_kv_seq_window) */
    float   *state;      /* every recurrent layer's state (kvc_kv_seq_state), made on first use,
                          * freed when the sequence is cut to 0; NULL: all zero */
} kvc_kv_seq;

void kvc_kv_seq_init(kvc_kv_seq *seq);

/* Make positions [seq->n_tokens, n) writable: first release the window
 * chunks behind the window of position n_tokens (kvc_kv_seq_slide), then
 * allocate the blocks they need and copy-on-write a shared block among them.
 * New blocks get only their full group's chunk: their window chunks come
 * when the forward pass writes them (kvc_kv_seq_window), so a long prefill
 * reserved at once holds one window, not its whole length.
 * Does not change n_tokens (the forward pass sets it as it writes). On
 * KVC_ERR_KV_FULL or KVC_ERR_NOMEM the sequence is as it was but for the
 * slide. */
int  kvc_kv_seq_reserve(kvc_kv_pool *pool, kvc_kv_seq *seq, int64_t n, kvc_err *err);

/* How many free blocks kvc_kv_seq_reserve(pool, seq, n) would take now
 * (new blocks and a copy-on-write), without taking them. */
int64_t kvc_kv_seq_reserve_need(const kvc_kv_pool *pool, const kvc_kv_seq *seq, int64_t n);

/* Release the window chunks the sequence no longer needs: those of blocks
 * wholly below position n_tokens - w, for each window group. */
void kvc_kv_seq_slide(kvc_kv_pool *pool, kvc_kv_seq *seq);

/* Before the forward pass writes positions [n_tokens, n) (reserved): slide,
 * hold again the window of position n_tokens if the sequence rested
 * (kvc_kv_seq_rest), and give the blocks up to position n their window
 * chunks (a group short of free chunks evicts one no sequence holds).
 * KVC_ERR_INVALID_ARG when a chunk of that window was evicted while the
 * sequence rested (truncate first: kvc_kv_seq_truncate says how far it can
 * serve), KVC_ERR_KV_FULL when every chunk of a group is held; the chunks
 * had before the failure stay held. With one group: nothing to do. */
int  kvc_kv_seq_window(kvc_kv_pool *pool, kvc_kv_seq *seq, int64_t n, kvc_err *err);

/* The window chunks a sequence holds at most while running with batches of
 * n_batch positions (what kvc_kv_seq_window may hold for group g > 0):
 * ceil((w + n_batch) / B) + 2; 0 for group 0. */
int64_t kvc_kv_window_need(const kvc_kv_pool *pool, int32_t g, int32_t n_batch);

/* Hold the window chunks of every block from the one of position pos on
 * (they are about to be rewritten in place: a context shift). KVC_OK, or
 * KVC_ERR_INVALID_ARG (nothing changed) when one of them was evicted. */
int  kvc_kv_seq_hold_back(kvc_kv_pool *pool, kvc_kv_seq *seq, int64_t pos, kvc_err *err);

/* Between turns: hold no window chunk (they stay the sequence's, evictable
 * like the tree's, least recently released first). Its next turn truncates
 * (which holds the kept length's window again, or says it keeps less) or
 * calls kvc_kv_seq_window. */
void kvc_kv_seq_rest(kvc_kv_pool *pool, kvc_kv_seq *seq);

/* A request may diverge at position q of the sequence (a message start, a
 * prompt's end, the conversation's end: DESIGN.md §2): the window chunks a
 * hit there needs, those of the sequence's blocks [(q' - w) / B, ceil(q / B))
 * with q' = q rounded down to a block (so a hit at q or at the block boundary
 * below it), are KEPT: once released, those of blocks in the prefix tree
 * (tagged) are evicted after every other chunk no sequence holds, least
 * recently released first among them. The mark is the block's until it is
 * freed; chunks already evicted stay gone. */
void kvc_kv_seq_keep(kvc_kv_pool *pool, const kvc_kv_seq *seq, int64_t q);

/* Keep positions [0, n), drop the rest: blocks wholly past what is kept are
 * released. Returns what it kept: min(n, n_tokens), or less when a window
 * group cannot serve that length any more (its chunks there were evicted):
 * then the longest length kvc_kv_servable allows (0 at worst). The window
 * chunks of the kept length's window are held again. n >= n_tokens keeps
 * every position; only blocks reserved past n_tokens and not written are
 * released. */
int64_t kvc_kv_seq_truncate(kvc_kv_pool *pool, kvc_kv_seq *seq, int64_t n);

/* Make blocks [i0, i1) of the sequence its own: each shared one is copied
 * (every chunk it has) into a fresh block that takes its place, the
 * sequence's holds moving with it. KVC_ERR_KV_FULL when a block cannot be
 * had: the blocks copied before stay copied. */
int  kvc_kv_seq_make_private(kvc_kv_pool *pool, kvc_kv_seq *seq, int32_t i0, int32_t i1, kvc_err *err);

/* The state of recurrent `layer` of the sequence: kvc_kv_layer_state_floats
 * floats, all zero while n_tokens is 0. NULL for a layer that is not
 * recurrent, or when the states cannot be allocated (out of memory). */
float *kvc_kv_seq_state(kvc_kv_pool *pool, kvc_kv_seq *seq, int32_t layer);

/* Every recurrent layer's state of the sequence, one after the other in
 * layer order (kvc_kv_state_floats floats; layer l's at the offset
 * kvc_kv_seq_state gives): what a snapshot copies. Made (zero) on first use;
 * NULL without recurrent layers or out of memory. */
float *kvc_kv_seq_states(kvc_kv_pool *pool, kvc_kv_seq *seq);

/* Make the sequence hold exactly blocks[0, ceil(n / B)) (a reference taken on
 * each; the blocks it held released after) and n_tokens = n: a cached path
 * the caller vouches for, e.g. a recurrent snapshot's (snapshot.h), whose
 * states the caller then writes (kvc_kv_seq_states; left as they were
 * here). A trailing partial block may be shared: it is copied on the next
 * write (kvc_kv_seq_reserve). Pools of one memory group only
 * (KVC_ERR_INVALID_ARG); KVC_ERR_NOMEM (sequence unchanged). */
int  kvc_kv_seq_assign(kvc_kv_pool *pool, kvc_kv_seq *seq, const int32_t *blocks, int64_t n,
                       kvc_err *err);

/* Release every block, the table and the states; the sequence is empty
 * afterwards. */
void kvc_kv_seq_release(kvc_kv_pool *pool, kvc_kv_seq *seq);

/* Append `n` full blocks (a cached prefix found elsewhere), taking a reference
 * on each; the sequence must end on a block boundary. n_tokens grows by n*B.
 * KVC_ERR_INVALID_ARG (sequence unchanged) when a window group's chunk the
 * new length needs is gone: check with kvc_kv_servable first. */
int  kvc_kv_seq_append_blocks(kvc_kv_pool *pool, kvc_kv_seq *seq,
                              const int32_t *blocks, int32_t n, kvc_err *err);

/* Make `dst` (empty) share the first n positions of `src`: full blocks are
 * shared by reference; a trailing partial block too (copied on first write).
 * dst holds the window chunks src holds among them. */
int  kvc_kv_seq_fork(kvc_kv_pool *pool, const kvc_kv_seq *src, kvc_kv_seq *dst,
                     int64_t n, kvc_err *err);

#endif
