/* block_store_redis.c - the shared tier: the local store continued into Redis
 * (hiredis; see block_store_redis.h).
 *
 * Every network call runs on the store's own I/O thread, which owns the
 * connection: the caller's thread (the tiers', under their lock) never waits
 * on the network, except a prefetch or get that waits for its answer up to a
 * short deadline (wait_ms), proportional to the blocks at stake. A put writes
 * the local store and queues the SET; a fetch goes ahead of queued writes;
 * an answer that comes after its deadline is kept for the next prefetch of
 * that run. */
#include "block_store_redis.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KNOWN_SLOTS  65536            /* hashes seen in Redis, direct-mapped (a power of two) */
#define QUEUE_BYTES  (256u << 20)     /* records waiting for their SET; more are dropped */
#define STAGE_FRESH_US 2000000        /* how long a fetched "missing" answer is believed */
#define DRAIN_US     2000000          /* at close: queued writes get this long, then dropped */
#define MAX_FETCHES  8                /* fetches queued; more asks are not sent */

enum { JOB_SET, JOB_FETCH, JOB_ENSURE };
enum { B_UNKNOWN = 0, B_THERE, B_MISSING, B_BAD };

/* Work for the I/O thread. Built and freed under mu; its own fields are the
 * I/O thread's while it runs it. */
typedef struct job {
    struct job     *next;
    int             kind;
    int             refs;       /* the queue's (until done) and a waiter's */
    bool            done;
    int64_t         n;          /* blocks */
    kvc_block_desc *d;          /* [n]; tokens point into toks */
    int32_t        *toks;
    int8_t         *state;      /* [n]: B_* after the job */
    redisReply    **reply;      /* JOB_FETCH: [n], the sound values */
    uint8_t        *rec;        /* JOB_SET: the record */
    size_t          rec_size;
    size_t          kv_bytes;   /* JOB_ENSURE: a local block's size */
    int64_t         rtt_us;     /* JOB_FETCH: its round trip, when it made one */
} job;

/* A fetched answer, waiting for its get (or telling a block is missing). */
typedef struct staged {
    uint64_t    hash;
    int8_t      state;        /* B_THERE (reply set) or B_MISSING */
    int64_t     at_us;
    redisReply *reply;        /* owned; its string is the block's record */
} staged;

typedef struct redis_store {
    kvc_block_store  base;
    kvc_block_store *local;   /* owned; NULL = Redis alone; used under local_mu */
    pthread_mutex_t  local_mu;
    /* the I/O thread's own */
    redisContext    *c;       /* NULL while down */
    char             host[256], user[128], password[256];
    int              port, db;
    char             url[300];          /* for messages, without the password */
    uint64_t         fp;
    struct timeval   timeout;
    int64_t          retry_us, next_try_us;
    bool             warned;            /* an outage was told and not yet its end */
    bool             reconnected;       /* a new connection: what we knew may be gone */
    int64_t          ping_us;           /* its first round trip (0: published) */
    kvc_bs_stats     io;                /* the shared_* counters as the thread keeps them */
    uint8_t         *buf;               /* the K/V of a local block being put back */
    size_t           buf_cap;
    /* under mu */
    pthread_mutex_t  mu;
    pthread_cond_t   work_cv, done_cv;
    pthread_t        thread;
    bool             started, stop, busy;
    job             *fq, *fq_tail;      /* fetches: first */
    int32_t          n_fq;              /* fetches queued */
    int32_t          n_fetched_in_row;
    job             *wq, *wq_tail;      /* writes and checks */
    size_t           queued_bytes;
    int32_t          max_run;
    int64_t          wait_us;           /* 0 = by the blocks at stake */
    int64_t          rtt_us;            /* a fetch's round trip, smoothed (0: none yet) */
    staged          *stage;             /* [stage_cap] */
    int64_t          n_stage, stage_cap;
    uint64_t        *known;             /* [KNOWN_SLOTS]: hashes in Redis (as far as we
                                           know), 0 = none */
    void           (*warn)(void *, const char *);
    void            *warn_user;
    kvc_bs_stats     st;                /* the shared_* fields, published after each job */
} redis_store;

/* ---------------------------------------------------------------- jobs */

static void job_free(job *j)
{
    if (!j)
        return;
    if (j->reply)
        for (int64_t i = 0; i < j->n; i++)
            if (j->reply[i])
                freeReplyObject(j->reply[i]);
    free(j->reply);
    free(j->d);
    free(j->toks);
    free(j->state);
    free(j->rec);
    free(j);
}

