/* gguf_write.c - the GGUF writer: builds a version 3 file in memory (keys in
 * insertion order, tensors aligned to general.alignment, default 32) and
 * writes it at once. It refuses what the reader would reject. Used by
 * make-model and the tests. */
#include "gguf_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ writer */

typedef struct bytebuf {
    uint8_t *p;
    size_t   len, cap;
    bool     failed;          /* an allocation failed; p holds what was written before */
} bytebuf;

static void bb_put(bytebuf *b, const void *src, size_t n)
{
    if (b->failed || n == 0)
        return;
    if (n > b->cap - b->len) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n && cap <= SIZE_MAX / 2)
            cap *= 2;
        uint8_t *p = cap - b->len >= n ? realloc(b->p, cap) : NULL;
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (src)
        memcpy(b->p + b->len, src, n);
    else
        memset(b->p + b->len, 0, n);
    b->len += n;
}

static void bb_le(bytebuf *b, uint64_t v, size_t n)
{
    uint8_t tmp[8];
    store_le(tmp, v, n);
    bb_put(b, tmp, n);
}

static void bb_str(bytebuf *b, const char *s, size_t n)
{
    bb_le(b, n, 8);
    bb_put(b, s, n);
}

static void bb_pad(bytebuf *b, size_t alignment)
{
    bb_put(b, NULL, (alignment - b->len % alignment) % alignment);
}

typedef struct wkv {
    char    *key;             /* NUL-terminated copy */
    bytebuf  val;             /* u32 type + value, serialized */
} wkv;

typedef struct wtensor {
    char    *name;
    uint32_t type, n_dims;
    int64_t  ne[GGUF_MAX_DIMS];
    uint8_t *data;            /* (size) copy, NULL when size is 0 */
    size_t   size;
} wtensor;

struct gguf_writer {
    wkv     *kvs;             /* (n_kv) in insertion order */
    size_t   n_kv, cap_kv;
    wtensor *tensors;         /* (n_tensors) in insertion order */
    size_t   n_tensors, cap_tensors;
    size_t   alignment;       /* general.alignment if set, else 32 */
};

gguf_writer *gguf_writer_new(void)
{
    gguf_writer *w = calloc(1, sizeof(*w));
    if (w)
        w->alignment = GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void gguf_writer_free(gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].val.p);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
    }
    free(w->kvs);
    free(w->tensors);
    free(w);
}

/* Adds `key` with the serialized value in *val (u32 type first), whose buffer
 * it takes over (and frees on failure). */
static int writer_add(gguf_writer *w, const char *key, bytebuf *val)
{
    int rc = KVC_OK;
    if (!w || !key)
        rc = KVC_ERR_INVALID_ARG;
    else if (val->failed)
        rc = KVC_ERR_NOMEM;
    else if (strcmp(key, "general.alignment") == 0 && load_le(val->p, 4) != GGUF_TYPE_UINT32)
        rc = KVC_ERR_INVALID_ARG;                   /* the reader accepts only u32 */
    for (size_t i = 0; rc == KVC_OK && i < w->n_kv; i++)
        if (strcmp(w->kvs[i].key, key) == 0)
            rc = KVC_ERR_INVALID_ARG;
    if (rc == KVC_OK && !grow((void **)&w->kvs, &w->cap_kv, w->n_kv, sizeof(wkv)))
        rc = KVC_ERR_NOMEM;
    char *k = rc == KVC_OK ? strdup(key) : NULL;
    if (rc == KVC_OK && !k)
        rc = KVC_ERR_NOMEM;
    if (rc) {
        free(val->p);
        return rc;
    }
    w->kvs[w->n_kv++] = (wkv){ k, *val };
    return KVC_OK;
}

/* A scalar of `type` whose little-endian bits are `bits`. */
static int writer_scalar(gguf_writer *w, const char *key, uint32_t type, uint64_t bits)
{
    bytebuf b = { 0 };
    bb_le(&b, type, 4);
    bb_le(&b, bits, vtypes[type].size);
    return writer_add(w, key, &b);
}

int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v)
{
    bool is_align = key && strcmp(key, "general.alignment") == 0;
    if (is_align && (v == 0 || (v & (v - 1)) != 0))
        return KVC_ERR_INVALID_ARG;
    int rc = writer_scalar(w, key, GGUF_TYPE_UINT32, v);
    if (rc == KVC_OK && is_align)
        w->alignment = v;
    return rc;
}

int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v)
{
    return writer_scalar(w, key, GGUF_TYPE_INT32, (uint32_t)v);
}

int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v)
{
    return writer_scalar(w, key, GGUF_TYPE_UINT64, v);
}

int gguf_writer_set_f32(gguf_writer *w, const char *key, float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof(bits));
    return writer_scalar(w, key, GGUF_TYPE_FLOAT32, bits);
}

int gguf_writer_set_bool(gguf_writer *w, const char *key, bool v)
{
    return writer_scalar(w, key, GGUF_TYPE_BOOL, v ? 1 : 0);
}

int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v)
{
    if (!v)
        return KVC_ERR_INVALID_ARG;
    bytebuf b = { 0 };
    bb_le(&b, GGUF_TYPE_STRING, 4);
    bb_str(&b, v, strlen(v));
    return writer_add(w, key, &b);
}

