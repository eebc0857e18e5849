/* test_block_store.c - the disk tier behind the block-store interface.
 *
 *  1. Round trip: put, get, contains, remove, iterate; a get that names
 *     other tokens or another parent under the same hash is a miss; the index
 *     rebuilt by a second open finds every block.
 *  2. Corruption: a flipped byte in the payload or the header, a truncated
 *     file, an empty one: detected, counted, discarded, never returned.
 *  3. Budget and LRU: the least recently used block goes first, a get counts
 *     as a use, and the order survives a reopen.
 *  4. Permissions: directories 0700, files 0600, whatever the umask; a
 *     second open of a directory in use is refused.
 *  5. Crash safety: a child process writing (and evicting, and reading) as fast
 *     as it can is SIGKILLed at random moments, 60 times; after each, the
 *     index loads and every block it lists reads back exactly, with no
 *     checksum failure and no temp file left.
 *  6. The model fingerprint: remembered, and changed by a changed file, also
 *     one overwritten in place with its mtime restored (the ctime tells).
 *  7. Chains: a full tier evicts leaves first. A shared root written first
 *     (and never touched again, as a prompt hot in RAM) outlives the
 *     conversations below it; the oldest conversation goes whole, from its
 *     end; after a reopen (a kill -9 with a full tier) the newest ones are
 *     still whole, root included.
 *  8. Disk full: on a 2 MiB tmpfs (when this process may mount one) with the
 *     default 4 GiB budget, every put still succeeds: the medium's ENOSPC
 *     lowers the budget to what fits (told once, counted) and older blocks
 *     make room; the newest blocks read back.
 *  9. The index snapshot: a clean reopen opens no block file; a file changed
 *     since (its mtime) has its header read (a corrupt one discarded); no
 *     snapshot, or a corrupt one: every header is read.
 * Block contents are a function of the block's hash, so any block can be
 * checked knowing only its name. */
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "block_store.h"
#include "test.h"

#define B        16
#define KV_BYTES (48 * 1024)

static char root[256];

static uint64_t mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    return x ^ (x >> 33);
}

/* The block named `hash`: tokens, parent and K/V all derived from it. */
typedef struct blk {
    int32_t        tokens[B];
    kvc_block_desc d;
    uint8_t        kv[KV_BYTES];
} blk;

static void make_blk(blk *b, uint64_t hash)
{
    for (int i = 0; i < B; i++)
        b->tokens[i] = (int32_t)(mix(hash + (uint64_t)i) % 150000);
    b->d = (kvc_block_desc){ hash, mix(hash ^ 0xabcdef), B, b->tokens, 0 };
    uint64_t x = hash | 1;
    for (size_t i = 0; i < KV_BYTES; i += 8) {
        x = mix(x);
        memcpy(b->kv + i, &x, 8);
    }
}

static kvc_block_store *open_store(const char *dir, uint64_t budget)
{
    kvc_disk_store_params p = { dir, budget, false };
    kvc_block_store *bs = NULL;
    kvc_err e = { 0 };
    int rc = kvc_disk_store_open(&p, &bs, &e);
    CHECKF(rc == KVC_OK, "open %s: %s", dir, e.msg);
    return bs;
}

static void sub(char *out, const char *name)
{
    snprintf(out, 512, "%s/%s", root, name);
}

static void file_of(char *out, const char *dir, uint64_t hash)
{
    snprintf(out, 600, "%s/%016llx.kvb", dir, (unsigned long long)hash);
}

static bool collect(void *user, uint64_t hash, uint64_t parent)
{
    uint64_t **p = user;
    *(*p)++ = hash;
    return true;
}

static blk *scratch;   /* one block to read into */

/* ================================================================ tests */