/* A job over the blocks d[0, n), their tokens copied. NULL: no memory. */
static job *job_new(int kind, const kvc_block_desc *d, int64_t n)
{
    job *j = calloc(1, sizeof(*j));
    if (!j)
        return NULL;
    j->kind = kind;
    j->refs = 1;
    j->n = n;
    size_t nt = 0;
    for (int64_t i = 0; i < n; i++)
        nt += (size_t)d[i].n_tokens;
    j->d = malloc((size_t)n * sizeof(*j->d));
    j->toks = malloc(KVC_MAX(nt, 1) * sizeof(int32_t));
    j->state = calloc((size_t)n, 1);
    j->reply = kind == JOB_FETCH ? calloc((size_t)n, sizeof(redisReply *)) : NULL;
    if (!j->d || !j->toks || !j->state || (kind == JOB_FETCH && !j->reply)) {
        job_free(j);
        return NULL;
    }
    size_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        j->d[i] = d[i];
        memcpy(j->toks + at, d[i].tokens, (size_t)d[i].n_tokens * sizeof(int32_t));
        j->d[i].tokens = j->toks + at;
        at += (size_t)d[i].n_tokens;
    }
    return j;
}

static void push(job **head, job **tail, job *j)
{
    j->next = NULL;
    if (*tail)
        (*tail)->next = j;
    else
        *head = j;
    *tail = j;
}

/* Queue j for the I/O thread. Under mu. */
static void submit_locked(redis_store *rs, job *j)
{
    if (j->kind == JOB_FETCH) {
        push(&rs->fq, &rs->fq_tail, j);
        rs->n_fq++;
    }
    else
        push(&rs->wq, &rs->wq_tail, j);
    if (j->kind == JOB_SET)
        rs->queued_bytes += j->rec_size;
    pthread_cond_signal(&rs->work_cv);
}

static void unref_locked(job *j)
{
    if (--j->refs == 0)
        job_free(j);
}

/* ------------------------------------------------------------ connection */

