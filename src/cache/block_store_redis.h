/* block_store_redis.h - the shared tier (DESIGN.md §5): the same blocks in
 * Redis, behind the local store (the disk tier), for several instances.
 *
 * kvc_redis_store_open returns one kvc_block_store that is the local store
 * (optional) continued into Redis. Every network call runs on the store's
 * own I/O thread: the caller never waits on the network but for a fetch's
 * answer, up to a short deadline (wait_ms), and never holds its lock across
 * a round trip.
 *   - prefetch: the run the local store lacks, fetched with one pipelined
 *     round trip (one GET per block), each value verified; an answer that
 *     comes after the deadline is kept for the next prefetch of that run;
 *   - get: a fetched block, else the local store, else one GET (same
 *     deadline);
 *   - put: the local store at once, and a SET queued (fetches go first);
 *   - refresh: EXISTS for a chain in one pipeline; what Redis lost (flushed,
 *     restarted, evicted) is put back from the local store, so write-through
 *     heals whatever the local disk holds;
 *   - contains: the local store's index (or, without one, the blocks this
 *     process saw in Redis), never a round trip. What was seen is forgotten
 *     on a miss and on a new connection (Redis may have restarted empty);
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
 * itself; `warn` hears of an outage once, and of the recovery (from the I/O
 * thread). One thread calls the store at a time, as every block store. */
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
    int32_t     wait_ms;      /* how long a prefetch or get waits for Redis's answer;
                                 0 = 20 ms + 2 ms per block asked (capped by timeout_ms);
                                 an answer that comes later is kept for the next ask */
    /* told (from the store's I/O thread) when Redis is lost, once
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