static void test_round_trip(void)
{
    char dir[512];
    sub(dir, "rt");
    kvc_block_store *bs = open_store(dir, 0);
    if (!bs)
        return;
    blk *b = malloc(sizeof(blk));
    kvc_err e = { 0 };
    for (uint64_t h = 1; h <= 20; h++) {
        make_blk(b, h * 1000003);
        CHECK(kvc_bs_put(bs, &b->d, b->kv, KV_BYTES, &e) == KVC_OK);
    }
    CHECK(kvc_bs_put(bs, &b->d, b->kv, KV_BYTES, &e) == KVC_OK);  /* again: a use */
    kvc_bs_stats st;
    kvc_bs_stats_get(bs, &st);
    CHECK_EQ_INT(st.n_blocks, 20);
    CHECK_EQ_INT(st.n_puts, 20);
    CHECK_EQ_INT(st.budget, (uint64_t)KVC_DISK_DEFAULT_MIB << 20);
    make_blk(b, 7 * 1000003);
    CHECK(kvc_bs_contains(bs, b->d.hash) && !kvc_bs_contains(bs, 5));
    CHECK(kvc_bs_get(bs, &b->d, scratch->kv, KV_BYTES, &e) == KVC_OK);
    CHECK(memcmp(scratch->kv, b->kv, KV_BYTES) == 0);
    /* the same hash naming other tokens, another parent, another size: misses */
    b->tokens[3]++;
    CHECK(kvc_bs_get(bs, &b->d, scratch->kv, KV_BYTES, &e) == KVC_ERR_NOT_FOUND);
    b->tokens[3]--;
    b->d.parent++;
    CHECK(kvc_bs_get(bs, &b->d, scratch->kv, KV_BYTES, &e) == KVC_ERR_NOT_FOUND);
    b->d.parent--;
    CHECK(kvc_bs_get(bs, &b->d, scratch->kv, KV_BYTES - 8, &e) == KVC_ERR_NOT_FOUND);
    CHECK(kvc_bs_contains(bs, b->d.hash));                    /* not discarded */
    CHECK(kvc_bs_remove(bs, b->d.hash) == KVC_OK);
    CHECK(!kvc_bs_contains(bs, b->d.hash));
    CHECK(kvc_bs_get(bs, &b->d, scratch->kv, KV_BYTES, &e) == KVC_ERR_NOT_FOUND);
    CHECK(kvc_bs_remove(bs, b->d.hash) == KVC_ERR_NOT_FOUND);
    kvc_bs_stats_get(bs, &st);
    CHECK_EQ_INT(st.checksum_failures, 0);
    CHECK_EQ_INT(st.n_hits, 1);
    CHECK_EQ_INT(st.bytes_read, KV_BYTES);
    kvc_bs_close(bs);
    /* a second open rebuilds the index from the files */
    bs = open_store(dir, 0);
    if (bs) {
        uint64_t all[32], *p = all;
        kvc_bs_iterate(bs, collect, &p);
        CHECK_EQ_INT(p - all, 19);
        int good = 0;
        for (uint64_t *q = all; q < p; q++) {
            make_blk(b, *q);
            good += kvc_bs_get(bs, &b->d, scratch->kv, KV_BYTES, &e) == KVC_OK &&
                    memcmp(scratch->kv, b->kv, KV_BYTES) == 0;
        }
        CHECK_EQ_INT(good, 19);
        /* iterate: least recently used first; the last read is the most recent */
        p = all;
        kvc_bs_iterate(bs, collect, &p);
        CHECK(p[-1] == b->d.hash);
        kvc_bs_close(bs);
    }
    free(b);
}

static void flip_byte(const char *path, off_t off)
{
    int fd = open(path, O_RDWR);
    uint8_t c = 0;
    CHECK(fd >= 0 && pread(fd, &c, 1, off) == 1);
    c ^= 0x20;
    CHECK(pwrite(fd, &c, 1, off) == 1);
    close(fd);
}

