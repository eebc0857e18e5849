/* gguf.c - GGUF v2/v3 reader (validating, zero-copy over mmap) and writer.
 *
 * Layout (all little-endian):
 *   u32 magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv x { str key, u32 type, value }          str = u64 len + bytes
 *                                                array = u32 elem type + u64 n + elements
 *   n_tensors x { str name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset }
 *   zero padding to general.alignment (u32, default 32)
 *   data section: tensor data at the offsets above, each aligned.
 *
 * The reader checks every length and count against the bytes that remain
 * before it reads or allocates, so memory use is bounded by the file size and
 * a hostile file fails with a message naming the field. */
#include "gguf_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define KV_MIN_BYTES     13  /* key length 8 + type 4 + smallest value 1 */
#define TENSOR_MIN_BYTES 32  /* name length 8 + n_dims 4 + ne[0] 8 + type 4 + offset 8 */

struct gguf_file {
    const uint8_t      *base;          /* file bytes (mapping or caller's buffer) */
    size_t              size;          /* bytes at base */
    void               *map;           /* our mmap, or NULL for gguf_open_memory */
    uint32_t            version;       /* 2 or 3 */
    size_t              alignment;     /* general.alignment or 32; a power of two */
    size_t              data_start;    /* offset of the data section in the file */
    int64_t             n_kv;          /* entries of kvs parsed (all, once open) */
    size_t              cap_kv;
    gguf_kv            *kvs;           /* in file order */
    const gguf_str    **kv_index;      /* (n_kv) &kvs[i].key, sorted */
    int64_t             n_tensors;
    size_t              cap_tensors;
    gguf_tensor        *tensors;       /* in file order */
    const gguf_str    **tensor_index;  /* (n_tensors) &tensors[i].name, sorted */
};

/* ====================================================== values and bytes */

static int64_t bits_i64(uint64_t u) { int64_t i; memcpy(&i, &u, sizeof(i)); return i; }

/* A decoded number: u for NUM_UINT and NUM_BOOL, i for NUM_INT, f for NUM_FLOAT. */
typedef struct num {
    int kind;                 /* enum num_kind */
    union { uint64_t u; int64_t i; double f; };
} num;

/* Decodes one numeric (or bool) element of type t at p; vtypes[t].size bytes. */
static num decode_num(uint32_t t, const uint8_t *p)
{
    num n = { .kind = vtypes[t].kind };
    size_t sz = vtypes[t].size;
    uint64_t raw = load_le(p, sz);
    if (n.kind == NUM_INT) {
        if (sz < 8 && (raw >> (8 * sz - 1)) & 1)
            raw |= ~(uint64_t)0 << (8 * sz);            /* sign-extend */
        n.i = bits_i64(raw);
    } else if (t == GGUF_TYPE_FLOAT32) {
        float f;
        uint32_t r32 = (uint32_t)raw;
        memcpy(&f, &r32, sizeof(f));
        n.f = f;
    } else if (t == GGUF_TYPE_FLOAT64) {
        memcpy(&n.f, &raw, sizeof(n.f));
    } else {
        n.u = raw;
    }
    return n;
}

static int str_cmp(gguf_str a, gguf_str b)
{
    size_t n = (size_t)KVC_MIN(a.len, b.len);
    int c = n ? memcmp(a.s, b.s, n) : 0;
    if (c)
        return c;
    return (a.len > b.len) - (a.len < b.len);
}

