/* test_block_store_redis.c - the shared tier (block_store_redis.h) against a
 * redis-server of its own on a free loopback port. Skips (77) with a message
 * when redis-server is not installed (scripts/install-deps.sh installs it).
 *
 *  1. URLs: host, port, db, user and password read; bad ones refused.
 *  2. Two instances (each its own disk directory, one Redis): what one puts,
 *     the other prefetches as one run in exactly one round trip and gets
 *     back bit for bit; the keys name the model fingerprint, the namespace
 *     and the hash; a run stops at the first missing block.
 *  3. Corruption: a value overwritten with garbage, and one with a flipped
 *     byte: detected (both in the one fetch), counted, deleted, never
 *     returned; the run ends there.
 *  4. Redis killed: every call returns at once or within the timeout, none
 *     fails the caller (puts still reach the disk), failures are counted and
 *     told once; Redis back: used again without being asked to.
 *  5. Redis alone (no disk): contains answers from what was seen. */
#include <sys/time.h>

#include "block_store_redis.h"
#include "redis_proc.h"
#include "test.h"

#define B        16
#define KV_BYTES (24 * 1024)
#define FP       0x1234abcd5678ef00ull
#define NBLK     24

static char root[256];

typedef struct blk {
    int32_t        tokens[B];
    kvc_block_desc d;
    uint8_t        kv[KV_BYTES];
} blk;

static blk chain[NBLK];   /* one conversation's blocks: each the parent of the next */

static void make_chain(void)
{
    uint64_t parent = 0x5eed;
    for (int i = 0; i < NBLK; i++) {
        blk *b = &chain[i];
        for (int j = 0; j < B; j++)
            b->tokens[j] = i * 1000 + j;
        uint64_t h = parent * 0x9e3779b97f4a7c15ull + (uint64_t)i + 1;
        b->d = (kvc_block_desc){ h, parent, B, b->tokens, 7 };
        for (size_t k = 0; k < KV_BYTES; k++)
            b->kv[k] = (uint8_t)(h >> (k % 56)) ^ (uint8_t)k;
        parent = h;
    }
}

static int warnings;
static void on_warn(void *user, const char *msg)
{
    (void)user;
    warnings++;
    fprintf(stderr, "  (told: %s)\n", msg);
}

static kvc_block_store *open_store(const char *sub, int port, bool with_disk)
{
    char dir[300], url[64];
    snprintf(dir, sizeof(dir), "%s/%s", root, sub);
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/0", port);
    kvc_block_store *local = NULL, *bs = NULL;
    kvc_disk_store_params dp = { dir, 64 << 20, false };
    kvc_err err = { 0 };
    if (with_disk && kvc_disk_store_open(&dp, &local, &err) != KVC_OK) {
        fprintf(stderr, "disk: %s\n", err.msg);
        return NULL;
    }
    /* wait_ms (capped by timeout_ms): a loaded machine (or a sanitizer) must
     * not make a local Redis miss its deadline here; test_tiers's far Redis
     * tests the default deadline */
    kvc_redis_store_params rp = { .url = url, .model_fp = FP, .timeout_ms = 1000,
                                  .retry_ms = 300, .wait_ms = 1000, .warn = on_warn };
    if (kvc_redis_store_open(&rp, local, &bs, &err) != KVC_OK)
        fprintf(stderr, "redis: %s\n", err.msg);
    return bs;
}

static redisReply *cmd(int port, const char *fmt, const char *key, const void *v, size_t n)
{
    struct timeval tv = { 1, 0 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    redisReply *r = c && !c->err ? redisCommand(c, fmt, key, v, n) : NULL;
    if (c)
        redisFree(c);
    return r;
}

static void key_of(const blk *b, char *key)
{
    sprintf(key, "kvc:%016llx:%016llx:%016llx", (unsigned long long)FP,
            (unsigned long long)b->d.ns, (unsigned long long)b->d.hash);
}

static kvc_block_desc run[NBLK];

static int64_t prefetch_all(kvc_block_store *bs, int from)
{
    for (int i = from; i < NBLK; i++)
        run[i - from] = chain[i].d;
    return kvc_bs_prefetch(bs, run, NBLK - from);
}

static void test_urls(void)
{
    char host[64], user[32], pw[32];
    int port, db;
    CHECK(kvc_redis_parse_url("redis://h.example:7000/3", host, sizeof(host), &port, &db, user,
                              sizeof(user), pw, sizeof(pw), NULL) == KVC_OK);
    CHECK(!strcmp(host, "h.example") && port == 7000 && db == 3 && !pw[0] && !user[0]);
    CHECK(kvc_redis_parse_url("redis://:s3cret@10.0.0.1", host, sizeof(host), &port, &db, user,
                              sizeof(user), pw, sizeof(pw), NULL) == KVC_OK);
    CHECK(!strcmp(host, "10.0.0.1") && port == 6379 && db == 0 && !strcmp(pw, "s3cret"));
    CHECK(kvc_redis_parse_url("redis://bob:pw@h:1/", host, sizeof(host), &port, &db, user,
                              sizeof(user), pw, sizeof(pw), NULL) == KVC_OK);
    CHECK(!strcmp(user, "bob") && !strcmp(pw, "pw") && port == 1);
    const char *bad[] = { "http://h", "redis://", "redis://h:0", "redis://h:99999",
                          "redis://h/x", "redis://h:12x" };
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad); i++)
        CHECKF(kvc_redis_parse_url(bad[i], host, sizeof(host), &port, &db, user, sizeof(user),
                                   pw, sizeof(pw), NULL) == KVC_ERR_INVALID_ARG, "%s", bad[i]);
}