static void test_corruption(void)
{
    char dir[512], path[600];
    sub(dir, "corrupt");
    kvc_block_store *bs = open_store(dir, 0);
    if (!bs)
        return;
    blk *b = malloc(sizeof(blk));
    kvc_err e = { 0 };
    uint64_t h[6] = { 11, 22, 33, 44, 55, 66 };
    for (int i = 0; i < 6; i++) {
        make_blk(b, h[i]);
        CHECK(kvc_bs_put(bs, &b->d, b->kv, KV_BYTES, &e) == KVC_OK);
    }
    /* while open: a flipped K/V byte, a flipped token, a truncated file */
    file_of(path, dir, h[0]);
    flip_byte(path, 64 + B * 4 + 12345);
    file_of(path, dir, h[1]);
    flip_byte(path, 64 + 5);
    file_of(path, dir, h[2]);
    CHECK(truncate(path, 64 + B * 4 + KV_BYTES / 2) == 0);
    for (int i = 0; i < 3; i++) {
        make_blk(b, h[i]);
        memset(scratch->kv, 0, KV_BYTES);
        int rc = kvc_bs_get(bs, &b->d, scratch->kv, KV_BYTES, &e);
        CHECKF(rc == KVC_ERR_FORMAT, "block %d: rc %d", i, rc);
        CHECK(!kvc_bs_contains(bs, h[i]));
        file_of(path, dir, h[i]);
        CHECK(access(path, F_OK) != 0);                          /* discarded */
    }
    kvc_bs_stats st;
    kvc_bs_stats_get(bs, &st);
    CHECK_EQ_INT(st.checksum_failures, 3);
    CHECK_EQ_INT(st.n_blocks, 3);
    kvc_bs_close(bs);
    /* while closed: a flipped header byte, a truncated file, an empty one, a
     * stray file and a temp file */
    file_of(path, dir, h[3]);
    flip_byte(path, 20);
    file_of(path, dir, h[4]);
    CHECK(truncate(path, 100) == 0);
    file_of(path, dir, 0x77);
    close(open(path, O_WRONLY | O_CREAT, 0600));
    char other[600];
    snprintf(other, sizeof(other), "%s/tmp.1.1", dir);
    close(open(other, O_WRONLY | O_CREAT, 0600));
    snprintf(other, sizeof(other), "%s/README", dir);
    close(open(other, O_WRONLY | O_CREAT, 0600));
    bs = open_store(dir, 0);
    if (bs) {
        kvc_bs_stats_get(bs, &st);
        CHECK_EQ_INT(st.discarded_at_load, 3);
        CHECK_EQ_INT(st.n_blocks, 1);
        make_blk(b, h[5]);
        CHECK(kvc_bs_get(bs, &b->d, scratch->kv, KV_BYTES, &e) == KVC_OK &&
              memcmp(scratch->kv, b->kv, KV_BYTES) == 0);
        snprintf(other, sizeof(other), "%s/tmp.1.1", dir);
        CHECK(access(other, F_OK) != 0);
        snprintf(other, sizeof(other), "%s/README", dir);
        CHECK(access(other, F_OK) == 0);                        /* not ours: left alone */
        kvc_bs_close(bs);
    }
    free(b);
}

static void test_budget_lru(void)
{
    char dir[512];
    sub(dir, "lru");
    const uint64_t one = 64 + B * 4 + KV_BYTES;
    kvc_block_store *bs = open_store(dir, 5 * one);
    if (!bs)
        return;
    blk *b = malloc(sizeof(blk));
    kvc_err e = { 0 };
    for (uint64_t h = 1; h <= 5; h++) {
        make_blk(b, h);
        CHECK(kvc_bs_put(bs, &b->d, b->kv, KV_BYTES, &e) == KVC_OK);
    }
    make_blk(b, 1);
    CHECK(kvc_bs_get(bs, &b->d, scratch->kv, KV_BYTES, &e) == KVC_OK);   /* 1 is used */
    make_blk(b, 6);
    CHECK(kvc_bs_put(bs, &b->d, b->kv, KV_BYTES, &e) == KVC_OK);
    CHECK(kvc_bs_contains(bs, 1) && !kvc_bs_contains(bs, 2) && kvc_bs_contains(bs, 3));
    kvc_bs_stats st;
    kvc_bs_stats_get(bs, &st);
    CHECK_EQ_INT(st.evictions, 1);
    CHECK_EQ_INT(st.bytes_used, 5 * one);
    make_blk(b, 8);
    CHECK(kvc_bs_put(bs, &b->d, b->kv, 6 * one, &e) == KVC_ERR_INVALID_ARG);
    kvc_bs_close(bs);
    /* reopened: the order is kept (3 is the least recently used now) */
    bs = open_store(dir, 5 * one);
    if (bs) {
        make_blk(b, 7);
        CHECK(kvc_bs_put(bs, &b->d, b->kv, KV_BYTES, &e) == KVC_OK);
        CHECK(!kvc_bs_contains(bs, 3) && kvc_bs_contains(bs, 4) && kvc_bs_contains(bs, 1));
        kvc_bs_close(bs);
    }
    /* reopened with a smaller budget: trimmed from the least recent */
    bs = open_store(dir, 2 * one);
    if (bs) {
        kvc_bs_stats_get(bs, &st);
        CHECK_EQ_INT(st.n_blocks, 2);
        CHECK(kvc_bs_contains(bs, 6) && kvc_bs_contains(bs, 7));
        kvc_bs_close(bs);
    }
    free(b);
}

