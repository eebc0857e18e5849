/* block_store_disk.c - the disk tier: one file per block in a directory.
 *
 * Why one file per block (not an append-only log): a block is large (the
 * K/V of 16 tokens of every layer: 192 KiB for a Qwen2.5-0.5B shape in F16),
 * so a file costs little beside it; the budget's LRU then frees space by
 * unlinking one file, where a log would need compaction; and a file becomes
 * visible all at once by rename(2), so no reader ever sees half a block.
 *
 * A write: the block goes to "tmp.<pid>.<n>" (O_EXCL, 0600), then rename(2)
 * gives it its name "<hash as 16 hex>.kvb". A writer killed at any moment
 * leaves either no block or a whole one (plus a temp file that the next open
 * removes: the directory's lock guarantees no one else writes there).
 *
 * fsync policy: none by default. The tier is a cache, and a killed process
 * loses nothing the kernel already has. After a power loss a file may come back
 * empty or partly written: its checksum (and size) fail at read, it is
 * discarded and recomputed. `fsync` in the params syncs each file before its
 * rename, for a medium where that matters more than the write rate.
 *
 * The file: a 64-byte header (file_header), the tokens (int32), the K/V as the
 * pool stores them. The header has its own checksum; the payload (tokens and
 * K/V) has XXH3-64. Recency survives restarts in each file's mtime, which the
 * store sets itself from a strictly increasing clock, so the LRU order rebuilt
 * at open is the order it had.
 *
 * Eviction goes leaves first, as the RAM tree's: a block that another stored
 * block continues (its child names it as parent) is never evicted before
 * that child, whatever their stamps. Blocks that stay hot in RAM are not
 * re-stamped on disk, so by stamps alone a shared system prompt would be the
 * oldest file and go first, leaving every conversation below it unreachable;
 * leaves first, a full tier loses whole old conversations from their ends and
 * keeps the newest ones whole. The parent links are in the files' headers, so
 * the order holds after a restart too. */
#include "block_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define FILE_MAGIC   0x31304b4c4243564bull   /* "KVCBLK01" */
#define FILE_VERSION 1

typedef struct file_header {
    uint64_t magic;
    uint32_t version;
    uint32_t n_tokens;
    uint64_t hash;          /* the chain hash: also the file's name */
    uint64_t parent;        /* the parent's chain hash */
    uint64_t kv_bytes;
    uint64_t payload_xxh;   /* XXH3-64 of tokens, then K/V */
    uint64_t reserved;      /* 0 */
    uint64_t header_xxh;    /* XXH3-64 of the 56 bytes above */
} file_header;
_Static_assert(sizeof(file_header) == 64, "the on-disk header is 64 bytes");

typedef struct entry {
    uint64_t      hash, parent;
    uint64_t      bytes;        /* file size */
    int64_t       stamp;        /* mtime in ns: the LRU key */
    struct entry *hnext;        /* bucket chain */
    struct entry *prev, *next;  /* in `leaves` (least recent first) or `inner` */
    struct entry *up;           /* the parent's entry, which counts this one in its
                                   n_children; NULL when the parent is not stored */
    int32_t       n_children;   /* stored blocks whose `up` is this one */
} entry;

/* A doubly-linked list of entries. */
typedef struct list {
    entry *head, *tail;
} list;

typedef struct disk_store {
    kvc_block_store base;
    char         dir[PATH_MAX];
    void       (*warn)(void *, const char *);
    void        *warn_user;
    bool         told_full;     /* the medium's being full was told */
    int          dir_fd;
    int          lock_fd;       /* flock(LOCK_EX) held while open */
    bool         fsync;
    entry      **buckets;       /* n_buckets chains, a power of two */
    size_t       n_buckets;
    list         leaves;        /* blocks no stored block continues, least recent
                                   first: the eviction order */
    list         inner;         /* the others (their children go first) */
    int64_t      last_stamp;
    uint64_t     tmp_serial;
    int64_t      puts_since_snapshot;
    bool         loaded;        /* locked and indexed: the snapshot is ours to save */
    kvc_bs_stats st;
} disk_store;

