/* block_store_redis.h - the shared tier (DESIGN.md §5): the same blocks in
 * Redis, behind the local store (the disk tier), for several instances.
 *
 * kvc_redis_store_open returns one kvc_block_store that is the local store
 * (optional) continued into Redis:
 *   - get: the blocks the last prefetch fetched, else the local store, else
 *     one GET; prefetch fetches the run the local store lacks with one
 *     pipelined round trip (MGET-like, one GET per block);
 *   - put: the local store, then a SET to Redis (the tiers call put from
 *     their writer thread, so the round trip is off the engine's path);
 *   - contains: the local store's index (or, without one, the blocks this
 *     process saw in Redis), never a round trip;
 *   - Redis decides what to keep (run it with maxmemory and allkeys-lru).
 *
 * Keys: "kvc:<model fingerprint>:<namespace>:<chain hash>" (16 hex digits
 * each); values: the block record of block_store.h (same checksums as the
 * disk files), verified against what the caller expects: a value that fails
 * is deleted, counted, and the block recomputed.
 *
 * Failure is not an error: when Redis refuses, times out (every connect and
 * command is bounded by timeout_ms) or answers garbage, the call fails
 * quietly, counted; the connection is dropped and retried retry_ms later, by
 * itself; `warn` hears of an outage once, and of the recovery. Not
 * thread-safe, as every block store. */
#ifndef KVC_BLOCK_STORE_REDIS_H
#define KVC_BLOCK_STORE_REDIS_H

#include "block_store.h"

typedef struct kvc_redis_store_params {
    const char *url;          /* redis://[[user]:password@]host[:port][/db]; port 6379, db 0 */
    const char *password;     /* NULL = the URL's, if any */
    uint64_t    model_fp;     /* the model fingerprint, named in every key */
    int32_t     timeout_ms;   /* each connect and command; 0 = 200 */
    int32_t     retry_ms;     /* after a failure, Redis is left alone this long; 0 = 1000 */
    int32_t     max_run;      /* blocks one prefetch may fetch; 0 = 1024 */
    /* told (from whichever thread calls the store) when Redis is lost, once
     * an outage, and when it is back; NULL = nobody. msg is borrowed. */
    void      (*warn)(void *user, const char *msg);
    void       *warn_user;
} kvc_redis_store_params;

/* Open the shared tier behind `local` (owned from now on, also on failure;
 * NULL = Redis alone). Tries to connect once: Redis being down is no error
 * (it is retried later). KVC_ERR_INVALID_ARG for a URL it cannot read,
 * KVC_ERR_NOMEM. Freed by kvc_bs_close, which closes `local` too. */
int kvc_redis_store_open(const kvc_redis_store_params *p, kvc_block_store *local,
                         kvc_block_store **out, kvc_err *err);

/* Parse a redis:// URL into host (hsize bytes), port, db, and the password
 * (psize bytes, "" when none) and user ("" when none, usize bytes).
 * KVC_ERR_INVALID_ARG naming what is wrong. */
int kvc_redis_parse_url(const char *url, char *host, size_t hsize, int *port, int *db,
                        char *user, size_t usize, char *password, size_t psize, kvc_err *err);

#endif