static void test_permissions(void)
{
    char dir[512], path[600];
    sub(dir, "perm/a/b");
    mode_t old = umask(0);
    kvc_block_store *bs = open_store(dir, 0);
    umask(old);
    if (!bs)
        return;
    blk *b = malloc(sizeof(blk));
    kvc_err e = { 0 };
    make_blk(b, 99);
    CHECK(kvc_bs_put(bs, &b->d, b->kv, KV_BYTES, &e) == KVC_OK);
    struct stat sb;
    const char *dirs[3] = { "perm", "perm/a", "perm/a/b" };
    for (int i = 0; i < 3; i++) {
        sub(path, dirs[i]);
        CHECK(stat(path, &sb) == 0);
        CHECKF((sb.st_mode & 0777) == 0700, "%s: mode %o", path, sb.st_mode & 0777);
    }
    file_of(path, dir, 99);
    CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0600);
    snprintf(path, sizeof(path), "%s/lock", dir);
    CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0600);
    /* in use: a second open is refused */
    kvc_disk_store_params p = { dir, 0, false };
    kvc_block_store *second = NULL;
    CHECK_EQ_INT(kvc_disk_store_open(&p, &second, &e), KVC_ERR_BUSY);
    CHECK(second == NULL && strstr(e.msg, "in use"));
    kvc_bs_close(bs);
    /* an existing directory open to others is closed to them */
    CHECK(chmod(dir, 0755) == 0);
    bs = open_store(dir, 0);
    CHECK(stat(dir, &sb) == 0 && (sb.st_mode & 0777) == 0700);
    kvc_bs_close(bs);
    free(b);
}

/* ---------------------------------------------------------- crash safety */

/* The child: write blocks as fast as it can (the budget keeps it evicting),
 * reading one back now and then. Never returns. */
static void writer(const char *dir, uint64_t seed, uint64_t budget)
{
    kvc_disk_store_params p = { dir, budget, false };
    kvc_block_store *bs = NULL;
    kvc_err e = { 0 };
    if (kvc_disk_store_open(&p, &bs, &e) != KVC_OK)
        _exit(3);
    blk *b = malloc(sizeof(blk)), *r = malloc(sizeof(blk));
    for (uint64_t i = 0;; i++) {
        uint64_t h = mix(seed * 1000 + i % 97);
        make_blk(b, h);
        if (i % 5 == 4) {
            int rc = kvc_bs_get(bs, &b->d, r->kv, KV_BYTES, &e);
            if (rc == KVC_OK && memcmp(r->kv, b->kv, KV_BYTES) != 0)
                _exit(4);
            if (rc == KVC_ERR_FORMAT)
                _exit(5);
        } else if (kvc_bs_put(bs, &b->d, b->kv, KV_BYTES, &e) != KVC_OK) {
            _exit(6);
        }
    }
}