/* ------------------------------------------------------- index snapshot
 *
 * "index" in the directory: the index as it was last saved (at open, at
 * close, and every SNAPSHOT_EVERY new blocks), so that a start need not open
 * every file to read its header (21,800 files of a full 4 GiB tier: 4
 * syscalls and a data block each). At open a listed file whose size and
 * mtime are those the snapshot names is taken from it (one fstatat); any
 * other file (new since, touched since, changed by someone) has its header
 * read as before. The snapshot is a hint: written whole (temp file and
 * rename) with a checksum, ignored when it fails it, and a block taken from
 * it is still verified whole at every read. */
#define SNAPSHOT_MAGIC 0x313058444943564bull  /* "KVCIDX01" */
#define SNAPSHOT_EVERY 1024

typedef struct snap_entry {
    uint64_t hash, parent, bytes;
    int64_t  stamp;
} snap_entry;

typedef struct snapshot {
    snap_entry *v;            /* sorted by hash */
    size_t      n;
} snapshot;

/* ------------------------------------------------------------- the index */

static entry **bucket_of(disk_store *ds, uint64_t hash)
{
    return &ds->buckets[(hash ^ (hash >> 29)) & (ds->n_buckets - 1)];
}

static entry *find(disk_store *ds, uint64_t hash)
{
    for (entry *e = *bucket_of(ds, hash); e; e = e->hnext)
        if (e->hash == hash)
            return e;
    return NULL;
}

static void list_unlink(list *l, entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        l->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        l->tail = e->prev;
    e->prev = e->next = NULL;
}

static void list_push_tail(list *l, entry *e)
{
    e->next = NULL;
    e->prev = l->tail;
    if (l->tail)
        l->tail->next = e;
    else
        l->head = e;
    l->tail = e;
}

/* Insert e before the first entry stamped later (the list is in stamp order). */
static void list_insert_by_stamp(list *l, entry *e)
{
    entry *w = l->head;
    while (w && w->stamp <= e->stamp)
        w = w->next;
    if (!w) {
        list_push_tail(l, e);
        return;
    }
    e->next = w;
    e->prev = w->prev;
    if (w->prev)
        w->prev->next = e;
    else
        l->head = e;
    w->prev = e;
}

static list *list_of(disk_store *ds, const entry *e)
{
    return e->n_children > 0 ? &ds->inner : &ds->leaves;
}

/* Count e in its stored parent's children: a parent that gains its first
 * child leaves the eviction order until it has none again. */
static void link_parent(disk_store *ds, entry *e)
{
    entry *p = e->parent != e->hash ? find(ds, e->parent) : NULL;
    if (!p)
        return;
    e->up = p;
    if (p->n_children++ == 0) {
        list_unlink(&ds->leaves, p);
        list_push_tail(&ds->inner, p);
    }
}

/* e goes: its parent counts one child less (and may become a leaf again, in
 * its place by stamp); children that counted on e are orphans now (rare: a
 * block with children goes only when removed or found corrupt). */
static void unlink_family(disk_store *ds, entry *e)
{
    entry *p = e->up;
    if (p && --p->n_children == 0) {
        list_unlink(&ds->inner, p);
        list_insert_by_stamp(&ds->leaves, p);
    }
    e->up = NULL;
    if (e->n_children == 0)
        return;
    list *both[2] = { &ds->leaves, &ds->inner };
    for (int i = 0; i < 2; i++)
        for (entry *x = both[i]->head; x; x = x->next)
            if (x->up == e)
                x->up = NULL;
    e->n_children = 0;
}

/* The next block to evict: the least recently used leaf. Only when no block
 * is a leaf (a cycle of parents, which sound chains never make) an inner one. */
static entry *victim(disk_store *ds)
{
    return ds->leaves.head ? ds->leaves.head : ds->inner.head;
}

/* Double the buckets when full; on allocation failure keep longer chains. */
static void grow(disk_store *ds)
{
    if ((size_t)ds->st.n_blocks < ds->n_buckets)
        return;
    entry **nb = calloc(ds->n_buckets * 2, sizeof(entry *));
    if (!nb)
        return;
    entry **old = ds->buckets;
    size_t old_n = ds->n_buckets;
    ds->buckets = nb;
    ds->n_buckets *= 2;
    for (size_t b = 0; b < old_n; b++)
        for (entry *e = old[b], *nx; e; e = nx) {
            nx = e->hnext;
            entry **p = bucket_of(ds, e->hash);
            e->hnext = *p;
            *p = e;
        }
    free(old);
}

/* Enter e as a leaf (most recent); the index takes it. link_parent counts
 * it in its parent's children. */