/* A printable, bounded copy of a name for messages: other bytes become '?'. */
static const char *printable(char *out, size_t out_size, gguf_str s)
{
    size_t n = 0, max = out_size - 4;
    for (uint64_t i = 0; i < s.len && n < max; i++) {
        unsigned char c = (unsigned char)s.s[i];
        out[n++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (s.len > max)
        memcpy(out + n, "...", 3), n += 3;
    out[n] = 0;
    return out;
}

/* ================================================================ reader */

typedef struct reader {
    const uint8_t *buf;
    size_t         size;       /* bytes in buf */
    size_t         pos;        /* next byte to read */
    kvc_err       *err;
    char           ctx[128];   /* what is being read ("key 3 ('general.name')"), message prefix */
} reader;

static size_t rd_left(const reader *r) { return r->size - r->pos; }

static int rd_fail(reader *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int rd_fail(reader *r, int code, const char *fmt, ...)
{
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (r->ctx[0])
        return kvc_fail(r->err, code, "%s: %s", r->ctx, msg);
    return kvc_fail(r->err, code, "%s", msg);
}

/* Fails unless n more bytes exist; `what` names them in the message. */
static int rd_need(reader *r, uint64_t n, const char *what)
{
    if (n > rd_left(r))
        return rd_fail(r, KVC_ERR_FORMAT, "%s (%" PRIu64 " bytes at offset %zu) extends past end of file (size %zu)",
                       what, n, r->pos, r->size);
    return KVC_OK;
}

/* Reads an n-byte little-endian field. */
static int rd_le(reader *r, size_t n, const char *what, uint64_t *v)
{
    int rc = rd_need(r, n, what);
    if (rc == KVC_OK) {
        *v = load_le(r->buf + r->pos, n);
        r->pos += n;
    }
    return rc;
}

static int rd_u64(reader *r, const char *what, uint64_t *v) { return rd_le(r, 8, what, v); }

static int rd_u32(reader *r, const char *what, uint32_t *v)
{
    uint64_t u = 0;
    int rc = rd_le(r, 4, what, &u);
    *v = (uint32_t)u;
    return rc;
}

/* Reads a gguf string; the result points into the buffer. */
static int rd_str(reader *r, const char *what, gguf_str *s)
{
    uint64_t len;
    int rc = rd_u64(r, what, &len);
    if (rc)
        return rc;
    if (len > rd_left(r))
        return rd_fail(r, KVC_ERR_FORMAT, "%s: string length %" PRIu64 " exceeds file (%zu bytes left at offset %zu)",
                       what, len, rd_left(r), r->pos);
    s->len = len;
    s->s = (const char *)r->buf + r->pos;
    r->pos += (size_t)len;
    return KVC_OK;
}

/* ------------------------------------------------------------ kv values */

/* A STRING array: validate every element first (no allocation), then index. */
static int parse_str_array(reader *r, gguf_kv *kv)
{
    uint64_t n = kv->v.arr.n;
    if (n > rd_left(r) / 8)
        return rd_fail(r, KVC_ERR_FORMAT, "array of %" PRIu64 " strings cannot fit in the %zu bytes left at offset %zu",
                       n, rd_left(r), r->pos);
    size_t start = r->pos;
    for (uint64_t i = 0; i < n; i++) {
        if (rd_left(r) < 8)
            return rd_fail(r, KVC_ERR_FORMAT, "string %" PRIu64 " of %" PRIu64 ": length (8 bytes at offset %zu) "
                           "extends past end of file (size %zu)", i, n, r->pos, r->size);
        uint64_t len = load_le(r->buf + r->pos, 8);
        r->pos += 8;
        if (len > rd_left(r))
            return rd_fail(r, KVC_ERR_FORMAT, "string %" PRIu64 " of %" PRIu64 ": string length %" PRIu64
                           " exceeds file (%zu bytes left at offset %zu)", i, n, len, rd_left(r), r->pos);
        r->pos += (size_t)len;
    }
    if (n == 0)
        return KVC_OK;
    gguf_str *strs = malloc((size_t)n * sizeof(*strs));
    if (!strs)
        return rd_fail(r, KVC_ERR_NOMEM, "cannot allocate the index of %" PRIu64 " strings", n);
    for (size_t i = 0, p = start; i < n; i++) {
        strs[i].len = load_le(r->buf + p, 8);
        strs[i].s = (const char *)r->buf + p + 8;
        p += 8 + (size_t)strs[i].len;
    }
    kv->v.arr.strs = strs;
    return KVC_OK;
}

static int parse_array(reader *r, gguf_kv *kv)
{
    uint32_t et;
    uint64_t n;
    int rc = rd_u32(r, "array element type", &et);
    if (rc == KVC_OK)
        rc = rd_u64(r, "array count", &n);
    if (rc)
        return rc;
    if (et == GGUF_TYPE_ARRAY)
        return rd_fail(r, KVC_ERR_UNSUPPORTED, "nested arrays are not supported");
    if (et >= GGUF_TYPE_COUNT)
        return rd_fail(r, KVC_ERR_FORMAT, "unknown array element type %" PRIu32, et);
    kv->v.arr.type = et;
    kv->v.arr.n = n;
    if (et == GGUF_TYPE_STRING)
        return parse_str_array(r, kv);
    size_t es = vtypes[et].size;
    if (n > rd_left(r) / es)
        return rd_fail(r, KVC_ERR_FORMAT, "array of %" PRIu64 " %s elements exceeds file (%zu bytes left at offset %zu)",
                       n, vtype_name(et), rd_left(r), r->pos);
    const uint8_t *p = r->buf + r->pos;
    if (et == GGUF_TYPE_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (p[i] > 1)
                return rd_fail(r, KVC_ERR_FORMAT, "bool element %" PRIu64 " is %u, not 0 or 1", i, p[i]);
    kv->v.arr.data = p;
    r->pos += (size_t)n * es;
    return KVC_OK;
}

static int parse_value(reader *r, gguf_kv *kv)
{
    uint32_t t = kv->type;
    if (t == GGUF_TYPE_STRING)
        return rd_str(r, "value", &kv->v.str);
    if (t == GGUF_TYPE_ARRAY)
        return parse_array(r, kv);
    if (t >= GGUF_TYPE_COUNT)
        return rd_fail(r, KVC_ERR_FORMAT, "unknown value type %" PRIu32, t);
    int rc = rd_need(r, vtypes[t].size, vtype_name(t));
    if (rc)
        return rc;
    num n = decode_num(t, r->buf + r->pos);
    r->pos += vtypes[t].size;
    if (n.kind == NUM_BOOL && n.u > 1)
        return rd_fail(r, KVC_ERR_FORMAT, "bool value is %" PRIu64 ", not 0 or 1", n.u);
    if (n.kind == NUM_INT)
        kv->v.i64 = n.i;
    else if (n.kind == NUM_FLOAT)
        kv->v.f64 = n.f;
    else
        kv->v.u64 = n.u;                            /* UINT*, BOOL */
    return KVC_OK;
}

static int parse_kvs(gguf_file *f, reader *r, uint64_t n_kv)
{
    for (uint64_t i = 0; i < n_kv; i++) {
        if (!grow((void **)&f->kvs, &f->cap_kv, (size_t)f->n_kv, sizeof(gguf_kv)))
            return kvc_fail(r->err, KVC_ERR_NOMEM, "cannot allocate key %" PRIu64, i);
        gguf_kv *kv = &f->kvs[f->n_kv];
        memset(kv, 0, sizeof(*kv));
        f->n_kv++;                                  /* counted now so close frees its strings */
        char name[80];
        snprintf(r->ctx, sizeof(r->ctx), "key %" PRIu64, i);
        int rc = rd_str(r, "name", &kv->key);
        if (rc)
            return rc;
        snprintf(r->ctx, sizeof(r->ctx), "key %" PRIu64 " ('%s')", i, printable(name, sizeof(name), kv->key));
        rc = rd_u32(r, "value type", &kv->type);
        if (rc == KVC_OK)
            rc = parse_value(r, kv);
        if (rc)
            return rc;
    }
    r->ctx[0] = 0;
    return KVC_OK;
}

/* ------------------------------------------------------- sorted indexes */

/* gguf_kv and gguf_tensor both start with their name, so one index (pointers
 * to those names, sorted) serves both, and a name pointer is the item's. */
_Static_assert(offsetof(gguf_kv, key) == 0, "gguf_kv starts with its key");
_Static_assert(offsetof(gguf_tensor, name) == 0, "gguf_tensor starts with its name");

static int cmp_name(const void *a, const void *b)
{
    return str_cmp(**(const gguf_str *const *)a, **(const gguf_str *const *)b);
}

/* Sorts pointers to the n items (elsize bytes each) into a new *index; a name
 * found twice is KVC_ERR_FORMAT naming both items ("key 5 (...): duplicate of key 2"). */
static int build_index(const gguf_str ***index, const void *items, size_t n, size_t elsize,
                       const char *what, kvc_err *err)
{
    const gguf_str **ix = malloc((n ? n : 1) * sizeof(*ix));
    if (!ix)
        return kvc_fail(err, KVC_ERR_NOMEM, "cannot allocate the %s index", what);
    *index = ix;
    for (size_t i = 0; i < n; i++)
        ix[i] = (const gguf_str *)((const char *)items + i * elsize);
    qsort(ix, n, sizeof(*ix), cmp_name);
    for (size_t i = 1; i < n; i++) {
        if (str_cmp(*ix[i - 1], *ix[i]) == 0) {
            size_t a = (size_t)((const char *)ix[i - 1] - (const char *)items) / elsize;
            size_t b = (size_t)((const char *)ix[i] - (const char *)items) / elsize;
            char name[80];
            return kvc_fail(err, KVC_ERR_FORMAT, "%s %zu ('%s'): duplicate of %s %zu", what, KVC_MAX(a, b),
                            printable(name, sizeof(name), *ix[i]), what, KVC_MIN(a, b));
        }
    }
    return KVC_OK;
}

/* The name equal to `name` in a sorted index, or NULL. */
static const gguf_str *index_find(const gguf_str *const *index, size_t n, const char *name)
{
    gguf_str want = { strlen(name), name };
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = str_cmp(*index[mid], want);
        if (c == 0)
            return index[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* -------------------------------------------------------------- tensors */

/* general.alignment, when present, must be a u32 nonzero power of two. */
static int read_alignment(gguf_file *f, kvc_err *err)
{
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_find_kv(f, "general.alignment");
    if (!kv)
        return KVC_OK;
    if (kv->type != GGUF_TYPE_UINT32)
        return kvc_fail(err, KVC_ERR_FORMAT, "key 'general.alignment' has type %s, expected uint32",
                        vtype_name(kv->type));
    uint64_t a = kv->v.u64;
    if (a == 0 || (a & (a - 1)) != 0)
        return kvc_fail(err, KVC_ERR_FORMAT, "key 'general.alignment' is %" PRIu64 ", not a nonzero power of two", a);
    f->alignment = (size_t)a;
    return KVC_OK;
}

/* Checks shape and type and sets t->size; r->ctx names the tensor. */
static int check_tensor_shape(reader *r, gguf_tensor *t)
{
    const kvc_type_traits *tt = kvc_type_info(t->type);
    if (!tt)
        return rd_fail(r, KVC_ERR_UNSUPPORTED, "unknown ggml type id %" PRIu32, t->type);
    if (t->ne[0] % tt->block_size != 0)
        return rd_fail(r, KVC_ERR_FORMAT, "row length ne[0] = %" PRId64 " is not a multiple of the %s block size %d",
                       t->ne[0], tt->name, tt->block_size);
    t->size = shape_bytes(tt, t->n_dims, t->ne);
    if (t->size == SIZE_MAX)
        return rd_fail(r, KVC_ERR_FORMAT, "shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "] of %s "
                       "is too large (byte size overflows)", t->ne[0], t->ne[1], t->ne[2], t->ne[3], tt->name);
    return KVC_OK;
}

static int parse_tensor_info(gguf_file *f, reader *r, gguf_tensor *t)
{
    char name[80], what[16];
    int rc = rd_str(r, "name", &t->name);
    if (rc)
        return rc;
    snprintf(r->ctx, sizeof(r->ctx), "tensor '%s'", printable(name, sizeof(name), t->name));
    if ((rc = rd_u32(r, "n_dims", &t->n_dims)))
        return rc;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return rd_fail(r, KVC_ERR_FORMAT, "n_dims %" PRIu32 " not in 1..%d", t->n_dims, GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        snprintf(what, sizeof(what), "ne[%" PRIu32 "]", d);
        if ((rc = rd_u64(r, what, &ne)))
            return rc;
        if (ne > INT64_MAX)
            return rd_fail(r, KVC_ERR_FORMAT, "ne[%" PRIu32 "] = %" PRIu64 " is negative as int64", d, ne);
        t->ne[d] = (int64_t)ne;
    }
    if ((rc = rd_u32(r, "type", &t->type)) || (rc = rd_u64(r, "offset", &t->offset)))
        return rc;
    if ((rc = check_tensor_shape(r, t)))
        return rc;
    if (t->offset % f->alignment != 0)
        return rd_fail(r, KVC_ERR_FORMAT, "data offset %" PRIu64 " is not aligned to %zu (general.alignment)",
                       t->offset, f->alignment);
    return KVC_OK;
}

static int parse_tensor_infos(gguf_file *f, reader *r, uint64_t n_tensors)
{
    for (uint64_t i = 0; i < n_tensors; i++) {
        if (!grow((void **)&f->tensors, &f->cap_tensors, (size_t)f->n_tensors, sizeof(gguf_tensor)))
            return kvc_fail(r->err, KVC_ERR_NOMEM, "cannot allocate tensor %" PRIu64, i);
        gguf_tensor *t = &f->tensors[f->n_tensors++];
        memset(t, 0, sizeof(*t));
        snprintf(r->ctx, sizeof(r->ctx), "tensor %" PRIu64, i);
        int rc = parse_tensor_info(f, r, t);
        if (rc)
            return rc;
    }
    r->ctx[0] = 0;
    return KVC_OK;
}

/* Places the data section after the infos and binds every tensor's data. */
static int bind_tensor_data(gguf_file *f, reader *r)
{
    uint64_t start = ((uint64_t)r->pos + f->alignment - 1) & ~((uint64_t)f->alignment - 1);
    if (start > r->size) {
        if (f->n_tensors > 0)
            return rd_fail(r, KVC_ERR_FORMAT, "data section starts at offset %" PRIu64 ", past end of file (size %zu)",
                           start, r->size);
        start = r->size;                            /* no tensors: the padding may be absent */
    }
    f->data_start = (size_t)start;
    size_t data_size = r->size - f->data_start;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (t->offset > data_size || t->size > data_size - t->offset) {
            char name[80];
            return kvc_fail(r->err, KVC_ERR_FORMAT, "tensor '%s': data [offset %" PRIu64 ", %zu bytes] extends past "
                            "end of file (size %zu, data section at %zu)", printable(name, sizeof(name), t->name),
                            t->offset, t->size, r->size, f->data_start);
        }
        t->data = f->base + f->data_start + t->offset;
    }
    return KVC_OK;
}

/* ---------------------------------------------------------------- header */

static int parse_header(gguf_file *f, reader *r, uint64_t *n_tensors, uint64_t *n_kv)
{
    uint32_t magic;
    if (r->size < 4)
        return rd_fail(r, KVC_ERR_FORMAT, "file is %zu bytes, too short for a GGUF header (not a GGUF file)", r->size);
    magic = (uint32_t)load_le(r->buf, 4);
    if (magic != GGUF_MAGIC)
        return rd_fail(r, KVC_ERR_FORMAT, "bad magic 0x%08" PRIx32 " (not a GGUF file)", magic);
    r->pos = 4;
    int rc = rd_u32(r, "version", &f->version);
    if (rc)
        return rc;
    if (f->version == 1)
        return rd_fail(r, KVC_ERR_UNSUPPORTED, "GGUF version 1 is not supported (only 2 and 3); convert the file again");
    if (f->version != 2 && f->version != 3) {
        bool swapped = (f->version & 0xffffu) == 0 && (f->version >> 24) >= 1 && (f->version >> 24) <= 3;
        return rd_fail(r, KVC_ERR_UNSUPPORTED, "GGUF version %" PRIu32 " is not supported (only 2 and 3)%s",
                       f->version, swapped ? "; the file looks big-endian" : "");
    }
    if ((rc = rd_u64(r, "n_tensors", n_tensors)) || (rc = rd_u64(r, "n_kv", n_kv)))
        return rc;
    /* Fail fast on counts the rest of the file cannot hold. */
    size_t left = rd_left(r);
    if (*n_kv > left / KV_MIN_BYTES)
        return rd_fail(r, KVC_ERR_FORMAT, "n_kv %" PRIu64 " is impossible: the %zu bytes left hold at most %zu keys",
                       *n_kv, left, left / KV_MIN_BYTES);
    if (*n_tensors > (left - *n_kv * KV_MIN_BYTES) / TENSOR_MIN_BYTES)
        return rd_fail(r, KVC_ERR_FORMAT, "n_tensors %" PRIu64 " is impossible: the %zu bytes left hold at most "
                       "%" PRIu64 " tensor infos after %" PRIu64 " keys", *n_tensors, left,
                       (left - *n_kv * KV_MIN_BYTES) / TENSOR_MIN_BYTES, *n_kv);
    return KVC_OK;
}

static int parse_file(gguf_file *f, kvc_err *err)
{
    reader r = { .buf = f->base, .size = f->size, .err = err };
    uint64_t n_tensors, n_kv;
    int rc = parse_header(f, &r, &n_tensors, &n_kv);
    if (rc == KVC_OK)
        rc = parse_kvs(f, &r, n_kv);
    if (rc == KVC_OK)
        rc = build_index(&f->kv_index, f->kvs, (size_t)f->n_kv, sizeof(gguf_kv), "key", err);
    if (rc == KVC_OK)
        rc = read_alignment(f, err);
    if (rc == KVC_OK)
        rc = parse_tensor_infos(f, &r, n_tensors);
    if (rc == KVC_OK)
        rc = build_index(&f->tensor_index, f->tensors, (size_t)f->n_tensors, sizeof(gguf_tensor), "tensor", err);
    if (rc == KVC_OK)
        rc = bind_tensor_data(f, &r);
    return rc;
}

/* ======================================================== open and close */

int gguf_open_memory(const void *data, size_t size, gguf_file **out, kvc_err *err)
{
    if (!out || (!data && size))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "gguf_open_memory: NULL %s", out ? "data" : "out");
    *out = NULL;
    gguf_file *f = calloc(1, sizeof(*f));
    if (!f)
        return kvc_fail(err, KVC_ERR_NOMEM, "cannot allocate a gguf_file");
    f->base = data;
    f->size = size;
    int rc = parse_file(f, err);
    if (rc) {
        gguf_close(f);
        return rc;
    }
    *out = f;
    return KVC_OK;
}

int gguf_open(const char *path, gguf_file **out, kvc_err *err)
{
    if (!path || !out)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "gguf_open: NULL %s", path ? "out" : "path");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kvc_fail(err, KVC_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kvc_fail(err, KVC_ERR_IO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return kvc_fail(err, KVC_ERR_IO, "'%s' is not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return kvc_fail(err, KVC_ERR_IO, "cannot map '%s' (%zu bytes): %s", path, size, strerror(e));
        }
    }
    close(fd);
    int rc = gguf_open_memory(map, size, out, err);
    if (rc) {
        if (map)
            munmap(map, size);
        kvc_err_prefix(err, "%s", path);
        return rc;
    }
    (*out)->map = map;
    return KVC_OK;
}

void gguf_close(gguf_file *f)
{
    if (!f)
        return;
    for (int64_t i = 0; i < f->n_kv; i++)
        if (f->kvs[i].type == GGUF_TYPE_ARRAY && f->kvs[i].v.arr.type == GGUF_TYPE_STRING)
            free((void *)f->kvs[i].v.arr.strs);
    free(f->kvs);
    free(f->kv_index);
    free(f->tensors);
    free(f->tensor_index);
    if (f->map)
        munmap(f->map, f->size);
    free(f);
}

/* ============================================================= accessors */

uint32_t gguf_version(const gguf_file *f) { return f->version; }
size_t   gguf_alignment(const gguf_file *f) { return f->alignment; }
int64_t  gguf_n_kv(const gguf_file *f) { return f->n_kv; }
int64_t  gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

/* NULL when i is out of range. */
const gguf_kv *gguf_kv_at(const gguf_file *f, int64_t i)
{
    return i >= 0 && i < f->n_kv ? &f->kvs[i] : NULL;
}

const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i)
{
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key)
{
    if (!f || !key || !f->kv_index)
        return NULL;
    return (const gguf_kv *)index_find(f->kv_index, (size_t)f->n_kv, key);
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name)
{
    if (!f || !name || !f->tensor_index)
        return NULL;
    return (const gguf_tensor *)index_find(f->tensor_index, (size_t)f->n_tensors, name);
}

/* ========================================================= typed getters */

/* Finds `key`: KVC_ERR_NOT_FOUND when absent, KVC_ERR_FORMAT when its type
 * is not `type` (-1: any integer or float). */
static int find_typed(const gguf_file *f, const char *key, int type, const gguf_kv **kv, kvc_err *err)
{
    *kv = gguf_find_kv(f, key);
    if (!*kv)
        return kvc_fail(err, KVC_ERR_NOT_FOUND, "key '%s' not found", key);
    int kind = vtype_kind((*kv)->type);
    bool ok = type < 0 ? kind == NUM_UINT || kind == NUM_INT || kind == NUM_FLOAT : (*kv)->type == (uint32_t)type;
    if (!ok)
        return kvc_fail(err, KVC_ERR_FORMAT, "key '%s' has type %s, expected %s", key, vtype_name((*kv)->type),
                        type < 0 ? "a number" : vtype_name((uint32_t)type));
    return KVC_OK;
}

/* The number held by `key` (an integer or float). */
static int get_num(const gguf_file *f, const char *key, num *n, kvc_err *err)
{
    const gguf_kv *kv;
    int rc = find_typed(f, key, -1, &kv, err);
    if (rc == KVC_OK) {
        n->kind = vtype_kind(kv->type);
        if (n->kind == NUM_INT)
            n->i = kv->v.i64;
        else if (n->kind == NUM_FLOAT)
            n->f = kv->v.f64;
        else
            n->u = kv->v.u64;
    }
    return rc;
}

/* The integer held by `key`, if within [lo, hi] (as two's complement bits in *u). */
static int get_int(const gguf_file *f, const char *key, const char *want, int64_t lo, uint64_t hi,
                   uint64_t *u, kvc_err *err)
{
    num n;
    int rc = get_num(f, key, &n, err);
    if (rc)
        return rc;
    if (n.kind == NUM_FLOAT)
        return kvc_fail(err, KVC_ERR_FORMAT, "key '%s' is a float (%g), expected %s", key, n.f, want);
    if (n.kind == NUM_INT && n.i < lo)
        return kvc_fail(err, KVC_ERR_FORMAT, "key '%s' is %" PRId64 ", out of range for %s", key, n.i, want);
    uint64_t v = n.kind == NUM_INT ? (uint64_t)n.i : n.u;
    if ((n.kind == NUM_UINT || n.i >= 0) && v > hi)
        return kvc_fail(err, KVC_ERR_FORMAT, "key '%s' is %" PRIu64 ", out of range for %s", key, v, want);
    *u = v;
    return KVC_OK;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, kvc_err *err)
{
    uint64_t v;
    int rc = get_int(f, key, "uint32", 0, UINT32_MAX, &v, err);
    if (rc == KVC_OK)
        *out = (uint32_t)v;
    return rc;
}

int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, kvc_err *err)
{
    uint64_t v;
    int rc = get_int(f, key, "int64", INT64_MIN, INT64_MAX, &v, err);
    if (rc == KVC_OK)
        *out = bits_i64(v);
    return rc;
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out, kvc_err *err)
{
    num n;
    int rc = get_num(f, key, &n, err);
    if (rc)
        return rc;
    if (n.kind == NUM_UINT)
        *out = (float)n.u;
    else if (n.kind == NUM_INT)
        *out = (float)n.i;
    else if (isfinite(n.f) && fabs(n.f) > FLT_MAX)
        return kvc_fail(err, KVC_ERR_FORMAT, "key '%s' is %g, out of range for float32", key, n.f);
    else
        *out = (float)n.f;
    return KVC_OK;
}

int gguf_get_bool(const gguf_file *f, const char *key, bool *out, kvc_err *err)
{
    const gguf_kv *kv;
    int rc = find_typed(f, key, GGUF_TYPE_BOOL, &kv, err);
    if (rc == KVC_OK)
        *out = kv->v.u64 != 0;
    return rc;
}

int gguf_get_str(const gguf_file *f, const char *key, char **out, kvc_err *err)
{
    const gguf_kv *kv;
    int rc = find_typed(f, key, GGUF_TYPE_STRING, &kv, err);
    if (rc)
        return rc;
    char *s = malloc((size_t)kv->v.str.len + 1);
    if (!s)
        return kvc_fail(err, KVC_ERR_NOMEM, "key '%s': cannot allocate %" PRIu64 " bytes", key, kv->v.str.len + 1);
    if (kv->v.str.len)
        memcpy(s, kv->v.str.s, (size_t)kv->v.str.len);
    s[kv->v.str.len] = 0;
    *out = s;
    return KVC_OK;
}

int gguf_get_arr(const gguf_file *f, const char *key, uint32_t elem_type, const gguf_kv **out, kvc_err *err)
{
    const gguf_kv *kv;
    int rc = find_typed(f, key, GGUF_TYPE_ARRAY, &kv, err);
    if (rc)
        return rc;
    if (kv->v.arr.type != elem_type)
        return kvc_fail(err, KVC_ERR_FORMAT, "key '%s' is an array of %s, expected array of %s", key,
                        vtype_name(kv->v.arr.type), vtype_name(elem_type));
    *out = kv;
    return KVC_OK;
}

/* Element i of a numeric array, or NULL (not a numeric array, i out of range). */
static const uint8_t *arr_elem(const gguf_kv *kv, uint64_t i)
{
    if (!kv || kv->type != GGUF_TYPE_ARRAY || kv->v.arr.type >= GGUF_TYPE_COUNT || i >= kv->v.arr.n)
        return NULL;
    size_t es = vtypes[kv->v.arr.type].size;
    return es ? (const uint8_t *)kv->v.arr.data + i * es : NULL;
}

/* 0 when kv is not a numeric array or i >= n. */
double gguf_arr_f64(const gguf_kv *kv, uint64_t i)
{
    const uint8_t *p = arr_elem(kv, i);
    if (!p)
        return 0;
    num n = decode_num(kv->v.arr.type, p);
    return n.kind == NUM_FLOAT ? n.f : n.kind == NUM_INT ? (double)n.i : (double)n.u;   /* u: UINT*, BOOL */
}

/* 0 when kv is not a numeric array or i >= n; floats truncate toward zero and
 * saturate (NaN is 0); uint64 above INT64_MAX saturates. */
int64_t gguf_arr_i64(const gguf_kv *kv, uint64_t i)
{
    const uint8_t *p = arr_elem(kv, i);
    if (!p)
        return 0;
    num n = decode_num(kv->v.arr.type, p);
    if (n.kind == NUM_INT)
        return n.i;
    if (n.kind != NUM_FLOAT)                        /* UINT*, BOOL */
        return n.u > INT64_MAX ? INT64_MAX : (int64_t)n.u;
    if (isnan(n.f))
        return 0;
    if (n.f >= 0x1p63)
        return INT64_MAX;
    if (n.f < -0x1p63)
        return INT64_MIN;
    return (int64_t)n.f;
}
