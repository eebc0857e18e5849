/* block_store_redis.c - the shared tier: the local store continued into Redis
 * (hiredis, blocking calls bounded by timeouts; see block_store_redis.h). */
#include "block_store_redis.h"

#include <hiredis/hiredis.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KNOWN_SLOTS 65536   /* hashes seen in Redis, direct-mapped (a power of two) */

/* A block the last prefetch fetched, verified, waiting for its get. */
typedef struct staged {
    uint64_t    hash;
    redisReply *reply;        /* owned; its string is the block's record */
} staged;

typedef struct redis_store {
    kvc_block_store  base;
    kvc_block_store *local;   /* owned; NULL = Redis alone */
    redisContext    *c;       /* NULL while down */
    char             host[256], user[128], password[256];
    int              port, db;
    char             url[300];          /* for messages, without the password */
    uint64_t         fp;
    struct timeval   timeout;
    int64_t          retry_us, next_try_us;
    bool             warned;            /* an outage was told and not yet its end */
    int32_t          max_run;
    staged          *stage;             /* [max_run] */
    int64_t          n_stage;
    uint64_t        *known;             /* [KNOWN_SLOTS]: hashes seen in Redis, 0 = none */
    uint8_t         *rec;               /* a record being written; rec_cap bytes */
    size_t           rec_cap;
    void           (*warn)(void *, const char *);
    void            *warn_user;
    kvc_bs_stats     st;                /* the shared_* fields; the rest is the local's */
} redis_store;

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
    rs->st.shared_failures++;
    rs->st.shared_up = 0;
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
    rs->st.shared_round_trips++;
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