static void test_crash_safety(int rounds)
{
    char dir[512];
    sub(dir, "crash");
    const uint64_t budget = 40 * (64 + B * 4 + KV_BYTES);
    uint64_t rng = 0x243F6A8885A308D3ull;
    int killed = 0, exited = 0, mid_write = 0;
    int64_t max_blocks = 0, total_checked = 0;
    blk *b = malloc(sizeof(blk));
    for (int k = 0; k < rounds; k++) {
        rng = mix(rng);
        pid_t pid = fork();
        if (pid == 0)
            writer(dir, (uint64_t)k % 7, budget);
        CHECK(pid > 0);
        usleep((useconds_t)(rng % 30000));
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        killed += WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
        exited += WIFEXITED(status);
        CHECKF(!WIFEXITED(status), "round %d: the writer exited with %d", k,
               WEXITSTATUS(status));
        char cmd[600];
        snprintf(cmd, sizeof(cmd), "ls %s | grep -q '^tmp'", dir);
        mid_write += system(cmd) == 0;          /* killed between create and rename */
        /* restart: the index loads; every block it lists is exactly its own */
        kvc_block_store *bs = open_store(dir, budget);
        if (!bs)
            break;
        uint64_t all[64], *p = all;
        kvc_bs_stats st;
        kvc_bs_stats_get(bs, &st);
        CHECKF(st.n_blocks <= 40, "round %d: %lld blocks over the budget", k,
               (long long)st.n_blocks);
        kvc_bs_iterate(bs, collect, &p);
        kvc_err e = { 0 };
        for (uint64_t *q = all; q < p; q++) {
            make_blk(b, *q);
            memset(scratch->kv, 0, KV_BYTES);
            int rc = kvc_bs_get(bs, &b->d, scratch->kv, KV_BYTES, &e);
            CHECKF(rc == KVC_OK && memcmp(scratch->kv, b->kv, KV_BYTES) == 0,
                   "round %d: block %016llx: rc %d %s", k, (unsigned long long)*q, rc, e.msg);
            total_checked++;
        }
        kvc_bs_stats_get(bs, &st);
        CHECKF(st.checksum_failures == 0 && st.discarded_at_load == 0,
               "round %d: %llu checksum failures, %llu discarded at load", k,
               (unsigned long long)st.checksum_failures,
               (unsigned long long)st.discarded_at_load);
        max_blocks = KVC_MAX(max_blocks, st.n_blocks);
        kvc_bs_close(bs);
        CHECKF(system(cmd) != 0, "round %d: a temp file survived the reopen", k);
    }
    printf("  crash safety: %d writers SIGKILLed (%d exited on their own), %d of them in the "
           "middle of a block; %lld blocks read back intact after the restarts (up to %lld at "
           "once); 0 checksum failures\n", killed, exited, mid_write, (long long)total_checked,
           (long long)max_blocks);
    CHECK(killed == rounds && max_blocks > 5 && mid_write > 0);
    free(b);
}

