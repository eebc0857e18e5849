/* block_store.h - the tiers below RAM (DESIGN.md §5): one small interface,
 * several backends (a local directory now, Redis next).
 *
 * A store keeps KV blocks content-addressed by their chain hash (the prefix
 * tree's kvc_pc_node.hash, which covers the model, the KV type and shape, the
 * namespace, the parent block and the tokens). A stored block holds its tokens,
 * its parent's chain hash and its K/V exactly as the pool stores them
 * (kvc_kv_block_bytes of one pool block, see kv.h). A read is verified against
 * what the caller expects, tokens and parent included: a hash alone is never
 * trusted. A block that fails its checksum is discarded, counted, and never
 * returned; the caller recomputes it.
 *
 * Stores are a cache: any block may be missing at any time, and every failure
 * is reported but safe to ignore. Not thread-safe: one thread uses a store at
 * a time (the tiers call it under their lock); a store may run threads of
 * its own behind the interface (the shared tier's network I/O). */
#ifndef KVC_BLOCK_STORE_H
#define KVC_BLOCK_STORE_H

#include "common.h"

/* What identifies a stored block, beside its K/V. Borrowed by every call. */
typedef struct kvc_block_desc {
    uint64_t       hash;      /* the chain hash: the key */
    uint64_t       parent;    /* the parent's chain hash (depth 0: kvc_pc_ns_seed) */
    int32_t        n_tokens;  /* tokens per block, B */
    const int32_t *tokens;    /* [n_tokens] */
    uint64_t       ns;        /* its cache namespace (covered by hash; named in shared
                                 keys); 0 = the default */
} kvc_block_desc;

typedef struct kvc_bs_stats {
    int64_t  n_blocks;            /* blocks held now */
    uint64_t bytes_used;          /* their size on the medium */
    uint64_t budget;              /* the most bytes_used may reach */
    uint64_t bytes_read;          /* K/V bytes returned by get */
    uint64_t bytes_written;       /* bytes written by put */
    uint64_t n_hits, n_misses;    /* get */
    uint64_t n_puts;              /* blocks written */
    uint64_t checksum_failures;   /* blocks discarded at get: checksum, size or header */
    uint64_t discarded_at_load;   /* entries dropped when the index was rebuilt */
    uint64_t headers_read_at_load;/* files opened to rebuild it (the others were as
                                     its saved snapshot names them) */
    uint64_t evictions;           /* blocks removed to stay under the budget */
    uint64_t full_events;         /* writes that found the medium full (ENOSPC):
                                     the budget was lowered to fit */
    /* a shared tier behind this store (Redis, block_store_redis.h); all 0
     * without one */
    int32_t  shared_up;           /* 1: connected now; 0: not (down, or never tried) */
    uint64_t shared_blocks_read;  /* blocks it served (verified) */
    uint64_t shared_blocks_written;
    uint64_t shared_bytes_read, shared_bytes_written;
    uint64_t shared_round_trips;  /* pipelines sent (one per call) */
    uint64_t shared_failures;     /* calls that failed: refused, timed out, garbage */
    uint64_t shared_checksum_failures;   /* values discarded: bad checksum or header */
    int32_t  shared_pending;      /* network calls queued or running (writes, checks) */
} kvc_bs_stats;

/* Called for each stored block; return false to stop. It must not change the
 * store. */
typedef bool (*kvc_bs_iter_fn)(void *user, uint64_t hash, uint64_t parent);

typedef struct kvc_block_store kvc_block_store;