static void test_share(int port)
{
    kvc_block_store *a = open_store("a", port, true), *b = open_store("b", port, true);
    CHECK(a && b);
    if (!a || !b)
        goto out;
    for (int i = 0; i < NBLK - 4; i++)                     /* the last 4 never written */
        CHECK(kvc_bs_put(a, &chain[i].d, chain[i].kv, KV_BYTES, NULL) == KVC_OK);
    kvc_bs_flush(a);                                       /* the SETs run in the background */
    kvc_bs_stats st;
    kvc_bs_stats_get(a, &st);
    CHECK_EQ_INT(st.shared_blocks_written, NBLK - 4);
    CHECK_EQ_INT(st.n_blocks, NBLK - 4);                  /* on a's disk as well */
    CHECK_EQ_INT(st.shared_up, 1);
    char key[80];
    key_of(&chain[0], key);
    redisReply *r = cmd(port, "EXISTS %s", key, NULL, 0);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
    if (r)
        freeReplyObject(r);

    CHECK(!kvc_bs_contains(b, chain[0].d.hash));          /* not on b's disk */
    kvc_bs_stats_get(b, &st);
    uint64_t trips = st.shared_round_trips;
    CHECK_EQ_INT(prefetch_all(b, 0), NBLK - 4);
    kvc_bs_stats_get(b, &st);
    CHECK_EQ_INT(st.shared_round_trips - trips, 1);        /* the run in one round trip */
    static uint8_t kv[KV_BYTES];
    for (int i = 0; i < NBLK - 4; i++) {
        memset(kv, 0, sizeof(kv));
        CHECK(kvc_bs_get(b, &chain[i].d, kv, KV_BYTES, NULL) == KVC_OK);
        CHECK(memcmp(kv, chain[i].kv, KV_BYTES) == 0);
    }
    kvc_bs_stats_get(b, &st);
    CHECK_EQ_INT(st.shared_round_trips - trips, 1);        /* the gets read what was fetched */
    CHECK_EQ_INT(st.shared_blocks_read, NBLK - 4);
    /* a block of another namespace is another key */
    kvc_block_desc other = chain[0].d;
    other.ns = 8;
    CHECK_EQ_INT(kvc_bs_prefetch(b, &other, 1), 0);
    /* b's writer puts what it read down to its disk; Redis is not written again
     * (but for block 0, which the miss above, under the same hash, unmarked) */
    for (int i = 1; i < NBLK - 4; i++)
        CHECK(kvc_bs_put(b, &chain[i].d, chain[i].kv, KV_BYTES, NULL) == KVC_OK);
    kvc_bs_flush(b);
    kvc_bs_stats_get(b, &st);
    CHECK_EQ_INT(st.n_blocks, NBLK - 5);
    CHECK_EQ_INT(st.shared_blocks_written, 0);
out:
    kvc_bs_close(a);
    kvc_bs_close(b);
}

static void test_corrupt(int port)
{
    kvc_block_store *c = open_store("c", port, true);
    CHECK(c != NULL);
    if (!c)
        return;
    char key[80];
    key_of(&chain[3], key);                                /* garbage */
    redisReply *r = cmd(port, "SET %s %b", key, "not a block", 11);
    CHECK(r && r->type == REDIS_REPLY_STATUS);
    if (r)
        freeReplyObject(r);
    key_of(&chain[10], key);                               /* one flipped byte */
    r = cmd(port, "GET %s", key, NULL, 0);
    CHECK(r && r->type == REDIS_REPLY_STRING);
    if (r && r->type == REDIS_REPLY_STRING) {
        r->str[r->len - 100] ^= 0x10;
        redisReply *w = cmd(port, "SET %s %b", key, r->str, r->len);
        if (w)
            freeReplyObject(w);
    }
    if (r)
        freeReplyObject(r);
    CHECK_EQ_INT(prefetch_all(c, 0), 3);                   /* stops at the garbage */
    kvc_bs_stats st;
    kvc_bs_stats_get(c, &st);
    CHECK_EQ_INT(st.shared_checksum_failures, 2);          /* every value fetched is checked */
    key_of(&chain[3], key);
    r = cmd(port, "EXISTS %s", key, NULL, 0);              /* deleted */
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 0);
    if (r)
        freeReplyObject(r);
    CHECK_EQ_INT(prefetch_all(c, 4), 6);                   /* 4..9, then the flipped one, gone */
    static uint8_t kv[KV_BYTES];
    CHECK(kvc_bs_get(c, &chain[10].d, kv, KV_BYTES, NULL) != KVC_OK);   /* deleted: a miss */
    kvc_bs_stats_get(c, &st);
    CHECK_EQ_INT(st.shared_checksum_failures, 2);
    kvc_bs_close(c);
}