static void test_fingerprint(void)
{
    char dir[512], model[600];
    sub(dir, "fp");
    kvc_block_store *bs = open_store(dir, 0);               /* makes the directory */
    kvc_bs_close(bs);
    snprintf(model, sizeof(model), "%s/model.gguf", root);
    FILE *f = fopen(model, "wb");
    for (int i = 0; i < 100000; i++)
        fputc(i * 7 & 0xff, f);
    fclose(f);
    uint64_t a = 0, a2 = 0, c = 0;
    kvc_err e = { 0 };
    CHECK(kvc_model_fingerprint(model, dir, &a, &e) == KVC_OK);
    CHECK(kvc_model_fingerprint(model, dir, &a2, &e) == KVC_OK);
    CHECK(a == a2 && a != 0);
    char path[600];
    snprintf(path, sizeof(path), "%s/models", dir);
    size_t len = 0;
    char *text = test_read_file(path, &len);
    CHECK(text && strstr(text, "model.gguf"));
    free(text);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0600);
    sleep(0);
    f = fopen(model, "r+b");
    fseek(f, 50000, SEEK_SET);
    fputc(1, f);                                            /* same size, other bytes */
    fclose(f);
    struct timespec t[2] = { { 0, UTIME_OMIT }, { 12345, 0 } }; /* and surely another mtime */
    utimensat(AT_FDCWD, model, t, 0);
    CHECK(kvc_model_fingerprint(model, dir, &c, &e) == KVC_OK);
    CHECK(c != a);
    /* overwritten in place with the mtime restored (cp onto it, touch -d; rsync
     * --inplace -t): same path, size, inode and mtime; only the ctime tells */
    CHECK(stat(model, &sb) == 0);
    const struct timespec keep = sb.st_mtim;
    const ino_t ino = sb.st_ino;
    usleep(20000);                                          /* past the clock's grain */
    f = fopen(model, "r+b");
    fseek(f, 60000, SEEK_SET);
    fputc(2, f);
    fclose(f);
    struct timespec t2[2] = { { 0, UTIME_OMIT }, keep };
    CHECK(utimensat(AT_FDCWD, model, t2, 0) == 0);
    CHECK(stat(model, &sb) == 0 && sb.st_ino == ino && sb.st_mtim.tv_sec == keep.tv_sec &&
          sb.st_mtim.tv_nsec == keep.tv_nsec && sb.st_size == 100000);
    uint64_t d = 0, d_fresh = 0;
    CHECK(kvc_model_fingerprint(model, dir, &d, &e) == KVC_OK);
    CHECK(kvc_model_fingerprint(model, NULL, &d_fresh, &e) == KVC_OK);   /* computed */
    CHECKF(d == d_fresh && d != c, "a restored mtime hid an overwrite: %016llx, the file's is "
           "%016llx", (unsigned long long)d, (unsigned long long)d_fresh);
    CHECK(kvc_model_fingerprint("/nonexistent/x.gguf", dir, &c, &e) == KVC_ERR_IO);
}

/* Put block `hash` as the child of `parent`. */
static void put_child(kvc_block_store *bs, blk *b, uint64_t hash, uint64_t parent)
{
    make_blk(b, hash);
    b->d.parent = parent;
    kvc_err e = { 0 };
    CHECKF(kvc_bs_put(bs, &b->d, b->kv, KV_BYTES, &e) == KVC_OK, "%s", e.msg);
}

/* Whether the chain root .. conv*10+1 .. conv*10+len is stored whole. */
static bool chain_whole(kvc_block_store *bs, int conv, int len)
{
    bool whole = kvc_bs_contains(bs, 1000);
    for (int i = 1; i <= len; i++)
        whole = whole && kvc_bs_contains(bs, (uint64_t)(conv * 10 + i));
    return whole;
}