/* A backend: a struct that starts with a kvc_block_store whose ops point here. */
typedef struct kvc_block_store_ops {
    const char *name;
    int  (*put)(kvc_block_store *bs, const kvc_block_desc *d, const void *kv, size_t kv_bytes,
                kvc_err *err);
    int  (*get)(kvc_block_store *bs, const kvc_block_desc *d, void *kv, size_t kv_bytes,
                kvc_err *err);
    bool (*contains)(kvc_block_store *bs, uint64_t hash);
    int  (*remove)(kvc_block_store *bs, uint64_t hash);
    void (*iterate)(kvc_block_store *bs, kvc_bs_iter_fn fn, void *user);
    void (*stats)(kvc_block_store *bs, kvc_bs_stats *st);
    void (*close)(kvc_block_store *bs);
    /* optional (NULL: none): make a run of blocks ready to get, e.g. fetched
     * from a remote tier in one round trip; see kvc_bs_prefetch */
    int64_t (*prefetch)(kvc_block_store *bs, const kvc_block_desc *run, int64_t n);
    /* optional: see kvc_bs_refresh */
    void (*refresh)(kvc_block_store *bs, const kvc_block_desc *run, int64_t n, size_t kv_bytes);
    /* optional: see kvc_bs_flush */
    void (*flush)(kvc_block_store *bs);
} kvc_block_store_ops;

struct kvc_block_store {
    const kvc_block_store_ops *ops;
};

/* Store the block `d` with its K/V (kv_bytes, copied). Storing a block held
 * already only marks it used. May evict least recently used blocks to stay
 * under the budget. KVC_ERR_IO (the medium failed: nothing stored),
 * KVC_ERR_INVALID_ARG (larger than the whole budget). */
static inline int kvc_bs_put(kvc_block_store *bs, const kvc_block_desc *d, const void *kv,
                             size_t kv_bytes, kvc_err *err)
{
    return bs->ops->put(bs, d, kv, kv_bytes, err);
}

/* Read the block `d` into kv (kv_bytes, caller-owned; its contents are
 * undefined after a failure). KVC_OK only when the stored block is d exactly
 * (hash, parent, tokens, size) and its checksum holds. KVC_ERR_NOT_FOUND when
 * it is not stored or is another block under the same hash; KVC_ERR_FORMAT
 * when it was corrupt (it is discarded and counted); KVC_ERR_IO. Marks it
 * used. */
static inline int kvc_bs_get(kvc_block_store *bs, const kvc_block_desc *d, void *kv,
                             size_t kv_bytes, kvc_err *err)
{
    return bs->ops->get(bs, d, kv, kv_bytes, err);
}

/* Whether a block is stored under `hash` (by the index: a get may still fail). */
static inline bool kvc_bs_contains(kvc_block_store *bs, uint64_t hash)
{
    return bs->ops->contains(bs, hash);
}

/* Forget the block under `hash`. KVC_OK, KVC_ERR_NOT_FOUND, KVC_ERR_IO. */
static inline int kvc_bs_remove(kvc_block_store *bs, uint64_t hash)
{
    return bs->ops->remove(bs, hash);
}

/* Every stored block, least recently used first. */
static inline void kvc_bs_iterate(kvc_block_store *bs, kvc_bs_iter_fn fn, void *user)
{
    bs->ops->iterate(bs, fn, user);
}

static inline void kvc_bs_stats_get(kvc_block_store *bs, kvc_bs_stats *st)
{
    bs->ops->stats(bs, st);
}

/* How many leading blocks of run[0, n) (a chain: each one's parent is the
 * previous one's hash) the store can give now, after readying them where that
 * helps (a remote store fetches the run in one round trip and keeps what it
 * got until the next prefetch). A store without the op: those it contains. */
static inline int64_t kvc_bs_prefetch(kvc_block_store *bs, const kvc_block_desc *run, int64_t n)
{
    if (bs->ops->prefetch)
        return bs->ops->prefetch(bs, run, n);
    int64_t k = 0;
    while (k < n && kvc_bs_contains(bs, run[k].hash))
        k++;
    return k;
}

/* The chain run[0, n) (root first) is in use and held below RAM as far as
 * contains() says: a store with a tier that can lose blocks behind its back
 * (a shared Redis flushed, restarted, or evicting) checks that tier in the
 * background and puts back there what it lost, from its local copy (blocks
 * of kv_bytes). Returns at once; a store without the op does nothing. */