/* The connection, (re)connected when it is time to try. NULL when down. */
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
    if (rs->c) {
        if (rs->warned)
            tell(rs, "the Redis tier at %s is back", rs->url);
        rs->warned = false;
        rs->st.shared_up = 1;
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

static void key_of(redis_store *rs, const kvc_block_desc *d, char key[64])
{
    snprintf(key, 64, "kvc:%016llx:%016llx:%016llx", (unsigned long long)rs->fp,
             (unsigned long long)d->ns, (unsigned long long)d->hash);
}

static void unstage(redis_store *rs)
{
    for (int64_t i = 0; i < rs->n_stage; i++)
        if (rs->stage[i].reply)
            freeReplyObject(rs->stage[i].reply);
    rs->n_stage = 0;
}

/* A value that failed its check: counted, and deleted so nobody reads it again. */
static void discard_value(redis_store *rs, const kvc_block_desc *d)
{
    char key[64];
    key_of(rs, d, key);
    rs->st.shared_checksum_failures++;
    *known_slot(rs, d->hash) = 0;
    redisReply *r = conn(rs) ? command(rs, REDIS_REPLY_INTEGER, "DEL %s", key) : NULL;
    if (r)
        freeReplyObject(r);
}

/* ------------------------------------------------------------ operations */

static int redis_put(kvc_block_store *bs, const kvc_block_desc *d, const void *kv,
                     size_t kv_bytes, kvc_err *err)
{
    redis_store *rs = (redis_store *)bs;
    int rc = rs->local ? kvc_bs_put(rs->local, d, kv, kv_bytes, err) : KVC_OK;
    if (known(rs, d->hash) || !conn(rs))
        return rs->local ? rc : KVC_OK;          /* Redis failing fails no one */
    size_t size = kvc_block_record_size(d->n_tokens, kv_bytes);
    if (size > rs->rec_cap) {
        uint8_t *g = realloc(rs->rec, size);
        if (!g)
            return rs->local ? rc : kvc_fail(err, KVC_ERR_NOMEM, "redis tier: out of memory");
        rs->rec = g;
        rs->rec_cap = size;
    }
    kvc_block_record_write(d, kv, kv_bytes, rs->rec);
    char key[64];
    key_of(rs, d, key);
    redisReply *r = command(rs, REDIS_REPLY_STATUS, "SET %s %b", key, (const char *)rs->rec,
                            size);
    if (r) {
        freeReplyObject(r);
        *known_slot(rs, d->hash) = d->hash;
        rs->st.shared_blocks_written++;
        rs->st.shared_bytes_written += size;
    }
    return rc;
}

/* Take a verified value for d into kv: counted and remembered. */
static int take(redis_store *rs, const kvc_block_desc *d, const redisReply *r, void *kv,
                size_t kv_bytes, kvc_err *err)
{
    int rc = kvc_block_record_read(r->str, r->len, d, kv, kv_bytes, err);
    if (rc == KVC_ERR_FORMAT)
        discard_value(rs, d);
    if (rc)
        return rc;
    rs->st.shared_blocks_read++;
    rs->st.shared_bytes_read += (uint64_t)r->len;
    *known_slot(rs, d->hash) = d->hash;
    return KVC_OK;
}

static int redis_get(kvc_block_store *bs, const kvc_block_desc *d, void *kv, size_t kv_bytes,
                     kvc_err *err)
{
    redis_store *rs = (redis_store *)bs;
    for (int64_t i = 0; i < rs->n_stage; i++) {
        staged *s = &rs->stage[i];
        if (s->hash != d->hash || !s->reply)
            continue;
        int rc = take(rs, d, s->reply, kv, kv_bytes, err);
        freeReplyObject(s->reply);                 /* one get per prefetched block */
        s->reply = NULL;
        return rc;
    }
    if (rs->local && kvc_bs_contains(rs->local, d->hash)) {
        int rc = kvc_bs_get(rs->local, d, kv, kv_bytes, err);
        if (rc != KVC_ERR_NOT_FOUND && rc != KVC_ERR_FORMAT)
            return rc;
    }
    if (!conn(rs))
        return kvc_fail(err, KVC_ERR_NOT_FOUND, "redis tier: down");
    char key[64];
    key_of(rs, d, key);
    redisReply *r = redisCommand(rs->c, "GET %s", key);
    rs->st.shared_round_trips++;
    if (r && r->type == REDIS_REPLY_NIL) {
        freeReplyObject(r);
        *known_slot(rs, d->hash) = 0;
        return kvc_fail(err, KVC_ERR_NOT_FOUND, "redis tier: no block %016llx",
                        (unsigned long long)d->hash);
    }
    if (!r || r->type != REDIS_REPLY_STRING) {
        if (r)
            freeReplyObject(r);
        failed(rs, r ? "unexpected reply to GET" : rs->c->errstr);
        return kvc_fail(err, KVC_ERR_IO, "redis tier: GET failed");
    }
    int rc = take(rs, d, r, kv, kv_bytes, err);
    freeReplyObject(r);
    return rc;
}

/* GET every block of run[0, n) in one pipeline (every command sent, then
 * every reply read); the leading run of sound values is staged. Returns its
 * length, or -1 when the connection broke or answered garbage (nothing
 * staged). *bad: the index of a corrupt value that ended the run, or -1. */
static int64_t pipeline_get(redis_store *rs, const kvc_block_desc *run, int64_t n, int64_t *bad)
{
    char key[64];
    for (int64_t i = 0; i < n; i++) {
        key_of(rs, &run[i], key);
        redisAppendCommand(rs->c, "GET %s", key);
    }
    rs->st.shared_round_trips++;
    int64_t got = 0;
    bool broken = false;
    *bad = -1;
    for (int64_t i = 0; i < n; i++) {
        void *rv = NULL;
        if (redisGetReply(rs->c, &rv) != REDIS_OK || !rv) {
            broken = true;                 /* the rest of the replies are lost with it */
            break;
        }
        redisReply *r = rv;
        bool more = got == i && *bad < 0;  /* a run ends at its first gap */
        if (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_NIL)
            broken = true;
        int rc = more && r->type == REDIS_REPLY_STRING
                     ? kvc_block_record_read(r->str, r->len, &run[i], NULL, 0, NULL)
                     : KVC_ERR_NOT_FOUND;
        if (more && rc == KVC_OK) {
            rs->stage[rs->n_stage++] = (staged){ run[i].hash, r };
            got++;
            continue;
        }
        if (more && rc == KVC_ERR_FORMAT)
            *bad = i;
        freeReplyObject(r);
    }
    if (broken)
        unstage(rs);
    return broken ? -1 : got;
}

/* The run's blocks that the local store lacks, fetched with one pipeline
 * (every GET sent, then every reply read) and kept for their get until the
 * next prefetch. Returns how many leading blocks of the run can be given. */
static int64_t redis_prefetch(kvc_block_store *bs, const kvc_block_desc *run, int64_t n)
{
    redis_store *rs = (redis_store *)bs;
    unstage(rs);
    int64_t k = 0;
    while (k < n && rs->local && kvc_bs_contains(rs->local, run[k].hash))
        k++;
    int64_t want = KVC_MIN(n - k, (int64_t)rs->max_run);
    if (want <= 0 || !conn(rs))
        return k;
    int64_t bad = -1;                          /* a corrupt value, deleted below */
    int64_t got = pipeline_get(rs, run + k, want, &bad);
    if (got < 0 && reconnect_now(rs))
        got = pipeline_get(rs, run + k, want, &bad);
    if (got < 0) {
        failed(rs, rs->c && rs->c->err ? rs->c->errstr : "unexpected reply to GET");
        return k;
    }
    if (bad >= 0)
        discard_value(rs, &run[k + bad]);
    return k + got;
}

static bool redis_contains(kvc_block_store *bs, uint64_t hash)
{
    redis_store *rs = (redis_store *)bs;
    return rs->local ? kvc_bs_contains(rs->local, hash) : known(rs, hash);
}

/* Only the local copy: Redis's keys are every instance's to keep. */
static int redis_remove(kvc_block_store *bs, uint64_t hash)
{
    redis_store *rs = (redis_store *)bs;
    return rs->local ? kvc_bs_remove(rs->local, hash) : KVC_ERR_NOT_FOUND;
}

static void redis_iterate(kvc_block_store *bs, kvc_bs_iter_fn fn, void *user)
{
    redis_store *rs = (redis_store *)bs;
    if (rs->local)
        kvc_bs_iterate(rs->local, fn, user);
}

static void redis_stats(kvc_block_store *bs, kvc_bs_stats *st)
{
    redis_store *rs = (redis_store *)bs;
    kvc_bs_stats own = rs->st;
    memset(st, 0, sizeof(*st));
    if (rs->local)
        kvc_bs_stats_get(rs->local, st);
    st->shared_up = own.shared_up;
    st->shared_blocks_read = own.shared_blocks_read;
    st->shared_blocks_written = own.shared_blocks_written;
    st->shared_bytes_read = own.shared_bytes_read;
    st->shared_bytes_written = own.shared_bytes_written;
    st->shared_round_trips = own.shared_round_trips;
    st->shared_failures = own.shared_failures;
    st->shared_checksum_failures = own.shared_checksum_failures;
}

static void redis_close(kvc_block_store *bs)
{
    redis_store *rs = (redis_store *)bs;
    if (rs->stage)
        unstage(rs);
    if (rs->c)
        redisFree(rs->c);
    kvc_bs_close(rs->local);
    free(rs->stage);
    free(rs->known);
    free(rs->rec);
    free(rs);
}

static const kvc_block_store_ops redis_ops = {
    "redis", redis_put, redis_get, redis_contains, redis_remove, redis_iterate, redis_stats,
    redis_close, redis_prefetch,
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
    rs->stage = calloc((size_t)rs->max_run, sizeof(staged));
    rs->known = calloc(KNOWN_SLOTS, sizeof(uint64_t));
    if (!rc && (!rs->stage || !rs->known))
        rc = kvc_fail(err, KVC_ERR_NOMEM, "redis tier: out of memory");
    if (rc) {
        redis_close(&rs->base);
        return rc;
    }
    snprintf(rs->url, sizeof(rs->url), "redis://%s:%d/%d", rs->host, rs->port, rs->db);
    rs->fp = p->model_fp;
    int32_t ms = p->timeout_ms > 0 ? p->timeout_ms : 200;
    rs->timeout = (struct timeval){ ms / 1000, (ms % 1000) * 1000 };
    rs->retry_us = (int64_t)(p->retry_ms > 0 ? p->retry_ms : 1000) * 1000;
    rs->warn = p->warn;
    rs->warn_user = p->warn_user;
    (void)conn(rs);                                  /* down now: told, retried later */
    *out = &rs->base;
    return KVC_OK;
}
