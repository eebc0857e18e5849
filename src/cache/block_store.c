/* block_store.c - what every tier shares: where the cache lives, and the
 * model fingerprint that keeps two models' blocks apart. */
#include "block_store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

int kvc_cache_default_dir(char *buf, size_t size, kvc_err *err)
{
    const char *own = getenv("KVCHAT_CACHE"), *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (own && own[0])                   /* kvchat's cache root, as for the demo model */
        n = snprintf(buf, size, "%s/kv", own);
    else if (xdg && xdg[0] == '/')       /* the XDG spec: relative paths are ignored */
        n = snprintf(buf, size, "%s/kvchat/kv", xdg);
    else if (home && home[0])
        n = snprintf(buf, size, "%s/.cache/kvchat/kv", home);
    else
        return kvc_fail(err, KVC_ERR_NOT_FOUND,
                        "no cache directory: neither XDG_CACHE_HOME nor HOME is set");
    if (n < 0 || (size_t)n >= size)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "cache directory path too long");
    return KVC_OK;
}

/* XXH3-64 of the whole file, read in chunks. */
static int hash_file(int fd, const char *path, uint64_t *out, kvc_err *err)
{
    enum { CHUNK = 4 << 20 };
    uint8_t *buf = malloc(CHUNK);
    XXH3_state_t *x = XXH3_createState();
    int rc = buf && x ? KVC_OK : kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    if (!rc)
        XXH3_64bits_reset(x);
    for (off_t off = 0; !rc;) {
        ssize_t r = pread(fd, buf, CHUNK, off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            rc = kvc_fail(err, KVC_ERR_IO, "reading %s: %s", path, strerror(errno));
        if (r <= 0)
            break;
        XXH3_64bits_update(x, buf, (size_t)r);
        off += r;
    }
    if (!rc)
        *out = XXH3_64bits_digest(x);
    free(buf);
    XXH3_freeState(x);
    return rc;
}

/* A stat time in ns. */
static long long ns_of(const struct timespec *t)
{
    return (long long)t->tv_sec * 1000000000 + t->tv_nsec;
}

/* The line remembering a fingerprint:
 * "<fp> <size> <inode> <mtime ns> <ctime ns> <path>". The ctime is what user
 * space cannot set: an in-place overwrite that restores the size and mtime
 * (cp onto the file and touch -d, rsync --inplace -t) still changes it. Lines
 * of the older form (no ctime) never match, so such a file is hashed again. */
static bool lookup_remembered(const char *file, const char *path, const struct stat *sb,
                              uint64_t *out)
{
    FILE *f = fopen(file, "r");
    if (!f)
        return false;
    char line[PATH_MAX + 160];
    bool found = false;
    const long long mt = ns_of(&sb->st_mtim), ct = ns_of(&sb->st_ctim);
    while (!found && fgets(line, sizeof(line), f)) {
        unsigned long long fp, size, ino;
        long long mtime, ctime;
        int at = 0;
        line[strcspn(line, "\n")] = '\0';
        if (sscanf(line, "%llx %llu %llu %lld %lld %n", &fp, &size, &ino, &mtime, &ctime,
                   &at) == 5 && at > 0 &&
            size == (unsigned long long)sb->st_size && ino == (unsigned long long)sb->st_ino &&
            mtime == mt && ctime == ct && strcmp(line + at, path) == 0) {
            *out = fp;
            found = true;
        }
    }
    fclose(f);
    return found;
}

int kvc_model_fingerprint(const char *path, const char *dir, uint64_t *out, kvc_err *err)
{
    char abs[PATH_MAX], file[PATH_MAX + 16];
    if (!realpath(path, abs))
        return kvc_fail(err, KVC_ERR_IO, "model %s: %s", path, strerror(errno));
    int fd = open(abs, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return kvc_fail(err, KVC_ERR_IO, "model %s: %s", abs, strerror(e));
    }
    bool remember = dir && snprintf(file, sizeof(file), "%s/models", dir) < (int)sizeof(file);
    if (remember && lookup_remembered(file, abs, &sb, out)) {
        close(fd);
        return KVC_OK;
    }
    int rc = hash_file(fd, abs, out, err);
    close(fd);
    if (rc || !remember)
        return rc;
    /* one short O_APPEND write: concurrent writers never interleave a line */
    int wfd = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (wfd >= 0) {
        char line[PATH_MAX + 160];
        int n = snprintf(line, sizeof(line), "%016llx %llu %llu %lld %lld %s\n",
                         (unsigned long long)*out, (unsigned long long)sb.st_size,
                         (unsigned long long)sb.st_ino, ns_of(&sb.st_mtim), ns_of(&sb.st_ctim),
                         abs);
        if (n > 0 && (size_t)n < sizeof(line))
            (void)!write(wfd, line, (size_t)n);
        close(wfd);
    }
    return KVC_OK;
}

/* ------------------------------------------------------------ the record */

#define RECORD_MAGIC   0x31304b4c4243564bull   /* "KVCBLK01", as the disk files */
#define RECORD_VERSION 1

typedef struct record_header {
    uint64_t magic;
    uint32_t version;
    uint32_t n_tokens;
    uint64_t hash;
    uint64_t parent;
    uint64_t kv_bytes;
    uint64_t payload_xxh;   /* XXH3-64 of tokens, then K/V */
    uint64_t reserved;      /* 0 */
    uint64_t header_xxh;    /* XXH3-64 of the 56 bytes above */
} record_header;
_Static_assert(sizeof(record_header) == KVC_BLOCK_RECORD_HEADER, "the record header is 64 bytes");

void kvc_block_record_write(const kvc_block_desc *d, const void *kv, size_t kv_bytes, void *out)
{
    uint8_t *p = out;
    size_t tok_bytes = (size_t)d->n_tokens * sizeof(int32_t);
    record_header h = { .magic = RECORD_MAGIC, .version = RECORD_VERSION,
                        .n_tokens = (uint32_t)d->n_tokens, .hash = d->hash, .parent = d->parent,
                        .kv_bytes = kv_bytes };
    memcpy(p + sizeof(h), d->tokens, tok_bytes);
    memcpy(p + sizeof(h) + tok_bytes, kv, kv_bytes);
    h.payload_xxh = XXH3_64bits(p + sizeof(h), tok_bytes + kv_bytes);
    h.header_xxh = XXH3_64bits(&h, offsetof(record_header, header_xxh));
    memcpy(p, &h, sizeof(h));
}

int kvc_block_record_read(const void *rec, size_t size, const kvc_block_desc *d, void *kv,
                          size_t kv_bytes, kvc_err *err)
{
    const uint8_t *p = rec;
    record_header h;
    if (size < sizeof(h))
        return kvc_fail(err, KVC_ERR_FORMAT, "block record: %zu bytes, shorter than a header",
                        size);
    memcpy(&h, p, sizeof(h));
    if (h.magic != RECORD_MAGIC || h.version != RECORD_VERSION ||
        h.header_xxh != XXH3_64bits(&h, offsetof(record_header, header_xxh)) ||
        h.n_tokens == 0 || h.n_tokens > (1u << 20) ||
        size != sizeof(h) + (uint64_t)h.n_tokens * 4 + h.kv_bytes)
        return kvc_fail(err, KVC_ERR_FORMAT, "block record: bad header or size");
    size_t tok_bytes = (size_t)h.n_tokens * sizeof(int32_t);
    if (XXH3_64bits(p + sizeof(h), tok_bytes + h.kv_bytes) != h.payload_xxh)
        return kvc_fail(err, KVC_ERR_FORMAT, "block record %016llx: checksum mismatch",
                        (unsigned long long)h.hash);
    if (h.hash != d->hash || h.parent != d->parent || h.n_tokens != (uint32_t)d->n_tokens ||
        (kv && h.kv_bytes != kv_bytes) || memcmp(p + sizeof(h), d->tokens, tok_bytes) != 0)
        return kvc_fail(err, KVC_ERR_NOT_FOUND, "block record %016llx: another block",
                        (unsigned long long)h.hash);
    if (kv)
        memcpy(kv, p + sizeof(h) + tok_bytes, kv_bytes);
    return KVC_OK;
}