static inline void kvc_bs_refresh(kvc_block_store *bs, const kvc_block_desc *run, int64_t n,
                                  size_t kv_bytes)
{
    if (bs->ops->refresh && n > 0)
        bs->ops->refresh(bs, run, n, kv_bytes);
}

/* Wait until what the store does in the background (a shared tier's writes)
 * is done. A store without the op has nothing in the background. */
static inline void kvc_bs_flush(kvc_block_store *bs)
{
    if (bs->ops->flush)
        bs->ops->flush(bs);
}

/* Close the store and free it. NULL ok. */
static inline void kvc_bs_close(kvc_block_store *bs)
{
    if (bs)
        bs->ops->close(bs);
}

/* ------------------------------------------------------------ the record */

/* A stored block as every backend keeps it (a disk file, a Redis value): a
 * 64-byte header (magic "KVCBLK01", the hash, parent, sizes, the payload's
 * XXH3-64 and the header's own), the tokens (int32), the K/V. */
#define KVC_BLOCK_RECORD_HEADER 64

static inline size_t kvc_block_record_size(int32_t n_tokens, size_t kv_bytes)
{
    return KVC_BLOCK_RECORD_HEADER + (size_t)n_tokens * sizeof(int32_t) + kv_bytes;
}

/* Write d's record with its K/V into out (kvc_block_record_size bytes). */
void kvc_block_record_write(const kvc_block_desc *d, const void *kv, size_t kv_bytes, void *out);

/* Check the record rec[0, size) against d and copy its K/V into kv
 * (kv_bytes); kv NULL: only check it (kv_bytes is then not compared).
 * KVC_OK; KVC_ERR_FORMAT when it is not a whole record or its checksums fail
 * (corrupt); KVC_ERR_NOT_FOUND when it is a sound record of another block
 * (parent, tokens or sizes differ). kv is undefined after a failure. */
int  kvc_block_record_read(const void *rec, size_t size, const kvc_block_desc *d, void *kv,
                           size_t kv_bytes, kvc_err *err);

/* ------------------------------------------------------------ disk backend */

typedef struct kvc_disk_store_params {
    const char *dir;          /* NULL = kvc_cache_default_dir() */
    uint64_t    budget_bytes; /* 0 = KVC_DISK_DEFAULT_MIB MiB (kvchat.h) */
    bool        fsync;        /* fsync each block before it becomes visible; off by default */
    /* told once when the medium fills up before the budget (the budget is
     * then lowered to what fits: older blocks make room), and every 2 s of
     * a slow index rebuild at open how many blocks it has read; NULL = nobody */
    void      (*warn)(void *user, const char *msg);
    void       *warn_user;
} kvc_disk_store_params;

/* Open (creating it and its parents, mode 0700) the directory, take its lock,
 * remove what crashed writers left, and rebuild the index from the files.
 * KVC_ERR_BUSY when another process holds the directory; KVC_ERR_IO. The
 * returned store is freed by kvc_bs_close. */
int kvc_disk_store_open(const kvc_disk_store_params *p, kvc_block_store **out, kvc_err *err);

/* The default directory: $KVCHAT_CACHE/kv (the CLI's cache root), else
 * $XDG_CACHE_HOME/kvchat/kv, else $HOME/.cache/kvchat/kv.
 * KVC_ERR_NOT_FOUND when neither variable is set, KVC_ERR_INVALID_ARG when
 * the path does not fit `size`. */
int kvc_cache_default_dir(char *buf, size_t size, kvc_err *err);

/* A fingerprint of a model file: XXH3 of all its bytes (metadata and tensor
 * data), remembered in `dir`/models (0600) under the file's path, size,
 * inode, modification time and status-change time (ctime, which user space
 * cannot set back), so it is computed once per file version.
 * `dir` NULL: computed, not remembered. KVC_ERR_IO. */
int kvc_model_fingerprint(const char *path, const char *dir, uint64_t *out, kvc_err *err);

#endif