int gguf_writer_set_arr(gguf_writer *w, const char *key, uint32_t elem_type, const void *data, uint64_t n)
{
    if (elem_type >= GGUF_TYPE_COUNT || vtypes[elem_type].size == 0 || (n && !data) || n > SIZE_MAX / 8)
        return KVC_ERR_INVALID_ARG;
    size_t bytes = (size_t)n * vtypes[elem_type].size;
    if (elem_type == GGUF_TYPE_BOOL)
        for (size_t i = 0; i < bytes; i++)
            if (((const uint8_t *)data)[i] > 1)
                return KVC_ERR_INVALID_ARG;         /* the reader accepts only 0/1 */
    bytebuf b = { 0 };
    bb_le(&b, GGUF_TYPE_ARRAY, 4);
    bb_le(&b, elem_type, 4);
    bb_le(&b, n, 8);
    bb_put(&b, data, bytes);
    return writer_add(w, key, &b);
}

int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n)
{
    if (n && !strs)
        return KVC_ERR_INVALID_ARG;
    for (uint64_t i = 0; i < n; i++)
        if (!strs[i])
            return KVC_ERR_INVALID_ARG;
    bytebuf b = { 0 };
    bb_le(&b, GGUF_TYPE_ARRAY, 4);
    bb_le(&b, GGUF_TYPE_STRING, 4);
    bb_le(&b, n, 8);
    for (uint64_t i = 0; i < n; i++)
        bb_str(&b, strs[i], strlen(strs[i]));
    return writer_add(w, key, &b);
}

/* Bytes of a tensor of `type` and shape, or SIZE_MAX when invalid. */
static size_t tensor_bytes(uint32_t type, uint32_t n_dims, const int64_t *ne)
{
    const kvc_type_traits *tt = kvc_type_info(type);
    if (!tt || n_dims < 1 || n_dims > GGUF_MAX_DIMS || ne[0] % tt->block_size)
        return SIZE_MAX;
    return shape_bytes(tt, n_dims, ne);
}

int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                           const int64_t *ne, const void *data, size_t size)
{
    if (!w || !name || !ne || (size && !data) || tensor_bytes(type, n_dims, ne) != size)
        return KVC_ERR_INVALID_ARG;
    for (size_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return KVC_ERR_INVALID_ARG;
    if (!grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors, sizeof(wtensor)))
        return KVC_ERR_NOMEM;
    wtensor t = { .name = strdup(name), .type = type, .n_dims = n_dims, .size = size };
    t.data = size ? malloc(size) : NULL;
    if (!t.name || (size && !t.data)) {
        free(t.name);
        free(t.data);
        return KVC_ERR_NOMEM;
    }
    if (size)
        memcpy(t.data, data, size);
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
        t.ne[d] = d < n_dims ? ne[d] : 1;
    w->tensors[w->n_tensors++] = t;
    return KVC_OK;
}

/* Header, kvs, tensor infos and padding: everything before the data section. */
static void write_meta(const gguf_writer *w, bytebuf *b)
{
    bb_le(b, GGUF_MAGIC, 4);
    bb_le(b, 3, 4);
    bb_le(b, w->n_tensors, 8);
    bb_le(b, w->n_kv, 8);
    for (size_t i = 0; i < w->n_kv; i++) {
        bb_str(b, w->kvs[i].key, strlen(w->kvs[i].key));
        bb_put(b, w->kvs[i].val.p, w->kvs[i].val.len);
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        bb_str(b, t->name, strlen(t->name));
        bb_le(b, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++)
            bb_le(b, (uint64_t)t->ne[d], 8);
        bb_le(b, t->type, 4);
        bb_le(b, offset, 8);
        offset += (t->size + w->alignment - 1) / w->alignment * w->alignment;
    }
    bb_pad(b, w->alignment);
}

int gguf_writer_to_memory(const gguf_writer *w, void **out, size_t *out_size, kvc_err *err)
{
    if (!w || !out || !out_size)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "gguf_writer_to_memory: NULL argument");
    bytebuf b = { 0 };
    write_meta(w, &b);
    for (size_t i = 0; i < w->n_tensors; i++) {
        bb_put(&b, w->tensors[i].data, w->tensors[i].size);
        bb_pad(&b, w->alignment);                  /* as llama.cpp: the last tensor is padded too */
    }
    if (b.failed) {
        free(b.p);
        return kvc_fail(err, KVC_ERR_NOMEM, "cannot allocate the serialized GGUF file");
    }
    *out = b.p;
    *out_size = b.len;
    return KVC_OK;
}

int gguf_writer_write(const gguf_writer *w, const char *path, kvc_err *err)
{
    if (!w || !path)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "gguf_writer_write: NULL argument");
    /* the header, then each tensor straight from its own buffer: a file of
     * several GB needs no second copy of itself in memory */
    bytebuf meta = { 0 };
    write_meta(w, &meta);
    if (meta.failed) {
        free(meta.p);
        return kvc_fail(err, KVC_ERR_NOMEM, "cannot allocate the GGUF header");
    }
    static const uint8_t zeros[256];
    FILE *fp = fopen(path, "wb");
    int rc = KVC_OK;
    if (!fp) {
        rc = kvc_fail(err, KVC_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
    } else {
        bool ok = fwrite(meta.p, 1, meta.len, fp) == meta.len;
        for (size_t i = 0; ok && i < w->n_tensors; i++) {
            const size_t size = w->tensors[i].size;
            size_t pad = (w->alignment - size % w->alignment) % w->alignment;  /* the last one too */
            ok = fwrite(w->tensors[i].data, 1, size, fp) == size;
            for (size_t n; ok && pad > 0; pad -= n) {
                n = KVC_MIN(pad, sizeof(zeros));
                ok = fwrite(zeros, 1, n, fp) == n;
            }
        }
        int e = errno;
        if (fclose(fp) != 0 && ok) {
            ok = false;
            e = errno;
        }
        if (!ok)
            rc = kvc_fail(err, KVC_ERR_IO, "cannot write '%s': %s", path, strerror(e));
    }
    free(meta.p);
    return rc;
}