static void test_chain_eviction(void)
{
    char dir[512];
    sub(dir, "chains");
    const uint64_t one = 64 + B * 4 + KV_BYTES;
    kvc_block_store *bs = open_store(dir, 10 * one);
    if (!bs)
        return;
    blk *b = malloc(sizeof(blk));
    const uint64_t root = 1000;
    put_child(bs, b, root, 7);                         /* the shared system prompt */
    for (int conv = 1; conv <= 3; conv++)              /* three conversations of 3 blocks */
        for (int i = 1; i <= 3; i++)
            put_child(bs, b, (uint64_t)(conv * 10 + i), i == 1 ? root : (uint64_t)(conv * 10 + i - 1));
    /* full (10 blocks); a fourth conversation makes room: conversation 1 goes, from its end */
    put_child(bs, b, 41, root);
    CHECKF(kvc_bs_contains(bs, root), "the shared root was evicted first");
    CHECK(!kvc_bs_contains(bs, 13) && kvc_bs_contains(bs, 12));
    put_child(bs, b, 42, 41);
    CHECK(!kvc_bs_contains(bs, 12) && kvc_bs_contains(bs, 11));
    kvc_bs_stats st;
    kvc_bs_stats_get(bs, &st);
    CHECK_EQ_INT(st.evictions, 2);
    kvc_bs_close(bs);
    /* restart with a full tier: the order is rebuilt from the files */
    bs = open_store(dir, 10 * one);
    if (bs) {
        put_child(bs, b, 43, 42);
        put_child(bs, b, 51, root);
        put_child(bs, b, 52, 51);
        CHECK(!kvc_bs_contains(bs, 11) && !kvc_bs_contains(bs, 23));
        CHECKF(chain_whole(bs, 3, 3) && chain_whole(bs, 4, 3) && chain_whole(bs, 5, 2),
               "the newest conversations are not whole after a restart");
        /* a leaf read back is used: conversation 2's first block (a leaf since its
         * end went) outlives conversation 3's end */
        make_blk(b, 21);
        b->d.parent = root;
        kvc_err e = { 0 };
        CHECK(kvc_bs_get(bs, &b->d, scratch->kv, KV_BYTES, &e) == KVC_OK);
        put_child(bs, b, 53, 52);
        CHECK(kvc_bs_contains(bs, 21) && !kvc_bs_contains(bs, 33) && kvc_bs_contains(bs, 32));
        /* a removed inner block leaves its child an orphan, still counted right:
         * a new conversation of 7 takes the room of the oldest leaves only */
        CHECK(kvc_bs_remove(bs, 51) == KVC_OK);
        for (int i = 0; i < 7; i++)
            put_child(bs, b, (uint64_t)(100 + i), i ? (uint64_t)(99 + i) : root);
        kvc_bs_stats_get(bs, &st);
        CHECK_EQ_INT(st.n_blocks, 10);
        bool newest = kvc_bs_contains(bs, root) && kvc_bs_contains(bs, 52) &&
                      kvc_bs_contains(bs, 53) && !kvc_bs_contains(bs, 41);
        for (int i = 0; i < 7; i++)
            newest = newest && kvc_bs_contains(bs, (uint64_t)(100 + i));
        CHECK(newest);
        /* a conversation continued after a long pause: its end is the least
         * recent leaf, but the room made for its next block is not the end
         * itself (that block would be stored unreachable) */
        put_child(bs, b, 153, 53);               /* 53: the least recent leaf, 106 the other */
        CHECKF(kvc_bs_contains(bs, 53) && kvc_bs_contains(bs, 153) && !kvc_bs_contains(bs, 106),
               "room for a block was made by evicting its parent");
        kvc_bs_close(bs);
    }
    free(b);
}

static int full_warnings;
static void on_full(void *user, const char *msg)
{
    (void)user;
    full_warnings++;
    printf("  (told: %s)\n", msg);
}

static void test_disk_full(void)
{
    char dir[512], cmd[700];
    sub(dir, "tmpfs");
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(cmd, sizeof(cmd), "mount -t tmpfs -o size=2m tmpfs '%s' 2>/dev/null", dir);
    if (system(cmd) != 0) {
        printf("  disk full: skipped (cannot mount a tmpfs here: not root?)\n");
        return;
    }
    kvc_disk_store_params p = { dir, 0, false, on_full, NULL };
    kvc_block_store *bs = NULL;
    kvc_err e = { 0 };
    CHECKF(kvc_disk_store_open(&p, &bs, &e) == KVC_OK, "%s", e.msg);
    blk *b = malloc(sizeof(blk));
    int ok = 0;
    const int n = 120;                              /* ~5.9 MiB of blocks into 2 MiB */
    for (uint64_t h = 1; bs && h <= (uint64_t)n; h++) {
        make_blk(b, h * 7919);
        ok += kvc_bs_put(bs, &b->d, b->kv, KV_BYTES, &e) == KVC_OK;
    }
    kvc_bs_stats st = { 0 };
    if (bs)
        kvc_bs_stats_get(bs, &st);
    int newest = 0;
    for (uint64_t h = (uint64_t)n - 4; bs && h <= (uint64_t)n; h++) {
        make_blk(b, h * 7919);
        newest += kvc_bs_get(bs, &b->d, scratch->kv, KV_BYTES, &e) == KVC_OK &&
                  memcmp(scratch->kv, b->kv, KV_BYTES) == 0;
    }
    printf("  disk full: %d of %d puts stored on a 2 MiB tmpfs; %lld blocks held, budget "
           "lowered to %.2f MiB after %llu full writes, told %d time(s)\n", ok, n,
           (long long)st.n_blocks, (double)st.budget / 1048576.0,
           (unsigned long long)st.full_events, full_warnings);
    CHECK_EQ_INT(ok, n);
    CHECK_EQ_INT(newest, 5);
    CHECK(st.full_events >= 1 && st.budget < (2u << 20) && st.n_blocks > 10);
    CHECK_EQ_INT(full_warnings, 1);
    kvc_bs_close(bs);
    free(b);
    snprintf(cmd, sizeof(cmd), "umount '%s'", dir);
    CHECK(system(cmd) == 0);
}