static void index_add(disk_store *ds, entry *e)
{
    entry **p = bucket_of(ds, e->hash);
    e->hnext = *p;
    *p = e;
    list_push_tail(&ds->leaves, e);
    ds->st.n_blocks++;
    ds->st.bytes_used += e->bytes;
    grow(ds);
}

static void index_drop(disk_store *ds, entry *e)
{
    entry **p = bucket_of(ds, e->hash);
    while (*p != e)
        p = &(*p)->hnext;
    *p = e->hnext;
    list *l = list_of(ds, e);
    unlink_family(ds, e);
    list_unlink(l, e);
    ds->st.n_blocks--;
    ds->st.bytes_used -= e->bytes;
    free(e);
}

/* ---------------------------------------------------------------- files */

static void name_of(uint64_t hash, char name[32])
{
    snprintf(name, 32, "%016llx.kvb", (unsigned long long)hash);
}

/* A strictly increasing wall-clock stamp in ns, written as a file's mtime. */
static int64_t next_stamp(disk_store *ds)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    ds->last_stamp = now > ds->last_stamp ? now : ds->last_stamp + 1;
    return ds->last_stamp;
}

static void stamp_times(int64_t stamp, struct timespec t[2])
{
    t[0] = (struct timespec){ 0, UTIME_OMIT };
    t[1] = (struct timespec){ stamp / 1000000000, stamp % 1000000000 };
}

/* Mark e used now: the most recent end of the list and of the mtimes. A
 * failed utimensat only costs order after a restart. */
static void touch(disk_store *ds, entry *e, int fd)
{
    e->stamp = next_stamp(ds);
    struct timespec t[2];
    stamp_times(e->stamp, t);
    if (fd >= 0) {
        (void)futimens(fd, t);
    } else {
        char name[32];
        name_of(e->hash, name);
        (void)utimensat(ds->dir_fd, name, t, 0);
    }
    list *l = list_of(ds, e);
    list_unlink(l, e);
    list_push_tail(l, e);
}

/* Remove e's file and entry (a failed unlink leaves a file the next open
 * validates again). */
static void discard(disk_store *ds, entry *e)
{
    char name[32];
    name_of(e->hash, name);
    (void)unlinkat(ds->dir_fd, name, 0);
    index_drop(ds, e);
}

static int read_full(int fd, void *buf, size_t n, off_t off)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return 0;
}