static int64_t ms_since(const struct timeval *t0)
{
    struct timeval t1;
    gettimeofday(&t1, NULL);
    return (t1.tv_sec - t0->tv_sec) * 1000 + (t1.tv_usec - t0->tv_usec) / 1000;
}

static void test_outage(redis_proc *rp)
{
    kvc_block_store *d = open_store("d", rp->port, true);
    CHECK(d != NULL);
    if (!d)
        return;
    warnings = 0;
    redis_proc_stop(rp, true);
    struct timeval t0;
    gettimeofday(&t0, NULL);
    static uint8_t kv[KV_BYTES];
    for (int round = 0; round < 5; round++) {
        CHECK(kvc_bs_put(d, &chain[NBLK - 1].d, chain[NBLK - 1].kv, KV_BYTES, NULL) == KVC_OK);
        CHECK_EQ_INT(prefetch_all(d, 0), 0);
        CHECK(kvc_bs_get(d, &chain[0].d, kv, KV_BYTES, NULL) != KVC_OK);
    }
    kvc_bs_flush(d);
    CHECKF(ms_since(&t0) < 3000, "calls while Redis is down took %lld ms",
           (long long)ms_since(&t0));
    kvc_bs_stats st;
    kvc_bs_stats_get(d, &st);
    CHECK(st.shared_failures >= 1);
    CHECK_EQ_INT(st.shared_up, 0);
    CHECK_EQ_INT(st.n_blocks, 1);                          /* the disk took the put */
    CHECK_EQ_INT(warnings, 1);                             /* told once */
    bool absent;
    CHECK(redis_proc_start(rp, rp->port, &absent));        /* back, empty */
    usleep(400 * 1000);                                    /* past retry_ms */
    CHECK(kvc_bs_put(d, &chain[0].d, chain[0].kv, KV_BYTES, NULL) == KVC_OK);
    kvc_bs_flush(d);
    kvc_bs_stats_get(d, &st);
    CHECK_EQ_INT(st.shared_up, 1);
    CHECK_EQ_INT(st.shared_blocks_written, 1);
    CHECK_EQ_INT(warnings, 2);                             /* and told it is back */
    kvc_bs_close(d);
}

static void test_alone(int port)
{
    kvc_block_store *e = open_store("e", port, false);
    CHECK(e != NULL);
    if (!e)
        return;
    CHECK(!kvc_bs_contains(e, chain[1].d.hash));
    CHECK(kvc_bs_put(e, &chain[1].d, chain[1].kv, KV_BYTES, NULL) == KVC_OK);
    CHECK(kvc_bs_contains(e, chain[1].d.hash));
    static uint8_t kv[KV_BYTES];
    CHECK(kvc_bs_get(e, &chain[1].d, kv, KV_BYTES, NULL) == KVC_OK);
    CHECK(memcmp(kv, chain[1].kv, KV_BYTES) == 0);
    kvc_bs_close(e);
}

int main(void)
{
    test_urls();
    redis_proc rp;
    bool absent = false;
    if (!redis_proc_start(&rp, 0, &absent)) {
        if (absent) {
            printf("test_block_store_redis: SKIP: redis-server is not installed "
                   "(scripts/install-deps.sh installs it)\n");
            return TEST_SKIP;
        }
        CHECKF(false, "redis-server did not start");
        return test_done("test_block_store_redis");
    }
    snprintf(root, sizeof(root), "/tmp/kvc_test_redis_XXXXXX");
    CHECK(mkdtemp(root) != NULL);
    make_chain();
    test_share(rp.port);
    test_corrupt(rp.port);
    test_outage(&rp);
    test_alone(rp.port);
    redis_proc_stop(&rp, false);
    char cmdline[300];
    snprintf(cmdline, sizeof(cmdline), "rm -rf '%s'", root);
    CHECK(system(cmdline) == 0);
    return test_done("test_block_store_redis");
}