static void tell(redis_store *rs, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tell(redis_store *rs, const char *fmt, ...)
{
    if (!rs->warn)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    rs->warn(rs->warn_user, msg);
}

/* A call failed: drop the connection, leave Redis alone for retry_us, count. */
static void failed(redis_store *rs, const char *what)
{
    char why[160];
    snprintf(why, sizeof(why), "%s", what);       /* it may be rs->c's, freed next */
    if (rs->c)
        redisFree(rs->c);
    rs->c = NULL;
    rs->io.shared_failures++;
    rs->io.shared_up = 0;
    rs->next_try_us = kvc_time_us() + rs->retry_us;
    if (!rs->warned)
        tell(rs, "the Redis tier at %s is unavailable (%s): serving without it, retrying "
                 "every %lld ms", rs->url, why, (long long)(rs->retry_us / 1000));
    rs->warned = true;
}

static redisContext *conn(redis_store *rs);

/* The connection broke (EOF or an I/O error), as it does on its first use
 * after Redis restarted: reconnect at once, so that the caller may try its
 * call once more (a timeout may so cost twice the bound, no more). */
static bool reconnect_now(redis_store *rs)
{
    if (!rs->c || (rs->c->err != REDIS_ERR_EOF && rs->c->err != REDIS_ERR_IO))
        return false;
    redisFree(rs->c);
    rs->c = NULL;
    rs->next_try_us = 0;
    return conn(rs) != NULL;
}

/* One command on the connection; a reply of the wrong kind is a failure.
 * NULL when it failed (already counted). */
static redisReply *command(redis_store *rs, int want, const char *fmt, ...)
{
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    redisReply *r = redisvCommand(rs->c, fmt, ap);
    if (!r && reconnect_now(rs))
        r = redisvCommand(rs->c, fmt, again);
    va_end(again);
    va_end(ap);
    rs->io.shared_round_trips++;
    if (!r || r->type != want) {
        char what[160];
        snprintf(what, sizeof(what), "%s", !r ? (rs->c ? rs->c->errstr : "connection lost")
                                          : r->type == REDIS_REPLY_ERROR ? r->str
                                                                         : "unexpected reply");
        if (r)
            freeReplyObject(r);
        failed(rs, what);
        return NULL;
    }
    return r;
}

/* The connection, (re)connected when it is time to try. NULL when down. A
 * new connection may be to a Redis that restarted empty: what we knew of its
 * keys is forgotten (rs->reconnected). */
static redisContext *conn(redis_store *rs)
{
    if (rs->c || kvc_time_us() < rs->next_try_us)
        return rs->c;
    rs->c = redisConnectWithTimeout(rs->host, rs->port, rs->timeout);
    if (!rs->c || rs->c->err || redisSetTimeout(rs->c, rs->timeout) != REDIS_OK) {
        failed(rs, rs->c ? rs->c->errstr : "out of memory");
        return NULL;
    }
    redisReply *r = NULL;
    if (rs->password[0] && rs->user[0])
        r = command(rs, REDIS_REPLY_STATUS, "AUTH %s %s", rs->user, rs->password);
    else if (rs->password[0])
        r = command(rs, REDIS_REPLY_STATUS, "AUTH %s", rs->password);
    if (r)
        freeReplyObject(r);
    if (rs->c && rs->db && (r = command(rs, REDIS_REPLY_STATUS, "SELECT %d", rs->db)))
        freeReplyObject(r);
    int64_t t0 = kvc_time_us();                     /* a first round trip, measured */
    if (rs->c && (r = command(rs, REDIS_REPLY_STATUS, "PING"))) {
        freeReplyObject(r);
        rs->ping_us = KVC_MAX(kvc_time_us() - t0, 1);
    }
    if (rs->c) {
        if (rs->warned)
            tell(rs, "the Redis tier at %s is back", rs->url);
        rs->warned = false;
        rs->reconnected = true;
        rs->io.shared_up = 1;
    }
    return rs->c;
}

/* ----------------------------------------------------------- what we saw */

static uint64_t *known_slot(redis_store *rs, uint64_t hash)
{
    return &rs->known[(hash ^ (hash >> 32)) & (KNOWN_SLOTS - 1)];
}

static bool known(redis_store *rs, uint64_t hash)
{
    return hash && *known_slot(rs, hash) == hash;
}

static void set_known(redis_store *rs, uint64_t hash, bool there)
{
    uint64_t *k = known_slot(rs, hash);
    if (there)
        *k = hash;
    else if (*k == hash)
        *k = 0;
}

static void key_of(redis_store *rs, const kvc_block_desc *d, char key[64])
{
    snprintf(key, 64, "kvc:%016llx:%016llx:%016llx", (unsigned long long)rs->fp,
             (unsigned long long)d->ns, (unsigned long long)d->hash);
}

/* ---------------------------------------------------------- the I/O side */

static void io_del(redis_store *rs, const kvc_block_desc *d)
{
    char key[64];
    key_of(rs, d, key);
    redisReply *r = conn(rs) ? command(rs, REDIS_REPLY_INTEGER, "DEL %s", key) : NULL;
    if (r)
        freeReplyObject(r);
}

static bool io_set(redis_store *rs, const kvc_block_desc *d, const uint8_t *rec, size_t size)
{
    char key[64];
    key_of(rs, d, key);
    redisReply *r = conn(rs) ? command(rs, REDIS_REPLY_STATUS, "SET %s %b", key,
                                       (const char *)rec, size) : NULL;
    if (!r)
        return false;
    freeReplyObject(r);
    rs->io.shared_blocks_written++;
    rs->io.shared_bytes_written += size;
    return true;
}

/* Send `cmd` for each block of j in one pipeline and read every reply into
 * replies[0, n) (NULL where none came). false when the connection broke. */
static bool pipeline(redis_store *rs, job *j, const char *cmd, redisReply **replies)
{
    char key[64];
    for (int64_t i = 0; i < j->n; i++) {
        key_of(rs, &j->d[i], key);
        redisAppendCommand(rs->c, "%s %s", cmd, key);
    }
    rs->io.shared_round_trips++;
    for (int64_t i = 0; i < j->n; i++) {
        void *rv = NULL;
        if (redisGetReply(rs->c, &rv) != REDIS_OK || !rv) {
            for (int64_t k = 0; k < i; k++) {
                freeReplyObject(replies[k]);
                replies[k] = NULL;
            }
            return false;                  /* the rest of the replies are lost with it */
        }
        replies[i] = rv;
    }
    return true;
}

/* pipeline, reconnecting once when the connection had broken (Redis
 * restarted); a failure is counted and told. */
static bool pipeline_once_more(redis_store *rs, job *j, const char *cmd, redisReply **replies)
{
    if (!conn(rs))
        return false;
    bool ok = pipeline(rs, j, cmd, replies);
    if (!ok && reconnect_now(rs))
        ok = pipeline(rs, j, cmd, replies);
    if (!ok)
        failed(rs, rs->c && rs->c->err ? rs->c->errstr : "connection lost");
    return ok;
}

/* GET every block of j in one pipeline; each verified: j->state B_THERE
 * (j->reply kept), B_MISSING, or B_BAD (a value that fails its check:
 * deleted and counted). */
static void io_fetch(redis_store *rs, job *j)
{
    int64_t t0 = kvc_time_us();
    if (!pipeline_once_more(rs, j, "GET", j->reply))
        return;
    j->rtt_us = kvc_time_us() - t0;
    for (int64_t i = 0; i < j->n; i++) {
        redisReply *r = j->reply[i];
        int rc = r->type == REDIS_REPLY_STRING
                     ? kvc_block_record_read(r->str, r->len, &j->d[i], NULL, 0, NULL)
                     : KVC_ERR_NOT_FOUND;
        if (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_NIL)
            rs->io.shared_failures++;
        j->state[i] = rc == KVC_OK ? B_THERE : rc == KVC_ERR_FORMAT ? B_BAD : B_MISSING;
        if (rc != KVC_OK) {
            freeReplyObject(r);
            j->reply[i] = NULL;
        }
        if (rc == KVC_ERR_FORMAT) {
            rs->io.shared_checksum_failures++;
            io_del(rs, &j->d[i]);
        }
    }
}

/* EXISTS for every block of j in one pipeline; those Redis lost are put
 * back from the local store where it has them (else forgotten, so that the
 * next write-through sends them). */
static void io_ensure(redis_store *rs, job *j)
{
    redisReply **rep = calloc((size_t)j->n, sizeof(*rep));
    if (!rep || !pipeline_once_more(rs, j, "EXISTS", rep)) {
        free(rep);
        return;
    }
    for (int64_t i = 0; i < j->n; i++) {
        bool there = rep[i]->type == REDIS_REPLY_INTEGER && rep[i]->integer == 1;
        freeReplyObject(rep[i]);
        j->state[i] = there ? B_THERE : B_MISSING;
        if (there || !rs->local || !rs->c)
            continue;
        if (j->kv_bytes > rs->buf_cap) {             /* the local block's K/V */
            uint8_t *g = realloc(rs->buf, j->kv_bytes);
            if (!g)
                continue;
            rs->buf = g;
            rs->buf_cap = j->kv_bytes;
        }
        pthread_mutex_lock(&rs->local_mu);
        int rc = kvc_bs_contains(rs->local, j->d[i].hash)
                     ? kvc_bs_get(rs->local, &j->d[i], rs->buf, j->kv_bytes, NULL)
                     : KVC_ERR_NOT_FOUND;
        pthread_mutex_unlock(&rs->local_mu);
        size_t size = kvc_block_record_size(j->d[i].n_tokens, j->kv_bytes);
        uint8_t *rec = rc == KVC_OK ? malloc(size) : NULL;
        if (!rec)
            continue;
        kvc_block_record_write(&j->d[i], rs->buf, j->kv_bytes, rec);
        if (io_set(rs, &j->d[i], rec, size))
            j->state[i] = B_THERE;
        free(rec);
    }
    free(rep);
}

/* The answers of a fetch, staged for their gets (the oldest, and stale
 * "missing" answers, make room). Under mu. */
static void stage_locked(redis_store *rs, job *j)
{
    int64_t now = kvc_time_us(), keep = 0;
    for (int64_t i = 0; i < rs->n_stage; i++) {
        staged *s = &rs->stage[i];
        bool drop = (s->state == B_MISSING && now - s->at_us > STAGE_FRESH_US) ||
                    rs->n_stage - i + j->n > rs->stage_cap;
        if (drop && s->reply)
            freeReplyObject(s->reply);
        if (!drop)
            rs->stage[keep++] = *s;
    }
    rs->n_stage = keep;
    for (int64_t i = 0; i < j->n && rs->n_stage < rs->stage_cap; i++) {
        if (j->state[i] != B_THERE && j->state[i] != B_MISSING)
            continue;
        rs->stage[rs->n_stage++] = (staged){ j->d[i].hash, j->state[i], now, j->reply[i] };
        j->reply[i] = NULL;
    }
}

/* A round trip measured (0: none), into the smoothed one. Under mu. */
static void fold_rtt_locked(redis_store *rs, int64_t us)
{
    if (us > 0)
        rs->rtt_us = rs->rtt_us ? (3 * rs->rtt_us + us) / 4 : us;
}

/* A job done: what it learned of Redis's keys, its answers, the counters. */
static void publish_locked(redis_store *rs, job *j)
{
    if (rs->reconnected)
        memset(rs->known, 0, KNOWN_SLOTS * sizeof(uint64_t));
    rs->reconnected = false;
    for (int64_t i = 0; i < j->n; i++)
        if (j->state[i] == B_THERE || j->state[i] == B_MISSING || j->state[i] == B_BAD)
            set_known(rs, j->d[i].hash, j->state[i] == B_THERE);
    if (j->kind == JOB_SET) {
        rs->queued_bytes -= j->rec_size;
        if (j->state[0] != B_THERE)
            set_known(rs, j->d[0].hash, false);      /* marked at put: not there after all */
    }
    if (j->kind == JOB_FETCH)
        stage_locked(rs, j);
    fold_rtt_locked(rs, j->rtt_us);
    fold_rtt_locked(rs, rs->ping_us);
    rs->ping_us = 0;
    rs->st.shared_up = rs->io.shared_up;
    rs->st.shared_blocks_written = rs->io.shared_blocks_written;
    rs->st.shared_bytes_written = rs->io.shared_bytes_written;
    rs->st.shared_round_trips = rs->io.shared_round_trips;
    rs->st.shared_failures = rs->io.shared_failures;
    rs->st.shared_checksum_failures = rs->io.shared_checksum_failures;
}

static void *io_main(void *arg)
{
    redis_store *rs = arg;
    int64_t drain_until = 0;
    pthread_mutex_lock(&rs->mu);
    for (;;) {
        while (!rs->fq && !rs->wq && !rs->stop)
            pthread_cond_wait(&rs->work_cv, &rs->mu);
        /* fetches first, but a write every third job at least: a stream of
         * fetches never starves the writes */
        job *j = rs->fq && (!rs->wq || rs->n_fetched_in_row < 2) ? rs->fq : rs->wq;
        if (!j)
            break;                                    /* stop, and nothing left */
        rs->n_fetched_in_row = j == rs->fq ? rs->n_fetched_in_row + 1 : 0;
        if (j == rs->fq) {
            rs->n_fq--;
            rs->fq = j->next;
            if (!rs->fq)
                rs->fq_tail = NULL;
        } else {
            rs->wq = j->next;
            if (!rs->wq)
                rs->wq_tail = NULL;
        }
        if (rs->stop && !drain_until)
            drain_until = kvc_time_us() + DRAIN_US;
        bool run = !drain_until || kvc_time_us() < drain_until;
        rs->busy = true;
        pthread_mutex_unlock(&rs->mu);
        if (run && j->kind == JOB_SET)
            j->state[0] = io_set(rs, &j->d[0], j->rec, j->rec_size) ? B_THERE : B_UNKNOWN;
        else if (run && j->kind == JOB_FETCH)
            io_fetch(rs, j);
        else if (run && j->kind == JOB_ENSURE)
            io_ensure(rs, j);
        pthread_mutex_lock(&rs->mu);
        publish_locked(rs, j);
        rs->busy = false;
        j->done = true;
        pthread_cond_broadcast(&rs->done_cv);
        unref_locked(j);
    }
    pthread_mutex_unlock(&rs->mu);
    return NULL;
}

/* ------------------------------------------------------------ operations */

/* The newest staged answer for hash, or NULL. Under mu. */
static staged *staged_of(redis_store *rs, uint64_t hash)
{
    for (int64_t i = rs->n_stage - 1; i >= 0; i--)
        if (rs->stage[i].hash == hash)
            return &rs->stage[i];
    return NULL;
}

/* How long a caller may wait for n blocks: wait_ms when set, else 20 ms and
 * 2 ms a block (less than computing a block's 16 tokens takes on a CPU for
 * any real model; a local Redis answers in well under a millisecond, but a
 * loaded machine may take a while to run the I/O thread), never more than
 * the command timeout. */
static int64_t wait_for(redis_store *rs, int64_t n)
{
    int64_t t = rs->wait_us ? rs->wait_us : 20000 + 2000 * n;
    int64_t cap = (int64_t)rs->timeout.tv_sec * 1000000 + rs->timeout.tv_usec;
    return KVC_MIN(t, cap);
}

/* Fetch run[0, n) on the I/O thread and wait for it up to the deadline
 * (its answers are staged whenever they come); when Redis's round trips have
 * been slower than that deadline, not at all (the answers serve the next
 * ask). Under mu. */
static void fetch_locked(redis_store *rs, const kvc_block_desc *run, int64_t n)
{
    const int64_t wait = wait_for(rs, n);
    const bool hopeless = rs->rtt_us > wait;
    job *j = rs->fq;                             /* the same run asked already? */
    while (j && !(j->d[0].hash == run[0].hash && j->n >= n))
        j = j->next;
    if (j && hopeless)
        return;
    if (!j) {
        if (rs->n_fq >= MAX_FETCHES || !(j = job_new(JOB_FETCH, run, n)))
            return;                              /* Redis is that far behind: not now */
        submit_locked(rs, j);
        if (hopeless)
            return;
    }
    j->refs++;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    int64_t ns = (int64_t)until.tv_nsec + wait * 1000;
    until.tv_sec += (time_t)(ns / 1000000000);
    until.tv_nsec = (long)(ns % 1000000000);
    while (!j->done && pthread_cond_timedwait(&rs->done_cv, &rs->mu, &until) == 0)
        ;
    unref_locked(j);
}

/* The queued SET of hash, or NULL. Under mu. */
static job *queued_set(redis_store *rs, uint64_t hash)
{
    for (job *j = rs->wq; j; j = j->next)
        if (j->kind == JOB_SET && j->d[0].hash == hash)
            return j;
    return NULL;
}

static int redis_put(kvc_block_store *bs, const kvc_block_desc *d, const void *kv,
                     size_t kv_bytes, kvc_err *err)
{
    redis_store *rs = (redis_store *)bs;
    int rc = KVC_OK;
    if (rs->local) {
        pthread_mutex_lock(&rs->local_mu);
        rc = kvc_bs_put(rs->local, d, kv, kv_bytes, err);
        pthread_mutex_unlock(&rs->local_mu);
    }
    pthread_mutex_lock(&rs->mu);
    bool skip = known(rs, d->hash) || queued_set(rs, d->hash) ||
                rs->queued_bytes >= QUEUE_BYTES;       /* Redis failing fails no one */
    pthread_mutex_unlock(&rs->mu);
    if (skip)
        return rc;
    job *j = job_new(JOB_SET, d, 1);
    size_t size = kvc_block_record_size(d->n_tokens, kv_bytes);
    if (j && !(j->rec = malloc(size))) {
        job_free(j);
        j = NULL;
    }
    if (!j)
        return rs->local ? rc : kvc_fail(err, KVC_ERR_NOMEM, "redis tier: out of memory");
    kvc_block_record_write(d, kv, kv_bytes, j->rec);
    j->rec_size = size;
    pthread_mutex_lock(&rs->mu);
    set_known(rs, d->hash, true);                      /* on its way; unmarked if it fails */
    submit_locked(rs, j);
    pthread_mutex_unlock(&rs->mu);
    return rc;
}

/* Read d from its staged answer or its queued SET, under mu. KVC_ERR_NOT_FOUND
 * when neither holds it. */
static int read_staged_locked(redis_store *rs, const kvc_block_desc *d, void *kv,
                              size_t kv_bytes, kvc_err *err)
{
    staged *s = staged_of(rs, d->hash);
    if (s && s->reply) {
        redisReply *r = s->reply;
        s->reply = NULL;                               /* one get per fetched block */
        s->state = B_MISSING;
        s->at_us = 0;                                  /* stale at once */
        int rc = kvc_block_record_read(r->str, r->len, d, kv, kv_bytes, err);
        if (!rc) {
            rs->st.shared_blocks_read++;
            rs->st.shared_bytes_read += (uint64_t)r->len;
        }
        freeReplyObject(r);
        return rc;
    }
    job *q = queued_set(rs, d->hash);
    if (q)
        return kvc_block_record_read(q->rec, q->rec_size, d, kv, kv_bytes, err);
    return kvc_fail(err, KVC_ERR_NOT_FOUND, "redis tier: no block %016llx",
                    (unsigned long long)d->hash);
}

static int redis_get(kvc_block_store *bs, const kvc_block_desc *d, void *kv, size_t kv_bytes,
                     kvc_err *err)
{
    redis_store *rs = (redis_store *)bs;
    pthread_mutex_lock(&rs->mu);
    int rc = read_staged_locked(rs, d, kv, kv_bytes, err);
    pthread_mutex_unlock(&rs->mu);
    if (rc != KVC_ERR_NOT_FOUND)
        return rc;
    if (rs->local) {
        pthread_mutex_lock(&rs->local_mu);
        rc = kvc_bs_contains(rs->local, d->hash) ? kvc_bs_get(rs->local, d, kv, kv_bytes, err)
                                                 : KVC_ERR_NOT_FOUND;
        pthread_mutex_unlock(&rs->local_mu);
        if (rc != KVC_ERR_NOT_FOUND && rc != KVC_ERR_FORMAT)
            return rc;
    }
    pthread_mutex_lock(&rs->mu);                       /* one GET, within the deadline */
    fetch_locked(rs, d, 1);
    rc = read_staged_locked(rs, d, kv, kv_bytes, err);
    pthread_mutex_unlock(&rs->mu);
    return rc;
}

/* How many of run[0, n) have a staged answer, and how many leading ones of
 * those are there. Under mu. */
static int64_t staged_run_locked(redis_store *rs, const kvc_block_desc *run, int64_t n,
                                 int64_t *covered)
{
    int64_t got = 0, now = kvc_time_us();
    *covered = 0;
    for (int64_t i = 0; i < n; i++) {
        staged *s = staged_of(rs, run[i].hash);
        if (!s || (s->state == B_MISSING && now - s->at_us > STAGE_FRESH_US))
            break;
        (*covered)++;
        if (got == i && s->reply)
            got++;
    }
    return got;
}

/* The run's blocks that the local store lacks: the answers of an earlier
 * fetch when staged, else fetched with one pipeline on the I/O thread, waited
 * for up to the deadline. Returns how many leading blocks of the run can be
 * given now. */
static int64_t redis_prefetch(kvc_block_store *bs, const kvc_block_desc *run, int64_t n)
{
    redis_store *rs = (redis_store *)bs;
    int64_t k = 0;
    if (rs->local) {
        pthread_mutex_lock(&rs->local_mu);
        while (k < n && kvc_bs_contains(rs->local, run[k].hash))
            k++;
        pthread_mutex_unlock(&rs->local_mu);
    }
    int64_t want = KVC_MIN(n - k, (int64_t)rs->max_run), covered = 0;
    if (want <= 0)
        return k;
    pthread_mutex_lock(&rs->mu);
    int64_t got = staged_run_locked(rs, run + k, want, &covered);
    if (covered == 0) {
        fetch_locked(rs, run + k, want);
        got = staged_run_locked(rs, run + k, want, &covered);
    }
    pthread_mutex_unlock(&rs->mu);
    return k + got;
}

static bool redis_contains(kvc_block_store *bs, uint64_t hash)
{
    redis_store *rs = (redis_store *)bs;
    bool c;
    if (rs->local) {
        pthread_mutex_lock(&rs->local_mu);
        c = kvc_bs_contains(rs->local, hash);
        pthread_mutex_unlock(&rs->local_mu);
    } else {
        pthread_mutex_lock(&rs->mu);
        c = known(rs, hash);
        pthread_mutex_unlock(&rs->mu);
    }
    return c;
}

/* Only the local copy: Redis's keys are every instance's to keep. */
static int redis_remove(kvc_block_store *bs, uint64_t hash)
{
    redis_store *rs = (redis_store *)bs;
    if (!rs->local)
        return KVC_ERR_NOT_FOUND;
    pthread_mutex_lock(&rs->local_mu);
    int rc = kvc_bs_remove(rs->local, hash);
    pthread_mutex_unlock(&rs->local_mu);
    return rc;
}

static void redis_iterate(kvc_block_store *bs, kvc_bs_iter_fn fn, void *user)
{
    redis_store *rs = (redis_store *)bs;
    if (!rs->local)
        return;
    pthread_mutex_lock(&rs->local_mu);
    kvc_bs_iterate(rs->local, fn, user);
    pthread_mutex_unlock(&rs->local_mu);
}

static void redis_stats(kvc_block_store *bs, kvc_bs_stats *st)
{
    redis_store *rs = (redis_store *)bs;
    memset(st, 0, sizeof(*st));
    if (rs->local) {
        pthread_mutex_lock(&rs->local_mu);
        kvc_bs_stats_get(rs->local, st);
        pthread_mutex_unlock(&rs->local_mu);
    }
    pthread_mutex_lock(&rs->mu);
    kvc_bs_stats own = rs->st;
    int32_t pending = rs->busy;
    for (const job *j = rs->wq; j; j = j->next)
        pending++;
    pending += rs->n_fq;
    pthread_mutex_unlock(&rs->mu);
    st->shared_pending = pending;
    st->shared_up = own.shared_up;
    st->shared_blocks_read = own.shared_blocks_read;
    st->shared_blocks_written = own.shared_blocks_written;
    st->shared_bytes_read = own.shared_bytes_read;
    st->shared_bytes_written = own.shared_bytes_written;
    st->shared_round_trips = own.shared_round_trips;
    st->shared_failures = own.shared_failures;
    st->shared_checksum_failures = own.shared_checksum_failures;
}

/* Check the chain in Redis in the background and put back what it lost. */
static void redis_refresh(kvc_block_store *bs, const kvc_block_desc *run, int64_t n,
                          size_t kv_bytes)
{
    redis_store *rs = (redis_store *)bs;
    pthread_mutex_lock(&rs->mu);
    bool busy_already = false;                 /* the same chain's check is queued */
    for (job *q = rs->wq; q && !busy_already; q = q->next)
        busy_already = q->kind == JOB_ENSURE && q->n == n && q->d[n - 1].hash == run[n - 1].hash;
    pthread_mutex_unlock(&rs->mu);
    job *j = busy_already ? NULL : job_new(JOB_ENSURE, run, n);
    if (!j)
        return;
    j->kv_bytes = kv_bytes;
    pthread_mutex_lock(&rs->mu);
    submit_locked(rs, j);
    pthread_mutex_unlock(&rs->mu);
}

static void redis_flush(kvc_block_store *bs)
{
    redis_store *rs = (redis_store *)bs;
    pthread_mutex_lock(&rs->mu);
    while (rs->fq || rs->wq || rs->busy)
        pthread_cond_wait(&rs->done_cv, &rs->mu);
    pthread_mutex_unlock(&rs->mu);
}

static void redis_close(kvc_block_store *bs)
{
    redis_store *rs = (redis_store *)bs;
    if (rs->started) {
        pthread_mutex_lock(&rs->mu);
        rs->stop = true;
        pthread_cond_signal(&rs->work_cv);
        pthread_mutex_unlock(&rs->mu);
        pthread_join(rs->thread, NULL);              /* it runs or drops what is queued */
    }
    for (int64_t i = 0; rs->stage && i < rs->n_stage; i++)
        if (rs->stage[i].reply)
            freeReplyObject(rs->stage[i].reply);
    if (rs->c)
        redisFree(rs->c);
    kvc_bs_close(rs->local);
    pthread_mutex_destroy(&rs->local_mu);
    pthread_mutex_destroy(&rs->mu);
    pthread_cond_destroy(&rs->work_cv);
    pthread_cond_destroy(&rs->done_cv);
    free(rs->stage);
    free(rs->known);
    free(rs->buf);
    free(rs);
}

static const kvc_block_store_ops redis_ops = {
    "redis", redis_put, redis_get, redis_contains, redis_remove, redis_iterate, redis_stats,
    redis_close, redis_prefetch, redis_refresh, redis_flush,
};

/* ------------------------------------------------------------------ open */

int kvc_redis_parse_url(const char *url, char *host, size_t hsize, int *port, int *db,
                        char *user, size_t usize, char *password, size_t psize, kvc_err *err)
{
    const char *p = url && strncmp(url, "redis://", 8) == 0 ? url + 8 : NULL;
    if (!p)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "redis URL '%s': not redis://host[:port][/db]",
                        url ? url : "");
    *port = 6379;
    *db = 0;
    user[0] = password[0] = '\0';
    const char *at = strrchr(p, '@');
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        size_t ul = colon ? (size_t)(colon - p) : 0;
        size_t pl = colon ? (size_t)(at - colon - 1) : (size_t)(at - p);
        if (ul >= usize || pl >= psize)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "redis URL: user or password too long");
        memcpy(user, p, ul);
        user[ul] = '\0';
        memcpy(password, colon ? colon + 1 : p, pl);
        password[pl] = '\0';
        p = at + 1;
    }
    size_t hl = strcspn(p, ":/");
    if (hl == 0 || hl >= hsize)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "redis URL '%s': no host", url);
    memcpy(host, p, hl);
    host[hl] = '\0';
    p += hl;
    char *end;
    if (*p == ':') {
        long v = strtol(p + 1, &end, 10);
        if (end == p + 1 || v <= 0 || v > 65535)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "redis URL '%s': bad port", url);
        *port = (int)v;
        p = end;
    }
    if (*p == '/' && p[1]) {
        long v = strtol(p + 1, &end, 10);
        if (end == p + 1 || *end || v < 0 || v > 100000)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "redis URL '%s': bad database", url);
        *db = (int)v;
    } else if (*p && strcmp(p, "/") != 0) {
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "redis URL '%s': unexpected '%s'", url, p);
    }
    return KVC_OK;
}