static int write_full(int fd, struct iovec *iov, int n_iov)
{
    while (n_iov > 0) {
        ssize_t w = writev(fd, iov, n_iov);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        while (n_iov > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            n_iov--;
        }
        if (n_iov > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

static uint64_t header_sum(const file_header *h)
{
    return XXH3_64bits(h, offsetof(file_header, header_xxh));
}

/* A header is whole: magic, version, its checksum, and the size it implies. */
static bool header_ok(const file_header *h, uint64_t file_size)
{
    return h->magic == FILE_MAGIC && h->version == FILE_VERSION &&
           h->header_xxh == header_sum(h) && h->n_tokens > 0 && h->n_tokens <= (1u << 20) &&
           file_size == sizeof(*h) + (uint64_t)h->n_tokens * 4 + h->kv_bytes;
}

/* ------------------------------------------------------------ operations */

static bool disk_contains(kvc_block_store *bs, uint64_t hash)
{
    return find((disk_store *)bs, hash) != NULL;
}

static int disk_remove(kvc_block_store *bs, uint64_t hash)
{
    disk_store *ds = (disk_store *)bs;
    entry *e = find(ds, hash);
    if (!e)
        return KVC_ERR_NOT_FOUND;
    discard(ds, e);
    return KVC_OK;
}

/* In eviction order: the leaves least recently used first, then the blocks
 * that others continue. */
static void disk_iterate(kvc_block_store *bs, kvc_bs_iter_fn fn, void *user)
{
    disk_store *ds = (disk_store *)bs;
    for (entry *e = ds->leaves.head; e; e = e->next)
        if (!fn(user, e->hash, e->parent))
            return;
    for (entry *e = ds->inner.head; e; e = e->next)
        if (!fn(user, e->hash, e->parent))
            return;
}

static void disk_stats(kvc_block_store *bs, kvc_bs_stats *st)
{
    *st = ((disk_store *)bs)->st;
}

static void save_snapshot(disk_store *ds);

static void disk_close(kvc_block_store *bs)
{
    disk_store *ds = (disk_store *)bs;
    if (ds->loaded)                              /* opened: its index is worth keeping */
        save_snapshot(ds);
    if (ds->buckets)
        for (size_t b = 0; b < ds->n_buckets; b++)
            for (entry *e = ds->buckets[b], *nx; e; e = nx) {
                nx = e->hnext;
                free(e);
            }
    free(ds->buckets);
    if (ds->lock_fd >= 0)
        close(ds->lock_fd);            /* releases the lock */
    if (ds->dir_fd >= 0)
        close(ds->dir_fd);
    free(ds);
}

/* Write the file of a block not yet stored: temp file, then rename. */
static int write_block(disk_store *ds, const kvc_block_desc *d, const void *kv, size_t kv_bytes,
                       uint64_t size, int *os_err, kvc_err *err)
{
    *os_err = 0;
    file_header h = { .magic = FILE_MAGIC, .version = FILE_VERSION,
                      .n_tokens = (uint32_t)d->n_tokens, .hash = d->hash, .parent = d->parent,
                      .kv_bytes = kv_bytes };
    XXH3_state_t *x = XXH3_createState();
    if (!x)
        return kvc_fail(err, KVC_ERR_NOMEM, "disk cache: out of memory");
    XXH3_64bits_reset(x);
    XXH3_64bits_update(x, d->tokens, (size_t)d->n_tokens * sizeof(int32_t));
    XXH3_64bits_update(x, kv, kv_bytes);
    h.payload_xxh = XXH3_64bits_digest(x);
    XXH3_freeState(x);
    h.header_xxh = header_sum(&h);

    char tmp[64], name[32];
    snprintf(tmp, sizeof(tmp), "tmp.%ld.%llu", (long)getpid(),
             (unsigned long long)++ds->tmp_serial);
    name_of(d->hash, name);
    int fd = openat(ds->dir_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        *os_err = errno;
        return kvc_fail(err, KVC_ERR_IO, "disk cache: cannot create %s: %s", tmp,
                        strerror(errno));
    }
    struct iovec iov[3] = { { &h, sizeof(h) },
                            { (void *)d->tokens, (size_t)d->n_tokens * sizeof(int32_t) },
                            { (void *)kv, kv_bytes } };
    struct timespec t[2];
    int64_t stamp = next_stamp(ds);
    stamp_times(stamp, t);
    int bad = write_full(fd, iov, 3) || futimens(fd, t) || (ds->fsync && fsync(fd));
    int saved = errno;
    bad |= close(fd) != 0;
    if (!bad && renameat(ds->dir_fd, tmp, ds->dir_fd, name) != 0) {
        bad = 1;
        saved = errno;
    }
    if (bad) {
        (void)unlinkat(ds->dir_fd, tmp, 0);
        *os_err = saved;
        return kvc_fail(err, KVC_ERR_IO, "disk cache: writing block %s: %s", name,
                        strerror(saved));
    }
    if (ds->fsync)
        (void)fsync(ds->dir_fd);
    entry *e = calloc(1, sizeof(*e));
    if (!e) {
        (void)unlinkat(ds->dir_fd, name, 0);
        return kvc_fail(err, KVC_ERR_NOMEM, "disk cache: out of memory");
    }
    *e = (entry){ .hash = d->hash, .parent = d->parent, .bytes = size, .stamp = stamp };
    index_add(ds, e);
    link_parent(ds, e);
    if (++ds->puts_since_snapshot >= SNAPSHOT_EVERY)
        save_snapshot(ds);
    ds->st.n_puts++;
    ds->st.bytes_written += size;
    return KVC_OK;
}

/* The medium is full (ENOSPC, EDQUOT) before the budget is: the budget comes
 * down to what the medium held (less one block, so that the next try has
 * room), told once. The caller evicts and tries again. */
static void medium_full(disk_store *ds, uint64_t size, int os_err)
{
    uint64_t old = ds->st.budget;
    ds->st.budget = KVC_MAX(ds->st.bytes_used > size ? ds->st.bytes_used - size : 0, size);
    ds->st.budget = KVC_MIN(ds->st.budget, old);
    ds->st.full_events++;
    if (ds->told_full || !ds->warn)
        return;
    ds->told_full = true;
    char msg[PATH_MAX + 200];
    snprintf(msg, sizeof(msg), "disk cache: %s is full (%s) at %.1f MiB: its budget is lowered "
             "from %.1f MiB to %.1f MiB, and older blocks are evicted to make room",
             ds->dir, strerror(os_err), (double)ds->st.bytes_used / 1048576.0,
             (double)old / 1048576.0, (double)ds->st.budget / 1048576.0);
    ds->warn(ds->warn_user, msg);
}

static int disk_put(kvc_block_store *bs, const kvc_block_desc *d, const void *kv,
                    size_t kv_bytes, kvc_err *err)
{
    disk_store *ds = (disk_store *)bs;
    entry *e = find(ds, d->hash);
    if (e) {
        touch(ds, e, -1);
        return KVC_OK;
    }
    uint64_t size = sizeof(file_header) + (uint64_t)d->n_tokens * 4 + kv_bytes;
    if (size > ds->st.budget)
        return kvc_fail(err, KVC_ERR_INVALID_ARG,
                        "disk cache: a block of %llu bytes exceeds the budget of %llu",
                        (unsigned long long)size, (unsigned long long)ds->st.budget);
    /* the parent is in use: it is continued now. Re-stamped first, so that the
     * room made for its child is never the parent itself (the least recent
     * leaf, when its conversation was last written long ago): the child would
     * be stored unreachable. */
    entry *parent = d->parent != d->hash ? find(ds, d->parent) : NULL;
    if (parent)
        touch(ds, parent, -1);
    for (int tries = 0;; tries++) {
        while (ds->st.bytes_used + size > ds->st.budget && victim(ds)) {
            discard(ds, victim(ds));
            ds->st.evictions++;
        }
        int os_err = 0;
        int rc = write_block(ds, d, kv, kv_bytes, size, &os_err, err);
        if (rc != KVC_ERR_IO || (os_err != ENOSPC && os_err != EDQUOT) || tries == 16 ||
            !victim(ds))
            return rc;
        medium_full(ds, size, os_err);
    }
}

/* Read and verify e's file against d into kv. KVC_ERR_FORMAT: corrupt (the
 * caller discards it); KVC_ERR_NOT_FOUND: another block, or the file is gone
 * (*gone). */
static int read_block(disk_store *ds, entry *e, const kvc_block_desc *d, void *kv,
                      size_t kv_bytes, bool *gone, kvc_err *err)
{
    char name[32];
    name_of(e->hash, name);
    int fd = openat(ds->dir_fd, name, O_RDONLY | O_CLOEXEC);
    *gone = fd < 0 && errno == ENOENT;
    if (fd < 0)
        return *gone ? kvc_fail(err, KVC_ERR_NOT_FOUND, "disk cache: %s is gone", name)
                     : kvc_fail(err, KVC_ERR_IO, "disk cache: opening %s: %s", name,
                                strerror(errno));
    size_t tok_bytes = (size_t)d->n_tokens * sizeof(int32_t);
    int32_t *toks = malloc(tok_bytes);
    file_header h;
    struct stat sb;
    int rc = KVC_OK;
    if (!toks)
        rc = kvc_fail(err, KVC_ERR_NOMEM, "disk cache: out of memory");
    else if (fstat(fd, &sb) != 0 || read_full(fd, &h, sizeof(h), 0) != 0 ||
             !header_ok(&h, (uint64_t)sb.st_size) || h.hash != e->hash)
        rc = kvc_fail(err, KVC_ERR_FORMAT, "disk cache: block %s: bad header or size", name);
    else if (h.parent != d->parent || h.n_tokens != (uint32_t)d->n_tokens ||
             h.kv_bytes != kv_bytes)
        rc = kvc_fail(err, KVC_ERR_NOT_FOUND, "disk cache: %s holds another block", name);
    else if (read_full(fd, toks, tok_bytes, sizeof(h)) != 0 ||
             read_full(fd, kv, kv_bytes, (off_t)(sizeof(h) + tok_bytes)) != 0)
        rc = kvc_fail(err, KVC_ERR_FORMAT, "disk cache: block %s: short read", name);
    if (!rc) {
        XXH3_state_t *x = XXH3_createState();
        if (!x) {
            rc = kvc_fail(err, KVC_ERR_NOMEM, "disk cache: out of memory");
        } else {
            XXH3_64bits_reset(x);
            XXH3_64bits_update(x, toks, tok_bytes);
            XXH3_64bits_update(x, kv, kv_bytes);
            if (XXH3_64bits_digest(x) != h.payload_xxh)
                rc = kvc_fail(err, KVC_ERR_FORMAT, "disk cache: block %s: checksum mismatch",
                              name);
            else if (memcmp(toks, d->tokens, tok_bytes) != 0)
                rc = kvc_fail(err, KVC_ERR_NOT_FOUND, "disk cache: %s holds other tokens", name);
            XXH3_freeState(x);
        }
    }
    if (!rc)
        touch(ds, e, fd);
    free(toks);
    close(fd);
    return rc;
}

static int disk_get(kvc_block_store *bs, const kvc_block_desc *d, void *kv, size_t kv_bytes,
                    kvc_err *err)
{
    disk_store *ds = (disk_store *)bs;
    entry *e = find(ds, d->hash);
    bool gone = false;
    int rc = e ? read_block(ds, e, d, kv, kv_bytes, &gone, err)
               : kvc_fail(err, KVC_ERR_NOT_FOUND, "disk cache: no block %016llx",
                          (unsigned long long)d->hash);
    if (rc == KVC_ERR_FORMAT) {
        ds->st.checksum_failures++;
        discard(ds, e);
    } else if (gone) {
        index_drop(ds, e);
    }
    if (rc == KVC_OK) {
        ds->st.n_hits++;
        ds->st.bytes_read += kv_bytes;
    } else {
        ds->st.n_misses++;
    }
    return rc;
}

static const kvc_block_store_ops disk_ops = {
    "disk", disk_put, disk_get, disk_contains, disk_remove, disk_iterate, disk_stats, disk_close,
    NULL, NULL, NULL,
};

/* ------------------------------------------------------------------ open */

/* mkdir -p with mode 0700 for what it creates; the leaf is set to 0700 (it
 * holds what users said). */
static int make_dirs(const char *dir, kvc_err *err)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s", dir) >= (int)sizeof(path))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "disk cache: path too long: %s", dir);
    for (char *p = path + 1; ; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(path, 0700) != 0 && errno != EEXIST)
                return kvc_fail(err, KVC_ERR_IO, "disk cache: cannot create %s: %s", path,
                                strerror(errno));
            *p = c;
            if (c == '\0')
                break;
        }
    }
    if (chmod(dir, 0700) != 0)
        return kvc_fail(err, KVC_ERR_IO, "disk cache: chmod 0700 %s: %s", dir, strerror(errno));
    return KVC_OK;
}

