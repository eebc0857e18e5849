/* context.h - the inside of a kvc_context, for the parts built on it (session,
 * engine).
 *
 * A context is a model's forward-pass state (kvc_compute), a paged KV pool,
 * n_seq block tables into it, and the prefix tree over the pool's full blocks
 * that every sequence's turns share (prefix_cache.h). */
#ifndef KVC_CONTEXT_H
#define KVC_CONTEXT_H

#include "model.h"
#include "prefix_cache.h"
#include "tiers.h"
#include "block_store_redis.h"

struct kvc_context {
    kvc_model   *model;
    kvc_context_params p;
    kvc_kv_pool *pool;
    kvc_compute *compute;
    kvc_kv_seq  *seqs;          /* n_seq */
    kvc_batch_item *items;      /* n_batch */
    float       *logits;        /* logits_cap rows of n_vocab */
    int32_t      logits_cap;
    int32_t      n_logits;      /* rows held by the last decode */
    kvc_prefix_cache *pc;       /* full blocks entered by the sessions' turns */
    int64_t      promised;      /* blocks running turns may still allocate: kept
                                   free (turn_kv.c) */
    struct kvc_chat_template *chat_tmpl; /* compiled once for the sessions (session.c) */
    char        *chat_tmpl_key; /* the template_name it was made for; NULL = the model's */
    struct kvc_gvocab *gvocab;  /* the vocabulary trie of constrained decoding (grammar.h),
                                   made by the first turn with a grammar; NULL before */
    int64_t      growth_reserve;/* blocks a turn's admission leaves free beside the
                                   promised ones, for running replies to grow into
                                   (the engine: one per running request) */
    kvc_block_store *store;     /* the disk tier (maybe continued into Redis), or NULL
                                   (kvc_context_set_tiers) */
    kvc_tiers   *tiers;         /* the tree joined to it, or NULL */
    uint64_t     room_refused;  /* kvc_context_make_room calls that evicted nothing
                                   because eviction could not make the room */
    struct kvc_snaps *snaps;    /* recurrent layers: snapshots of their states in the
                                   tree (snapshot.h); NULL for attention-only models */
    int32_t      snap_interval; /* with snaps: tokens between a long prefill's snapshots
                                   (multiple of the block; 0: none but the chosen points) */
};

/* The snapshot interval a model gets when none is asked for: the tokens
 * whose K/V take as many bytes as one snapshot of its recurrent states
 * (so that periodic snapshots cost about what the K/V they cover do), a
 * multiple of the block, within [64, 4096]; 0 without recurrent layers. */
int32_t kvc_context_snap_interval(const kvc_model *model, int32_t kv_type);

/* Put the disk tier under the context's tree: open (create) the store in
 * `dir` (NULL = the user's cache directory) with a budget of `mib` MiB (0 =
 * KVC_DISK_DEFAULT_MIB), and seed the chain hashes with the fingerprint of
 * the model file at `model_path` (remembered in the directory), so blocks of
 * another model or KV type are never found. Only on a context whose tree is
 * still empty. Errors (nothing changed): the store's (KVC_ERR_BUSY: another
 * process holds the directory; KVC_ERR_IO), KVC_ERR_INVALID_ARG, NOMEM. */
int kvc_context_set_disk(kvc_context *c, const char *model_path, const char *dir, int64_t mib,
                         kvc_err *err);

/* Give the context's pool memory groups (kv.h): layer l attends with window
 * window[l] (0: full attention), the layers of each window in a window group
 * with room for n_window chunks (0: as many as the pool has blocks), the
 * full layers in group 0. The pool and tree are made again, so only on a
 * fresh context (nothing cached, no tiers). The attention of the forward
 * pass then takes each layer's window from its group. KVC_ERR_INVALID_ARG
 * (context unchanged) otherwise, or for a layout kvc_kv_groups_of_layers
 * refuses; NOMEM. */
int kvc_context_set_windows(kvc_context *c, const int32_t *window, int64_t n_window, kvc_err *err);

/* The same, with the disk tier optional (mib 0: none) and the shared tier in
 * Redis behind it (redis NULL or its url NULL: none; its model_fp is filled
 * in here). Redis being down is no error (block_store_redis.h). redis->warn
 * also hears the disk tier's one warning (its medium full). A pool with
 * window groups (kv.h) stores a record per (block, group) (tiers.c). Recurrent
 * snapshots go to the same tiers (snapshot.h). */
int kvc_context_set_tiers(kvc_context *c, const char *model_path, const char *dir, int64_t mib,
                          const kvc_redis_store_params *redis, kvc_err *err);

/* Evict least recently used unreferenced blocks from the prefix tree until
 * n_free blocks are free, only when that is enough (the tree knows how many it
 * can evict): a request that cannot fit evicts nothing. Returns whether
 * n_free blocks are free. */
bool kvc_context_make_room(kvc_context *c, int64_t n_free);

/* Make room for `rows` rows of logits in c->logits. KVC_ERR_NOMEM. */
int kvc_context_logits_reserve(kvc_context *c, int32_t rows, kvc_err *err);

/* Bytes of one KV block (16 tokens, K and V of every layer but the
 * sliding-window ones, which keep window chunks of their own) of a context
 * for `model` with KV type `kv_type` (enum kvc_kv_type); 0 for a bad type. */
size_t kvc_context_block_bytes(const kvc_model *model, int32_t kv_type);

/* The kv_blocks of a context for `model` whose pool, window chunks (kv.h)
 * included, fits in `bytes`, for n_run running sequences with batches of
 * n_batch (0: 512) and *kv_window_blocks (kvc_context_params'; set to -1
 * when its default 0 would keep every block's window chunk at that size, as
 * kvc_context_new then does). 0 for a bad type. */
int64_t kvc_context_blocks_for(const kvc_model *model, int32_t kv_type, int32_t n_run,
                               int32_t n_batch, uint64_t bytes, int64_t *kv_window_blocks);

/* The context length to use when the caller leaves it to the model: the
 * training context from the file, capped by what the KV pool can hold for one
 * sequence (kv_blocks > 0: a pool of that many blocks; else n_seq full
 * contexts within half the physical memory), so that a file claiming 2^31
 * tokens does not ask for a terabyte. At least one block (16 tokens). */
int32_t kvc_context_fit_n_ctx(const kvc_model *model, int32_t kv_type, int64_t kv_blocks,
                              int32_t n_seq);

#endif