int kvc_redis_store_open(const kvc_redis_store_params *p, kvc_block_store *local,
                         kvc_block_store **out, kvc_err *err)
{
    *out = NULL;
    redis_store *rs = calloc(1, sizeof(*rs));
    if (!rs) {
        kvc_bs_close(local);
        return kvc_fail(err, KVC_ERR_NOMEM, "redis tier: out of memory");
    }
    rs->base.ops = &redis_ops;
    rs->local = local;
    int rc = kvc_redis_parse_url(p->url, rs->host, sizeof(rs->host), &rs->port, &rs->db,
                                 rs->user, sizeof(rs->user), rs->password, sizeof(rs->password),
                                 err);
    if (!rc && p->password && snprintf(rs->password, sizeof(rs->password), "%s", p->password) >=
                                  (int)sizeof(rs->password))
        rc = kvc_fail(err, KVC_ERR_INVALID_ARG, "redis tier: password too long");
    rs->max_run = p->max_run > 0 ? p->max_run : 1024;
    rs->stage_cap = 2 * (int64_t)rs->max_run;
    rs->stage = calloc((size_t)rs->stage_cap, sizeof(staged));
    rs->known = calloc(KNOWN_SLOTS, sizeof(uint64_t));
    pthread_mutex_init(&rs->local_mu, NULL);
    pthread_mutex_init(&rs->mu, NULL);
    pthread_cond_init(&rs->work_cv, NULL);
    pthread_cond_init(&rs->done_cv, NULL);
    if (!rc && (!rs->stage || !rs->known))
        rc = kvc_fail(err, KVC_ERR_NOMEM, "redis tier: out of memory");
    snprintf(rs->url, sizeof(rs->url), "redis://%s:%d/%d", rs->host, rs->port, rs->db);
    rs->fp = p->model_fp;
    int32_t ms = p->timeout_ms > 0 ? p->timeout_ms : 200;
    rs->timeout = (struct timeval){ ms / 1000, (ms % 1000) * 1000 };
    rs->retry_us = (int64_t)(p->retry_ms > 0 ? p->retry_ms : 1000) * 1000;
    rs->wait_us = p->wait_ms > 0 ? (int64_t)p->wait_ms * 1000 : 0;
    rs->warn = p->warn;
    rs->warn_user = p->warn_user;
    if (!rc) {
        (void)conn(rs);                              /* down now: told, retried later */
        rs->st.shared_up = rs->io.shared_up;
        rs->st.shared_round_trips = rs->io.shared_round_trips;
        rs->st.shared_failures = rs->io.shared_failures;
        rs->reconnected = false;
        fold_rtt_locked(rs, rs->ping_us);
        rs->ping_us = 0;
        rs->started = pthread_create(&rs->thread, NULL, io_main, rs) == 0;
        if (!rs->started)
            rc = kvc_fail(err, KVC_ERR_NOMEM, "redis tier: cannot start its I/O thread");
    }
    if (rc) {
        redis_close(&rs->base);
        return rc;
    }
    *out = &rs->base;
    return KVC_OK;
}