static bool is_block_name(const char *name, uint64_t *hash)
{
    if (strlen(name) != 20 || strcmp(name + 16, ".kvb") != 0)
        return false;
    char *end;
    unsigned long long h = strtoull(name, &end, 16);
    if (end != name + 16)
        return false;
    *hash = h;
    return true;
}

static int64_t mtime_ns(const struct stat *sb)
{
    return (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
}

static int by_hash(const void *a, const void *b)
{
    const snap_entry *x = a, *y = b;
    return x->hash < y->hash ? -1 : x->hash > y->hash;
}

/* Read the snapshot; empty when there is none or it fails its checks. */
static snapshot read_snapshot(disk_store *ds)
{
    snapshot sn = { 0 };
    int fd = openat(ds->dir_fd, "index", O_RDONLY | O_CLOEXEC);
    struct stat sb;
    uint64_t head[3];                                /* magic, count, XXH3 of the entries */
    if (fd < 0)
        return sn;
    if (fstat(fd, &sb) == 0 && sb.st_size >= (off_t)sizeof(head) &&
        read_full(fd, head, sizeof(head), 0) == 0 && head[0] == SNAPSHOT_MAGIC &&
        head[1] <= (1u << 28) &&
        (uint64_t)sb.st_size == sizeof(head) + head[1] * sizeof(snap_entry) &&
        (sn.v = malloc(KVC_MAX(head[1], 1) * sizeof(snap_entry))) &&
        read_full(fd, sn.v, head[1] * sizeof(snap_entry), sizeof(head)) == 0 &&
        XXH3_64bits(sn.v, head[1] * sizeof(snap_entry)) == head[2]) {
        sn.n = head[1];
        qsort(sn.v, sn.n, sizeof(snap_entry), by_hash);
    } else {
        free(sn.v);
        sn.v = NULL;
    }
    close(fd);
    return sn;
}

/* Save the index as the snapshot (a failure only costs the next start time). */
static void save_snapshot(disk_store *ds)
{
    ds->puts_since_snapshot = 0;
    size_t n = (size_t)ds->st.n_blocks, k = 0;
    snap_entry *v = malloc(KVC_MAX(n, 1) * sizeof(*v));
    if (!v)
        return;
    list *both[2] = { &ds->leaves, &ds->inner };
    for (int i = 0; i < 2; i++)
        for (entry *e = both[i]->head; e && k < n; e = e->next)
            v[k++] = (snap_entry){ e->hash, e->parent, e->bytes, e->stamp };
    uint64_t head[3] = { SNAPSHOT_MAGIC, k, XXH3_64bits(v, k * sizeof(*v)) };
    char tmp[64];
    snprintf(tmp, sizeof(tmp), "tmp.index.%ld", (long)getpid());
    int fd = openat(ds->dir_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    struct iovec iov[2] = { { head, sizeof(head) }, { v, k * sizeof(*v) } };
    bool ok = fd >= 0 && write_full(fd, iov, 2) == 0;
    if (fd >= 0)
        ok = close(fd) == 0 && ok;
    if (!ok || renameat(ds->dir_fd, tmp, ds->dir_fd, "index") != 0)
        (void)unlinkat(ds->dir_fd, tmp, 0);
    free(v);
}

/* A block file whose size and mtime are those the snapshot names: its entry
 * from there, without opening it. */
static bool from_snapshot(disk_store *ds, const snapshot *sn, const char *name, uint64_t hash,
                          entry *out)
{
    snap_entry key = { .hash = hash };
    const snap_entry *s = sn->n ? bsearch(&key, sn->v, sn->n, sizeof(key), by_hash) : NULL;
    struct stat sb;
    if (!s || fstatat(ds->dir_fd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode) ||
        (uint64_t)sb.st_size != s->bytes || mtime_ns(&sb) != s->stamp)
        return false;
    *out = (entry){ .hash = hash, .parent = s->parent, .bytes = s->bytes, .stamp = s->stamp };
    return true;
}

/* One directory entry: a block file validated and indexed (or discarded),
 * a temp file removed. A block the snapshot names as it is is taken from
 * there; any other has its header read and checked. */
static void load_one(disk_store *ds, const snapshot *sn, const char *name, entry ***all,
                     size_t *n, size_t *cap)
{
    uint64_t hash;
    if (strncmp(name, "tmp.", 4) == 0) {
        (void)unlinkat(ds->dir_fd, name, 0);   /* we hold the lock: its writer is dead */
        return;
    }
    if (!is_block_name(name, &hash))
        return;
    entry known;
    file_header h;
    struct stat sb;
    bool fast = from_snapshot(ds, sn, name, hash, &known), ok = fast;
    if (!fast) {
        int fd = openat(ds->dir_fd, name, O_RDONLY | O_CLOEXEC);
        ok = fd >= 0 && fstat(fd, &sb) == 0 && read_full(fd, &h, sizeof(h), 0) == 0 &&
             header_ok(&h, (uint64_t)sb.st_size) && h.hash == hash;
        if (fd >= 0)
            close(fd);
        ds->st.headers_read_at_load++;
        if (ok)
            known = (entry){ .hash = hash, .parent = h.parent, .bytes = (uint64_t)sb.st_size,
                             .stamp = mtime_ns(&sb) };
    }
    entry *e = ok ? calloc(1, sizeof(*e)) : NULL;
    if (ok && *n == *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        entry **a = realloc(*all, c * sizeof(entry *));
        if (a) {
            *all = a;
            *cap = c;
        }
    }
    if (!e || *n == *cap) {
        free(e);
        if (!ok) {
            (void)unlinkat(ds->dir_fd, name, 0);
            ds->st.discarded_at_load++;
        }
        return;
    }
    *e = known;
    (*all)[(*n)++] = e;
}

static int by_stamp(const void *a, const void *b)
{
    const entry *x = *(entry *const *)a, *y = *(entry *const *)b;
    if (x->stamp != y->stamp)
        return x->stamp < y->stamp ? -1 : 1;
    return x->hash < y->hash ? -1 : x->hash > y->hash;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Rebuild the index from the directory, least recently used first; a
 * rebuild that takes more than 2 s tells warn how far it got every 2 s, and
 * when it is done. */
static int load_index(disk_store *ds, kvc_err *err)
{
    int fd = dup(ds->dir_fd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return kvc_fail(err, KVC_ERR_IO, "disk cache: cannot list the directory: %s",
                        strerror(errno));
    }
    entry **all = NULL;
    size_t n = 0, cap = 0, seen = 0;
    snapshot sn = read_snapshot(ds);
    const double t0 = now_seconds();
    double next = t0 + 2.0;
    char msg[160];
    for (struct dirent *de; (de = readdir(d));) {
        load_one(ds, &sn, de->d_name, &all, &n, &cap);
        if (ds->warn && ++seen % 512 == 0 && now_seconds() >= next) {   /* a slow rebuild: say so */
            snprintf(msg, sizeof(msg), "disk cache: reading its index: %zu blocks so far (%.0f s)",
                     n, now_seconds() - t0);
            ds->warn(ds->warn_user, msg);
            next = now_seconds() + 2.0;
        }
    }
    closedir(d);
    free(sn.v);
    if (ds->warn && next > t0 + 2.0) {   /* progress was shown: and the end */
        snprintf(msg, sizeof(msg), "disk cache: index read: %zu blocks in %.1f s", n, now_seconds() - t0);
        ds->warn(ds->warn_user, msg);
    }
    if (n)
        qsort(all, n, sizeof(entry *), by_stamp);
    for (size_t i = 0; i < n; i++) {
        index_add(ds, all[i]);
        if (all[i]->stamp > ds->last_stamp)
            ds->last_stamp = all[i]->stamp;
    }
    for (size_t i = 0; i < n; i++)       /* every parent stored now: count children */
        link_parent(ds, all[i]);
    free(all);
    while (ds->st.bytes_used > ds->st.budget && victim(ds)) {   /* a smaller budget now */
        discard(ds, victim(ds));
        ds->st.evictions++;
    }
    ds->loaded = true;
    save_snapshot(ds);                  /* what a start after a kill -9 finds */
    return KVC_OK;
}

int kvc_disk_store_open(const kvc_disk_store_params *p, kvc_block_store **out, kvc_err *err)
{
    *out = NULL;
    char dir[PATH_MAX];
    int rc = p->dir ? (snprintf(dir, sizeof(dir), "%s", p->dir) < (int)sizeof(dir)
                           ? KVC_OK
                           : kvc_fail(err, KVC_ERR_INVALID_ARG, "disk cache: path too long"))
                    : kvc_cache_default_dir(dir, sizeof(dir), err);
    if (!rc)
        rc = make_dirs(dir, err);
    if (rc)
        return rc;
    disk_store *ds = calloc(1, sizeof(*ds));
    if (!ds)
        return kvc_fail(err, KVC_ERR_NOMEM, "disk cache: out of memory");
    ds->base.ops = &disk_ops;
    snprintf(ds->dir, sizeof(ds->dir), "%s", dir);
    ds->warn = p->warn;
    ds->warn_user = p->warn_user;
    ds->lock_fd = -1;
    ds->fsync = p->fsync;
    ds->st.budget = p->budget_bytes ? p->budget_bytes : (uint64_t)KVC_DISK_DEFAULT_MIB << 20;
    ds->n_buckets = 1024;
    ds->buckets = calloc(ds->n_buckets, sizeof(entry *));
    ds->dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (!ds->buckets)
        rc = kvc_fail(err, KVC_ERR_NOMEM, "disk cache: out of memory");
    else if (ds->dir_fd < 0)
        rc = kvc_fail(err, KVC_ERR_IO, "disk cache: cannot open %s: %s", dir, strerror(errno));
    if (!rc) {
        ds->lock_fd = openat(ds->dir_fd, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (ds->lock_fd < 0)
            rc = kvc_fail(err, KVC_ERR_IO, "disk cache: cannot create %s/lock: %s", dir,
                          strerror(errno));
        else if (flock(ds->lock_fd, LOCK_EX | LOCK_NB) != 0)
            rc = errno == EWOULDBLOCK
                     ? kvc_fail(err, KVC_ERR_BUSY, "disk cache: %s is in use by another process",
                                dir)
                     : kvc_fail(err, KVC_ERR_IO, "disk cache: locking %s: %s", dir,
                                strerror(errno));
    }
    if (!rc)
        rc = load_index(ds, err);
    if (rc) {
        disk_close(&ds->base);
        return rc;
    }
    *out = &ds->base;
    return KVC_OK;
}