static void test_snapshot(void)
{
    char dir[512], path[600];
    sub(dir, "snap");
    kvc_block_store *bs = open_store(dir, 0);
    if (!bs)
        return;
    blk *b = malloc(sizeof(blk));
    kvc_err e = { 0 };
    for (uint64_t h = 1; h <= 30; h++) {
        make_blk(b, h * 104729);
        CHECK(kvc_bs_put(bs, &b->d, b->kv, KV_BYTES, &e) == KVC_OK);
    }
    kvc_bs_close(bs);
    kvc_bs_stats st;
    bs = open_store(dir, 0);                              /* clean: all from the snapshot */
    kvc_bs_stats_get(bs, &st);
    CHECK_EQ_INT(st.n_blocks, 30);
    CHECK_EQ_INT(st.headers_read_at_load, 0);
    int good = 0;
    for (uint64_t h = 1; h <= 30; h++) {
        make_blk(b, h * 104729);
        good += kvc_bs_get(bs, &b->d, scratch->kv, KV_BYTES, &e) == KVC_OK &&
                memcmp(scratch->kv, b->kv, KV_BYTES) == 0;
    }
    CHECK_EQ_INT(good, 30);
    /* a second open, refused (the directory is in use), leaves the snapshot alone */
    kvc_disk_store_params p2 = { dir, 0, false };
    kvc_block_store *second = NULL;
    struct stat before, after;
    snprintf(path, sizeof(path), "%s/index", dir);
    CHECK(stat(path, &before) == 0);
    CHECK_EQ_INT(kvc_disk_store_open(&p2, &second, &e), KVC_ERR_BUSY);
    CHECK(stat(path, &after) == 0 && after.st_ino == before.st_ino &&
          after.st_size == before.st_size);
    kvc_bs_close(bs);
    usleep(20000);
    file_of(path, dir, 7 * 104729);                       /* changed since: read, discarded */
    flip_byte(path, 20);
    bs = open_store(dir, 0);
    kvc_bs_stats_get(bs, &st);
    CHECK_EQ_INT(st.headers_read_at_load, 1);
    CHECK_EQ_INT(st.discarded_at_load, 1);
    CHECK_EQ_INT(st.n_blocks, 29);
    kvc_bs_close(bs);
    snprintf(path, sizeof(path), "%s/index", dir);        /* a corrupt snapshot: ignored */
    flip_byte(path, 40);
    bs = open_store(dir, 0);
    kvc_bs_stats_get(bs, &st);
    CHECK_EQ_INT(st.headers_read_at_load, 29);
    CHECK_EQ_INT(st.n_blocks, 29);
    kvc_bs_close(bs);
    free(b);
}

int main(int argc, char **argv)
{
    snprintf(root, sizeof(root), "/tmp/kvc_test_store_XXXXXX");
    if (!mkdtemp(root))
        return 1;
    int rounds = argc > 1 ? atoi(argv[1]) : 60;
    scratch = malloc(sizeof(blk));
    test_round_trip();
    test_corruption();
    test_budget_lru();
    test_permissions();
    test_crash_safety(rounds);
    test_fingerprint();
    test_chain_eviction();
    test_disk_full();
    test_snapshot();
    free(scratch);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return test_done("test_block_store");
}
